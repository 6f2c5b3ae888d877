"""The Ray Data settings chute runs under, for the ray engine and for Ray Dataset inputs.

Ray Data keeps them in a process-wide context; chute changes them only for the span of a
run and puts them back, so a user's own Ray Data code in the same process is unaffected.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_data(verbose: bool) -> Iterator[None]:
    """Ray Data's own progress bars and execution logs, only with ``verbose``.

    Errors raised in map functions are kept as they are: wrapped in Ray Data's
    ``UserCodeException``, the chute error inside (a ``ModelError``) would be lost, since
    an exception's ``__cause__`` does not survive the trip back to the driver.
    """
    from ray.data import DataContext

    ctx = DataContext.get_current()
    saved = (
        ctx.enable_progress_bars,
        ctx.print_on_execution_start,
        ctx.raise_original_map_exception,
    )
    ctx.enable_progress_bars = verbose
    ctx.print_on_execution_start = verbose
    ctx.raise_original_map_exception = True
    data_log = logging.getLogger("ray.data")
    level = data_log.level
    if not verbose:  # chute re-raises a failed job's error itself, once and readably
        data_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        (
            ctx.enable_progress_bars,
            ctx.print_on_execution_start,
            ctx.raise_original_map_exception,
        ) = saved
        data_log.setLevel(level)
