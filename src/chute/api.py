"""The faces users touch in Python: :class:`Job` (a spec that runs) and the one-call
:func:`predict` and :func:`run` over it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chute import engines
from chute.job import BatchFormat, EngineName, JobSpec, Model, Sink
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

    def __post_init__(self) -> None:
        super().__post_init__()
        engines.check_name(self.engine)  # the registry knows the engines; the spec does not

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


def _models(model: Model | Sequence[Model] | Any, data: Any = None) -> tuple[Model, ...]:
    if isinstance(model, Model):
        return (model,)
    if isinstance(model, (list, tuple)) and all(isinstance(m, Model) for m in model):
        return tuple(model)
    fn: Any = model
    return (Model("prediction", fn, batch_format=batch_format_of(data)),)


def batch_format_of(data: Any) -> BatchFormat:
    """The batch a bare function gets: the type it gave — a pandas DataFrame in, pandas
    batches; a dict of NumPy arrays in, NumPy dicts; anything else (files, Arrow, a Ray
    Dataset) pyarrow Tables."""
    if type(data).__module__.startswith("pandas"):
        return "pandas"
    if isinstance(data, dict):
        return "numpy"
    return "pyarrow"


def predict(
    data: Any,
    model: Model | Sequence[Model] | Any,
    *,
    carryover: Sequence[str] | str = "*",
    engine: EngineName = "auto",
) -> pd.DataFrame:
    """Run one or more models over in-memory data or files and return a DataFrame.

    ``model`` is a :class:`Model`, a list of them, or a bare function / class (named
    ``prediction``), which gets batches of the data's own type: pandas DataFrames for a
    DataFrame, dicts of NumPy arrays for a dict of arrays, pyarrow Tables otherwise (a
    :class:`Model` says its ``batch_format``). Every input column is carried through
    unless ``carryover`` says otherwise; rows come back in input order.

    >>> chute.predict(df, lambda batch: batch["x"] * 2)  # doctest: +SKIP
    """
    carry = (carryover,) if isinstance(carryover, str) else tuple(carryover)
    models = _models(model, data)
    job = Job(source=as_source(data), models=models, carryover=carry, engine=engine)
    report = job.run()
    assert report.result is not None
    frame: pd.DataFrame = report.result.to_pandas()
    given = type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pandas")
    if given and report.result_rows is not None:
        _as_given(frame, data, report.result_rows)
    return frame


def _as_given(frame: pd.DataFrame, data: pd.DataFrame, rows: Any) -> None:
    """A DataFrame's result keeps its rows' index (its labels, names and levels: assigned
    back, each prediction meets its row, and a row a model failed on is missing, not
    filled by the next) and its carried columns as they were (nullable ``Int64``, a
    category, a time zone: Arrow's round trip would make an ``Int64`` past 2**53 a float)."""
    frame.index = data.index[rows]
    for name in frame.columns:
        if name in data.columns and isinstance(name, str):
            frame[name] = data[name].iloc[rows].set_axis(frame.index)


def run(
    data: Any,
    model: Model | Sequence[Model] | Any,
    output: str,
    *,
    carryover: Sequence[str] | str = (),
    format: str = "parquet",
    engine: EngineName = "auto",
    progress: bool = False,
    overwrite: bool = False,
) -> Report:
    """Run models over ``data`` and write the results under ``output``; return the report."""
    job = Job(
        source=as_source(data),
        models=_models(model, data),
        carryover=(carryover,) if isinstance(carryover, str) else tuple(carryover),
        output=Sink(output, format),  # type: ignore[arg-type]
        engine=engine,
    )
    return job.run(progress=progress, overwrite=overwrite)
