"""Memory a launched engine uses while a run goes: its process tree's RSS and GPU memory, sampled in a thread.

RSS (psutil) covers the whole tree (API server, engine core, workers); GPU memory comes from
``nvidia-smi`` when present. The summary's high-water marks are set against the ledger's total.

On Linux each sample also splits the tree's RSS by kind (``/proc/PID/status``): *held* memory,
anonymous plus shared memory (``RssAnon + RssShmem``: heaps, tensors, the KV cache, IPC buffers),
and file-backed pages (``RssFile``: the mapped libraries, counted again in every process that
maps them, and reclaimable page cache). It also keeps each process's kernel high-water mark
(``VmHWM``), which no sampling interval can miss; their sum bounds the tree's peak from above.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
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
        self.held: list[int] = []  # per sample: the tree's RssAnon + RssShmem (Linux)
        self.file_backed: list[int] = []  # per sample: the tree's RssFile (Linux)
        self.hwm_by_process: dict[str, int] = {}  # per process ever seen: its VmHWM (Linux)
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

    def _tree_status(self, procs: list[str]) -> None:
        """Held and file-backed RSS of the tree now, and every process's VmHWM (Linux ``/proc``; skipped elsewhere)."""
        held = file_backed = 0
        for key in procs:
            fields = _proc_status(int(key.split(":", 1)[0]))
            if fields is None:
                return
            held += fields.get("RssAnon", 0) + fields.get("RssShmem", 0)
            file_backed += fields.get("RssFile", 0)
            self.hwm_by_process[key] = max(self.hwm_by_process.get(key, 0), fields.get("VmHWM", 0))
        self.held.append(held)
        self.file_backed.append(file_backed)

    def sample(self) -> None:
        """Take one sample; keep the per-process split of the highest tree RSS so far."""
        by_proc = self.tree_rss_by_process()
        total = sum(by_proc.values())
        if not self.samples or total > max(s[1] for s in self.samples):
            self.peak_by_process = by_proc
        self._tree_status(list(by_proc))
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
        if self.held:
            out["held_high_water_bytes"] = max(self.held)
            out["file_backed_high_water_bytes"] = max(self.file_backed)
            out["hwm_sum_bytes"] = sum(self.hwm_by_process.values())
            out["held_note"] = (
                "held = RssAnon + RssShmem of the tree (heaps, tensors, KV cache, IPC); file-backed = RssFile (mapped "
                "libraries, counted once per process that maps them); hwm_sum = the sum of every process's VmHWM"
            )
        if ledger_total_bytes:
            out["ledger_total_bytes"] = int(ledger_total_bytes)
            if rss:
                out["rss_high_water_over_ledger"] = round(max(rss) / ledger_total_bytes, 4)
        return out


_STATUS_FIELDS = ("VmHWM", "RssAnon", "RssFile", "RssShmem")


def _proc_status(pid: int) -> dict[str, int] | None:
    """The memory fields of ``/proc/PID/status`` in bytes; None where there is no such file (not Linux)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return {} if Path("/proc/self/status").exists() else None  # the process exited / no procfs
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in _STATUS_FIELDS:
            out[name] = int(value.split()[0]) * 1024  # "123456 kB"
    return out
