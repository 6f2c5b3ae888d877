"""The ledger: what an output location holds, kept in ``<output>/_chute/``.

* ``job.json`` — the fingerprint and description of the job that owns the location;
* ``ledger.jsonl`` — one line per committed unit: its id, rows and part files. A unit is
  committed when its parts account for all of its rows; a line is appended (and flushed)
  only after those parts were renamed into place, so a crash at any moment leaves a
  ledger that names only complete units. A torn last line is ignored;
* ``report.json`` at the end, and the success marker ``<output>/_SUCCESS``.

Everything chute keeps starts with ``_`` so that Arrow, pandas and Spark readers of the
output directory skip it.

A downstream reader trusts exactly the part files named in the ledger (or, once
``_SUCCESS`` exists, every ``part-*`` file: orphans are removed before it is written).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import pyarrow.fs as pafs

from chute.errors import JobStateError
from chute.sinks import ERRORS_DIR, output_filesystem

META_DIR = "_chute"
SUCCESS = "_SUCCESS"


class Ledger:
    """Committed units of one output location."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs = fs
        self.root = root
        self.meta = f"{root}/{META_DIR}"
        self._entries: dict[str, dict[str, Any]] = {}

    @classmethod
    def open(
        cls,
        path: str,
        fingerprint: str,
        description: dict[str, Any],
        overwrite: bool,
        units_total: int | None = None,
    ) -> Ledger:
        """Open (or create) the ledger, refusing a location that holds another job."""
        fs, root = output_filesystem(path)
        ledger = cls(fs, root)
        ledger._claim(fingerprint, description, overwrite, units_total)
        ledger._entries = ledger.read_entries()
        ledger._mend_last_line()
        return ledger

    def _mend_last_line(self) -> None:
        """End the ledger with a newline, so that the next commit starts a line of its own.

        A crash in the middle of an append leaves a torn last line: cut it off (that unit
        was not committed). Appended to as it was, the torn line would swallow the next
        unit's line and lose that commit too. A last line that is whole but lacks only its
        newline was read as committed: keep it.
        """
        path = f"{self.meta}/ledger.jsonl"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return
        with self.fs.open_input_stream(path) as f:
            data = f.read()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
            mended = data + b"\n"
        except json.JSONDecodeError:
            mended = data[:cut]
        tmp = f"{self.meta}/.ledger.jsonl.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(mended)
        self.fs.move(tmp, path)

    def _claim(
        self,
        fingerprint: str,
        description: dict[str, Any],
        overwrite: bool,
        units_total: int | None,
    ) -> None:
        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.File:
            raise JobStateError(f"output {self.root!r} is a file; give a directory.")
        if info.type == pafs.FileType.Directory:
            owner = self.read_json("job.json")
            if overwrite or (owner is not None and not self.read_entries()):
                # asked to, or the earlier job committed nothing: there is nothing to mix
                self.fs.delete_dir_contents(self.root)
            elif owner is None and self._foreign_files():
                raise JobStateError(
                    f"output {self.root!r} holds files that chute did not write. Choose an "
                    "empty or new directory, or pass --overwrite to replace its contents."
                )
            elif owner is not None and owner.get("fingerprint") != fingerprint:
                changed = _changes(owner.get("job", {}), description)
                raise JobStateError(
                    f"output {self.root!r} holds the results of a different job "
                    f"(changed: {changed}). Resuming would mix two jobs' outputs. Use another "
                    "output location, or pass --overwrite to discard the earlier results."
                )
            elif owner is not None:
                return
        self.fs.create_dir(self.meta, recursive=True)
        self._write_json(
            "job.json",
            {
                "fingerprint": fingerprint,
                "job": description,
                "units_total": units_total,
                "created": time.time(),
            },
        )

    def _foreign_files(self) -> bool:
        infos = self.fs.get_file_info(pafs.FileSelector(self.root))
        return any(i.base_name not in (META_DIR, SUCCESS) for i in infos)

    def read_json(self, name: str) -> dict[str, Any] | None:
        path = f"{self.meta}/{name}"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read())  # type: ignore[no-any-return]

    def _write_json(self, name: str, value: Any) -> None:
        tmp, final = f"{self.meta}/.{name}.tmp", f"{self.meta}/{name}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(json.dumps(value, indent=2, default=str).encode())
        self.fs.move(tmp, final)

    def read_entries(self) -> dict[str, dict[str, Any]]:
        path = f"{self.meta}/ledger.jsonl"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return {}
        with self.fs.open_input_stream(path) as f:
            text = f.read().decode()
        entries: dict[str, dict[str, Any]] = {}
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a crash: that unit was not committed
            entries[entry["unit"]] = entry
        return entries

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        """Committed units by id."""
        return self._entries

    def commit(self, entries: Iterable[dict[str, Any]]) -> None:
        """Record units as committed (their parts are already in place)."""
        batch = list(entries)
        if not batch:
            return
        blob = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in batch).encode()
        with self.fs.open_append_stream(f"{self.meta}/ledger.jsonl") as f:
            f.write(blob)
        for entry in batch:
            self._entries[entry["unit"]] = entry

    def committed_parts(self) -> set[str]:
        return {p for e in self._entries.values() for p in e["parts"]}

    def remove_orphans(self) -> int:
        """Delete part files (and temporaries) that no committed unit names."""
        keep = {f"{self.root}/{p}" for p in self.committed_parts()}
        infos = self.fs.get_file_info(pafs.FileSelector(self.root))
        errors = f"{self.root}/{ERRORS_DIR}"
        if self.fs.get_file_info(errors).type == pafs.FileType.Directory:
            infos += self.fs.get_file_info(pafs.FileSelector(errors))
        orphans = [
            i.path
            for i in infos
            if i.is_file and i.base_name.startswith(("part-", ".part-")) and i.path not in keep
        ]
        for path in orphans:
            self.fs.delete_file(path)
        return len(orphans)

    def unfinish(self) -> None:
        """Remove the success marker: the location is being written again."""
        path = f"{self.root}/{SUCCESS}"
        if self.fs.get_file_info(path).type == pafs.FileType.File:
            self.fs.delete_file(path)

    def save_report(self, report: dict[str, Any], html: bool = True) -> None:
        """Write ``report.json`` and, with ``html``, the self-contained ``report.html``."""
        self._write_json("report.json", report)
        if html:
            from chute.htmlreport import render

            with self.fs.open_output_stream(f"{self.meta}/report.html") as f:
                f.write(render(report).encode())

    def finish(self, report: dict[str, Any], html: bool = True) -> None:
        """Write the report and the success marker."""
        self.save_report(report, html)
        with self.fs.open_output_stream(f"{self.root}/{SUCCESS}") as f:
            f.write(b"")

    def report(self) -> dict[str, Any] | None:
        return self.read_json("report.json")


def _changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return ", ".join(keys) or "the job description"
