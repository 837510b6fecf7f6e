"""Cases for control ops shared by the tests (moved from test_ops_control.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_control.py and the
delegate's tests."""
import numpy as np
from tflite_taichi.builder import ModelBuilder


I32 = np.int32


def _subgraph(b, name, inputs, build):
    """A subgraph taking `inputs` [(name, shape, dtype, quantization)]; `build(g, ins)` adds its
    ops and returns its outputs."""
    g = b.subgraph(name)
    ins = [g.input(n, shape, dtype, q) for n, shape, dtype, q in inputs]
    g.output(*build(g, ins))
    return g


def _binary(g, op, a, b, shape, dtype=np.float32, q=None, name="y"):
    y = g.tensor(name, shape, dtype, q)
    g.op(op, [a, b], [y])
    return y


def _while_with_body(body_outputs, cond=None):
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (2,))
    y = g.tensor("y", (2,))
    g.op("WHILE", [x], [y], cond_subgraph_index=1, body_subgraph_index=2)
    g.output(y)
    _subgraph(b, "cond", [("x", (2,), np.float32, None)],
              cond or (lambda sg, v: [_reduce_any_less(sg, v[0])]))
    _subgraph(b, "body", [("x", (2,), np.float32, None)], body_outputs)
    return b.finish()


def _reduce_any_less(sg, x):
    less = _binary(sg, "LESS", x, sg.const("ten", np.float32(10)), (2,), np.bool_, name="less")
    go = sg.tensor("go", (), np.bool_)
    sg.op("REDUCE_ANY", [less, sg.const("axis", np.array([0], I32))], [go])
    return go
