"""Bounded retries with exponential backoff, for transient I/O errors only."""

from __future__ import annotations

import errno
import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("chute")

ATTEMPTS = 4
BASE_DELAY = 0.2
PERMANENT: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


TRANSIENT_ERRNOS = {
    errno.EAGAIN,
    errno.EINTR,
    errno.EIO,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
    errno.ENETUNREACH,
    errno.EHOSTUNREACH,
}
TRANSIENT_TEXT = re.compile(
    r"time ?out|timed out|connection|temporar|throttl|slow[ _]?down|unavailable|try again|"
    r"broken pipe|reset by peer|\b(429|500|502|503|504)\b|"
    # object stores (the AWS SDK's names): 5xx, throttling, a dropped or empty response
    r"INTERNAL_FAILURE|InternalError|SERVICE_UNAVAILABLE|REQUEST_TIMEOUT|NETWORK_CONNECTION|"
    r"curlCode|empty reply|TooManyRequests|RequestLimitExceeded",
    re.IGNORECASE,
)
PERMANENT_TEXT = re.compile(
    r"NO_SUCH_BUCKET|NoSuchBucket|NO_SUCH_KEY|ACCESS_DENIED|AccessDenied|INVALID_ACCESS_KEY_ID|"
    r"InvalidAccessKeyId|SIGNATURE_DOES_NOT_MATCH|SignatureDoesNotMatch|"
    r"HTTP (?:response code|status):? 40[0134]\b",
    re.IGNORECASE,
)
"""Storage errors that retrying cannot fix (checked before the transient patterns)."""


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may go away on its own: a flaky filesystem, a dropped connection,
    throttling. Arrow reports corrupt data as OSError too: that is not transient."""
    if isinstance(exc, PERMANENT) or PERMANENT_TEXT.search(str(exc)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno in TRANSIENT_ERRNOS or bool(TRANSIENT_TEXT.search(str(exc)))
    return False


def retrying(
    fn: Callable[[], T],
    what: str,
    attempts: int = ATTEMPTS,
    base_delay: float = BASE_DELAY,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn``; on a transient error wait 0.2 s, 0.4 s, 0.8 s … and call it again.

    After ``attempts`` tries, or at once for a permanent error, the error is raised.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not transient(exc):
                raise
            delay = base_delay * 2 ** (attempt - 1)
            log.warning("%s failed (%s); retrying in %.1f s", what, exc, delay)
            sleep(delay)
    raise AssertionError("unreachable")
