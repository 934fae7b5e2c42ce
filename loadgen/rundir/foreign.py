"""Import other tools' per-request results into run directories, so archived runs compare on one footing.

* LLMPerf ``individual/*.json`` (a list of per-request records: ``ttft_s``,
  ``end_to_end_latency_s``, token counts, ``error_code``). There are no chunk times and no send
  times, so the instants are **synthesized**: requests are placed in file order on ``concurrency``
  slots (default: ``num_concurrent_requests`` of the matching ``summary/`` file, else 1), each slot
  running its requests back to back: scheduled = sent = the slot's free instant, first token =
  sent + ttft, done = sent + E2E. TTFT, E2E and their quantiles are exact (to the nanosecond); the
  timeline, rates, client queue, stability and Little's Law are not measurements, and the manifest
  says so under ``synthesized`` (the analyzer then refuses stability and flags rates). No chunks.
* vLLM ``bench serve --save-result --save-detailed`` JSON (``ttfts``, ``itls``, ``input_lens``,
  ``output_lens``, ``errors`` and, in newer versions, ``latencies``, ``start_times``,
  ``queue_times``). With ``start_times`` the send instants are real (scheduled = sent − queue time
  when ``queue_times`` exists, else = sent); without them they are synthesized as above. Chunks
  are rebuilt from ``itls`` (one row per streamed chunk). vLLM counts every chunk as one
  inter-token sample, so each chunk carries 1 token unless the output has more tokens than
  chunks, when the tokens are spread evenly (both cases noted in the manifest); the recorded
  ``client_output_tokens`` is vLLM's ``output_lens`` either way, so ITL and TTFT reproduce vLLM's
  own numbers.

Both write through ``RunWriter`` with ``run_kind: "imported"``.
"""

from __future__ import annotations

import heapq
import re
from pathlib import Path
from typing import Any

from loadgen.rundir.foreign_input import (
    LlmperfRecord,
    VllmBenchResult,
    read_llmperf_records,
    read_llmperf_summary,
    read_vllm_bench_result,
)
from loadgen.rundir.identity import harness_identity, sha256_file, utc_now_iso
from loadgen.rundir.io import RunWriter
from loadgen.rundir.manifest import Anchor, Manifest, TargetRef
from loadgen.rundir.plausible import checked_row
from loadgen.rundir.schema import empty_request_row, http_error_kind
from loadgen.util.errors import RunDirError
from loadgen.util.jsonfile import read_json

__all__ = ["import_llmperf", "import_vllm_bench", "llmperf_error_kind"]

NS = 1_000_000_000


def _load_json(path: Path) -> Any:
    return read_json(path, "a results JSON file", RunDirError)


def _ns(seconds: Any) -> int:
    return round(float(seconds) * NS)


def _clean_url(url: Any) -> str | None:
    """A base URL without user-info or query (no credentials recorded)."""
    if not url:
        return None
    return re.sub(r"//[^/@]*@", "//", str(url)).split("?")[0]


def llmperf_error_kind(code: Any) -> tuple[str, int | None]:
    """(error_kind, http_status) for an LLMPerf ``error_code`` (HTTP codes map to http_*)."""
    try:
        code_i = int(float(code))
    except (TypeError, ValueError, OverflowError):  # not a number, or an infinite one
        return "client", None
    # a status line's code has three digits (600-999 are a server's failure, as the driver maps them); LLMPerf's
    # own codes are small negatives: anything past is neither
    if not -999 <= code_i <= 999:
        return "client", None
    kind = http_error_kind(code_i)
    return kind, (
        None if kind == "client" else code_i
    )  # LLMPerf's own negative codes (-1 exception, -100 too few tokens)


class _Slots:
    """Back-to-back placement of ``n`` requests on ``k`` concurrency slots (earliest-free slot first; slots
    beyond ``n`` would never be used, so at most ``n`` are made)."""

    def __init__(self, k: int, n: int) -> None:
        self.heap = [(0, i) for i in range(max(1, min(k, n)))]

    def place(self, duration_ns: int) -> int:
        start, slot = heapq.heappop(self.heap)
        heapq.heappush(self.heap, (start + max(0, duration_ns), slot))
        return start


def _manifest(
    tool: str,
    path: Path,
    extra_source: dict[str, Any],
    target: dict[str, Any],
    synthesized: dict[str, Any],
    options: dict[str, Any],
) -> Manifest:
    now = utc_now_iso()
    return Manifest(
        run_kind="imported",
        harness=harness_identity(),
        target=TargetRef.model_validate(target),
        options=options,
        started_utc=now,
        anchor=Anchor(perf_counter_ns=0, utc=now),
        source={"tool": tool, "path": str(path), "sha256": sha256_file(path), **extra_source},
        synthesized=synthesized,
    )


def _find_llmperf_summary(path: Path) -> Path | None:
    cand = path.parent.parent / "summary" / path.name
    return cand if cand.is_file() else None


#: What an LLMPerf import can and cannot say (the manifest's ``synthesized``, less its method).
_LLMPERF_SYNTHESIZED: dict[str, Any] = {
    "chunks": False,
    "not_meaningful": [
        "offered_rps",
        "send_rps",
        "completed_rps",
        "token rates",
        "client_queue_ms",
        "timeseries",
        "stability",
    ],
    "exact": ["ttft_ms", "e2e_ms", "server_ttft_ms", "status and error counts", "token counts"],
}


def import_llmperf(
    path: Path | str,
    out_dir: Path | str,
    *,
    concurrency: int | None = None,
    request_class: str = "imported",
    summary: Path | str | None = None,
) -> Path:
    """LLMPerf ``individual`` JSON → run directory at ``out_dir``; returns it. See module docstring."""
    path = Path(path)
    rows = read_llmperf_records(path, _load_json(path))
    summary_path = Path(summary) if summary else _find_llmperf_summary(path)
    summ = read_llmperf_summary(summary_path, _load_json(summary_path)).model_dump() if summary_path else {}
    if concurrency is None:
        concurrency = int(summ.get("num_concurrent_requests") or 1)
    target = {
        "kind": "unknown",
        "base_url": _clean_url(summ.get("api")),
        "model": summ.get("model"),
        "version": None,
        "engine": None,
    }
    method = f"file order on {concurrency} back-to-back concurrency slot(s); scheduled = sent"
    synthesized = {"timing": True, "method": method, **_LLMPERF_SYNTHESIZED}
    options = {"importer": "llmperf", "concurrency": concurrency, "request_class": request_class}
    extra = {
        "summary_path": str(summary_path) if summary_path else None,
        "summary_name": summ.get("name"),
        "framework": summ.get("framework"),
    }
    manifest = _manifest("llmperf", path, extra, target, synthesized, options)
    slots = _Slots(concurrency, len(rows))
    target_out = summ.get("mean_output_tokens")
    requests = []
    for i, r in enumerate(rows):
        start = slots.place(_ns(r.end_to_end_latency_s or 0))
        row = _llmperf_row(f"{path.stem}-{i:05d}", r, start, request_class, target_out)
        requests.append(checked_row(path, row, i))
    with RunWriter(Path(out_dir), manifest) as writer:
        for row in requests:
            writer.add_request(row)
        writer.close({"ended_utc": utc_now_iso(), "duration_s": None})
    return Path(out_dir)


def _llmperf_row(request_id: str, r: LlmperfRecord, start: int, request_class: str, target_out: Any) -> dict[str, Any]:
    """One LLMPerf record as a request row starting at ``start`` ns (its slot); an error code as its kind."""
    ttft = r.ttft_s or 0
    got_token = ttft > 0
    out_tokens = r.number_output_tokens
    row = empty_request_row(
        request_id=request_id,
        request_class=request_class,
        scheduled_ns=start,
        slot_acquired_ns=start,
        sent_ns=start,
        first_token_ns=start + _ns(ttft) if got_token else None,
        done_ns=start + _ns(r.end_to_end_latency_s or 0),
        target_prompt_tokens=r.number_input_tokens or 0,
        target_output_tokens=int(target_out if target_out is not None else (out_tokens or 0)),
        client_prompt_tokens=r.number_input_tokens,
        client_output_tokens=out_tokens if got_token else None,
    )
    code = r.error_code
    if code is None:
        row["status"] = "ok"
        return row
    kind, http = llmperf_error_kind(code)
    msg = r.error_msg.splitlines()[0] if r.error_msg else ""
    row.update(
        status="error", error_kind=kind, http_status=http, error_message=f"llmperf error_code {code}: {msg}"[:300]
    )
    return row


def _vllm_timing_notes(data: dict[str, Any], measured: bool, conc: Any) -> list[str]:
    """What the result lacks, so which instants are synthesized (the first note names the method)."""
    notes: list[str] = []
    if not measured:
        notes.append(f"no start_times: send instants synthesized on {conc} back-to-back slot(s)")
    elif not isinstance(data.get("queue_times"), list):
        notes.append("no queue_times: scheduled = sent (client queue unknown)")
    if not isinstance(data.get("latencies"), list):
        notes.append("no latencies: done = last token")
    return notes


def _vllm_manifest(path: Path, data: dict[str, Any], request_class: str, synthesized: dict[str, Any]) -> Manifest:
    target: dict[str, Any] = {
        "kind": "unknown",
        "base_url": None,
        "model": data.get("model_id"),
        "version": None,
        "engine": {"name": data.get("backend"), "version": None, "config": {}} if data.get("backend") else None,
    }
    options = {
        "importer": "vllm-bench",
        "request_class": request_class,
        "request_rate": data.get("request_rate"),
        "burstiness": data.get("burstiness"),
        "max_concurrency": data.get("max_concurrency"),
    }
    return _manifest(
        "vllm-bench-serve",
        path,
        {"date": data.get("date"), "duration_s": data.get("duration")},
        target,
        synthesized,
        options,
    )


class _VllmSample:
    """One request of a vLLM result: TTFT, inter-token gaps and E2E in seconds, output length, error text."""

    def __init__(self, data: VllmBenchResult, i: int) -> None:
        self.error = (data.errors[i] or "") if data.errors is not None else ""
        self.ok = not self.error
        self.ttft_s = data.ttfts[i] or 0.0
        self.itl_s = data.itls[i] or []
        self.input_len = data.input_lens[i] or 0
        self.output_len = data.output_lens[i] or 0
        latency = data.latencies[i] if data.latencies is not None else None
        self.e2e_s = latency if latency is not None else self.ttft_s + sum(self.itl_s)


class _VllmClock:
    """Send instants: real (``start_times``, minus ``queue_times`` for scheduled), or synthesized on
    back-to-back concurrency slots. The run's zero is the earliest scheduled instant (a start less its queue
    time), so no request is scheduled before the run's anchor: anchoring at the first start put a first
    request that had queued at a negative ``scheduled_ns``."""

    def __init__(self, data: VllmBenchResult, n: int, conc: int) -> None:
        self.starts = data.start_times or []
        self.measured = data.start_times is not None
        self.queues = data.queue_times
        self.t0 = min(self.starts[i] - self._queue_s(i) for i in range(n)) if self.measured and n else 0.0
        self.slots = _Slots(conc, n)

    def _queue_s(self, i: int) -> float:
        """Request ``i``'s client queue time, s (0 where the file has none)."""
        q = self.queues[i] if self.queues is not None else None
        return q or 0.0

    def place(self, i: int, e2e_s: float) -> tuple[int, int]:
        """(sent_ns, scheduled_ns) of request ``i``: scheduled is computed as the anchor was, so it is never
        below 0."""
        if self.measured:
            start = self.starts[i]
            return _ns(start - self.t0), _ns(start - self._queue_s(i) - self.t0)
        sent = self.slots.place(_ns(e2e_s))
        return sent, sent


def _vllm_chunks(request_id: str, sent: int, sample: _VllmSample) -> tuple[dict[str, list[Any]], bool]:
    """Chunk columns rebuilt from TTFT and the gaps, and whether the tokens did not map one per chunk."""
    arrivals = [sent + _ns(sample.ttft_s)]
    for gap in sample.itl_s:
        arrivals.append(arrivals[-1] + _ns(gap))
    m = len(arrivals)
    out_len = sample.output_len
    if out_len <= m:  # vLLM's own reading: every chunk is one inter-token sample
        tokens = [1] * m
        uneven = out_len != m
    else:  # multi-token chunks: spread the tokens evenly, at least one per chunk
        uneven = True
        q, r = divmod(out_len, m)
        tokens = [q + 1 if j < r else q for j in range(m)]
    columns: dict[str, list[Any]] = {
        "request_id": [request_id] * m,
        "seq": list(range(m)),
        "arrival_ns": arrivals,
        "tokens": tokens,
        "bytes": [0] * m,
    }
    return columns, uneven


def _vllm_error_columns(err: Any) -> dict[str, Any]:
    """Outcome columns of a failed request; the HTTP status is read from the error text when it has one."""
    text = str(err).splitlines()[0] if str(err).strip() else "error"
    m_http = re.search(r"\b([45]\d\d)\b", str(err))
    code = int(m_http.group(1)) if m_http else None
    return {"status": "error", "error_kind": http_error_kind(code), "http_status": code, "error_message": text[:300]}


def _vllm_request(
    path: Path, i: int, result: VllmBenchResult, clock: _VllmClock, request_class: str
) -> tuple[dict[str, Any], dict[str, list[Any]] | None, int]:
    """Request ``i`` of a vLLM result: its row (checked as a reader would), its chunks rebuilt from its gaps
    (None when no token came), and 1 when its tokens were spread over fewer chunks."""
    sample = _VllmSample(result, i)
    sent, scheduled = clock.place(i, sample.e2e_s)
    row = empty_request_row(
        request_id=f"{path.stem}-{i:05d}",
        request_class=request_class,
        scheduled_ns=scheduled,
        slot_acquired_ns=sent,
        sent_ns=sent,
        target_prompt_tokens=sample.input_len,
        target_output_tokens=sample.output_len,
        client_prompt_tokens=sample.input_len,
        done_ns=sent + _ns(sample.e2e_s) if (sample.ok or sample.e2e_s > 0) else sent,
    )
    chunks, spread = None, 0
    if sample.ok and sample.ttft_s > 0:
        chunks, spread = _vllm_chunks(str(row["request_id"]), sent, sample)
        arrivals = chunks["arrival_ns"]
        row.update(
            first_token_ns=arrivals[0],
            last_token_ns=arrivals[-1],
            client_output_tokens=sample.output_len,
            chunk_count=len(arrivals),
            status="ok",
        )
    elif sample.ok:
        row.update(status="error", error_kind="empty_output", error_message="no first token recorded")
    else:
        row.update(_vllm_error_columns(sample.error))
    return checked_row(path, row, i), chunks, spread


def import_vllm_bench(
    path: Path | str, out_dir: Path | str, *, request_class: str = "imported", concurrency: int | None = None
) -> Path:
    """vLLM ``bench serve --save-detailed`` result JSON → run directory; returns it."""
    path = Path(path)
    data = _load_json(path)
    result = read_vllm_bench_result(path, data)
    n = len(result.ttfts)
    measured = result.start_times is not None
    conc = concurrency or result.max_concurrency or 1
    notes = _vllm_timing_notes(data, measured, conc)
    synthesized = {
        "timing": not measured,
        "method": notes[0] if notes else "start_times are real send instants",
        "chunks": "rebuilt from itls",
        "notes": notes,
    }
    manifest = _vllm_manifest(path, data, request_class, synthesized)
    clock = _VllmClock(result, n, conc)
    requests = [_vllm_request(path, i, result, clock, request_class) for i in range(n)]
    uneven = sum(spread for _, _, spread in requests)
    if uneven:
        notes.append(
            f"{uneven} request(s): output tokens != chunks; one token per chunk, or tokens spread "
            f"evenly when there are more tokens than chunks"
        )
    with RunWriter(Path(out_dir), manifest) as writer:
        for row, chunks, _ in requests:
            if chunks is not None:
                writer.add_chunks(chunks)
            writer.add_request(row)
        writer.close({"ended_utc": utc_now_iso(), "duration_s": result.duration, "synthesized": synthesized})
    return Path(out_dir)
