"""A real multi-node Ray cluster on loopback, for tests: ``ray start`` in subprocesses.

Each node gets its own loopback address (127.0.0.2 for the head, 127.0.0.3, … for the
others): Ray rewrites 127.0.0.1 to the machine's outward address, but leaves the rest of
127.0.0.0/8 alone, so every byte stays on loopback. Token authentication is turned off
for these throwaway clusters (``RAY_AUTH_MODE=disabled``), for the nodes and the drivers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

HEAD_IP = "127.0.0.2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopbackCluster:
    """Start with :meth:`start`, add nodes with :meth:`add_node`, always :meth:`stop`."""

    def __init__(self, temp_dir: Path, head_cpus: int = 1) -> None:
        self.temp_dir = temp_dir
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

    def kill_node(self, ip: str) -> int:
        """SIGKILL every Ray process of the node at ``ip`` (its raylet and workers)."""
        killed = 0
        for proc in psutil.process_iter(["cmdline"]):
            line = " ".join(proc.info["cmdline"] or [])
            if f"--node-ip-address={ip}" in line or f"--node_ip_address={ip}" in line:
                proc.send_signal(signal.SIGKILL)
                killed += 1
        return killed

    def stop(self) -> None:
        self._ray("stop", "--force")
