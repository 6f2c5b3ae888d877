"""Shared fixtures: one lazily started local Ray, the engine parameter and small taxi data.

Nothing is registered or started at import time: Ray starts only when a test asks for it
(directly through ``ray_session``, or through ``engine`` with the ``ray`` parameter) and
is shut down at the end of the session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chute.demo

TAXI_ROWS = 60_000


def _import_root(directory: Path) -> Path:
    """The folder a test module is imported from (above ``tests/`` when it is a package)."""
    while (directory / "__init__.py").exists():
        directory = directory.parent
    return directory


IMPORT_ROOT = _import_root(Path(__file__).resolve().parent)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray with 2 CPUs for the whole session, started on first use."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # someone else owns it: use it, leave it running
        yield ray
        return
    # Ray's workers inherit this process's environment. Test modules define the models
    # and sources they ship to workers at module level, so workers must import them from
    # here; and Ray Data logs one error line per actor pool about constructor arguments
    # held in the object store (ray#53727), which chute's own init_ray silences the same way.
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "RAY_BACKEND_LOG_LEVEL")}
    path = [str(IMPORT_ROOT), *filter(None, [saved["PYTHONPATH"]])]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    try:
        # address="local": always a fresh instance of our own, never a cluster that
        # another process on this machine started with `ray start` (which a bare
        # ray.init() would join).
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray
    finally:
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _engine_params() -> list[Any]:
    from chute.engines import ENGINES

    return [
        pytest.param(name, id=name, marks=[pytest.mark.ray] if entry.requires == "ray" else [])
        for name, entry in ENGINES.items()
    ]


@pytest.fixture(params=_engine_params())
def engine(request: pytest.FixtureRequest) -> str:
    """Each end-to-end test runs once per registered engine (``chute.engines.ENGINES``);
    only an engine that needs Ray starts the session's Ray."""
    from chute.engines import ENGINES

    if ENGINES[request.param].requires == "ray":
        request.getfixturevalue("ray_session")
    return str(request.param)


@pytest.fixture(scope="session")
def taxi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo taxi data, small: 12 monthly Parquet files, 60,000 rows in all."""
    directory = tmp_path_factory.mktemp("taxi")
    chute.demo.generate(str(directory), total=TAXI_ROWS)
    return directory
