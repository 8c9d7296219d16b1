"""The data path: iterating a dataset and its position, its batches grouped, fused steps and prefetch.

`steps_per_execution` (fixed or `"auto"`), `ciclo.fuse` and `ciclo.prefetch_to_device`.

May import: strategies, logs, base.
"""
