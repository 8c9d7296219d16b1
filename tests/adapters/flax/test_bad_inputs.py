"""Wrong usages of `ciclo.create_flax_state`, each refused naming the fix (see docs/bad_inputs.md)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import flax.errors
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from support import bad_inputs_page as page

import ciclo

X = np.ones((4, 8), np.float32)
Y = np.array([0, 1, 2, 0], np.int32)
LOSS = {"loss": optax.softmax_cross_entropy_with_integer_labels}


def linen(**kwargs: Any) -> ciclo.types.ModelState:
    kwargs.setdefault("inputs", jnp.zeros((1, 8)))
    return ciclo.create_flax_state(nn.Dense(3), tx=optax.sgd(0.1), losses=LOSS, **kwargs)


CASES: list[tuple[str, Callable[[], Any], type[BaseException], str]] = [
    (
        "inputs=(1, 8), a shape instead of an example array",
        lambda: linen(inputs=(1, 8)),
        TypeError,
        r"inputs=\(1, 8\) looks like a shape: inputs must be an example batch, "
        r"e.g. inputs=jnp.zeros\(\(1, 8\)\)",
    ),
    (
        "a linen module without inputs",
        lambda: linen(inputs=None),
        TypeError,
        r"needs sample `inputs`.*jnp.empty",
    ),
    (
        "an nnx module given inputs=",
        lambda: ciclo.create_flax_state(nnx.Linear(8, 3, rngs=nnx.Rngs(0)), inputs=jnp.zeros((1, 8))),
        TypeError,
        r"an nnx module is built initialised, so it takes no inputs= \(which is for linen modules\): "
        r"leave inputs= out",
    ),
    (
        "a model that is not a flax module",
        lambda: ciclo.create_flax_state(lambda x: x, tx=optax.sgd(0.1)),
        TypeError,
        r"takes a flax.linen.Module or a flax.nnx.Module.*ciclo.types.ModelAdapter",
    ),
    (
        "strategy=42",
        lambda: linen(strategy=42),
        TypeError,
        r"42 is not a strategy.*see ciclo.strategies.Strategy",
    ),
    (
        "test batches of another shape",
        lambda: ciclo.train_loop(
            linen(), [(X, Y)] * 4, test_dataset=lambda: [(np.ones((4, 5), np.float32), Y)], epoch_duration=2
        ),
        flax.errors.ScopeParamShapeError,
        r"the model failed on inputs float32\[4, 5\]: give every step",
    ),
    (
        "float labels for an integer-label loss",
        lambda: ciclo.train_loop(linen(), [(X, Y.astype(np.float32))] * 2),
        TypeError,
        r"loss 'loss' failed on preds float32\[4, 3\] and target float32\[4\].*need int labels",
    ),
]


@pytest.mark.parametrize(
    ("name", "usage", "expected", "pattern"), [pytest.param(*case, id=case[0]) for case in CASES]
)
def test_bad_input(name: str, usage: Callable[[], Any], expected: type[BaseException], pattern: str) -> None:
    with pytest.raises(expected) as info:
        usage()
    message = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert re.search(pattern, message), message
    if name in page.rows():  # docs/bad_inputs.md quotes this case: each quote must be the code's words
        page.check(name, message)


def test_the_page_s_flax_rows_are_cases_here() -> None:
    assert page.FRAMEWORK_ROWS <= {case[0] for case in CASES}
