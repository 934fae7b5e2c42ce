"""The KV cache size a CPU vLLM that loadgen launches gets when none is given: one that fits the host.

vLLM-CPU sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE``; left unset, a worker on a 24 GiB host grew to
22.9 GB and the kernel's OOM killer ended it mid-run (issue 34). Here the size is the host's available
memory (the lesser of the system's and the cgroup's) less what the memory ledger says the engine needs
besides its KV cache (weights, activations, workspaces, fragmentation, safety margin, the runtime of its
processes), less ``CLIENT_RESERVE_GIB`` for loadgen's own client, in whole GiB and never more than the
KV its sequences can use (``max_num_seqs`` × ``max_model_len`` tokens). Without a readable config.json
only the runtime is set aside (at least 1 GiB is given), and the rule says so. A CUDA engine is sized by vLLM's
``--gpu-memory-utilization`` on the device and is left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import psutil

from loadgen.ledger import GIB, EngineSettings, compute_ledger, read_model_config
from loadgen.ledger.compute import CPU_RUNTIME_GIB
from loadgen.util.errors import EngineError, LoadgenError

__all__ = ["CLIENT_RESERVE_GIB", "KvDefault", "available_bytes", "host_kv_cache_gib"]

#: Memory left for loadgen's client (driver, part writer, analysis) and the system beside the engine.
CLIENT_RESERVE_GIB = 2.0


@dataclass(frozen=True)
class KvDefault:
    """A default KV size and how it was reached (recorded in the manifest)."""

    kv_cache_gib: int
    rule: str


def available_bytes(cgroup_dir: Path = Path("/sys/fs/cgroup")) -> int:
    """Memory available now: the system's, or the cgroup v2 limit's headroom where that is smaller."""
    free = int(psutil.virtual_memory().available)
    try:
        limit = (cgroup_dir / "memory.max").read_text().strip()
        used = int((cgroup_dir / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return free
    return free if limit == "max" or not limit.isdigit() else min(free, int(limit) - used)


def _arg(extra_args: list[str], flag: str) -> int | None:
    """An integer ``--flag N`` / ``--flag=N`` of vLLM's arguments (the last one wins), or None."""
    value: int | None = None
    for i, a in enumerate(extra_args):
        if a.startswith(flag + "="):
            text: str | None = a.split("=", 1)[1]
        else:
            text = extra_args[i + 1] if a == flag and i + 1 < len(extra_args) else None
        if text is not None and text.isdigit():
            value = int(text)
    return value


def host_kv_cache_gib(
    model_dir: Path,
    max_model_len: int | None,
    max_num_seqs: int | None,
    extra_args: list[str],
    available: int | None = None,
) -> KvDefault:
    """The default KV size in whole GiB (module docstring); EngineError when not even 1 GiB fits."""
    mml = _arg(extra_args, "--max-model-len") or max_model_len
    seqs = _arg(extra_args, "--max-num-seqs") or max_num_seqs
    avail = available if available is not None else available_bytes()
    try:
        settings = EngineSettings(device="cpu", block_size=128, kv_cache_gib=1.0, max_model_len=mml)
        if seqs:
            settings = settings.with_(max_num_seqs=seqs)
        ledger = compute_ledger(read_model_config(model_dir), settings)
        besides_kv = ledger.total_bytes - ledger.line("kv_cache").bytes
        need_gib = math.ceil(ledger.kv_bytes_per_token * ledger.max_model_len * settings.max_num_seqs / GIB)
        basis = f"the ledger's {besides_kv / GIB:.2f} GiB besides KV (weights, activations, runtime, margin)"
    except LoadgenError as exc:
        besides_kv = int(sum(CPU_RUNTIME_GIB.values()) * GIB)
        need_gib = None
        basis = f"the engine runtime {besides_kv / GIB:.2f} GiB only (no ledger: {exc})"
    room_gib = (avail - besides_kv) / GIB - CLIENT_RESERVE_GIB
    if need_gib is None:  # nothing known of the model: vLLM will say more than this estimate could
        return KvDefault(
            max(1, math.floor(room_gib)),
            f"{max(1, math.floor(room_gib))} GiB by default: "
            f"{avail / GIB:.1f} GiB available less {basis} and {CLIENT_RESERVE_GIB:g} GiB for the client",
        )
    gib = min(math.floor(room_gib), max(1, need_gib))
    if gib < 1:
        raise EngineError(
            f"vLLM KV cache: {avail / GIB:.1f} GiB available, {basis} and {CLIENT_RESERVE_GIB:g} GiB for the "
            "client leave less than 1 GiB: expected --kv-cache-gib N (VLLM_CPU_KVCACHE_SPACE) or more free memory"
        )
    rule = (
        f"{gib} GiB by default: {avail / GIB:.1f} GiB available less {basis} and "
        f"{CLIENT_RESERVE_GIB:g} GiB for the client, capped at the {need_gib} GiB its sequences can use"
    )
    return KvDefault(gib, rule)
