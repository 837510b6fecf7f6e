"""One family of exceptions for everything a user can get wrong or a model file can hold.

Every error the package raises on purpose derives from `TfliteTaichiError`, so
`except tflite_taichi.errors.TfliteTaichiError` catches all of them; each also derives from
the builtin a tf.lite user would expect (ValueError for bad data, RuntimeError for state, and
both where LiteRT raises ValueError for a state: `NotReadyError`). Messages name the tensor or
op concerned.
"""


class TfliteTaichiError(Exception):
    """Base of every error raised by tflite_taichi."""


class ModelError(TfliteTaichiError, ValueError):
    """The model file is malformed, inconsistent, or uses something we cannot run."""


class UnsupportedOpError(ModelError):
    """The model uses ops that no registered implementation covers (all listed at once)."""

    def __init__(self, message, ops=()):
        super().__init__(message)
        self.ops = tuple(ops)


class TensorTooLargeError(ModelError):
    """A tensor would take more memory than the interpreter allows (`max_tensor_bytes`, by
    default 4x the model file's size + 256 MiB per tensor, 16x that for all of the model's tensors
    together): refused, naming the tensor, before anything is allocated. Raised for declared
    shapes when the model is read, and for inferred shapes (after resizes and constant folding)
    at allocate_tensors; after resize_tensor_input it arrives as the cause of an InputError."""


class InputError(TfliteTaichiError, ValueError):
    """A value passed to the Interpreter (tensor data, index, shape) is not acceptable."""


class InterpreterStateError(TfliteTaichiError, RuntimeError):
    """An Interpreter method was called in the wrong state (e.g. invoke before allocate)."""


class NotReadyError(InterpreterStateError, ValueError):
    """The interpreter, or the tensor asked for, is not ready: allocate_tensors() has not run
    (or must run again after resize_tensor_input() or close()), or the tensor's value needs a
    successful invoke() first (an intermediate, an output whose shape depends on the data).

    Also a ValueError because LiteRT raises ValueError in these states ("Tensor data is null",
    "Tensor is unallocated") and code written for tf.lite catches that; it stays a RuntimeError
    through InterpreterStateError, which is what LiteRT's invoke() before allocate raises."""


class BackendUnavailable(TfliteTaichiError, RuntimeError):
    """The requested backend cannot run on this machine, with the reason."""


class CacheError(BackendUnavailable):
    """cache_dir cannot be used: not private, not ours, or not a folder."""


class CacheWarning(UserWarning):
    """Something in cache_dir was not trusted (corrupt, truncated, foreign) and was rebuilt."""


class KernelError(TfliteTaichiError, RuntimeError):
    """An op's Taichi code did not compile: Taichi's frontend refused it (a name, type or syntax
    error in a `ti.func`, most likely in an op registered with register_op). Names the ops of the
    kernel it was part of and the Taichi arch; Taichi's error, which points at the line of the
    op's code, is in the message and is the exception's __cause__. Raised by allocate_tensors()
    (with answer_while_compiling, the invokes run on the CPU instead, with a warning that holds
    it, and wait_for_kernels() raises it)."""


class BatchError(TfliteTaichiError, RuntimeError):
    """A batch run (tflite_taichi.batch) cannot start or go on: bad options, an output folder
    that holds another run's files, workers that cannot start an interpreter. A bad *input* is
    not one: it goes to the run's errors.jsonl and the run goes on."""
