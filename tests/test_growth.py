"""The local engine's pools grow while the newest replica is the bottleneck and cheap to
copy (``chute.engines.growth``): measured, never from the model's name."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.engines.growth import GROW_MEMORY, Growth, cheap, growth_for
from chute.models import adapter

MiB = 2**20


def test_a_cheap_load_may_be_followed_and_a_dear_one_may_not() -> None:
    assert cheap(100 * MiB, 20_000 * MiB)
    assert not cheap(GROW_MEMORY + 1, 20_000 * MiB)
    assert not cheap(100 * MiB, 500 * MiB)  # more than a tenth of what is available
    assert not cheap(None, None)  # not measured: one replica


def _turn(growth: Growth, index: int, stop: threading.Event) -> list[bool]:
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(growth.wait(index, stop)))
    thread.start()
    thread.join(timeout=5)
    return seen


def test_a_busy_replica_lets_the_next_start_and_the_threads_split() -> None:
    stop = threading.Event()
    growth = Growth(2, 2, grows=True)
    assert growth.wait(0, stop)
    growth.loaded(0, 10 * MiB, None, stop)
    growth.calling(0)  # a long call under way: the watcher sees it before it ends
    assert _turn(growth, 1, stop) == [True]
    assert growth.started == 2 and growth.threads_each() == 1
    stop.set()


def test_a_replica_of_short_calls_settles_the_pool_and_takes_the_threads() -> None:
    stop = threading.Event()
    growth = Growth(2, 2, grows=True)
    growth.loaded(0, 10 * MiB, None, stop)
    assert growth.threads_each() == 1  # as if grown, while it may still grow
    assert growth.build_threads(0) == 2  # built with the whole share: it may stay alone
    growth.calling(0)
    growth.called(0, 0.001)
    assert growth.settled and growth.started == 1 and growth.threads_each() == 2
    assert _turn(growth, 1, stop) == [False]  # the waiting replica ends without loading
    stop.set()


def test_a_replica_that_waits_for_its_input_settles_the_pool() -> None:
    stop = threading.Event()
    growth = Growth(2, 2, grows=True)
    growth.loaded(0, 10 * MiB, None, stop)
    time.sleep(0.6)  # no input for a while, then one long call: busy a fifth of the time
    growth.calling(0)
    growth.called(0, 0.15)
    assert growth.settled and growth.started == 1
    stop.set()


def test_no_input_left_ends_the_replicas_still_waiting() -> None:
    stop = threading.Event()
    growth = Growth(3, 3, grows=True)
    growth.loaded(0, 10 * MiB, None, stop)
    growth.ended(0)
    assert _turn(growth, 1, stop) == [False] and _turn(growth, 2, stop) == [False]
    stop.set()


def test_a_dear_load_ends_the_growth_at_once() -> None:
    stop = threading.Event()
    growth = Growth(3, 3, grows=True)
    growth.loaded(0, GROW_MEMORY * 2, None, stop)
    assert _turn(growth, 1, stop) == [False] and _turn(growth, 2, stop) == [False]
    assert growth.threads_each() == 3
    stop.set()


def test_only_a_pool_left_as_it_is_grows_and_only_on_cpus() -> None:
    assert growth_for(chute.Model("m", Busy), 1, 2).grows
    fixed = growth_for(chute.Model("m", len, pool=chute.Pool.fixed(1)), 1, 2)
    assert not fixed.grows and fixed.most == 1 and fixed.threads_each() == 2
    ranged = growth_for(chute.Model("m", len, pool=chute.Pool(min=1, max=3)), 3, 1)
    assert not ranged.grows and ranged.most == 3
    gpu = chute.Model("m", len, resources=chute.Resources(gpus=1))
    assert not growth_for(gpu, 1, 2).grows
    sized = chute.Model("m", len, resources=chute.Resources(cpus=2))  # its CPUs are kept
    assert not growth_for(sized, 1, 2).grows
    server = chute.Model("m", adapter("openai", base_url="http://127.0.0.1:1", model="x"))
    assert not growth_for(server, 1, 2).grows  # its requests in flight are its pool's
    assert not growth_for(chute.Model("m", len), 1, 1).grows  # one core: nothing to split


class Busy:
    """Sleeps 0.2 s each call: a model of long calls that holds the run back."""

    def __init__(self, hold: int = 0) -> None:
        self.held = np.ones(hold // 8)  # touched: resident
        self.pid = os.getpid()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(0.2)
        return {"y": batch["x"] * 2, "replica": np.full(len(batch["x"]), id(self))}


def _run(tmp_path: Path, pool: chute.Pool, hold: int = 0) -> tuple[chute.Report, pa.Table]:
    x = np.arange(4_000)
    pq.write_table(pa.table({"x": x}), tmp_path / "a.parquet", row_group_size=200)
    job = chute.Job(
        source=chute.FileSource(str(tmp_path / "a.parquet")),
        models=(
            chute.Model(
                "m", Busy, kwargs={"hold": hold}, batch_format="numpy", batch_size=200, pool=pool
            ),
        ),
        carryover=("x",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    report = job.run()
    table = pq.read_table(tmp_path / "out")
    assert sorted(table.column("x").to_pylist()) == list(range(4_000))  # each row once
    np.testing.assert_array_equal(table.column("m_y").to_numpy(), table.column("x").to_numpy() * 2)
    return report, table


needs_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to grow")


@needs_cores
@pytest.mark.timeout(120)
def test_a_busy_model_grows_to_a_replica_a_core(tmp_path: Path) -> None:
    report, table = _run(tmp_path, chute.Pool())
    replicas = len(set(table.column("m_replica").to_pylist()))
    assert report.stages["m"].loads == replicas >= 2


@needs_cores
@pytest.mark.timeout(120)
def test_a_pool_the_user_fixed_keeps_its_size(tmp_path: Path) -> None:
    report, table = _run(tmp_path, chute.Pool.fixed(1))
    assert report.stages["m"].loads == 1 == len(set(table.column("m_replica").to_pylist()))


@needs_cores
@pytest.mark.timeout(120)
def test_a_model_that_takes_much_memory_keeps_one_replica(tmp_path: Path) -> None:
    report, table = _run(tmp_path, chute.Pool(), hold=GROW_MEMORY + 64 * MiB)
    assert report.stages["m"].loads == 1 == len(set(table.column("m_replica").to_pylist()))


class FailsSecond(Busy):
    """Long calls, so the pool grows; the second replica cannot load."""

    built = 0

    def __init__(self) -> None:
        type(self).built += 1
        if type(self).built > 1:
            raise RuntimeError("no second copy")
        super().__init__()


@needs_cores
@pytest.mark.timeout(120)
def test_a_replica_added_for_speed_that_cannot_load_leaves_the_run_to_the_first(
    tmp_path: Path,
) -> None:
    """The second replica is one the user never asked for (a port, a lock, a device the
    first holds): the run failed on it though the first served fine. It goes on with the
    first, and the report says so."""
    pq.write_table(pa.table({"x": np.arange(4_000)}), tmp_path / "a.parquet", row_group_size=200)
    FailsSecond.built = 0
    job = chute.Job(
        source=chute.FileSource(str(tmp_path / "a.parquet")),
        models=(chute.Model("m", FailsSecond, batch_format="numpy", batch_size=200),),
        carryover=("x",),
        output=chute.Sink(str(tmp_path / "out")),
        engine="local",
    )
    report = job.run()
    assert FailsSecond.built == 2  # it grew, and the second load is what failed
    table = pq.read_table(tmp_path / "out")
    assert sorted(table.column("x").to_pylist()) == list(range(4_000))  # each row once
    assert len(set(table.column("m_replica").to_pylist())) == 1
    (note,) = [e for e in report.events if "added for speed could not load" in e]
    assert "no second copy" in note and "went on with 1" in note
