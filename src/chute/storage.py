"""Storage: one place that turns a path or URI into a pyarrow filesystem and a path on it.

* a plain path or ``file://`` URI → the local filesystem;
* ``s3://bucket/key`` (also ``s3a://``) → pyarrow's native S3 client. Credentials come from
  the standard AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
  ``AWS_SESSION_TOKEN``, ``~/.aws/credentials`` and ``~/.aws/config``, instance roles);
  ``s3://anonymous@bucket/key`` (or ``StorageOptions(anonymous=True)``) reads public
  buckets unsigned; ``s3://KEY:SECRET@bucket/key`` works but is redacted wherever chute
  prints or stores a path. An S3-compatible store is reached through ``endpoint_url``
  (or the ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` environment variables);
* any other scheme (``gs://``, ``abfs://``, ``memory://``, …) through fsspec, wrapped in
  ``pyarrow.fs.PyFileSystem``; a missing package says which one to ``pip install``.

:class:`StorageOptions` travel with sources and sinks to Ray workers, which rebuild the
filesystem there. They hold no credentials, so they are safe to pickle, log and store;
fsspec options (``options=``) are passed on but never shown or stored.

Object stores have no atomic rename and no append, so writers there write each file once
under a unique final name (an S3 PUT is atomic: an object appears whole or not at all);
:func:`put` picks the right way for the filesystem at hand.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from chute.errors import ConfigError, write_error

ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
S3_SCHEMES = ("s3", "s3a")
META_DIR = "_chute"
"""chute's folder in an output location: its ledger, claims and report."""
SUCCESS = "_SUCCESS"
"""The file a finished output holds beside its parts."""
DEFAULT_RETRIES = 6
"""Attempts per S3 request (the AWS SDK's standard strategy: throttling, 5xx, dropped
connections, with exponential backoff and jitter). chute's own bounded retries wrap it."""

_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]+):[^@\s]*@")
_SECRET_KEYS = re.compile(r"key|secret|token|password|credential|sas", re.IGNORECASE)


@dataclass(frozen=True)
class StorageOptions:
    """How to reach remote storage. Credentials are not options: they come from the
    standard chain of each store (for S3: environment, config files, instance roles).

    >>> StorageOptions(endpoint_url="http://127.0.0.1:9000", region="us-east-1")  # doctest: +SKIP
    """

    endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO, Ceph, moto), e.g. ``http://127.0.0.1:9000``.
    Defaults to ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``."""
    region: str | None = None
    """The bucket's region; found from ``AWS_REGION``/the config/the bucket when unset."""
    anonymous: bool = False
    """Unsigned requests: public buckets, no credentials looked up."""
    retries: int = DEFAULT_RETRIES
    """Attempts per request inside the S3 client (throttling, 5xx, dropped connections)."""
    connect_timeout: float | None = None
    request_timeout: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Passed to the fsspec filesystem of other schemes; never printed or stored."""

    def __post_init__(self) -> None:
        if self.retries < 1:
            raise ConfigError(f"storage retries must be >= 1, got {self.retries}.")
        if self.endpoint_url is not None and "://" not in self.endpoint_url:
            raise ConfigError(
                f"storage endpoint_url {self.endpoint_url!r} needs a scheme: write it like "
                "'http://host:9000' or 'https://host'."
            )

    def with_env(self) -> StorageOptions:
        """These options with the endpoint filled in from the environment (done on the
        driver, so that workers on other machines reach the same endpoint)."""
        if self.endpoint_url is not None:
            return self
        endpoint = next((os.environ[name] for name in ENDPOINT_ENV if os.environ.get(name)), None)
        return replace(self, endpoint_url=endpoint) if endpoint else self

    def describe(self) -> dict[str, Any]:
        """What may be shown and stored: no credentials, no fsspec options' values."""
        shown: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "anonymous": self.anonymous,
        }
        if self.options:
            shown["options"] = sorted(self.options)
        return {k: v for k, v in shown.items() if v}


def scheme_of(path: str) -> str:
    """``"s3"`` for ``s3://b/k``, ``""`` for a local path (Windows drives included)."""
    head, sep, _ = path.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]+", head):
        return ""
    return head.lower()


def as_given(given: str, path: str) -> str:
    """A filesystem's ``path`` (``b/k``) written as the location ``given`` was: with its
    scheme (``s3://b/k``), for messages."""
    scheme = scheme_of(given)
    return f"{scheme}://{path}" if scheme else path


def is_remote(path: str) -> bool:
    return scheme_of(path) not in ("", "file", "local")


def redact(text: str) -> str:
    """``text`` with the secret of any ``scheme://key:secret@`` URI in it hidden.

    >>> redact("s3://AKIA123:abc/def@bucket/x")
    's3://AKIA123:***@bucket/x'
    """
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


_CACHE: dict[tuple[Any, ...], pafs.FileSystem] = {}
_CACHE_LOCK = threading.Lock()


def resolve(path: str, storage: StorageOptions | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``path`` and the path on it (no trailing slash).

    Filesystems are built once per process and options (a client holds a connection pool).
    """
    storage = (storage or StorageOptions()).with_env()
    scheme = scheme_of(path)
    if scheme in ("", "file", "local"):
        return pafs.LocalFileSystem(), _strip(local_absolute(path))
    if scheme in S3_SCHEMES:
        return _s3(path, storage)
    if scheme in ("hdfs", "viewfs"):  # pyarrow's own client (libhdfs)
        fs, inner = pafs.FileSystem.from_uri(path)
        return fs, _strip(inner)
    return _fsspec(path, storage)


def _strip(path: str) -> str:
    return path.rstrip("/") or "/"


def local_absolute(path: str) -> str:
    """The absolute local path that ``path`` (a plain path, ``~/...``, or a ``file:`` URI)
    names, as the operating system reads it.

    A ``file:`` URI is decoded (``file:///data/my%20runs`` is the folder ``my runs``;
    ``file://localhost/x`` is ``/x``); one for another host, or with a query or fragment,
    is refused. A ``..`` is resolved through the folders before it, links included, as
    the system does (``latest/../2024`` beside a link ``latest -> archive/06`` is
    ``archive/2024``): cut as text, it named another folder, whose files were read.
    """
    scheme = scheme_of(path)
    if scheme == "file" and path[7:8] in ("~", "."):  # file://~/x, file://./x: as before
        scheme, path = "", path[7:]
    elif not scheme and path.startswith("file:/"):  # file:/data, as Hadoop and Spark write
        scheme, path = "file", "file://" + path[5:]
    if scheme == "file":
        uri = urllib.parse.urlsplit(path)
        if uri.netloc not in ("", "localhost"):
            raise ConfigError(
                f"{path!r} names the host {uri.netloc!r}: a file URI names a file on this "
                "machine (file:///path). Write the local path, or the URI of a storage "
                "every worker can reach."
            )
        if uri.query or uri.fragment:
            raise ConfigError(
                f"{path!r} has a '?' or '#', which in a file URI begins a query or a "
                "fragment, not part of the path. Write a plain path, or percent-encode the "
                "character (%3F for '?', %23 for '#')."
            )
        path = urllib.parse.unquote(uri.path)
    elif scheme:  # local://path
        path = path.split("://", 1)[1]
    path = os.path.expanduser(path)
    if not os.path.isabs(path):  # only then: a worker's own folder may be gone (getcwd fails)
        path = os.path.join(os.getcwd(), path)
    segments = path.split("/")
    if ".." in segments:
        last = len(segments) - segments[::-1].index("..")
        path = os.path.join(os.path.realpath("/".join(segments[:last]) or "/"), *segments[last:])
    return os.path.normpath(path)


def _s3(uri: str, storage: StorageOptions) -> tuple[pafs.FileSystem, str]:
    # Split by hand: an S3 key is taken as written. As a URL, "out?v=2" and "out#2" lost
    # their query and fragment (a run wrote to, or --overwrite wiped, "out"), and "%20"
    # was unquoted into a space.
    location, _, key = uri.split("://", 1)[1].partition("/")
    login, _, netloc = location.rpartition("@")  # keeps the bucket's case, drops credentials
    bucket = netloc.lower()
    if not bucket:
        raise ConfigError(f"{redact(uri)!r} names no bucket: write it like 's3://bucket/prefix'.")
    key = key.strip("/")
    odd = odd_segment(key)
    if key and odd is not None:
        segment = f"a {odd!r} segment" if odd else "an empty segment ('//')"
        raise ConfigError(
            f"{redact(uri)!r} has {segment} in its key. S3 keys are not paths: the S3 "
            "client reads and writes a key with '.' and '..' cleaned away (another prefix, "
            "perhaps another job's files) but lists it as written, and refuses an empty "
            "segment. Write the key without it."
        )
    user, _, secret = (urllib.parse.unquote(v) for v in login.partition(":"))
    anonymous = storage.anonymous or (user == "anonymous" and not secret)
    credentials = (user, secret) if secret else ("", "")
    cache_key = ("s3", bucket, credentials, anonymous, storage.endpoint_url, storage.region,
                 storage.retries, storage.connect_timeout, storage.request_timeout)  # fmt: skip
    with _CACHE_LOCK:
        fs = _CACHE.get(cache_key)
        if fs is None:
            fs = _CACHE[cache_key] = _s3_filesystem(bucket, credentials, anonymous, storage)
    return fs, _strip(f"{netloc}/{key}" if key else netloc)


def odd_segment(key: str) -> str | None:
    """A segment of an S3 key that pyarrow's client does not send as written (``""`` for
    ``//``, ``.`` or ``..``), or ``None``."""
    return next((part for part in key.split("/") if part in ("", ".", "..")), None)


def _s3_filesystem(
    bucket: str, credentials: tuple[str, str], anonymous: bool, storage: StorageOptions
) -> pafs.S3FileSystem:
    kwargs: dict[str, Any] = {
        "anonymous": anonymous,
        "region": storage.region or _region(bucket, storage),
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=storage.retries),
        # small files go up in one PutObject (atomic, one request) instead of a multipart upload
        "allow_delayed_open": True,
    }
    if credentials[1]:
        kwargs["access_key"], kwargs["secret_key"] = credentials
    if storage.endpoint_url:
        endpoint = urllib.parse.urlsplit(storage.endpoint_url)
        kwargs["endpoint_override"] = endpoint.netloc + endpoint.path.rstrip("/")
        kwargs["scheme"] = endpoint.scheme
    if storage.connect_timeout:
        kwargs["connect_timeout"] = storage.connect_timeout
    if storage.request_timeout:
        kwargs["request_timeout"] = storage.request_timeout
    return pafs.S3FileSystem(**kwargs)


def _region(bucket: str, storage: StorageOptions) -> str | None:
    """The region from the environment, else asked of AWS (one request), else the SDK's."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(name):
            return os.environ[name]
    if storage.endpoint_url:
        return "us-east-1"  # S3-compatible stores ignore it, but the signature needs one
    try:
        return str(pafs.resolve_s3_region(bucket))
    except (OSError, ValueError):
        return None  # let the SDK's own chain (config files) decide


def _fsspec(path: str, storage: StorageOptions) -> tuple[pafs.FileSystem, str]:
    scheme = scheme_of(path)
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is a dependency
        raise ConfigError(f"{scheme}:// paths need fsspec: pip install fsspec") from exc
    try:
        fs, inner = fsspec.core.url_to_fs(path, **dict(storage.options))
    except ImportError as exc:
        raise ConfigError(
            f"{scheme}:// paths need a package that is not installed: {exc} "
            f"(for example: pip install {_FSSPEC_PACKAGES.get(scheme, f'<the {scheme} package>')})"
        ) from exc
    except ValueError as exc:
        raise ConfigError(f"cannot open {redact(path)!r}: {exc}") from exc
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), _strip(str(inner)) or "/"


_FSSPEC_PACKAGES = {
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "abfs": "adlfs",
    "az": "adlfs",
    "hf": "huggingface_hub",
    "http": "aiohttp",
    "https": "aiohttp",
}


def is_local(fs: pafs.FileSystem) -> bool:
    """A filesystem with atomic rename and append (the local one)."""
    return isinstance(fs, pafs.LocalFileSystem)


def put(fs: pafs.FileSystem, path: str, data: bytes | Callable[[pa.NativeFile], None]) -> int:
    """Write ``data`` to ``path`` so that readers see the whole file or none of it; the
    bytes written. ``data`` is the bytes, or a function that writes them to a stream.

    Locally: under a temporary name, then renamed into place (a failed write removes its
    temporary; a function writes straight into it, without a copy in memory). On an object
    store: one upload under the final name (an S3 PUT is atomic); no rename exists there.
    A full disk or a refused write raises chute's error for it (:func:`writing`).
    """

    def write(out: pa.NativeFile) -> int:
        if callable(data):
            data(out)
        else:
            out.write(data)
        return int(out.tell())

    with writing(path):
        if not is_local(fs):
            # Closing a stream completes its upload: a function that fails half-way must
            # not leave half a file under the final name, so the bytes are made first.
            if callable(data):
                buffer = pa.BufferOutputStream()
                data(buffer)
                payload = buffer.getvalue()
            else:
                payload = pa.py_buffer(data)
            with fs.open_output_stream(path) as out:
                out.write(payload)
            return int(payload.size)
        directory, _, base = path.rpartition("/")
        tmp = f"{directory}/.{base}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with fs.open_output_stream(tmp) as out:
                size = write(out)
            settle(tmp, path)
            return size
        except BaseException:
            with contextlib.suppress(OSError):  # what a full disk holds of it, freed
                fs.delete_file(tmp)
            raise


def settle(tmp: str, path: str) -> None:
    """Put the local file ``tmp`` under its name ``path`` durably: its bytes reach the disk
    before the rename, and the rename before this returns, so that what names the file
    next (a ledger line, ``_SUCCESS``) never outlives it in a power loss or a machine's
    crash (a killed process loses nothing either way: the kernel holds its writes)."""
    synced(tmp)
    os.replace(tmp, path)
    try:
        synced(path.rpartition("/")[0] or ".")
    except OSError as exc:  # some mounts (FUSE, CIFS) cannot flush a folder: the file is
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # flushed all the same
            raise


def synced(path: str) -> None:
    """Flush a local file's (or folder's) data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Append ``data`` to ``path`` (local files only: object stores have no append)."""
    with writing(path), fs.open_append_stream(path) as out:
        out.write(data)


def make_dir(fs: pafs.FileSystem, path: str) -> None:
    """Create the directory ``path`` and its parents (where a filesystem has directories)."""
    with writing(path):
        fs.create_dir(path, recursive=True)


@contextmanager
def writing(path: str) -> Iterator[None]:
    """Turn an ``OSError`` of a write to ``path`` into chute's error for its errno (a full
    disk, a read-only or refused location: :func:`chute.errors.write_error`)."""
    try:
        yield
    except OSError as exc:
        error = write_error(exc, redact(path))
        if error is None:
            raise
        raise error from exc


def read(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The bytes of ``path``, or ``None`` where it does not exist."""
    try:
        with fs.open_input_stream(path) as f:
            return bytes(f.read())
    except FileNotFoundError:
        return None
    except PermissionError as exc:  # another user's output (written with umask 077)
        raise ConfigError(
            f"permission denied reading {redact(path)}: this user cannot read the output's "
            "files. Make them readable (chmod), run as their owner, or write elsewhere."
        ) from exc


def open_input_file(fs: pafs.FileSystem, path: str) -> Any:
    """Open ``path`` for random access."""
    return fs.open_input_file(path)


def parquet_metadata(fs: pafs.FileSystem, path: str, size: int | None = None) -> Any:
    """The footer of a Parquet file. With its size known (from the listing), an object
    store is not asked for it again: one ranged GET per file, no HEAD."""
    import pyarrow.parquet as pq

    if size is None or is_local(fs):
        return pq.read_metadata(fs.open_input_file(path))
    import pyarrow.dataset as ds

    fragment = ds.ParquetFileFormat().make_fragment(path, fs, file_size=size)
    fragment.ensure_complete_metadata()
    return fragment.metadata


def read_row_groups(
    fs: pafs.FileSystem, path: str, size: int, row_groups: list[int], columns: list[str] | None
) -> Any:
    """Row groups of a Parquet object whose size is known from the listing: ranged GETs
    only, no HEAD. ``columns`` the file lacks are left out."""
    import pyarrow.dataset as ds

    fragment = ds.ParquetFileFormat().make_fragment(path, fs, file_size=size, row_groups=row_groups)
    names = fragment.physical_schema.names
    cols = [c for c in columns if c in names] if columns is not None else None
    return fragment.to_table(columns=cols, use_threads=False)


def bucket_of(fs: pafs.FileSystem, path: str) -> str | None:
    """The bucket of an S3 path (``None`` elsewhere)."""
    return path.split("/", 1)[0] if isinstance(fs, pafs.S3FileSystem) else None


PERMANENT_S3 = re.compile(
    r"NO_SUCH_BUCKET|NoSuchBucket|ACCESS_DENIED|AccessDenied|INVALID_ACCESS_KEY_ID|"
    r"InvalidAccessKeyId|SIGNATURE_DOES_NOT_MATCH|SignatureDoesNotMatch|"
    r"HTTP response code:? 40[134]|HTTP status 40[134]|\b40[13] (?:Forbidden|Unauthorized)",
    re.IGNORECASE,
)


def check(path: str, storage: StorageOptions | None = None, what: str = "input") -> None:
    """Fail at once, naming the bucket and the fix, when ``path``'s bucket is missing or
    refuses these credentials; a local output must be writable by this user."""
    if scheme_of(path) in ("", "file", "local") and what == "output":
        check_writable(resolve(path, storage)[1])
    if scheme_of(path) not in S3_SCHEMES:
        return
    fs, root = resolve(path, storage)
    bucket = root.split("/", 1)[0]
    try:
        info = fs.get_file_info(bucket)
    except OSError as exc:
        detailed = _detailed(fs, root, exc) if permanent(exc) else exc
        raise storage_error(detailed, path, what, storage) from exc
    if info.type == pafs.FileType.NotFound:
        raise ConfigError(
            f"the {what} bucket {bucket!r} ({redact(path)}) does not exist"
            f"{_where(storage)}. Check the bucket name, or create the bucket first."
        )


def check_writable(directory: str) -> None:
    """Refuse, before any compute, a local output directory (or, where it does not exist
    yet, the directory it would be made in) that this user cannot write to."""
    existing = directory
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if existing != directory and not os.path.isdir(existing):
        raise ConfigError(
            f"cannot make the output {directory!r}: {existing!r} is a file, not a folder. "
            "Choose another output location."
        )
    if existing == directory and not (os.path.isdir(existing) or os.path.isfile(existing)):
        # /dev/null, a socket: a regular file is refused later, naming it so
        raise ConfigError(
            f"the output {directory!r} is not a folder: give a folder (a new or empty one, "
            "or one that holds this job's earlier results)."
        )
    if not os.path.isdir(existing) or os.access(existing, os.W_OK | os.X_OK):
        return
    code = errno.EROFS if os.statvfs(existing).f_flag & os.ST_RDONLY else errno.EACCES
    error = write_error(OSError(code, os.strerror(code)), existing)
    assert error is not None  # both errnos have one
    raise error


def _detailed(fs: pafs.FileSystem, root: str, exc: OSError) -> OSError:
    """A HEAD request's error has no body ("access denied" for a bad key too): a listing's
    error says which (unknown key, bad signature, denied)."""
    try:
        fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError as listing:
        return listing
    return exc


def storage_error(
    exc: BaseException, path: str, what: str, storage: StorageOptions | None = None
) -> ConfigError:
    """A permanent storage error as a message that names the bucket and the fix."""
    text = str(exc)
    # Classified without the addresses in it: a port such as 54017 is not an HTTP 401.
    said = re.sub(r"[a-z][a-z0-9+.-]*://\S+|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?", "", text)
    bucket = urllib.parse.urlsplit(path).hostname if scheme_of(path) in S3_SCHEMES else None
    where = f"the {what} bucket {bucket!r}" if bucket else f"the {what} {redact(path)!r}"
    if re.search(r"NO_SUCH_BUCKET|NoSuchBucket", said):
        fix = "Check the bucket name, or create the bucket first."
    elif re.search(r"INVALID_ACCESS_KEY_ID|InvalidAccessKey|SIGNATURE|\b401\b|Unauthorized", said):
        fix = (
            "The credentials were refused: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE or ~/.aws/credentials (use s3://anonymous@bucket/… for public data)."
        )
    elif re.search(r"ACCESS_DENIED|AccessDenied|\b403\b|Forbidden", said):
        fix = (
            "Access was denied: give these credentials read (input) or write (output) "
            "access to the bucket, or use s3://anonymous@bucket/… for public data."
        )
    else:
        fix = (
            "Check the endpoint (storage.endpoint_url or AWS_ENDPOINT_URL), the region and "
            "the network; the request was retried before giving up."
        )
    reason = redact(text).rstrip(". ")
    return ConfigError(f"cannot reach {where}{_where(storage)}: {reason}. {fix}")


def _where(storage: StorageOptions | None) -> str:
    endpoint = (storage or StorageOptions()).with_env().endpoint_url
    return f" at {endpoint}" if endpoint else ""


def permanent(exc: BaseException) -> bool:
    """Whether a storage error will not go away by retrying (no bucket, access denied)."""
    return bool(PERMANENT_S3.search(str(exc)))
