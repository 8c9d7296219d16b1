"""The loop engine: one run's lifecycle.

`run_phases` (the step loop), `LoopState` (what a callback sees), the one
`Callback` type and the one door every other form of callback comes in by.
The engine calls only `Callback`s: it knows no backup, signal, hook name,
built-in callback or clu.

May import: state, data, strategies, logs, base.
"""
