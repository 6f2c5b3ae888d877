"""Object storage (issue 6): jobs that read from and write to a real S3 API on loopback.

moto runs in server mode on 127.0.0.1 (``tests/s3server.py``) and every request goes
through a small proxy that counts requests by kind and, when a test asks, answers some of
them with ``503 SlowDown``, ``500`` or a dropped connection. Nothing here is mocked: the
requests are pyarrow's AWS SDK talking HTTP to moto.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import chute
import chute.sources.files
from chute import ConfigError
from chute.cli import main
from chute.ledger import Ledger
from chute.storage import StorageOptions, redact, resolve
from tests import s3server
from tests.chaos_job import (
    HERE,
    METRICS,
    ROWS_PER_UNIT,
    driver_env,
    finish_or_kill,
    make_data,
    reap,
    seen_units,
    session_processes,
    start_driver,
    write_job,
)
from tests.s3server import FaultProxy, MotoS3, get_object, list_keys, put_objects, read_json

moto_s3 = s3server.moto_s3  # the fixtures: a moto server, the proxy, an empty bucket
s3_proxy = s3server.s3_proxy
s3 = s3server.s3

UNITS = 6
ROWS = 200


def scale(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": batch["x"] * 2.0 + batch["id"]}


def _table(unit: int, rows: int = ROWS) -> pa.Table:
    ids = np.arange(unit * rows, (unit + 1) * rows, dtype=np.int64)
    return pa.table({"id": ids, "x": np.sin(ids.astype(np.float64))})


def _encode(table: pa.Table, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, buf)
    elif fmt == "csv":
        pacsv.write_csv(table, buf)
    else:
        buf.write("".join(json.dumps(r) + "\n" for r in table.to_pylist()).encode())
    return buf.getvalue()


def upload(moto_s3: MotoS3, fmt: str, units: int = UNITS, prefix: str = "in") -> None:
    ext = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}[fmt]
    put_objects(
        moto_s3,
        "bucket",
        {f"{prefix}/unit-{u:03d}.{ext}": _encode(_table(u), fmt) for u in range(units)},
    )


def _job(
    source: str,
    out: str,
    engine: str,
    fmt: str = "parquet",
    file_rows: int | None = None,
    **kwargs: Any,
) -> chute.Job:
    model = chute.Model("m", scale, inputs=("id", "x"), batch_format="numpy", batch_size=64)
    return chute.Job(
        source=chute.FileSource(source),
        models=(model,),
        carryover=("id",),
        output=chute.Sink(out, fmt, file_rows=file_rows),  # type: ignore[arg-type]
        engine=engine,  # type: ignore[arg-type]
        **kwargs,
    )


def read_result(moto_s3: MotoS3, prefix: str, fmt: str = "parquet") -> pa.Table:
    """The rows of every file the manifest names (what a downstream reader trusts)."""
    manifest = read_json(moto_s3, "bucket", f"{prefix}/_chute/manifest.json")
    tables = []
    for item in manifest["files"]:
        data = get_object(moto_s3, "bucket", f"{prefix}/{item['path']}")
        assert len(data) == item["bytes"]
        if fmt == "parquet":
            table = pq.read_table(io.BytesIO(data))
        elif fmt == "csv":
            table = pacsv.read_csv(io.BytesIO(data))
        else:
            table = pa.Table.from_pylist([json.loads(line) for line in data.splitlines()])
        assert table.num_rows == item["rows"]
        tables.append(table)
    return pa.concat_tables(tables).sort_by("id")


def check_exactly_once(
    moto_s3: MotoS3, prefix: str, units: int = UNITS, fmt: str = "parquet"
) -> None:
    keys = list_keys(moto_s3, "bucket", prefix + "/")
    assert f"{prefix}/_SUCCESS" in keys
    result = read_result(moto_s3, prefix, fmt)
    ids = result.column("id").to_numpy()
    assert len(ids) == units * ROWS and len(np.unique(ids)) == len(ids)
    assert (ids == np.arange(units * ROWS)).all()
    expected = np.sin(ids.astype(np.float64)) * 2.0 + ids
    np.testing.assert_allclose(result.column("m_y").to_numpy(), expected)
    manifest = read_json(moto_s3, "bucket", f"{prefix}/_chute/manifest.json")
    parts = {k.rsplit("/", 1)[1] for k in keys if k.rsplit("/", 1)[1].startswith("part-")}
    assert parts == {f["path"] for f in manifest["files"]}, "an orphan part or a lost one"
    assert manifest["rows"] == units * ROWS


# --------------------------------------------------------------------------- 1. in and out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_job_reads_from_and_writes_to_the_bucket(
    s3: FaultProxy, moto_s3: MotoS3, engine: str, fmt: str
) -> None:
    upload(moto_s3, fmt)
    report = _job("s3://bucket/in/", "s3://bucket/out", engine, fmt).run()
    assert (report.units_done, report.rows_out) == (UNITS, UNITS * ROWS)
    check_exactly_once(moto_s3, "out", fmt=fmt)
    keys = list_keys(moto_s3, "bucket", "out/_chute/")
    assert "out/_chute/report.json" in keys and "out/_chute/job.json" in keys
    ledger = [k for k in keys if k.startswith("out/_chute/ledger/")]
    assert ledger, "the ledger is objects in the bucket"
    entries = [
        json.loads(line) for k in ledger for line in get_object(moto_s3, "bucket", k).splitlines()
    ]
    assert sorted(e["index"] for e in entries) == list(range(UNITS))
    assert read_json(moto_s3, "bucket", "out/_chute/report.json")["rows_out"] == UNITS * ROWS


@pytest.mark.timeout(120)
def test_an_s3_key_is_taken_as_written(s3: FaultProxy, moto_s3: MotoS3) -> None:
    """Parsed as a URL, "out?v=2" lost its query: the run wrote to "out", and with
    --overwrite wiped it; "#" and "%20" went the same way."""
    upload(moto_s3, "parquet")
    _job("s3://bucket/in/", "s3://bucket/out", "local").run()
    before = {k: get_object(moto_s3, "bucket", k) for k in list_keys(moto_s3, "bucket", "out/")}
    for out in ("out?v=2", "out#2", "out%20x"):
        _job("s3://bucket/in/", f"s3://bucket/{out}", "local").run(overwrite=True)
        check_exactly_once(moto_s3, out)
    after = {k: get_object(moto_s3, "bucket", k) for k in list_keys(moto_s3, "bucket", "out/")}
    assert after == before  # "out" itself untouched
    put_objects(moto_s3, "bucket", {"odd/a#1.parquet": _encode(_table(0), "parquet")})
    report = _job("s3://bucket/odd/a#1.parquet", "s3://bucket/odd-out", "local").run()
    assert report.rows_out == ROWS


@pytest.mark.timeout(120)
def test_a_key_with_a_dot_dot_or_empty_segment_is_refused_before_anything_is_written(
    s3: FaultProxy, moto_s3: MotoS3
) -> None:
    """pyarrow's client sent "staging/../prod/..." as "prod/..." for reads and writes but
    listed it as written: a second job wrote into, and broke, a finished output "prod";
    "x/../in2/" read in2's objects as x's; "in//a.parquet" was a "bad file" to skip."""
    upload(moto_s3, "parquet")
    _job("s3://bucket/in/", "s3://bucket/prod", "local").run()
    before = {k: get_object(moto_s3, "bucket", k) for k in list_keys(moto_s3, "bucket", "prod/")}
    for source, out, named in [
        ("s3://bucket/in/", "s3://bucket/staging/../prod", "a '..' segment"),
        ("s3://bucket/in/", "s3://bucket/res/./v1", "a '.' segment"),
        ("s3://bucket/x/../in/", "s3://bucket/o", "a '..' segment"),
        ("s3://bucket/in/", "s3://bucket/res//v1/", "an empty segment ('//')"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            _job(source, out, "local").run()
    put_objects(moto_s3, "bucket", {"two//a.parquet": _encode(_table(0), "parquet")})
    with pytest.raises(ConfigError, match=r"1 S3 key\(s\) with an empty.*two//a\.parquet"):
        _job("s3://bucket/two/", "s3://bucket/o", "local", on_bad_input="skip").run()
    after = {k: get_object(moto_s3, "bucket", k) for k in list_keys(moto_s3, "bucket", "prod/")}
    assert after == before
    assert not [k for k in list_keys(moto_s3, "bucket", "") if k.startswith(("res", "o/"))]


@pytest.mark.timeout(120)
def test_a_folder_written_with_a_slash_is_the_folder_beside_an_object_of_its_name(
    s3: FaultProxy, moto_s3: MotoS3
) -> None:
    """An object "in" beside the keys "in/...": "s3://bucket/in/" read the object only
    (three rows, "complete"); without the slash it names the object."""
    upload(moto_s3, "parquet")
    put_objects(moto_s3, "bucket", {"in": _encode(_table(9, rows=3), "parquet")})
    for source, out, rows in [("in/", "out", UNITS * ROWS), ("in", "one", 3)]:
        job = _job(f"s3://bucket/{source}", f"s3://bucket/{out}", "local")
        job = dataclasses.replace(job, source=chute.FileSource(job.source.paths, "parquet"))
        assert job.run().rows_out == rows
    check_exactly_once(moto_s3, "out")


@pytest.mark.timeout(60)
def test_inputs_on_two_storages_are_refused(s3: FaultProxy, tmp_path: Path) -> None:
    """Every file was read through one filesystem: S3 keys opened as local paths were
    "bad files", and under on_bad_input: skip the run completed without them."""
    pq.write_table(_table(0), tmp_path / "a.parquet")
    for paths in ([str(tmp_path), "s3://bucket/in/"], ["s3a://bucket/in/", str(tmp_path)]):
        with pytest.raises(ConfigError, match=r"on 2 storages \(local, s3\)"):
            chute.FileSource(paths)
    chute.FileSource(["s3://bucket/in/", "s3a://bucket/more/"])  # one storage


@pytest.mark.timeout(60)
def test_status_and_report_on_an_s3_output(s3: FaultProxy, moto_s3: MotoS3) -> None:
    upload(moto_s3, "parquet")
    _job("s3://bucket/in/", "s3://bucket/out", "local").run()
    runner = CliRunner(env={"COLUMNS": "200", "AWS_ENDPOINT_URL": s3.endpoint})
    status = runner.invoke(main, ["status", "s3://bucket/out"], catch_exceptions=False)
    assert status.exit_code == 0, status.output
    text = " ".join(status.output.replace("│", " ").split())
    assert f"units committed {UNITS} of {UNITS}" in text
    assert f"rows committed {UNITS * ROWS:,}" in text
    assert "finished yes" in text
    report = runner.invoke(main, ["report", "s3://bucket/out"], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert f"{UNITS * ROWS:,}" in report.output
    assert "out/_chute/report.html" in list_keys(moto_s3, "bucket", "out/_chute/")


@pytest.mark.timeout(60)
def test_status_and_report_of_a_job_file_reach_its_storage(
    s3: FaultProxy, moto_s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint is only in the job's storage section: `chute status job.yaml` finds it."""
    upload(moto_s3, "parquet")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    job = tmp_path / "job.yaml"
    job.write_text(
        "input: s3://bucket/in/\n"
        "models: [{name: m, fn: tests.test_s3:scale, inputs: [id, x], batch_format: numpy}]\n"
        "output: s3://bucket/out\n"
        f"storage: {{endpoint_url: '{s3.endpoint}'}}\n"
    )
    runner = CliRunner(env={"COLUMNS": "200", "AWS_ENDPOINT_URL": None})
    run = runner.invoke(main, ["run", str(job), "-q"], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    status = runner.invoke(main, ["status", str(job)], catch_exceptions=False)
    assert status.exit_code == 0, status.output
    text = " ".join(status.output.replace("│", " ").split())
    assert f"units committed {UNITS} of {UNITS}" in text
    report = runner.invoke(main, ["report", str(job)], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert f"{UNITS * ROWS:,}" in report.output


@pytest.mark.timeout(60)
def test_resume_on_s3_computes_only_uncommitted_units(s3: FaultProxy, moto_s3: MotoS3) -> None:
    upload(moto_s3, "parquet")
    # a file a unit: the two forgotten units' files are theirs alone (a file the local
    # writer joins units into is trusted only with all of them)
    _job("s3://bucket/in/", "s3://bucket/out", "local", file_rows=ROWS).run()
    fs, root = resolve("s3://bucket/out")
    ledger = Ledger(fs, root)
    entries = ledger.read_entries()
    # forget two units: their parts stay behind as orphans, the ledger no longer names them
    lost = [e for e in entries.values() if e["index"] in (1, 4)]
    client = moto_s3.client()
    for key in list_keys(moto_s3, "bucket", "out/_chute/ledger/"):
        client.delete_object(Bucket="bucket", Key=key)
    client.delete_object(Bucket="bucket", Key="out/_SUCCESS")
    kept = [e for e in entries.values() if e not in lost]
    blob = "".join(json.dumps(e) + "\n" for e in kept).encode()
    put_objects(moto_s3, "bucket", {"out/_chute/ledger/00000000-aaaaaaaa.jsonl": blob})
    report = _job("s3://bucket/in/", "s3://bucket/out", "local", file_rows=ROWS).run()
    assert (report.units_skipped, report.units_done) == (UNITS - 2, 2)
    check_exactly_once(moto_s3, "out")


# --------------------------------------------------------------------------- 2. retries


@pytest.mark.timeout(240)
def test_transient_faults_are_retried_and_the_output_is_exactly_once(
    s3: FaultProxy, moto_s3: MotoS3, engine: str
) -> None:
    upload(moto_s3, "parquet", units=12)
    s3.inject(slow_down=0.06, internal=0.04, drop=0.04)
    report = _job("s3://bucket/in/", "s3://bucket/out", engine).run()
    faults = dict(s3.faults)
    s3.inject()
    assert report.rows_out == 12 * ROWS
    assert sum(faults.values()) >= 5 and set(faults) == {"503", "500", "drop"}, faults
    check_exactly_once(moto_s3, "out", units=12)
    print(f"faults injected and survived: {faults}; requests: {dict(s3.counts)}")


# --------------------------------------------------------------------------- 3. permanent


def _never(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise AssertionError("the model ran: the error should have come before any compute")


def _failing_job(source: str, out: str) -> chute.Job:
    model = chute.Model("m", _never, inputs=("x",), batch_format="numpy")
    return chute.Job(chute.FileSource(source), (model,), output=chute.Sink(out), engine="local")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("side", ["input", "output"])
def test_a_missing_bucket_fails_at_planning_naming_it(
    s3: FaultProxy, moto_s3: MotoS3, side: str
) -> None:
    upload(moto_s3, "parquet", units=1)
    source = "s3://no-such-bucket/in/" if side == "input" else "s3://bucket/in/"
    out = "s3://no-such-bucket/out" if side == "output" else "s3://bucket/out"
    with pytest.raises(ConfigError) as info:
        _failing_job(source, out).run()
    text = str(info.value)
    assert f"the {side} bucket 'no-such-bucket'" in text and "does not exist" in text
    assert "create the bucket" in text
    assert s3.counts["PUT"] == 0  # nothing was written anywhere


@pytest.mark.timeout(60)
@pytest.mark.parametrize("side", ["input", "output"])
def test_refused_credentials_fail_at_planning_naming_the_fix(
    s3: FaultProxy, moto_s3: MotoS3, side: str, tmp_path: Path
) -> None:
    upload(moto_s3, "parquet", units=1)
    pq.write_table(_table(0), tmp_path / "local.parquet")
    bad = "s3://AKIAWRONGKEY:wrong-secret@bucket"
    source = f"{bad}/in/" if side == "input" else str(tmp_path / "local.parquet")
    out = f"{bad}/out" if side == "output" else str(tmp_path / "out")
    moto_s3.require_auth(True)  # moto now checks keys against its IAM: this one is unknown
    try:
        with pytest.raises(ConfigError) as info:
            _failing_job(source, out).run()
    finally:
        moto_s3.require_auth(False)
    text = str(info.value)
    assert f"cannot reach the {side} bucket 'bucket'" in text, text
    assert "InvalidAccessKeyId" in text or "INVALID_ACCESS_KEY_ID" in text, text
    assert "credentials were refused" in text and "AWS_ACCESS_KEY_ID" in text
    assert "wrong-secret" not in text  # the secret is never shown
    assert s3.counts["PUT"] == 0
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- 4. chaos

CHAOS_UNITS = 12
KILL_POINTS = {"local": ["start", 2, 7], "ray": [4]}
"""On Ray, one kill mid-run (a kill while Ray starts: the chaos test's, on local files)."""


def _ledger_lines(moto_s3: MotoS3, prefix: str) -> list[dict[str, Any]]:
    """Every committed entry in the bucket's ledger objects (duplicates kept)."""
    keys = list_keys(moto_s3, "bucket", f"{prefix}/_chute/ledger/")
    return [
        json.loads(line)
        for key in keys
        for line in get_object(moto_s3, "bucket", key).splitlines()
        if line.strip()
    ]


def _chaos_reached(moto_s3: MotoS3, point: str | int) -> bool:
    if point == "start":
        return "chaos-out/_chute/job.json" in list_keys(moto_s3, "bucket", "chaos-out/_chute/")
    return len(_ledger_lines(moto_s3, "chaos-out")) >= int(point)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "driver_engine", ["local", pytest.param("ray", marks=pytest.mark.ray)], ids=str
)
def test_driver_sigkill_with_s3_input_and_output_resumes_exactly_once(
    s3: FaultProxy, moto_s3: MotoS3, tmp_path: Path, driver_engine: str
) -> None:
    """The chaos test of issue 3, on the bucket: SIGKILL the driver at several points,
    resume each time; every row once, predictions and metrics as an uninterrupted run's."""
    from chute.metrics import metric_from_spec

    data = make_data(tmp_path / "data", CHAOS_UNITS)
    put_objects(moto_s3, "bucket", {f"chaos-in/{p.name}": p.read_bytes() for p in data.iterdir()})
    model = chute.Model(
        "m", f"{HERE}:SlowModel", inputs=("id", "x"), batch_format="numpy", batch_size=250
    )
    reference = chute.Job(
        source=chute.FileSource(str(data)),
        models=(model,),
        carryover=("id", "tag"),
        output=chute.Sink(str(tmp_path / "reference")),
        engine="local",
        metrics=tuple(metric_from_spec(spec) for spec in METRICS),
    ).run()
    expected = pq.read_table(tmp_path / "reference").sort_by("id")
    job = write_job(
        tmp_path / "job.yaml", "s3://bucket/chaos-in/", "s3://bucket/chaos-out",  # type: ignore[arg-type]
        driver_engine, delay=0.05,
    )  # fmt: skip
    env = driver_env(AWS_ENDPOINT_URL=s3.endpoint)
    all_units = set(range(CHAOS_UNITS))
    runs = [*KILL_POINTS[driver_engine], None]
    before: set[int] = set()
    for n, point in enumerate(runs):
        before = {e["index"] for e in _ledger_lines(moto_s3, "chaos-out")}
        seen = tmp_path / f"seen-{n}.jsonl"
        proc = start_driver(job, {**env, "CHAOS_SEEN": str(seen)})
        try:
            reached = None if point is None else partial(_chaos_reached, moto_s3, point)
            finish_or_kill(proc, reached, n, timeout=200 if point is None else 150)
        finally:
            reap(proc)
            assert not session_processes(proc.pid)
        lines = _ledger_lines(moto_s3, "chaos-out")
        assert len(lines) == len({e["index"] for e in lines}), f"run {n} committed a unit twice"
        assert not seen_units(seen) & before, f"run {n} recomputed committed units"
        if point is None:
            assert seen_units(seen) == all_units - before
    report = read_json(moto_s3, "bucket", "chaos-out/_chute/report.json")
    assert report["units_skipped"] == len(before) and report["units_total"] == CHAOS_UNITS
    assert report["metrics"] == json.loads(json.dumps(reference.metrics))
    result = read_result(moto_s3, "chaos-out").select(expected.column_names)
    assert result.num_rows == CHAOS_UNITS * ROWS_PER_UNIT
    assert result.equals(expected)
    keys = list_keys(moto_s3, "bucket", "chaos-out/")
    parts = {k.split("/")[-1] for k in keys if k.split("/")[-1].startswith("part-")}
    manifest = read_json(moto_s3, "bucket", "chaos-out/_chute/manifest.json")
    assert parts == {f["path"] for f in manifest["files"]}, "orphans left in the bucket"


# --------------------------------------------------------------------------- 5. artifacts


def _onnx_model(tmp_path: Path) -> tuple[bytes, Any]:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2))
    clf = LogisticRegression().fit(x, (x[:, 0] + x[:, 1] > 0).astype(np.int64))
    onx = to_onnx(clf, x[:1].astype(np.float32), options={"zipmap": False})
    return onx.SerializeToString(), clf


def _model_gets(proxy: FaultProxy, key: str) -> int:
    return sum(1 for method, path in proxy.requests if method == "GET" and path == f"/bucket/{key}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_remote_onnx_model_is_downloaded_once_per_node_with_two_replicas(
    s3: FaultProxy, moto_s3: MotoS3, tmp_path: Path
) -> None:
    """Two Ray actors on one node load s3://…/clf.onnx: one download, then the cache."""
    upload(moto_s3, "parquet")
    model, clf = _onnx_model(tmp_path)
    put_objects(moto_s3, "bucket", {"models/clf.onnx": model})
    job = {
        "input": "s3://bucket/in/",
        "carryover": ["id"],
        "models": [
            {
                "name": "clf",
                "model": {"type": "onnx", "path": "s3://bucket/models/clf.onnx"},
                "inputs": ["x", "id"],
                "pool": 2,
                "batch_size": 100,
            }
        ],
        "output": "s3://bucket/out",
        "engine": "ray",
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    cache = tmp_path / "cache"
    env = driver_env(AWS_ENDPOINT_URL=s3.endpoint, CHUTE_CACHE_DIR=str(cache))
    for run in range(2):
        s3.reset()
        proc = subprocess.run(
            [sys.executable, "-m", "chute", "run", str(tmp_path / "job.yaml"), "-q",
             "--overwrite"],
            env=env, capture_output=True, text=True, timeout=200,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        # first run: one GET of the model for two replicas; second run: none (cached)
        assert _model_gets(s3, "models/clf.onnx") == (1 if run == 0 else 0), s3.requests
    cached = [p for p in cache.rglob("clf.onnx")]
    assert len(cached) == 1 and cached[0].read_bytes() == model
    result = read_result(moto_s3, "out")
    ids = result.column("id").to_numpy().astype(np.float64)
    expected = clf.predict(np.column_stack([np.sin(ids), ids]).astype(np.float32))
    np.testing.assert_array_equal(result.column("clf_label").to_numpy(), expected)


_FETCH = """
import sys
from chute.artifacts import local_path
print(local_path(sys.argv[1]))
"""


@pytest.mark.timeout(120)
def test_a_remote_model_directory_is_fetched_once_by_concurrent_processes_and_threads(
    s3: FaultProxy, moto_s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from chute.artifacts import identity, local_path

    files = {
        "config.json": b'{"hidden": 8}',
        "model.safetensors": os.urandom(200_000),
        "tokenizer/vocab.txt": b"a\nb\nc\n",
    }
    put_objects(moto_s3, "bucket", {f"models/tiny/{k}": v for k, v in files.items()})
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "cache"))
    uri = "s3://bucket/models/tiny"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _FETCH, uri], env=env, stdout=subprocess.PIPE,
                         text=True)
        for _ in range(2)
    ]  # fmt: skip
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: local_path(uri), range(3)))
    paths += [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(paths)) == 1 and paths[0].endswith("/tiny")
    for name, data in files.items():
        assert Path(paths[0], name).read_bytes() == data
        assert _model_gets(s3, f"models/tiny/{name}") == 1, s3.requests  # five callers, one GET
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]
    # identity: from a listing, no download; a replaced file is another model
    before = identity(uri)
    gets = s3.counts["GET"]
    assert identity(uri) == before and s3.counts["GET"] == gets
    time.sleep(1.1)  # S3 modification times have one-second resolution
    put_objects(moto_s3, "bucket", {"models/tiny/config.json": b'{"hidden": 16}'})
    assert identity(uri) != before
    assert local_path(uri) != paths[0]  # downloaded again, under a new key
    assert Path(local_path(uri), "config.json").read_bytes() == b'{"hidden": 16}'


# --------------------------------------------------------------------------- 6. listing


@pytest.mark.timeout(120)
def test_planning_many_objects_takes_paginated_listings_and_one_footer_read_each(
    s3: FaultProxy, moto_s3: MotoS3
) -> None:
    """A measurement's shape (benchmarks/listing.py runs it on 10,000 objects): listing
    pages, not a request per object; one ranged GET per footer and no HEAD per file."""
    objects = 1_200  # two listing pages of 1,000
    put_objects(
        moto_s3,
        "bucket",
        {f"many/p-{i:05d}.parquet": _encode(_table(i, rows=3), "parquet") for i in range(objects)},
    )
    s3.reset()
    source = chute.FileSource("s3://bucket/many/")
    units = source.plan()
    assert len(units) == objects and sum(u.rows or 0 for u in units) == 3 * objects
    counts = dict(s3.counts)
    assert counts.get("LIST", 0) <= 3, counts  # 2 pages (+ the directory probe)
    assert counts.get("HEAD", 0) <= 3, counts  # the bucket and the prefix, not each object
    assert counts.get("GET", 0) == objects, counts  # one footer read per file
    assert set(counts) <= {"LIST", "HEAD", "GET"}


@pytest.mark.timeout(120)
def test_reading_units_asks_for_no_object_twice(
    engine: str, s3: FaultProxy, moto_s3: MotoS3, tmp_path: Path
) -> None:
    """The sizes come from the listing: reading a unit is ranged GETs, and one HEAD once
    its rows are read (the object is still the one planned)."""
    upload(moto_s3, "parquet")
    s3.reset()
    _job("s3://bucket/in/", str(tmp_path / "out"), engine).run()
    counts = dict(s3.counts)
    assert counts.get("HEAD", 0) <= 3 + UNITS, counts  # the bucket, the prefix, each unit's
    assert len(pq.read_table(tmp_path / "out")) == UNITS * ROWS


@pytest.mark.timeout(120)
def test_an_object_rewritten_at_its_size_during_the_run_stops_it(
    s3: FaultProxy, moto_s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The units read after the rewrite took the new bytes with the row groups planned
    from the old: a complete run of rows from two versions of one object."""
    monkeypatch.setattr(chute.sources.files, "UNIT_TARGET_ROWS", ROWS)  # a unit a row group

    def version(offset: int) -> bytes:
        ids = np.arange(offset, offset + 20 * ROWS, dtype=np.int64)
        buf = io.BytesIO()
        table = pa.table({"id": ids, "x": np.ones(len(ids))})
        pq.write_table(table, buf, row_group_size=ROWS, compression="none", use_dictionary=False)
        return buf.getvalue()

    old, new = version(0), version(10**6)
    assert len(old) == len(new)
    put_objects(moto_s3, "bucket", {"rw/data.parquet": old})
    rewritten: list[bool] = []

    def rewrite(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not rewritten:
            time.sleep(1.1)  # the listing's time is to the second
            put_objects(moto_s3, "bucket", {"rw/data.parquet": new})
            rewritten.append(True)
        return {"y": batch["x"]}

    source = chute.FileSource("s3://bucket/rw/data.parquet")
    assert len(source.plan()) == 20  # the first few are read before the rewrite, not all
    job = chute.Job(
        source=source,
        models=(chute.Model("m", rewrite, inputs=("x",), batch_format="numpy", batch_size=ROWS),),
        carryover=("id",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    with pytest.raises(chute.DataError, match="was modified after the job was planned"):
        job.run()


# --------------------------------------------------------------------------- 7. access


@pytest.mark.timeout(60)
def test_anonymous_access_sends_unsigned_requests(s3: FaultProxy, moto_s3: MotoS3) -> None:
    upload(moto_s3, "parquet", units=2)
    client = moto_s3.client()  # a public bucket, as the Ray seeds' air-example-data
    client.put_bucket_acl(Bucket="bucket", ACL="public-read")
    for key in list_keys(moto_s3, "bucket", "in/"):
        client.put_object_acl(Bucket="bucket", Key=key, ACL="public-read")
    report = _job("s3://anonymous@bucket/in/", "s3://bucket/out", "local").run()
    assert report.rows_out == 2 * ROWS
    gets = [p for m, p in s3.requests if m == "GET" and p.startswith("/bucket/in/")]
    assert gets and s3.unsigned >= len(gets)  # the reads carried no signature
    check_exactly_once(moto_s3, "out", units=2)


@pytest.mark.timeout(120)
def test_secrets_in_uris_never_reach_reports_ledgers_or_logs(
    s3: FaultProxy, moto_s3: MotoS3, caplog: pytest.LogCaptureFixture
) -> None:
    upload(moto_s3, "parquet", units=3)
    secret = "Sup3rS3cretValue"
    s3.inject(slow_down=0.15)  # retries log warnings: they must not carry the secret either
    with caplog.at_level("WARNING", logger="chute"):
        report = _job(
            f"s3://testing:{secret}@bucket/in/", f"s3://testing:{secret}@bucket/out", "local"
        ).run()
    s3.inject()
    assert report.rows_out == 3 * ROWS
    assert report.output == "s3://testing:***@bucket/out"
    stored = [get_object(moto_s3, "bucket", k) for k in list_keys(moto_s3, "bucket", "out/_chute/")]
    assert stored and not any(secret.encode() in blob for blob in stored)
    assert secret not in caplog.text and secret not in str(report.to_dict())
    with pytest.raises(chute.DataError) as info:
        _job(f"s3://testing:{secret}@bucket/nothing-here/", "s3://bucket/o2", "local").run()
    assert secret not in str(info.value) and "***" in str(info.value)


@pytest.mark.timeout(60)
def test_other_fsspec_schemes_go_through_pyarrow(tmp_path: Path) -> None:
    """memory:// (fsspec's in-process store) as input and output, on the local engine."""
    import fsspec

    memory = fsspec.filesystem("memory")
    for unit in range(3):
        with memory.open(f"/chute-test/in/u{unit}.parquet", "wb") as f:
            f.write(_encode(_table(unit), "parquet"))
    try:
        report = _job("memory://chute-test/in/", "memory://chute-test/out", "local").run()
        assert report.rows_out == 3 * ROWS
        manifest = json.loads(memory.cat("/chute-test/out/_chute/manifest.json"))
        tables = [
            pq.read_table(io.BytesIO(memory.cat(f"/chute-test/out/{f['path']}")))
            for f in manifest["files"]
        ]
        ids = pa.concat_tables(tables).column("id").to_numpy()
        assert sorted(ids.tolist()) == list(range(3 * ROWS))
        assert memory.exists("/chute-test/out/_SUCCESS")
    finally:
        memory.rm("/chute-test", recursive=True)


def test_a_scheme_whose_package_is_missing_says_what_to_install() -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match=r"pip install gcsfs"):
        chute.FileSource("gs://some-bucket/data/").plan()


# --------------------------------------------------------------------------- 8. units


@pytest.mark.parametrize(
    ("path", "scheme"),
    [
        pytest.param("data/x.parquet", "", id="relative"),
        pytest.param("/abs/x", "", id="absolute"),
        pytest.param("file:///abs/x", "file", id="file"),
        pytest.param("s3://b/k", "s3", id="s3"),
        pytest.param("S3A://b/k", "s3a", id="s3a"),
        pytest.param("gs://b/k", "gs", id="gs"),
    ],
)
def test_scheme_of(path: str, scheme: str) -> None:
    from chute.storage import scheme_of

    assert scheme_of(path) == scheme


def test_redact_hides_secrets_and_keeps_the_rest() -> None:
    assert redact("s3://AKIA:abc+/d@bucket/x y") == "s3://AKIA:***@bucket/x y"
    assert redact("in s3://anonymous@bucket/x") == "in s3://anonymous@bucket/x"
    assert redact("two: s3://k:s@a/x and gs://u:p@b/") == "two: s3://k:***@a/x and gs://u:***@b/"


def test_storage_options_take_the_endpoint_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert StorageOptions().with_env().endpoint_url == "http://127.0.0.1:9"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:10")
    assert StorageOptions().with_env().endpoint_url == "http://127.0.0.1:10"
    explicit = StorageOptions(endpoint_url="https://minio.local")
    assert explicit.with_env() is explicit
    # carried by sources and sinks, filled in on the driver (workers may lack the variable)
    assert chute.Sink("s3://b/o").storage == StorageOptions(endpoint_url="http://127.0.0.1:10")
    with pytest.raises(ConfigError, match="needs a scheme"):
        StorageOptions(endpoint_url="minio.local:9000")


def test_storage_options_never_show_fsspec_option_values() -> None:
    options = StorageOptions(options={"token": "abc123", "project": "p"})
    assert "abc123" not in repr(options)
    assert options.describe() == {"options": ["project", "token"]}


def test_yaml_storage_section_reaches_source_and_sink(tmp_path: Path) -> None:
    from chute.config import job_from_dict

    job = job_from_dict(
        {
            "input": "s3://bucket/in/",
            "models": [{"name": "m", "fn": "tests.test_s3:scale"}],
            "output": "s3://bucket/out",
            "storage": {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"},
        }
    )
    wanted = StorageOptions(endpoint_url="http://127.0.0.1:9000", region="eu-west-1")
    assert job.output is not None and job.output.storage == wanted
    assert job.source.storage == wanted  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"storage\.secret_key: unknown key"):
        job_from_dict(
            {
                "input": "in/",
                "models": [{"name": "m", "fn": "tests.test_s3:scale"}],
                "output": "out/",
                "storage": {"secret_key": "x"},
            }
        )


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate.", True),
        ("AWS Error INTERNAL_FAILURE during GetObject operation: ", True),
        (
            "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 52, Empty reply",
            True,
        ),
        ("AWS Error SERVICE_UNAVAILABLE during ListObjectsV2 operation", True),
        ("AWS Error ACCESS_DENIED during HeadBucket operation: No response body.", False),
        ("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: connection", False),
        ("AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2 operation", False),
        ("Couldn't deserialize thrift: corrupt data", False),
    ],
)
def test_storage_errors_are_classified(message: str, transient: bool) -> None:
    from chute.retry import transient as is_transient

    assert is_transient(OSError(message)) is transient


def test_the_object_layout_also_works_on_a_local_directory(tmp_path: Path) -> None:
    """One design for both: a local ledger can be objects per commit batch too."""
    ledger = Ledger.open(str(tmp_path), "fp", {}, False, objects=True)
    ledger.commit([{"unit": "u1", "index": 0, "rows": 3, "parts": ["p1"]}])
    ledger.commit([{"unit": "u2", "index": 1, "rows": 4, "parts": ["p2"], "files": [["p2", 4, 9]]}])
    names = sorted(p.name for p in (tmp_path / "_chute" / "ledger").iterdir())
    assert [n.split("-")[0] for n in names] == ["00000000", "00000001"]
    again = Ledger.open(str(tmp_path), "fp", {}, False)  # reads both layouts
    assert set(again.entries) == {"u1", "u2"}
    manifest = again.manifest("fp")
    assert manifest["files"] == [
        {"path": "p1", "rows": None, "bytes": None},
        {"path": "p2", "rows": 4, "bytes": 9},
    ]
    resumed = Ledger.open(str(tmp_path), "fp", {}, False, objects=True)
    resumed.commit([{"unit": "u3", "index": 2, "rows": 1, "parts": []}])
    assert (
        sorted(p.name.split("-")[0] for p in (tmp_path / "_chute" / "ledger").iterdir())[-1]
        == "00000002"
    )  # numbering goes on after a resume


@pytest.mark.parametrize(
    ("message", "advice"),
    [
        # a port that holds 401 or 403 is not an HTTP status (CI met port 54017)
        ("When getting information for bucket 'b': AWS Error NETWORK_CONNECTION during "
         "HeadBucket operation: curlCode: 7, Couldn't connect to server (127.0.0.1:54017, "
         "http://127.0.0.1:54017/b)", "Check the endpoint"),
        ("AWS Error UNKNOWN (HTTP status 403) during HeadBucket operation: 127.0.0.1:40100",
         "Access was denied"),
        ("AWS Error UNKNOWN (HTTP status 401) during HeadBucket operation", "credentials were"),
        ("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: http://h:4011/", "bucket name"),
    ],
)  # fmt: skip
def test_a_storage_error_gives_the_advice_for_its_cause(message: str, advice: str) -> None:
    from chute.storage import storage_error

    assert advice in str(storage_error(OSError(message), "s3://b/in/", "input"))


@pytest.mark.timeout(60)
def test_an_unreachable_endpoint_fails_at_planning_naming_it(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    storage = StorageOptions(endpoint_url=f"http://127.0.0.1:{port}", retries=2)
    model = chute.Model("m", _never, inputs=("x",), batch_format="numpy")
    job = chute.Job(
        chute.FileSource("s3://bucket/in/", storage=storage),
        (model,),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    with pytest.raises(ConfigError) as info:
        job.run()
    text = str(info.value)
    assert f"the input bucket 'bucket' at http://127.0.0.1:{port}" in text
    assert "Check the endpoint" in text


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_storage_options_travel_to_ray_workers(
    s3: FaultProxy, moto_s3: MotoS3, ray_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint is given only in the job's options and is one no worker's environment
    names (a second proxy): the workers' reads and writes must reach it."""
    upload(moto_s3, "parquet", units=3)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    other = FaultProxy(moto_s3.endpoint)
    try:
        storage = StorageOptions(endpoint_url=other.endpoint)
        model = chute.Model("m", scale, inputs=("id", "x"), batch_format="numpy")
        job = chute.Job(
            source=chute.FileSource("s3://bucket/in/", storage=storage),
            models=(model,),
            carryover=("id",),
            output=chute.Sink("s3://bucket/out", storage=storage),
            engine="ray",
        )
        s3.reset()
        assert job.run().rows_out == 3 * ROWS
        part_puts = [p for m, p in other.requests if m == "PUT" and "/part-" in p]
        assert len(part_puts) >= 3  # written by the workers, through the carried endpoint
        assert not [p for m, p in s3.requests if "/part-" in p]
    finally:
        other.stop()
    check_exactly_once(moto_s3, "out", units=3)


def test_many_ledger_objects_are_merged_on_resume(tmp_path: Path) -> None:
    from chute.ledger import COMPACT_AT

    ledger = Ledger.open(str(tmp_path), "fp", {}, False, objects=True)
    for i in range(COMPACT_AT + 6):
        ledger.commit([{"unit": f"u{i}", "index": i, "rows": 1, "parts": [f"p{i}"]}])
    folder = tmp_path / "_chute" / "ledger"
    assert len(list(folder.iterdir())) == COMPACT_AT + 6
    again = Ledger.open(str(tmp_path), "fp", {}, False, objects=True)
    assert len(again.entries) == COMPACT_AT + 6
    assert len(list(folder.iterdir())) == 1  # merged into one object
    assert Ledger.open(str(tmp_path), "fp", {}, False, objects=True).entries == again.entries


def test_ledger_objects_are_batched_more_widely_as_a_run_goes_on(tmp_path: Path) -> None:
    objects = Ledger.open(str(tmp_path / "a"), "fp", {}, False, objects=True)
    assert not objects.flush_due(waited=0.5, elapsed=10)
    assert objects.flush_due(waited=1.0, elapsed=10)
    assert not objects.flush_due(waited=5.0, elapsed=1_000)  # 1% of the run: 10 s
    assert objects.flush_due(waited=30.0, elapsed=36_000)  # never more than 30 s
    appends = Ledger.open(str(tmp_path / "b"), "fp", {}, False)
    assert appends.flush_due(waited=0.0, elapsed=1_000)


@pytest.mark.timeout(60)
def test_a_large_job_json_goes_up_whole_or_not_at_all(
    s3: FaultProxy, moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multipart upload that failed left 0 bytes under job.json (its stream's close
    completed it): every later run crashed on it. Staged under another name, it is copied
    into place whole, or not at all."""
    import chute.ledger

    big = {"files": ["x" * 100] * 70_000}  # ~7 MiB: a job over 70,000 input objects
    real = chute.ledger.put

    def cut_short(fs: Any, path: str, data: Any) -> int:
        if len(data) > chute.ledger.MULTIPART_AT:  # what pyarrow leaves of a failed upload
            real(fs, path, b"")
            raise OSError("AWS Error ACCESS_DENIED during UploadPart operation")
        return real(fs, path, data)

    monkeypatch.setattr(chute.ledger, "put", cut_short)
    with pytest.raises(OSError, match="UploadPart"):
        Ledger.open("s3://bucket/big", "fp", big, False)
    keys = list_keys(moto_s3, "bucket", "big/")
    assert "big/_chute/job.json" not in keys and not [k for k in keys if ".tmp" in k], keys
    monkeypatch.setattr(chute.ledger, "put", real)
    ledger = Ledger.open("s3://bucket/big", "fp", big, False)
    assert ledger.read_json("job.json")["job"] == big
    keys = list_keys(moto_s3, "bucket", "big/")
    assert "big/_chute/job.json" in keys and not [k for k in keys if ".tmp" in k], keys


@pytest.mark.timeout(60)
def test_a_folder_named_with_its_slash_is_read_past_a_marker_object(
    s3: FaultProxy, moto_s3: MotoS3
) -> None:
    """A 0-byte object "mk/data" beside "mk/data/x.parquet" (a console's folder marker)
    made "s3://bucket/mk/data/" an empty input file: the folder could not be read."""
    put_objects(
        moto_s3, "bucket", {"mk/data": b"", "mk/data/u.parquet": _encode(_table(0), "parquet")}
    )
    report = _job("s3://bucket/mk/data/", "s3://bucket/mk-out", "local").run()
    assert report.rows_out == ROWS
