"""The stall watchdog on its own: fed samples of a cluster, it stops a run that waits for
what no node can give, says what is pending, what the cluster has and lost, and what to
do; demand a node can run once its tasks finish is not a stall. (On real clusters:
tests/test_cluster_shapes.py.)"""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from chute.engines.ray.watchdog import Sample, Stalled, Watchdog
from chute.engines.resources import Cluster, Node
from chute.errors import ResourceError, StallError
from chute.report import ProgressBar
from chute.terminal import ProgressLines

HEAD, WORKER = Node("127.0.0.2", 1.0), Node("127.0.0.3", 1.0)
STARTED = Cluster(2.0, nodes=(HEAD, WORKER))
LOST_WORKER = Sample([{"CPU": 1.0}], (HEAD,), {"127.0.0.2": 1.0})
"""The hang of issue 18: the restarted model actor took the head's only CPU; a read waits."""


def _watchdog(found: Sample, notes: list[str], bound: float = 0.4) -> Watchdog:
    return Watchdog(STARTED, 1.0, notes.append, bound=bound, poll=0.02, probe=lambda _: found)


@pytest.mark.timeout(30)
def test_a_run_waiting_for_what_no_node_has_is_stopped_saying_why() -> None:
    notes: list[str] = []
    watchdog = _watchdog(LOST_WORKER, notes)
    deadline = time.monotonic() + 10
    with pytest.raises(Stalled), watchdog:
        while time.monotonic() < deadline:  # the streaming thread, waiting on Ray Data
            time.sleep(0.01)
    assert isinstance(watchdog.error, StallError)
    assert isinstance(watchdog.error, ResourceError) and watchdog.error.exit_code == 7
    text = str(watchdog.error)
    assert text.startswith("no progress for 0.4 s: Ray has {CPU: 1} pending (read tasks")
    assert "The cluster has 1 CPUs, 0 GPUs on 1 node (127.0.0.2: 1 CPU)" in text
    assert "1 CPU of it held by model actors; lost since the start: 127.0.0.3: 1 CPU." in text
    assert "add a node (or CPUs), then run the same command again; it resumes" in text
    assert notes[0].startswith("lost node 127.0.0.3 (1 CPU) at 0:0")  # on the first sample
    assert notes[1].startswith("waiting for resources: {CPU: 1} pending · lost node 127.0.0.3")
    assert len(notes) == 2


@pytest.mark.parametrize(
    "found",
    [
        pytest.param(Sample([], (HEAD,), {"127.0.0.2": 1.0}), id="nothing-pending"),
        pytest.param(
            Sample([{"CPU": 1.0}], (Node("127.0.0.2", 2.0),), {"127.0.0.2": 1.0}),
            id="a-read-waits-for-other-reads",
        ),
        pytest.param(Sample([{"CPU": 0.5}], (HEAD, WORKER), {}), id="room-once-tasks-end"),
    ],
)
def test_demand_a_node_can_run_is_not_a_stall(found: Sample) -> None:
    notes: list[str] = []
    watchdog = _watchdog(found, notes, bound=1.0)
    now = time.monotonic()
    assert not any(watchdog.check(found, now + t) for t in (0, 5, 50, 500))
    assert watchdog.error is None
    assert not [note for note in notes if note.startswith("waiting")]


def test_progress_restarts_the_clock_and_clears_the_waiting_note() -> None:
    notes: list[str] = []
    watchdog = _watchdog(LOST_WORKER, notes, bound=60.0)
    now = time.monotonic()
    assert not watchdog.check(LOST_WORKER, now)  # first seen
    assert not watchdog.check(LOST_WORKER, now + 31)  # waited half the bound: shown
    assert notes[-1].startswith("waiting for resources: {CPU: 1} pending · lost node")
    watchdog.progress()  # a record arrived: the run moves after all
    assert notes[-1].startswith("lost node 127.0.0.3 (1 CPU) at ")  # still said, ETA aside
    later = time.monotonic()
    assert not watchdog.check(LOST_WORKER, later + 59)  # counted from the last record
    watchdog._stop.set()  # no thread to stop: the check only decides
    assert watchdog.check(LOST_WORKER, later + 61)
    assert watchdog.error is None  # a watchdog already stopped raises nothing


def test_the_progress_line_says_waiting_for_resources_instead_of_an_eta() -> None:
    out = io.StringIO()
    now = [0.0]
    lines = ProgressLines(1_000, Console(file=out, width=200), lambda: now[0], every=1.0)
    lines.start()
    lines.advance(100)
    now[0] = 2.0
    lines.waiting = "waiting for resources: {CPU: 1} pending"
    lines.tick()
    assert out.getvalue().splitlines() == [
        "units · 100 of 1,000 rows (10%) · waiting for resources: {CPU: 1} pending · 2 s elapsed"
    ]


def test_the_bar_says_waiting_for_resources_instead_of_an_eta() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=True)
    with ProgressBar(1_000, console=console, clock=lambda: 2.0) as bar:
        bar.advance(100)
        bar.waiting("waiting for resources: {CPU: 1} pending")
    assert "waiting for resources: {CPU: 1} pending" in out.getvalue()
    assert "ETA" not in out.getvalue().splitlines()[-1]


def _adapting(grow: bool = True) -> Watchdog:
    return Watchdog(STARTED, 1.0, bound=60.0, poll=0.02, adapt=True, grow=lambda: grow)


def test_a_lost_node_that_leaves_demand_waiting_asks_for_a_new_plan_not_the_bound() -> None:
    """Adapting, the watchdog does not wait out the bound after a loss that leaves CPUs:
    a new plan on what is left goes on in the same run."""
    watchdog = _adapting()
    watchdog._stop.set()  # no thread to stop: the check only decides
    now = time.monotonic()
    assert not watchdog.check(LOST_WORKER, now)  # first seen
    assert not watchdog.check(LOST_WORKER, now + 4)  # a restarting actor may get there
    assert watchdog.check(LOST_WORKER, now + 5.5)
    assert watchdog.error is None and watchdog.replan is None  # stopped already: nothing set
    watchdog = _adapting()
    watchdog._raise_in_target = lambda: None  # type: ignore[method-assign]
    assert not watchdog.check(LOST_WORKER, now)
    assert watchdog.check(LOST_WORKER, now + 5.5)
    assert watchdog.error is None
    assert watchdog.replan is not None and watchdog.replan.startswith("lost node 127.0.0.3")


def test_no_cpu_left_is_waited_out_and_stopped_even_when_adapting() -> None:
    """Nothing to plan for: the bound, then the error that says to add a node."""
    no_cpu = Sample([{"CPU": 1.0}], (Node("127.0.0.2", 0.0),), {})
    watchdog = _adapting()
    watchdog._raise_in_target = lambda: None  # type: ignore[method-assign]
    now = time.monotonic()
    assert not any(watchdog.check(no_cpu, now + t) for t in (0, 6, 30, 59))
    assert watchdog.check(no_cpu, now + 61)
    assert watchdog.replan is None and isinstance(watchdog.error, StallError)


@pytest.mark.parametrize("grow", [True, False], ids=["work-left", "nearly-done"])
def test_a_node_that_joins_asks_for_a_new_plan_while_work_is_left(grow: bool) -> None:
    joined = Sample([], (HEAD, WORKER, Node("127.0.0.4", 2.0)), {})
    gpu_less_cpu_less = Sample([], (HEAD, WORKER, Node("127.0.0.5", 0.0)), {})
    watchdog = _adapting(grow)
    watchdog._raise_in_target = lambda: None  # type: ignore[method-assign]
    now = time.monotonic()
    assert not watchdog.check(gpu_less_cpu_less, now)  # nothing to run there
    assert watchdog.check(joined, now + 1) is grow
    assert watchdog.replan == ("node 127.0.0.4 (2 CPU) joined" if grow else None)
    assert watchdog.error is None


def test_a_watchdog_that_does_not_adapt_never_asks_for_a_new_plan() -> None:
    watchdog = _watchdog(LOST_WORKER, [], bound=60.0)
    joined = Sample([], (HEAD, WORKER, Node("127.0.0.4", 2.0)), {})
    now = time.monotonic()
    assert not any(watchdog.check(s, now + t) for s, t in ((joined, 0), (LOST_WORKER, 30)))
    assert watchdog.replan is None


def test_a_lost_node_says_how_long_after_its_last_output_ray_declared_it_dead() -> None:
    watchdog = _adapting()
    watchdog._stop.set()
    watchdog.progress({"127.0.0.2", "127.0.0.3"})  # a batch from each node arrives
    heard = watchdog.heard["127.0.0.3"]
    watchdog.check(LOST_WORKER, heard + 12.3)  # Ray declares the worker dead 12 s later
    assert watchdog.lost["127.0.0.3"].endswith(", 12 s after its last output")
    reads = _adapting()  # the worker only read, for a model actor on the head
    reads._stop.set()
    reads.progress({"127.0.0.2"})
    reads.check(LOST_WORKER, reads.heard["127.0.0.2"] + 7.2)
    assert reads.lost["127.0.0.3"].endswith(", 7 s after the run's last output")
    quiet = _adapting()  # nothing written yet: no time to tell
    quiet._stop.set()
    quiet.check(LOST_WORKER, time.monotonic())
    assert quiet.lost["127.0.0.3"].startswith("127.0.0.3 (1 CPU) at 0:")
    assert "output" not in quiet.lost["127.0.0.3"]
