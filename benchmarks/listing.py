"""Planning over many small Parquet objects on a local S3 server: how many requests?

Starts moto's S3 server on loopback with the counting proxy of ``tests/s3server.py`` in
front of it, uploads N small Parquet files (straight to moto, not counted), then plans a
job over the prefix the way ``chute run`` does (list the prefix, read the schema, read
every footer in parallel) and prints the LIST, GET and HEAD requests it took and the time.

    python benchmarks/listing.py            # 10,000 objects
    python benchmarks/listing.py --objects 200

A measurement, not a test: ``tests/test_s3.py`` asserts the same shape on 200 objects.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.s3server import FaultProxy, MotoS3

from chute.sources import FileSource


def small_parquet(i: int, rows: int = 10) -> bytes:
    ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), buf)
    return buf.getvalue()


def upload(server: MotoS3, objects: int) -> None:
    client = server.client()
    client.create_bucket(Bucket="bucket")
    body = [small_parquet(i) for i in range(objects)]

    def put(i: int) -> None:
        client.put_object(Bucket="bucket", Key=f"many/part-{i:06d}.parquet", Body=body[i])

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(put, range(objects)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10_000)
    args = parser.parse_args()
    server = MotoS3()
    proxy = FaultProxy(server.endpoint)
    try:
        began = time.perf_counter()
        upload(server, args.objects)
        print(f"uploaded {args.objects:,} objects in {time.perf_counter() - began:.1f} s")
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        proxy.reset()
        began = time.perf_counter()
        source = FileSource("s3://bucket/many/")
        units = source.plan()
        schema = source.schema()
        seconds = time.perf_counter() - began
        rows = sum(u.rows or 0 for u in units)
        counts = dict(sorted(proxy.counts.items()))
        print(f"planned {len(units):,} units, {rows:,} rows, columns {schema.names}")
        print(f"requests: {counts} (total {sum(counts.values()):,})")
        print(f"planning time: {seconds:.2f} s")
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()
