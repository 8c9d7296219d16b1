"""Managed training states.

`ManagedState` (losses, metrics, the train/test/predict steps, strategy
handling), `ModelState` built on the model-adapter protocol, the training
options that compose (precision, accumulation, non-finite skipping, EMA), the
metrics, learning-rate readout, `ciclo.summary`, `ciclo.preflight`, and populations
(`ciclo.population`: members stacked on a leading axis, one vmapped step).

May import: data, strategies, logs, base.
"""
