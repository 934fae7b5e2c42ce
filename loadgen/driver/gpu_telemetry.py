"""GPU telemetry: NVML samples (utilisation, memory used, power) into ``server_metrics`` on the run clock.

Optional (``pip install 'loadgen[gpu]'``: nvidia-ml-py, imported as ``pynvml``). NVML sees the GPUs of the
host loadgen runs on, so the samples describe the target's GPUs only when it runs on this host (a vLLM
loadgen launched, or a server beside the driver); the manifest's ``gpu_telemetry`` section says which
devices were sampled, or why sampling was skipped (no nvidia-ml-py, no driver, no GPU, or turned off).

Samples are rows like the scraped ones: ``gpu:utilization_percent`` (busy share of the last sample
period, as NVML reports it), ``gpu:memory_used_bytes`` and ``gpu:power_watts``, labelled ``{"gpu": "<index>"}``,
timed at the midpoint of the NVML calls relative to the run's anchor.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import anyio

__all__ = ["GPU_METRICS", "GpuSampler", "open_gpu_telemetry"]

#: The sample names, and what each counts.
GPU_METRICS = {
    "gpu:utilization_percent": "percent of the last NVML sample period a kernel was running (nvmlDeviceGetUtilizationRates.gpu)",
    "gpu:memory_used_bytes": "device memory in use, bytes (nvmlDeviceGetMemoryInfo.used)",
    "gpu:power_watts": "board power draw, watts (nvmlDeviceGetPowerUsage / 1000)",
}


class GpuSampler:
    """Samples every device NVML lists; ``run`` polls on an interval until cancelled."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles
        self.samples = 0
        self.failures = 0

    def sample(self, anchor_ns: int) -> dict[str, list[Any]]:
        """One sample of every device: server_metrics columns (a failing reading is counted, not raised)."""
        nvml = self.nvml
        cols: dict[str, list[Any]] = {"time_ns": [], "name": [], "labels": [], "value": []}
        t0 = time.perf_counter_ns()
        readings: list[tuple[int, str, float]] = []
        for index, handle in enumerate(self.handles):
            for name, read in (
                ("gpu:utilization_percent", lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
                ("gpu:memory_used_bytes", lambda h: float(nvml.nvmlDeviceGetMemoryInfo(h).used)),
                ("gpu:power_watts", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ):
                try:
                    readings.append((index, name, read(handle)))
                except Exception:  # NVMLError (not supported on this board, GPU lost): count, keep sampling
                    self.failures += 1
        t_ns = (t0 + time.perf_counter_ns()) // 2 - anchor_ns
        for index, name, value in readings:
            cols["time_ns"].append(t_ns)
            cols["name"].append(name)
            cols["labels"].append(f'{{"gpu": "{index}"}}')
            cols["value"].append(value)
        self.samples += 1
        return cols

    async def run(
        self,
        anchor_ns: int,
        sink: Callable[[dict[str, list[Any]]], None],
        interval_s: float,
        *,
        task_status=anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sample now, then on a fixed-interval grid until cancelled (each sample in a worker thread)."""
        sink(await anyio.to_thread.run_sync(self.sample, anchor_ns))
        task_status.started()
        start = time.perf_counter_ns()
        interval_ns = int(interval_s * 1e9)
        k = 1
        while True:
            delay = (start + k * interval_ns - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await anyio.sleep(delay)
            sink(await anyio.to_thread.run_sync(self.sample, anchor_ns))
            k = max(k + 1, (time.perf_counter_ns() - start) // interval_ns + 1)

    def __enter__(self) -> GpuSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut NVML down (``with`` does it on leaving)."""
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down a lost GPU's library: nothing to keep
            pass


def _import_nvml() -> ModuleType:
    return importlib.import_module("pynvml")


def open_gpu_telemetry(
    mode: str, interval_s: float, nvml: ModuleType | None = None
) -> tuple[GpuSampler | None, dict[str, Any]]:
    """(sampler or None, the manifest's ``gpu_telemetry`` section) for ``mode`` auto | on | off.

    ``nvml``: the NVML module (default: ``pynvml`` when installed). ``auto`` skips with the reason; the
    caller turns a skip under ``on`` into an error."""
    if mode == "off":
        return None, {"enabled": False, "reason": "turned off (--gpu-telemetry off)"}
    if nvml is None:
        try:
            nvml = _import_nvml()
        except ImportError:
            return None, {
                "enabled": False,
                "reason": "nvidia-ml-py (pynvml) is not installed: pip install 'loadgen[gpu]' on a host with an NVIDIA GPU",
            }
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: a CPU host
        text = str(exc) or type(exc).__name__
        return None, {
            "enabled": False,
            "reason": f"NVML unavailable on this host ({text[:200]}): no NVIDIA driver or GPU",
        }
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = [_device(nvml, i, h) for i, h in enumerate(handles)]
    except Exception as exc:
        nvml.nvmlShutdown()
        return None, {"enabled": False, "reason": f"NVML could not list the GPUs ({str(exc)[:200]})"}
    if not handles:
        nvml.nvmlShutdown()
        return None, {"enabled": False, "reason": "NVML lists no GPU on this host"}
    section = {
        "enabled": True,
        "source": "NVML (nvidia-ml-py) on the host loadgen runs on",
        "interval_s": interval_s,
        "devices": devices,
        "metrics": dict(GPU_METRICS),
    }
    return GpuSampler(nvml, handles), section


def _device(nvml: Any, index: int, handle: Any) -> dict[str, Any]:
    name = nvml.nvmlDeviceGetName(handle)
    return {
        "index": index,
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
    }
