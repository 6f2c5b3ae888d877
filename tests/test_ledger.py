"""The ledger: who owns an output location, which units are committed, what is an orphan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chute import JobStateError
from chute.ledger import META_DIR, SUCCESS, Ledger

DESCRIPTION: dict[str, Any] = {
    "source": {"kind": "files", "files": ["a.parquet"]},
    "models": [{"name": "tip"}],
    "carryover": ["trip_id"],
    "preprocess": None,
    "format": "parquet",
}


def _open(out: Path, fingerprint: str = "fp1", overwrite: bool = False, **changes: Any) -> Ledger:
    description = {**DESCRIPTION, **changes}
    return Ledger.open(str(out), fingerprint, description, overwrite)


def _entry(unit: str, *parts: str, rows: int = 10) -> dict[str, Any]:
    return {"unit": unit, "index": 0, "rows": rows, "parts": list(parts)}


def _touch(path: Path, text: str = "x") -> Path:
    path.write_text(text)
    return path


def test_open_new_directory_claims_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ledger = _open(out)
    assert ledger.entries == {}
    job = json.loads((out / META_DIR / "job.json").read_text())
    assert job["fingerprint"] == "fp1"
    assert job["job"] == DESCRIPTION
    assert sorted(p.name for p in out.iterdir()) == [META_DIR]
    assert [p.name for p in (out / META_DIR).iterdir()] == ["job.json"]  # no temporaries


def test_open_empty_existing_directory(tmp_path: Path) -> None:
    assert _open(tmp_path).entries == {}
    assert (tmp_path / META_DIR / "job.json").is_file()


def test_same_fingerprint_resumes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _open(out)
    _touch(out / "part-000000-0000000000-aaaaaaa1.parquet")
    first.commit([_entry("u1", "part-000000-0000000000-aaaaaaa1.parquet")])
    created = json.loads((out / META_DIR / "job.json").read_text())["created"]
    again = _open(out)
    assert again.entries == {"u1": _entry("u1", "part-000000-0000000000-aaaaaaa1.parquet")}
    assert json.loads((out / META_DIR / "job.json").read_text())["created"] == created
    assert (out / "part-000000-0000000000-aaaaaaa1.parquet").exists()


def _with_a_commit(ledger: Ledger) -> Ledger:
    ledger.commit([{"unit": "u0", "index": 0, "rows": 1, "parts": []}])
    return ledger


def test_different_fingerprint_is_refused_naming_the_change(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _with_a_commit(_open(out))
    with pytest.raises(JobStateError) as info:
        _open(out, "fp2", models=[{"name": "tip"}, {"name": "fare"}], carryover=[])
    text = str(info.value)
    assert "a different job (changed: carryover, models (1 added: fare))" in text
    assert "--overwrite" in text


def test_different_fingerprint_same_description_still_refused(tmp_path: Path) -> None:
    _with_a_commit(_open(tmp_path))
    with pytest.raises(JobStateError, match=r"changed: the job description"):
        _open(tmp_path, "fp2")


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    _touch(tmp_path / "notes.txt")
    with pytest.raises(JobStateError, match="holds files that chute did not write") as info:
        _open(tmp_path)
    assert "--overwrite" in str(info.value)
    assert not (tmp_path / META_DIR).exists()


def test_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = _touch(tmp_path / "out")
    with pytest.raises(JobStateError, match="is a file; give a directory"):
        _open(path)
    with pytest.raises(JobStateError):
        _open(path, overwrite=True)


def test_overwrite_replaces_another_jobs_results_at_the_first_commit(tmp_path: Path) -> None:
    out = tmp_path / "out"
    old = _open(out)
    _touch(out / "part-000000-0000000000-aaaaaaa1.parquet")
    (out / "_errors").mkdir()
    _touch(out / "_errors" / "part-000000-0000000000-aaaaaaa2.parquet")
    old.commit([_entry("u1", "part-000000-0000000000-aaaaaaa1.parquet")])
    old.finish({"rows_out": 10})

    ledger = _open(out, "fp2", overwrite=True)
    assert ledger.entries == {} and ledger.report() is None and not ledger.finished()
    assert (out / "part-000000-0000000000-aaaaaaa1.parquet").exists()  # not yet: the run
    assert json.loads((out / META_DIR / "job.json").read_text())["fingerprint"] == "fp1"
    assert _open(out).entries.keys() == {"u1"}  # stopped here, the earlier job resumes whole

    ledger = _open(out, "fp2", overwrite=True)
    assert ledger.reconcile() == [] and ledger.remove_orphans() == 0  # not orphans: kept
    assert (out / "part-000000-0000000000-aaaaaaa1.parquet").exists()
    _touch(out / "part-000001-0000000000-bbbbbbb1.parquet")  # this run's, written since
    ledger.commit([_entry("v1", "part-000001-0000000000-bbbbbbb1.parquet")])
    assert sorted(p.name for p in out.iterdir()) == [
        "_chute",
        "_errors",
        "part-000001-0000000000-bbbbbbb1.parquet",
    ]
    assert list((out / "_errors").iterdir()) == []
    assert json.loads((out / META_DIR / "job.json").read_text())["fingerprint"] == "fp2"
    assert _open(out, "fp2").entries.keys() == {"v1"}


def test_overwrite_of_a_job_over_no_rows_replaces_the_results_as_it_finishes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    old = _open(out)
    _touch(out / "part-000000-0000000000-aaaaaaa1.parquet")
    old.commit([_entry("u1", "part-000000-0000000000-aaaaaaa1.parquet")])
    _open(out, "fp2", overwrite=True).finish({"rows_out": 0})
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "_chute"]
    assert _open(out, "fp2").entries == {}


def test_overwrite_wipes_what_chute_wrote_and_refuses_what_it_did_not(tmp_path: Path) -> None:
    """--overwrite emptied the folder whole: a job whose output held its input (or the
    user's notes) deleted them. Only chute's own names go; another tool's part files, or
    a _SUCCESS in a folder chute never claimed, are the user's."""
    _open(tmp_path)  # claimed: _chute/job.json
    part = "part-000001-0000000000-abcdef12.parquet"
    for name in (part, f".{part}.0badcafe.tmp", "_SUCCESS", ".DS_Store"):
        _touch(tmp_path / name)
    (tmp_path / "_errors").mkdir()
    _touch(tmp_path / "_errors" / "part-000000-0000000000-cdcdcdcd.parquet")
    _open(tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".DS_Store", META_DIR]  # hidden: kept
    for name in ("notes.txt", "part-00000-1b2c.snappy.parquet", "dt=2024-01-01"):
        _touch(tmp_path / name)
    with pytest.raises(
        JobStateError, match=r"did not write.*'dt=2024-01-01', 'notes.txt', 'part-00000-1b2c"
    ):
        _open(tmp_path, overwrite=True)
    assert {p.name for p in tmp_path.iterdir()} >= {"notes.txt", "dt=2024-01-01"}


def test_a_spark_output_is_not_taken_for_chutes(tmp_path: Path) -> None:
    """Spark's part-00000-….parquet and _SUCCESS passed for chute's: the folder was taken
    as empty, and Spark's part deleted as an orphan."""
    _touch(tmp_path / "part-00000-1b2c3d4e-c000.snappy.parquet")
    _touch(tmp_path / "_SUCCESS")
    with pytest.raises(JobStateError, match=r"did not write: '_SUCCESS', 'part-00000"):
        _open(tmp_path)


def test_overwrite_of_the_same_job_starts_over(tmp_path: Path) -> None:
    first = _open(tmp_path)
    first.commit([_entry("u1", "part-000000-0000000000-aaaaaaa1.parquet")])
    assert _open(tmp_path, overwrite=True).entries == {}


def test_commit_appends_lines(tmp_path: Path) -> None:
    ledger = _open(tmp_path)
    ledger.commit([_entry("u1", "p1"), _entry("u2", "p2", "p3")])
    ledger.commit([])
    ledger.commit([_entry("u3", "p4")])
    lines = (tmp_path / META_DIR / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(line)["unit"] for line in lines] == ["u1", "u2", "u3"]
    assert set(ledger.entries) == {"u1", "u2", "u3"}
    assert ledger.committed_parts() == {"p1", "p2", "p3", "p4"}
    assert ledger.read_entries() == ledger.entries


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    ledger = _open(tmp_path)
    ledger.commit([_entry("u1", "p1"), _entry("u2", "p2")])
    path = tmp_path / META_DIR / "ledger.jsonl"
    with path.open("a") as f:
        f.write('{"unit":"u3","index":2,"rows":10,"par')  # a crash mid-write
    entries = _open(tmp_path).entries
    assert set(entries) == {"u1", "u2"}


def test_remove_orphans_keeps_committed_parts_only(tmp_path: Path) -> None:
    ledger = _open(tmp_path)
    one, two, three, four = (f"part-00000{i}-0000000000-0000000{i}.parquet" for i in range(1, 5))
    for name in (one, two, three, f".{four}.12345678.tmp"):
        _touch(tmp_path / name)
    _touch(tmp_path / "README.txt")
    _touch(tmp_path / "part-00000-spark.parquet")  # another tool's: never an orphan of chute's
    ledger.commit([_entry("u1", one), _entry("u2", three)])
    assert ledger.remove_orphans() == 2
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["README.txt", META_DIR, one, three, "part-00000-spark.parquet"])
    assert ledger.remove_orphans() == 0


def test_finish_and_unfinish(tmp_path: Path) -> None:
    ledger = _open(tmp_path)
    assert ledger.report() is None
    ledger.finish({"rows_out": 5})
    assert (tmp_path / SUCCESS).is_file()
    assert ledger.report() == {"rows_out": 5}
    assert _open(tmp_path).entries == {}  # the success marker is not a foreign file
    ledger.unfinish()
    assert not (tmp_path / SUCCESS).exists()
    ledger.unfinish()  # nothing to remove


def test_a_job_that_committed_nothing_gives_way_to_another(tmp_path: Path) -> None:
    _open(tmp_path)
    _touch(tmp_path / "part-000000-0000000000-aaaaaaaa.parquet")  # an orphan of that run
    ledger = _open(tmp_path, "fp2")
    assert ledger.entries == {}
    assert not (tmp_path / "part-000000-0000000000-aaaaaaaa.parquet").exists()
    assert '"fp2"' in (tmp_path / META_DIR / "job.json").read_text()


def test_json_it_writes_is_json_to_any_reader(tmp_path: Path) -> None:
    """A metric over a column holding an infinity wrote `"sum": Infinity`, which Python
    reads but JSON.parse (and most readers) refuse."""
    ledger = _open(tmp_path)
    ledger._write_json("report.json", {"sum": float("inf"), "nan": [float("nan"), 1.5]})

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    text = (tmp_path / META_DIR / "report.json").read_text()
    assert json.loads(text, parse_constant=refuse) == {"sum": None, "nan": [None, 1.5]}


@pytest.mark.parametrize("name", ["job.json", "report.json"])
def test_a_metadata_file_cut_short_is_named_and_overwrite_starts_over(
    tmp_path: Path, name: str
) -> None:
    """A failed upload can leave 0 bytes: every run, --overwrite included, and `chute
    status` crashed with a JSONDecodeError traceback."""
    out = tmp_path / "out"
    ledger = _open(out)
    _touch(out / "part-000000-0000000000-aaaaaaa1.parquet")
    ledger.commit([_entry("u1", "part-000000-0000000000-aaaaaaa1.parquet")])
    ledger.finish({"rows_out": 10})
    (out / META_DIR / name).write_bytes(b"")
    if name == "report.json":  # the ledger is what counts: the report is written again
        assert _open(out).report() is None and _open(out).entries.keys() == {"u1"}
        return
    with pytest.raises(JobStateError, match=r"job.json' is not what chute wrote .* --overwrite"):
        _open(out)
    _open(out, "fp2", overwrite=True).commit([_entry("v1")])
    assert _open(out, "fp2").entries.keys() == {"v1"}


def test_a_file_retyped_in_an_older_chutes_line_stays_in_the_manifest(tmp_path: Path) -> None:
    """A line that names its parts only (an older chute's) was given "files": [] when its
    file was replaced: the unit then owned no file, and the manifest left its rows out."""
    name, new = "part-000000-0000000000-0000000a.parquet", "part-000000-0000000000-0000000b.parquet"
    ledger = Ledger.open(str(tmp_path), "fp", {}, False)
    (tmp_path / name).write_bytes(b"old")
    ledger.commit([{"unit": "u", "index": 0, "rows": 3, "errors": 0, "parts": [name]}])
    (tmp_path / new).write_bytes(b"new")
    ledger.replace_file(name, new, 3)
    entry = Ledger.open(str(tmp_path), "fp", {}, False).entries["u"]
    assert entry["parts"] == [new] and "files" not in entry
    assert [f["path"] for f in ledger.manifest()["files"]] == [new]


def test_every_file_a_ledger_line_or_success_names_is_on_the_disk_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing was fsynced: after a power loss, _SUCCESS and ledger lines could survive the
    part files they name (empty, on ext4's delayed allocation). Each part is flushed under
    its temporary name before it is renamed, the ledger before _SUCCESS."""
    import os

    import numpy as np
    import pyarrow as pa

    import chute

    flushed: list[str] = []
    fsync = os.fsync

    def recorded(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    out = tmp_path / "out"
    job = chute.Job(
        chute.TableSource(pa.table({"x": np.arange(40)}), unit_rows=10),
        (chute.Model("m", lambda b: {"y": b["x"]}, inputs=("x",), batch_format="numpy"),),
        output=chute.Sink(str(out), file_rows=10),
        engine="local",
    )
    job.run()
    names = [os.path.basename(p) for p in flushed]
    parts = sorted(p.name for p in out.glob("part-*"))
    assert len(parts) == 4
    assert all(any(n.startswith(f".{part}.") for n in names) for part in parts)
    assert names[-2].startswith(f".{SUCCESS}.") and names[-1] == "out"  # the marker last
    assert str(out / META_DIR / "ledger.jsonl") in flushed[:-2]
