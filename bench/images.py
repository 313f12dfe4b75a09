"""An image folder for the benchmarks' 32x32 RGB models (no download): random images in 10 class
folders, each class a mean colour plus noise, so they can be learnt; read by `data.name: hf`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

IMAGES = 640
"""Images written by default (a 20% test split is held out of them)."""


def image_folder(root: Path, count: int = IMAGES, size: int = 32) -> list[str]:
    """`count` random `size`x`size` RGB PNGs in 10 class folders under `root` (written once);
    returns the `hf` data keys that read them."""
    g = np.random.default_rng(0)
    for k in range(count):
        folder = root / f"class{k % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        colour = np.array([(k % 10) * 25, 255 - (k % 10) * 25, 128])
        pixels = np.clip(colour + g.normal(0, 40, (size, size, 3)), 0, 255).astype(np.uint8)
        if not (folder / f"{k}.png").exists():
            Image.fromarray(pixels).save(folder / f"{k}.png")
    return ["data.name=hf", f"data.path={root}", "data.features.image=image"]
