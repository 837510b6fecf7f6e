"""Cases for control ops shared by the tests: hypothesis
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


def _unary(g, x, op, shape, dtype=np.float32, q=None, name="y"):
    y = g.tensor(name, shape, dtype, q)
    g.op(op, [x], [y])
    return y


LOOP_OPS = ["double", "add_half", "tanh", "add_y"]


def _loop_step(g, op, x, y, shape):
    if op == "double":
        return _binary(g, "MUL", x, g.const("two", np.float32(2)), shape, name="x_next")
    if op == "add_half":
        return _binary(g, "ADD", x, g.const("half", np.float32(0.5)), shape, name="x_next")
    if op == "tanh":
        return _unary(g, x, "TANH", shape, name="x_next")
    return _binary(g, "ADD", x, y, shape, name="x_next")


def _count_cond(b, carried):
    """cond subgraph: i < n, with (i, n) the first two loop-carried tensors."""
    def build(g, ins):
        return [_binary(g, "LESS", ins[0], ins[1], (), np.bool_, name="go")]
    return _subgraph(b, "cond", carried, build)


def _counter(g, i):
    return _binary(g, "ADD", i, g.const("one", I32(1)), (), I32, name="i_next")


def delegated_around_if_model(shape, around=True):
    """x * 2 -> IF(c, .) (then: RELU, else: a WHILE adding 0.5 n times) -> + 1: the MUL and
    ADD are delegated, the IF (and everything it calls) runs on the CPU. around=False: the IF
    alone on x (main has nothing to delegate; only the subgraphs it calls are)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    c, n, x = g.input("c", (), np.bool_), g.input("n", (), I32), g.input("x", shape)
    doubled = _binary(g, "MUL", x, g.const("two", np.float32(2)), shape, name="doubled") if around else x
    branch = g.tensor("branch", shape)
    g.op("IF", [c, n, doubled], [branch], then_subgraph_index=1, else_subgraph_index=2)
    g.output(_binary(g, "ADD", branch, g.const("one", np.float32(1)), shape, name="out")
             if around else branch)
    carried = [("n", (), I32, None), ("x", shape, np.float32, None)]
    _subgraph(b, "then", carried, lambda sg, v: [_unary(sg, v[1], "RELU", shape)])

    def loop(sg, v):
        outs = [sg.tensor("i_out", (), I32), sg.tensor("n_out", (), I32), sg.tensor("x_out", shape)]
        sg.op("WHILE", [sg.const("i0", I32(0)), v[0], v[1]], outs, cond_subgraph_index=3,
              body_subgraph_index=4)
        return [outs[2]]
    _subgraph(b, "else", carried, loop)
    inner = [("i", (), I32, None), ("n", (), I32, None), ("x", shape, np.float32, None)]
    _count_cond(b, inner)
    _subgraph(b, "body", inner, lambda sg, v: [_counter(sg, v[0]), v[1],
                                                _loop_step(sg, "add_half", v[2], None, shape)])
    return b.finish()
