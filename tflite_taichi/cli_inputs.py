"""What the command line makes of a model's inputs (run, inspect, bench): --input NAME=file.npy
and --shape NAME=D1,D2 matched to the model's inputs by tensor or signature name, shapes held
to what the model declares (its -1 dimensions are the ones sized at run time), and what to say
when a model with run-time-sized inputs cannot run at their placeholder size."""
from __future__ import annotations

import numpy as np


class UsageError(Exception):
    """A mistake in the command line (a file --input names, an input name): main() prints it as
    one line, `tflite-taichi <command>: error: ...`, and exits with 2, as argparse does."""


def parse_input_args(pairs) -> dict:
    """--input NAME=file.npy arguments -> {NAME: path}, before any file is read."""
    given = {}
    for pair in pairs or []:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input takes NAME=file.npy, got {pair!r}")
        if name in given:
            raise UsageError(f"--input {name} is given twice")
        given[name] = path
    return given


def read_npy(name: str, path: str) -> np.ndarray:
    """The array numpy.save wrote to `path` (for input `name`); a UsageError naming both if not."""
    magic = np.lib.format.MAGIC_PREFIX
    try:
        with open(path, "rb") as f:
            head = f.read(len(magic))
            if head != magic:
                # np.load would try the file as a pickle (refused) and say "pickled data"
                kind = "a .npz archive" if head.startswith(b"PK") else "not a .npy file"
                raise UsageError(f"--input {name}: {path} is {kind}; give one array saved with "
                                 "numpy.save")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"--input {name}: no such file: {path}") from None
    except OSError as e:
        raise UsageError(f"--input {name}: cannot read {path}: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:     # a truncated file, an array of Python objects
        raise UsageError(f"--input {name}: {path} is not a readable .npy file ({e})") from None


def refuse_float64(array: np.ndarray, detail, what: str) -> None:
    """A UsageError naming the fix where `array` is float64 (numpy's default float, so what
    np.random and np.array give) for an input that is not: converting it quietly would hide a
    loss of precision the user did not choose; the same rule as batch's."""
    dtype = np.dtype(detail["dtype"])
    if array.dtype != np.float64 or dtype == np.float64:
        return
    raise UsageError(f"{what} holds float64 data, but input '{detail['name']}' takes {dtype.name}: "
                     f"save it as x.astype(np.{dtype.name})")


def inputs_by_name(it) -> dict:
    """{every name --input accepts: the input's detail}: each model input's tensor name, and
    its name in the signatures of the main graph (e.g. `keras_tensor`, as
    get_signature_list() gives it, beside the tensor's `serving_default_keras_tensor:0`)."""
    details = {d["index"]: d for d in it.get_input_details()}
    names = {d["name"]: d for d in details.values()}
    for sig in it.model.signatures:
        if sig.subgraph_index == it.model.main.index:
            for name, t in sig.inputs.items():
                if t in details:
                    names.setdefault(name, details[t])
    return names


def needs_shapes(unsized, error) -> str:
    """What to say when a model with run-time-sized inputs fails at their placeholder shapes."""
    inputs = "; ".join(f"'{d['name']}' is declared {signature_text(d)} (tried as "
                       f"{[int(n) for n in d['shape']]})" for d in unsized)
    example = unsized[0]["name"]
    return (f"the model cannot run at the placeholder shape of its run-time-sized input(s) "
            f"({error}). {inputs}: give a shape with --shape {example}=1,16000 (say), or an "
            f"array with --input {example}=file.npy")


def match_inputs(it, given: dict, option: str = "--input") -> dict:
    """{input tensor index: (NAME, value)} of the --input (or --shape) arguments, by tensor or
    signature name; a UsageError lists the names there are."""
    names = inputs_by_name(it)
    unknown = [name for name in given if name not in names]
    if unknown:
        raise UsageError(f"the model has no input named {', '.join(map(repr, unknown))}; its "
                         f"inputs: {', '.join(map(repr, names))}")
    matched = {}
    for name, path in given.items():
        index = names[name]["index"]
        if index in matched:
            raise UsageError(f"{option} {matched[index][0]} and {option} {name} name the same "
                             f"input, '{names[name]['name']}'")
        matched[index] = (name, path)
    return matched


def parse_shape_args(pairs) -> dict:
    """--shape NAME=1,16000 arguments -> {NAME: (1, 16000)}."""
    shapes = {}
    for pair in pairs or []:
        name, sep, dims = pair.partition("=")
        try:
            shape = tuple(int(n) for n in dims.replace("x", ",").split(",") if n.strip())
        except ValueError:
            shape = None
        if not sep or not name or shape is None or any(n < 0 for n in shape):
            raise UsageError(f"--shape takes NAME=D1,D2,... (whole numbers >= 0), got {pair!r}")
        if name in shapes:
            raise UsageError(f"--shape {name} is given twice")
        shapes[name] = shape
    return shapes


def signature_text(d) -> str:
    """An input's declared shape, its run-time-sized dimensions as -1: '[-1, -1]'."""
    return str([int(n) for n in d["shape_signature"]])


def check_declared_shape(d, shape, what: str) -> None:
    """A UsageError unless `shape` differs from input `d`'s declared shape only in dimensions
    the model marks run-time-sized (-1 in its shape_signature), as LiteRT's strict resize asks."""
    sig = [int(n) for n in d["shape_signature"]]
    if len(sig) == len(shape) and all(s == -1 or s == n for s, n in zip(sig, shape)):
        return
    raise UsageError(f"{what}: {list(shape)} does not fit input '{d['name']}', declared "
                     f"{signature_text(d)} (only its -1 dimensions are sized at run time); "
                     "add --resize to resize the input anyway (the model may not work at that "
                     "shape)")




def apply_shapes(it, shape_pairs, resize: bool = False) -> dict:
    """Resize `it`'s inputs to the --shape arguments (held to the declared shape unless
    `resize`); returns {input tensor index: (NAME, shape)} of those given."""
    sized = match_inputs(it, parse_shape_args(shape_pairs), "--shape")
    for d in it.get_input_details():
        if d["index"] in sized:
            name, shape = sized[d["index"]]
            if not resize:
                check_declared_shape(d, shape, f"--shape {name}")
            if tuple(shape) != tuple(d["shape"]):
                it.resize_tensor_input(d["index"], shape)
    return sized
