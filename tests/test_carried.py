"""Stage statistics carried with the rows (the ray engine): slicing and joining keep sums."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from chute import Job, Model, TableSource
from chute.engines import carried
from chute.plan import build_plan
from chute.stages import Batching, tag


def _batch(rows: int, seconds: float, sizing: Batching | None = None) -> pa.Table:
    return carried.carry(pa.table({"x": np.arange(rows)}), "m", seconds, sizing)


def test_slices_and_joins_keep_the_totals() -> None:
    """Ray Data re-blocks between pools: the shares still add up to each batch's time."""
    a, b = _batch(100, 2.0), _batch(50, 1.0)
    joined = pa.concat_tables([a.slice(0, 30), a.slice(30), b.slice(10), b.slice(0, 10)])
    table, totals = carried.collect(joined)
    assert table.column_names == ["x"]
    assert totals["m"]["busy"] == pytest.approx(3.0, rel=1e-6)
    assert totals["m"]["batches"] == pytest.approx(2.0, rel=1e-6)
    assert totals["m"]["rows"] == 150


def test_batch_sizing_travels_too() -> None:
    """Splits, resizes and calls add up; the size is the latest one a batch knew."""
    _, first = carried.collect(_batch(64, 0.5, Batching(3, 1, 4, 256)))
    _, second = carried.collect(_batch(64, 0.5, Batching(1, 2, 2, 128)))
    _, third = carried.collect(_batch(64, 0.5, Batching(0, 0, 0, None)))
    totals: dict[str, dict[str, float]] = {}
    for part in (first, second, third):
        carried.add(totals, carried.decode(carried.encode(part)))
    (stats,) = carried.stage_stats(totals).values()
    assert (stats.oom_splits, stats.resizes, stats.calls) == (4, 3, 6)
    assert (stats.batch_rows, stats.batches, stats.rows) == (128, 3, 192)
    assert stats.busy_seconds == pytest.approx(1.5)
    joined = pa.concat_tables(
        [_batch(8, 0.1, Batching(0, 0, 1, 64)), _batch(8, 0.1, Batching(0, 1, 1, 96))]
    )
    _, totals = carried.collect(joined)
    assert totals["m"]["batch_rows"] == 96  # the later batch's size


def test_an_empty_batch_has_the_same_columns() -> None:
    """Blocks Ray Data joins must share a schema, empty ones included."""
    assert _batch(0, 0.1).schema == _batch(5, 0.1).schema
    _, totals = carried.collect(_batch(0, 0.1))
    assert totals["m"]["rows"] == 0


def test_counters_travel_once_per_batch_whatever_their_names() -> None:
    """A model's counters (an LLM's tokens) ride in one row of their batch: slices and
    joins sum each batch's once, and batches with other counter names share a schema."""
    a = carried.carry(pa.table({"x": np.arange(10)}), "m", 1.0, Batching(), {"tokens": 7.0})
    b = carried.carry(pa.table({"x": np.arange(4)}), "m", 1.0, Batching(), {"finish/stop": 2})
    c = carried.carry(pa.table({"x": np.arange(3)}), "m", 1.0, Batching(), {})
    assert a.schema == b.schema == c.schema
    joined = pa.concat_tables([a.slice(0, 3), b, a.slice(3), c])
    _, totals = carried.collect(joined)
    (stats,) = carried.stage_stats(totals).values()
    assert stats.counters == {"tokens": 7.0, "finish/stop": 2.0}
    assert carried.counted(totals) == {"m": {"tokens": 7.0, "finish/stop": 2.0}}


def _tagged(unit: int, rows: int) -> pa.Table:
    return tag(pa.table({"x": np.arange(rows)}), unit, 0, rows)


def test_rows_of_a_task_that_ran_again_name_their_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read marks its rows; a later task that Ray ran a second time marks the rows it
    passes on; the writer names the units of the marked rows, and drops the mark."""
    first = carried.mark(_tagged(3, 4))  # a first run: nothing marked
    monkeypatch.setattr(carried, "attempt", lambda: 1)
    second = carried.mark(_tagged(7, 2))  # a read that ran before
    monkeypatch.setattr(carried, "attempt", lambda: 0)
    joined = pa.concat_tables([first, second])
    table, units = carried.retried(joined)
    assert units == {7} and carried.RETRIED not in table.column_names
    assert carried.retried(carried.mark(first))[1] == set()  # a first run keeps it as it is
    monkeypatch.setattr(carried, "attempt", lambda: 2)  # the writer itself ran again
    assert carried.retried(carried.mark(joined))[1] == {3, 7}
    assert carried.retried(joined)[1] == {3, 7}


def test_outside_a_ray_task_nothing_ran_before() -> None:
    assert carried.attempt() == 0


def _dies_once(marker: str) -> int:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)  # the worker dies: Ray runs the task again
    return carried.attempt()


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_ray_tells_a_task_how_many_times_it_ran_before(ray_session: Any, tmp_path: Path) -> None:
    """chute names the units computed again from Ray's attempt number, which Ray 2.60 keeps
    on its core worker with no public API: if that goes, this fails (not the report)."""
    import ray

    task = ray.remote(max_retries=1)(_dies_once)
    assert ray.get(task.remote(str(tmp_path / "mark"))) == 1
    assert ray.get(task.remote(str(tmp_path / "mark"))) == 0


class _DiesTwice:
    """An actor whose process dies at its first two starts; it says how often Ray
    restarted it."""

    def __init__(self, marker: str) -> None:
        with open(marker, "a") as f:
            f.write("x")
        if os.path.getsize(marker) <= 2:
            os._exit(1)

    def restarts(self) -> int:
        from chute.engines.ray.operators import restarts

        return restarts()


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_ray_tells_an_actor_how_many_times_it_was_restarted(
    ray_session: Any, tmp_path: Path
) -> None:
    """chute stops a model whose actor dies at every start from Ray's restart count, read
    from Ray's actor table (a private module): if that goes, this fails."""
    import ray

    from chute.engines.ray.operators import restarts

    actor = ray.remote(max_restarts=-1, max_task_retries=-1)(_DiesTwice)
    assert ray.get(actor.remote(str(tmp_path / "starts")).restarts.remote()) == 2
    assert ray.get(actor.remote(str(tmp_path / "starts")).restarts.remote()) == 0
    assert restarts() == 0  # not in an actor


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_read_tasks_note_the_units_they_begin_for_the_driver_to_read_once(
    ray_session: Any,
) -> None:
    """What names the units in flight when a run is planned again, though none of their
    rows reached the driver: each read task's note in Ray's key-value store (a private
    module: if it goes, this fails, not the report)."""
    import ray

    from chute.engines.ray.operators import begin, begun

    run, other = uuid.uuid4().hex, uuid.uuid4().hex
    task = ray.remote(num_cpus=0)(begin)
    ray.get([task.remote(run, [1, 2]), task.remote(run, [5]), task.remote(other, [1])])
    here = ray.util.get_node_ip_address()
    assert begun(run) == {1: {here}, 2: {here}, 5: {here}}
    assert begun(run) == {}  # read once: the notes are gone, another run's kept
    assert begun(other) == {1: {here}}
    assert begun("") is None  # no attempt yet: nothing to say


def test_the_report_names_the_units_computed_again() -> None:
    from chute.engines.ray import engine

    table = pa.table({"x": np.arange(40)})
    plan = build_plan(Job(TableSource(table, unit_rows=5), (Model("m", _same),)))
    ids = [u.id for u in plan.pending]
    line = engine._again(plan, {1, 3})
    assert line.startswith("2 unit(s) computed again by Ray, their tasks run a second time")
    assert line.endswith(f"(each row is written once): {ids[1]}, {ids[3]}")
    assert engine._again(plan, set(range(8))).endswith(f"{ids[4]} and 3 more")
    # planned again: of the units in flight, those that had rows written
    assert engine._written(plan, set()) == ""
    assert engine._written(plan, {2}) == f"; 1 of them had rows written, dropped: {ids[2]}"
    # and those of the units left that a read task had begun: in flight, on any node
    began = {1: {"10.0.0.2"}, 2: {"10.0.0.3"}, 3: {"10.0.0.3", "10.0.0.2"}, 6: {"10.0.0.2"}}
    assert engine._in_flight(plan, {2, 3, 4, 5}, began) == (
        f"; 2 of them in flight, computed again (1 on 10.0.0.2, 2 on 10.0.0.3): {ids[2]}, {ids[3]}"
    )
    assert engine._in_flight(plan, {4, 5}, began) == ", none of them begun"
    assert engine._in_flight(plan, {4, 5}, None) == ", those in flight computed again"


def _same(batch: Any) -> Any:
    return batch
