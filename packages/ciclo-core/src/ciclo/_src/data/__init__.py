"""The data path: iterating a dataset and its position, `ciclo.fuse` and `ciclo.prefetch_to_device`.

May import: strategies, logs, base.
"""
