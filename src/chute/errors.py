"""chute's exceptions: one root, a small tree, an exit code each.

    ChuteError                   exit 1
    ├── ConfigError              exit 2   the job or its YAML is wrong; nothing ran
    │   └── ColumnNotFoundError  exit 2   a named column is not in the data
    ├── DataError                exit 3   the input cannot be read or is empty
    │   └── InputChanged         exit 3   an input file changed after the job was planned
    ├── ModelError               exit 4   a model failed to load or to predict
    ├── JobStateError            exit 5   the output location holds something else
    └── ResourceError            exit 6   the cluster cannot give what the job asks for
        └── StallError           exit 7   a run made no progress: the cluster lost what it
                                          needs; committed units kept, run again to resume

Errors from Ray, Arrow and the frameworks are translated where they cross into chute,
with ``raise ... from exc`` so the original traceback is kept. An ``OSError`` met while
writing the output is translated by its errno, in one place: :func:`write_error`. What
still reaches the runner from an engine — the same on every engine, since an engine hands
on the exception its stage raised, never a wrapper or its text — is translated there by
:func:`translate`, by type.
"""

from __future__ import annotations

import difflib
import errno
from collections.abc import Iterable


class ChuteError(Exception):
    """Root of every error chute raises on purpose."""

    exit_code = 1


class ConfigError(ChuteError):
    """The job description is invalid: fix the job, nothing has run."""

    exit_code = 2


class ColumnNotFoundError(ConfigError):
    """A column named by the job does not exist in the data."""


class DataError(ChuteError):
    """The input data is missing, empty, unreadable or inconsistent."""

    exit_code = 3


class InputChanged(DataError):
    """An input file changed (rewritten, cut short, removed) after the job was planned.
    Never a bad file to skip, even under ``on_bad_input: skip``: the file is not at fault,
    what was read of it may be neither version, a unit of images would go with it, and the
    job run again is another job (its input's sizes and times are part of it), so nothing
    would ever compute the rows left out."""


INPUT_CHANGED = (
    "it changed during the run. Leave the input as it is while a job runs; to start over on "
    "the input as it is now, run the job again with --overwrite (what it wrote came from the "
    "input it planned)."
)
"""How a :class:`DataError` about an input file that changed since planning ends."""


class StorageError(ChuteError):
    """The storage failed to answer (a dropped connection, throttling) after retries: not
    the file's fault, so never a bad input file to skip; run the job again to resume."""

    exit_code = 1


class ModelError(ChuteError):
    """A model could not be loaded, or raised while predicting.

    ``unit`` and ``row`` say where, when known: the driver adds the unit's name.
    """

    exit_code = 4

    def __init__(self, message: str, unit: int | None = None, row: int | None = None) -> None:
        super().__init__(message)
        self.unit = unit
        self.row = row

    def __reduce__(self) -> tuple[type[ModelError], tuple[str, int | None, int | None]]:
        return (type(self), (str(self), self.unit, self.row))  # keeps unit/row across Ray


class JobStateError(ChuteError):
    """The output location holds results that do not belong to this job."""

    exit_code = 5


class ResourceError(ChuteError):
    """The job asks for resources (GPUs, CPUs, memory) the engine cannot provide."""

    exit_code = 6


class StallError(ResourceError):
    """A run stopped making progress: what it waits for, no node of the cluster can give
    (a node was lost). What was committed stays; running the job again resumes it."""

    exit_code = 7


def did_you_mean(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or ``""``; a higher
    ``cutoff`` for big vocabularies (every module on sys.path), where a loose match is noise."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=cutoff)
    return f" Did you mean {matches[0]!r}?" if matches else ""


def missing_columns_error(
    missing: Iterable[str], available: Iterable[str], where: str
) -> ColumnNotFoundError:
    """Build the error for columns named by ``where`` that the data lacks."""
    available = [c for c in available if not c.startswith("__chute_")]  # chute's own
    missing = list(missing)
    hints = "".join(dict.fromkeys(did_you_mean(m, available) for m in missing))
    return ColumnNotFoundError(
        f"{where}: column(s) {', '.join(repr(m) for m in missing)} not found in the data."
        f"{hints} Available columns: {', '.join(available)}."
    )


_FREE = "free space, or choose another output"
_GRANT = "make the output writable by this user, or choose another output"
_WRITE_ERRORS: dict[int, tuple[type[ChuteError], str, str]] = {
    errno.ENOSPC: (ResourceError, "no space left on device", _FREE),
    errno.EDQUOT: (ResourceError, "disk quota exceeded", _FREE),
    errno.EFBIG: (
        ResourceError,
        "file too large",
        "raise the file size limit (ulimit -f), or choose another output",
    ),
    errno.EACCES: (ConfigError, "permission denied", _GRANT),
    errno.EPERM: (ConfigError, "operation not permitted", _GRANT),
    errno.EROFS: (ConfigError, "read-only file system", "choose an output on a writable one"),
}
"""What an errno met writing the output means: the error class, the reason, the fix."""


def write_error(exc: OSError, path: str) -> ChuteError | None:
    """The chute error for an ``OSError`` met writing ``path``, by its errno (``None`` for
    an errno without one: that error stays as it is).

    >>> error = write_error(OSError(errno.ENOSPC, "No space left on device"), "/out/part-1")
    >>> type(error).__name__, str(error).split(":")[0]
    ('ResourceError', 'no space left on device writing /out/part-1')
    """
    known = _WRITE_ERRORS.get(exc.errno or 0)
    if known is None:
        return None
    kind, reason, fix = known
    return kind(f"{reason} writing {path}: {fix}. Run the job again once fixed: it resumes.")


def translate(exc: BaseException) -> ChuteError:
    """The chute error for an exception that ended a run, decided by its type alone.

    >>> type(translate(MemoryError())).__name__
    'ResourceError'
    """
    if isinstance(exc, ChuteError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, MemoryError):
        return ResourceError(
            "the driver ran out of memory. Give the job a machine with more memory, or "
            "smaller batches (batch_size)."
        )
    if _from_arrow(exc):
        return DataError(f"Arrow could not handle the data: {name}: {exc}")
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return ChuteError(f"an I/O error stopped the run{where}: {name}: {exc}")
    return ChuteError(f"the run stopped on an unexpected {name}: {exc}")


def _from_arrow(exc: BaseException) -> bool:
    """Whether Arrow raised it (``pyarrow.lib.ArrowException`` and its kin), told apart by
    the class's module so that this module imports no pyarrow."""
    return any(kind.__module__.startswith("pyarrow") for kind in type(exc).__mro__)
