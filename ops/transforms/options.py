"""The custom options of the transform ops, flexbuffer maps read as MediaPipe's kernels and the
GPU delegate's parsers read them (the package's __init__ lists the keys), into frozen options;
`flex_options` writes them (tests, builders).
"""
from dataclasses import dataclass

import numpy as np

from tflite_taichi.errors import ModelError

from ..common import flexbuffer_map


def _op_fail(op, message) -> ModelError:
    return ModelError(f"op #{op.index} ({op.name}): {message}")


def _int(op, options: dict, key: str, default=None) -> int:
    value = options.get(key, default)
    if value is None:
        raise _op_fail(op, f"custom_options lack '{key}'")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _op_fail(op, f"custom_options '{key}' must be an integer, is {value!r}")
    if not -2 ** 31 <= value < 2 ** 31:
        raise _op_fail(op, f"custom_options '{key}' = {value} does not fit an int32")
    return value


def _float(op, options: dict, key: str, default=None) -> float:
    value = options.get(key, default)
    if value is None:
        raise _op_fail(op, f"custom_options lack '{key}'")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _op_fail(op, f"custom_options '{key}' must be a number, is {value!r}")
    return float(np.float32(value))


def _ints(op, options: dict, key: str, length=None) -> tuple:
    value = options.get(key)
    if value is None:
        raise _op_fail(op, f"custom_options lack '{key}'")
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int)
                                          for v in value):
        raise _op_fail(op, f"custom_options '{key}' must be a vector of integers, is {value!r}")
    if length is not None and len(value) != length:
        raise _op_fail(op, f"custom_options '{key}' must have {length} entries, has {value}")
    return tuple(int(v) for v in value)


def _pairs(indices: tuple) -> tuple:
    """The subset as the kernels read it: pairs, an odd last index paired with itself."""
    pairs = [(indices[i], indices[i + 1]) for i in range(0, len(indices) - 1, 2)]
    if len(indices) % 2:
        pairs.append((indices[-1], indices[-1]))
    return tuple(pairs)


def flex_options(**fields) -> bytes:
    """A flexbuffer map as converters write these ops' custom_options: ints, floats, strings,
    and typed vectors of ints."""
    from flatbuffers import flexbuffers
    b = flexbuffers.Builder()
    with b.Map():
        for key in sorted(fields):
            value = fields[key]
            if isinstance(value, (list, tuple)):
                b.Key(key)
                b.TypedVectorFromElements([int(v) for v in value])
            elif isinstance(value, str):
                b.String(key, value)
            elif isinstance(value, float):
                b.Float(key, value)
            else:
                b.Int(key, int(value))
    return bytes(b.Finish())


@dataclass(frozen=True)
class TransformTensorOptions:
    output_h: int
    output_w: int
    align_corners: bool        # v2


def parse_transform_tensor(op) -> TransformTensorOptions:
    if op.version == 1:
        o = flexbuffer_map(op, "v1: output_size [h, w], mode 'bilinear'")
        mode = o.get("mode", "bilinear")
        if mode != "bilinear":
            raise _op_fail(op, f"custom_options mode is {mode!r}; only 'bilinear' exists")
        h, w = _ints(op, o, "output_size", 2)
        return TransformTensorOptions(h, w, False)
    o = flexbuffer_map(op, "v2: output_height, output_width")
    return TransformTensorOptions(_int(op, o, "output_height"), _int(op, o, "output_width"), True)


@dataclass(frozen=True)
class LandmarksMatrixV1:
    input_hw: tuple
    output_hw: tuple
    dimensions: int
    landmarks_range: int
    bbox_size_multiplier: float
    left: int
    right: int
    subset: tuple              # pairs of landmark indices


@dataclass(frozen=True)
class LandmarksMatrixV2:
    subset: tuple              # pairs of landmark indices
    left: int
    right: int
    target_rotation: float
    output_h: int
    output_w: int
    scale_x: float
    scale_y: float


def parse_landmarks_matrix(op):
    if op.version == 1:
        o = flexbuffer_map(op, "v1: input_hw, output_hw, dimensions, landmarks_range, "
                      "bbox_size_multiplier, left_rotation_idx, right_rotation_idx, subset")
        return LandmarksMatrixV1(
            input_hw=_ints(op, o, "input_hw", 2), output_hw=_ints(op, o, "output_hw", 2),
            dimensions=_int(op, o, "dimensions"), landmarks_range=_int(op, o, "landmarks_range"),
            bbox_size_multiplier=_float(op, o, "bbox_size_multiplier"),
            left=_int(op, o, "left_rotation_idx"), right=_int(op, o, "right_rotation_idx"),
            subset=_pairs(_ints(op, o, "subset")))
    o = flexbuffer_map(op, "v2: subset_idxs, left_rotation_idx, right_rotation_idx, "
                  "target_rotation_radians, output_height, output_width, scale_x, scale_y")
    return LandmarksMatrixV2(
        subset=_pairs(_ints(op, o, "subset_idxs")), left=_int(op, o, "left_rotation_idx"),
        right=_int(op, o, "right_rotation_idx"),
        target_rotation=_float(op, o, "target_rotation_radians"),
        output_h=_int(op, o, "output_height"), output_w=_int(op, o, "output_width"),
        scale_x=_float(op, o, "scale_x"), scale_y=_float(op, o, "scale_y"))


@dataclass(frozen=True)
class TransformLandmarksOptions:
    dimensions: int            # v1 (v2: the landmarks' last dimension)
    scale: float


def parse_transform_landmarks(op) -> TransformLandmarksOptions:
    if op.version != 1:                # v2 reads no options
        return TransformLandmarksOptions(dimensions=0, scale=1.0)
    o = flexbuffer_map(op, "v1: dimensions, scale") if op.custom_options else {}
    return TransformLandmarksOptions(dimensions=_int(op, o, "dimensions", 3),
                                     scale=_float(op, o, "scale", 1.0))

