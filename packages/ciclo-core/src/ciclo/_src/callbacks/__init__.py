"""The built-in callbacks: progress bars, checkpoints, early stopping, loggers, profiling.

Also the watchdog, a population's pruning (`prune`, `optuna_trials`) and the training-options watch.

Each is a `ciclo.Callback` that declares the hook `train_loop(callbacks=[...])`
places it under and keeps its manual-loop form (`checkpoint(elapsed, state)`,
`keras_bar(elapsed, logs)`). Loggers live in `_loggers`.

May import: resume, engine, state, data, strategies, logs, base.
"""
