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
import json
import re
from pathlib import Path
from typing import Any

from .errors import RunDirError
from .identity import harness_identity, sha256_file, utc_now_iso
from .records import empty_request_row
from .manifest import Anchor, Manifest, TargetRef
from .rundir import RunWriter

__all__ = ["import_llmperf", "import_vllm_bench", "llmperf_error_kind"]

NS = 1_000_000_000


def _load_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RunDirError(f"{path}: no such file: expected a results JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path}: invalid JSON ({exc}): expected a results JSON file") from None


def _ns(seconds: Any) -> int:
    return int(round(float(seconds) * NS))


def _clean_url(url: Any) -> str | None:
    """A base URL without user-info or query (no credentials recorded)."""
    if not url:
        return None
    return re.sub(r"//[^/@]*@", "//", str(url)).split("?")[0]


def llmperf_error_kind(code: Any) -> tuple[str, int | None]:
    """(error_kind, http_status) for an LLMPerf ``error_code`` (HTTP codes map to http_*)."""
    try:
        code_i = int(float(code))
    except (TypeError, ValueError):
        return "client", None
    if code_i == 429:
        return "http_429", 429
    if 400 <= code_i < 500:
        return "http_4xx", code_i
    if 500 <= code_i < 600:
        return "http_5xx", code_i
    return "client", None  # LLMPerf's own negative codes (-1 exception, -100 too few tokens)


class _Slots:
    """Back-to-back placement of requests on ``k`` concurrency slots (earliest-free slot first)."""

    def __init__(self, k: int) -> None:
        self.heap = [(0, i) for i in range(max(1, k))]

    def place(self, duration_ns: int) -> int:
        start, slot = heapq.heappop(self.heap)
        heapq.heappush(self.heap, (start + max(0, duration_ns), slot))
        return start


def _manifest(tool: str, path: Path, extra_source: dict[str, Any], target: dict[str, Any],
              synthesized: dict[str, Any], options: dict[str, Any]) -> Manifest:
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


def import_llmperf(path: Path | str, out_dir: Path | str, *, concurrency: int | None = None,
                   request_class: str = "imported", summary: Path | str | None = None) -> Path:
    """LLMPerf ``individual`` JSON → run directory at ``out_dir``; returns it. See module docstring."""
    path = Path(path)
    rows = _load_json(path)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise RunDirError(f"{path}: expected a JSON list of LLMPerf per-request records")
    for i, r in enumerate(rows):
        for key in ("ttft_s", "end_to_end_latency_s"):
            if key not in r:
                raise RunDirError(f"{path}: record [{i}] has no {key}: expected an LLMPerf individual record")
    summary_path = Path(summary) if summary else _find_llmperf_summary(path)
    summ = _load_json(summary_path) if summary_path else {}
    if concurrency is None:
        concurrency = int(summ.get("num_concurrent_requests") or 1)
    target = {"kind": "unknown", "base_url": _clean_url(summ.get("api")), "model": summ.get("model"),
              "version": None, "engine": None}
    synthesized = {
        "timing": True,
        "method": f"file order on {concurrency} back-to-back concurrency slot(s); scheduled = sent",
        "chunks": False,
        "not_meaningful": ["offered_rps", "send_rps", "completed_rps", "token rates", "client_queue_ms",
                           "timeseries", "stability"],
        "exact": ["ttft_ms", "e2e_ms", "server_ttft_ms", "status and error counts", "token counts"],
    }
    options = {"importer": "llmperf", "concurrency": concurrency, "request_class": request_class}
    extra = {"summary_path": str(summary_path) if summary_path else None,
             "summary_name": summ.get("name"), "framework": summ.get("framework")}
    manifest = _manifest("llmperf", path, extra, target, synthesized, options)
    slots = _Slots(concurrency)
    target_out = summ.get("mean_output_tokens")
    with RunWriter(Path(out_dir), manifest) as writer:
        for i, r in enumerate(rows):
            code = r.get("error_code")
            ttft = r.get("ttft_s") or 0
            e2e = r.get("end_to_end_latency_s") or 0
            e2e_ns = _ns(e2e)
            start = slots.place(e2e_ns)
            got_token = float(ttft) > 0
            out_tokens = r.get("number_output_tokens")
            row = empty_request_row(
                request_id=f"{path.stem}-{i:05d}",
                request_class=request_class,
                scheduled_ns=start, slot_acquired_ns=start, sent_ns=start,
                first_token_ns=start + _ns(ttft) if got_token else None,
                done_ns=start + e2e_ns,
                target_prompt_tokens=int(r.get("number_input_tokens") or 0),
                target_output_tokens=int(target_out if target_out is not None else (out_tokens or 0)),
                client_prompt_tokens=r.get("number_input_tokens"),
                client_output_tokens=int(out_tokens) if got_token and out_tokens is not None else None,
            )
            if code is None:
                row["status"] = "ok"
            else:
                kind, http = llmperf_error_kind(code)
                msg = str(r.get("error_msg") or "").splitlines()[0] if r.get("error_msg") else ""
                row.update(status="error", error_kind=kind, http_status=http,
                           error_message=f"llmperf error_code {code}: {msg}"[:300])
            writer.add_request(row)
        writer.close({"ended_utc": utc_now_iso(), "duration_s": None})
    return Path(out_dir)


def import_vllm_bench(path: Path | str, out_dir: Path | str, *, request_class: str = "imported",
                      concurrency: int | None = None) -> Path:
    """vLLM ``bench serve --save-detailed`` result JSON → run directory; returns it."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected a vLLM bench serve result object")
    for key in ("ttfts", "itls", "input_lens", "output_lens"):
        if not isinstance(data.get(key), list):
            raise RunDirError(f"{path}: no per-request {key!r} list: expected a result saved with --save-detailed")
    n = len(data["ttfts"])
    errors = data.get("errors") or [""] * n
    latencies = data.get("latencies")
    starts = data.get("start_times")
    queues = data.get("queue_times")
    measured = isinstance(starts, list) and len(starts) == n
    conc = concurrency or data.get("max_concurrency") or 1
    notes: list[str] = []
    if not measured:
        notes.append(f"no start_times: send instants synthesized on {conc} back-to-back slot(s)")
    elif not isinstance(queues, list):
        notes.append("no queue_times: scheduled = sent (client queue unknown)")
    if not isinstance(latencies, list):
        notes.append("no latencies: done = last token")
    synthesized = {"timing": not measured, "method": notes[0] if notes else "start_times are real send instants",
                   "chunks": "rebuilt from itls", "notes": notes}
    target = {"kind": "unknown", "base_url": None, "model": data.get("model_id"), "version": None,
              "engine": {"name": data.get("backend"), "version": None, "config": {}} if data.get("backend") else None}
    options = {"importer": "vllm-bench", "request_class": request_class, "request_rate": data.get("request_rate"),
               "burstiness": data.get("burstiness"), "max_concurrency": data.get("max_concurrency")}
    manifest = _manifest("vllm-bench-serve", path, {"date": data.get("date"), "duration_s": data.get("duration")},
                         target, synthesized, options)
    t0 = min(float(s) for s in starts) if measured and n else 0.0
    slots = _Slots(int(conc))
    uneven = 0
    with RunWriter(Path(out_dir), manifest) as writer:
        for i in range(n):
            err = errors[i] if i < len(errors) else ""
            ok = not err
            ttft = float(data["ttfts"][i] or 0)
            itl = [float(x) for x in (data["itls"][i] or [])]
            out_len = int(data["output_lens"][i] or 0)
            e2e = float(latencies[i]) if isinstance(latencies, list) and latencies[i] is not None else ttft + sum(itl)
            if measured:
                sent = _ns(float(starts[i]) - t0)
                queue = _ns(queues[i]) if isinstance(queues, list) and queues[i] is not None else 0
            else:
                sent, queue = slots.place(_ns(e2e)), 0
            scheduled = sent - max(0, queue)
            row = empty_request_row(
                request_id=f"{path.stem}-{i:05d}", request_class=request_class,
                scheduled_ns=scheduled, slot_acquired_ns=sent, sent_ns=sent,
                target_prompt_tokens=int(data["input_lens"][i] or 0), target_output_tokens=out_len,
                client_prompt_tokens=int(data["input_lens"][i] or 0),
                done_ns=sent + _ns(e2e) if (ok or e2e > 0) else sent,
            )
            if ok and ttft > 0:
                arrivals = [sent + _ns(ttft)]
                for gap in itl:
                    arrivals.append(arrivals[-1] + _ns(gap))
                m = len(arrivals)
                if out_len <= m:  # vLLM's own reading: every chunk is one inter-token sample
                    tokens = [1] * m
                    uneven += out_len != m
                else:  # multi-token chunks: spread the tokens evenly, at least one per chunk
                    uneven += 1
                    q, r = divmod(out_len, m)
                    tokens = [q + 1 if j < r else q for j in range(m)]
                writer.add_chunks({"request_id": [row["request_id"]] * m, "seq": list(range(m)),
                                   "arrival_ns": arrivals, "tokens": tokens, "bytes": [0] * m})
                row.update(first_token_ns=arrivals[0], last_token_ns=arrivals[-1], client_output_tokens=out_len,
                           chunk_count=m, status="ok")
            elif ok:
                row.update(status="error", error_kind="empty_output", error_message="no first token recorded")
            else:
                text = str(err).splitlines()[0] if str(err).strip() else "error"
                m_http = re.search(r"\b([45]\d\d)\b", str(err))
                code = int(m_http.group(1)) if m_http else None
                kind = ("http_429" if code == 429 else "http_4xx" if code and code < 500 else
                        "http_5xx" if code else "client")
                row.update(status="error", error_kind=kind, http_status=code, error_message=text[:300])
            writer.add_request(row)
        if uneven:
            notes.append(f"{uneven} request(s): output tokens != chunks; one token per chunk, or tokens spread "
                         f"evenly when there are more tokens than chunks")
        writer.close({"ended_utc": utc_now_iso(), "duration_s": data.get("duration"), "synthesized": synthesized})
    return Path(out_dir)
