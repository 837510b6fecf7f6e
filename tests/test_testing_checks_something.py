"""tflite_taichi.testing refuses to check nothing (a test that checks nothing passes
whatever the code does): with no backend worker
(an empty TFLITE_TAICHI_TEST_BACKENDS, or a user's check_op without workers or LiteRT) only the
reference path would run and nothing would be compared, so check_op and check_delegate raise."""
import numpy as np
import pytest
from hypothesis import strategies as st

from tflite_taichi.testing import Input, Output, check_delegate, check_op, examples, one_op_model


def _model():
    return one_op_model("RELU", [Input((2, 3))], [Output((2, 3))])


def test_a_wrong_empty_backend_list_is_refused_by_check_delegate():
    with pytest.raises(ValueError, match="nothing would be checked"):
        check_delegate(_model(), [], [np.ones((2, 3), np.float32)])


@pytest.mark.parametrize("workers", [(), []])
def test_a_wrong_check_op_without_backend_or_litert_is_refused(workers):
    with pytest.raises(ValueError, match="nothing would be checked"):
        check_op(st.just((_model(), None)), workers=workers)


def test_examples_scale_with_the_profile():
    from hypothesis import settings
    assert examples(50) == settings.default.max_examples
    assert examples(0) == 1
