"""Recognising an out-of-memory error, without importing the framework that raised it.

A model stage that runs out of memory splits its batch and retries (see
:class:`chute.stages.ModelStage`); an out-of-memory error is never a row failure. The test is
conservative: a class known to mean "out of memory" anywhere in the exception's MRO, or an
ONNX Runtime / CUDA runtime error whose message says so. An exception raised from one, or
while handling one (an adapter that wraps the framework's error), counts too.
"""

from __future__ import annotations

OOM_CLASSES = frozenset(
    {
        "MemoryError",  # the host: Python, NumPy, Arrow allocations
        "OutOfMemoryError",  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
        "ResourceExhaustedError",  # TensorFlow
    }
)
"""Exception class names that mean out of memory whatever their message."""

OOM_MESSAGES = (
    "cuda out of memory",
    "cuda error: out of memory",
    "cublas_status_alloc_failed",
    "failed to allocate memory",  # ONNX Runtime's arena
    "resource_exhausted: out of memory",  # JAX / XLA
    "out of memory",
)
"""Message fragments that mean out of memory, trusted only for the runtimes below."""

_RUNTIME_MODULES = ("onnxruntime", "torch", "jax", "jaxlib", "tensorflow")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an out-of-memory error.

    >>> is_out_of_memory(MemoryError())
    True
    >>> is_out_of_memory(ValueError("out of memory"))
    False
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_oom(current):
            return True
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return False


def _is_oom(exc: BaseException) -> bool:
    if any(cls.__name__ in OOM_CLASSES for cls in type(exc).__mro__):
        return True
    if not _from_runtime(exc):
        return False
    message = str(exc).lower()
    return any(fragment in message for fragment in OOM_MESSAGES)


def _from_runtime(exc: BaseException) -> bool:
    """An error class from an inference runtime, or a plain RuntimeError (torch raises those)."""
    module = type(exc).__module__.split(".")[0]
    return module in _RUNTIME_MODULES or type(exc) is RuntimeError
