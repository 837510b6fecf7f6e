"""Shared by the batch tests: folders of input arrays."""
import os

import numpy as np


def write_arrays(folder, count, shape, seed=0, width=2, zeros=False) -> dict:
    """`count` float32 arrays a00.npy, a01.npy, ... (`width` digits) of `shape` in `folder`,
    made here (one standard_normal draw each, or zeros); returns {path: array}."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for i in range(count):
        path = os.path.join(str(folder), f"a{i:0{width}d}.npy")
        arrays[path] = np.zeros(shape, np.float32) if zeros else rng.standard_normal(shape).astype(np.float32)
        np.save(path, arrays[path])
    return arrays
