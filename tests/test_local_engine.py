"""The local engine's plumbing: channels and the rebatcher, without a job around them; and
its writers, one per four cores, in a job."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import chute
import chute.engines.local as local
from chute.engines.channels import Channel, Rebatcher, Stopped
from chute.engines.resources import local_writers
from chute.ledger import Ledger
from chute.stages import KEY, decode, tag
from chute.storage import resolve
from tests.conformance.test_conformance import expected, read_output, taxi_job


def _slices(unit: int, rows: int, size: int) -> list[pa.Table]:
    """Unit ``unit`` of ``rows`` rows, as the readers hand it on: tagged slices."""
    table = pa.table({"x": np.arange(rows)})
    return [tag(table.slice(start, size), unit, start, rows) for start in range(0, rows, size)]


def _batches(tables: list[pa.Table], rows: int) -> list[pa.Table]:
    channel = Channel(len(tables) + 1, 1, threading.Event())
    for table in tables:
        channel.put(table)
    channel.close()
    rebatcher = Rebatcher(channel, rows)
    out = []
    while (batch := rebatcher.take()) is not None:
        out.append(batch)
    return out


def _units(batch: pa.Table) -> list[int]:
    units, _, _ = decode(batch.column(KEY).to_numpy())
    return sorted(set(units.tolist()))


def test_interleaved_units_are_batched_one_unit_at_a_time() -> None:
    """Four readers' slices arrive interleaved; full batches still hold one unit each."""
    per_unit = [_slices(unit, 250, 50) for unit in range(4)]
    interleaved = [t for group in zip(*per_unit, strict=True) for t in group]
    batches = _batches(interleaved, 100)

    keys = np.concatenate([b.column(KEY).to_numpy() for b in batches])
    assert sorted(keys.tolist()) == sorted(
        np.concatenate([t.column(KEY).to_numpy() for t in interleaved]).tolist()
    )  # every row once
    full = [b for b in batches if b.num_rows == 100]
    assert len(full) == 10
    assert all(len(_units(b)) == 1 for b in full[:8])  # 2 full batches per unit...
    assert sum(len(_units(b)) for b in full[8:]) == 4  # ...and the 4 tails of 50, paired
    assert [b.num_rows for b in batches] == [100] * 10


@pytest.mark.parametrize("rows", [1, 7, 100, 1000])
def test_every_row_comes_out_once_in_unit_order(rows: int) -> None:
    tables = _slices(0, 130, 40) + _slices(1, 3, 2) + _slices(2, 64, 64)
    batches = _batches(tables, rows)
    assert all(b.num_rows <= rows for b in batches)
    units, positions, _ = decode(np.concatenate([b.column(KEY).to_numpy() for b in batches]))
    for unit, size in [(0, 130), (1, 3), (2, 64)]:
        assert positions[units == unit].tolist() == list(range(size))  # once each, in order


def test_tails_ready_at_the_same_moment_are_joined() -> None:
    batches = _batches(_slices(0, 30, 30) + _slices(1, 20, 20), 100)
    assert [b.num_rows for b in batches] == [50]  # both tails, already waiting: one batch


@pytest.mark.timeout(10)
def test_a_finished_tail_never_waits_for_rows_that_have_not_arrived() -> None:
    """The input is still open and nothing more is coming yet: the tails go on at once
    (a kill now must not redo a unit whose rows were all read)."""
    channel = Channel(4, 1, threading.Event())
    rebatcher = Rebatcher(channel, 100)
    for table in _slices(0, 250, 250):
        channel.put(table)
    assert [rebatcher.take().num_rows for _ in range(3)] == [100, 100, 50]  # type: ignore[union-attr]
    channel.put(_slices(1, 30, 30)[0])
    tail = rebatcher.take()
    assert tail is not None and _units(tail) == [1] and tail.num_rows == 30
    channel.close()
    assert rebatcher.take() is None


@pytest.mark.timeout(10)
def test_a_batch_of_several_units_tails_goes_on_unit_by_unit() -> None:
    """A second model's rebatcher gets the first's batches, and a batch of joined tails
    holds several units: unit 0's tail, all of unit 1, and unit 2's first rows. Units 0
    and 1 are finished and go on at once; unit 2 waits for its last rows only, not for
    the end of the input (before, the whole batch was filed under unit 0, unfinished, and
    stayed until the input ended: later commits, and memory that grew with the input)."""
    channel = Channel(4, 1, threading.Event())
    rebatcher = Rebatcher(channel, 100)
    unit0 = _slices(0, 50, 10)
    channel.put(pa.concat_tables(unit0[:-1]))  # its first rows, in a batch of their own
    mixed = pa.concat_tables([unit0[-1], _slices(1, 10, 10)[0], _slices(2, 30, 20)[0]])
    channel.put(mixed)
    first = rebatcher.take()
    assert first is not None and _units(first) == [0, 1] and first.num_rows == 60
    channel.put(_slices(2, 30, 20)[1])
    second = rebatcher.take()
    assert second is not None and _units(second) == [2] and second.num_rows == 30
    channel.close()
    assert rebatcher.take() is None


def test_once_the_run_is_stopping_no_more_work_is_taken_even_work_that_waits() -> None:
    """After an error, replicas went on taking batches already in their channel or in the
    rebatcher's buffer (four model calls begun after the error, in one case), and the run
    raised only when they were done."""
    stop = threading.Event()
    channel = Channel(8, 1, stop)
    rebatcher = Rebatcher(channel, 100)
    for table in _slices(0, 1_000, 250):
        channel.put(table)
    assert rebatcher.take() is not None  # buffers the rest of what it read
    stop.set()
    with pytest.raises(Stopped):
        rebatcher.take()
    with pytest.raises(Stopped):
        channel.get()
    assert channel.poll() is not None  # the driver still drains what finished


@pytest.mark.timeout(10)
def test_a_unit_whose_rows_arrive_out_of_order_goes_on_once_they_all_have() -> None:
    """Two replicas of an earlier model finish out of order: unit 0's last slice came
    second. Taken as finished then, its two earlier slices, arriving after, waited for
    the end of the input (a late commit, and rows held in memory all along)."""
    channel = Channel(8, 1, threading.Event())
    rebatcher = Rebatcher(channel, 1_000)
    first, second, third, last = _slices(0, 1_000, 250)
    for table in (second, last, first):
        channel.put(table)
    channel.put(_slices(1, 2_000, 500)[0])  # more input: the channel is not drained
    channel.put(third)
    batch = rebatcher.take()
    assert batch is not None and _units(batch) == [0] and batch.num_rows == 1_000
    channel.close()
    rest = rebatcher.take()
    assert rest is not None and _units(rest) == [1] and rest.num_rows == 500


@pytest.mark.timeout(120)
def test_a_writer_per_four_cores_writes_every_row_once_into_few_files(
    taxi_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On 24 cores the local engine runs six writers, each with a file of its own open:
    here on any machine. Every row is written once, the demo's 12 input files give at most
    12 data files, and the ledger names exactly those."""
    monkeypatch.setattr(local, "local_writers", lambda cores=None: local_writers(24))
    assert local.LocalEngine().writers == 6
    out = tmp_path / "out"
    replace(taxi_job(taxi_dir, None, "local"), output=chute.Sink(str(out))).run()
    parts = sorted(p.name for p in out.iterdir() if p.name.startswith("part-"))
    assert 1 <= len(parts) <= 12
    assert read_output(out).sort_by("trip_id").equals(expected(taxi_dir))
    entries = Ledger(*resolve(str(out))).read_entries()
    assert {p for e in entries.values() for p in e["parts"]} == set(parts)
