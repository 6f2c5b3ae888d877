"""The demo's tip model written into Iceberg, Delta Lake and Lance tables, exactly once.

    pip install 'chute[iceberg,delta,lance]'
    python examples/tables/run.py                   # 120,000 demo rows into ./chute-tables/
    python examples/tables/run.py --rows 1000000 --out /tmp/tables

Each table gets the same job: the synthetic NYC-taxi data (``chute.demo``, generated into
``<out>/taxi``), the tip model, five carried columns. The Iceberg table lives in pyiceberg's
SQL catalog on SQLite (``<out>/catalog.db``, warehouse ``<out>/warehouse``); Delta and
Lance tables are folders.
Every table is read back with its own reader and compared with the Parquet output of the
same job; the script prints, per output, the commits the table's history holds, its data
files and the seconds the run took (benchmarks/tables.py is the same comparison, timed).
Run it twice: the second run finds every unit committed and adds nothing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import chute
from chute.demo import demo_job
from chute.tables import UNITS_KEY, TableSink


def sinks(out: Path) -> dict[str, chute.Sink]:
    """A Parquet directory and one sink per table format."""
    catalog = {"type": "sql", "uri": f"sqlite:///{out}/catalog.db"}
    catalog["warehouse"] = f"file://{out}/warehouse"
    return {
        "parquet": chute.Sink(str(out / "parquet")),
        "iceberg": TableSink(format="iceberg", table="demo.tips", catalog=catalog),
        "delta": TableSink(str(out / "tips.delta"), format="delta"),
        "lance": TableSink(str(out / "tips.lance"), format="lance"),
    }


def read_back(sink: chute.Sink) -> tuple[pa.Table, int, int]:
    """The table as its own reader gives it; its chute commits and data files."""
    if not isinstance(sink, TableSink):
        table = pq.read_table(sink.path)
        return table, 0, len(list(Path(sink.path).glob("part-*")))
    if sink.format == "iceberg":
        from pyiceberg.catalog import load_catalog

        iceberg = load_catalog("default", **dict(sink.catalog)).load_table(sink.table)
        commits = sum(UNITS_KEY in s.summary.additional_properties for s in iceberg.snapshots())
        files = len(iceberg.inspect.files())
        return iceberg.scan().to_arrow(), commits, files
    if sink.format == "delta":
        from deltalake import DeltaTable

        delta = DeltaTable(sink.path)
        commits = sum(UNITS_KEY in c for c in delta.history())
        return delta.to_pyarrow_table(), commits, len(delta.file_uris())
    import lance

    dataset = lance.dataset(sink.path)
    transactions = dataset.get_transactions(10_000)
    commits = sum(UNITS_KEY in (t.transaction_properties or {}) for t in transactions if t)
    files = sum(len(f.data_files()) for f in dataset.get_fragments())
    return dataset.to_table(), commits, files


def run(rows: int, out: Path, commit_seconds: float | None = None) -> list[dict[str, Any]]:
    """The job into each output: seconds, commits, files; the rows checked alike.
    ``commit_seconds``: the tables' commit batching, when not the default."""
    results, reference = [], None
    for name, sink in sinks(out).items():
        if isinstance(sink, TableSink) and commit_seconds is not None:
            sink = replace(sink, commit_seconds=commit_seconds)
        job = replace(demo_job(str(out), engine="local", rows=rows), output=sink)
        began = time.perf_counter()
        report = job.run()
        seconds = time.perf_counter() - began
        table, commits, files = read_back(sink)
        frame = table.select(sorted(table.column_names)).sort_by("trip_id").to_pandas()
        if reference is None:
            reference = frame
        assert len(frame) == rows, f"{name} holds {len(frame)} rows"
        pd.testing.assert_frame_equal(frame, reference, check_dtype=False)
        line = {"output": name, "rows": report.rows_out, "seconds": round(seconds, 2)}
        results.append({**line, "commits": commits, "files": files})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=120_000)
    parser.add_argument("--out", default="chute-tables")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    for line in run(args.rows, out):
        print(
            f"{line['output']:8} {line['rows']:>10,} rows  {line['seconds']:6.2f} s  "
            f"{line['commits']:>3} table commits  {line['files']:>4} data files"
        )


if __name__ == "__main__":
    main()
