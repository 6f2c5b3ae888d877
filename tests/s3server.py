"""A real S3 API on loopback for the tests: moto in server mode, and a fault-injecting,
request-counting proxy in front of it.

* :class:`MotoS3` — ``moto.server.ThreadedMotoServer`` on 127.0.0.1 and a free port;
  every bucket and object lives in this process, reset between tests.
* :class:`FaultProxy` — a small threaded HTTP proxy: counts requests by kind (LIST, GET,
  HEAD, PUT, DELETE, POST) and, when told to, answers a fraction of them with
  ``503 SlowDown``, ``500 InternalError`` or a dropped connection (nothing forwarded).

The AWS SDK inside pyarrow finds its credentials in the environment: dummy ones are set
here at import, before any test starts a Ray whose workers inherit the environment.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import socket
import threading
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te"}


class MotoS3:
    """moto's S3 server on 127.0.0.1 and a free port."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def client(self, endpoint: str | None = None) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1")

    def reset(self) -> None:
        """Drop every bucket and object (moto's own API)."""
        self._post("/moto-api/reset", b"")

    def require_auth(self, on: bool) -> None:
        """Make moto check credentials against its IAM (``on``) or accept any (off)."""
        self._post("/moto-api/reset-auth", b"0" if on else b"inf")

    def _post(self, path: str, data: bytes) -> None:
        request = urllib.request.Request(
            self.endpoint + path, data=data, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        self.server.stop()


class FaultProxy:
    """An HTTP proxy in front of ``upstream`` that counts requests and injects faults."""

    def __init__(self, upstream: str, seed: int = 0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.counts: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.requests: list[tuple[str, str]] = []
        self.unsigned = 0
        """Requests that carried no ``Authorization`` header (anonymous access)."""
        self.rates: dict[str, float] = {}
        self._seed = seed
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def inject(self, slow_down: float = 0.0, internal: float = 0.0, drop: float = 0.0) -> None:
        """Answer these fractions of requests with 503 SlowDown, 500, or a dropped connection."""
        self.rates = {"503": slow_down, "500": internal, "drop": drop}

    def reset(self) -> None:
        """Counts and faults to zero, and the fault draws afresh: a test's faults do not
        depend on how many requests the tests before it made."""
        with self._lock:
            self._random.seed(self._seed)
            self.counts.clear()
            self.faults.clear()
            self.unsigned = 0
            self.requests.clear()
            self.rates = {}

    def fault(self) -> str | None:
        """The fault to inject into the next request, if any (and count it)."""
        with self._lock:
            draw = self._random.random()
            for name, rate in self.rates.items():
                if draw < rate:
                    self.faults[name] += 1
                    return name
                draw -= rate
            return None

    def count(self, method: str, path: str, query: str, signed: bool = True) -> None:
        with self._lock:
            self.unsigned += not signed
            self.counts[kind(method, path, query)] += 1
            self.requests.append((method, f"{path}?{query}" if query else path))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def kind(method: str, path: str, query: str) -> str:
    """LIST for a bucket listing, else the method (GET, HEAD, PUT, DELETE, POST)."""
    key = path.lstrip("/").partition("/")[2]
    if method == "GET" and (not key or "list-type" in query):
        return "LIST"
    return method


def as_s3(payload: bytes) -> bytes:
    """moto's answer as S3 gives it. moto 5.2 names the answer to CompleteMultipartUpload
    ``<CompleteMultipartUploadResponse>`` where S3 says ``<CompleteMultipartUploadResult>``,
    and pyarrow's S3 client reads any other root as an error inside a 200 OK: every
    multipart upload through pyarrow (pyiceberg's metadata files) failed against moto."""
    wrong = b"CompleteMultipartUploadResponse"
    return payload.replace(wrong, b"CompleteMultipartUploadResult") if wrong in payload else payload


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _serve(self) -> None:
            body = self._body()
            path, _, query = self.path.partition("?")
            proxy.count(self.command, path, query, "Authorization" in self.headers)
            fault = proxy.fault()
            if fault == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault is not None:
                status, payload = (503, SLOW_DOWN) if fault == "503" else (500, INTERNAL)
                self._reply(status, [("Content-Type", "application/xml")], payload)
                return
            status, headers, payload = self._forward(body)
            self._reply(status, headers, payload)

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body or None, headers=headers)
                response = conn.getresponse()
                payload = as_s3(response.read())
                return response.status, response.getheaders(), payload
            finally:
                conn.close()

        def _reply(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
            self.send_response(status)
            length = None
            for name, value in headers:
                if name.lower() in HOP_BY_HOP:
                    continue
                if name.lower() == "content-length":
                    length = value
                    continue
                self.send_header(name, value)
            if self.command == "HEAD":
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                return
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    return Handler


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server for the whole session."""
    pytest.importorskip("moto.server")
    server = MotoS3()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_proxy(moto_s3: MotoS3) -> Iterator[FaultProxy]:
    """The counting, fault-injecting proxy in front of moto, for the whole session."""
    proxy = FaultProxy(moto_s3.endpoint)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def s3(
    moto_s3: MotoS3, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FaultProxy]:
    """An empty store reached through the proxy (``AWS_ENDPOINT_URL`` points at it) with a
    bucket named ``bucket``; counts and faults start at zero."""
    moto_s3.reset()
    s3_proxy.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_proxy.endpoint)
    moto_s3.client().create_bucket(Bucket="bucket")
    yield s3_proxy
    s3_proxy.reset()


def put_objects(moto_s3: MotoS3, bucket: str, objects: dict[str, bytes]) -> None:
    """Upload ``objects`` (key → bytes) straight to moto (not through the proxy)."""
    client = moto_s3.client()
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def get_object(moto_s3: MotoS3, bucket: str, key: str) -> bytes:
    data: bytes = moto_s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


def list_keys(moto_s3: MotoS3, bucket: str, prefix: str = "") -> list[str]:
    paginator = moto_s3.client().get_paginator("list_objects_v2")
    return sorted(
        item["Key"]
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
    )


def read_json(moto_s3: MotoS3, bucket: str, key: str) -> Any:
    return json.loads(get_object(moto_s3, bucket, key))
