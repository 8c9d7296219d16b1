"""The built-in callbacks: progress bars, checkpoints, early stopping, loggers, profiling.

Each is a `ciclo.Callback` that declares the hook `train_loop(callbacks=[...])`
places it under and keeps its manual-loop form (`checkpoint(elapsed, state)`,
`keras_bar(elapsed, logs)`). Loggers live in `_loggers`.

May import: resume, engine, state, data, strategies, logs, base.
"""
