"""Strategies: how a step is compiled and how states and batches are placed.

`eager`, `jit`, `jit_donate`, `data_parallel` and `fsdp` (`jax.sharding`) and
`pmap`, found by name in one registry.

May import: logs, base.
"""
