"""Cases for PAD, SLICE, STRIDED_SLICE (every spec: masks, ellipsis, new axes, shrinks, negative
strides, offset; numpy's index for a spec, and where LiteRT is wrong), SPLIT and SPLIT_V: their
case spaces, used by test_ops_slicing.py and the shape family's delegate table (cases/shape.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import strategies


S = strategies()


# -- PAD / PADV2 ------------------------------------------------------------------------------
@st.composite
def pad_case(draw):
    shape = draw(S.shapes(1, 4, 1, 5))
    pads = np.array([[draw(st.integers(0, 3)), draw(st.integers(0, 3))] for _ in shape], np.int32)
    out = tuple(int(d + lo + hi) for d, (lo, hi) in zip(shape, pads))
    return shape, pads, out


# -- SLICE ------------------------------------------------------------------------------------
@st.composite
def slice_case(draw):
    shape = draw(S.shapes(1, 4, 1, 6))
    begin, size, out = [], [], []
    for n in shape:
        b = draw(st.integers(0, n - 1))
        s = draw(st.one_of(st.just(-1), st.integers(1, n - b)))
        begin.append(b)
        size.append(s)
        out.append(n - b if s == -1 else s)
    return shape, begin, size, tuple(out)


# -- STRIDED_SLICE ----------------------------------------------------------------------------
@st.composite
def strided_spec(draw, shape, max_spec=6, litert_safe=False):
    """A random slice spec for `shape`: per entry a kind and begin/end/stride values, plus masks.
    litert_safe: keep clear of LiteRT's bugs (no ellipsis together with a new axis, no negative
    stride on a shrink entry; the empty non-final ellipsis is left to the caller's assume()).

    Returns (begin, end, strides, masks dict, kinds)."""
    rank = len(shape)
    kinds = []
    consuming = 0
    has_ellipsis = False
    allow_new = allow_ellipsis = True
    if litert_safe:
        allow_new = draw(st.booleans())
        allow_ellipsis = not allow_new
    for _ in range(draw(st.integers(1, max_spec))):
        room = not litert_safe or rank + kinds.count("new") < 5   # LiteRT: at most 5 dims
        options = ["new"] if allow_new and room else []
        if consuming < rank:
            options += ["slice", "slice", "shrink"]
        if not has_ellipsis and allow_ellipsis:
            options.append("ellipsis")
        if not options:
            break
        kind = draw(st.sampled_from(options))
        kinds.append(kind)
        consuming += kind in ("slice", "shrink")
        has_ellipsis |= kind == "ellipsis"
    # dimension each consuming entry indexes (the ellipsis covers what the others leave)
    n_consuming = sum(k in ("slice", "shrink") for k in kinds)
    dims, d = [], 0
    for k in kinds:
        if k == "ellipsis":
            d += rank - n_consuming
            dims.append(None)
        elif k == "new":
            dims.append(None)
        else:
            dims.append(d)
            d += 1
    begin, end, strides = [], [], []
    begin_mask = end_mask = shrink_mask = new_mask = ellipsis_mask = 0
    for i, (k, dim) in enumerate(zip(kinds, dims)):
        n = shape[dim] if dim is not None else 1
        stride = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        b = draw(st.integers(-n - 2, n + 2))
        e = draw(st.integers(-n - 2, n + 2))
        if k == "shrink":
            stride = draw(st.sampled_from([1, 1, 2] if litert_safe else [1, 1, 2, -1]))
            b = draw(st.integers(-n, n - 1))
            shrink_mask |= 1 << i
        if k == "new":
            new_mask |= 1 << i
        if k == "ellipsis":
            ellipsis_mask |= 1 << i
            if draw(st.booleans()):
                new_mask |= 1 << i          # the ellipsis wins
        if draw(st.integers(0, 3)) == 0:
            begin_mask |= 1 << i
        if draw(st.integers(0, 3)) == 0:
            end_mask |= 1 << i
        if k != "shrink" and draw(st.integers(0, 7)) == 0:
            shrink_mask |= (1 << i) if k == "new" else 0   # new_axis wins over shrink
        begin.append(b)
        end.append(e)
        strides.append(stride)
    masks = dict(begin_mask=begin_mask, end_mask=end_mask, ellipsis_mask=ellipsis_mask,
                 new_axis_mask=new_mask, shrink_axis_mask=shrink_mask)
    return begin, end, strides, masks, kinds


def numpy_index(begin, end, strides, masks, kinds):
    """The Python index expression a spec stands for (numpy is the oracle here)."""
    index = []
    for i, k in enumerate(kinds):
        bm, em = masks["begin_mask"] >> i & 1, masks["end_mask"] >> i & 1
        if k == "ellipsis":
            index.append(Ellipsis)
        elif k == "new":
            index.append(None)
        elif k == "shrink":
            index.append((0 if strides[i] > 0 else -1) if bm else begin[i])
        else:
            index.append(slice(None if bm else begin[i], None if em else end[i], strides[i]))
    return tuple(index)


def _litert_is_wrong(shape, kinds, strides, masks):
    """The spec hits one of LiteRT's known STRIDED_SLICE bugs."""
    if "ellipsis" in kinds and "new" in kinds:
        return True       # docs/ops.md, the oracle's caveats: crashes or garbage
    if "ellipsis" in kinds and kinds[-1] != "ellipsis":
        covered = len(shape) - sum(k in ("slice", "shrink") for k in kinds)
        if covered == 0:
            return True   # docs/ops.md: an empty ellipsis that is not last slices wrongly
    if any(k == "shrink" and s < 0 for k, s in zip(kinds, strides)):
        return True       # measured here: a shrink entry with a negative stride yields zeros
    return False


@st.composite
def offset_case(draw):
    shape = draw(S.shapes(1, 4, 1, 6))
    begin, size, strides = [], [], []
    for n in shape:
        stride = draw(st.sampled_from([1, 1, 2, -1]))
        count = draw(st.integers(0, n if abs(stride) == 1 else (n + 1) // 2))
        span = (count - 1) * abs(stride) + 1 if count else 0
        if stride > 0:
            b = draw(st.integers(0, n - span))
        else:
            # LiteRT adds the size to begin and then wraps a negative end, so a window that
            # reaches element 0 (begin + size == -1) yields garbage there: stop one short.
            count = min(count, n - 1)
            b = draw(st.integers(count, n - 1))
        if draw(st.booleans()):
            b -= n                    # negative begin counts from the end
        begin.append(b)
        size.append(count * stride)   # end holds the extent from begin, in input elements
        strides.append(stride)
    return shape, begin, size, strides


@st.composite
def split_case(draw):
    """(input shape, axis (maybe negative), num_splits, output shape)."""
    shape = list(draw(S.shapes(1, 4, 1, 4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    num, piece = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    shape[axis] = num * piece
    out = list(shape)
    out[axis] = piece
    return tuple(shape), axis, num, tuple(out)


@st.composite
def split_v_case(draw):
    """(input shape, axis, size_splits (maybe one -1), output shapes)."""
    shape = list(draw(S.shapes(1, 4, 1, 4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    shape[axis] = sum(sizes)
    outs = []
    for size in sizes:
        o = list(shape)
        o[axis] = size
        outs.append(tuple(o))
    size_splits = list(sizes)
    if draw(st.booleans()):
        size_splits[draw(st.integers(0, len(sizes) - 1))] = -1
    return tuple(shape), axis, size_splits, outs
