"""hoist's exceptions, the mapping from the engine's status codes, and the
check of a step number."""

import errno
import operator

from . import _hoist


class DataLossError(Exception):
    """A checkpoint's bytes or manifest are corrupt: a hash mismatch, a
    truncated file, an invalid manifest. The checkpoint cannot be trusted;
    other steps are unaffected."""


class CoordinationError(RuntimeError):
    """A rank of the job failed, left, or took another path (a save some
    ranks did not make): the save failed on every surviving rank and its
    step never became visible; the message names the rank. (A rank that
    does not answer within the coordinator's timeout is a TimeoutError.)"""


# absl::StatusCode values.
_CANCELLED, _UNKNOWN, _INVALID_ARGUMENT, _DEADLINE_EXCEEDED = 1, 2, 3, 4
_NOT_FOUND, _ALREADY_EXISTS, _PERMISSION_DENIED, _RESOURCE_EXHAUSTED = 5, 6, 7, 8
_FAILED_PRECONDITION, _ABORTED, _OUT_OF_RANGE, _UNIMPLEMENTED = 9, 10, 11, 12
_INTERNAL, _UNAVAILABLE, _DATA_LOSS = 13, 14, 15


def _translate(error):
    """The Python exception for a hoist._hoist.Error."""
    code, message = error.code, error.message
    if code == _DATA_LOSS:
        return DataLossError(message)
    if code in (_INVALID_ARGUMENT, _FAILED_PRECONDITION, _OUT_OF_RANGE):
        return ValueError(message)
    if code == _NOT_FOUND:
        return FileNotFoundError(errno.ENOENT, message)
    if code == _ALREADY_EXISTS:
        return FileExistsError(errno.EEXIST, message)
    if code == _PERMISSION_DENIED:
        return PermissionError(errno.EACCES, message)
    if code == _RESOURCE_EXHAUSTED:
        if "No space left" in message:
            return OSError(errno.ENOSPC, message)
        return MemoryError(message)
    if code == _DEADLINE_EXCEEDED:
        return TimeoutError(message)
    if code == _UNIMPLEMENTED:
        return NotImplementedError(message)
    if code == _ABORTED and "coordinator operation" in message:
        return CoordinationError(message)
    if code == _ABORTED:  # what storage errors (EIO, ...) become
        return OSError(message)
    return RuntimeError(message)


def call(fn, *args, **kwargs):
    """Calls into the engine, raising hoist's Python exceptions."""
    try:
        return fn(*args, **kwargs)
    except _hoist.Error as error:
        raise _translate(error) from None


def step_number(step):
    """`step` as an int: an int, a NumPy or JAX integer scalar, an integer
    tensor of one element. A float (2.5 would be step 2), a string or a bool
    is a TypeError, so that no call saves, restores or deletes another step
    than the one meant."""
    if isinstance(step, bool):
        raise TypeError(f"step must be an integer, not bool ({step!r})")
    try:
        return operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an integer, not "
                        f"{type(step).__name__} ({step!r})") from None
