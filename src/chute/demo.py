"""The demo: a synthetic NYC-taxi-like dataset and the tip model.

12 Parquet files, one per month of 2009, 1,710,629 rows in all, with the yellow-taxi
columns plus a unique ``trip_id``. The data is generated from a fixed seed, so every
machine gets the same rows.
"""

from __future__ import annotations

import calendar
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from chute.api import Job
from chute.errors import ConfigError
from chute.job import Model, Sink
from chute.sources import FileSource

TOTAL_ROWS = 1_710_629
YEAR = 2009
CARRYOVER = ("trip_id", "vendor_id", "pickup_at", "passenger_count", "tip_amount")


def tip_model(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tip model: a trip with two or more passengers is scored 1, else 0."""
    return {"score": (batch["passenger_count"] >= 2).astype(np.float32)}


def month_rows(total: int = TOTAL_ROWS) -> list[int]:
    """Rows per month, proportional to the days in each month, summing to ``total``."""
    days = np.array([calendar.monthrange(YEAR, m)[1] for m in range(1, 13)])
    rows = (days * total) // days.sum()
    rows[: total - rows.sum()] += 1
    return [int(r) for r in rows]


def _month(month: int, rows: int, first_id: int, rng: np.random.Generator) -> pa.Table:
    start = np.datetime64(f"{YEAR}-{month:02d}-01T00:00:00", "s")
    seconds = calendar.monthrange(YEAR, month)[1] * 86_400
    pickup = start + np.sort(rng.integers(0, seconds, rows)).astype("timedelta64[s]")
    minutes = rng.gamma(2.0, 6.0, rows)
    distance = np.round(minutes * rng.uniform(0.15, 0.4, rows), 2)
    fare = np.round(2.5 + distance * 2.0 + minutes * 0.2, 1)
    credit = rng.random(rows) < 0.3
    tip = np.where(credit, np.round(fare * rng.uniform(0.1, 0.25, rows), 2), 0.0)
    tolls = np.where(rng.random(rows) < 0.05, 4.15, 0.0)
    extra = rng.choice([0.0, 0.5, 1.0], rows)
    mta = np.full(rows, 0.5)
    lon, lat = -73.98 + rng.normal(0, 0.03, (2, rows)), 40.75 + rng.normal(0, 0.03, (2, rows))
    passengers = rng.choice(
        np.arange(1, 7, dtype=np.int8), rows, p=[0.69, 0.14, 0.05, 0.02, 0.07, 0.03]
    )
    return pa.table(
        {
            "trip_id": pa.array(np.arange(first_id, first_id + rows, dtype=np.int64)),
            "vendor_id": pa.array(rng.choice(["VTS", "CMT", "DDS"], rows, p=[0.5, 0.45, 0.05])),
            "pickup_at": pa.array(pickup),
            "dropoff_at": pa.array(pickup + (minutes * 60).astype("timedelta64[s]")),
            "passenger_count": pa.array(passengers, pa.int8()),
            "trip_distance": distance,
            "pickup_longitude": lon[0],
            "pickup_latitude": lat[0],
            "rate_code_id": pa.array(rng.choice([1, 1, 1, 2, 5], rows).astype(np.int64)),
            "store_and_fwd_flag": pa.array(rng.choice(["N", "Y"], rows, p=[0.99, 0.01])),
            "dropoff_longitude": lon[1],
            "dropoff_latitude": lat[1],
            "payment_type": pa.array(np.where(credit, "CREDIT", "CASH")),
            "fare_amount": fare,
            "extra": extra,
            "mta_tax": mta,
            "tip_amount": tip,
            "tolls_amount": tolls,
            "total_amount": np.round(fare + extra + mta + tip + tolls, 2),
        }
    )


def generate(directory: str, total: int = TOTAL_ROWS, seed: int = 2009) -> list[str]:
    """Write the 12 monthly files under ``directory`` (kept if already there); return them."""
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"yellow_{YEAR}-{m:02d}.parquet") for m in range(1, 13)]
    if all(os.path.exists(p) for p in paths) and _rows(paths) == total:
        return paths
    rng = np.random.default_rng(seed)
    first = 0
    for month, (path, rows) in enumerate(zip(paths, month_rows(total), strict=True), start=1):
        tmp = path + ".tmp"
        pq.write_table(_month(month, rows, first, rng), tmp)
        os.replace(tmp, path)
        first += rows
    return paths


def _rows(paths: list[str]) -> int:
    return sum(pq.read_metadata(p).num_rows for p in paths)


def demo_job(directory: str, engine: Any = "auto", rows: int = TOTAL_ROWS) -> Job:
    """The demo job over the data in ``directory``/taxi, written to ``directory``/tip-scores."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError(
            f"the demo's folder {directory!r} is a file: name a folder (--dir) for the demo's "
            "data and results."
        )
    data = os.path.join(directory, "taxi")
    generate(data, rows)
    return Job(
        source=FileSource(data),
        models=(Model("tip", tip_model, inputs=("passenger_count",), batch_format="numpy"),),
        carryover=CARRYOVER,
        output=Sink(os.path.join(directory, "tip-scores")),
        engine=engine,
    )
