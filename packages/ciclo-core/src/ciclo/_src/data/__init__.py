"""The data path: how batches reach a step and where a dataset is.

Owns iterating a dataset and its resumable position (`StatefulIterator`),
fusing several steps into one `lax.scan` (`ciclo.fuse`) and prefetching to
devices (`ciclo.prefetch_to_device`).

May import: strategies, logs, base.
"""
