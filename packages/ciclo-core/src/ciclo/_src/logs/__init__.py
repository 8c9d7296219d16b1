"""What a step reports and what a run remembers.

Owns `Logs`, the `History` and its host copies, the one rule that turns a
step's or callback's return value into logs and a state (`step_output`), and
plotting.

May import: base.
"""
