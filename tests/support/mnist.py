"""Synthetic stand-ins for TFDS MNIST, for the snippets of ciclo's READMEs and guide."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def mnist_like(batch_size: int = 8, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches shaped like TFDS MNIST (`image`, `label`): the label is readable from the image."""
    rng = np.random.default_rng(seed)
    while True:
        label = rng.integers(0, 10, size=batch_size)
        image = rng.integers(0, 20, size=(batch_size, 28, 28, 1)).astype(np.float32)
        image[np.arange(batch_size), label, :, 0] = 255.0
        yield {"image": image, "label": label.astype(np.int32)}
