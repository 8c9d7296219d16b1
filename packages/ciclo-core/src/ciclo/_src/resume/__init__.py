"""Surviving a run's end: backups, signals and the orbax layer.

Owns `ciclo.backup` (a `Callback` that saves the state, the loop's counters,
the History, callbacks' state and the data position, and resumes from them),
its lock, the signal guard (`CatchInterrupt`), the one orbax layer and the
JSON form of host values.

May import: engine, state, data, strategies, logs, base.
"""
