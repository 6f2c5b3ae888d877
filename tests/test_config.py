"""YAML → Job: shorthands, path resolution, overrides and error paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chute import BatchSize, ConfigError, FileSource, Pool
from chute.config import job_from_dict, load_job

BASE: dict[str, Any] = {
    "input": "data/",
    "models": [{"name": "m", "fn": "models.py:Model"}],
    "output": "out/",
}


def test_shorthands_expand() -> None:
    job = job_from_dict({**BASE, "models": [{**BASE["models"][0], "pool": 3}]}, base="/jobs")
    assert isinstance(job.source, FileSource)
    assert job.source.paths == ["/jobs/data"]
    assert job.output is not None and job.output.path == "/jobs/out"
    assert job.models[0].pool == Pool.fixed(3)
    assert job.models[0].fn == "/jobs/models.py:Model"


def test_remote_and_absolute_paths_and_module_references_are_kept() -> None:
    raw = {
        **BASE,
        "input": {"path": ["/abs/a/*.parquet", "/abs/b.parquet"]},
        "models": [{"name": "m", "fn": "pkg.module:Model"}],
        "output": "s3://bucket/out",
    }
    job = job_from_dict(raw, base="/jobs")
    assert isinstance(job.source, FileSource)
    assert job.source.paths == ["/abs/a/*.parquet", "/abs/b.parquet"]
    assert job.output is not None and job.output.path == "s3://bucket/out"
    assert job.models[0].fn == "pkg.module:Model"


def test_overrides_win() -> None:
    job = job_from_dict(
        BASE,
        base="/jobs",
        input="/other/*.csv",
        output="/o",
        batch_size="8MiB",
        pool=Pool.fixed(2),
        engine="ray",
        address="ray://head:10001",
    )
    assert isinstance(job.source, FileSource)
    assert job.source.paths == ["/other/*.csv"]
    assert job.output is not None and job.output.path == "/o"
    assert job.models[0].batch_size == BatchSize(rows=None, bytes=8 * 2**20)
    assert job.models[0].pool == Pool.fixed(2)
    assert (job.engine, job.address) == ("ray", "ray://head:10001")


def test_resources_memory_and_preprocess_parse() -> None:
    raw = {
        **BASE,
        "preprocess": {"fn": "prep.py:clean", "inputs": ["a"], "cpus": 0.5},
        "models": [
            {"name": "m", "fn": "x:y", "resources": {"cpus": 0.5, "gpus": 0.25, "memory": "2GiB"}}
        ],
    }
    job = job_from_dict(raw, base="/jobs")
    assert job.models[0].resources.memory == 2 * 2**30
    assert job.models[0].resources.gpus == 0.25
    assert job.preprocess is not None
    assert job.preprocess.fn == "/jobs/prep.py:clean" and job.preprocess.inputs == ("a",)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            {"models": BASE["models"], "output": "o"},
            "input: required key is missing",
            id="missing-input",
        ),
        pytest.param(
            {**BASE, "models": []}, "models: List should have at least 1 item", id="no-models"
        ),
        pytest.param(
            {**BASE, "models": [{"name": "m", "fn": "x:y", "batch_format": "torch"}]},
            "models[0].batch_format: Input should be 'pyarrow', 'pandas' or 'numpy'",
            id="bad-format",
        ),
        pytest.param(
            {**BASE, "output": {"path": "o", "format": "xlsx"}},
            "output.format: Input should be 'parquet', 'csv', 'jsonl', 'openai-batch', 'iceberg', "
            "'delta' or 'lance'",
            id="bad-output-format",
        ),
        pytest.param(
            {**BASE, "models": [{"name": "bad name", "fn": "x:y"}]},
            "models[0] (bad name): model name 'bad name' must be an identifier",
            id="bad-name",
        ),
        pytest.param(
            {**BASE, "models": [{"name": "m", "fn": "x:y", "resources": {"memory": "lots"}}]},
            "cannot read 'lots' as a size",
            id="bad-memory",
        ),
    ],
)
def test_errors_name_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        job_from_dict(raw)
    assert message in str(info.value)


def test_metrics_are_read_from_the_job_file() -> None:
    raw = {
        **BASE,
        "metrics": [
            {"type": "auc_roc", "label": "y", "score": "m_p"},
            {"type": "log_loss", "label": "y", "score": "m_p", "by": "region", "max_groups": 7},
        ],
    }
    job = job_from_dict(raw, base="/jobs")
    assert [repr(m) for m in job.metrics] == [
        "<AucRoc 'auc_roc' on y, m_p>",
        "<Sliced 'log_loss' on y, m_p, region>",
    ]


def test_an_unknown_metric_type_is_named_with_a_suggestion() -> None:
    raw = {**BASE, "metrics": [{"type": "auc_rc", "label": "y", "score": "m_p"}]}
    with pytest.raises(ConfigError, match=r"metrics\[0\]: .*Did you mean 'auc_roc'"):
        job_from_dict(raw)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        pytest.param(
            {"by": "region", "max_groups": "abc"},
            "metrics[0].max_groups: 'abc' is not a whole number of at least 1",
            id="max-groups-text",
        ),
        pytest.param(
            {"threshold": "high"},
            "metrics[0].threshold: 'high' is not a finite number",
            id="threshold",
        ),
        pytest.param(
            {"bins": "1e9"}, "metrics[0].bins: '1e9' is not a whole number", id="bins-as-text"
        ),
        pytest.param({"bins": 2.7}, "metrics[0].bins: 2.7 is not a whole number", id="bins-2.7"),
        pytest.param(
            {"bins": 10**9}, "metrics[0].bins: 1000000000 is not at most 1,048,576", id="bins-1e9"
        ),
        pytest.param(
            {"score_range": [0]},
            "metrics[0].score_range: [0] is not two finite numbers, low and high",
            id="range",
        ),
        pytest.param({"label": ["y"]}, "metrics[0].label: ['y'] is not a column name", id="label"),
        pytest.param(
            {"score_range": [0, float("inf")]},
            "metrics[0].score_range: [0, inf] is not two finite numbers",
            id="range-to-infinity",
        ),
    ],
)
def test_a_bad_metric_option_names_the_key_the_value_and_what_it_takes(
    option: dict[str, Any], message: str
) -> None:
    """These said "invalid literal for int()", "could not convert string to float" or
    "'<' not supported between 'str' and 'int'", naming neither key nor metric; bins: 2.7
    became 2 in silence."""
    spec = {"type": "accuracy", "label": "y", "score": "m_p", **option}
    if "bins" in option or "score_range" in option:
        spec["type"] = "auc_roc"
    with pytest.raises(ConfigError) as info:
        job_from_dict({**BASE, "metrics": [spec]})
    assert message in str(info.value)


def test_a_metric_name_left_empty_takes_the_metrics_own() -> None:
    """``name:`` with no value in a job file is None: the default name, not an error."""
    spec = {"type": "accuracy", "label": "y", "score": "m_p", "name": None}
    (metric,) = job_from_dict({**BASE, "metrics": [spec]}).metrics
    assert metric.name == "confusion"  # accuracy is one of its results


@pytest.mark.parametrize("value", ["lots", 0, "12 parsecs"])
def test_a_bad_batch_size_names_the_key_and_the_forms(value: Any) -> None:
    raw = {
        "input": "data/",
        "models": [{"name": "m", "fn": "chute.demo:tip_model", "batch_size": value}],
        "output": "out/",
    }
    with pytest.raises(ConfigError) as info:
        job_from_dict(raw)
    text = str(info.value)
    assert text.startswith(f"models[0].batch_size: {value!r} is not a batch size")
    assert "rows (an int" in text and "'8MiB'" in text and "'auto'" in text


def test_a_job_file_refuses_a_key_given_twice_and_keeps_yaml_merge_keys(tmp_path: Any) -> None:
    """The last of two output: keys won in silence; a merge (<<: *common) is YAML's own
    way to share settings, and its keys may be overridden."""
    from chute.config.yamlfile import read_yaml

    twice = tmp_path / "twice.yaml"
    twice.write_text("output: out\nmodels: []\noutput: elsewhere\n")
    with pytest.raises(ConfigError, match="line 3, column 1: the key 'output' is given twice"):
        read_yaml(str(twice))
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "common: &c {fn: 'm:f', inputs: [x]}\n"
        "models: [{<<: *c, name: a}, {<<: *c, name: b, inputs: [y]}]\n"
    )
    models = read_yaml(str(merged))["models"]
    assert models == [
        {"fn": "m:f", "inputs": ["x"], "name": "a"},
        {"fn": "m:f", "inputs": ["y"], "name": "b"},
    ]
    listed = tmp_path / "listed.yaml"
    listed.write_text("? [a, b]\n: 1\n")
    with pytest.raises(ConfigError, match="a key must be a name"):
        read_yaml(str(listed))


def test_yes_and_no_in_a_job_file_are_text_and_true_and_false_are_booleans(
    tmp_path: Any,
) -> None:
    """YAML 1.1 read `labels: [no, yes]` as False and True: a classifier's class names
    were written as a bool column. Booleans are YAML 1.2's: true and false."""
    from chute.config.yamlfile import read_yaml

    path = tmp_path / "job.yaml"
    path.write_text(
        "labels: [no, yes, on, off, n, y]\nflags: [true, False, TRUE]\nchoice: {yes: no}\n"
    )
    assert read_yaml(str(path)) == {
        "labels": ["no", "yes", "on", "off", "n", "y"],
        "flags": [True, False, True],
        "choice": {"yes": "no"},
    }


def test_max_failed_fraction_is_a_share_of_the_rows(tmp_path: Any) -> None:
    from chute.config import load_job

    path = tmp_path / "job.yaml"
    base = "input: data/\noutput: out\nmodels: [{name: m, fn: 'm.py:f'}]\n"
    (tmp_path / "m.py").write_text("def f(batch):\n    return batch\n")
    path.write_text(base + "max_failed_fraction: 1.0\n")
    assert load_job(str(path)).max_failed_fraction == 1.0
    for bad in ("0", "1.5", "yes"):
        path.write_text(base + f"max_failed_fraction: {bad}\n")
        with pytest.raises(ConfigError, match="max_failed_fraction"):
            load_job(str(path))


def test_carryover_star_as_the_readme_writes_it() -> None:
    """``carryover: "*"`` was refused: 'Input should be a valid list'."""
    assert job_from_dict({**BASE, "carryover": "*"}).carryover == ("*",)
    assert job_from_dict({**BASE, "carryover": "id"}).carryover == ("id",)


@pytest.mark.parametrize("key", ["partition_by", "sort_by", "table", "commit_seconds"])
def test_a_table_option_on_a_file_output_is_refused(key: str) -> None:
    """Taken in silence: the files came out neither partitioned nor sorted."""
    value = {"table": "db.t", "commit_seconds": 1.0}.get(key, ["id"])
    with pytest.raises(ConfigError, match=f"output: {key} is an option of table outputs"):
        job_from_dict({**BASE, "output": {"path": "out/", key: value}})


def test_file_size_reaches_a_table_output() -> None:
    """A table output's file_size and file_rows were dropped by the job file."""
    output = {"path": "t/", "format": "delta", "file_size": "64MiB", "file_rows": 1000}
    job = job_from_dict({**BASE, "output": output})
    assert job.output is not None
    assert (job.output.target.bytes, job.output.target.rows) == (64 * 2**20, 1000)


def test_a_table_option_at_its_default_on_a_file_output_is_taken() -> None:
    """A template's `partition_by: []` or `index: null` says nothing a file output lacks."""
    output = {"path": "out/", "partition_by": [], "index": None, "commit_seconds": 5.0}
    assert job_from_dict({**BASE, "output": output}).output is not None


def test_a_job_file_reached_through_a_link_and_dot_dot_is_read_where_the_system_finds_it(
    tmp_path: Path,
) -> None:
    """``link/../jobs/job.yaml`` with ``link -> real/sub`` is ``real/jobs/job.yaml``: its
    relative paths were taken from ``./jobs``, another folder's data and code (exit 0)."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "jobs").mkdir()
    (tmp_path / "jobs").mkdir()  # the folder the text names: a decoy
    job = "input: data.parquet\nmodels: [{name: m, fn: 'udf.py:fn'}]\noutput: out\n"
    (tmp_path / "real" / "jobs" / "job.yaml").write_text(job)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    loaded = load_job(str(tmp_path / "link" / ".." / "jobs" / "job.yaml"))
    assert isinstance(loaded.source, FileSource)
    assert loaded.source.paths == [str(tmp_path / "real" / "jobs" / "data.parquet")]
    assert loaded.models[0].fn == f"{tmp_path / 'real' / 'jobs' / 'udf.py'}:fn"
