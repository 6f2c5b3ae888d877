"""Model artifacts: the local path an adapter loads a model from.

Adapters call :func:`local_path` on every ``path`` they are given. A local path is returned
as it is (after checking that it exists); remote URIs are the storage layer's to resolve.
"""

from __future__ import annotations

import os

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
