"""One owner per output location: a run's claim, kept in ``<output>/_chute/owners/``.

Two runs writing one output would each remove the other's parts as orphans and commit
units twice, and both would report success. So a run claims the location before it
reads the ledger, and the claim is one small JSON object per run, which works the same
on a local filesystem and on an object store (no rename, no append, no lock server):

1. write ``owners/<run>.json`` (who: host, boot id, pid and its start time, when);
2. list ``owners/``; every other claim is either **stale** — its process is gone (same
   machine: the pid no longer runs, or runs another program), or its heartbeat is older
   than its time to live (another machine) — and is deleted, or **live**, and then this
   run withdraws its own claim and is refused, naming the other run.

With read-after-write and list-after-write consistency (local filesystems; S3 since
2020), of two runs that claim at once at least one sees the other's claim, so two runs
never both own the location (both may withdraw; a retry then wins). The owner rewrites its
claim every :data:`HEARTBEAT_SECONDS` from a daemon thread; a claim found gone or taken
means another run judged this one dead, and :meth:`Lease.ensure` stops the run before it
commits or deletes anything more.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.fs as pafs

from chute.errors import ConfigError, JobStateError, write_error
from chute.retry import retrying
from chute.storage import is_local, put, read

OWNERS_DIR = "owners"
TTL_SECONDS = 60.0
"""A claim from another machine whose heartbeat is older than this is stale."""
HEARTBEAT_SECONDS = 10.0
"""How often a run rewrites its claim."""

_ACTIVE: set[str] = set()
"""Runs of this process that hold a claim (a claim with this pid but another run id was
left by an earlier run of this process that did not release it)."""


@dataclass(frozen=True)
class Claim:
    """Who holds (or held) an output location."""

    run: str
    host: str
    boot: str
    """The machine's boot id: a pid is only meaningful within one boot."""
    pid: int
    pid_started: int | None
    """The process's start time in clock ticks since boot (Linux), against pid reuse."""
    started: float
    """When the run began (seconds since the epoch)."""
    ttl: float
    pidns: str = ""
    """The process's pid namespace (``pid:[4026531836]``): containers on one machine share
    its host name and boot id, not their pids. Empty in claims of earlier versions."""

    @classmethod
    def mine(cls, ttl: float) -> Claim:
        pid = os.getpid()
        host, boot, started = socket.gethostname(), _boot_id(), _started(pid)
        return cls(uuid.uuid4().hex, host, boot, pid, started, time.time(), ttl, _pidns())

    @classmethod
    def parse(cls, data: bytes) -> Claim | None:
        """A claim from its JSON (fields a later version added are left out), or ``None``
        for bytes that are not one."""
        try:
            fields = json.loads(data)
            known = {k: v for k, v in fields.items() if k in cls.__dataclass_fields__}
            return cls(**known)
        except (ValueError, TypeError, AttributeError):
            return None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started))
        return f"pid {self.pid} on host {self.host!r}, started {when}"

    def here(self) -> bool:
        """Whether the claim was made on this machine, in this boot, where its pid can be
        looked up (the same pid namespace: another container's pids are not ours)."""
        same = self.host == socket.gethostname() and self.boot == _boot_id()
        return same and (not self.pidns or not _pidns() or self.pidns == _pidns())

    def alive_here(self) -> bool:
        """For a claim made on this machine: whether its run can still be going."""
        if self.pid == os.getpid():
            return self.run in _ACTIVE
        if not _pid_exists(self.pid) or _state(self.pid) in ("Z", "X"):
            return False  # gone, or exited and waiting to be reaped
        return self.pid_started is None or _started(self.pid) in (None, self.pid_started)


@dataclass(frozen=True)
class Fence:
    """A run's claim, as the writers of its parts check it (shipped to Ray's workers): a
    part is put in place only while the claim is still the run's. A driver paused past its
    time to live (a frozen VM) whose output another run took over and finished would
    otherwise put the part its writer held into that finished output, beside ``_SUCCESS``,
    its rows there twice."""

    claim: Claim
    relative: str
    """The claim's file, relative to the output location."""

    def check(self, fs: pafs.FileSystem, root: str) -> None:
        """Raise unless the claim at ``root`` is still this run's."""
        data = retrying(lambda: read(fs, f"{root}/{self.relative}"), "reading the claim")
        if not data or Claim.parse(data) != self.claim:
            raise JobStateError(
                "this run lost its claim on the output (another run, judging it dead, took "
                "the output over): it puts no more files there. Run it again once the "
                "other run has finished."
            )


class Lease:
    """This run's claim on an output location; a context manager that releases it."""

    def __init__(self, fs: pafs.FileSystem, meta: str, claim: Claim) -> None:
        self.fs = fs
        self.folder = f"{meta}/{OWNERS_DIR}"
        self.claim = claim
        self.path = f"{self.folder}/{claim.run}.json"
        self.taken_over: list[Claim] = []
        """Stale claims of dead runs that this run replaced."""
        self._lost: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._renewed = _clock()
        """When the claim was last read back as this run's and rewritten in good time."""

    @classmethod
    def acquire(cls, fs: pafs.FileSystem, meta: str, where: str, ttl: float = TTL_SECONDS) -> Lease:
        """Claim the location whose chute folder is ``meta``; refuse if a live run owns it.

        ``where`` names the location in messages.
        """
        lease = cls(fs, meta, Claim.mine(ttl))
        if is_local(fs):
            try:
                fs.create_dir(lease.folder, recursive=True)
            except OSError as exc:  # /proc/out: a folder that no one may make there
                raise write_error(exc, where) or ConfigError(
                    f"cannot make the output folder {where!r} ({exc}): choose another output "
                    "location."
                ) from exc
        _ACTIVE.add(lease.claim.run)
        try:
            lease._write()
            lease._settle(where)
        except BaseException:
            lease.release()
            raise
        lease._start_heartbeat()
        return lease

    def _settle(self, where: str) -> None:
        """Delete stale claims; refuse if another live one exists."""
        infos = self._list()
        now = next((i.mtime for i in infos if i.path == self.path), None)
        for info in infos:
            if info.path == self.path or not info.base_name.endswith(".json"):
                continue
            data = self._bytes(info.path)
            if not data:
                continue  # withdrawn or released since the listing
            other = Claim.parse(data)
            if other is None:  # torn, or of a version this one cannot read: live till old
                if not _older(info, now, TTL_SECONDS):
                    raise JobStateError(
                        f"output {where!r} holds a claim this chute cannot read "
                        f"({info.path}): another run, perhaps of another chute version, may "
                        f"own it. Wait {TTL_SECONDS:.0f} s for it to go stale, or stop that run."
                    )
                self._delete(info.path)
                continue
            if self._stale(other, info, now):
                self._delete(info.path)
                self.taken_over.append(other)
                continue
            raise JobStateError(
                f"output {where!r} is in use by another chute run: {other.describe()}. "
                "Two runs on one output would each remove the other's results. Wait for it "
                "to finish or stop it, or choose another output location. (A run that died "
                "is taken over by the next run: at once on the same machine, after "
                f"{other.ttl:.0f} s without a heartbeat from another machine.)"
            )

    @staticmethod
    def _stale(other: Claim, info: pafs.FileInfo, now: Any) -> bool:
        if other.here():
            return not other.alive_here()
        return _older(info, now, other.ttl)

    def fence(self) -> Fence:
        """The claim as writers check it (its file relative to the output location, the
        folder of ``_chute/``)."""
        return Fence(self.claim, self.path[len(self.folder.rsplit("/", 2)[0]) + 1 :])

    def ensure(self) -> None:
        """Raise if this run lost its claim (another run judged it dead and took over), or
        could not renew it for half its time to live: past that, another machine's run may
        judge it dead before this run learns of it."""
        if self._lost is None and _clock() - self._renewed > self.claim.ttl / 2:
            self._lost = (
                f"this run could not renew its claim on the output for "
                f"{_clock() - self._renewed:.0f} s (the process was paused, or the storage "
                "did not answer), and another run may have taken the output over. It stops "
                "without committing or deleting anything more; run it again."
            )
        if self._lost is not None:
            raise JobStateError(self._lost)

    def check(self) -> None:
        """Read the claim back now (before deleting files): raise if it is gone."""
        self.ensure()
        if self._read(self.path) != self.claim:
            self._lose()
            self.ensure()

    def release(self) -> None:
        """Give the location up (the claim is deleted; nothing else is touched)."""
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=5)
        _ACTIVE.discard(self.claim.run)
        if self._lost is None:
            with contextlib.suppress(Exception):
                self._delete(self.path)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def _start_heartbeat(self) -> None:
        period = min(HEARTBEAT_SECONDS, self.claim.ttl / 4)
        self._beat = threading.Thread(
            target=self._heartbeat, args=(period,), name="chute-lease", daemon=True
        )
        self._beat.start()

    def _heartbeat(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                if not self.beat():
                    return
            except Exception:  # a transient failure: the next beat tries again
                continue

    def beat(self) -> bool:
        """Renew the claim once; ``False`` once it is lost. A renewal that took longer than
        a third of the time to live (a paused process, a write retried through an outage)
        may have landed after another run took the output over: it is withdrawn, and this
        run stops, rather than bring back a claim the other run has replaced."""
        began = _clock()
        if self._read(self.path) != self.claim:
            self._lose()
            return False
        self._write()
        if _clock() - began > self.claim.ttl / 3:
            self._lose()
            with contextlib.suppress(Exception):
                self._delete(self.path)
            return False
        self._renewed = began
        return True

    def _lose(self) -> None:
        self._lost = (
            f"this run lost its claim on the output (its {self.path!r} was removed by another "
            "run that judged it dead). It stops without committing or deleting anything more; "
            "run it again once the other run has finished."
        )

    def _write(self) -> None:
        data = json.dumps(asdict(self.claim)).encode()
        retrying(lambda: put(self.fs, self.path, data), "writing the output's claim")

    def _list(self) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.folder, allow_not_found=True)
        return list(retrying(lambda: self.fs.get_file_info(selector), "listing claims"))

    def _read(self, path: str) -> Claim | None:
        data = self._bytes(path)
        return Claim.parse(data) if data else None

    def _bytes(self, path: str) -> bytes | None:
        return retrying(lambda: read(self.fs, path), "reading a claim")

    def _delete(self, path: str) -> None:
        def delete() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(path)

        retrying(delete, f"removing {path}")


def _older(info: pafs.FileInfo, now: Any, ttl: float) -> bool:
    """Whether a claim was last written more than ``ttl`` before ``now`` (the store's
    times, both: no clock of this machine is compared with the store's)."""
    if now is None or info.mtime is None:
        return False
    return bool((now - info.mtime).total_seconds() > ttl)


def _clock() -> float:
    """Seconds on a clock that goes on while the machine sleeps (Linux's boot time)."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (from field 3 on)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2 :].split()


def _state(pid: int) -> str:
    fields = _stat(pid)
    return fields[0] if fields else ""


def _started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, where /proc has it."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 else None  # field 22 of proc(5)


def live_claims(fs: pafs.FileSystem, meta: str) -> list[Claim]:
    """The claims of runs that still own the location whose chute folder is ``meta``,
    read without writing anything (``chute validate``): a claim from this machine whose
    process runs, or one from another machine whose heartbeat is younger than its TTL."""
    folder = f"{meta}/{OWNERS_DIR}"
    selector = pafs.FileSelector(folder, allow_not_found=True)
    infos = retrying(lambda: fs.get_file_info(selector), "listing claims")
    reader = Lease(fs, meta, Claim.mine(TTL_SECONDS))
    live = []
    for info in infos:
        claim = reader._read(info.path) if info.base_name.endswith(".json") else None
        if claim is None:
            continue
        if claim.here():
            alive = claim.alive_here()
        else:
            age = time.time() - info.mtime.timestamp() if info.mtime is not None else 0.0
            alive = age <= claim.ttl
        if alive:
            live.append(claim)
    return live
