"""The engine a calibration or validation measures: a URL loadgen did not launch, or a vLLM it launches.

``measured_engine`` yields what both need from it while it runs: its base URL, the facts its startup
log reports (scheduler limits), the manifest sections that identify it (launch arguments, environment,
the CPUs it was pinned to) and the tokenizer that counts prompts the way it does. A launched vLLM goes
through the target layer (``open_target``), the one way loadgen launches a target, and is stopped when
the block ends, whatever ends it. Its process tree's memory is sampled while the block runs, so the
runtime it needs beyond the ledger's model memory is measured, not assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.targets import Target, TargetSpec, open_target
from loadgen.targets.vllm import VllmTarget, engine_memory
from loadgen.util.errors import LoadgenError
from loadgen.vllm import MemorySampler

# (memory, reconciliation) of the engine so far, against the ledger with an optional measured runtime (GiB)
MemoryReport = Callable[[float | None], tuple[dict[str, Any], dict[str, Any]]]

__all__ = ["MeasuredEngine", "MemoryReport", "measured_engine"]


@dataclass
class MeasuredEngine:
    url: str
    log_notes: dict[str, Any] | None = None  # a vLLM startup log's facts (its scheduler limits among them)
    manifest: dict[str, Any] = field(default_factory=dict)  # sections every run against it records
    tokenizer: str | None = None  # counts prompts as the engine does (None: the caller's default)
    memory: MemoryReport | None = None  # a launched engine's memory so far (None: a URL, not ours to sample)
    target: Target | None = None  # the launched engine as a target (plans run on it); None for a URL


@contextmanager
def measured_engine(
    work_dir: Path,
    *,
    url: str | None = None,
    vllm: str | None = None,
    vllm_args: Sequence[str] = (),
    log_notes: dict[str, Any] | None = None,
) -> Iterator[MeasuredEngine]:
    """The engine at ``url``, or a vLLM launched on ``vllm`` (model dir, config.json or shipped name)."""
    if url is not None:
        yield MeasuredEngine(url, log_notes)
        return
    if vllm is None:
        raise LoadgenError("calibration: expected --target URL or --vllm MODEL")
    with open_target(TargetSpec(vllm=vllm, vllm_args=tuple(vllm_args)), Path(work_dir) / "engine") as target:
        assert isinstance(target, VllmTarget) and target.server is not None  # open_target launched it
        server = target.server
        assert server.proc is not None
        with MemorySampler(server.proc.pid) as sampler:
            yield MeasuredEngine(
                server.base_url,
                {**server.engine_notes(), **(log_notes or {})},
                server.manifest_extra(),
                "server",  # vLLM's own /tokenize: prompts hold the token counts the engine sees
                lambda runtime_gib: engine_memory(server, sampler, server.log_path, runtime_gib=runtime_gib),
                target,
            )
