"""The conformance kit for framework authors: `ciclo.testing.check_adapter` and `AdapterTests`.

It runs every clause of the `ciclo.types.ModelAdapter` contract through the
loops, so it sits above them.

May import: every other room.
"""
