"""One worker's interpreter: decode a batch of items, run them, and return their outputs.

The same `BatchRunner` serves the local pool's worker processes and Ray Data's actors.

Batching: when every input's batch dimension is 1 and the model still works with it resized to
`batch_size` (each output's first dimension follows), `batch_size` items run as one invoke (a
short last group is padded with copies of its first item, so one shape is ever prepared);
otherwise items run one by one. Resizing is not proof that the first dimension is a batch (a
model may reduce over it), so the first group run batched is checked: its first row must not
change when every other row is replaced by a copy of it (`_rows_independent`); if it does,
the runner goes back to one item per invoke and says so in `describe()`.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np

from tflite_taichi.batch.inputs import InputSpec, ItemError, decode
from tflite_taichi.errors import BatchError, TfliteTaichiError

# The batch-independence check compares one row computed beside different rows, by the same
# kernels at the same shape: equal but for float atomics' order, so 1e-5 of the row's largest
# magnitude (float32 rounding over ~100 reordered terms) and one quantization step for 8-bit.
ROW_TOLERANCE = 1e-5



@dataclass
class RunConfig:
    """What a worker needs to build its runner (picklable; the model's bytes travel once)."""
    model: bytes
    backend: str
    precision: str
    batch_size: int
    spec: InputSpec
    info: list                   # output_info: name, item shape, dtype per output
    out_dir: str
    fmt: str
    cache_dir: Optional[str] = None
    part_prefix: str = "part"    # this run's part files: PREFIX-000017.parquet (folder.py)
    imports: tuple = ()          # modules a worker imports first (custom ops: import_modules)
    threads: Optional[int] = None  # each worker's num_threads (None: the Interpreter's default)
    batching_note: Optional[str] = None   # why the model cannot run batches (probe_batching),
                                          # found on the driver: the workers run one item


def import_modules(names) -> None:
    """Import each named module (a user's custom ops register themselves when imported): in the
    driver before the model is read, and in every worker before its Interpreter is built."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:          # ImportError, or whatever the module raises at import
            raise BatchError(f"--import {name}: {type(e).__name__}: {e} (sys.path: "
                             f"{os.pathsep.join(sys.path[:4])}...)") from e


def batch_group(it, resize, spec: InputSpec, info: list, n: int) -> tuple:
    """(items per invoke, why) for interpreter `it`: n where the model runs a batch of n with
    batch-first outputs, else 1. resize(k) gives its inputs k items and allocates; it is left
    allocated for the group chosen."""
    if n <= 1:
        resize(1)
        return 1, "one item per invoke (--batch 1)"
    if not all(spec.batch_dims) or not all(out["batch_dim"] for out in info):
        resize(1)
        return 1, "one item per invoke: an input or output has no batch dimension of 1"
    try:
        resize(n)
        shapes = [[int(size) for size in d["shape"]] for d in it.get_output_details()]
    except TfliteTaichiError as e:
        resize(1)
        return 1, f"one item per invoke: the model does not take batch {n} ({e})"
    if any(len(s) == 0 or s[0] != n for s in shapes):
        resize(1)
        return 1, (f"one item per invoke: with batch {n} the outputs' shapes are {shapes}, "
                   "not batch-first")
    return n, f"{n} items per invoke"


def resizer(it, spec: InputSpec):
    """resize(n) for batch_group: `it`'s inputs to n items each (an input already of that shape
    is left as the model declares it, so the interpreter prepares it as a user's loop does),
    then allocate."""
    inputs = [d["index"] for d in it.get_input_details()]

    def resize(n: int) -> None:
        current = {d["index"]: list(d["shape"]) for d in it.get_input_details()}
        for index, shape, batched in zip(inputs, spec.item_shapes, spec.batch_dims):
            wanted = [n, *shape] if batched else list(shape)
            if current[index] != wanted:
                it.resize_tensor_input(index, wanted)
        it.allocate_tensors()
    return resize


def probe_batching(reader, spec: InputSpec, info: list, n: int) -> Optional[str]:
    """Why the model cannot run batches of n, found on the driver's reference interpreter
    `reader` (numpy: no kernels to build, milliseconds), or None when it can (the workers then
    check on their own backend). A model that cannot batch is known before any worker starts,
    so no worker builds kernels for a batch it will not run (on cpu each kernel is machine code
    built at load: seconds a worker)."""
    if n <= 1:
        return None
    group, note = batch_group(reader, resizer(reader, spec), spec, info, n)
    return note if group == 1 else None


class BatchRunner:
    def __init__(self, config: RunConfig):
        from tflite_taichi.interpreter import Interpreter
        self.config = config
        import_modules(config.imports)
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")    # the delegate's partition notes, once per worker
            self.it = Interpreter(model_content=config.model, backend=config.backend,
                                  precision=config.precision, cache_dir=config.cache_dir,
                                  num_threads=config.threads)
            self.inputs = [d["index"] for d in self.it.get_input_details()]
            self.outputs = [d["index"] for d in self.it.get_output_details()]
            self.group, self.batching_note = self._choose_group(config.batch_size)
        self.checked = self.group == 1
        self.start_seconds = time.perf_counter() - started

    def describe(self) -> dict:
        return {"backend": self.it.backend, "items_per_invoke": self.group,
                "batching": self.batching_note, "start_s": round(self.start_seconds, 3),
                "pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}

    # -- batching ---------------------------------------------------------------------------
    def _resize(self, n: int) -> None:
        resizer(self.it, self.config.spec)(n)

    def _choose_group(self, n: int) -> tuple:
        if n > 1 and self.config.batching_note is not None:
            n = 1           # the driver found it cannot batch: no kernels built for a batch of n
        group, note = batch_group(self.it, self._resize, self.config.spec, self.config.info, n)
        return group, self.config.batching_note or note

    def _resize_back(self) -> None:
        self._resize(1)

    def _invoke(self, arrays: list) -> list:
        for index, value in zip(self.inputs, arrays):
            self.it.set_tensor(index, value)
        self.it.invoke()
        return [np.array(self.it.get_tensor(index), copy=True) for index in self.outputs]

    def _rows_independent(self, group: list) -> bool:
        """Row 0 of the outputs for `group`, against the same with every row a copy of row 0."""
        mixed = self._invoke([np.stack(column) for column in zip(*group)])
        same = self._invoke([np.stack([value] * self.group) for value in group[0]])
        for a, b in zip(mixed, same):
            a, b = a[0], b[0]
            if a.dtype.kind == "f":
                scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1.0)
                if not np.all(np.abs(a - b) <= ROW_TOLERANCE * scale):
                    return False
            elif np.any(np.abs(a.astype(np.int64) - b.astype(np.int64)) > 1):
                return False
        return True

    # -- running ----------------------------------------------------------------------------
    def run(self, items: list) -> tuple:
        """items: [(key, payload)] -> (keys, [stacked outputs per output], [(key, reason)])."""
        decoded, errors = [], []
        for key, payload in items:
            try:
                decoded.append((key, decode(self.config.spec, key, payload)))
            except ItemError as e:
                errors.append((key, str(e)))
            except BatchError:
                raise            # the run's configuration, not this item (no Pillow, say)
            except Exception as e:  # noqa: BLE001 - MemoryError, a decoder's bug: this item only
                errors.append((key, f"cannot be decoded ({type(e).__name__}: {e})"))
        keys, rows = [], [[] for _ in self.outputs]
        step = self.group
        for start in range(0, len(decoded), step):
            chunk = decoded[start:start + step]
            try:
                values = self._run_chunk([arrays for _, arrays in chunk])
            except TfliteTaichiError as e:
                errors += [(key, f"the invoke failed: {type(e).__name__}: {e}") for key, _ in chunk]
                continue
            for (key, _), item_outputs in zip(chunk, values):
                problem = self._check_shapes(item_outputs)
                if problem:
                    errors.append((key, problem))
                    continue
                keys.append(key)
                for column, value in zip(rows, item_outputs):
                    column.append(value)
        stacked = [np.stack(column) if column else
                   np.zeros((0, *spec["shape"]), spec["dtype"])
                   for column, spec in zip(rows, self.config.info)]
        return keys, stacked, errors

    def _run_chunk(self, group: list) -> list:
        """[[output per model output] per item] for a list of items' decoded arrays."""
        if self.group == 1:
            spec, info = self.config.spec, self.config.info
            return [[o[0] if out["batch_dim"] else o for o, out in zip(
                        self._invoke([a[None] if batched else a
                                      for a, batched in zip(arrays, spec.batch_dims)]), info)]
                    for arrays in group]
        padded = group + [group[0]] * (self.group - len(group))
        if not self.checked:
            self.checked = True
            if len(group) > 1 and not self._rows_independent(padded):
                self._resize_back()
                self.group = 1
                self.batching_note = ("one item per invoke: the model's first dimension is not "
                                      "a batch (a row changed with its neighbours)")
                return self._run_chunk(group)
        outputs = self._invoke([np.stack(column) for column in zip(*padded)])
        return [[o[i] for o in outputs] for i in range(len(group))]

    def _check_shapes(self, item_outputs: list) -> Optional[str]:
        for value, spec in zip(item_outputs, self.config.info):
            if list(value.shape) != spec["shape"]:
                return (f"output '{spec['name']}' has shape {list(value.shape)} for this input, "
                        f"not {spec['shape']} (outputs of a batch run have one shape)")
        return None
