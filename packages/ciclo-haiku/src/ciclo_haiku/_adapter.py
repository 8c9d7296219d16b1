"""The `ModelAdapter` of haiku functions: haiku params trained, haiku state kept as model state."""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
from typing import Any, Final, final

import haiku as hk
import jax

AUTO: Final = "auto"
# In lookup order; `deterministic` is passed as `not training`.
TRAINING_FLAGS = ("is_training", "training", "train", "deterministic")

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _calling_convention(
    transformed: hk.Transformed | hk.TransformedWithState,
) -> tuple[bool, list[inspect.Parameter] | None]:
    """Whether `transformed.apply` takes an rng, and the parameters of the function it runs (None: unknown).

    haiku gives `apply` the signature `(params, [state,] rng, *function's parameters)`, without `rng` after
    `hk.without_apply_rng`.
    """
    try:
        parameters = list(inspect.signature(transformed.apply).parameters.values())
    except (TypeError, ValueError):  # not introspectable: assume haiku's default convention
        return True, None
    rest = parameters[2 if isinstance(transformed, hk.TransformedWithState) else 1 :]
    if rest and rest[0].kind is inspect.Parameter.VAR_POSITIONAL:  # a generic (*args, **kwargs) wrapper
        return True, None
    if rest and rest[0].name == "rng":
        return True, rest[1:]
    return False, rest


@final
@dataclasses.dataclass(frozen=True, eq=False)
class HaikuAdapter:
    """Initialises and applies a haiku transformed function for `ciclo.types.ModelState`.

    The haiku params are trained, the haiku state is the model state (None if
    empty), and the step key is the haiku rng. The function is initialised in
    training mode and gets its training flag by keyword: `training_flag="auto"`
    looks for one in its signature, a name is that argument, None sets none.
    See docs/frameworks/haiku.md.

    Attributes:
        transformed: the `hk.Transformed` or `hk.TransformedWithState`.
        training_flag: `"auto"`, the name of the argument set to the training
            flag, or None.
        flag: `training_flag` resolved: the argument set for each step, or None.
        takes_rng: whether `transformed.apply` takes an rng.

    Example:
        >>> import haiku as hk, jax, jax.numpy as jnp
        >>> def forward(x, is_training):
        ...     x = hk.Linear(3)(x)
        ...     return hk.dropout(hk.next_rng_key(), 0.5, x) if is_training else x
        >>> adapter = HaikuAdapter(hk.transform(forward))
        >>> params, model_state = adapter.init(jax.random.key(0), jnp.ones((1, 2)))
        >>> key = jax.random.key(1)
        >>> outputs, _ = adapter.apply(params, model_state, jnp.ones((4, 2)), key=key, training=True)
        >>> outputs.shape, model_state, adapter.flag
        ((4, 3), None, 'is_training')
    """

    transformed: hk.Transformed | hk.TransformedWithState
    training_flag: str | None = AUTO
    flag: str | None = dataclasses.field(init=False, repr=False)
    takes_rng: bool = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.transformed, (hk.Transformed, hk.TransformedWithState)):
            raise TypeError(
                "HaikuAdapter takes an hk.Transformed or an hk.TransformedWithState (hk.transform(f) or "
                f"hk.transform_with_state(f)), got {type(self.transformed).__name__}"
            )
        if self.training_flag is not None and not isinstance(self.training_flag, str):
            raise TypeError(
                "training_flag must be 'auto', the name of an argument or None, "
                f"got {reprlib.repr(self.training_flag)}"
            )
        takes_rng, parameters = _calling_convention(self.transformed)
        keywords = {parameter.name for parameter in parameters or () if parameter.kind in _KEYWORD_KINDS}
        flag = self.training_flag
        if flag == AUTO:
            flag = next((name for name in TRAINING_FLAGS if name in keywords), None)
        elif (
            flag is not None
            and flag not in keywords
            and parameters is not None
            and all(parameter.kind is not inspect.Parameter.VAR_KEYWORD for parameter in parameters)
        ):
            raise TypeError(
                f"training_flag={reprlib.repr(flag)}, but the model's function takes no keyword argument "
                f"{reprlib.repr(flag)}: its arguments are ({', '.join(p.name for p in parameters)}); "
                "pass training_flag=None to set none"
            )
        object.__setattr__(self, "flag", flag)
        object.__setattr__(self, "takes_rng", takes_rng)

    def _flag(self, training: bool) -> dict[str, bool]:
        if self.flag is None:
            return {}
        return {self.flag: (not training) if self.flag == "deterministic" else training}

    def init(self, key: jax.Array, inputs: Any, /) -> tuple[Any, Any]:
        """Runs `transformed.init` in training mode: `(params, haiku state or None)`."""
        if isinstance(self.transformed, hk.TransformedWithState):
            params, state = self.transformed.init(key, inputs, **self._flag(True))
            return params, (state or None)
        return self.transformed.init(key, inputs, **self._flag(True)), None

    def apply(
        self, params: Any, model_state: Any, inputs: Any, /, *, key: jax.Array, training: bool
    ) -> tuple[Any, Any]:
        """Runs `transformed.apply` with `key` as its rng; the new haiku state is kept in training only."""
        rng = (key,) if self.takes_rng else ()
        flag = self._flag(training)
        if isinstance(self.transformed, hk.Transformed):
            return self.transformed.apply(params, *rng, inputs, **flag), model_state
        outputs, new_state = self.transformed.apply(params, model_state or {}, *rng, inputs, **flag)
        return outputs, (new_state if training and model_state is not None else model_state)

    def to_model(self, params: Any, model_state: Any, /) -> Any:
        """What `transformed.init` gives: `params` for an `hk.Transformed`, else `(params, state)`."""
        if isinstance(self.transformed, hk.Transformed):
            return params
        return params, (model_state or {})
