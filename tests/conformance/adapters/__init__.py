"""The adapters the conformance suite runs on: one module of this package per row of `TABLE`.

Each module defines `NAME`, `REQUIRES`, `ENTRY_POINT` and
`make_state(kind, *, features, classes, tx, losses, metrics, strategy, key, **options)`,
where `options` are the training options every `create_*_state` takes (`precision`,
`accumulate_steps`, `ema_decay`), and `kind` is `"mlp"` (features -> 64 -> relu -> classes) or `"bn_dropout"`
(features -> 64 -> batch norm -> relu -> dropout -> classes).

For `ciclo.testing`, each module also defines `INITIALISED` (True where the models are built
initialised, nnx and equinox: the kit gets their variables, `init` refuses) and `call_model(kind)`:
how to run the model its adapter's `to_model` gives (None where the model is called as it is or has
no `to_model`).
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from support.docs import installed


@dataclasses.dataclass(frozen=True)
class Adapter:
    name: str
    requires: str | None
    entry_point: str | None

    @property
    def available(self) -> bool:
        return self.requires is None or installed(self.requires)

    def load(self) -> ModuleType:
        return importlib.import_module(f"conformance.adapters.{self.name}")


TABLE = (
    Adapter("jax", None, None),  # the plain-JAX adapter of docs/adapter.md
    Adapter("flax_linen", "flax", "create_flax_state"),
    Adapter("flax_nnx", "flax", "create_flax_state"),
    Adapter("haiku", "haiku", "create_haiku_state"),
    Adapter("equinox", "equinox", "create_equinox_state"),
)
