"""What a vLLM startup log reports, and ``loadgen vllm serve``'s ready line, as typed results.

``VllmLogNotes`` (``loadgen vllm parse-log LOG``; schema ``vllm-log``, version ``VLLM_LOG_SCHEMA_VERSION``) is
every key ``parse_vllm_log`` can write, each absent when the log does not print its line; ``parse_vllm_log``
builds its dict through it, so a key it does not declare is a bug caught there. ``VllmEngineNotes`` adds what
the launcher measured (``VllmServer.engine_notes()``: the run manifest's ``engine_notes.log`` and the ready
line's ``engine_notes``). ``VllmServeReady`` is the ready line (schema ``vllm-serve``, version
``VLLM_SERVE_SCHEMA_VERSION``), built by ``ready_document``. The notes' models live in
``loadgen.rundir.engine_notes`` (a run manifest reads them) and are re-exported here. Neither document has a ``kind`` or ``version``
field (the notes are also a manifest section, and were written without one); each schema's ``$id`` gives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from loadgen.rundir.engine_notes import ModelLoading, VllmEngineNotes, VllmLogNotes
from loadgen.util.resultmodel import Number, ResultModel

__all__ = [
    "VLLM_LOG_SCHEMA_VERSION",
    "VLLM_SERVE_SCHEMA_VERSION",
    "ModelLoading",
    "VllmEngineNotes",
    "VllmLogNotes",
    "VllmServeReady",
    "ready_document",
]

#: The ``vllm-log`` schema's version (the notes have no version field).
VLLM_LOG_SCHEMA_VERSION = 1
#: The ``vllm-serve`` schema's version (the ready line has no version field).
VLLM_SERVE_SCHEMA_VERSION = 1


class VllmServeReady(ResultModel):
    """``loadgen vllm serve``'s line once the server answers /health: where it is, what it serves, its notes."""

    base_url: str = Field(description="the server's base URL")
    ready_s: Number = Field(description="from launch to the first /health 200, s (1 decimal)")
    log: str = Field(description="the server's log file")
    version: str | None = Field(description="the version /version answered (null: no answer)")
    models: list[str] = Field(description="the model ids /v1/models lists")
    engine_notes: VllmEngineNotes


def ready_document(
    base_url: str, ready_s: float, log: str, identity: Mapping[str, Any], notes: Mapping[str, Any]
) -> dict[str, Any]:
    """The ready line ``loadgen vllm serve`` prints: ``identity`` is ``VllmServer.identity()`` (version,
    models), ``notes`` its ``engine_notes()``."""
    return VllmServeReady(
        base_url=base_url,
        ready_s=round(ready_s, 1),
        log=log,
        version=identity.get("version"),
        models=list(identity.get("models") or []),
        engine_notes=VllmEngineNotes.model_validate(dict(notes)),
    ).document()
