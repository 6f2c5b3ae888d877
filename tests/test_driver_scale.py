"""The driver stays O(units): what one Ray read task carries does not grow with the units.

Ray Data puts every read task in the object store from the driver, so a task that carried
the whole file list made the driver's memory and CPU grow with the square of the units
(issue 18: 4,000 files peaked at 1.7 GB). ``benchmarks/driver.py`` measures the driver.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chute.engines.ray.operators import GROUP_ROWS, GROUP_UNITS, MIN_READ_TASKS, read_groups
from chute.plan import Reader
from chute.sources import FileSource, Unit
from chute.stages import KEY
from chute.stages.rows import ROW_BITS


def _files(folder: Path, count: int) -> FileSource:
    folder.mkdir()
    table = pa.table({"trip_id": [1, 2], "x": [0.5, 1.5]})
    for i in range(count):
        pq.write_table(table, folder / f"part-{i:05d}.parquet")
    return FileSource(str(folder))


def _task_sizes(source: FileSource) -> list[tuple[int, int]]:
    """(units, pickled bytes) of each read task."""
    from ray import cloudpickle

    from chute.engines.ray.operators import UnitDatasource

    units = source.plan()
    reader = Reader(source, ["trip_id", "x"], source.schema())
    tasks = UnitDatasource(reader, units).get_read_tasks(len(units))
    assert sum(len(t.read_fn.units) for t in tasks) == len(units)
    return [(len(task.read_fn.units), len(cloudpickle.dumps(task))) for task in tasks]


def test_a_read_task_carries_its_own_units_not_the_list(tmp_path: Path) -> None:
    few = _task_sizes(_files(tmp_path / "a", 128))  # a task a unit
    many = _task_sizes(_files(tmp_path / "b", 2_560))  # grouped: ten units a task
    assert {units for units, _ in few} == {1}
    alone = max(size for _, size in few)
    per_unit = max((size - alone) / (units - 1) for units, size in many if units > 1)
    assert per_unit < 300  # what a unit costs in its own task, never in every task
    assert max(size for _, size in many) < alone + 300 * (GROUP_UNITS - 1)


def _unit(i: int, rows: int | None) -> Unit:
    return Unit(i, f"u{i}", rows)


def test_small_units_share_read_tasks_and_large_ones_go_alone() -> None:
    many = 64 * MIN_READ_TASKS  # enough units for the largest groups
    units = [_unit(i, 10) for i in range(100)]
    units += [_unit(100, GROUP_ROWS), _unit(101, None), _unit(102, GROUP_ROWS - 5)]
    units += [_unit(i, 1) for i in range(103, many)]
    groups = read_groups(units)
    assert [u.index for g in groups for u in g] == list(range(many))  # each once, in order
    # the unit a few rows short of GROUP_ROWS takes five one-row units beside it
    assert [len(g) for g in groups[:6]] == [GROUP_UNITS, 100 - GROUP_UNITS, 1, 1, 6, GROUP_UNITS]
    assert all(sum(u.rows or 0 for u in g) <= GROUP_ROWS or len(g) == 1 for g in groups)
    assert max(len(g) for g in groups) == GROUP_UNITS


def test_a_few_hundred_units_keep_a_read_task_each_so_they_commit_one_by_one() -> None:
    """Grouped units reach the model, and commit, together: a job of 16 units once read as
    one block committed all of them at the end (Ctrl-C kept nothing, commits waited)."""
    for count in (1, 16, MIN_READ_TASKS, 2 * MIN_READ_TASKS - 1):
        assert len(read_groups([_unit(i, 10) for i in range(count)])) == count
    for count in (1_000, 10_000, 100_000):
        groups = read_groups([_unit(i, 10) for i in range(count)])
        assert MIN_READ_TASKS <= len(groups) <= max(MIN_READ_TASKS * 2, count // GROUP_UNITS + 1)


def test_a_read_task_reads_its_units_after_the_trip(tmp_path: Path) -> None:
    from ray import cloudpickle

    from chute.engines.ray.operators import ReadUnits

    source = _files(tmp_path / "in", 3)
    units = source.plan()
    reader = Reader(source, ["trip_id", "x"], source.schema())
    task = cloudpickle.loads(cloudpickle.dumps(ReadUnits(reader, units[1:])))
    assert task.reader.source._files is None  # no listing on the worker
    assert task.units[1].size == (tmp_path / "in" / "part-00002.parquet").stat().st_size
    (block,) = list(task())  # small units: one block
    assert block.column("trip_id").to_pylist() == [1, 2, 1, 2]
    units_of_rows = [key if key >= 0 else -key - 1 for key in block.column(KEY).to_pylist()]
    assert [k >> ROW_BITS for k in units_of_rows] == [1, 1, 2, 2]  # each row tagged with its unit
