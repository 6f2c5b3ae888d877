"""A run's end on Ray: wait, bounded, until its actors have exited and their CPUs and GPUs
are free again, and forget the frames a failed run's error holds."""

from __future__ import annotations

import gc
import logging
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from chute.engines.ray.operators import ModelActor

log = logging.getLogger("chute")

EXIT_SECONDS = 60.0
"""Most seconds a run waits for its actors to exit after it ends."""
FREE_SECONDS = 10.0
"""Then, most seconds it waits for Ray's view of free CPUs and GPUs to show them back."""
_POOL_ACTOR = "MapWorker("
"""How the class names of Ray Data's pool actors start in Ray's actor table (followed by
the operator's name, which holds ``ModelActor`` for chute's model stages)."""


@contextmanager
def released(
    wait: Callable[[], bool] = lambda: True,
    kill: Callable[[], bool] = lambda: False,
    free: Callable[[], bool] = lambda: True,
    actors: bool = True,
) -> Iterator[None]:
    """On the way out of a run, finished or failed, wait until its actors have exited and
    their CPUs and GPUs are free again, so that the next run in this process (a notebook,
    a test) never finds them taken: its reads would starve.

    Ray Data lets go of an actor pool by dropping its handles (never ``ray.kill``), and Ray
    ends the actors asynchronously; on a loaded machine that can take many seconds. The
    wait is for this driver's pool actors to be dead in Ray's actor table, then for the
    free CPUs and GPUs to be at least what they were when the run started (both bounded:
    a slow cluster delays the return, never fails the job). No wait where ``wait()`` says
    so at the end: a run stopped because the cluster lost nodes would wait for actors
    that cannot start, and for CPUs that are gone.

    Where the run failed, or ``kill()`` says so at the end (the run stops to be planned
    again and goes on), the pool's actors are killed first: none may finish a batch and
    write a part after the new plan's work has begun, and an actor whose model hangs on a
    thread that never returns (a timed-out call) would otherwise never exit, keeping its
    CPUs from the next run. Where ``free()`` says not (nodes were lost), there is
    no wait for the CPUs of the start. A run without ``actors`` (every model fused into
    the read tasks) skips the garbage collection that frees a pool: it has none; and when
    it finished, the wait too: its tasks have all returned, and a task's CPUs are free on
    its node the moment it does (Ray's view here lags by a heartbeat, ~0.1 s, which was a
    third of a small job's time). Only a failed one waits, for the tasks it left running.
    """
    import ray

    before = _free(ray.available_resources())
    failed = False
    try:
        yield
    except BaseException as exc:
        failed = True
        # The frames a failed run's error passed through hold its dataset, and through it
        # the tasks in flight on its actors: the actors would live as long as the error.
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        if actors:  # a full collection costs ~0.1 s with a big heap: only where it frees
            gc.collect()  # Ray Data's executor and operators hold each other: a cycle to free
        if failed or kill():
            _kill_pool_actors()
        if (actors or failed) and wait():
            _wait_for(lambda: live_pool_actors() == 0, EXIT_SECONDS)
            if free():
                _wait_for(lambda: _at_least(_free(ray.available_resources()), before), FREE_SECONDS)


def _free(available: Mapping[str, float]) -> dict[str, float]:
    return {kind: float(available.get(kind, 0.0)) for kind in ("CPU", "GPU")}


def _at_least(now: Mapping[str, float], before: Mapping[str, float]) -> bool:
    return all(now[kind] >= before[kind] - 1e-6 for kind in before)


def live_pool_actors() -> int:
    """This driver's Ray Data pool actors that are not dead yet (0 if Ray cannot say)."""
    return len(_live_pool_actors())


def _live_pool_actors() -> list[str]:
    """The ids of this driver's model pool actors not dead yet (none if Ray cannot say)."""
    import ray

    try:
        job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
        table = ray._private.state.actors(job_id=job)  # the GCS actor table; no dashboard
    except Exception:  # not every Ray has it: then the wait for free resources alone
        log.debug("cannot read Ray's actor table", exc_info=True)
        return []
    return [
        str(actor.get("ActorID"))
        for actor in table.values()
        if _is_model_pool(str(actor.get("ActorClassName"))) and actor.get("State") != "DEAD"
    ]


def _kill_pool_actors() -> None:
    """Kill this driver's model pool actors at once, in-flight batches and all."""
    import ray

    worker = ray._private.worker.global_worker
    for actor in _live_pool_actors():
        try:  # ray.kill wants a handle, which Ray Data kept to itself: the same call by id
            worker.core_worker.kill_actor(ray.ActorID.from_hex(actor), True)
        except Exception:  # gone meanwhile, or a Ray without the call: the wait covers it
            log.debug("cannot kill actor %s", actor, exc_info=True)


def _is_model_pool(name: str) -> bool:
    return name.startswith(_POOL_ACTOR) and ModelActor.__name__ in name


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            log.debug("gave up after %g s waiting for a run's actors to go", seconds)
            return False
        time.sleep(0.05)
    return True


def drop_frames(exc: BaseException | None) -> None:
    """Forget the Ray Data frames an error (and the errors it arose from) holds: they keep
    the failed run's actors, and their CPUs, alive for as long as the error is referenced,
    so that the next run in the same process (a notebook) would starve its reads and hang.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__context__
