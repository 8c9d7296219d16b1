"""The batch-split refusal of a mesh counts the parts its batch axes make, not the devices."""

from __future__ import annotations

import pytest
from jax.sharding import PartitionSpec as P
from support import training

from ciclo.strategies import MeshParallel


def test_a_mesh_with_a_tensor_axis_names_its_batch_axes_when_a_batch_does_not_split() -> None:
    strategy = MeshParallel(axes={"data": 1, "fsdp": 2, "tensor": 2}, rules=[(r"^0/w$", P(None, "tensor"))])
    state = training.managed_state("mlp", strategy)
    with pytest.raises(ValueError) as caught:
        training.train_step(state, training.batches(1, batch=3)[0])
    assert str(caught.value).startswith(
        "strategy 'mesh' splits each batch over 2 parts in this process (the product of its batch axes "
        "('data', 'fsdp'), per process), but batch leaf [0] has 3 rows (shape (3, 8)), not a multiple of 2."
    )
    # Where the batch axes are every device, the message is data_parallel's.
    with pytest.raises(ValueError, match="over the 4 devices of this process, but batch leaf"):
        training.train_step(training.managed_state("mlp", MeshParallel()), training.batches(1, batch=3)[0])
