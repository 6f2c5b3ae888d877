"""``chute.predict`` gives a bare function batches of the data's own type, and a Report
prints itself (text, rich, Jupyter)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import chute
from chute.report import Report, StageStats


@pytest.mark.timeout(60)
def test_the_readme_one_liner_gets_pandas() -> None:
    pandas_df = pd.DataFrame({"x": [1, 2, 3]})
    df = chute.predict(pandas_df, lambda batch: batch["x"] * 2)
    assert df["prediction"].tolist() == [2, 4, 6]
    assert df["x"].tolist() == [1, 2, 3]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("data", "kind"),
    [
        pytest.param(pd.DataFrame({"x": [1.0, 2.0]}), pd.DataFrame, id="pandas"),
        pytest.param({"x": np.array([1.0, 2.0])}, dict, id="numpy"),
        pytest.param(pa.table({"x": [1.0, 2.0]}), pa.Table, id="arrow"),
    ],
)
def test_a_bare_function_gets_the_type_it_was_given(data: Any, kind: type) -> None:
    seen: list[type] = []

    def model(batch: Any) -> Any:
        seen.append(type(batch))
        return np.ones(len(batch["x"]))

    chute.predict(data, model)
    assert seen and all(issubclass(t, kind) for t in seen)


@pytest.mark.timeout(60)
def test_a_model_keeps_its_own_batch_format() -> None:
    seen: list[type] = []

    def model(batch: Any) -> Any:
        seen.append(type(batch))
        return np.zeros(batch.num_rows)

    chute.predict(pd.DataFrame({"x": [1, 2]}), chute.Model("m", model))
    assert seen == [pa.Table]


def _report() -> Report:
    return Report(
        fingerprint="f",
        engine="local",
        engine_reason="no cluster address",
        output="out/<tips>",
        units_total=12,
        units_done=12,
        units_skipped=0,
        rows_in=1_710_629,
        rows_out=1_710_629,
        rows_skipped=0,
        parts=24,
        wall_seconds=2.0,
        stages={"write": StageStats(1.25, 1_710_629, 1_200)},
    )


def test_a_report_prints_as_text() -> None:
    text = str(_report())
    assert text == _report().render()
    assert "<rich" not in text and "object at 0x" not in text
    assert "rows in / out │ 1,710,629 / 1,710,629" in text
    assert "throughput    │ 855,314 rows/s" in text
    assert "1,200 batches (summed over its replicas or threads)" in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_a_report_shows_itself_in_jupyter() -> None:
    html = _report()._repr_html_()
    assert html.startswith("<table>") and html.endswith("</table>")
    assert "<th style='text-align:left'>rows in / out</th>" in html
    assert "out/&lt;tips&gt;" in html  # escaped


def _fails_on_two(batch: Any) -> Any:
    if (batch["x"] == 2).any():
        raise ValueError("two")
    return batch["x"] * 10


@pytest.mark.timeout(120)
def test_a_dataframes_result_keeps_its_index_and_carried_columns_as_they_were(
    engine: str,
) -> None:
    """The result had a fresh RangeIndex: assigned back, predictions met other rows, and a
    row a model failed on (quarantined) moved every later one up; a nullable Int64 past
    2**53 came back a rounded float."""
    frame = pd.DataFrame(
        {
            "x": [1, 2, 3, 4],
            "big": pd.array([2**53 + 1, None, 3, 4], dtype="Int64"),
            "c": pd.Categorical(list("abab")),
        },
        index=pd.Index([10, 5, 7, 3], name="id"),
    )
    model = chute.Model(
        "m", _fails_on_two, inputs=["x"], batch_format="pandas", on_error="quarantine"
    )
    out = chute.predict(frame, model, engine=engine)  # type: ignore[arg-type]
    assert out.index.tolist() == [10, 7, 3] and out.index.name == "id"
    assert out["big"].dtype == "Int64" and out["big"].iloc[0] == 2**53 + 1
    assert out["c"].dtype == "category"
    frame["pred"] = out["m"]
    assert frame["pred"].tolist()[::2] == [10.0, 30.0] and pd.isna(frame["pred"].loc[5])
