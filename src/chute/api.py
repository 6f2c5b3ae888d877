"""The faces users touch in Python: :class:`Job` (a spec that runs) and the one-call
:func:`predict` and :func:`run` over it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chute.job import EngineName, JobSpec, Model, Sink
from chute.report import Report
from chute.runner import run_job
from chute.sources import as_source

if TYPE_CHECKING:
    import pandas as pd


class Job(JobSpec):
    """A batch-inference job. Build it, then ``run()`` it.

    >>> job = Job(source=..., models=[Model("m", fn)], output=Sink("out/"))  # doctest: +SKIP
    >>> report = job.run()  # doctest: +SKIP
    """

    def run(
        self,
        *,
        progress: bool = False,
        overwrite: bool = False,
        verbose: bool = False,
        limit: int | None = None,
    ) -> Report:
        """Run the job to completion (or resume it) and return its report."""
        return run_job(self, progress=progress, overwrite=overwrite, verbose=verbose, limit=limit)


def _models(model: Model | Sequence[Model] | Any) -> tuple[Model, ...]:
    if isinstance(model, Model):
        return (model,)
    if isinstance(model, (list, tuple)) and all(isinstance(m, Model) for m in model):
        return tuple(model)
    fn: Any = model
    return (Model("prediction", fn),)


def predict(
    data: Any,
    model: Model | Sequence[Model] | Any,
    *,
    carryover: Sequence[str] | str = "*",
    engine: EngineName = "auto",
) -> pd.DataFrame:
    """Run one or more models over in-memory data or files and return a DataFrame.

    ``model`` is a :class:`Model`, a list of them, or a bare function / class (named
    ``prediction``). Every input column is carried through unless ``carryover`` says
    otherwise; rows come back in input order.

    >>> chute.predict(df, lambda b: {"y": b["x"]})  # doctest: +SKIP
    """
    carry = (carryover,) if isinstance(carryover, str) else tuple(carryover)
    job = Job(source=as_source(data), models=_models(model), carryover=carry, engine=engine)
    report = job.run()
    assert report.result is not None
    frame: pd.DataFrame = report.result.to_pandas()
    return frame


def run(
    data: Any,
    model: Model | Sequence[Model] | Any,
    output: str,
    *,
    carryover: Sequence[str] = (),
    format: str = "parquet",
    engine: EngineName = "auto",
    progress: bool = False,
    overwrite: bool = False,
) -> Report:
    """Run models over ``data`` and write the results under ``output``; return the report."""
    job = Job(
        source=as_source(data),
        models=_models(model),
        carryover=tuple(carryover),
        output=Sink(output, format),  # type: ignore[arg-type]
        engine=engine,
    )
    return job.run(progress=progress, overwrite=overwrite)
