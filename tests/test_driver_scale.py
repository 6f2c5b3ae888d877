"""The driver stays O(units): what one Ray read task carries does not grow with the units.

Ray Data puts every read task in the object store from the driver, so a task that carried
the whole file list made the driver's memory and CPU grow with the square of the units
(issue 18: 4,000 files peaked at 1.7 GB). ``benchmarks/driver.py`` measures the driver.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chute.plan import Reader
from chute.sources import FileSource

pytest.importorskip("ray")


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
    assert len(tasks) == len(units)
    return [len(cloudpickle.dumps(task)) for task in tasks]


def test_a_read_task_carries_its_own_unit_not_the_list(tmp_path: Path) -> None:
    few = _task_sizes(_files(tmp_path / "a", 4))
    many = _task_sizes(_files(tmp_path / "b", 800))
    assert max(many) <= max(few) + 8  # a few bytes for larger unit indexes, never per unit
    assert max(many) < 2_000  # was ~100 bytes per unit in the plan: 80 KB here


def test_a_read_task_reads_its_unit_after_the_trip(tmp_path: Path) -> None:
    from ray import cloudpickle

    from chute.engines.ray.operators import ReadUnit

    source = _files(tmp_path / "in", 3)
    units = source.plan()
    reader = Reader(source, ["trip_id", "x"], source.schema())
    task = cloudpickle.loads(cloudpickle.dumps(ReadUnit(reader, units[2])))
    assert task.reader.source._files is None  # no listing on the worker
    assert task.unit.size == (tmp_path / "in" / "part-00002.parquet").stat().st_size
    (batch,) = list(task())
    assert batch.column("trip_id").to_pylist() == [1, 2]
