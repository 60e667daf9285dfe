"""Reading what a process and a folder cost: CPU time, resident memory, bytes on disk.

Guarantee: read-only views of /proc and the file system; a process that has gone away reads as
zero instead of raising, so a probe never aborts a run (the crash scenario kills processes on purpose).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), in seconds."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # Field 2 (the command) may contain spaces; everything after its closing parenthesis splits cleanly.
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


@dataclass(frozen=True)
class DiskUsage:
    allocated: int
    """What `du` reports: blocks actually allocated."""
    apparent: int
    """Sum of file sizes."""
    files: int


def disk_usage(folder: Path, skip: tuple[str, ...] = ()) -> DiskUsage:
    """Sizes of every file under `folder`, except those whose name ends with one of `skip`."""
    allocated = apparent = files = 0
    for root, _, names in os.walk(folder):
        for name in names:
            if name.endswith(skip):
                continue
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue  # RocksDB deletes files while we walk
            allocated += st.st_blocks * 512
            apparent += st.st_size
            files += 1
    return DiskUsage(allocated, apparent, files)


@dataclass
class CpuAccount:
    """CPU seconds used by each named process, summed over the blocks measured with `block()`."""

    pids: Mapping[str, Callable[[], int]]
    """Name -> current PID (looked up each time: a restarted process gets a new one)."""
    used: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0

    def snapshot(self) -> dict[str, float]:
        return {name: cpu_seconds(pid()) for name, pid in self.pids.items()}

    @contextmanager
    def block(self) -> Iterator[None]:
        start, t0 = self.snapshot(), time.monotonic()
        try:
            yield
        finally:
            end = self.snapshot()
            self.wall += time.monotonic() - t0
            for name in self.pids:
                self.used[name] = self.used.get(name, 0.0) + max(0.0, end[name] - start[name])

    def add(self, start: Mapping[str, float], end: Mapping[str, float]) -> None:
        """Account the interval between two snapshots of the same PIDs."""
        for name in self.pids:
            self.used[name] = self.used.get(name, 0.0) + max(0.0, end.get(name, 0.0) - start.get(name, 0.0))

    def ms_per_op(self, ops: int) -> dict[str, float]:
        ops = max(ops, 1)
        return {name: round(1000 * self.used.get(name, 0.0) / ops, 3) for name in self.pids}
