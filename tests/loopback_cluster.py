"""A real multi-node Ray cluster on loopback, for tests: ``ray start`` in subprocesses.

Each node gets its own loopback address (127.0.0.2 for the head, 127.0.0.3, … for the
others): Ray rewrites 127.0.0.1 to the machine's outward address, but leaves the rest of
127.0.0.0/8 alone, so every byte stays on loopback. Token authentication is turned off
for these throwaway clusters (``RAY_AUTH_MODE=disabled``), for the nodes and the drivers.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

HEAD_IP = "127.0.0.2"
SOCKET_ROOM = 40
"""The longest temp dir whose Ray socket paths fit the 107 bytes of an AF_UNIX address:
Ray adds ``/session_<date>_<time>_<pid>/sockets/plasma_store.1`` (about 65 bytes)."""


def short_dir(temp_dir: Path) -> Path:
    """``temp_dir``, or a new short directory under /tmp where it is too long for Ray."""
    if len(str(temp_dir)) <= SOCKET_ROOM:
        return temp_dir
    return Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp" if os.path.isdir("/tmp") else None))


def free_port() -> int:
    """A port free now, outside the range the OS hands out to other sockets: the port of
    a socket closed at once (port 0) is the next one any process's connection may take,
    and once the session's own Ray took it before the head started (``Failed to start
    the grpc server``)."""
    low, high = _ephemeral()
    for _ in range(200):
        port = random.randrange(20_000, 30_000)
        if low <= port <= high:
            continue
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("0.0.0.0", port))
            return port
    raise RuntimeError("no free port found between 20000 and 30000")


def _ephemeral() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


class LoopbackCluster:
    """Start with :meth:`start`, add nodes with :meth:`add_node`, always :meth:`stop`."""

    def __init__(self, temp_dir: Path, head_cpus: int = 1) -> None:
        self.temp_dir = short_dir(temp_dir)
        self._made = self.temp_dir != temp_dir
        self.port = free_port()
        self.head_cpus = head_cpus
        self.nodes: list[str] = []
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.port}"

    def _ray(self, *args: str) -> None:
        command = [sys.executable, "-m", "ray.scripts.scripts", *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stdout}\n{done.stderr}")

    def start(self) -> LoopbackCluster:
        for attempt in range(3):
            try:
                self._ray(
                    "start",
                    "--head",
                    f"--port={self.port}",
                    f"--node-ip-address={HEAD_IP}",
                    f"--num-cpus={self.head_cpus}",
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                    f"--temp-dir={self.temp_dir}",
                )
                break
            except RuntimeError as exc:  # its port taken meanwhile: another, once or twice
                if "Failed to start the grpc server" not in str(exc) or attempt == 2:
                    raise
                self._kill()
                self.port = free_port()
        self.nodes.append(HEAD_IP)
        return self

    def add_node(self, cpus: int = 1, resources: str | None = None) -> str:
        """Start another node on the next loopback address; return that address."""
        ip = f"127.0.0.{len(self.nodes) + 2}"
        extra = [f"--resources={resources}"] if resources else []
        self._ray(
            "start",
            f"--address={self.address}",
            f"--node-ip-address={ip}",
            f"--num-cpus={cpus}",
            *extra,
        )
        self.nodes.append(ip)
        return ip

    def processes(self, ip: str | None = None) -> list[psutil.Process]:
        """This cluster's processes (of the node at ``ip`` only, if given); never another
        Ray on the machine, such as the test session's own."""
        ours = re.compile(rf"({re.escape(self.address)}|--gcs_server_port={self.port})(?!\d)")
        node = re.compile(rf"--node[-_]ip[-_]address={re.escape(ip or '')}(?!\d)")
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            line = " ".join(proc.info["cmdline"] or [])
            if ours.search(line) and (ip is None or node.search(line)):
                found[proc.pid] = proc
        for proc in list(found.values()):  # workers rename themselves ray::…: find by parent
            try:
                found.update((child.pid, child) for child in proc.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        return list(found.values())

    def _kill(self) -> None:
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()

    def kill_node(self, ip: str) -> int:
        """SIGKILL every process of the node at ``ip``: its raylet, workers and actors."""
        victims = self.processes(ip)
        for proc in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        return len(victims)

    def stop(self) -> None:
        """Kill this cluster's processes (``ray stop`` would kill every Ray here)."""
        self._kill()
        if self._made:  # the short directory made for Ray's sockets: nothing else uses it
            shutil.rmtree(self.temp_dir, ignore_errors=True)
