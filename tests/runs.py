"""Small jobs the tests run the same way in several files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import chute


def local_run(table: pa.Table, model: chute.Model, out: Path) -> chute.Report:
    """Run ``model`` over ``table`` on the local engine into ``out``, the ``id`` column
    carried."""
    job = chute.Job(
        source=chute.TableSource(table),
        models=(model,),
        carryover=("id",),
        output=chute.Sink(str(out)),
        engine="local",
    )
    return job.run()
