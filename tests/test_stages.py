"""Stage logic without any engine: row keys, model loading, batch formats and outputs."""

from __future__ import annotations

import gc
import itertools
import sys
import textwrap
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chute import ConfigError, Model, ModelError, Preprocess
from chute.stages import (
    KEY,
    ROW_BITS,
    ModelStage,
    PreprocessStage,
    decode,
    tag,
    to_columns,
)
from chute.usercode import import_string

# -- row keys ----------------------------------------------------------------------------


def _keys(table: pa.Table) -> np.ndarray:
    return table.column(KEY).to_numpy()


@pytest.mark.parametrize(
    ("unit", "start", "n", "unit_rows"),
    [
        pytest.param(0, 0, 5, 5, id="whole-unit"),
        pytest.param(3, 0, 4, 10, id="first-slice"),
        pytest.param(3, 6, 4, 10, id="last-slice"),
        pytest.param(7, 2, 3, None, id="total-unknown"),
        pytest.param(2**20, 2**39, 3, 2**39 + 3, id="large-indexes"),
        pytest.param(1, 0, 1, 1, id="single-row"),
    ],
)
def test_tag_decode_round_trip(unit: int, start: int, n: int, unit_rows: int | None) -> None:
    table = tag(pa.table({"x": np.arange(n)}), unit, start, unit_rows)
    assert table.column_names == ["x", KEY]
    assert table.schema.field(KEY).type == pa.int64()
    units, rows, last = decode(_keys(table))
    assert units.tolist() == [unit] * n
    assert rows.tolist() == list(range(start, start + n))
    is_last = unit_rows is not None and start + n == unit_rows
    assert last.tolist() == [False] * (n - 1) + [is_last]


def test_only_the_last_row_of_a_unit_is_marked() -> None:
    table = tag(pa.table({"x": np.arange(3)}), 5, 0, 3)
    keys = _keys(table)
    assert (keys[:2] >= 0).all()
    assert keys[2] == -((5 << ROW_BITS) + 2) - 1


def test_tag_empty_table() -> None:
    table = tag(pa.table({"x": pa.array([], pa.int64())}), 1, 0, 0)
    assert table.num_rows == 0
    assert table.column_names == ["x", KEY]


def test_keys_of_different_units_never_collide() -> None:
    a = _keys(tag(pa.table({"x": np.arange(4)}), 0, 0, 4))
    b = _keys(tag(pa.table({"x": np.arange(4)}), 1, 0, 4))
    assert not set(a.tolist()) & set(b.tolist())


# -- loading models ----------------------------------------------------------------------


def _batch(n: int = 4) -> pa.Table:
    table = pa.table(
        {
            "x": np.arange(n, dtype=np.int64),
            "y": np.arange(n, dtype=np.float64) / 2,
            "name": [f"r{i}" for i in range(n)],
        }
    )
    return tag(table, 0, 0, n)


def double_x(batch: pa.Table) -> dict[str, Any]:
    return {"double": np.asarray(batch.column("x")) * 2}


class Counting:
    """A model class that records how often it was constructed."""

    constructed = 0

    def __init__(self, offset: int, *, scale: int = 1) -> None:
        type(self).constructed += 1
        self.offset = offset
        self.scale = scale

    def __call__(self, batch: pa.Table) -> np.ndarray:
        return np.asarray(batch.column("x")) * self.scale + self.offset


def test_function_model() -> None:
    stage = ModelStage(Model("m", double_x), ["x"])
    out = stage(_batch())
    assert out.column("m_double").to_pylist() == [0, 2, 4, 6]
    assert out.column_names == ["x", "y", "name", KEY, "m_double"]
    assert _keys(out).tolist() == _keys(_batch()).tolist()


def test_class_model_is_constructed_once_with_its_arguments() -> None:
    Counting.constructed = 0
    model = Model("m", Counting, args=(10,), kwargs={"scale": 3})
    stage = ModelStage(model, ["x"])
    assert Counting.constructed == 1
    first = stage(_batch())
    second = stage(_batch(2))
    assert Counting.constructed == 1
    assert first.column("m").to_pylist() == [10, 13, 16, 19]
    assert second.column("m").to_pylist() == [10, 13]
    assert (stage.clock.batches, stage.clock.rows) == (2, 6)


def test_ctor_override_replaces_model_arguments() -> None:
    Counting.constructed = 0
    model = Model("m", Counting, args=(10,))
    stage = ModelStage(model, ["x"], target=Counting, ctor=((100,), {"scale": 0}))
    assert stage(_batch(2)).column("m").to_pylist() == [100, 100]
    assert Counting.constructed == 1


def test_a_dropped_stage_frees_its_model_without_the_cycle_collector() -> None:
    """A replica's model (maybe gigabytes) goes with its stage at once: the stage holds no
    reference to itself, so the next run's copy never loads beside the last one."""
    stage = ModelStage(Model("m", Counting, args=(1,)), ["x"])
    stage(_batch(2))
    model = weakref.ref(stage._fn)
    gc.disable()
    try:
        del stage
        assert model() is None
    finally:
        gc.enable()


def test_callable_instance_model_is_used_as_is() -> None:
    Counting.constructed = 0
    instance = Counting(5)
    stage = ModelStage(Model("m", instance), ["x"])
    assert Counting.constructed == 1
    assert stage(_batch(3)).column("m").to_pylist() == [5, 6, 7]


def test_class_constructor_failure_is_a_model_error() -> None:
    class Broken:
        def __init__(self) -> None:
            raise RuntimeError("weights missing")

        def __call__(self, batch: Any) -> Any:
            return batch

    with pytest.raises(
        ModelError, match=r"model 'm' failed to load: RuntimeError: weights missing"
    ):
        ModelStage(Model("m", Broken), ["x"])


def test_args_for_a_function_are_refused() -> None:
    with pytest.raises(ConfigError, match="args/kwargs are constructor arguments"):
        ModelStage(Model("m", double_x, args=(1,)), ["x"])


def test_non_callable_target_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not callable"):
        ModelStage(Model("m", 42), ["x"])  # type: ignore[arg-type]


def test_class_without_call_is_refused() -> None:
    class NoCall:
        pass

    with pytest.raises(ConfigError, match="NoCall has no __call__"):
        ModelStage(Model("m", NoCall), ["x"])


_names = (f"chute_test_mod_{i}" for i in itertools.count())


@pytest.fixture
def module_name() -> Iterator[str]:
    """A fresh module name, removed from sys.modules and sys.path afterwards."""
    name = next(_names)
    saved_path = list(sys.path)
    yield name
    sys.path[:] = saved_path
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


MODULE_SOURCE = textwrap.dedent(
    """
    import numpy as np

    def triple(batch):
        return {"t": np.asarray(batch.column("x")) * 3}

    class Add:
        def __init__(self, n):
            self.n = n

        def __call__(self, batch):
            return np.asarray(batch.column("x")) + self.n
    """
)


def test_import_string_package_module(
    tmp_path: Path, module_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / module_name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(MODULE_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    stage = ModelStage(Model("m", f"{module_name}.models:triple"), ["x"])
    assert stage(_batch(3)).column("m_t").to_pylist() == [0, 3, 6]
    cls_stage = ModelStage(Model("k", f"{module_name}.models:Add", args=(1,)), ["x"])
    assert cls_stage(_batch(3)).column("k").to_pylist() == [1, 2, 3]


def test_import_string_file_path(tmp_path: Path, module_name: str) -> None:
    path = tmp_path / f"{module_name}.py"
    path.write_text(MODULE_SOURCE)
    stage = ModelStage(Model("m", f"{path}:triple"), ["x"])
    assert stage(_batch(3)).column("m_t").to_pylist() == [0, 3, 6]
    assert import_string(f"{path}:Add") is import_string(f"{path}:Add")  # loaded once


def test_import_string_relative_file_path(
    tmp_path: Path, module_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{module_name}.py").write_text(MODULE_SOURCE)
    monkeypatch.chdir(tmp_path)
    stage = ModelStage(Model("m", f"models/{module_name}.py:Add", args=(10,)), ["x"])
    assert stage(_batch(2)).column("m").to_pylist() == [10, 11]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        pytest.param("no_colon_here", "write it as 'package.module:name'", id="no-colon"),
        pytest.param("pkg.mod:", "write it as 'package.module:name'", id="no-attr"),
        pytest.param(":attr", "write it as 'package.module:name'", id="no-module"),
        pytest.param("chute_no_such_module_xyz:fn", "no module named 'chute_no_such_module_xyz'",
                     id="missing-module"),
        pytest.param("chute.demo:no_such_attr", "has no attribute 'no_such_attr'",
                     id="missing-attr"),
    ],
)  # fmt: skip
def test_import_string_errors(target: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        import_string(target)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param("raise RuntimeError('no weights')", "RuntimeError: no weights", id="raises"),
        pytest.param("def broken(:\n", "SyntaxError", id="syntax-error"),
    ],
)
def test_import_string_module_that_fails_is_a_model_error(
    tmp_path: Path, module_name: str, body: str, error: str
) -> None:
    path = tmp_path / f"{module_name}.py"
    path.write_text(body)
    for _ in range(2):  # the half-run module is not cached: the second try fails the same way
        with pytest.raises(ModelError, match=f"importing .* raised {error}"):
            import_string(f"{path}:fn")
    assert module_name not in sys.modules


def test_import_string_fixed_file_is_reloaded(tmp_path: Path, module_name: str) -> None:
    path = tmp_path / f"{module_name}.py"
    path.write_text("raise RuntimeError('not yet')")
    with pytest.raises(ModelError):
        import_string(f"{path}:fn")
    path.write_text("def fn(batch):\n    return batch\n")
    assert callable(import_string(f"{path}:fn"))


def test_missing_file_leaves_no_module_behind(tmp_path: Path, module_name: str) -> None:
    with pytest.raises(ConfigError, match=r"does not exist\. A target is"):
        import_string(f"{tmp_path / module_name}.py:fn")
    assert module_name not in sys.modules


def test_import_string_existing_module() -> None:
    from chute.demo import tip_model

    assert import_string("chute.demo:tip_model") is tip_model


# -- batch formats -----------------------------------------------------------------------


def _fsl_batch() -> pa.Table:
    flat = pa.array(np.arange(6, dtype=np.float32))
    table = pa.table({"x": np.arange(3), "v": pa.FixedSizeListArray.from_arrays(flat, 2)})
    return tag(table, 0, 0, 3)


def test_pyarrow_batch_format() -> None:
    seen: list[Any] = []

    def fn(batch: Any) -> Any:
        seen.append(batch)
        return np.zeros(batch.num_rows)

    ModelStage(Model("m", fn, batch_format="pyarrow"), ["x", "v"])(_fsl_batch())
    assert isinstance(seen[0], pa.Table)
    assert seen[0].column_names == ["x", "v"]


def test_pandas_batch_format() -> None:
    seen: list[Any] = []

    def fn(batch: Any) -> Any:
        seen.append(batch)
        return batch["x"] + 1

    out = ModelStage(Model("m", fn, batch_format="pandas"), ["x"])(_fsl_batch())
    assert isinstance(seen[0], pd.DataFrame)
    assert list(seen[0].columns) == ["x"]
    assert out.column("m").to_pylist() == [1, 2, 3]


def test_numpy_batch_format() -> None:
    seen: list[Any] = []

    def fn(batch: Any) -> Any:
        seen.append(batch)
        return batch["v"].sum(axis=1)

    out = ModelStage(Model("m", fn, batch_format="numpy"), ["x", "v"])(_fsl_batch())
    batch = seen[0]
    assert isinstance(batch, dict)
    assert set(batch) == {"x", "v"}
    assert all(isinstance(v, np.ndarray) for v in batch.values())
    assert batch["v"].shape == (3, 2)
    assert batch["v"].dtype == np.float32
    assert out.column("m").to_pylist() == [1.0, 5.0, 9.0]


def test_model_sees_only_its_inputs() -> None:
    seen: list[list[str]] = []

    def fn(batch: pa.Table) -> Any:
        seen.append(batch.column_names)
        return np.asarray(batch.column("y")) + 1

    out = ModelStage(Model("m", fn), ["y"])(_batch())
    assert seen == [["y"]]
    assert out.column_names == ["x", "y", "name", KEY, "m"]
    assert out.column("x").to_pylist() == [0, 1, 2, 3]
    assert out.column("name").to_pylist() == ["r0", "r1", "r2", "r3"]


def test_model_exception_becomes_model_error() -> None:
    def fn(batch: Any) -> Any:
        raise KeyError("pasenger_count")

    with pytest.raises(ModelError, match=r"model 'm' raised KeyError: 'pasenger_count'") as info:
        ModelStage(Model("m", fn), ["x"])(_batch())
    assert isinstance(info.value.__cause__, KeyError)


# -- output normalisation ----------------------------------------------------------------


def _run(out: Any, n: int = 4, name: str = "m") -> pa.Table:
    return ModelStage(Model(name, lambda batch: out), ["x"])(_batch(n))


def _added(table: pa.Table) -> list[str]:
    return table.column_names[4:]


def test_dict_output_gets_prefixed_columns() -> None:
    table = _run({"score": np.ones(4), "label": ["a", "b", "c", "d"]}, name="tip")
    assert _added(table) == ["tip_score", "tip_label"]
    assert table.column("tip_label").to_pylist() == ["a", "b", "c", "d"]


def test_single_array_gets_the_bare_model_name() -> None:
    table = _run(np.arange(4, dtype=np.float32), name="tip")
    assert _added(table) == ["tip"]
    assert table.schema.field("tip").type == pa.float32()


def test_list_output_is_a_single_column() -> None:
    assert _run([1, 2, 3, 4]).column("m").to_pylist() == [1, 2, 3, 4]


def test_2d_array_becomes_fixed_size_list() -> None:
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = _run({"emb": values})
    field = table.schema.field("m_emb")
    assert pa.types.is_fixed_size_list(field.type)
    assert field.type.list_size == 3
    assert field.type.value_type == pa.float32()
    assert table.column("m_emb").to_pylist()[1] == [3.0, 4.0, 5.0]


def test_non_contiguous_2d_array_keeps_rows() -> None:
    values = np.arange(12, dtype=np.int64).reshape(3, 4).T  # Fortran order, shape (4, 3)
    table = _run(values)
    assert table.column("m").to_pylist() == values.tolist()


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00"


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ([PNG, b"x\x00", b"\x00"], [PNG, b"x\x00", b"\x00"]),  # a list of bytes, as made
        (np.array([b"ab\x00cd", b"x", b""]), [b"ab\x00cd", b"x", b""]),  # NumPy's own
        (["a\x00b", "c\x00", "d"], ["a\x00b", "c\x00", "d"]),
        ([["a\x00", "b"], ["c", "d"], ["e", "f"]], [["a\x00", "b"], ["c", "d"], ["e", "f"]]),
    ],
    ids=["bytes", "numpy-bytes", "text", "text-rows"],
)
def test_bytes_and_text_keep_every_byte(out: Any, expected: Any) -> None:
    """Through NumPy's fixed-width arrays Arrow read each value up to its first NUL: a
    generated PNG was written as its first 8 bytes, a float32 embedding's bytes as b''."""
    assert _run(out, 3).column("m").to_pylist() == expected


@pytest.mark.parametrize(
    ("series", "kind", "expected"),
    [
        (
            pd.Series([2**53 + 1, None, 2**63 - 1], dtype="Int64"),
            pa.int64(),
            [2**53 + 1, None, 2**63 - 1],
        ),
        (pd.Series([2**64 - 1, None, 0], dtype="UInt64"), pa.uint64(), [2**64 - 1, None, 0]),
        (pd.Series([1.5, None, 2.0], dtype="Float64"), pa.float64(), [1.5, None, 2.0]),
        (pd.Series([True, None, False], dtype="boolean"), pa.bool_(), [True, None, False]),
        (pd.Series(["a", None, "c"]), pa.string(), ["a", None, "c"]),
        (pd.Series(["a", None, "a"], dtype="category"), pa.string(), ["a", None, "a"]),
        (pd.Series([1.0, float("nan"), 2.0]), pa.float64(), [1.0, "nan", 2.0]),  # NaN: a number
    ],
    ids=["Int64", "UInt64", "Float64", "boolean", "str", "category", "float64"],
)
@pytest.mark.parametrize("how", ["series", "frame"])
def test_pandas_outputs_keep_their_values_and_nulls(
    series: pd.Series, kind: pa.DataType, expected: list[Any], how: str
) -> None:
    """Through NumPy an ``Int64`` column with ``<NA>`` became float64 (2**53 + 1 rounded,
    2**63 - 1 written as 2**63), and text or ``boolean`` with a missing value failed."""
    out = series if how == "series" else pd.DataFrame({"y": series})
    column = _run(out, 3).column("m" if how == "series" else "m_y")
    assert column.type == kind
    got = ["nan" if isinstance(v, float) and v != v else v for v in column.to_pylist()]
    assert got == expected


def test_a_zoned_pandas_output_keeps_its_nanoseconds() -> None:
    times = pd.Series(pd.to_datetime(["2020-01-01 00:00:00.000000001", None, None]))
    column = _run(times.dt.tz_localize("UTC"), 3).column("m")
    assert column.type == pa.timestamp("ns", tz="UTC")
    assert column[0].value == 1577836800000000001 and column.null_count == 2


class _StaticOut:
    """Writes each call's results into one buffer it keeps, and returns a view of it (a
    static output tensor, ``out=``)."""

    def __init__(self) -> None:
        self.out = np.zeros(64)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch["x"])
        np.multiply(batch["x"], 2.0, out=self.out[:n])
        return {"y": self.out[:n]}


@pytest.mark.parametrize("failing", [False, True])
def test_a_model_that_refills_one_buffer_gives_each_row_its_own_value(failing: bool) -> None:
    """Arrow wraps a model's array without a copy: the calls over one batch (its rows cut
    at the batch size, on Ray a block's; a failing row bisected out) kept views of one
    buffer, and every row held the last call's values, with the run complete."""
    model = _StaticOut()

    def fn(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if failing and (batch["x"] == 5).any():
            raise ValueError("a bad row")
        return model(batch)

    spec = Model("m", fn, batch_format="numpy", batch_size=2, on_error="quarantine")
    table = ModelStage(spec, ["x"])(_batch(8))
    values = table.column("m_y").to_pylist()
    x = table.column("x").to_pylist()
    assert values == [None if failing and v == 5 else v * 2.0 for v in x]


def test_masked_values_are_nulls_not_their_fill_data() -> None:
    """``np.asarray`` drops a masked array's mask: the values hidden under it were written
    as if the model had returned them."""
    scores = np.ma.masked_array([0.5, 9.9, 0.7, 0.1], mask=[0, 1, 0, 0])
    assert _run({"s": scores}).column("m_s").to_pylist() == [0.5, None, 0.7, 0.1]
    grid = np.ma.masked_array(np.arange(8.0).reshape(4, 2), mask=[[0, 1]] + [[0, 0]] * 3)
    assert _run(grid).column("m").to_pylist()[:2] == [[0.0, None], [2.0, 3.0]]


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        pytest.param([[1.0], [1.0, 2.0], [], [3.0]], [[1.0], [1.0, 2.0], [], [3.0]], id="lists"),
        pytest.param(
            [np.arange(i + 1) for i in range(4)],
            [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]],
            id="arrays",
        ),
        pytest.param([["a"], ["b", "c"], [], None], [["a"], ["b", "c"], [], None], id="text"),
        pytest.param("torch", [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]], id="torch-tensors"),
    ],
)
def test_rows_of_several_lengths_are_a_list_column(out: Any, expected: Any) -> None:
    """NumPy refuses ragged rows (``inhomogeneous shape``): a model that returns a
    varying number of values a row (entities, top-k labels, token ids) failed."""
    if out == "torch":
        torch = pytest.importorskip("torch")
        out = [torch.arange(i + 1) for i in range(4)]
    assert _run(out).column("m").to_pylist() == expected


def test_rows_of_one_length_then_of_several_say_how_to_return_lists() -> None:
    def topk(batch: dict[str, np.ndarray]) -> Any:
        if batch["x"][0] < 4:  # the first batch: two labels a row, by chance
            return [[0.5, 0.25]] * len(batch["x"])
        return [[0.5] * (int(v) % 3) for v in batch["x"]]

    with pytest.raises(ModelError, match=r"became a fixed-size list; return the rows as an Arrow"):
        _run_batches(topk, pa.table({"id": np.arange(8), "x": np.arange(8.0)}))


def test_masked_values_inside_a_list_are_nulls() -> None:
    """``np.asarray`` made ``np.ma.masked`` NaN and dropped the masks of rows' arrays."""
    masked = np.ma.masked
    assert _run([1.5, masked, 2.5, masked]).column("m").to_pylist() == [1.5, None, 2.5, None]
    assert _run({"n": [1, masked, 3, 4]}).column("m_n").to_pylist() == [1, None, 3, 4]
    rows = [np.ma.masked_array([i, i + 0.5], mask=[0, i % 2]) for i in range(4)]
    column = _run(rows).column("m")
    assert pa.types.is_fixed_size_list(column.type)  # as the same rows without masks
    assert column.to_pylist() == [[0, 0.5], [1, None], [2, 2.5], [3, None]]
    ragged = [np.ma.masked_array(np.arange(i + 1.0), mask=[1] + [0] * i) for i in range(4)]
    assert _run(ragged).column("m").to_pylist()[2] == [None, 1.0, 2.0]


@pytest.mark.parametrize(
    "out",
    [
        pytest.param({1: np.zeros(4), "1": np.ones(4)}, id="keys-alike-as-text"),
        pytest.param(pd.DataFrame([[1, 2]] * 4, columns=["a", "a"]), id="repeated-frame-column"),
    ],
)
def test_two_outputs_of_one_name_are_refused_not_merged(out: Any) -> None:
    """The second replaced the first (a dict), or both became one list column (a frame)."""
    with pytest.raises(ModelError, match=r"two outputs that both become the column 'm_"):
        _run(out)


def test_dataframe_output_gets_prefixed_columns() -> None:
    frame = pd.DataFrame({"a": [1, 2, 3, 4], "b": [0.5, 1.5, 2.5, 3.5]})
    table = _run(frame)
    assert _added(table) == ["m_a", "m_b"]
    assert table.column("m_b").to_pylist() == [0.5, 1.5, 2.5, 3.5]


def test_arrow_table_and_arrays_output() -> None:
    out = pa.table({"a": pa.chunked_array([[1, 2], [3, 4]]), "b": pa.array(["w", "x", "y", "z"])})
    table = _run(out)
    assert _added(table) == ["m_a", "m_b"]
    assert table.column("m_a").to_pylist() == [1, 2, 3, 4]
    assert _run(pa.array([9, 8, 7, 6])).column("m").to_pylist() == [9, 8, 7, 6]


def test_torch_tensor_output() -> None:
    torch = pytest.importorskip("torch")
    out = {"p": torch.arange(4, dtype=torch.float32, requires_grad=True) * 2}
    table = _run(out)
    assert table.column("m_p").to_pylist() == [0.0, 2.0, 4.0, 6.0]
    emb = _run(torch.ones(4, 2))
    assert emb.schema.field("m").type.list_size == 2


@pytest.mark.parametrize(
    "out",
    [
        pytest.param(np.zeros(3), id="array-short"),
        pytest.param({"a": np.zeros(4), "b": np.zeros(5)}, id="dict-one-long"),
        pytest.param(pd.DataFrame({"a": [1]}), id="dataframe-short"),
        pytest.param(np.zeros((2, 8)), id="2d-short"),
    ],
)
def test_wrong_length_is_a_clear_model_error(out: Any) -> None:
    with pytest.raises(ModelError) as info:
        _run(out)
    text = str(info.value)
    assert text.startswith("model 'm' returned")
    assert "but the batch has 4 rows: return one value per input row." in text


def test_wrong_length_message_names_the_column() -> None:
    with pytest.raises(ModelError, match=r"returned 5 values for column 'm_b' but the batch has 4"):
        _run({"a": np.zeros(4), "b": np.zeros(5)})


def test_unconvertible_output_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="cannot turn output 'm_x' into a column"):
        _run({"x": [object(), object(), object(), object()]})


def test_unnamed_output_without_prefix_is_refused() -> None:
    with pytest.raises(ModelError, match="must return named columns"):
        to_columns(np.zeros(2), None, 2, "preprocess")


# -- preprocess --------------------------------------------------------------------------


def test_preprocess_adds_and_replaces_columns() -> None:
    seen: list[Any] = []

    def fn(batch: pd.DataFrame) -> dict[str, Any]:
        seen.append(batch)
        return {"y": batch["y"] * 10, "x_sq": batch["x"] ** 2}

    stage = PreprocessStage(Preprocess(fn, batch_format="pandas"), ["x", "y"], protected=["name"])
    out = stage(_batch())
    assert isinstance(seen[0], pd.DataFrame)
    assert list(seen[0].columns) == ["x", "y"]
    assert out.column_names == ["x", "y", "name", KEY, "x_sq"]
    assert out.column("y").to_pylist() == [0.0, 5.0, 10.0, 15.0]
    assert out.column("x_sq").to_pylist() == [0, 1, 4, 9]
    assert _keys(out).tolist() == _keys(_batch()).tolist()
    assert stage.clock.rows == 4


def test_preprocess_refuses_to_replace_a_carryover_column() -> None:
    stage = PreprocessStage(Preprocess(lambda b: {"x": np.zeros(b.num_rows)}), ["x"], ["x"])
    with pytest.raises(ConfigError, match="preprocess returned column 'x', which is a carryover"):
        stage(_batch())


def test_a_carried_column_returned_as_another_type_says_which() -> None:
    """pandas makes an integer column holding a null float64: the refusal said only "with
    other values", for values the step never changed."""

    def whole(frame: pd.DataFrame) -> pd.DataFrame:
        frame["f"] = 1.0
        return frame

    stage = PreprocessStage(Preprocess(whole, batch_format="pandas"), ["x"], ["x"])
    batch = _batch().set_column(0, "x", pa.array([1, None, 3, 4], pa.int64()))
    with pytest.raises(ConfigError, match=r"'x'.* other values \(as double, read as int64\)"):
        stage(batch)


def test_a_model_input_nothing_makes_is_a_config_error_not_the_models() -> None:
    """With a preprocess step the plan cannot check a model's inputs: a name nothing makes
    failed inside the model's call as its KeyError (exit 4; under quarantine every row
    bisected into _errors/)."""
    stage = ModelStage(Model("a", lambda b: b["b_y"], on_error="quarantine"), ["b_y"])
    with pytest.raises(ConfigError, match=r"model 'a' reads 'b_y', which the batch does not"):
        stage(_batch())


def test_a_frame_returned_whole_keeps_its_carried_columns_as_read() -> None:
    """``df["f"] = ...; return df`` with a carried column in the frame was refused as a
    replacement of that column."""

    def whole(frame: pd.DataFrame) -> pd.DataFrame:
        frame["x_sq"] = frame["x"] ** 2
        return frame

    stage = PreprocessStage(Preprocess(whole, batch_format="pandas"), ["x", "y"], ["x", "y"])
    batch = _batch().set_column(1, "y", pa.array([0.5, float("nan"), None, 1.5]))
    out = stage(batch)
    assert out.column("x").to_pylist() == [0, 1, 2, 3]
    assert out.column("x_sq").to_pylist() == [0, 1, 4, 9]
    assert str(out.column("y").to_pylist()) == "[0.5, nan, None, 1.5]"  # as read


def test_a_step_that_fills_one_buffer_every_call_does_not_rewrite_earlier_batches() -> None:
    """NumPy's values became Arrow's without a copy: batches waiting for the models still
    pointed at the buffer the next call filled (15,000 rows of 20,000 wrong in a review)."""
    buffer = np.empty(8)

    def fill(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch["x"])
        np.add(batch["x"], 1.0, out=buffer[:n])
        return {"x1": buffer[:n]}

    stage = PreprocessStage(Preprocess(fill, batch_format="numpy"), ["x"], [])
    first = stage(_batch())
    stage(_batch().set_column(0, "x", pa.array([10, 11, 12, 13])))
    assert first.column("x1").to_pylist() == [1.0, 2.0, 3.0, 4.0]


def test_preprocess_refuses_to_replace_the_row_key() -> None:
    stage = PreprocessStage(Preprocess(lambda b: {KEY: np.zeros(b.num_rows)}), ["x"], [])
    with pytest.raises(ConfigError):
        stage(_batch())


def test_preprocess_error_is_a_model_error() -> None:
    stage = PreprocessStage(Preprocess(lambda b: 1 / 0), ["x"], [])
    with pytest.raises(ModelError, match="preprocess raised ZeroDivisionError"):
        stage(_batch())


def test_a_model_that_returns_none_is_told_what_to_return() -> None:
    with pytest.raises(ModelError) as info:
        to_columns(None, "m", 3, "model 'm'")
    assert str(info.value) == (
        "model 'm' returned None; return a dict of columns, a DataFrame, an Arrow table or an "
        "array."
    )


def none_below_five(batch: dict[str, np.ndarray]) -> dict[str, list[int | None]]:
    return {"label": [None if v < 5 else int(v) for v in batch["x"]]}


@pytest.mark.parametrize("batch_size", [10, 5, 3])
def test_a_call_of_all_nulls_takes_the_type_of_the_others(batch_size: int) -> None:
    """A model returns None for some rows: a call whose rows are all such gives Arrow's null
    type, and joining it to a call that gave int64 raised ``ArrowInvalid`` — so a batch cut
    in calls (a size, a memory split, a failure isolated) failed where one call did not."""
    import chute
    from chute.stages import ModelStage, tag

    model = chute.Model(
        "m", none_below_five, inputs=("x",), batch_format="numpy", batch_size=batch_size
    )
    out = ModelStage(model, ["x"])(tag(pa.table({"x": np.arange(10)}), 0, 0, 10))
    assert out.column("m_label").type == pa.int64()
    assert out.column("m_label").to_pylist() == [None] * 5 + [5, 6, 7, 8, 9]


# --------------------------------------------------------------------------- one output type


def _run_batches(fn: Any, table: pa.Table, batch_format: str = "numpy") -> pa.Table:
    import chute

    job = chute.Job(
        source=chute.TableSource(table, unit_rows=8),  # one unit: its batches in order
        models=(Model("m", fn, batch_format=batch_format, batch_size=4),),  # type: ignore[arg-type]
        carryover=("id",),
        engine="local",
    )
    report = job.run()
    assert report.result is not None
    return report.result


def test_an_output_column_whose_type_changes_between_batches_is_an_error_naming_it() -> None:
    """NumPy makes an integer column with a null float64 in that batch only: the first
    batch's int64 and a later batch's float64 went to one file (a ValueError about the
    file's schema) or to files that disagree (pandas could not read the output back)."""
    x = pa.array([1, 2, 3, 4, 5, None, 7, 8], pa.int64())
    table = pa.table({"id": range(8), "x": x})
    with pytest.raises(ModelError, match=r"returned 'm_y' as double in this batch and as int64"):
        _run_batches(lambda b: {"y": b["x"] * 2}, table)
    floats_first = pa.table({"id": range(8), "x": pa.array([None, 2, 3, 4, 5, 6, 7, 8])})
    got = _run_batches(lambda b: {"y": b["x"] * 2}, floats_first)  # ints fit float64 exactly
    assert got.schema.field("m_y").type == pa.float64()
    assert got.sort_by("id").column("m_y").to_pylist()[1:] == [4.0, 6.0, 8.0, 10, 12, 14, 16]


@pytest.mark.parametrize(
    ("first", "later", "types"),
    [
        pytest.param(
            pa.array([["a"]] * 4),
            pa.array([[2139]] * 4),
            r"list<item: int64> in this batch and as list<item: string>",
            id="list-of-numbers-after-list-of-text",
        ),
        pytest.param(
            pa.array([0] * 4, pa.timestamp("s")),
            pa.array([0] * 4, pa.timestamp("s", "+02:00")),
            r"timestamp\[s, tz=\+02:00\] in this batch and as timestamp\[s\]",
            id="zoned-after-naive",
        ),
        pytest.param(
            pa.array([{"a": 1}] * 4),
            pa.array([{"a": 1, "b": 2}] * 4),
            r"struct<a: int64, b: int64> in this batch and as struct<a: int64>",
            id="struct-with-a-field-more",  # cast to the first, b would be dropped
        ),
    ],
)
def test_an_output_whose_nested_or_zoned_type_changes_between_batches_is_an_error(
    first: pa.Array, later: pa.Array, types: str
) -> None:
    """Cast to the first batch's type, the later batch's numbers were text ('2139'), its
    times naive (shifted by their zone) or a struct field it added dropped."""
    table = pa.table({"id": range(8), "x": range(8)})

    def changes(batch: pa.Table) -> dict[str, Any]:
        return {"y": first if batch.column("x")[0].as_py() < 4 else later}

    with pytest.raises(ModelError, match=rf"returned 'm_y' as {types}"):
        _run_batches(changes, table, "pyarrow")


def test_a_batch_of_dicts_without_an_optional_key_has_it_null() -> None:
    """As pyarrow does for a row without the key within one batch: the field is null."""
    table = pa.table({"id": range(8), "x": range(8)})

    def tags(batch: pa.Table) -> dict[str, Any]:
        if batch.column("x")[0].as_py() < 4:
            return {"y": pa.array([{"a": 1, "b": "x"}] * 4)}
        return {"y": pa.array([{"a": 2}] * 4)}

    got = _run_batches(tags, table, "pyarrow").sort_by("id").column("m_y").to_pylist()
    assert got == [{"a": 1, "b": "x"}] * 4 + [{"a": 2, "b": None}] * 4


def test_output_columns_that_change_between_batches_are_an_error_naming_them() -> None:
    table = pa.table({"id": range(8), "x": range(8)})

    def extra_later(batch: pa.Table) -> dict[str, Any]:
        out = {"y": batch.column("x")}
        return out if batch.column("x")[0].as_py() < 4 else {**out, "z": batch.column("x")}

    with pytest.raises(ModelError, match="the columns m_y, m_z in this batch and m_y in an"):
        _run_batches(extra_later, table, "pyarrow")
