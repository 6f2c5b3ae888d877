"""Calls with a deadline: a model call that does not answer in time is abandoned.

Python cannot stop a thread, so a call that hangs is left running on its own daemon
thread and the caller goes on: the model stage builds a fresh replica for the next try
(see :class:`chute.stages.ModelStage`).

>>> caller = Caller("demo")
>>> caller.call(abs, -2, timeout=5.0)
2
>>> caller.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class BatchTimeout(TimeoutError):
    """A model call did not answer within its timeout."""


_Reply = tuple[bool, Any]
_Call = tuple[Callable[[Any], Any], Any, "queue.SimpleQueue[_Reply]"]


class Caller:
    """Runs calls one at a time on a daemon thread of its own, so that a caller can stop
    waiting. The same thread serves every call, so what a model keeps per thread (torch's
    thread settings, a CUDA device) stays set from one batch to the next."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, arg, reply = item
            try:
                reply.put((True, fn(arg)))
            except BaseException as exc:  # handed to the caller, who raises it
                reply.put((False, exc))
            del item, fn, arg, reply  # hold no batch while idle

    def call(self, fn: Callable[[Any], Any], arg: Any, timeout: float) -> Any:
        """``fn(arg)``, or :class:`BatchTimeout` when it has not returned in ``timeout``
        seconds (the call goes on in the background; :meth:`close` this caller then)."""
        reply: queue.SimpleQueue[_Reply] = queue.SimpleQueue()
        self._calls.put((fn, arg, reply))
        try:
            ok, value = reply.get(timeout=timeout)
        except queue.Empty:
            raise BatchTimeout(f"no answer within {timeout:g} s") from None
        if ok:
            return value
        raise value

    def close(self) -> None:
        """Let the thread end once its current call (if any) returns."""
        self._calls.put(None)
