"""The same network in PyTorch eager, built from a .tflite model's weights: the batched
yardstick a GPU user knows, built in torch where torch is present.

Only the ops of the convolutional classifiers benchmarked here (CONV_2D, DEPTHWISE_CONV_2D,
AVERAGE/MAX_POOL_2D, MEAN, ADD, FULLY_CONNECTED, RESHAPE, SOFTMAX, and whatever folds at prepare);
anything else raises. The graph is prepared by tflite_taichi itself (shapes inferred for the batch,
constant sub-graphs folded), then every op becomes the matching torch.nn.functional call on NCHW
tensors, with TFLite's SAME padding as explicit (possibly asymmetric) pads.

    from torch_eager import TorchModel      # with bench/ on sys.path
    net = TorchModel("mobilenet_v1_fp32.tflite", batch=32, device="cuda")
    y = net(x_nhwc)                        # a numpy array in, a numpy array out
"""
import numpy as np

from tflite_taichi.ops.common import PADDING_SAME

ACTIVATIONS = {0: None, 1: "relu", 3: "relu6"}      # tflite.ActivationFunctionType


def _prepare(model_path: str, batch: int):
    from tflite_taichi import graph as graph_mod
    from tflite_taichi.model import read_model
    model = read_model(model_path)
    sg = model.subgraphs[0]
    shapes = {t: (batch, *sg.tensors[t].shape[1:]) for t in sg.inputs}
    return sg, graph_mod.prepare(sg, graph_mod.resolve_ops(model), shapes)


class TorchModel:
    def __init__(self, model_path: str, batch: int = 1, device: str = "cpu"):
        import torch
        import torch.nn.functional as F
        self.torch, self.F, self.device = torch, F, device
        self.subgraph, self.graph = _prepare(model_path, batch)
        self.consts = {t: torch.as_tensor(np.asarray(v, np.float32), device=device)
                       for t, v in self.graph.constants.items()
                       if isinstance(v, np.ndarray) and v.dtype.kind in "fiub"}
        self.plan = [self._layer(step.node, step.op) for step in self.graph.steps]

    # -- building: weights rearranged once, as torch wants them ------------------------------
    def _layer(self, node, op):
        torch = self.torch
        name = node.op
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            w = np.asarray(node.inputs[1].value, np.float32)
            if name == "CONV_2D":                    # [O, H, W, I] -> [O, I, H, W]
                weight, groups = w.transpose(0, 3, 1, 2), node.inputs[0].shape[3] // w.shape[3]
            else:                                    # [1, H, W, C*M] -> [C*M, 1, H, W]
                weight, groups = w.transpose(3, 0, 1, 2), node.inputs[0].shape[3]
            bias = node.inputs[2].value if len(node.inputs) > 2 and node.inputs[2] is not None else None
            return ("conv", op, torch.as_tensor(np.ascontiguousarray(weight), device=self.device),
                    None if bias is None else torch.as_tensor(np.asarray(bias, np.float32), device=self.device),
                    groups, node)
        if name in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "MEAN", "ADD", "FULLY_CONNECTED", "RESHAPE", "SOFTMAX"):
            return (name.lower(), op, None, None, None, node)
        raise NotImplementedError(f"bench/torch_eager.py has no torch form of {name}")

    @staticmethod
    def _same_pads(in_size, k, s, d, out_size):
        total = max((out_size - 1) * s + (k - 1) * d + 1 - in_size, 0)
        return total // 2, total - total // 2

    def _pad(self, x, node, k_h, k_w):
        o = node.options
        if o.padding != PADDING_SAME:
            return x
        _, in_h, in_w, _ = node.inputs[0].shape
        _, out_h, out_w, _ = node.outputs[0].shape
        top, bottom = self._same_pads(in_h, k_h, o.stride_h, getattr(o, "dilation_h", 1), out_h)
        left, right = self._same_pads(in_w, k_w, o.stride_w, getattr(o, "dilation_w", 1), out_w)
        return self.F.pad(x, (left, right, top, bottom))

    def _act(self, x, code):
        kind = ACTIVATIONS.get(code, "unsupported")
        if kind == "unsupported":
            raise NotImplementedError(f"fused activation {code}")
        if kind == "relu":
            return self.F.relu(x)
        if kind == "relu6":
            return self.F.hardtanh(x, 0.0, 6.0)
        return x

    # -- running: tensors are NCHW when rank 4 (convolutions' layout), else as in the model -----
    def _nhwc(self, x):
        return x.permute(0, 2, 3, 1) if x.dim() == 4 else x

    def _nchw(self, x):
        return x.permute(0, 3, 1, 2) if x.dim() == 4 else x

    def __call__(self, x_nhwc: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            values = dict(self.consts)
            t_in = self.subgraph.inputs[0]
            values[t_in] = self._nchw(torch.as_tensor(x_nhwc, device=self.device))
            for kind, op, weight, bias, groups, node in self.plan:
                values[op.outputs[0]] = self._run(kind, op, weight, bias, groups, node, values)
            out = values[self.subgraph.outputs[0]]
            return self._nhwc(out).contiguous().cpu().numpy()

    def _run(self, kind, op, weight, bias, groups, node, values):
        F = self.F
        x = values[op.inputs[0]]
        o = node.options
        if kind == "conv":
            x = self._pad(x, node, weight.shape[2], weight.shape[3])
            y = F.conv2d(x, weight, bias, stride=(o.stride_h, o.stride_w),
                         dilation=(o.dilation_h, o.dilation_w), groups=groups)
            return self._act(y, o.fused_activation_function)
        if kind in ("average_pool_2d", "max_pool_2d"):
            if o.padding != PADDING_SAME or kind == "max_pool_2d":
                x = self._pad(x, node, o.filter_h, o.filter_w)
                pool = F.avg_pool2d if kind == "average_pool_2d" else F.max_pool2d
                y = pool(x, (o.filter_h, o.filter_w), (o.stride_h, o.stride_w))
            else:
                raise NotImplementedError("SAME-padded AVERAGE_POOL_2D (TFLite excludes the padding)")
            return self._act(y, o.fused_activation_function)
        if kind == "mean":
            axes = [int(a) % 4 for a in np.ravel(node.inputs[1].value)] if x.dim() == 4 else None
            y = self._nhwc(x).mean(dim=axes if axes is not None else
                                   [int(a) for a in np.ravel(node.inputs[1].value)],
                                   keepdim=bool(o.keep_dims))
            return self._nchw(y)
        if kind == "add":
            return self._act(x + values[op.inputs[1]], o.fused_activation_function)
        if kind == "fully_connected":
            w = values[op.inputs[1]]
            b = values.get(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
            y = F.linear(self._nhwc(x).reshape(-1, w.shape[1]), w, b)
            return self._act(y, o.fused_activation_function)
        if kind == "reshape":
            return self._nchw(self._nhwc(x).reshape(tuple(node.outputs[0].shape)))
        if kind == "softmax":
            return self._nchw(F.softmax(self._nhwc(x) * o.beta, dim=-1))
        raise NotImplementedError(kind)
