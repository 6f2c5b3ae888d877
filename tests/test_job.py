"""Job values: validated when built, and a fingerprint that changes with what the output
depends on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from chute import BatchSize, ConfigError, Job, Model, Pool, Preprocess, Resources, Sink
from chute.job import DEFAULT_BATCH_ROWS, parse_bytes
from chute.sources import FileSource, TableSource


def score(batch: Any) -> dict[str, Any]:
    return {"y": np.asarray(batch["x"])}


def other_score(batch: Any) -> dict[str, Any]:
    return {"y": np.asarray(batch["x"]) * 2}


class Scorer:
    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor

    def __call__(self, batch: Any) -> Any:
        return np.asarray(batch["x"]) * self.factor


# -- Resources ---------------------------------------------------------------------------


def test_resources_defaults() -> None:
    res = Resources()
    assert (res.cpus, res.gpus, res.memory) == (None, 0.0, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"cpus": 0}, "cpus must be > 0", id="zero-cpus"),
        pytest.param({"cpus": -1.5}, "cpus must be > 0", id="negative-cpus"),
        pytest.param({"gpus": -0.5}, "gpus must be >= 0", id="negative-gpus"),
        pytest.param({"memory": 0}, "memory must be > 0", id="zero-memory"),
        pytest.param({"memory": -10}, "memory must be > 0", id="negative-memory"),
    ],
)
def test_resources_rejects_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Resources(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"cpus": 0.25}, id="fractional-cpus"),
        pytest.param({"gpus": 0.5}, id="fractional-gpus"),
        pytest.param({"gpus": 0}, id="no-gpus"),
        pytest.param({"memory": 2**30}, id="memory"),
    ],
)
def test_resources_accepts_good_values(kwargs: dict[str, Any]) -> None:
    Resources(**kwargs)


# -- Pool --------------------------------------------------------------------------------


def test_pool_fixed_and_range() -> None:
    assert Pool.fixed(3) == Pool(min=3, max=3)
    assert Pool() == Pool(min=1, max=None)
    assert Pool(min=2, max=5).max == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"min": 0}, r"pool min must be >= 1, got 0", id="zero-min"),
        pytest.param({"min": -1}, r"pool min must be >= 1", id="negative-min"),
        pytest.param(
            {"min": 3, "max": 2}, r"pool max \(2\) must be >= pool min \(3\)", id="max<min"
        ),
    ],
)
def test_pool_rejects_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Pool(**kwargs)


def test_pool_fixed_zero_is_refused() -> None:
    with pytest.raises(ConfigError):
        Pool.fixed(0)


# -- BatchSize ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "rows", "nbytes"),
    [
        pytest.param(128, 128, None, id="int-rows"),
        pytest.param("256", 256, None, id="digit-string-rows"),
        pytest.param("8MiB", None, 8 * 2**20, id="MiB"),
        pytest.param("2KiB", None, 2048, id="KiB"),
        pytest.param("1.5GB", None, 1_500_000_000, id="GB-decimal"),
        pytest.param(" 64 mib ", None, 64 * 2**20, id="spaces-lowercase"),
        pytest.param("100B", None, 100, id="bytes"),
    ],
)
def test_batch_size_parse(value: int | str, rows: int | None, nbytes: int | None) -> None:
    size = BatchSize.parse(value)
    assert (size.rows, size.bytes) == (rows, nbytes)


def test_batch_size_parse_passes_batch_size_through() -> None:
    size = BatchSize(rows=None, bytes=10)
    assert BatchSize.parse(size) is size


def test_batch_size_default_is_rows() -> None:
    assert BatchSize() == BatchSize(rows=DEFAULT_BATCH_ROWS)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(0, id="zero-rows"),
        pytest.param(-5, id="negative-rows"),
        pytest.param("0", id="zero-string"),
        pytest.param("0MiB", id="zero-bytes"),
        pytest.param("-1MiB", id="negative-bytes"),
        pytest.param("lots", id="garbage"),
        pytest.param("8 parsecs", id="unknown-unit"),
        pytest.param(True, id="bool"),
    ],
)
def test_batch_size_rejects_bad_values(value: Any) -> None:
    with pytest.raises(ConfigError):
        BatchSize.parse(value)


def test_batch_size_needs_exactly_one_of_rows_or_bytes() -> None:
    with pytest.raises(ConfigError, match="not both or neither"):
        BatchSize(rows=10, bytes=10)
    with pytest.raises(ConfigError, match="not both or neither"):
        BatchSize(rows=None, bytes=None)


@pytest.mark.parametrize(
    ("size", "row_bytes", "rows"),
    [
        pytest.param(BatchSize(rows=10), 1000.0, 10, id="rows-ignore-width"),
        pytest.param(BatchSize(rows=None, bytes=800), 16.0, 50, id="bytes"),
        pytest.param(BatchSize(rows=None, bytes=10), 100.0, 1, id="at-least-one-row"),
        pytest.param(BatchSize(rows=None, bytes=10), 0.0, 10, id="zero-width"),
    ],
)
def test_batch_size_rows_for(size: BatchSize, row_bytes: float, rows: int) -> None:
    assert size.rows_for(row_bytes) == rows


def test_parse_bytes_message() -> None:
    assert parse_bytes(123) == 123
    with pytest.raises(ConfigError, match="write it like '64MiB'"):
        parse_bytes("big")


# -- Model -------------------------------------------------------------------------------


def test_model_normalises_its_fields() -> None:
    model = Model("m", score, inputs=["x"], batch_size="1MiB", args=[1, 2])  # type: ignore[arg-type]
    assert model.inputs == ("x",)
    assert model.batch_size == BatchSize(rows=None, bytes=2**20)
    assert model.args == (1, 2)
    assert Model("m", score, batch_size=64).batch_size == BatchSize(rows=64)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("", id="empty"),
        pytest.param("my model", id="space"),
        pytest.param("1st", id="leading-digit"),
        pytest.param("tip-score", id="dash"),
        pytest.param("a.b", id="dot"),
    ],
)
def test_model_rejects_bad_names(name: str) -> None:
    with pytest.raises(ConfigError, match="must be an identifier"):
        Model(name, score)


@pytest.mark.parametrize("name", ["__chute_error", "__chute"])
def test_model_names_of_chute_s_own_are_refused(name: str) -> None:
    """A model named ``__chute_error`` returning a ``model`` column: its output was taken
    for chute's mark of failed rows, and its labelled rows went to the errors dataset of a
    run that finished, exit 0."""
    with pytest.raises(ConfigError, match="names that start with '__chute' are chute's own"):
        Model(name, score)


def test_an_output_column_named_as_chute_s_own_is_refused() -> None:
    """The same through a model name that only becomes chute's prefix with its output's."""
    import pyarrow as pa

    import chute

    job = chute.Job(
        chute.TableSource(pa.table({"x": [1.0, 2.0]})),
        (Model("_", lambda b: {"chute_error_model": ["label"] * b.num_rows}, inputs=("x",)),),
        engine="local",
    )
    with pytest.raises(chute.ModelError, match="names that start with '__chute_' are chute's own"):
        job.run()


def test_model_rejects_bad_batch_format() -> None:
    with pytest.raises(ConfigError, match=r"batch_format 'polars' is not one of pyarrow, pandas"):
        Model("m", score, batch_format="polars")  # type: ignore[arg-type]


def test_model_rejects_bad_batch_size() -> None:
    with pytest.raises(ConfigError):
        Model("m", score, batch_size=0)  # type: ignore[arg-type]


def test_preprocess_rejects_bad_batch_format() -> None:
    with pytest.raises(ConfigError, match="batch_format"):
        Preprocess(score, batch_format="arrow")  # type: ignore[arg-type]


# -- Sink and Job ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_sink_accepts_formats(fmt: str) -> None:
    assert Sink("out", fmt).format == fmt  # type: ignore[arg-type]


def test_sink_rejects_unknown_format() -> None:
    with pytest.raises(ConfigError, match="output format 'xlsx' is not one of parquet, csv, jsonl"):
        Sink("out", "xlsx")  # type: ignore[arg-type]


def _table(n: int = 4) -> pa.Table:
    return pa.table({"x": np.arange(n, dtype=np.int64), "z": np.arange(n, dtype=np.float64)})


def test_job_rejects_duplicate_model_names() -> None:
    with pytest.raises(ConfigError, match="model names must be unique; repeated: a"):
        Job(TableSource(_table()), [Model("a", score), Model("b", score), Model("a", other_score)])


def test_job_rejects_unknown_engine() -> None:
    with pytest.raises(ConfigError, match="engine 'spark' is not one of auto, local, ray"):
        Job(TableSource(_table()), [Model("a", score)], engine="spark")  # type: ignore[arg-type]


def test_job_normalises_sequences() -> None:
    job = Job(TableSource(_table()), [Model("a", score)], carryover=["x"])  # type: ignore[arg-type]
    assert job.models == (Model("a", score),)
    assert job.carryover == ("x",)


def test_one_carried_name_is_a_column_not_its_letters() -> None:
    """``carryover="ke"`` carried the columns ``k`` and ``e``, where a frame had them."""
    job = Job(TableSource(_table()), [Model("a", score)], carryover="x")  # type: ignore[arg-type]
    assert job.carryover == ("x",)


@pytest.mark.parametrize(
    ("carryover", "message"),
    [
        (["x", "z", "x"], "carryover names 'x' more than once: the output would have two columns"),
        (["*", "x"], "carryover '\\*' already means every input column"),
        (["x", 3], "carryover takes column names, got 3"),
    ],
)
def test_a_carryover_that_would_write_a_column_twice_is_refused(
    carryover: Any, message: str
) -> None:
    """``[id, id]`` wrote Parquet files with two ``id`` columns (no reader takes them)
    while the run reported complete."""
    with pytest.raises(ConfigError, match=message):
        Job(TableSource(_table()), [Model("a", score)], carryover=carryover)


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"output": "out/"}, "output must be a chute sink .* got str 'out/'"),
        ({"source": "data/"}, "source must be a chute source .* got str 'data/'"),
        ({"models": [score]}, "models must be chute.Model objects, got function .*chute.Model"),
    ],
)
def test_a_part_of_the_wrong_kind_is_named(part: dict[str, Any], message: str) -> None:
    """These were AttributeErrors from inside planning ('str' object has no attribute...)."""
    fields: dict[str, Any] = {"source": TableSource(_table()), "models": [Model("a", score)]}
    with pytest.raises(ConfigError, match=message):
        Job(**{**fields, **part})


def test_constructor_arguments_beside_an_adapter_are_refused() -> None:
    """They went nowhere: the adapter ran with its defaults."""
    from chute import adapter

    spec = adapter("sklearn", path="clf.skops")
    with pytest.raises(ConfigError, match=r"adapter takes its options in chute\.adapter"):
        Model("clf", spec, kwargs={"threshold": 0.9})


# -- fingerprint -------------------------------------------------------------------------


def _job(**changes: Any) -> Job:
    fields: dict[str, Any] = {
        "source": TableSource(_table()),
        "models": (Model("a", score, inputs=("x",)),),
        "carryover": ("z",),
        "output": Sink("out"),
    }
    fields.update(changes)
    return Job(**fields)


def test_fingerprint_is_stable() -> None:
    first = _job().fingerprint()
    assert first == _job().fingerprint()
    assert len(first) == 16
    int(first, 16)


def test_fingerprint_ignores_what_does_not_change_the_output() -> None:
    base = _job().fingerprint()
    tuned = Model("a", score, inputs=("x",), batch_size=7, pool=Pool.fixed(2),
                  resources=Resources(cpus=0.5))  # fmt: skip
    assert _job(models=(tuned,)).fingerprint() == base
    assert _job(output=Sink("elsewhere")).fingerprint() == base
    assert _job(engine="local").fingerprint() == base


def test_fingerprint_of_file_source_is_stable(tmp_path: Any) -> None:
    path = tmp_path / "a.csv"
    path.write_text("x,z\n1,2\n")
    one = _job(source=FileSource(str(path))).fingerprint()
    two = _job(source=FileSource(str(path))).fingerprint()
    assert one == two


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"models": (Model("a", score, inputs=("x",)), Model("b", score))},
                     id="another-model"),
        pytest.param({"models": (Model("b", score, inputs=("x",)),)}, id="renamed-model"),
        pytest.param({"models": (Model("a", other_score, inputs=("x",)),)}, id="other-function"),
        pytest.param({"models": (Model("a", "pkg.mod:fn", inputs=("x",)),)}, id="import-string"),
        pytest.param({"models": (Model("a", score, inputs=("z",)),)}, id="model-inputs"),
        pytest.param({"models": (Model("a", score, inputs=("x",), batch_format="numpy"),)},
                     id="batch-format"),
        pytest.param({"models": (Model("a", Scorer, inputs=("x",), args=(2.0,)),)},
                     id="class"),
        pytest.param({"carryover": ("x", "z")}, id="carryover"),
        pytest.param({"carryover": ()}, id="no-carryover"),
        pytest.param({"source": TableSource(_table(5))}, id="input-rows"),
        pytest.param({"output": Sink("out", "csv")}, id="output-format"),
        pytest.param({"preprocess": Preprocess(other_score)}, id="preprocess"),
    ],
)  # fmt: skip
def test_fingerprint_changes_with_the_job(changes: dict[str, Any]) -> None:
    assert _job(**changes).fingerprint() != _job().fingerprint()


def test_fingerprint_changes_with_constructor_arguments() -> None:
    def job(*args: Any, **kwargs: Any) -> str:
        model = Model("a", Scorer, inputs=("x",), args=args, kwargs=kwargs)
        return _job(models=(model,)).fingerprint()

    assert job(2.0) == job(2.0)
    assert job(2.0) != job(3.0)
    assert job(factor=2.0) != job(factor=3.0)
    small = np.zeros((1000, 10), dtype=np.float32)
    assert job(small) != job(np.ones((1000, 10), dtype=np.float32))  # hashed by content
    assert job(weights={"w": small}) != job(weights={"w": small + 1})  # inside a mapping too
    assert job(weights={"w": small}) == job(weights={"w": small.copy()})


def test_big_arrays_are_described_by_shape_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("chute.job.fingerprint.HASHED_ARRAY_BYTES", 1000)

    def job(*args: Any) -> str:
        return _job(models=(Model("a", Scorer, inputs=("x",), args=args),)).fingerprint()

    big = np.zeros((1000, 10), dtype=np.float32)
    assert job(big) == job(np.ones((1000, 10), dtype=np.float32))
    assert job(big) != job(np.zeros((1000, 11), dtype=np.float32))


def test_torch_weights_are_hashed_by_content() -> None:
    torch = pytest.importorskip("torch")

    def job(state: Any) -> str:
        model = Model("a", Scorer, inputs=("x",), kwargs={"state_dict": state})
        return _job(models=(model,)).fingerprint()

    weights = {"w": torch.zeros(64, 10)}
    assert job(weights) == job({"w": torch.zeros(64, 10)})
    assert job(weights) != job({"w": torch.ones(64, 10)})


def test_fingerprint_changes_with_the_input_files(tmp_path: Any) -> None:
    (tmp_path / "a.csv").write_text("x,z\n1,2\n")
    (tmp_path / "b.csv").write_text("x,z\n1,2\n")
    one = _job(source=FileSource(str(tmp_path / "a.csv"))).fingerprint()
    two = _job(source=FileSource(str(tmp_path / "b.csv"))).fingerprint()
    both = _job(source=FileSource(str(tmp_path))).fingerprint()
    assert len({one, two, both}) == 3


def test_describe_names_the_callable_instance_by_its_class() -> None:
    job = _job(models=(Model("a", Scorer(2.0), inputs=("x",)),))
    assert job.describe()["models"][0]["fn"].split("#")[0].endswith(":Scorer")


def test_fingerprint_changes_when_a_model_function_is_edited() -> None:
    def first(batch: Any) -> Any:
        return batch

    def second(batch: Any) -> Any:
        return batch.slice(0)

    second.__qualname__ = first.__qualname__
    one = _job(models=(Model("a", first, inputs=("x",)),)).fingerprint()
    two = _job(models=(Model("a", second, inputs=("x",)),)).fingerprint()
    assert one != two


def test_fingerprint_changes_with_in_memory_content_of_the_same_shape() -> None:
    one = _job(source=TableSource(pa.table({"x": [1, 2, 3], "z": [4, 5, 6]}))).fingerprint()
    two = _job(source=TableSource(pa.table({"x": [1, 2, 9], "z": [4, 5, 6]}))).fingerprint()
    assert one != two


def test_fingerprint_changes_when_an_input_file_is_rewritten(tmp_path: Any) -> None:
    path = tmp_path / "a.csv"
    path.write_text("x,z\n1,2\n")
    one = _job(source=FileSource(str(path))).fingerprint()
    path.write_text("x,z\n1,2\n3,4\n")
    assert _job(source=FileSource(str(path))).fingerprint() != one


def test_trusting_a_pickle_is_not_a_change_of_job(tmp_path: Any) -> None:
    from chute.models import adapter

    (tmp_path / "m.skops").write_bytes(b"x")

    def job(**options: Any) -> str:
        spec = adapter("sklearn", path=str(tmp_path / "m.skops"), **options)
        return _job(models=(Model("a", spec, inputs=("x",)),)).fingerprint()

    assert job() == job(trust_pickle=True)
    assert job() != job(method="predict_proba")
