"""CPU pinning: keep the client (driver, workers) and an engine loadgen launches on separate cores.

On a small host the driver and a CPU engine fight for the same cores, and the measurement then times
that fight, not the engine. ``loadgen --client-cpus 0 --engine-cpus 1 ...`` pins this process (and
every worker it starts) to the client CPUs and every engine loadgen launches (the simulated engine,
vLLM) to the engine CPUs. A launched vLLM also gets ``VLLM_CPU_OMP_THREADS_BIND`` so its OpenMP
threads bind inside the engine set rather than where vLLM's own auto-binding would put them.

CPU lists use the kernel's notation (``0-3,6``). The engine set travels to launchers through the
environment (:data:`ENGINE_CPUS_ENV`), so worker processes and nested launchers see the same choice.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from loadgen.util.errors import LoadgenError

__all__ = [
    "ENGINE_CPUS_ENV",
    "SHARED_CPUS",
    "VLLM_BIND_ENV",
    "affinity",
    "engine_cpus",
    "format_cpus",
    "parse_cpus",
    "pin",
    "shared_cpus_warning",
]

#: The engine CPU set chosen by ``--engine-cpus`` (kernel list notation), read by every launcher.
ENGINE_CPUS_ENV = "LOADGEN_ENGINE_CPUS"
#: vLLM's CPU backend: the cores its OpenMP threads bind to (one list per rank, ``|``-separated).
VLLM_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"

#: The words that mark the shared-CPU warning in a manifest's ``warnings`` (calibration lists those runs).
SHARED_CPUS = "the client and the launched engine share CPUs"

_MAX_CPU = 1 << 16


def parse_cpus(text: str, *, what: str = "--cpus", check_usable: bool = True) -> frozenset[int]:
    """``"0-2,5"`` → {0, 1, 2, 5}; a LoadgenError naming ``what`` for anything else.

    With ``check_usable`` every CPU must be in this process's allowed set (a CPU that is offline,
    absent or outside the container's cpuset cannot be pinned to).
    """
    cpus: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise LoadgenError(f"{what}: {text!r} is not a CPU list (expected e.g. 0-3,6)") from None
        if lo < 0 or hi < lo or hi >= _MAX_CPU:
            raise LoadgenError(f"{what}: {part!r} in {text!r} is not a CPU range (expected 0 <= low <= high)")
        cpus.update(range(lo, hi + 1))
    if check_usable:
        usable = affinity()
        if usable is not None and not cpus <= usable:
            missing = format_cpus(cpus - usable)
            raise LoadgenError(f"{what}: CPUs {missing} are not available here (usable: {format_cpus(usable)})")
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 5} → ``"0-2,5"`` (the kernel's notation; the inverse of :func:`parse_cpus`)."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def affinity(pid: int = 0) -> frozenset[int] | None:
    """The CPUs ``pid`` (0: this process) may run on; None where the OS does not tell."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    try:
        return frozenset(getter(pid))
    except OSError:
        return None


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Restrict ``pid`` (0: this process) to ``cpus``; its later threads and children inherit it."""
    setter = getattr(os, "sched_setaffinity", None)
    if setter is None:
        raise LoadgenError("CPU pinning is not supported on this platform (no sched_setaffinity)")
    setter(pid, cpus)


def engine_cpus() -> frozenset[int] | None:
    """The engine CPU set chosen for this run (``--engine-cpus``), or None when engines are not pinned."""
    text = os.environ.get(ENGINE_CPUS_ENV, "").strip()
    # checked against the host by ``--engine-cpus`` before the client was pinned: not against the client's set
    return parse_cpus(text, what=ENGINE_CPUS_ENV, check_usable=False) if text else None


def shared_cpus_warning(engine: frozenset[int] | None, client: frozenset[int] | None = None) -> str | None:
    """A warning when a launched engine may run on the client's cores (the timing then measures contention)."""
    client = client if client is not None else affinity()
    if client is None:
        return None
    engine_set = engine if engine is not None else client  # an unpinned engine inherits the client's set
    shared = client & engine_set
    if not shared:
        return None
    return (
        f"{SHARED_CPUS} {format_cpus(shared)}: latencies include their contention "
        "for the CPU (pin them apart with loadgen --client-cpus LIST --engine-cpus LIST)"
    )
