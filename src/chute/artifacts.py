"""Model artifacts: the local path an adapter loads a model from.

Adapters call :func:`local_path` on every ``path`` they are given. A local path is returned
as it is (after checking that it exists); remote URIs are the storage layer's to resolve.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from chute.errors import ConfigError


def local_path(path: str, what: str = "model artifact") -> str:
    """The local file or directory that holds ``path``."""
    if "://" in path:
        raise ConfigError(
            f"{what} {path!r}: remote artifacts are not supported yet; copy it to a local path."
        )
    resolved = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(resolved):
        raise ConfigError(f"{what} {path!r} does not exist: check the path.")
    return resolved


def identity(path: str) -> str:
    """A cheap identity of an artifact (sizes and modification times), for job fingerprints."""
    if "://" in path or not os.path.exists(path):
        return path
    return ";".join(f"{name}:{size}:{mtime}" for name, size, mtime in _stat_tree(path))


def _stat_tree(path: str) -> Iterator[tuple[str, int, int]]:
    if os.path.isfile(path):
        stat = os.stat(path)
        yield os.path.basename(path), stat.st_size, stat.st_mtime_ns
        return
    for folder, _, names in sorted(os.walk(path)):
        for name in sorted(names):
            full = os.path.join(folder, name)
            stat = os.stat(full)
            yield os.path.relpath(full, path), stat.st_size, stat.st_mtime_ns
