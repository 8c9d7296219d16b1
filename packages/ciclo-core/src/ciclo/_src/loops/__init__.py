"""The loops users call, built on the engine from public pieces.

`ciclo.loop`, `train_loop`, `test_loop`, `predict_loop`, `lr_find`, the hook
vocabulary that places callbacks, the evaluation loop inside `train_loop`
(`ciclo.inner_loop`) and `steps_per_execution="auto"`.

May import: callbacks, resume, engine, state, data, strategies, logs, base.
"""
