"""Device memory of the GPUs the shipped profiled engines name, each with where the figure came from.

The memory ledger sizes a KV pool from ``device_memory_gib`` × ``gpu_memory_utilization`` (``EngineSettings``);
an engine TOML names its GPU (``[cost.profile] gpu``, the profile's own name) but not its memory. This table
is that memory, keyed by the name the profile (and vLLM's ``torch.cuda.get_device_name``) gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import GIB

__all__ = ["GpuMemory", "GPU_MEMORY", "gpu_memory"]


@dataclass(frozen=True)
class GpuMemory:
    """A GPU's total device memory (what ``cudaMemGetInfo`` reports as total) and its source."""

    total_bytes: int
    source: str

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


GPU_MEMORY: dict[str, GpuMemory] = {
    "NVIDIA GeForce RTX 4090": GpuMemory(
        25_250_627_584,
        "logged: device_total_memory_bytes in the meta.json of LLMServingSim's measured RTX 4090 run "
        "(bench/examples/RTX4090/Llama-3.1-8B)",
    ),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": GpuMemory(
        95 * GIB,
        "assumed: 95 GiB, as the engine TOML's kv_cache_gib assumes (the shared RTX PRO 6000 runs do not log it)",
    ),
}


def gpu_memory(name: str) -> GpuMemory | None:
    """The device memory of the GPU named ``name`` (exactly as its profile names it), or None if unknown."""
    return GPU_MEMORY.get(name)
