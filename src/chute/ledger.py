"""The ledger: what an output location holds, kept in ``<output>/_chute/``.

* ``job.json`` — the fingerprint and description of the job that owns the location;
* the committed units, one JSON line each (id, rows, part files with their rows and
  bytes). A unit is committed when its parts account for all of its rows, and its line is
  written only after those parts are in place, so a crash at any moment leaves a ledger
  that names only complete units. Two layouts, one meaning:

  - **Files shared by units.** Writers join small pieces into files up to a target size
    (:class:`~chute.job.FileTarget`), so one data file may hold the whole of several units
    (never part of a unit beside another: :func:`chute.sinks.file_groups`). Each of those
    units' lines names the file with the unit's own rows in it, the file's bytes, and how
    many units it holds: ``[path, rows, bytes, units]``. Such units complete together and
    are committed in one ledger write; should a crash tear that write, a resume trusts a
    shared file's units only when all ``units`` of them are in the ledger, and forgets the
    others (:meth:`Ledger.reconcile`), so the file is an orphan, removed, and every unit in
    it is redone: no row twice, none lost. A file is deleted only when no trusted unit
    names it.

  - on a local filesystem, ``ledger.jsonl``, appended to (a torn last line is ignored).
    Each part file reaches the disk (fsync) before it is renamed into place, and so before
    the line that names it; the ledger reaches it before ``_SUCCESS``: a machine that loses
    power never keeps a line or the marker beside a file that did not;
  - on an object store, which has neither append nor rename, one object per commit batch,
    ``ledger/<seq>-<uuid>.jsonl``, each written whole in one PUT. The driver batches the
    units that complete close together (see :meth:`Ledger.flush_due`: at most one object a
    second, and one per 1% of the run's time so far, up to 30 s, so a ten-hour job
    writes about 1,500) and a unit counts as committed only once its object exists.
    Resuming lists ``ledger/`` (one request per 1,000 objects) and merges what it finds;
    more than :data:`COMPACT_AT` objects are first merged into one. Both layouts are read
    everywhere, so either resumes.
* ``report.json`` (and ``report.html``) at the end and after an interruption;
* ``manifest.json`` — written at the end, just before the success marker
  ``<output>/_SUCCESS``: every part file that belongs to the result, with its rows and
  bytes, and the errors parts. **Downstream readers trust the manifest** (or, once
  ``_SUCCESS`` exists on a local filesystem, every ``part-*`` file: orphans are removed
  before it is written). On an object store, list the manifest's files rather than the
  prefix: a listing can show parts of a run that is still going or was killed.

Everything chute keeps starts with ``_`` so that Arrow, pandas and Spark readers of the
output directory skip it.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import pyarrow.fs as pafs

from chute.errors import JobStateError
from chute.job import describe_changes
from chute.lease import OWNERS_DIR, Lease
from chute.retry import retrying
from chute.sinks import ERRORS_DIR, output_filesystem
from chute.storage import (
    META_DIR,
    SUCCESS,
    StorageOptions,
    append,
    check,
    is_local,
    make_dir,
    put,
    read,
    redact,
    synced,
    writing,
)

PART_NAME = re.compile(r"part-\d{6,}-\d{10,}-[0-9a-f]{8}\.(?:parquet|csv|jsonl)")
"""A part file's name as chute makes it (``PartWriter._name``: the unit's index, at least six
digits, and its first row's, at least ten): another tool's ``part-00000-…`` (Spark's) is not
one."""
TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{8}\.tmp")
"""A file chute was writing, under a temporary name beside it."""


def written_by_chute(name: str, claimed: bool) -> bool:
    """Whether an output directory's entry ``name`` is one chute writes: ``_chute/``, and
    its part files (and their temporaries), ``_errors/`` and ``_SUCCESS`` where chute has
    claimed the directory (``claimed``: ``_chute/job.json`` is there; else another tool's,
    or a copy the user made of chute's results).
    Anything else is the user's: a run never deletes it, ``--overwrite`` included, and
    refuses to write beside it."""
    if (temporary := TEMPORARY.fullmatch(name)) is not None:
        name = temporary.group(1)
    if name in (SUCCESS, ERRORS_DIR) or PART_NAME.fullmatch(name) is not None:
        return claimed  # else another copy's, the user's own: never deleted as an orphan
    return name == META_DIR


def foreign_files(fs: pafs.FileSystem, root: str, claimed: bool) -> list[str]:
    """The entries of the output directory ``root`` that chute did not write, sorted; a
    hidden one (``.DS_Store``, ``.git``) is neither chute's nor in the way: left alone."""
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return _foreign([i.base_name for i in infos], claimed)


def _foreign(names: list[str], claimed: bool) -> list[str]:
    return sorted(n for n in names if not written_by_chute(n, claimed) and not n.startswith("."))


def foreign_error(where: str, names: list[str], chute_was_here: bool) -> str:
    shown = ", ".join(repr(n) for n in names[:5])
    if len(names) > 5:
        shown += f" and {len(names) - 5} more"
    also = " beside the results of a chute job" if chute_was_here else ""
    return (
        f"output {where!r} holds files that chute did not write{also}: {shown}. chute "
        "never deletes or mixes with them (--overwrite replaces only chute's own results). "
        "Choose an empty or new directory, or move those files away."
    )


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _is_part(name: str) -> bool:
    """A part file chute wrote, or its temporary."""
    temporary = TEMPORARY.fullmatch(name)
    return PART_NAME.fullmatch(temporary.group(1) if temporary else name) is not None


LEDGER_FILE = "ledger.jsonl"
LEDGER_DIR = "ledger"
MANIFEST = "manifest.json"
OBJECT_BATCH_SECONDS = 1.0
"""On object stores, units that complete within this long of the last ledger write are
written together in the next one."""
OBJECT_BATCH_MAX_SECONDS = 30.0
"""The longest a completed unit waits for its ledger object (on a long run)."""
MULTIPART_AT = 5 * 1024 * 1024
"""Metadata this large is staged under another name on an object store (see ``_put``)."""
COMPACT_AT = 64
"""Ledger objects found on resume beyond which they are merged into one."""


class Ledger:
    """Committed units of one output location."""

    def __init__(self, fs: pafs.FileSystem, root: str, objects: bool | None = None) -> None:
        self.fs = fs
        self.root = root
        self.meta = f"{root}/{META_DIR}"
        self._entries: dict[str, dict[str, Any]] = {}
        self.objects = not is_local(fs) if objects is None else objects
        """One object per commit batch (object stores) rather than appended lines."""
        self.batch_seconds = OBJECT_BATCH_SECONDS if self.objects else 0.0
        """How long the driver may hold completed units before writing them (0: at once)."""
        self._seq = 0
        self._objects_read = 0
        self.lease: Lease | None = None
        """This run's claim on the location: checked before every commit and deletion."""
        self.errors_dir = ERRORS_DIR
        """Where the rows a model failed on are, relative to the root (quarantine)."""
        self._replacing: list[str] | None = None
        """With ``--overwrite``: the earlier results' files, deleted at this run's first
        commit (:meth:`_replace`), so that a run that fails before it leaves them."""
        self._job: dict[str, Any] = {}
        """This run's ``job.json``, written by :meth:`_claim` or at the first commit."""
        self.strangers: list[str] = []
        """The top level's entries chute did not write, as :meth:`reconcile` last listed."""

    @classmethod
    def open(
        cls,
        path: str,
        fingerprint: str,
        description: dict[str, Any],
        overwrite: bool,
        units_total: int | None = None,
        storage: StorageOptions | None = None,
        objects: bool | None = None,
        lease: Lease | None = None,
    ) -> Ledger:
        """Open (or create) the ledger, refusing a location that holds another job.

        ``lease`` is the run's claim on the location (:meth:`claim`); without one the
        caller answers for being the only writer (tests, tools).
        """
        check(path, storage, "output")  # a missing bucket, refused credentials: fail now
        fs, root = output_filesystem(path, storage)
        ledger = cls(fs, root, objects)
        ledger.lease = lease
        ledger._claim(fingerprint, description, overwrite, units_total)
        if ledger._replacing is not None:
            return ledger  # starts from nothing; the earlier ledger goes at the first commit
        ledger._entries = ledger.read_entries()
        if not ledger.objects:
            ledger._mend_last_line()
        elif ledger._objects_read > COMPACT_AT:
            ledger.compact()
        return ledger

    @staticmethod
    def claim(path: str, storage: StorageOptions | None = None) -> Lease:
        """Claim the output location for this run (see :mod:`chute.lease`): refused with a
        :class:`~chute.errors.JobStateError` naming the other run while a live run owns it."""
        check(path, storage, "output")
        fs, root = output_filesystem(path, storage)
        if fs.get_file_info(root).type == pafs.FileType.File:
            raise JobStateError(f"output {redact(path)!r} is a file; give a directory.")
        return Lease.acquire(fs, f"{root}/{META_DIR}", redact(path))

    def flush_due(self, waited: float, elapsed: float) -> bool:
        """Whether completed units that waited ``waited`` seconds, ``elapsed`` seconds into
        the run, are to be written now (appends always; objects in batches)."""
        if not self.objects:
            return True
        wait = min(OBJECT_BATCH_MAX_SECONDS, max(self.batch_seconds, 0.01 * elapsed))
        return waited >= wait

    def compact(self) -> None:
        """Merge the ledger objects into one (written first: a crash leaves duplicates of
        the same entries, never a lost one), then delete the merged ones."""
        selector = pafs.FileSelector(f"{self.meta}/{LEDGER_DIR}", allow_not_found=True)
        old = [i.path for i in retrying(lambda: self.fs.get_file_info(selector), "listing")]
        self.commit(list(self._entries.values()))
        for path in old:
            retrying(partial(self._delete, path), f"removing {path}")
        self._objects_read = 1

    def _mend_last_line(self) -> None:
        """End the ledger with a newline, so that the next commit starts a line of its own.

        A crash in the middle of an append leaves a torn last line: cut it off (that unit
        was not committed). Appended to as it was, the torn line would swallow the next
        unit's line and lose that commit too. A last line that is whole but lacks only its
        newline was read as committed: keep it.
        """
        path = f"{self.meta}/{LEDGER_FILE}"
        data = read(self.fs, path)
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
            mended = data + b"\n"
        except json.JSONDecodeError:
            mended = data[:cut]
        put(self.fs, path, mended)

    def _claim(
        self,
        fingerprint: str,
        description: dict[str, Any],
        overwrite: bool,
        units_total: int | None,
    ) -> None:
        self._job = {
            "fingerprint": fingerprint,
            "job": description,
            "units_total": units_total,
            "created": time.time(),
        }
        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.File:
            raise JobStateError(f"output {self.root!r} is a file; give a directory.")
        if info.type == pafs.FileType.Directory:
            owner = self.owner(overwrite)
            foreign = self._foreign(owner is not None)
            if foreign:  # never deleted, never mixed with: not even --overwrite wipes them
                raise JobStateError(foreign_error(redact(self.root), foreign, owner is not None))
            committed = owner is not None and bool(self.read_entries())
            if overwrite and committed:
                # The earlier results stay until this run commits its first unit: a run
                # that fails before (a model that does not load) leaves them, less
                # _SUCCESS (the location is being written again)
                self._replacing = self._results()
                self.unfinish()
                return
            if overwrite or (owner is not None and not committed):
                # asked to, or the earlier job committed nothing: there is nothing to mix
                self._wipe()
            elif owner is not None and owner.get("fingerprint") != fingerprint:
                changed = describe_changes(owner.get("job", {}), description)
                raise JobStateError(
                    f"output {self.root!r} holds the results of a different job "
                    f"(changed: {changed}). Resuming would mix two jobs' outputs. Use another "
                    "output location, or pass --overwrite to discard the earlier results."
                )
            elif owner is not None:
                return
        if is_local(self.fs):  # object stores have no directories to make
            make_dir(self.fs, self.meta)
        self._write_json("job.json", self._job)

    def _results(self) -> list[str]:
        """Every file of the location that chute wrote (for :meth:`_replace`) but this
        run's claim and ``job.json``: part files and temporaries, ``_errors/``'s files,
        ``_chute/``'s (the ledger, the report, the manifest)."""
        keep = (f"{self.meta}/{OWNERS_DIR}/", f"{self.meta}/job.json")
        files: list[str] = []
        for info in self._list(self.root):
            if not written_by_chute(info.base_name, True):
                continue
            if info.is_file:
                files.append(info.path)
                continue
            selector = pafs.FileSelector(info.path, recursive=True, allow_not_found=True)
            inside = retrying(partial(self.fs.get_file_info, selector), f"listing {info.path}")
            files += [i.path for i in inside if i.is_file and not i.path.startswith(keep)]
        return files

    def _replace(self) -> None:
        """What ``--overwrite`` replaces goes, at this run's first commit: the earlier
        ledger first (a run stopped after it finds a job that committed nothing, and
        starts afresh), then this job's ``job.json`` is written, then the earlier results'
        files go. Files this run wrote since its claim are not among them."""
        old, self._replacing = self._replacing, None
        if old is None:
            return
        self._guard()
        ledger = (f"{self.meta}/{LEDGER_FILE}", f"{self.meta}/{LEDGER_DIR}/")
        for path in [p for p in old if p.startswith(ledger)]:
            retrying(partial(self._delete, path), f"removing {path}")
        self._write_json("job.json", self._job)
        for path in [p for p in old if not p.startswith(ledger)]:
            retrying(partial(self._delete, path), f"removing {path}")

    def _wipe(self) -> None:
        """Empty the location for a fresh start, keeping the claims and ``job.json``.

        The ledger goes before the parts it names, so an interrupted wipe leaves a ledger
        whose every unit still has its parts (and a resume verifies them anyway), never
        one that names deleted parts; ``job.json`` is rewritten, not removed, so the
        location never looks like somebody else's files.
        """
        self._guard()
        for path in (f"{self.root}/{SUCCESS}", f"{self.meta}/{MANIFEST}"):
            retrying(partial(self._delete, path), f"removing {path}")
        retrying(partial(self._delete, f"{self.meta}/{LEDGER_FILE}"), "removing the ledger")
        for info in self._list(f"{self.meta}/{LEDGER_DIR}"):
            retrying(partial(self._delete, info.path), f"removing {info.path}")
        keep = {f"{self.meta}/{OWNERS_DIR}", f"{self.meta}/job.json", self.meta}
        mine = [i for i in self._list(self.root) if written_by_chute(i.base_name, True)]
        for info in self._list(self.meta) + mine:  # never a file chute did not write
            if info.path not in keep:
                retrying(partial(self._remove, info), f"removing {info.path}")
        self._entries = {}

    def _foreign(self, claimed: bool) -> list[str]:
        """What the location holds that chute did not write (refused, never wiped)."""
        return foreign_files(self.fs, self.root, claimed)

    def _remove(self, info: pafs.FileInfo) -> None:
        if info.type == pafs.FileType.Directory:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_dir(info.path)
        else:
            self._delete(info.path)

    def _guard(self) -> None:
        """Before deleting anything: this run must still own the location."""
        if self.lease is not None:
            self.lease.check()

    def read_json(self, name: str) -> dict[str, Any] | None:
        """``_chute/<name>``, or ``None`` where there is none; one that is not a JSON object
        (a write cut short: an upload that failed can leave 0 bytes) is refused by name."""
        path = f"{self.meta}/{name}"
        data = retrying(lambda: read(self.fs, path), f"reading {name}")
        if data is None:
            return None
        try:
            value = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            value = exc
        if not isinstance(value, dict):
            raise JobStateError(
                f"{redact(path)!r} is not what chute wrote ({len(data):,} bytes, not a JSON "
                f"object: a write cut short). {self._start_over}"
            )
        return value

    _start_over = "Run with --overwrite to start over, or write to another output."
    """What to do about a record of the output that was cut short."""

    def owner(self, overwrite: bool = False) -> dict[str, Any] | None:
        """``job.json``; with ``overwrite``, one cut short is a claim of no known job."""
        try:
            return self.read_json("job.json")
        except JobStateError:
            if overwrite:
                return {}
            raise

    def _write_json(self, name: str, value: Any) -> None:
        """``value`` as JSON, as any reader parses it: a non-finite number (a mean of a
        column holding an infinity) is ``null``, where Python's ``Infinity`` or ``NaN``
        would make the file invalid JSON for every other reader."""
        text = json.dumps(_finite(value), indent=2, default=str, allow_nan=False)
        self._put(name, text.encode())

    def _put(self, name: str, data: bytes) -> None:
        path = f"{self.meta}/{name}"
        if is_local(self.fs) or len(data) < MULTIPART_AT:
            retrying(lambda: put(self.fs, path, data), f"writing {name}")
            return
        # A multipart upload that fails can leave 0 bytes under its name (the stream's close
        # completes it): a job.json that large (~100 bytes an input file) goes up under a
        # name of its own first, and is copied into place whole.
        staged = f"{self.meta}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            retrying(lambda: put(self.fs, staged, data), f"writing {name}")
            retrying(lambda: self.fs.copy_file(staged, path), f"writing {name}")
        finally:
            with contextlib.suppress(OSError):
                self.fs.delete_file(staged)

    def read_entries(self) -> dict[str, dict[str, Any]]:
        """Every committed unit, from both layouts (appended lines, objects per batch)."""
        return {entry["unit"]: entry for entry in self._lines()}

    def _lines(self) -> Iterator[dict[str, Any]]:
        """The ledger's lines in commit order, a torn last line left out."""
        for blob in [self._read_file(), *self._read_objects()]:
            for line in blob.decode().splitlines():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line from a crash: that unit was not committed

    def _read_file(self) -> bytes:
        path = f"{self.meta}/{LEDGER_FILE}"
        return retrying(lambda: read(self.fs, path), f"reading {LEDGER_FILE}") or b""

    def _read_objects(self) -> list[bytes]:
        """The ledger objects in commit order (one paginated listing, then each object)."""
        selector = pafs.FileSelector(f"{self.meta}/{LEDGER_DIR}", allow_not_found=True)
        infos = retrying(lambda: self.fs.get_file_info(selector), "listing the ledger")
        names = sorted(i.base_name for i in infos if i.is_file and i.base_name.endswith(".jsonl"))
        self._objects_read = len(names)
        if names:
            self._seq = max(self._seq, int(names[-1].split("-", 1)[0]) + 1)
        return [self._read_object(name) for name in names]

    def _read_object(self, name: str) -> bytes:
        path = f"{self.meta}/{LEDGER_DIR}/{name}"
        return retrying(lambda: read(self.fs, path), f"reading ledger {name}") or b""

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        """Committed units by id."""
        return self._entries

    def commit(self, entries: Iterable[dict[str, Any]]) -> None:
        """Record units as committed (their parts are already in place)."""
        batch = list(entries)
        if not batch:
            return
        if self.lease is not None:
            self.lease.ensure()
        self._replace()
        blob = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in batch).encode()
        if self.objects:
            if is_local(self.fs):
                make_dir(self.fs, f"{self.meta}/{LEDGER_DIR}")
            name = f"{LEDGER_DIR}/{self._seq:08d}-{uuid.uuid4().hex[:8]}.jsonl"
            self._put(name, blob)  # whole or not at all; a retry rewrites the same object
            self._seq += 1
        else:
            append(self.fs, f"{self.meta}/{LEDGER_FILE}", blob)
        for entry in batch:
            self._entries[entry["unit"]] = entry

    def replace_file(self, old: str, new: str, size: int) -> None:
        """Name ``new`` (``size`` bytes, the same rows) where the committed units name
        ``old``, in new ledger lines that supersede theirs; then ``old`` goes. Stopped
        between, the unreplaced one is an orphan: the next run removes it."""
        replaced = []
        for entry in self._entries.values():
            files = entry.get("files") or []
            if old not in entry.get("parts", ()) and not any(f[0] == old for f in files):
                continue
            moved = [[new, f[1], size, *f[3:]] if f[0] == old else f for f in files]
            parts = [new if p == old else p for p in entry.get("parts", ())]
            updated = {**entry, "parts": parts}
            if "files" in entry:  # an older chute's line names its parts only: kept so
                updated["files"] = moved
            if "nulls" in entry:  # the new file is typed
                updated["nulls"] = [p for p in entry["nulls"] if p != old]
            replaced.append(updated)
        self.commit(replaced)
        self._guard()
        retrying(partial(self._delete, f"{self.root}/{old}"), f"removing {old}")

    def committed_parts(self) -> set[str]:
        return {p for e in self._entries.values() for p in e["parts"]}

    def remove_orphans(self) -> int:
        """Delete part files (and temporaries) that no committed unit names."""
        return self._remove_orphans(self._files())

    def reconcile(self) -> list[str]:
        """Verify the committed units against one listing of the location, then remove
        orphans; returns the ids of units that were forgotten.

        A unit is trusted only while every file its ledger line names exists with the
        recorded size. One that fails is forgotten (its remaining files become orphans)
        so that the run recomputes it; its line stays in the ledger until a new line for
        the same unit supersedes it, and a later resume forgets it again meanwhile.
        """
        sizes = self._files()
        broken = {u for u, e in self._entries.items() if not self._intact(e, sizes)}
        broken |= _unshared(self._entries, broken)
        for unit in broken:
            del self._entries[unit]
        self._remove_orphans(sizes)
        return sorted(broken)

    def _files(self) -> dict[str, int | None]:
        """Every file of the location's top level and errors folder, with its size; the
        top level's entries chute did not write are kept (:attr:`strangers`)."""
        top = self._list(self.root)
        self.strangers = _foreign([i.base_name for i in top], claimed=True)
        infos = top + self._list(f"{self.root}/{ERRORS_DIR}")
        return {i.path: i.size for i in infos if i.is_file}

    def _intact(self, entry: dict[str, Any], sizes: dict[str, int | None]) -> bool:
        for file in _files(entry):
            path = f"{self.root}/{file['path']}"
            if path not in sizes:
                return False
            if file["bytes"] is not None and sizes[path] != file["bytes"]:
                return False
        return True

    def _remove_orphans(self, sizes: dict[str, int | None]) -> int:
        keep = {f"{self.root}/{p}" for p in self.committed_parts()}
        keep.update(self._replacing or ())  # the earlier results: until the first commit
        orphans = [path for path in sizes if _is_part(path.rpartition("/")[2]) and path not in keep]
        if orphans:
            self._guard()
        for path in orphans:
            retrying(partial(self._delete, path), f"removing {path}")
        return len(orphans)

    def _list(self, path: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(path, allow_not_found=True)
        return retrying(lambda: self.fs.get_file_info(selector), f"listing {path}")

    def _delete(self, path: str) -> None:
        with writing(path), contextlib.suppress(FileNotFoundError):  # gone already (a
            self.fs.delete_file(path)  # retried delete); one refused: named, exit 2

    def finished(self) -> bool:
        """Whether the success marker is there: the last run finished the output and nothing
        (an interrupted ``--overwrite``) has begun to take it apart since."""
        path = f"{self.root}/{SUCCESS}"
        info = retrying(lambda: self.fs.get_file_info(path), f"reading {SUCCESS}")
        return bool(info.is_file)

    def unfinish(self) -> None:
        """Remove the success marker: the location is being written again."""
        retrying(lambda: self._delete(f"{self.root}/{SUCCESS}"), f"removing {SUCCESS}")

    def save_report(self, report: dict[str, Any], html: bool = True) -> None:
        """Write ``report.json`` and, with ``html``, the self-contained ``report.html``;
        not while ``--overwrite`` replaces the results and has committed nothing (a run that
        failed before its first commit leaves the earlier job's report with its results)."""
        if self._replacing is not None:
            return
        if self.lease is not None:  # a run that lost its claim (paused past its time)
            try:  # never writes over the report of the run that took the output over
                self.lease.check()
            except JobStateError:
                return
        self._write_json("report.json", report)
        if html:
            from chute.htmlreport import render

            self._put("report.html", render(report).encode())

    def finish(self, report: dict[str, Any], html: bool = True) -> None:
        """Write the report, the manifest and then the success marker (the caller has
        verified, with :meth:`reconcile`, that every file they name exists)."""
        self._guard()
        self._replace()  # a job over no rows replaces the earlier results all the same
        self.save_report(report, html)
        self._write_json(MANIFEST, self.manifest(report.get("fingerprint")))
        ledger = f"{self.meta}/{LEDGER_FILE}"
        if is_local(self.fs) and self.fs.get_file_info(ledger).is_file:
            synced(ledger)  # its lines on the disk before the marker (the parts are)
        retrying(lambda: put(self.fs, f"{self.root}/{SUCCESS}", b""), f"writing {SUCCESS}")

    def manifest(self, fingerprint: Any = None) -> dict[str, Any]:
        """Every file of the result, in unit order: what a downstream reader trusts."""
        entries = sorted(self._entries.values(), key=lambda e: (e.get("index", 0), e["unit"]))
        files = _merged(f for e in entries for f in _files(e))
        data = [f for f in files if not f["path"].startswith(f"{self.errors_dir}/")]
        return {
            "fingerprint": fingerprint,
            "units": len(entries),
            "rows": sum(f["rows"] or 0 for f in data),
            "bytes": sum(f["bytes"] or 0 for f in data),
            "files": data,
            "errors": [f for f in files if f["path"].startswith(f"{self.errors_dir}/")],
        }

    def report(self) -> dict[str, Any] | None:
        """The last run's report; none while ``--overwrite`` replaces the results, or
        where it was cut short (it is written again: the ledger is what counts)."""
        if self._replacing is not None:
            return None
        try:
            return self.read_json("report.json")
        except JobStateError:
            return None


def entry_files(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The files of a ledger entry (see :func:`_files`)."""
    return _files(entry)


def _files(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The files of a ledger entry with the unit's rows in each, the file's bytes (``None``
    in an old ledger's) and how many units the file holds."""
    if "files" in entry:
        return [
            {"path": f[0], "rows": f[1], "bytes": f[2], "units": f[3] if len(f) > 3 else 1}
            for f in entry["files"]
        ]
    return [{"path": p, "rows": None, "bytes": None, "units": 1} for p in entry["parts"]]


def _unshared(entries: dict[str, dict[str, Any]], broken: set[str]) -> set[str]:
    """Units that name a shared file whose other units are not all trusted (a torn commit,
    or one of them broken): they are forgotten too, until nothing changes."""
    holders: dict[str, list[str]] = {}
    declared: dict[str, int] = {}
    for unit, entry in entries.items():
        for f in _files(entry):
            if f["units"] > 1:
                holders.setdefault(f["path"], []).append(unit)
                declared[f["path"]] = f["units"]
    forgotten = set(broken)
    changed = True
    while changed:
        changed = False
        for path, units in holders.items():
            trusted = [u for u in units if u not in forgotten]
            if trusted and len(trusted) < declared[path]:
                forgotten.update(trusted)
                changed = True
    return forgotten - broken


def _merged(files: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each file once, in order, with the rows of all its units: what a manifest lists."""
    out: dict[str, dict[str, Any]] = {}
    for f in files:
        if f["path"] in out:
            seen = out[f["path"]]
            seen["rows"] = None if None in (seen["rows"], f["rows"]) else seen["rows"] + f["rows"]
        else:
            out[f["path"]] = {"path": f["path"], "rows": f["rows"], "bytes": f["bytes"]}
    return list(out.values())
