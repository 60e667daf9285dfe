"""The three-node loopback cluster of `cluster/cluster.sh`, driven from tests.

Guarantee: the cluster is started and stopped only through the committed script and config; the
nodes' PIDs are read from the script's PID files and, should the script's stop leave one running,
that PID is SIGKILLed after checking it is still that node. Every wait is bounded.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx

from support.processes import REPO, log_tail, port_is_free, wait_until

SCRIPT = REPO / "cluster" / "cluster.sh"
NODES = (1, 2, 3)
START_TIMEOUT = 180.0


def _node_ports(base: int) -> list[int]:
    return [base + offset + node for offset in (10, 70, 80) for node in NODES]


def free_port_base(attempts: int = 200) -> int:
    """A base for which the nine ports the script derives from it are free on 127.0.0.1."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20000, 60000, 100)
        if all(port_is_free(port) for port in _node_ports(base)):
            return base
    raise RuntimeError("no free block of cluster ports found")


@dataclass
class Cluster:
    directory: Path
    port_base: int
    started_pids: set[int] = field(default_factory=set)

    def admin_url(self, node: int) -> str:
        return f"http://127.0.0.1:{self.port_base + 70 + node}"

    def ingress_url(self, node: int) -> str:
        return f"http://127.0.0.1:{self.port_base + 80 + node}"

    def script(self, *args: str, timeout: float = START_TIMEOUT) -> str:
        env = {**os.environ, "CLUSTER_DIR": str(self.directory), "CLUSTER_PORT_BASE": str(self.port_base)}
        done = subprocess.run(
            [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            logs = "\n".join(f"--- n{n}.log ---\n{log_tail(self.directory / f'n{n}.log')}" for n in NODES)
            raise RuntimeError(f"cluster.sh {' '.join(args)} failed: {done.stdout}{done.stderr}\n{logs}")
        return done.stdout

    def pid(self, node: int) -> int | None:
        try:
            return int((self.directory / f"n{node}.pid").read_text())
        except FileNotFoundError:
            return None

    def start(self, *nodes: int) -> None:
        self.script("start", *map(str, nodes or NODES))
        self.started_pids |= {pid for n in NODES if (pid := self.pid(n)) is not None}

    def kill9(self, node: int) -> None:
        self.script("kill", str(node), timeout=30)

    def stop(self) -> None:
        """The script's graceful stop; then SIGKILL whatever node it left running (never anything else)."""
        self.started_pids |= {pid for n in NODES if (pid := self.pid(n)) is not None}
        try:
            self.script("stop", timeout=120)
        finally:
            for pid in self.started_pids:
                if self._is_our_node(pid):
                    os.kill(pid, signal.SIGKILL)

    def _is_our_node(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return False
        return f"{self.directory}/n" in cmdline

    def running(self) -> list[int]:
        return [pid for pid in self.started_pids if self._is_our_node(pid)]

    def register(self, node: int, uri: str) -> None:
        response = httpx.post(f"{self.admin_url(node)}/deployments", json={"uri": uri, "force": True}, timeout=30)
        if not response.is_success:
            raise RuntimeError(f"registering {uri}: HTTP {response.status_code} {response.text}")

    def sql(self, node: int, query: str) -> list[dict[str, Any]] | None:
        """Rows, or None while the query engine cannot answer (it fails for a while after a leader change)."""
        try:
            response = httpx.post(
                f"{self.admin_url(node)}/query",
                json={"query": query},
                headers={"accept": "application/json"},
                timeout=15,
                trust_env=False,
            )
        except httpx.TransportError:
            return None
        return cast(list[dict[str, Any]], response.json()["rows"]) if response.is_success else None

    def wait_sql(self, node: int, query: str, timeout: float = 60) -> list[dict[str, Any]]:
        return wait_until(lambda: self.sql(node, query), timeout, f"n{node} to answer {query!r}", interval=0.5)
