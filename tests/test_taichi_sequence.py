"""LSTM on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the reference
path. The models feed output_state and cell_state as inputs (random, non-zero), since the
runtime cannot hold variable tensors yet (ops/sequence.py). Tolerances:
tflite_taichi.testing.TAICHI_RTOL; int8 within one quantization step."""
import numpy as np
from hypothesis import given, settings

from tflite_taichi.testing import TAICHI_EXAMPLES, check_delegate, strategies
from test_ops_sequence import lstm_case, lstm_model

S = strategies()
ALL_ACTIVATIONS = ["TANH", "RELU", "RELU6", "RELU_N1_TO_1", "SIGN_BIT", "NONE"]


def _inputs(case, seed):
    """x, output_state, cell_state: uniform reals."""
    rng = np.random.default_rng(seed)
    B = case["n_batch"]
    shapes = [(B, case["n_input"]), (B, case["n_output"]), (B, case["n_cell"])]
    return [rng.uniform(-2, 2, s).astype(np.float32) for s in shapes]


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=lstm_case(layer_norm=False, activations=ALL_ACTIVATIONS), seed=S.seeds())
def test_float32_delegate_matches_reference(taichi_workers, case, seed):
    check_delegate(lstm_model(case, "input"), taichi_workers, _inputs(case, seed))


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=lstm_case(layer_norm=False), seed=S.seeds())
def test_zero_constant_state_delegate_matches_reference(taichi_workers, case, seed):
    # the first invoke's form: states are (packed) constants
    check_delegate(lstm_model(case, "zero"), taichi_workers, _inputs(case, seed)[:1])


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=lstm_case(layer_norm=False), qx=S.quant_params(), qh=S.quant_params(),
       qo=S.quant_params(), wq=S.scales(2e-3, 1e-2), seed=S.seeds())
def test_int8_delegate_matches_reference(taichi_workers, case, qx, qh, qo, wq, seed):
    # The float view of a quantized LSTM: int8 input, output state and output, int8 weights
    # (biases and cell state float32), computed in float as the reference does.
    model = lstm_model(case, "input", x_q=qx, out_q=qo, state_q=(qh, None), weight_q=wq)
    check_delegate(model, taichi_workers, seed=seed)


def test_fp16_on_vulkan(vulkan_workers):
    case = dict(n_batch=2, n_input=5, n_cell=4, n_output=3, cifg=False, peephole=True,
                projection=True, projection_bias=True, layer_norm=False, act="TANH",
                cell_clip=1.5, proj_clip=0.0, seed=4, n_inputs=24)
    check_delegate(lstm_model(case, "input"), vulkan_workers, _inputs(case, 1), precision="fp16")


def test_gles(gles_worker):
    case = dict(n_batch=3, n_input=4, n_cell=5, n_output=5, cifg=True, peephole=True,
                projection=False, projection_bias=False, layer_norm=False, act="TANH",
                cell_clip=0.0, proj_clip=0.0, seed=5, n_inputs=20)
    check_delegate(lstm_model(case, "input"), [gles_worker], _inputs(case, 2))


def test_layer_norm_stays_on_the_cpu(taichi_workers):
    case = dict(n_batch=2, n_input=3, n_cell=4, n_output=4, cifg=False, peephole=False,
                projection=False, projection_bias=False, layer_norm=True, act="TANH",
                cell_clip=0.0, proj_clip=0.0, seed=6, n_inputs=24)
    summaries = check_delegate(lstm_model(case, "input"), taichi_workers, _inputs(case, 3),
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "layer-norm" in summary["fallback"][0]["reason"]


def test_wide_projection_stays_on_the_cpu(taichi_workers):
    case = dict(n_batch=1, n_input=2, n_cell=2, n_output=33, cifg=True, peephole=False,
                projection=True, projection_bias=False, layer_norm=False, act="TANH",
                cell_clip=0.0, proj_clip=0.0, seed=7, n_inputs=20)
    summaries = check_delegate(lstm_model(case, "input"), taichi_workers, _inputs(case, 4),
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "projection to 33 outputs" in summary["fallback"][0]["reason"]
