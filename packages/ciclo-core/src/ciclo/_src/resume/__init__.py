"""Surviving a run's end: backups (`ciclo.backup`) and their lock, signals, the one orbax layer.

May import: engine, state, data, strategies, logs, base.
"""
