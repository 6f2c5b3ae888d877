"""How a model's pool grows on the local engine: one replica, then more while the newest
is the bottleneck, makes long calls and was cheap to copy.

One-thread replicas beat one replica with every core's threads on some models and lose on
others. On 2 cores, interleaved runs (``benchmarks/RESULTS.md``): MiniLM, 2 s calls, took
8.9 s with two one-thread replicas against 10.2 s with one two-thread replica, whose
calls kept both cores busy (torch's threads wait for each other in a small transformer's
small matrix products, spinning while they do). The MLP, 8 ms calls, ran slower with two
replicas and held more memory: short calls spend much of their time in Python, under
the GIL that replicas share. The 800 MB model's second copy made the run 0.46 s instead
of 0.26 s (a never-touched gigabyte is slow to hand out here) and doubles its memory.

So a model whose pool and resources the user left as they are (``Pool()``: one replica,
no ``max``; no CPUs, GPUs or memory asked for) starts one replica and grows one replica
at a time, up to one a core of its share, while the newest replica holds the run back:
its model calls take :data:`GROW_CALL` seconds on average (the call under way counted:
a long first call lets the next replica load while it runs) and at least
:data:`GROW_BUSY` of its time since it loaded, after a load that added at most
:data:`GROW_MEMORY` (and a tenth of the memory available) to the process. The first
load's figure includes the imports of the model's libraries (torch and
sentence-transformers add ~400 MiB at once, a second MiniLM ~11 MiB), so it errs towards
one replica. While the pool may still grow, each replica calls its model with the
threads it would have once grown (a call under way cannot give threads back; an adapter
that fixes its threads when it loads keeps those it was built with, the whole share for
the first replica); a newest
replica whose first call was short, or that waited for its input, settles the pool, and
the replicas then split the model's share of the threads. A pool or resources the user
set keep the size asked for. A function, or an object the job holds, keeps one replica:
every local replica would call that one thing (:func:`shared_object`); a class is built
once per replica.
"""

from __future__ import annotations

import functools
import threading
import time
import types
from pathlib import Path

from chute.engines.resources import fuses
from chute.errors import ChuteError
from chute.job import Model
from chute.models import AdapterSpec
from chute.usercode import import_string

GROW_MEMORY = 512 * 1024 * 1024
"""The most a replica's load may add to the process for another replica to start."""
GROW_SHARE = 0.1
"""...and the most, as a share of the memory available then."""
GROW_CALL = 0.1
"""The least mean seconds of a replica's model calls for another to start: a model of short
calls (a few milliseconds) spends much of each in Python, under the GIL that replicas
share, and runs faster on one replica with more threads (measured on the MLP)."""
WATCH_EVERY = 0.05
"""Seconds between two looks at the newest replica."""
SETTLE_CALLS = 1
"""Calls of the newest replica after which, if its calls are short or it waits for its
input, the pool stops growing."""
GROW_BUSY = 0.8
"""The least share of a replica's time since it loaded spent in model calls for another to
start: one that waits for its input is not what holds the run back."""


GROW_NOTE = (
    f"one replica, then one more at a time while the newest makes model calls of "
    f"{GROW_CALL:g} s or more on average, busy at least {GROW_BUSY:.0%} of its time, after a load "
    f"that added at most {GROW_MEMORY // 2**20} MiB; the threads split between them"
)


def growth_for(model: Model, replicas: int, threads: int) -> Growth:
    """The growth of ``model``'s ``replicas`` planned replicas of ``threads`` threads each:
    up to one replica a thread of its share where the model would run inside the read
    tasks on Ray (:func:`chute.engines.resources.fuses`: its pool and resources left as
    they are, CPUs only, not an adapter whose pool bounds its engines or requests, such as
    vLLM or an OpenAI-compatible server); else those planned."""
    if fuses(model) and replicas * threads > 1 and not shared_object(model):
        return Growth(replicas * threads, replicas * threads, grows=True)
    return Growth(replicas, replicas * threads, grows=False)


def shared_object(model: Model) -> bool:
    """Whether ``model`` is one thing every local replica would call, from several threads
    at once: an object the job holds (an instance with ``__call__``, a bound method), or a
    function, which calls whatever its module holds (``MODEL.predict(...)``), not a class
    or adapter each replica builds. An object that keeps state between calls (a staging
    buffer, an ONNX I/O binding, a fast tokenizer) would mix their inputs or fail: a
    function around one gave 13,800 rows of 16,000 another row's prediction once its pool
    grew. It keeps one replica unless its pool asks for more (then the user says it is
    safe). A builtin (``len``) holds nothing. (On Ray each worker process has its own.)"""
    fn = model.fn
    if isinstance(fn, AdapterSpec | type):
        return False
    if isinstance(fn, str):
        try:
            fn = import_string(fn)
        except ChuteError:
            return False
        if isinstance(fn, type):
            return False
    if isinstance(fn, functools.partial):
        fn = fn.func
    return not isinstance(fn, types.BuiltinFunctionType)


def resident_bytes() -> int | None:
    """This process's resident memory (Linux: ``/proc/self/statm``); ``None`` elsewhere."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        import resource

        return int(fields[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError, ImportError):
        return None


def available_bytes() -> int | None:
    """Memory the kernel can hand out without swapping (``MemAvailable``); ``None`` if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cheap(added: int | None, available: int | None) -> bool:
    """Whether a replica whose load added ``added`` bytes may be followed by another."""
    if added is None:  # not measured: one replica, as before growth existed
        return False
    return added <= GROW_MEMORY and (available is None or added <= GROW_SHARE * available)


class Growth:
    """The replicas of one model on the local engine (see the module's text). ``most``
    replica threads wait their turn: all start at once where the pool does not grow; else
    the first, then each later one when a thread that watches the newest
    (:data:`WATCH_EVERY`) finds it holds the run back. ``threads`` is the model's share of
    the cores (:meth:`threads_each`)."""

    def __init__(self, most: int, threads: int, grows: bool) -> None:
        self.most = most
        self.threads = threads
        self.grows = grows
        """Whether replicas after the first wait for a measurement (else all start)."""
        self.started = 1 if grows else most
        self.settled = not grows
        """Whether the pool's size is final (grown as far as it goes, or stopped)."""
        self._lock = threading.Lock()
        self._turns = [threading.Event() for _ in range(most)]
        self._go = [not grows or i == 0 for i in range(most)]
        for i in range(1 if grows else most):
            self._turns[i].set()
        self._loaded: dict[int, float] = {}
        """When each replica that may let the next one start finished loading."""
        self._busy = [0.0] * most
        self._calls = [0] * most
        self._calling: list[float | None] = [None] * most
        """When each replica's call under way began (``None``: not in a call)."""

    def wait(self, index: int, stop: threading.Event) -> bool:
        """Wait until replica ``index`` may start (``True``) or will not (``False``)."""
        while not self._turns[index].wait(0.1):
            if stop.is_set():
                return False
        return self._go[index]

    def loaded(
        self, index: int, added: int | None, available: int | None, stop: threading.Event
    ) -> None:
        """Replica ``index`` loaded, adding ``added`` bytes to the process: few enough, and
        it is watched (the first time, by a thread started here); too many, and no replica
        follows it."""
        if not self.grows or index + 1 >= self.most:
            return
        if not cheap(added, available):
            self.ended(index)
            return
        self._loaded[index] = time.perf_counter()
        if index == 0:
            watcher = threading.Thread(target=self._watch, args=(stop,), daemon=True)
            watcher.name = "chute-growth"
            watcher.start()

    def calling(self, index: int) -> None:
        """Replica ``index`` begins a model call."""
        self._calling[index] = time.perf_counter()

    def called(self, index: int, seconds: float) -> None:
        """Replica ``index``'s call took ``seconds``. After :data:`SETTLE_CALLS` calls, a
        newest replica whose calls are short or that waits for its input is not one to
        copy: the pool keeps its size, and its replicas take the threads."""
        self._busy[index] += seconds
        self._calling[index] = None
        self._calls[index] += 1
        loaded = self._loaded.get(index)
        if loaded is None or self._calls[index] < SETTLE_CALLS or index != self.started - 1:
            return
        if not self._holds_back(index, time.perf_counter()):
            self.ended(index)

    def _holds_back(self, index: int, now: float) -> bool:
        """Whether replica ``index`` makes long calls (:data:`GROW_CALL` on average, the
        call under way counted) and spends :data:`GROW_BUSY` of its time since it loaded
        in them."""
        began = self._calling[index]
        busy = self._busy[index] + (now - began if began is not None else 0.0)
        calls = self._calls[index] + (began is not None)
        long_calls = busy >= GROW_CALL * max(1, calls)
        return long_calls and busy >= GROW_BUSY * (now - self._loaded[index])

    def _watch(self, stop: threading.Event) -> None:
        while not stop.wait(WATCH_EVERY):
            with self._lock:
                newest = self.started - 1
                if self.settled or newest + 1 >= self.most or self._turns[newest + 1].is_set():
                    return  # grown as far as it goes, or ended
                if newest not in self._loaded:  # still loading
                    continue
                if self._holds_back(newest, time.perf_counter()):
                    self.started = newest + 2
                    self._go[newest + 1] = True
                    self._turns[newest + 1].set()

    def ended(self, index: int) -> None:
        """Replica ``index`` is done (no input left, an error) or stops the growth: the
        replicas after it that have not started never will."""
        with self._lock:
            for later in range(index + 1, self.most):
                self._turns[later].set()
            self.settled = True

    def failed(self, index: int) -> None:
        """Replica ``index``, grown for speed, could not load: the pool is those before it."""
        with self._lock:
            self.started = min(self.started, index)
            for later in range(index + 1, self.most):
                self._turns[later].set()
            self.settled = True

    def build_threads(self, index: int) -> int:
        """The threads replica ``index`` is built with, which adapters that fix them when
        they load keep (ONNX Runtime's session, XGBoost, LightGBM): the first replica
        gets the whole share, as it may stay alone; a later one its part of the share
        among the replicas started with it."""
        return max(1, self.threads // (index + 1)) if self.grows else self.threads_each()

    def threads_each(self) -> int:
        """Intra-op threads of each replica's next call: while the pool may still grow, a
        replica's share as if it had grown (a call under way cannot give threads back, and
        two calls on more threads than cores wait on each other); once it cannot, the
        share split between the replicas started."""
        if self.settled or self.started >= self.most:
            return max(1, self.threads // self.started)
        return max(1, self.threads // self.most)
