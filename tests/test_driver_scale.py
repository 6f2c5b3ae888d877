"""The driver stays O(units): what one Ray read task carries does not grow with the units.

Ray Data puts every read task in the object store from the driver, so a task that carried
the whole file list made the driver's memory and CPU grow with the square of the units
(issue 18: 4,000 files peaked at 1.7 GB). ``benchmarks/driver.py`` measures the driver.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chute.engines.ray.operators import GROUP_ROWS, GROUP_UNITS, read_groups
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


def _task_sizes(source: FileSource) -> list[int]:
    from ray import cloudpickle

    from chute.engines.ray.operators import UnitDatasource

    units = source.plan()
    reader = Reader(source, ["trip_id", "x"], source.schema())
    tasks = UnitDatasource(reader, units).get_read_tasks(len(units))
    assert sum(len(t.read_fn.units) for t in tasks) == len(units)
    return [len(cloudpickle.dumps(task)) for task in tasks]


def test_a_read_task_carries_its_own_units_not_the_list(tmp_path: Path) -> None:
    few = _task_sizes(_files(tmp_path / "a", 128))
    many = _task_sizes(_files(tmp_path / "b", 1_280))
    assert max(many) <= max(few) + 64  # a few bytes for larger unit indexes, never per unit
    assert max(many) < 300 * GROUP_UNITS  # was ~100 bytes a unit of the plan in every task


def test_small_units_share_read_tasks_and_large_ones_go_alone() -> None:
    def unit(i: int, rows: int | None) -> Unit:
        return Unit(i, f"u{i}", rows)

    units = [unit(i, 10) for i in range(100)]
    units += [unit(100, GROUP_ROWS), unit(101, None), unit(102, GROUP_ROWS - 5), unit(103, 10)]
    groups = read_groups(units)
    assert [u.index for g in groups for u in g] == list(range(104))  # each once, in order
    assert [len(g) for g in groups] == [GROUP_UNITS, 100 - GROUP_UNITS, 1, 1, 1, 1]
    assert all(sum(u.rows or 0 for u in g) <= GROUP_ROWS or len(g) == 1 for g in groups)


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
