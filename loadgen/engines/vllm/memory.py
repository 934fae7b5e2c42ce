"""Memory a launched engine uses while a run goes: its process tree's RSS and GPU memory, sampled in a thread.

RSS (psutil) covers the whole tree (API server, engine core, workers); GPU memory comes from
``nvidia-smi`` when present. The summary's high-water marks are set against the ledger's total.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Any, Self

import psutil

__all__ = ["MemorySampler"]


class MemorySampler:
    """Background sampling of a process tree's RSS (psutil) and GPU memory (nvidia-smi, when present)."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int | None]] = []  # (monotonic s, rss bytes, gpu bytes)
        self.peak_by_process: dict[str, int] = {}  # per-process RSS at the tree's high-water sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvsmi = shutil.which("nvidia-smi")

    def tree_rss_by_process(self) -> dict[str, int]:
        """RSS bytes of every process in the tree, keyed ``pid:name``."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return {}
        out: dict[str, int] = {}
        for p in procs:
            try:
                out[f"{p.pid}:{p.name()}"] = p.memory_info().rss
            except psutil.Error:
                pass
        return out

    def tree_rss(self) -> int:
        """RSS bytes of the whole tree."""
        return sum(self.tree_rss_by_process().values())

    def gpu_used(self) -> int | None:
        """Bytes used on all GPUs (nvidia-smi), or None without nvidia-smi or when it fails."""
        if not self._nvsmi:
            return None
        try:
            r = subprocess.run(
                [self._nvsmi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            return sum(int(x) for x in r.stdout.split()) * (1 << 20) if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError):
            return None

    def sample(self) -> None:
        """Take one sample; keep the per-process split of the highest tree RSS so far."""
        by_proc = self.tree_rss_by_process()
        total = sum(by_proc.values())
        if not self.samples or total > max(s[1] for s in self.samples):
            self.peak_by_process = by_proc
        self.samples.append((time.monotonic(), total, self.gpu_used()))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> Self:
        """Sample every ``interval_s`` in a daemon thread until ``stop``."""
        self._thread = threading.Thread(target=self._loop, name="loadgen-mem", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling; return ``summary()``."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        return self.summary()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self, ledger_total_bytes: int | None = None) -> dict[str, Any]:
        """Sample count, RSS first and high-water, GPU high-water, per-process RSS at the peak; vs the ledger when given."""
        rss = [s[1] for s in self.samples]
        gpu = [s[2] for s in self.samples if s[2] is not None]
        out: dict[str, Any] = {
            "samples": len(self.samples),
            "interval_s": self.interval_s,
            "rss_high_water_bytes": max(rss) if rss else None,
            "rss_first_bytes": rss[0] if rss else None,
            "gpu_high_water_bytes": max(gpu) if gpu else None,
            "rss_by_process_at_peak": dict(self.peak_by_process),
            "note": "RSS covers the whole process tree (API server, engine core, workers: Python + torch runtimes), "
            "which the ledger's model-memory lines do not include",
        }
        if ledger_total_bytes:
            out["ledger_total_bytes"] = int(ledger_total_bytes)
            if rss:
                out["rss_high_water_over_ledger"] = round(max(rss) / ledger_total_bytes, 4)
        return out
