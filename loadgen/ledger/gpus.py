"""What the ledger knows of GPUs: the device memory of those the shipped profiled engines name (each with where
the figure came from), and the streaming-multiprocessor count of common ones (vendor specifications).

The memory ledger sizes a KV pool from ``device_memory_gib`` × ``gpu_memory_utilization`` (``EngineSettings``);
an engine TOML names its GPU (``[cost.profile] gpu``, the profile's own name) but not its memory. This table
is that memory, keyed by the name the profile (and vLLM's ``torch.cuda.get_device_name``) gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import GIB

__all__ = [
    "GpuMemory",
    "GPU_MEMORY",
    "gpu_memory",
    "GPU_SM_COUNTS",
    "ASSUMED_SM_COUNT",
    "gpu_sm_count",
    "GPU_CAPABILITIES",
    "gpu_capability",
]


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
        101_976_440_832,
        "logged: device_total_memory_bytes in the meta.json of LLMServingSim's Qwen3-32B TP 2 run on two of these "
        "GPUs (bench/examples/RTXPRO6000/Qwen3-32B/vllm/meta.json at commit 0d3de68; the shared RTX PRO 6000 runs "
        "do not log it)",
    ),
}


def gpu_memory(name: str) -> GpuMemory | None:
    """The device memory of the GPU named ``name`` (exactly as its profile names it), or None if unknown."""
    return GPU_MEMORY.get(name)


#: Streaming multiprocessors per GPU (vendor specifications), by a lower-case fragment of the name CUDA reports;
#: the Triton sampler keeps one float32 vocabulary row of scratch per program, one program per SM at most.
#: The first fragment found in the name wins, so longer names come first.
GPU_SM_COUNTS: tuple[tuple[str, int], ...] = (
    ("rtx pro 6000", 188),
    ("rtx 4090", 128),
    ("rtx 3090", 82),
    ("rtx a6000", 84),
    ("h100 pcie", 114),
    ("h100", 132),
    ("h200", 132),
    ("b200", 148),
    ("a100", 108),
    ("l40s", 142),
    ("l40", 142),
    ("a10g", 80),
    ("l4", 58),
)
#: SMs assumed when the GPU is not named or not in GPU_SM_COUNTS (an H100 SXM's): the scratch rows are then
#: min(next power of two of the rows, 132).
ASSUMED_SM_COUNT = 132


def gpu_sm_count(device_name: str) -> tuple[int, str]:
    """(SMs, where the figure came from) for the GPU CUDA names ``device_name``."""
    lowered = device_name.lower()
    for fragment, count in GPU_SM_COUNTS:
        if fragment in lowered:
            return count, f"{device_name}: {count} SMs (specification)"
    return ASSUMED_SM_COUNT, f"{device_name or 'GPU not named'}: {ASSUMED_SM_COUNT} SMs ASSUMED (an H100 SXM's)"


#: CUDA compute capability per GPU (vendor specifications), by a lower-case fragment of the name CUDA reports;
#: the first fragment found wins, so longer names come first. vLLM 0.19 enables some kernels and fusions by it.
GPU_CAPABILITIES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("rtx pro 6000 blackwell", (12, 0)),
    ("rtx 5090", (12, 0)),
    ("rtx 4090", (8, 9)),
    ("rtx 3090", (8, 6)),
    ("rtx a6000", (8, 6)),
    ("h100", (9, 0)),
    ("h200", (9, 0)),
    ("gh200", (9, 0)),
    ("b200", (10, 0)),
    ("gb200", (10, 0)),
    ("b300", (10, 3)),
    ("a100", (8, 0)),
    ("l40s", (8, 9)),
    ("l40", (8, 9)),
    ("a10g", (8, 6)),
    ("l4", (8, 9)),
)


def gpu_capability(device_name: str) -> tuple[int, int] | None:
    """The compute capability of the GPU CUDA names ``device_name`` (GPU_CAPABILITIES), or None if unknown."""
    lowered = device_name.lower()
    for fragment, capability in GPU_CAPABILITIES:
        if fragment in lowered:
            return capability
    return None
