"""The loops users call, built on the engine from public pieces.

`ciclo.loop`, `train_loop`, `test_loop`, `predict_loop`, `lr_find`, the hook
vocabulary and `collect`, which place callbacks by hook name, and the
evaluation loop inside `train_loop` (`ciclo.inner_loop`, the test pass at each
epoch's end).

May import: callbacks, resume, engine, state, data, strategies, logs, base.
"""
