"""Writing the output fails (a full disk, a file size limit, a refused or read-only
location): a chute error that names the path and the fix, its exit code, no traceback,
and a resume that ends with every row exactly once once the cause is gone."""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import chute
from chute.errors import ChuteError, ConfigError, ResourceError
from chute.storage import append, check_writable, make_dir, put

LIMIT = 64 * 1024
"""The file size limit the failing runs write under: more than the ledger's and the
claim's files, less than one part."""
ROWS = 60_000

JOB = """
input: {path: in, format: parquet}
carryover: [id]
models:
  - name: m
    fn: models.py:double
    inputs: [x]
output: {path: out}
engine: local
"""

MODELS = """
import numpy as np

def double(batch):
    return np.asarray(batch["x"]) * 2
"""

LIMITED = (
    "import resource, runpy, signal, sys; "
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "  # the write gets EFBIG, not a signal
    f"resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, resource.RLIM_INFINITY)); "
    "sys.argv = ['chute', *sys.argv[1:]]; runpy.run_module('chute', run_name='__main__')"
)
"""``python -c LIMITED run job.yaml``: ``chute`` under a file size limit."""

UNPRIVILEGED = (
    "import ctypes, os, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0); "  # PR_CAPBSET_DROP, DAC_OVERRIDE
    "os.execv(sys.argv[1], sys.argv[1:])"
)
"""``python -c UNPRIVILEGED cmd...``: root without the capability that ignores file modes."""


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A job over three Parquet files (ids 0..ROWS-1), its model file, no output yet."""
    (tmp_path / "in").mkdir()
    per = ROWS // 3
    for i in range(3):
        ids = np.arange(i * per, (i + 1) * per)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), tmp_path / "in" / f"f{i}.parquet")
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "models.py").write_text(MODELS)
    return tmp_path


CHUTE = [sys.executable, "-m", "chute"]


def _chute(job_dir: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    """``chute run job.yaml`` in a subprocess, ``command`` standing for ``chute``; its output
    with rich's line wrapping undone."""
    done = subprocess.run(
        [*command, "run", "job.yaml"],
        cwd=job_dir,
        env={**os.environ, "COLUMNS": "1000"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    done.stdout, done.stderr = " ".join(done.stdout.split()), " ".join(done.stderr.split())
    return done


def _exactly_once(out: Path) -> None:
    ids = pd.read_parquet(out).id
    assert sorted(ids) == list(range(ROWS))
    assert (out / "_SUCCESS").exists()


@pytest.mark.timeout(300)
def test_file_size_limit_is_a_clear_error_and_the_resume_completes(job_dir: Path) -> None:
    failed = _chute(job_dir, [sys.executable, "-c", LIMITED])
    said = failed.stdout + failed.stderr
    assert failed.returncode == ResourceError.exit_code, said
    assert "Traceback" not in said
    assert "file too large" in said and f"writing {job_dir / 'out'}/part-" in said
    assert "raise the file size limit (ulimit -f), or choose another output" in said
    done = _chute(job_dir, CHUTE)
    assert done.returncode == 0, done.stdout + done.stderr
    _exactly_once(job_dir / "out")


def _unprivileged() -> list[str]:
    """The launcher that makes a write into a directory of mode 0o555 fail for this user."""
    return [sys.executable, "-c", UNPRIVILEGED] if os.geteuid() == 0 else []


def _can_refuse(directory: Path) -> bool:
    """Whether a process started like the job is refused a write into ``directory``."""
    probe = f"open({str(directory / 'probe')!r}, 'w')"
    launched = [*_unprivileged(), sys.executable, "-c", probe]
    return subprocess.run(launched, capture_output=True, timeout=60).returncode != 0


@pytest.mark.timeout(300)
def test_read_only_output_is_refused_before_any_compute(job_dir: Path) -> None:
    out = job_dir / "out"
    out.mkdir(mode=0o555)
    out.chmod(0o555)
    if not _can_refuse(out):
        pytest.skip("cannot drop the privilege to write anywhere (CAP_DAC_OVERRIDE) here")
    command = [*_unprivileged(), *CHUTE]
    failed = _chute(job_dir, command)
    said = failed.stdout + failed.stderr
    assert failed.returncode == ConfigError.exit_code, said
    assert "Traceback" not in said
    assert f"permission denied writing {out}: make the output writable" in said
    assert list(out.iterdir()) == []  # nothing was written, no claim either
    out.chmod(0o755)
    done = _chute(job_dir, command)
    assert done.returncode == 0, done.stdout + done.stderr
    _exactly_once(out)


def test_check_writable_names_the_nearest_existing_directory(tmp_path: Path) -> None:
    check_writable(str(tmp_path / "not" / "yet"))  # made later, under a writable one
    if os.geteuid() == 0:
        return  # root writes anywhere: the subprocess test above drops that privilege
    locked = tmp_path / "locked"
    locked.mkdir(mode=stat.S_IRUSR | stat.S_IXUSR)
    with pytest.raises(ConfigError, match=f"permission denied writing {locked}:"):
        check_writable(str(locked / "out"))


class Refusing(pafs.FSSpecHandler):
    """An in-memory filesystem whose every write fails with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(fsspec.filesystem("memory"))
        self.code = code

    def _refuse(self, *_: Any) -> Any:
        raise OSError(self.code, os.strerror(self.code))

    open_output_stream = open_append_stream = create_dir = _refuse


WRITES: list[Callable[[pafs.FileSystem, str], None]] = [
    lambda fs, path: put(fs, path, b"data"),
    lambda fs, path: append(fs, path, b"line\n"),
    make_dir,
]


@pytest.mark.parametrize(
    ("code", "kind", "words"),
    [
        pytest.param(errno.ENOSPC, ResourceError, "no space left on device", id="ENOSPC"),
        pytest.param(errno.EDQUOT, ResourceError, "disk quota exceeded", id="EDQUOT"),
        pytest.param(errno.EFBIG, ResourceError, "file too large", id="EFBIG"),
        pytest.param(errno.EACCES, ConfigError, "permission denied", id="EACCES"),
        pytest.param(errno.EPERM, ConfigError, "operation not permitted", id="EPERM"),
        pytest.param(errno.EROFS, ConfigError, "read-only file system", id="EROFS"),
    ],
)
@pytest.mark.parametrize("write", WRITES, ids=["put", "append", "make_dir"])
def test_write_errors_are_translated_by_errno(
    code: int, kind: type[ChuteError], words: str, write: Callable[[pafs.FileSystem, str], None]
) -> None:
    fs = pafs.PyFileSystem(Refusing(code))
    with pytest.raises(kind, match=f"^{words} writing /out/part-1: ") as info:
        write(fs, "/out/part-1")
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == code


def test_other_os_errors_stay_as_they_are() -> None:
    fs = pafs.PyFileSystem(Refusing(errno.EIO))
    with pytest.raises(OSError) as info:
        put(fs, "/out/part-1", b"data")
    assert not isinstance(info.value, ChuteError) and info.value.errno == errno.EIO


class ArmedDouble:
    """Doubles ``x``; while the file ``arm`` exists, first puts its own process (the Ray
    worker that runs the read tasks it is fused into, and writes the parts) under a file
    size limit, and lifts the limit once ``arm`` is gone (the process outlives the run)."""

    def __init__(self, arm: str) -> None:
        self.arm = arm

    def __call__(self, batch: pa.Table) -> np.ndarray:
        if os.path.exists(self.arm):
            libc = ctypes.CDLL(None)
            libc.signal.restype = ctypes.c_void_p
            libc.signal(25, ctypes.c_void_p(1))  # SIGXFSZ ignored, from any thread
            resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))
        else:
            limit = resource.RLIM_INFINITY
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        return np.asarray(batch["x"]) * 2


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_write_error_on_a_ray_worker_arrives_as_the_chute_error(
    job_dir: Path, ray_session: Any
) -> None:
    arm = job_dir / "arm"
    arm.touch()

    def job() -> chute.Job:
        model = chute.Model("m", ArmedDouble, inputs=("x",), kwargs={"arm": str(arm)})
        return chute.Job(
            source=chute.FileSource(str(job_dir / "in")),
            models=(model,),
            carryover=("id",),
            output=chute.Sink(str(job_dir / "out")),
            engine="ray",
        )

    with pytest.raises(ResourceError) as info:
        job().run()
    assert str(info.value).startswith("file too large writing")
    assert f"writing {job_dir / 'out'}/part-" in str(info.value)
    arm.unlink()
    job().run()
    _exactly_once(job_dir / "out")


class FullFileSystem(MemoryFileSystem):  # type: ignore[misc]
    """An in-memory store that is full for part files and reports (claims, ``job.json``
    and the ledger still fit): the run fails, and so does its partial report."""

    protocol = "chute-full-disk"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "w" in mode and ("part-" in path or "report" in path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super()._open(path, mode, **kwargs)


@pytest.mark.timeout(120)
def test_a_full_disk_while_stopping_is_one_line_not_a_traceback(
    job_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fsspec.register_implementation(FullFileSystem.protocol, FullFileSystem, clobber=True)
    model = chute.Model("m", lambda b: np.asarray(b["x"]) * 2, inputs=("x",))
    where = f"{FullFileSystem.protocol}://{job_dir.name}/out"
    job = chute.Job(
        source=chute.FileSource(str(job_dir / "in")),
        models=(model,),
        output=chute.Sink(where),
        engine="local",
    )
    with pytest.raises(ResourceError, match=f"^no space left on device writing {where}/part-"):
        job.run()
    warned = [r for r in caplog.records if r.name == "chute" and r.levelname == "WARNING"]
    assert any("could not write the partial report: no space left" in r.message for r in warned)
    assert all(r.exc_info is None for r in warned)


def test_a_folder_the_mount_cannot_flush_is_no_error_but_a_file_that_fails_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync of a folder is refused by some mounts (EINVAL on FUSE and CIFS); a file's
    fsync that fails (EIO: the disk) fails the write, and no file is put."""
    import errno
    import os

    import pyarrow.fs as pafs

    from chute.storage import put

    fsync = os.fsync

    def refusing(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(target):
            raise OSError(errno.EINVAL, "Invalid argument")
        if target.endswith(".tmp") and "bad" in target:
            raise OSError(errno.EIO, "Input/output error")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", refusing)
    fs = pafs.LocalFileSystem()
    assert put(fs, str(tmp_path / "good.json"), b"{}") == 2
    with pytest.raises(OSError, match="Input/output error"):
        put(fs, str(tmp_path / "bad.json"), b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.json"]


class KeepsFiles(pafs.FSSpecHandler):
    """An in-memory filesystem that refuses to delete a file (another owner's file in a
    sticky folder; a bucket policy without delete)."""

    def __init__(self) -> None:
        super().__init__(fsspec.filesystem("memory"))

    def delete_file(self, path: str) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))


def test_an_orphan_part_that_cannot_be_removed_is_a_named_error() -> None:
    """A resume that found a part no ledger line names, and could not delete it, ended
    in a traceback (exit 1)."""
    from chute.ledger import Ledger

    fs = pafs.PyFileSystem(KeepsFiles())
    orphan = "/out/part-000009-0000000000-0badc0de.parquet"
    put(fs, orphan, b"rows a killed run wrote")
    with pytest.raises(ConfigError, match=f"^operation not permitted writing {orphan}: "):
        Ledger(fs, "/out", objects=False).reconcile()
    assert fs.get_file_info(orphan).size == len(b"rows a killed run wrote")
