"""The run manifest: one typed, versioned model of what ran, beside the record schema (``records.py``).

Every run directory holds ``manifest.json``. Producers (the driver, the worksheet, the importers)
build a :class:`Manifest`; whatever is learnt later (the plan cell, the warm state a target reached,
a launched engine's memory high-water mark, the final counts) goes through :func:`merge_manifest`
(in memory) or :func:`amend_manifest` (on disk), the one merge rule; readers use attributes.

Versions: ``manifest_version`` 2 is this model. Manifests written before it (no ``manifest_version``:
version 1) hold the same sections and load unchanged. ``schema_version`` is the *record* schema
version (``records.SCHEMA_VERSION``) of the Parquet files beside the manifest.

Sections keep keys this model does not name (``extra="allow"``): an engine-specific ``/version``
body, or a section written by a newer loadgen, survives a read-modify-write.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from loadgen.rundir.engine_notes import EngineNotes
from loadgen.rundir.schema import MANIFEST_FILE, PLAN_FILE, SCHEMA_VERSION, record_schema_note
from loadgen.rundir.target_identity import PlanTarget
from loadgen.util.errors import RunDirError
from loadgen.util.jsonfile import read_json_object
from loadgen.util.limits import MAX_OFFSET_NS

__all__ = [
    "MANIFEST_VERSION",
    "RUN_KINDS",
    "RUN_STATES",
    "Anchor",
    "DriverInfo",
    "EngineIdentity",
    "Harness",
    "Host",
    "LastFlush",
    "MetricsScrapes",
    "Manifest",
    "ScenarioRef",
    "TargetRef",
    "TraceRef",
    "WarmState",
    "WorkerInfo",
    "WorkersInfo",
    "WriterInfo",
    "amend_manifest",
    "merge_manifest",
    "merge_sections",
    "read_manifest",
    "version_notes",
    "write_manifest",
]

#: Version of this manifest model (1: the untyped dict written before it; loads unchanged).
MANIFEST_VERSION = 2
#: measured: a live target over HTTP; simulated: the virtual-time worksheet; imported: another tool's results.
RUN_KINDS = ("measured", "simulated", "imported")
#: running: files open; complete: every request recorded; interrupted: stopped early (signal, deadline);
#: failed: stopped by an error (the records up to it are kept); killed: the writer died without closing
#: (SIGKILL, power loss): never written by a writer, only by the reader's recovered view (``rundir``).
RUN_STATES = ("running", "complete", "interrupted", "failed", "killed")


class Section(BaseModel):
    """A manifest section: typed where loadgen reads it, open to keys it only carries."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class MetricsScrapes(Section):
    """The target's /metrics scrapes of a run: how many were stored, how many skipped and why
    (``driver.metrics_scrape``); the server_metrics series has a gap at every skipped one."""

    stored: int = 0
    skipped: dict[str, int] = {}


class Harness(Section):
    name: str = "loadgen"
    version: str | None = None
    git_sha: str | None = None
    python: str | None = None
    python_implementation: str | None = None
    packages: dict[str, str | None] = {}
    pid: int | None = None
    monotonic_clock: str | None = None


class Host(Section):
    hostname_sha256: str | None = None
    os: str | None = None
    machine: str | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    memory_bytes: int | None = None
    gpus: list[dict[str, Any]] = []


class EngineIdentity(Section):
    name: str | None = None
    version: str | None = None
    config: dict[str, Any] | None = None


class TargetRef(Section):
    """What was measured: kind (sim | vllm | managed | openai-compatible | unknown), where, which model."""

    kind: str = "unknown"
    base_url: str | None = None  # without credentials
    model: str | None = None
    version: Any = None  # the target's GET /version body (redacted)
    engine: EngineIdentity | None = None
    served_models: list[str] = []


class ScenarioRef(Section):
    name: str | None = None
    path: str | None = None
    sha256: str | None = None
    content: dict[str, Any] | None = None  # the full validated scenario (rebuilds budgets without the file)


class TraceRef(Section):
    path: str | None = None
    sha256: str | None = None
    name: str | None = None
    seed: int | None = None
    metadata: dict[str, Any] = {}


class WarmState(Section):
    """The state the target was in when the measured run started, and what was done to reach it."""

    state: str = "unknown"  # warm | cold | unknown (requested but not achieved)
    requested: str | None = None
    achieved: bool | None = None
    actions: list[str] = []
    reason: str | None = None  # why the requested state was not achievable
    method: str | None = None  # how a cold state was reached: "restart" | "prefix_cache_reset"


class Anchor(Section):
    """The run's time origin: every *_ns in the records counts from ``perf_counter_ns``."""

    perf_counter_ns: int = 0
    utc: str | None = None
    clock: str | None = None  # set when the clock is not perf_counter (virtual time, synthesized)


class DriverInfo(Section):
    """How the driver replayed the trace, and what it cost (filled at the start and at the end)."""

    mode: str | None = None  # open | closed
    endpoint: str | None = None
    path: str | None = None
    concurrency: int | None = None
    tokenizer: str | None = None
    prompt_salt: str | None = None  # None: prompts are the trace's own (no salt)
    token_counter: str | None = None
    vllm_extensions: bool | None = None
    timeouts_s: dict[str, list[float | None]] = {}
    prompt_build_s: float | None = None
    scrape_metrics: bool | None = None
    timeout_origin: str | None = None
    target_notes: list[str] = []
    slot_waits: int | None = None
    sent_at_deadline: int | None = None
    rate_limited: int | None = None
    process_cpu_s: float | None = None  # this process only; the part writer's is part_writer_cpu_s
    part_writer: str | None = None  # what wrote the flushes' part files: process | thread | both
    part_writer_cpu_s: float | None = None  # the part writer process's user + system CPU
    part_writer_priority: str | None = None  # the part writer process's: idle (SCHED_IDLE) | low (nice 10) | normal
    rss_start_bytes: int | None = None
    max_rss_bytes: int | None = None
    peak_in_flight: int | None = None
    connections_opened: int | None = None
    cpu_affinity: str | None = None  # the CPUs the driver may run on (``--client-cpus``), kernel list notation


class WriterInfo(Section):
    """The process writing the run: how a reader tells a live run from one whose writer died."""

    pid: int | None = None
    hostname_sha256: str | None = None
    process_start_s: float | None = None  # the writer's process start (epoch s): a reused pid is not it
    flush_interval_s: float | None = None  # records reach disk at least this often (driver runs)


class LastFlush(Section):
    """The last part files written: what a killed run keeps."""

    utc: str | None = None
    ns: int | None = None  # on the run clock
    covered_until_ns: int | None = None  # every request scheduled before this instant has its row
    parts: int | None = None


class WorkerInfo(Section):
    """One worker of a run spread over workers (``--workers``/``--ray``): where it ran, what it cost."""

    worker_id: int = 0
    host_sha256: str | None = None
    node_ip: str | None = None  # Ray: the node's IP address
    pid: int | None = None
    clock_offset_ns: int | None = None  # its clock − the coordinator's (time.time_ns), corrected for
    clock_offset_uncertainty_ns: int | None = None  # half the shortest ping-pong round trip
    send_lag_ns: dict[str, int | None] = {}  # p50, p99, max, n (nearest rank, as the run's)
    cpu_user_s: float | None = None
    cpu_sys_s: float | None = None
    requests_assigned: int | None = None
    requests_sent: int | None = None  # rows with a sent_ns
    requests_completed: int | None = None  # rows with status ok
    requests_lost: int = 0  # recorded by the coordinator (error_kind worker_lost): the worker died first
    state: str | None = None  # its shard's state (complete, interrupted, killed ...)
    exit: str | None = None  # how the worker ended: "exit code 0", "killed by SIGKILL", "actor died"


class WorkersInfo(Section):
    """How a run was spread over workers; every worker's part files sit in the run's tables."""

    mode: str | None = None  # processes | ray
    count: int | None = None
    ray_address: str | None = None  # without credentials
    partition: str | None = None  # the rule that assigns a request to a worker
    start_utc: str | None = None  # the shared start instant
    start_lead_ns: int | None = None  # how far ahead of the start message the start instant was set
    coordination: dict[str, Any] = {}  # coordinator-side cost (CPU s, set-up s)
    workers: list[WorkerInfo] = []


def _finite_or_none(value: Any) -> Any:
    """A NaN or infinity is unknown, as the writer writes it (null); other values go on to their bounds."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class Manifest(BaseModel):
    """The identity of one run directory (see the module docstring and README "Run directories")."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    manifest_version: int = Field(default=MANIFEST_VERSION, ge=1)
    schema_version: str = SCHEMA_VERSION
    run_kind: str = "measured"
    state: str = "running"
    harness: Harness | None = None
    host: Host | None = None
    target: TargetRef = Field(default_factory=TargetRef)
    scenario: ScenarioRef | None = None
    trace: TraceRef | None = None
    options: dict[str, Any] = {}
    warm_state: WarmState = Field(default_factory=WarmState)
    order_index: int | None = None
    repeat: int | None = None
    plan_cell: dict[str, Any] | None = None
    started_utc: str | None = None
    ended_utc: str | None = None
    anchor: Anchor | None = None
    # a run's length and counts as figures show them: a negative or absurd one is a damaged manifest, refused
    duration_s: Annotated[
        Annotated[float, Field(ge=0, le=MAX_OFFSET_NS / 1e9)] | None, BeforeValidator(_finite_or_none)
    ] = None
    model_executed: bool = Field(False, alias="modelExecuted")
    benchmark_executed: bool = Field(False, alias="benchmarkExecuted")
    # each engine's own keys, typed where this repo writes them, open to others (loadgen.rundir.engine_notes)
    engine_notes: EngineNotes = Field(default_factory=EngineNotes)
    engine_config: dict[str, Any] | None = None  # the simulated engine's config (worksheet)
    behavior_relevant: dict[str, Any] = {}
    driver: DriverInfo | None = None
    send_lag_ns: dict[str, float | int | None] | None = None
    warnings: list[str] = []
    stopped_by_deadline: bool = False
    interrupted_by: str | None = None
    stopped_ns: int | None = None  # run clock: when a stopped run stopped (signal, deadline, write error, kill)
    writer: WriterInfo | None = None
    last_flush: LastFlush | None = None
    recovery: dict[str, Any] | None = None  # set by the reader's recovered view of a killed run
    scheduled_requests: int | None = Field(None, ge=0)
    status_counts: dict[str, Annotated[int, Field(ge=0)]] = {}
    requests_recorded: int | None = Field(None, ge=0)
    chunks_recorded: int | None = Field(None, ge=0)
    source: dict[str, Any] | None = None  # imported runs: the other tool's file
    synthesized: dict[str, Any] | None = None  # imported runs: which instants were synthesized, and how
    # sections added by the layer that ran this run
    plan_target: PlanTarget | None = None  # a launched target's identity and server process (sim, vllm)
    practice: dict[str, Any] | None = None
    handoff: dict[str, Any] | None = None
    workers: WorkersInfo | None = None  # a run spread over workers (``--workers``/``--ray``)
    metrics_scrapes: MetricsScrapes | None = None  # absent: no /metrics scraped

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the on-disk key names (``modelExecuted``, ...)."""
        return self.model_dump(mode="json", by_alias=True)

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, default=str)

    @property
    def send_lag_p99_ms(self) -> float | None:
        """The client's send-lag p99 in milliseconds (None: not recorded, e.g. an imported or simulated run)."""
        p99 = (self.send_lag_ns or {}).get("p99")
        return None if p99 is None else float(p99) / 1e6


def merge_sections(base: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """The one merge rule, on plain sections: dicts merge key by key, one level deep; anything else is replaced."""
    out = dict(base)
    for key, value in updates.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def merge_manifest(manifest: Manifest, updates: Mapping[str, Any] | Manifest) -> Manifest:
    """The one merge rule: ``updates`` (on-disk key names) over ``manifest``, sections one level deep."""
    if isinstance(updates, Manifest):
        updates = updates.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return _validate(merge_sections(manifest.to_dict(), updates), "manifest update")


#: The members of a ``Number`` (int | float) pydantic names in an error's place: not fields.
_NUMBER_TAGS = ("int", "float")


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    err = errors[0]
    if err["loc"][-1:] == ("int",):  # a Number: its float member's words ("a valid number") say what is expected
        err = next((e for e in errors if e["loc"] == (*err["loc"][:-1], "float")), err)
    where = ".".join(str(p) for p in err["loc"] if p not in _NUMBER_TAGS) or "(top level)"
    return f"field {where}: {err['msg'].lower()} (got {str(err.get('input'))[:80]!r})"


def _validate(data: Any, origin: str) -> Manifest:
    if not isinstance(data, dict):
        raise RunDirError(f"{origin}: a JSON {type(data).__name__}: expected a manifest object")
    data = _upgrade(data)
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise RunDirError(f"{origin}: {_first_error(exc)}: expected a loadgen manifest") from None


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older manifest to the current version (version 1 has the same sections)."""
    version = data.get("manifest_version", 1)
    if version == 1:
        data = {**data, "manifest_version": MANIFEST_VERSION}
    return data


def version_notes(manifest: Manifest) -> list[str]:
    """What a reader should know of a run written by a newer (or unknown) loadgen: its record schema, its manifest
    version. Empty for a run this version wrote or reads fully."""
    notes = [note for note in (record_schema_note(manifest.schema_version),) if note]
    if manifest.manifest_version > MANIFEST_VERSION:
        notes.append(
            f"manifest version {manifest.manifest_version} is newer than this loadgen's ({MANIFEST_VERSION}): "
            "sections it added are kept but not read"
        )
    return notes


def _not_a_run(path: Path) -> str:
    """What a directory without a manifest is, and where its runs are: `bench --out DIR` writes its run in DIR/run,
    a plan its runs under DIR/cells/."""
    if not path.is_dir():
        return "a file, not a directory" if path.exists() else "no such directory"
    if (path / PLAN_FILE).is_file():
        return (
            f"a plan directory ({PLAN_FILE}; its runs are under {path / 'cells'}, and loadgen compare takes it whole)"
        )
    runs = sorted(child for child in path.iterdir() if (child / MANIFEST_FILE).is_file())
    if len(runs) == 1:
        return f"no {MANIFEST_FILE} (the run directory {runs[0]} is inside it)"
    if runs:
        return f"no {MANIFEST_FILE} ({len(runs)} run directories are inside it, {runs[0]} the first)"
    return f"no {MANIFEST_FILE}"


def read_manifest(run_dir: str | Path) -> Manifest:
    """Read and validate a run directory's manifest.json (any version)."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.is_file():
        raise RunDirError(f"{run_dir}: {_not_a_run(Path(run_dir))}: expected a loadgen run directory")
    return _validate(read_json_object(path, "a manifest object", RunDirError), str(path))


def _finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: non-finite floats are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_manifest(run_dir: str | Path, manifest: Manifest, *, reserve_bytes: int = 0) -> None:
    """Write manifest.json atomically and durably (a synced temp file, then rename; the temp file never
    outlives a failure).

    ``reserve_bytes``: pad the file with trailing whitespace (still valid JSON) to at least this size,
    so that when the disk is full later, the final manifest can still be written over it in place.
    """
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST_FILE
    tmp = run_dir / (MANIFEST_FILE + ".tmp")
    text = json.dumps(_finite(manifest.to_dict()), indent=2, sort_keys=True, default=str) + "\n"
    data = text.encode()
    if len(data) < reserve_bytes:
        data += b" " * (reserve_bytes - len(data) - 1) + b"\n"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # what a reader finds after a power loss is this file or the previous one
        os.replace(tmp, path)
        _fsync_dir(run_dir)
    except OSError:
        tmp.unlink(missing_ok=True)
        if not _overwrite_in_place(path, data):
            raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _overwrite_in_place(path: Path, data: bytes) -> bool:
    """The fallback when no new file fits (disk full): overwrite an existing, large enough manifest,
    padded to the size it had (trailing whitespace), so the room stays for the next write in place."""
    try:
        size = path.stat().st_size if path.is_file() else 0
        if size < len(data):
            return False
        if size > len(data):
            data = data[:-1] + b" " * (size - len(data)) + b"\n"
        with open(path, "r+b") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        return False
    return True


def amend_manifest(run_dir: str | Path, updates: Mapping[str, Any]) -> Manifest:
    """What a layer learns after the run (e.g. an engine's memory high-water mark), merged on disk."""
    manifest = merge_manifest(read_manifest(run_dir), updates)
    write_manifest(run_dir, manifest)
    return manifest
