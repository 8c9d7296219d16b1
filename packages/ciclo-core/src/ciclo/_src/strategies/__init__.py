"""Strategies: how a step is compiled and how states and batches are placed.

`eager`, `jit`, `jit_donate`, `data_parallel`, `fsdp` and `mesh` (`jax.sharding`,
one layout machinery: partition rules, logical names, a fallback) and `pmap`, found
by name in one registry.

May import: logs, base.
"""
