"""Gaussian blobs around fixed centres: a separable classification task for the adapter tests."""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike


def blobs(
    n: int, seed: int = 0, *, features: int, classes: int, centres_dtype: DTypeLike = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """`n` float32 inputs around `classes` fixed centres, and their int32 labels.

    `centres_dtype` is the precision the centres are computed in before the
    inputs are rounded to float32 (the conformance suite's data uses float64).
    """
    centres = np.random.default_rng(1234).normal(size=(classes, features)).astype(centres_dtype) * 3
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n).astype(np.int32)
    inputs = (centres[labels] + rng.normal(size=(n, features))).astype(np.float32)
    return inputs, labels


def blob_batches(
    steps: int,
    seed: int = 0,
    *,
    features: int,
    classes: int,
    batch: int,
    centres_dtype: DTypeLike = np.float32,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` batches of `batch` blobs, as `(inputs, labels)` tuples."""
    inputs, labels = blobs(
        steps * batch, seed, features=features, classes=classes, centres_dtype=centres_dtype
    )
    return [(inputs[i : i + batch], labels[i : i + batch]) for i in range(0, steps * batch, batch)]
