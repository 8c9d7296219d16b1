"""The plain-JAX adapter written in docs/adapter.md ("Writing an adapter: a new framework in 50 lines")."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from support.docs import DOCS, Session

import ciclo

NAME = "jax"
REQUIRES = None
ENTRY_POINT = None
INITIALISED = False


def call_model(kind: str, *, classes: int) -> None:
    return None  # the page's adapter has no to_model


_page = Session(DOCS / "adapter.md")
_page.run_upto(0)  # the first block defines the adapter
MLP = _page.namespace["MLP"]


def make_state(kind: str, *, features: int, classes: int, **settings: Any) -> ciclo.types.ModelState:
    if kind not in ("mlp", "bn_dropout"):
        raise ValueError(f"unknown model kind {kind!r}")
    bn_dropout = kind == "bn_dropout"
    adapter = MLP(hidden=64, classes=classes, batch_norm=bn_dropout, dropout=0.3 if bn_dropout else 0.0)
    return ciclo.create_model_state(adapter, inputs=jnp.zeros((1, features)), **settings)
