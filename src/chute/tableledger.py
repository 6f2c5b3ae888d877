"""The ledger of a table output: chute's side of the exactly-once protocol with a table.

A table holds the rows of many jobs (today's predictions, tomorrow's), so chute keeps one
folder per job inside the table's location, ``_chute/jobs/<job>/`` (``<job>`` is the
fingerprint's first 16 digits), beside the claim that one run at a time holds on the whole
table (``_chute/owners/``, :mod:`chute.lease`). The job's Parquet files go to
``data/chute-<job>/`` (Lance writes into its own ``data/``), quarantined rows to
``_chute/jobs/<job>/errors/``.

A commit batch is three steps, each one durable before the next starts:

1. the batch's units are written to the ledger **staged**: each line names the batch's
   token (``"batch": token``);
2. one table transaction adds the batch's data files; its metadata names the job, the
   token and the units (:func:`chute.tables.commit_meta`);
3. a line ``{"confirmed": token}`` is written to the ledger.

A unit is committed once its batch is confirmed. A resume that finds a staged batch
without its confirmation (the driver died between 1 and 3) looks for the token in the
table's history, then (where the history no longer shows it) for the batch's data files
in the table's current state: there, the batch is confirmed now; absent, its units are
forgotten and recomputed, and their files removed as orphans. A batch tried again within
a run (its confirmation failed, or an interrupt came after step 1) is looked for the
same way before anything is added. So every unit is in the table once, however the
driver dies or a step fails.

A run that opens the ledger also asks the table whether it still holds the confirmed batches
(:meth:`TableLedger._forget_lost`): a table dropped, made again (or overwritten whole), or
rolled back to before some of them has lost their rows, and their units are computed again.
Their old files are kept (``retired.json`` names them): the snapshots a rollback went back
from still name them, and a roll forward to one must find them; the table's own upkeep
(expiring snapshots, vacuum) removes them once nothing names them. Where the table's history
is cut short (expired, cleaned up) and its files rewritten by a compaction, nothing tells,
and the ledger is trusted (a table's history can be expired; chute's ledger is not).

chute never deletes a row from a table: ``--overwrite`` cannot redo a job that committed
rows, and a table's committed units are trusted without a listing of chute's files (the
table owns those files; compaction may have rewritten them).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from chute.errors import JobStateError, ModelError
from chute.job import describe_changes
from chute.lease import Lease
from chute.ledger import LEDGER_DIR, LEDGER_FILE, MANIFEST, Ledger
from chute.retry import retrying
from chute.sinks import output_filesystem
from chute.stages import holds_null
from chute.storage import META_DIR, SUCCESS, append, check, is_local, make_dir
from chute.tables import (
    DATA_DIR,
    JOBS_DIR,
    DataFile,
    Table,
    TableSink,
    check_schema,
    check_storable,
    commit_meta,
    job_folder,
    schema_from,
)

TABLE_BATCH_MAX_SECONDS = 60.0
"""The longest a completed unit waits for its table commit, on a long run."""
log = logging.getLogger("chute")
ABANDONED = "abandoned"
"""In a job's folder: a later run was told (``--overwrite``) to leave this job unfinished."""
RETIRED = "retired.json"
"""The data files of committed units the table no longer holds (:meth:`TableLedger.
_forget_lost`): kept, never swept as orphans, since older snapshots may name them."""


class TableLedger(Ledger):
    """Committed units of one job on one table; every batch a table transaction."""

    def __init__(self, fs: pafs.FileSystem, root: str, objects: bool | None = None) -> None:
        super().__init__(fs, root, objects)
        self.sink: TableSink | None = None
        self.table: Table | None = None
        self.job = ""
        self._landed: set[str] = set()
        """Tokens of the batches this run added to the table."""
        self._confirmed: set[str] = set()
        self._schema: pa.Schema | None = None
        self._checked: set[str] = set()
        self._broken: str | None = None

    @classmethod
    def open_table(
        cls,
        sink: TableSink,
        table: Table,
        fingerprint: str,
        description: dict[str, Any],
        overwrite: bool,
        units_total: int | None = None,
        lease: Lease | None = None,
    ) -> TableLedger:
        """Open (or start) this job's ledger on the table; resolve a batch a killed run
        left staged; refuse to leave another job of the table unfinished unless told to."""
        check(sink.path, sink.storage, "output")
        fs, root = output_filesystem(sink.path, sink.storage)
        ledger = cls(fs, root)
        ledger.sink, ledger.table, ledger.job = sink, table, fingerprint[:16]
        ledger.meta = f"{root}/{job_folder(ledger.job)}"
        ledger.batch_seconds = sink.commit_seconds
        ledger.errors_dir = sink.errors_dir
        ledger.lease = lease
        ledger._schema = table.schema()
        ledger._refuse_redo(overwrite)
        ledger._refuse_again(description, overwrite)
        ledger._settle_others(description, overwrite)
        ledger._claim(fingerprint, description, False, units_total)
        ledger._entries = ledger.read_entries()
        if not ledger.objects:
            ledger._mend_last_line()
        ledger._resolve()
        ledger._forget_lost()
        return ledger

    # ------------------------------------------------------------------ opening

    _start_over = (
        "The rows this job committed are in the table: to run it again, delete them with the "
        "table's own tools, and this job's folder, or write to another table."
    )

    def _refuse_redo(self, overwrite: bool) -> None:
        """``--overwrite`` of a job whose rows are in the table: refused. Units of a batch a
        killed run left staged count only where the table took that batch (a run killed
        before its first table commit left no row of the job there)."""
        if not overwrite or self.owner(overwrite) is None:
            return
        entries = list(self.read_entries().values())
        staged = [e for e in entries if self._staged(e)]
        if not entries or (
            len(staged) == len(entries) and not self._in_table({str(e["batch"]) for e in staged})
        ):
            return
        raise JobStateError(
            f"{self._name()} already holds rows of this job, and chute never deletes rows "
            "from a table: --overwrite cannot redo it. Run without --overwrite to finish "
            "the job, or delete its rows with the table's own tools and its folder "
            f"{self.meta!r}, or write to another table."
        )

    def _refuse_again(self, description: dict[str, Any], overwrite: bool) -> None:
        """Another job of this table, finished (or left), already added rows of this job's
        input: a rerun after any change (a metric, a comment in the model's file, the input
        files touched) would add every row again. Refused unless ``overwrite`` says to.

        A resume is not checked, unless this job was left unfinished by a later run told
        ``--overwrite``: that run's job has added rows of the input since, and finishing
        this one would add them again (it did: 8,000 rows of 4,000 ids, exit 0)."""
        if overwrite:
            return
        if self.owner() is not None:  # a resume
            if self.abandoned():
                self._refuse_abandoned(description)
            return
        for _, owner in self._others(finished=True):
            before = owner.get("job", {})
            shared = _same_input(before.get("source"), description.get("source"))
            if shared:
                changed = describe_changes(before, description)
                raise JobStateError(
                    f"{self._name()} already holds the rows of another chute job over the same "
                    f"input ({shared}; changed since: {changed}): this run would add them again. "
                    "Pass --overwrite to add them again all the same (the earlier rows stay: "
                    "chute never deletes rows from a table; delete them with the table's own "
                    "tools first to replace them), or write to another table."
                )

    def _refuse_abandoned(self, description: dict[str, Any]) -> None:
        """This job, left unfinished by a later ``--overwrite``, resumed over a table where
        another job has added rows of the same input since: refused."""
        for _, owner in self._others(finished=True):
            before = owner.get("job", {})
            shared = _same_input(before.get("source"), description.get("source"))
            if shared:
                raise JobStateError(
                    f"this job was left unfinished on {self._name()} by a later run told "
                    f"--overwrite, and the table holds the rows of another chute job over the "
                    f"same input since ({shared}; changed from this job: "
                    f"{describe_changes(description, before)}): finishing this job would add "
                    "them again. The rows this job committed stay in the table. Leave it "
                    "unfinished, or delete that job's rows with the table's own tools and its "
                    "folder in _chute/jobs/ before finishing this one, or write to another table."
                )

    def _settle_others(self, description: dict[str, Any], overwrite: bool) -> None:
        """Another job of this table left unfinished: refused (rows of two jobs would mix
        in silence), or abandoned with ``overwrite`` (its committed rows stay)."""
        for folder, owner in self._unfinished_others():
            before = owner.get("job", {})
            shared = _same_input(before.get("source"), description.get("source"))
            if not overwrite:
                twice = (
                    f" It read this job's input ({shared}): with --overwrite the rows it "
                    "committed would be in the table a second time (chute never deletes rows "
                    "from a table; delete them with the table's own tools first to replace them)."
                    if shared
                    else ""
                )
                raise JobStateError(
                    f"{self._name()} holds an unfinished chute job (changed: "
                    f"{describe_changes(before, description)}); this run would mix its rows with "
                    "that job's. Run that job again to finish it, or pass --overwrite to leave it "
                    f"unfinished (the rows it committed stay in the table).{twice}"
                )
            if shared:
                log.warning(
                    "%s holds rows an unfinished job committed from this job's input (%s); "
                    "told --overwrite, this run leaves them and adds its own: those rows are in "
                    "the table twice",
                    self._name(),
                    shared,
                )
            self._guard()
            self._write(f"{folder}/{ABANDONED}", b"")

    def _unfinished_others(self) -> list[tuple[str, dict[str, Any]]]:
        return self._others(finished=False)

    def _others(self, finished: bool) -> list[tuple[str, dict[str, Any]]]:
        """Other jobs of this table that committed something: unfinished ones, or (with
        ``finished``) those finished or left unfinished by a later run."""
        found = []
        for info in self._list(f"{self.root}/{META_DIR}/{JOBS_DIR}"):
            folder = info.path
            if folder == self.meta or info.type != pafs.FileType.Directory:
                continue
            names = {i.base_name for i in self._list(folder)}
            ended = bool(names & {SUCCESS, ABANDONED})
            if "job.json" in names and ended == finished:
                if not self._committed_in(folder):  # nothing of it in the table: no mix
                    continue
                try:
                    owner = json.loads(self._read(f"{folder}/job.json") or b"{}")
                except (json.JSONDecodeError, UnicodeDecodeError):
                    owner = {}  # cut short: a job all the same, of unknown settings
                found.append((folder, owner if isinstance(owner, dict) else {}))
        return found

    def _committed_in(self, folder: str) -> bool:
        """Whether the job of ``folder`` wrote anything to its ledger (a unit staged for
        the table, or committed)."""
        infos = {i.base_name: i for i in self._list(folder)}
        ledger = infos.get(LEDGER_FILE)
        if ledger is not None and (ledger.size or 0) > 0:
            return True
        return bool(self._list(f"{folder}/{LEDGER_DIR}"))

    def read_entries(self) -> dict[str, dict[str, Any]]:
        """Every unit the ledger names (staged ones too); the confirmed tokens aside."""
        entries: dict[str, dict[str, Any]] = {}
        for entry in self._lines():
            if "confirmed" in entry:
                self._confirmed.add(entry["confirmed"])
            else:
                entries[entry["unit"]] = entry
        return entries

    def _resolve(self) -> None:
        """Staged batches without a confirmation: confirmed if the table's history holds
        them, forgotten (so recomputed) if not."""
        staged = {e["batch"] for e in self._entries.values() if self._staged(e)}
        if not staged:
            return
        held = self._in_table(staged)
        if held:
            self._confirm(sorted(held))
        for unit, entry in list(self._entries.items()):
            if entry.get("batch") in staged - held:
                del self._entries[unit]

    def _in_table(self, tokens: set[str]) -> set[str]:
        """The batches among ``tokens`` that the table took: by its history, or failing
        that by their files (:meth:`_found_in_table`)."""
        assert self.table is not None
        held = set(self.table.lineage(tokens).held)
        return held | self._found_in_table(tokens - held)

    def _found_in_table(self, tokens: set[str]) -> set[str]:
        """Batches whose commit the table's history no longer shows (expired, or older than
        what is read of it) but whose data files the table holds: they landed. Without
        this their units would be computed again, their rows added twice, and their files,
        which the table names, removed as orphans."""
        if not tokens:
            return set()
        files: dict[str, set[str]] = {t: set() for t in tokens}
        for entry in self._entries.values():
            if entry.get("batch") in files:
                paths = (f[0] for f in entry.get("files", []))
                files[entry["batch"]].update(p for p in paths if p.startswith(f"{DATA_DIR}/"))
        assert self.table is not None
        present = self.table.holds(set().union(*files.values()))
        return {t for t, paths in files.items() if paths & present}

    def _forget_lost(self) -> None:
        """Forget the units whose confirmed batch the table no longer holds, so they are
        computed again: the table dropped (or its files removed), dropped and made again,
        overwritten whole by its own writer, or rolled back (restored) to a version before
        the batch. Trusted, these units made a resume lose their rows, and a finished job
        run again say "nothing to do" over a table without them.

        A batch is held where a commit the table's current version descends from names it,
        or failing that where the table names its files. Where neither shows it and the
        history was read back to the table's first commit (or to a commit that replaced or
        emptied the whole table), it is not in the table; where the history is cut short
        (snapshots expired, the log cleaned up: routine upkeep, with compaction rewriting
        the files), nothing tells, and the batch is trusted."""
        assert self.table is not None
        tokens = {e["batch"] for e in self._entries.values() if "batch" in e}
        if not tokens:
            return
        if self._schema is None:  # no table at all: every batch is gone
            lost = tokens
        else:
            lineage = self.table.lineage(tokens)
            lost = tokens - lineage.held
            lost -= self._found_in_table(lost)
            if lost and not lineage.whole:
                log.info(
                    "%d batch(es) of this job are neither in what %s's history still shows "
                    "nor in its files (expired, compacted): trusted as committed",
                    len(lost),
                    self._name(),
                )
                return
        gone = [unit for unit, e in self._entries.items() if e.get("batch") in lost]
        if gone:
            log.warning(
                "%s no longer holds %d unit(s) this job committed to it (it was dropped, made "
                "again, overwritten whole, or rolled back to a version before them): they are "
                "computed again",
                self._name(),
                len(gone),
            )
        files = {f[0] for unit in gone for f in self._entries[unit].get("files", [])}
        files = {p for p in files if p.startswith(f"{DATA_DIR}/")}  # not its errors parts
        if files - (retired := self._retired()):
            self._write_json(RETIRED, sorted(retired | files))
        for unit in gone:
            del self._entries[unit]

    def _retired(self) -> set[str]:
        """The files :data:`RETIRED` names (relative to the table's location)."""
        data = self._read(f"{self.meta}/{RETIRED}")
        return set(json.loads(data)) if data else set()

    def _remove_orphans(self, sizes: dict[str, int | None]) -> int:
        kept = {f"{self.root}/{path}" for path in self._retired()}
        return super()._remove_orphans({p: n for p, n in sizes.items() if p not in kept})

    def _staged(self, entry: dict[str, Any]) -> bool:
        return "batch" in entry and entry["batch"] not in self._confirmed

    # ------------------------------------------------------------------ committing

    def flush_due(self, waited: float, elapsed: float) -> bool:
        """Commit once the last commit is ``commit_seconds`` or 2% of the run's time so
        far old (``waited``), whichever is longer, at most a minute: about T/5 commits in
        a run of T ≤ 250 s, 50 + 50·ln(T/250) up to 50 minutes, then one a minute."""
        wait = min(TABLE_BATCH_MAX_SECONDS, max(self.batch_seconds, 0.02 * elapsed))
        return waited >= wait

    def commit(self, entries: Iterable[dict[str, Any]]) -> None:
        """Stage the units, add their files to the table in one transaction, confirm."""
        batch = list(entries)
        if not batch:
            return
        if self._broken is not None:
            raise JobStateError(self._broken)
        batch = self._not_landed(batch)
        if not batch:
            return
        schema = self._check(batch)
        token = uuid.uuid4().hex
        staged = [{**_without_table(e), "batch": token} for e in batch]
        files = [f for e in batch for f in self._data_files(e)]
        super().commit(staged)
        if files:
            self._add(files, schema, token, [e["index"] for e in batch])
        self._confirm([token])

    @property
    def commits(self) -> int:
        """Table transactions this run made."""
        return len(self._landed)

    def _not_landed(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The units of ``batch`` still to add. A batch is tried again when an earlier try
        failed after staging it (its confirmation failed, an interrupt, the table's schema
        unreadable): where that try's transaction is in the table, it is confirmed now,
        never added a second time."""
        tried = {
            entry["batch"]
            for e in batch
            if (entry := self._entries.get(e["unit"])) is not None and self._staged(entry)
        }
        if not tried:
            return batch
        held = self._in_table(tried)
        if held:
            self._confirm(sorted(held))
            self._landed |= held
        return [e for e in batch if self._entries.get(e["unit"], {}).get("batch") not in held]

    def _add(
        self, files: list[DataFile], schema: pa.Schema | None, token: str, units: list[int]
    ) -> None:
        assert self.table is not None and schema is not None
        try:
            self.table.commit(files, schema, commit_meta(self.job, token, units))
        except Exception as exc:
            self._after_failure(token, units, exc)
            raise
        self._landed.add(token)
        if self._schema is None:
            self._schema = self.table.schema()

    def _after_failure(self, token: str, units: list[int], exc: Exception) -> None:
        """A failed table commit: its units are not committed, unless it landed after all
        (a lost answer) — then this run cannot go on, and a resume confirms the batch."""
        assert self.table is not None
        try:
            landed = token in self.table.lineage({token}).held
        except Exception:
            landed = True  # unknown: stop, and let the resume look again
        if landed:
            self._broken = (
                f"a commit to {self._name()} failed ({exc}), and whether it landed is not known; "
                "this run stops. Run the job again: it reads the table's history to learn."
            )
            raise JobStateError(self._broken) from exc
        for entry in list(self._entries.values()):
            if entry.get("batch") == token:
                del self._entries[entry["unit"]]

    def _confirm(self, tokens: list[str]) -> None:
        blob = "".join(json.dumps({"confirmed": t}) + "\n" for t in tokens).encode()
        if self.objects:
            if is_local(self.fs):
                make_dir(self.fs, f"{self.meta}/{LEDGER_DIR}")
            self._put(f"{LEDGER_DIR}/{self._seq:08d}-{uuid.uuid4().hex[:8]}.jsonl", blob)
            self._seq += 1
        else:
            append(self.fs, f"{self.meta}/{LEDGER_FILE}", blob)
        self._confirmed.update(tokens)

    def _check(self, batch: list[dict[str, Any]]) -> pa.Schema | None:
        """Every part's columns against the table's (before anything of the batch is
        written); the schema of the batch."""
        assert self.sink is not None
        schema = self._schema
        for text in {i["schema"] for e in batch for i in e.get("table", [])}:
            written = schema_from(text)
            if (void := [f for f in written if holds_null(f.type)]) != []:
                # a table column needs a type: created from these rows it would be "void"
                # (Delta, Lance), or list<null>, and no later rows with values could go in
                what = (
                    "null in every row"
                    if pa.types.is_null(void[0].type)
                    else f"{void[0].type}: only nulls or empty lists in every row"
                )
                raise ModelError(
                    f"column {void[0].name!r} is {what} of a part written for "
                    f"{self._name()}, so it has no type a table column could take. Return "
                    "typed nulls from the model (pa.nulls(n, pa.float64()), or a float "
                    "array of NaN), or values, and typed lists (pa.array(rows, "
                    "pa.list_(pa.float64()))); a carried input column null in every row: cast "
                    "it in a preprocess step, or leave it out of the carryover."
                )
            if schema is None:
                schema = written
            if text not in self._checked:
                assert self.table is not None
                check_storable(self.table, written, self._name())  # a model's output types
                check_schema(schema, written, self._name(), ordered=self.sink.format == "lance")
                self._checked.add(text)
        return schema

    def _data_files(self, entry: dict[str, Any]) -> list[DataFile]:
        assert self.sink is not None
        infos = entry.get("table", [])
        if self.sink.format == "lance":
            return [
                DataFile(f"data/{fr['files'][0]['path']}", fr["physical_rows"], 0, fr)
                for info in infos
                for fr in info.get("fragments", [])
            ]
        split = [f for info in infos for f in info.get("files", [])]
        if split:  # parts written one file per partition value
            return [DataFile(p, r, b, partition=values) for p, r, b, values in split]
        folder = f"{self.sink.job_dir}/"
        return [DataFile(p, r, b) for p, r, b in entry.get("files", []) if p.startswith(folder)]

    # ------------------------------------------------------------------ verifying, finishing

    def reconcile(self) -> list[str]:
        """Remove this job's orphan files; committed units are the table's (never redone)."""
        self._remove_orphans(self._files())
        return []

    def _files(self) -> dict[str, int | None]:
        assert self.sink is not None
        folders = [self.sink.errors_dir]
        if self.sink.format != "lance":  # Lance's data/ is shared: its orphans are Lance's
            folders.append(self.sink.job_dir)
        infos = [i for f in folders for i in self._list(f"{self.root}/{f}")]
        return {i.path: i.size for i in infos if i.is_file}

    def _foreign(self, claimed: bool) -> list[str]:
        return []  # a table's location holds its own files: chute's are in their folders

    def _wipe(self) -> None:
        """Start this job afresh (it committed nothing): its ledger and orphan files go."""
        self._guard()
        for info in self._list(self.meta):
            if info.base_name not in ("job.json", RETIRED):
                retrying(partial(self._remove, info), f"removing {info.path}")
        self._entries = {}
        self._remove_orphans(self._files())

    def finished(self) -> bool:
        """Whether this job's success marker (in its folder) is there."""
        return self._exists(SUCCESS)

    def abandoned(self) -> bool:
        """Whether a later run was told (``--overwrite``) to leave this job unfinished."""
        return self._exists(ABANDONED)

    def committed(self) -> tuple[dict[str, dict[str, Any]], int]:
        """Read-only (``chute status``): the units whose batch is confirmed, and how many
        wait in a batch a killed run left staged (the next run asks the table for it)."""
        entries = self.read_entries()
        staged = [u for u, e in entries.items() if self._staged(e)]
        for unit in staged:
            del entries[unit]
        return entries, len(staged)

    def _exists(self, name: str) -> bool:
        path = f"{self.meta}/{name}"
        return bool(retrying(lambda: self.fs.get_file_info(path), f"reading {name}").is_file)

    def unfinish(self) -> None:
        retrying(lambda: self._delete(f"{self.meta}/{SUCCESS}"), f"removing {SUCCESS}")

    def finish(self, report: dict[str, Any], html: bool = True) -> None:
        """End the run on the table (a vector index is built now), then write the report,
        the manifest and the job's success marker."""
        assert self.table is not None
        self._guard()
        report = {**report, "table": {**self.table.finish(), "commits": self.commits}}
        self.save_report(report, html)
        self._write_json(MANIFEST, self.manifest(report.get("fingerprint")))
        self._put(SUCCESS, b"")

    def _name(self) -> str:
        assert self.sink is not None
        return self.sink.name

    def _read(self, path: str) -> bytes | None:
        from chute.storage import read

        return retrying(lambda: read(self.fs, path), f"reading {path}")

    def _write(self, path: str, data: bytes) -> None:
        from chute.storage import put

        retrying(lambda: put(self.fs, path, data), f"writing {path}")


def _without_table(entry: dict[str, Any]) -> dict[str, Any]:
    """A unit's ledger line: without the parts' table infos, and naming every data file of
    a part split by partition value (the record names only its first)."""
    line = {k: v for k, v in entry.items() if k != "table"}
    split = [f for info in entry.get("table", []) for f in info.get("files", [])]
    if split:
        errors = [f for f in entry.get("files", []) if not f[0].startswith(f"{DATA_DIR}/")]
        line["files"] = [[p, r, b] for p, r, b, _ in split] + errors
        line["parts"] = [f[0] for f in line["files"]]
    return line


def table_jobs(fs: pafs.FileSystem, root: str) -> list[TableLedger]:
    """The ledgers of the jobs a table's location holds (``chute status``, ``chute report``),
    the most recently started first; each is read, never claimed or written."""
    jobs = f"{root}/{META_DIR}/{JOBS_DIR}"
    selector = pafs.FileSelector(jobs, recursive=False, allow_not_found=True)
    started: list[tuple[float, TableLedger]] = []
    for info in fs.get_file_info(selector):
        owner = fs.get_file_info(f"{info.path}/job.json")
        if owner.is_file:  # a folder (or, on S3, a prefix) with a job in it
            ledger = TableLedger(fs, root)
            ledger.meta, ledger.job = info.path, info.base_name
            ledger.errors_dir = f"{job_folder(info.base_name)}/errors"
            started.append((owner.mtime.timestamp() if owner.mtime else 0.0, ledger))
    started.sort(key=lambda pair: pair[0], reverse=True)
    return [ledger for _, ledger in started]


def _same_input(before: Any, after: Any) -> str:
    """What two jobs' inputs (their descriptions' ``source``) share: the files both read
    (whatever their sizes and times now), or the whole input where it is not files; ""
    if nothing."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return ""
    if before.get("kind") == after.get("kind") == "files":
        paths = {str(f[0]) for f in before.get("files", [])}
        both = [str(f[0]) for f in after.get("files", []) if str(f[0]) in paths]
        if not both:
            return ""
        more = f" and {len(both) - 1} more file(s)" if len(both) > 1 else ""
        return f"{both[0]}{more}"
    return "the same input data" if before == after else ""
