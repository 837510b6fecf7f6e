"""A model with two signatures, each on its own subgraph, shared by the interpreter's tests and
the litert backend's."""
from tflite_taichi.builder import ModelBuilder


def two_signature_model(resizable: bool = False) -> bytes:
    """Signature "main" (subgraph 0): y = RELU(x), x [3]; signature "double" (subgraph 1):
    v = u + u, u [2] (`resizable`: u's length -1 in its shape signature)."""
    b = ModelBuilder()
    main = b.subgraph("main")
    x = main.input("x", (3,))
    y = main.tensor("y", (3,))
    main.op("RELU", [x], [y])
    main.output(y)
    second = b.subgraph("double")
    signature = {"shape_signature": (-1,)} if resizable else {}
    u = second.input("u", (2,), **signature)
    v = second.tensor("v", (2,), **signature)
    second.op("ADD", [u, u], [v])
    second.output(v)
    b.signature("main", 0, {"x": x}, {"y": y})
    b.signature("double", 1, {"u": u}, {"v": v})
    return b.finish()
