"""Export for serving: a `ModelState`'s prediction function as a `jax.export` file, and loading it back."""

from __future__ import annotations

import hashlib
import importlib
import os
import stat
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ciclo._src.base.checks import check_bool
from ciclo._src.base.files import write_atomically
from ciclo._src.base.reprs import short
from ciclo._src.state.model_state import ModelState

_BATCH = "batch"  # the symbolic batch dimension's name, as `Exported.in_avals` show it
# After jax's bytes, which flatbuffers reads from their start (jax alone still reads the file): the
# mark and the sha256 of those bytes, so that a file cut, damaged or of another kind never reaches MLIR.
_MARK = b"ciclo.export sha256 "
_TRAILER = len(_MARK) + hashlib.sha256().digest_size


def _check_serialization() -> None:
    try:
        importlib.import_module("flatbuffers")
    except ImportError as error:
        raise ImportError(
            f"ciclo.export and ciclo.load_exported need flatbuffers, the format jax.export serializes to "
            f'({error}): pip install "ciclo-core[export]"'
        ) from error


def _spec(leaf: Any, batch: Any) -> jax.ShapeDtypeStruct:
    shape, dtype = (
        (leaf.shape, leaf.dtype) if hasattr(leaf, "dtype") else (np.shape(leaf), np.result_type(leaf))
    )
    if batch is None:
        return jax.ShapeDtypeStruct(tuple(shape), dtype)  # type: ignore[no-untyped-call]
    if not shape:
        raise ValueError(
            f"ciclo.export(batch_polymorphic=True) gives every input array a symbolic batch dimension, its "
            f"first axis, and the inputs hold a scalar ({short(leaf)}): give inputs with a batch axis "
            "(e.g. x[None]), or pass batch_polymorphic=False to export these exact shapes"
        )
    return jax.ShapeDtypeStruct((batch, *shape[1:]), dtype)  # type: ignore[no-untyped-call]


def export(
    state: ModelState,
    inputs: Any,
    path: str | os.PathLike[str],
    *,
    batch_polymorphic: bool = True,
    use_ema: bool = False,
) -> jax.export.Exported:
    """Writes `state`'s prediction function to `path` with `jax.export`, to serve without its framework.

    The function is `predict_step`'s on a batch's inputs, with the state's arrays inside as constants
    (docs/after_training.md, "Export for serving").

    Args:
        state: a `ciclo.types.ModelState`, under any strategy.
        inputs: sample inputs (arrays or `jax.ShapeDtypeStruct`s) for the shapes and dtypes.
        path: the file to write (its folder is created).
        batch_polymorphic: give every input a symbolic first dimension (any batch size).
        use_ema: export the EMA weights (`state.with_ema_params()`).

    Raises:
        ImportError: without flatbuffers (the `export` extra).
        TypeError: for a flag that is not True or False.

    Example:
        >>> import os, tempfile
        >>> import ciclo, jax.numpy as jnp, optax
        >>> class Scale:  # a ModelAdapter: the model is inputs * params
        ...     def init(self, key, inputs):
        ...         return jnp.full((), 3.0), None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return inputs * params, model_state
        >>> state = ciclo.create_model_state(Scale(), inputs=jnp.ones((1, 2)), tx=optax.sgd(0.1))
        >>> path = os.path.join(tempfile.mkdtemp(), "model.jax")
        >>> ciclo.export(state, jnp.ones((1, 2)), path).in_avals
        (ShapedArray(float32[batch,2]),)
    """
    if not isinstance(state, ModelState):
        raise TypeError(
            f"ciclo.export takes a ciclo.types.ModelState (made by ciclo.create_model_state or a "
            f"framework's create_*_state), got {type(state).__name__}: {short(state)}. A state with "
            "steps of its own has no prediction function ciclo knows: export yours with "
            "jax.export.export(jax.jit(fn))"
        )
    check_bool(batch_polymorphic, "batch_polymorphic")
    check_bool(use_ema, "use_ema")
    _check_serialization()
    if use_ema:
        try:
            state = state.with_ema_params()
        except ValueError as error:
            raise ValueError(f"ciclo.export(use_ema=True): {error}") from None
    served = state.with_strategy("eager")
    batch = jax.export.symbolic_shape(_BATCH)[0] if batch_polymorphic else None
    specs = jax.tree.map(lambda leaf: _spec(leaf, batch), inputs)

    def predict(inputs: Any) -> Any:
        preds, _ = served._apply(inputs, training=False)
        return preds

    try:
        exported = jax.export.export(jax.jit(predict))(specs)
    except Exception as error:  # noqa: BLE001 - any framework's error, or jax's on shapes
        cause = str(error).strip().split("\n")[0]
        hint = (
            "with batch_polymorphic=True the model must work for any batch size: "
            "pass batch_polymorphic=False to export the exact shapes of inputs, or "
            if batch_polymorphic
            else ""
        )
        raise ValueError(
            f"ciclo.export could not export this state's prediction function on inputs {short(specs)} "
            f"({type(error).__name__}: {short(cause, 300)}): {hint}make the adapter's apply traceable "
            "by jax.jit (no host callbacks, no Python branch on array values)"
        ) from error
    try:
        data = exported.serialize()
    except Exception as error:  # noqa: BLE001 - jax refuses pytree types it cannot serialize
        raise ValueError(
            f"ciclo.export could not serialize this state's prediction function ({type(error).__name__}: "
            f"{short(str(error), 300)}): its outputs {exported.out_tree} must be arrays in tuples, lists, "
            "dicts or None, or of types registered with jax.export.register_pytree_node_serialization"
        ) from error
    write_atomically(os.fspath(path), bytes(data) + _MARK + hashlib.sha256(data).digest())
    return exported


def load_exported(path: str | os.PathLike[str]) -> Callable[..., Any]:
    """The prediction function that `ciclo.export` wrote to `path`, as a callable that needs jax alone.

    Raises:
        ValueError: for a file `ciclo.export` did not write, or one damaged since (its checksum
            differs), and for what is not a regular file (a FIFO is not opened).

    Example:
        >>> import os, tempfile
        >>> import ciclo, jax.numpy as jnp, optax
        >>> class Shift:  # a ModelAdapter: the model is inputs + params
        ...     def init(self, key, inputs):
        ...         return jnp.ones(()), None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return inputs + params, model_state
        >>> state = ciclo.create_model_state(Shift(), inputs=jnp.zeros((1,)), tx=optax.sgd(0.1))
        >>> path = os.path.join(tempfile.mkdtemp(), "model.jax")
        >>> _ = ciclo.export(state, jnp.zeros((1,)), path)
        >>> ciclo.load_exported(path)(jnp.arange(3.0))
        Array([1., 2., 3.], dtype=float32)
    """
    _check_serialization()
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
        raise ValueError(
            f"{path} is not a ciclo export: it is not a regular file (a FIFO, a directory or a device); "
            "pass the file ciclo.export wrote"
        )
    with open(path, "rb") as file:
        data = file.read()
    payload, trailer = data[:-_TRAILER], data[-_TRAILER:]
    if trailer != _MARK + hashlib.sha256(payload).digest():
        raise ValueError(
            f"{path} is not a ciclo export, or it is damaged: it does not end with the checksum of its "
            f"contents that ciclo.export writes ({len(data)} bytes). Pass the file ciclo.export wrote, or "
            "export the state again; a file of jax.export alone loads with "
            "jax.export.deserialize(bytearray(data)).call"
        )
    exported = jax.export.deserialize(bytearray(payload))
    call: Callable[..., Any] = exported.call
    return call
