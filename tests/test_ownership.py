"""No silent loss (issue 12): one owner per output, and a resume that verifies what it trusts.

Drivers here are real subprocesses (``python -m chute run job.yaml``) on real files or on
the moto S3 server on loopback. The model (:class:`tests.gated_job.GatedModel`) lets the
first units through and holds the rest at a gate, so a test knows the first run is live
and mid-run before it starts a second one or damages the output — no sleeps.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import chute
from chute.errors import JobStateError
from chute.lease import Claim, Lease
from chute.ledger import META_DIR, SUCCESS, Ledger
from chute.storage import resolve
from tests import s3server
from tests.chaos_job import driver_env, make_data, reap, start_driver, wait_for
from tests.gated_job import ROWS_PER_UNIT, write_job
from tests.s3server import FaultProxy

moto_s3 = s3server.moto_s3
s3_proxy = s3server.s3_proxy
s3 = s3server.s3

pytestmark = pytest.mark.slow

UNITS = 8
ROWS = UNITS * ROWS_PER_UNIT


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 Parquet files of 1,000 rows; ids 0..7,999."""
    return make_data(tmp_path_factory.mktemp("owner-data"), UNITS)


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The output location: a local directory, or a prefix in the moto bucket."""
    if request.param == "s3":
        request.getfixturevalue("s3")
        return "s3://bucket/out"
    return str(tmp_path / "out")


# --------------------------------------------------------------------------- checks


def _ledger(out: str) -> Ledger:
    fs, root = resolve(out)
    return Ledger(fs, root)


def committed(out: str) -> set[int]:
    return {e["index"] for e in _ledger(out).read_entries().values()}


def check_exactly_once(out: str) -> dict[str, Any]:
    """``_SUCCESS``, a manifest that names only existing files, every id once; the report."""
    ledger = _ledger(out)
    fs, root = ledger.fs, ledger.root
    assert fs.get_file_info(f"{root}/{SUCCESS}").is_file
    manifest = ledger.read_json("manifest.json")
    assert manifest is not None
    tables = []
    for item in manifest["files"]:
        with fs.open_input_file(f"{root}/{item['path']}") as f:
            assert f.size() == item["bytes"], item
            tables.append(pq.read_table(io.BytesIO(f.read())))
    ids = np.sort(np.concatenate([t.column("id").to_numpy() for t in tables]))
    assert len(ids) == ROWS and (ids == np.arange(ROWS)).all(), "rows lost or doubled"
    for table in tables:
        x_ids = table.column("id").to_numpy()
        assert np.allclose(table.column("m_score").to_numpy() - x_ids, 2.0 * _x(x_ids))
    parts = {
        i.base_name
        for i in fs.get_file_info(pyarrow_selector(root))
        if i.base_name.startswith("part-")
    }
    assert parts == {f["path"] for f in manifest["files"]}, "an orphan part or a lost one"
    report = ledger.read_json("report.json")
    assert report is not None and report["complete"]
    return report


def pyarrow_selector(root: str) -> pafs.FileSelector:
    return pafs.FileSelector(root)


_X: dict[int, np.ndarray] = {}


def _x(ids: np.ndarray) -> np.ndarray:
    """The input's ``x`` for ``ids`` (make_data's seeded values)."""
    if not _X:
        rng = np.random.default_rng(7)
        _X[0] = np.concatenate([rng.normal(size=ROWS_PER_UNIT) for _ in range(UNITS)])
    return _X[0][ids]


def _killed(proc: subprocess.Popen[str]) -> str:
    """Why a driver did not get where it should have: kill it, return its stderr."""
    proc.kill()
    return proc.communicate(timeout=30)[1][-3000:]


def run_cli(job: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chute", "run", str(job), "-q", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _env(where: str, request: pytest.FixtureRequest) -> dict[str, str]:
    if where.startswith("s3://"):
        proxy: FaultProxy = request.getfixturevalue("s3")
        return driver_env(AWS_ENDPOINT_URL=proxy.endpoint)
    return driver_env()


# --------------------------------------------------------------------------- 1. one owner


@pytest.mark.timeout(240)
def test_a_second_run_on_a_live_runs_output_is_refused_naming_it(
    data: Path, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Staggered: the first run has committed units and is mid-run; the second is refused
    at once (exit 5, the first run's pid and host named), touches nothing, and the first
    run then finishes exactly once."""
    gate = tmp_path / "gate"
    job = write_job(tmp_path / "job.yaml", data, where, gate)
    env = _env(where, request)
    first = start_driver(job, env)
    try:
        assert wait_for(lambda: len(committed(where)) >= 2, first, 90), _killed(first)
        second = run_cli(job, env)
        said = " ".join(second.stderr.split())  # the console wraps long lines
        assert second.returncode == 5, said[-2000:]
        assert "in use by another chute run" in said
        assert f"pid {first.pid}" in said and "Traceback" not in said
        second_overwrite = run_cli(job, env, "--overwrite")  # nor may --overwrite wipe it
        assert second_overwrite.returncode == 5, second_overwrite.stderr[-2000:]
        gate.touch()
        _, err = first.communicate(timeout=120)
        assert first.returncode == 0, err[-3000:]
    finally:
        gate.touch()
        reap(first)
    check_exactly_once(where)


@pytest.mark.timeout(240)
def test_two_runs_started_together_never_both_own_the_output(
    data: Path, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Started at the same moment: at most one claims the output (both may withdraw);
    whatever happened, a run afterwards ends with every row exactly once."""
    gate = tmp_path / "gate"
    job = write_job(tmp_path / "job.yaml", data, where, gate)
    env = _env(where, request)
    runs = [start_driver(job, env), start_driver(job, env)]
    try:
        # one is refused (exits 5) and the other is held at the gate, or both are refused;
        # two owners would both be held at the gate and neither would exit
        def settled() -> bool:
            exited = sum(p.poll() is not None for p in runs)
            return exited == 2 or (exited == 1 and gate.with_suffix(".reached").exists())

        assert wait_for(settled, None, 90), "both runs claimed the output"
        refused = [p for p in runs if p.poll() is not None]
        for proc in refused:
            _, err = proc.communicate()
            assert proc.returncode == 5, err[-3000:]
            assert "in use by another chute run" in " ".join(err.split())
        gate.touch()
        for proc in runs:
            if proc not in refused:
                _, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err[-3000:]
    finally:
        gate.touch()
        for proc in runs:
            reap(proc)
    final = run_cli(job, env)  # a third run: finishes what is left, or says it is done
    assert final.returncode == 0, final.stderr[-3000:]
    check_exactly_once(where)


@pytest.mark.timeout(240)
def test_a_killed_owners_claim_is_taken_over_by_the_next_run(
    data: Path, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGKILL leaves the claim behind; the next run sees its process is gone and takes
    the output over without a manual step, recomputing nothing that was committed."""
    gate = tmp_path / "gate"
    job = write_job(tmp_path / "job.yaml", data, where, gate)
    env = _env(where, request)
    first = start_driver(job, env)
    try:
        assert wait_for(lambda: len(committed(where)) >= 2, first, 90), _killed(first)
    finally:
        reap(first)
    fs, root = resolve(where)
    claims = fs.get_file_info(pyarrow_selector(f"{root}/{META_DIR}/owners"))
    assert len(claims) == 1, "the killed run's claim is left behind"
    done = committed(where)
    gate.touch()
    again = run_cli(job, env)
    assert again.returncode == 0, again.stderr[-3000:]
    report = check_exactly_once(where)
    assert report["units_skipped"] == len(done)
    assert fs.get_file_info(pyarrow_selector(f"{root}/{META_DIR}/owners")) == []


# --------------------------------------------------------------------------- the lease


def _fake_claim(folder: Path, **changes: Any) -> Path:
    claim = {
        "run": "f" * 32,
        "host": "elsewhere",
        "boot": "b",
        "pid": 4242,
        "pid_started": 1,
        "started": time.time(),
        "ttl": 60.0,
        **changes,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{claim['run']}.json"
    path.write_text(json.dumps(claim))
    return path


def _acquire(out: Path) -> Lease:
    fs, root = resolve(str(out))
    return Lease.acquire(fs, f"{root}/{META_DIR}", str(out))


def test_a_live_claim_from_another_machine_is_refused(tmp_path: Path) -> None:
    _fake_claim(tmp_path / META_DIR / "owners")
    with pytest.raises(JobStateError, match=r"pid 4242 on host 'elsewhere'"):
        _acquire(tmp_path)
    assert len(list((tmp_path / META_DIR / "owners").iterdir())) == 1, "ours was withdrawn"


def test_a_claim_without_a_heartbeat_for_its_ttl_is_taken_over(tmp_path: Path) -> None:
    stale = _fake_claim(tmp_path / META_DIR / "owners")
    old = time.time() - 120
    os.utime(stale, (old, old))
    lease = _acquire(tmp_path)
    assert not stale.exists() and [c.host for c in lease.taken_over] == ["elsewhere"]
    lease.release()
    assert list((tmp_path / META_DIR / "owners").iterdir()) == []


def test_a_claim_of_a_dead_process_on_this_machine_is_taken_over(tmp_path: Path) -> None:
    here = Claim.mine(60.0)
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = _fake_claim(
        tmp_path / META_DIR / "owners", host=here.host, boot=here.boot, pid=int(proc.stdout)
    )
    with _acquire(tmp_path) as lease:
        assert not dead.exists() and len(lease.taken_over) == 1


def test_a_claim_of_a_live_process_on_this_machine_is_refused(tmp_path: Path) -> None:
    with _acquire(tmp_path), pytest.raises(JobStateError, match="in use by another chute run"):
        _acquire(tmp_path)  # the same process, another run: still a live owner


def test_a_claim_from_another_pid_namespace_here_waits_for_its_ttl(tmp_path: Path) -> None:
    """Containers on one machine share its host name and boot id (host networking, a fixed
    hostname), not their pids: a live run in another container was judged dead by its pid
    and taken over at once. Its claim now counts as another machine's: live until its
    heartbeat is older than its TTL."""
    here = Claim.mine(60.0)
    other = _fake_claim(
        tmp_path / META_DIR / "owners",
        host=here.host,
        boot=here.boot,
        pid=999_999,  # no such pid in this namespace
        pidns="pid:[1]",
    )
    with pytest.raises(JobStateError, match="in use by another chute run"):
        _acquire(tmp_path)
    old = time.time() - 120
    os.utime(other, (old, old))
    with _acquire(tmp_path) as lease:
        assert not other.exists() and len(lease.taken_over) == 1


@pytest.mark.parametrize("text", ["{torn", None], ids=["torn", "a later version's"])
def test_a_claim_this_version_cannot_read_is_live_until_its_ttl(
    tmp_path: Path, text: str | None
) -> None:
    """A claim that does not parse, or one with a field a later chute added, was ignored:
    two runs of two versions could both own the output."""
    path = _fake_claim(tmp_path / META_DIR / "owners", future_field=1)
    if text is not None:
        path.write_text(text)
    with pytest.raises(JobStateError, match=r"cannot read|in use by another chute run"):
        _acquire(tmp_path)
    old = time.time() - 120
    os.utime(path, (old, old))
    with _acquire(tmp_path):
        assert not path.exists()


def test_a_renewal_that_came_late_is_withdrawn_and_a_run_that_cannot_renew_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run paused between reading its claim and rewriting it (or a write retried
    through an outage) may rewrite it after another run took the output over: before,
    the claim came back and both runs owned the output. Now a renewal later than a third
    of the TTL is withdrawn and the run stops; and a run that could not renew for half
    its TTL stops before its next commit, whatever its heartbeat thread is doing."""
    import chute.lease as lease_module

    now = [0.0]
    monkeypatch.setattr(lease_module, "_clock", lambda: now[0])
    lease = _acquire(tmp_path)
    write = lease._write

    def paused_write() -> None:
        now[0] += 30.0  # past 60 / 3
        write()

    monkeypatch.setattr(lease, "_write", paused_write)
    assert lease.beat() is False
    assert not Path(lease.path).exists()
    with pytest.raises(JobStateError, match="lost its claim"):
        lease.ensure()
    lease.release()

    now[0] = 0.0
    second = _acquire(tmp_path / "second")
    assert second.beat() is True
    now[0] = 29.0
    second.ensure()  # renewed 29 s ago: fine
    now[0] = 31.0
    with pytest.raises(JobStateError, match="could not renew its claim"):
        second.ensure()
    second.release()


def test_a_lost_claim_stops_commits_and_deletions(tmp_path: Path) -> None:
    lease = _acquire(tmp_path)
    ledger = Ledger.open(str(tmp_path), "fp", {}, False, lease=lease)
    os.remove(lease.path)  # another run judged this one dead and took over
    (tmp_path / "part-000000-0000000000-0000000a.parquet").touch()
    with pytest.raises(JobStateError, match="lost its claim"):
        ledger.remove_orphans()
    with pytest.raises(JobStateError, match="lost its claim"):
        ledger.commit([{"unit": "u", "index": 0, "rows": 1, "parts": [], "files": []}])
    assert (tmp_path / "part-000000-0000000000-0000000a.parquet").exists()
    ledger.save_report({"complete": False, "stopped": "paused"})  # the partial report too
    assert not (tmp_path / "_chute" / "report.json").exists()
    lease.release()


class TakenOver:
    """A model whose run is taken over while it computes: after its first call, another
    run (judging this one dead: a frozen VM) removes this run's claim."""

    def __init__(self, out: str) -> None:
        self.owners, self.calls = Path(out) / META_DIR / "owners", 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.calls == 2:
            for claim in self.owners.glob("*.json"):
                claim.unlink()
        return {"score": batch["x"] * 2.0}


@pytest.mark.timeout(120)
def test_a_run_that_lost_its_claim_puts_no_more_files_in_the_output(
    data: Path, tmp_path: Path
) -> None:
    """The displaced run's writer put the part it held into the output the other run had
    finished, beside its _SUCCESS: those rows twice for every reader of the folder."""
    out = tmp_path / "out"
    model = chute.Model(
        "m", TakenOver(str(out)), inputs=("x",), batch_format="numpy", batch_size=1_000
    )
    job = chute.Job(
        source=chute.FileSource(str(data)), models=(model,), carryover=("id",),
        output=chute.Sink(str(out), file_rows=ROWS_PER_UNIT), engine="local",
    )  # fmt: skip
    with pytest.raises(JobStateError, match="lost its claim"):
        job.run(progress=False)
    written = [pq.read_table(p) for p in out.glob("part-*")]
    assert sum(t.num_rows for t in written) <= ROWS_PER_UNIT  # the first call's, at most


# --------------------------------------------------------------------------- 2. verify


def _job(data: Path, out: Path, engine: str = "local") -> chute.Job:
    model = chute.Model(
        "m", lambda b: {"score": b["x"] * 2.0 + b["id"]}, inputs=("id", "x"),
        batch_format="numpy", batch_size=250,
    )  # fmt: skip
    return chute.Job(
        source=chute.FileSource(str(data)),
        models=(model,),
        carryover=("id",),
        # a file a unit, as before files were joined: these tests lose, change or delete
        # one unit's file (a file units share is trusted only with all of them)
        output=chute.Sink(str(out), file_rows=ROWS_PER_UNIT),
        engine=engine,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(120)
def test_a_resume_recomputes_units_whose_parts_are_missing_or_changed(
    data: Path, tmp_path: Path, engine: str
) -> None:
    out = tmp_path / "out"
    _job(data, out, engine).run()
    entries = sorted(_ledger(str(out)).read_entries().values(), key=lambda e: e["index"])
    (out / entries[1]["parts"][0]).unlink()  # lost
    with (out / entries[5]["parts"][0]).open("ab") as f:
        f.write(b"junk")  # changed
    report = _job(data, out, engine).run()
    assert sorted(report.units_redone) == sorted([entries[1]["unit"], entries[5]["unit"]])
    assert report.units_skipped == UNITS - 2 and report.rows_in == 2 * ROWS_PER_UNIT
    check_exactly_once(str(out))


class _Interrupted(BaseException):
    """A crash at a chosen deletion (BaseException: nothing catches it on the way)."""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("then", ["plain", "overwrite"])
@pytest.mark.parametrize("deletions", [1, 2, 3, 5, 8, 12])
def test_an_overwrite_interrupted_while_deleting_ends_exactly_once(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deletions: int, then: str
) -> None:
    """``--overwrite`` stopped after ``deletions`` files are gone, then a plain run or
    another ``--overwrite``: exactly once, and a plain run redoes only what is lost."""
    out = tmp_path / "out"
    _job(data, out).run()
    count = {"n": 0}
    original = Ledger._delete

    def failing_delete(self: Ledger, path: str) -> None:
        count["n"] += 1
        if count["n"] > deletions:
            raise _Interrupted
        original(self, path)

    monkeypatch.setattr(Ledger, "_delete", failing_delete)
    with pytest.raises(_Interrupted):
        _job(data, out).run(overwrite=True)
    monkeypatch.setattr(Ledger, "_delete", original)
    report = _job(data, out).run(overwrite=then == "overwrite")
    assert report.complete
    check_exactly_once(str(out))


@pytest.mark.timeout(240)
def test_files_that_vanish_during_a_run_are_never_marked_finished(
    data: Path, tmp_path: Path
) -> None:
    """A committed part deleted behind the run's back: no ``_SUCCESS`` (exit 5, saying
    why); the next run recomputes that unit and ends exactly once."""
    out = tmp_path / "out"
    gate = tmp_path / "gate"
    job = write_job(tmp_path / "job.yaml", data, str(out), gate)
    first = start_driver(job, driver_env())
    try:
        assert wait_for(lambda: len(committed(str(out))) >= 2, first, 90), _killed(first)
        victim = next(iter(_ledger(str(out)).read_entries().values()))
        (out / victim["parts"][0]).unlink()
        gate.touch()
        _, err = first.communicate(timeout=120)
    finally:
        gate.touch()
        reap(first)
    assert first.returncode == 5, err[-3000:]
    assert "lost files during the run" in err and not (out / SUCCESS).exists()
    again = run_cli(job, driver_env())
    assert again.returncode == 0, again.stderr[-3000:]
    report = check_exactly_once(str(out))
    assert report["units_redone"] == [victim["unit"]]
