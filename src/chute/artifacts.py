"""Model artifacts: the local path an adapter loads a model from.

Adapters call :func:`local_path` on every ``path`` they are given. A local path is returned
as it is (after checking that it exists). A remote one (``s3://bucket/model.onnx``, a
directory such as a transformers model, any scheme :mod:`chute.storage` reaches) is
downloaded once per machine into a cache directory and the cached copy is returned:

* the cache key is the URI (without credentials) and the size and modification time of
  every file under it, so a replaced model is downloaded again and an unchanged one never;
* a file lock per key makes concurrent replicas on one machine (Ray actors are separate
  processes; local replicas are threads) wait for one download instead of each fetching;
* the download goes to a temporary directory that is renamed into place when complete, so
  a crash mid-download leaves nothing that looks cached.

The cache lives in ``$CHUTE_CACHE_DIR`` or ``~/.cache/chute/artifacts``. The endpoint and
credentials come from the environment (``AWS_ENDPOINT_URL``, the AWS chain).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from functools import partial

import pyarrow.fs as pafs

from chute.errors import ConfigError
from chute.retry import retrying
from chute.storage import (
    StorageOptions,
    is_remote,
    local_absolute,
    permanent,
    redact,
    resolve,
    storage_error,
)

CACHE_ENV = "CHUTE_CACHE_DIR"
CHUNK = 8 << 20
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def local_path(
    path: str, what: str = "model artifact", storage: StorageOptions | None = None
) -> str:
    """The local file or directory that holds ``path`` (downloaded once if remote)."""
    if is_remote(path):
        return _cached(path, what, storage)
    resolved = local_absolute(path)
    if not os.path.exists(resolved):
        raise ConfigError(f"{what} {path!r} does not exist: check the path.")
    return resolved


def identity(path: str, storage: StorageOptions | None = None) -> str:
    """A cheap identity of an artifact (sizes and modification times), for job fingerprints.

    Remote artifacts are listed (one request), never downloaded for this."""
    if is_remote(path):
        try:
            _, root, files = _remote_files(path, "model artifact", storage)
        except ConfigError:
            return _public(path)
        return f"{_public(path)}#{_stamp(root, files)}"
    if not os.path.exists(path):
        return path
    return ";".join(f"{name}:{size}:{mtime}" for name, size, mtime in _stat_tree(path))


def size(path: str, storage: StorageOptions | None = None) -> int:
    """Bytes of an artifact, its files summed (a remote one listed, never downloaded); 0
    where it cannot be found or listed."""
    try:
        if is_remote(path):
            return sum(f.size or 0 for f in _remote_files(path, "model artifact", storage)[2])
        return sum(size for _, size, _ in _stat_tree(local_path(path)))
    except (ConfigError, OSError):
        return 0


def cache_dir() -> str:
    """Where remote artifacts are kept: ``$CHUTE_CACHE_DIR`` or ``~/.cache/chute/artifacts``."""
    return os.environ.get(CACHE_ENV) or os.path.expanduser("~/.cache/chute/artifacts")


def _public(uri: str) -> str:
    """The URI without any credentials in it."""
    parts = urllib.parse.urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    if user == "anonymous":
        netloc = f"anonymous@{netloc}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _remote_files(
    uri: str, what: str, storage: StorageOptions | None
) -> tuple[pafs.FileSystem, str, list[pafs.FileInfo]]:
    """The filesystem, the root and every file under it (one HEAD, or one listing)."""
    fs, root = resolve(uri, storage)
    try:
        info = retrying(lambda: fs.get_file_info(root), f"looking up {redact(uri)}")
        if info.type == pafs.FileType.File:
            return fs, root, [info]
        selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        files = retrying(lambda: fs.get_file_info(selector), f"listing {redact(uri)}")
    except OSError as exc:
        if permanent(exc):
            raise storage_error(exc, uri, what, storage) from exc
        raise ConfigError(f"cannot reach {what} {redact(uri)!r}: {exc}") from exc
    files = sorted((f for f in files if f.is_file), key=lambda f: f.path)
    if not files:
        raise ConfigError(f"{what} {redact(uri)!r} does not exist: check the path.")
    return fs, root, files


def _stamp(root: str, files: list[pafs.FileInfo]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.path[len(root) :]}\0{f.size}\0{f.mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _cached(uri: str, what: str, storage: StorageOptions | None) -> str:
    fs, root, files = _remote_files(uri, what, storage)
    key = hashlib.sha256(f"{_public(uri)}#{_stamp(root, files)}".encode()).hexdigest()[:24]
    name = root.rstrip("/").rsplit("/", 1)[-1] or "artifact"
    base = cache_dir()
    final = os.path.join(base, key)
    target = os.path.join(final, name)
    if os.path.exists(target):
        return target
    os.makedirs(base, exist_ok=True)
    with _locked(os.path.join(base, f"{key}.lock")):
        if not os.path.exists(target):  # another replica may have fetched it meanwhile
            _download(fs, root, files, final, name)
    return target


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock across processes (flock) and threads of this process."""
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(path, threading.Lock())
    with thread_lock, open(path, "a") as handle:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: threads only
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(
    fs: pafs.FileSystem, root: str, files: list[pafs.FileInfo], final: str, name: str
) -> None:
    """Fetch every file into a temporary directory, then rename it into place."""
    tmp = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        for info in files:
            relative = info.path[len(root) :].lstrip("/")
            local = os.path.join(tmp, name, relative) if relative else os.path.join(tmp, name)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            retrying(partial(_copy, fs, info.path, local), f"downloading {name}")
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy(fs: pafs.FileSystem, source: str, destination: str) -> None:
    with fs.open_input_stream(source) as src, open(destination, "wb") as dst:
        while chunk := src.read(CHUNK):
            dst.write(chunk)


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
