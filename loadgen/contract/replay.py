"""Replay frozen cases against a serving candidate, alone or under load, and diff against a reference.

Each case is sent once (non-streaming by default; ``stream=True`` reads SSE with the usage chunk)
with its deterministic settings (temperature 0, seed, max_tokens, stop), the ``X-Loadgen-Case``
header (ignored by real engines; the simulated engine's responder uses it) and the API key from an
environment variable (never recorded). 429 answers are retried after their Retry-After, and recorded. The result keeps, per case, every check's
expected vs got, the settings and the answer text (contract prompts are frozen test material, not
user data).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx

from loadgen.rundir.identity import utc_now_iso
from loadgen.rundir.schema import CONTRACT_FILE
from loadgen.util.errors import RunDirError, TargetError
from loadgen.util.inputs import UNSET_API_KEY
from loadgen.util.jsonfile import read_json_object
from loadgen.util.outputfile import write_output_text
from loadgen.workload.scenario import load_scenario

from ..driver import RunOptions, run_trace
from ..driver.bounded import bounded_get, bounded_request
from ..driver.error_kinds import parse_retry_after
from ..driver.sse import Chunk, SSEProtocolError, chunk_from_object, parse_chunk
from ..trace.io import read_trace
from ..util.redact import redact, redact_url, url_secrets, with_encodings, without_secrets
from ..util.targeturl import split_target_url
from .cases import Case, CaseSet
from .checks import CheckOutcome, Observed, run_checks
from .responder import CASE_HEADER
from .result import CONTRACT_SCHEMA_VERSION, ContractDocument, ReferenceDiff
from .result import CaseDiff as CaseDiffResult

__all__ = [
    "ANSWER_MAX_BYTES",
    "CONTRACT_FILE",
    "CaseDiff",
    "CaseResult",
    "ContractDiff",
    "ContractResult",
    "diff",
    "read_contract",
    "render_messages_as_prompt",
    "replay_cases",
    "replay_cases_sync",
    "replay_under_load",
    "write_contract",
]

_MAX_TEXT = 4000
#: Most bytes of one case's answer read (what is read, not only what is kept): more is a failed case.
ANSWER_MAX_BYTES = 16 << 20


def _redact(message: str, secrets: tuple[str, ...]) -> str:

    return redact(message, secrets)


def _redact_url(url: str) -> str:

    return redact_url(url)


@dataclass
class CaseResult:
    case_id: str
    passed: bool
    checks: list[CheckOutcome]
    settings: dict[str, Any]
    observed: Observed
    attempts: int = 1
    retry_after_s: list[float] = field(default_factory=list)
    elapsed_ms: float | None = None
    rounds: int = 1  # under load: how many times the case was replayed
    rounds_failed: int = 0
    distinct_answers: int = 1  # different answer texts over the rounds

    def to_dict(self) -> dict[str, Any]:
        obs = asdict(self.observed)
        if obs["text"] is not None and len(obs["text"]) > _MAX_TEXT:
            obs["text"] = obs["text"][:_MAX_TEXT]
            obs["text_truncated"] = True
        return {
            "case_id": self.case_id,
            "passed": self.passed,
            "checks": [c.to_dict() for c in self.checks],
            "settings": self.settings,
            "observed": obs,
            "attempts": self.attempts,
            "retry_after_s": self.retry_after_s,
            "elapsed_ms": self.elapsed_ms,
            "rounds": self.rounds,
            "rounds_failed": self.rounds_failed,
            "distinct_answers": self.distinct_answers,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        obs = dict(data["observed"])
        obs.pop("text_truncated", None)
        return cls(
            case_id=data["case_id"],
            passed=data["passed"],
            checks=[CheckOutcome(**c) for c in data["checks"]],
            settings=data["settings"],
            observed=Observed(**obs),
            attempts=data.get("attempts", 1),
            retry_after_s=list(data.get("retry_after_s", [])),
            elapsed_ms=data.get("elapsed_ms"),
            rounds=data.get("rounds", 1),
            rounds_failed=data.get("rounds_failed", 0),
            distinct_answers=data.get("distinct_answers", 1),
        )


@dataclass
class CaseDiff:
    """One case compared with the reference candidate.

    status: ``same_pass``, ``same_fail`` (same checks fail), ``regressed`` (reference passed,
    candidate fails), ``fixed`` (reference failed, candidate passes), ``changed_checks`` (both fail,
    different checks), ``missing`` (not replayed on the candidate), ``extra`` (not in the reference).
    """

    case_id: str
    status: str
    reference_failed: list[str]
    candidate_failed: list[str]
    output_changed: bool


@dataclass
class ContractDiff:
    cases: list[CaseDiff]

    @property
    def regressions(self) -> list[str]:
        return [c.case_id for c in self.cases if c.status in ("regressed", "changed_checks", "missing")]

    @property
    def changed(self) -> bool:
        """Any case whose pass/fail pattern differs from the reference (improvements included)."""
        return any(c.status not in ("same_pass", "same_fail") for c in self.cases)

    @property
    def rejects(self) -> bool:
        """The candidate changes contract behaviour for the worse: reject before any cost comparison."""
        return bool(self.regressions)

    def result(self) -> ReferenceDiff:
        """The typed result (``loadgen schema contract-diff``; contract.json's ``reference_diff``)."""
        return ReferenceDiff(
            rejects=self.rejects,
            changed=self.changed,
            regressions=self.regressions,
            outputs_changed=[c.case_id for c in self.cases if c.output_changed],
            cases=[CaseDiffResult(**asdict(c)) for c in self.cases],
        )

    def to_dict(self) -> dict[str, Any]:
        return self.result().document()


@dataclass
class ContractResult:
    """Per-case pass/fail for one candidate; ``passed`` only when every case passed."""

    cases: list[CaseResult]
    target: dict[str, Any]
    mode: str = "alone"  # alone | under_load
    sources: list[dict[str, str]] = field(default_factory=list)
    started_utc: str | None = None
    ended_utc: str | None = None
    notes: list[str] = field(default_factory=list)
    reference_diff: ContractDiff | None = None
    run_dir: str | None = None  # under_load: the run it was mixed into

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Every failed check: case id, check kind, expected, got."""
        return [
            {"case_id": c.case_id, "kind": o.kind, "expected": o.expected, "got": o.got}
            for c in self.cases
            for o in c.checks
            if not o.passed
        ]

    def by_id(self) -> dict[str, CaseResult]:
        return {c.case_id: c for c in self.cases}

    def summary(self) -> str:
        n_ok = sum(c.passed for c in self.cases)
        line = f"contract {'PASSED' if self.passed else 'FAILED'}: {n_ok}/{len(self.cases)} cases passed ({self.mode})"
        if self.reference_diff is not None:
            line += f"; vs reference: {'REJECT (behaviour changed: ' + ', '.join(self.reference_diff.regressions) + ')' if self.reference_diff.rejects else 'no regression'}"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "loadgen.contract_result",
            "version": CONTRACT_SCHEMA_VERSION,
            "passed": self.passed,
            "mode": self.mode,
            "n_cases": len(self.cases),
            "n_passed": sum(c.passed for c in self.cases),
            "target": self.target,
            "sources": self.sources,
            "started_utc": self.started_utc,
            "ended_utc": self.ended_utc,
            "run_dir": self.run_dir,
            "notes": self.notes,
            "failures": self.failures,
            "response_models": sorted({c.observed.response_model for c in self.cases if c.observed.response_model}),
            "system_fingerprints": sorted(
                {c.observed.system_fingerprint for c in self.cases if c.observed.system_fingerprint}
            ),
            "reference_diff": self.reference_diff.to_dict() if self.reference_diff else None,
            "cases": [c.to_dict() for c in self.cases],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContractResult:
        ref = data.get("reference_diff")
        return cls(
            cases=[CaseResult.from_dict(c) for c in data["cases"]],
            target=data.get("target", {}),
            mode=data.get("mode", "alone"),
            sources=data.get("sources", []),
            started_utc=data.get("started_utc"),
            ended_utc=data.get("ended_utc"),
            notes=data.get("notes", []),
            reference_diff=ContractDiff([CaseDiff(**c) for c in ref["cases"]]) if ref else None,
            run_dir=data.get("run_dir"),
        )


def write_contract(result: ContractResult, path: str | Path) -> Path:
    """Write a result as JSON (``contract.json`` inside a run directory), every key named by the published schema
    (``loadgen schema contract``)."""
    document = ContractDocument.from_document(result.to_dict()).document()
    return write_output_text(path, json.dumps(document, indent=2, sort_keys=True) + "\n")


def read_contract(path: str | Path) -> ContractResult:
    """Read a result written by :func:`write_contract` (a run directory is accepted)."""

    path = Path(path)
    if path.is_dir():
        path = path / CONTRACT_FILE
    data = read_json_object(path, "a contract result (contract.json)", RunDirError)
    if data.get("kind") != "loadgen.contract_result":
        raise RunDirError(f"{path}: kind = {data.get('kind')!r}: expected 'loadgen.contract_result'")
    try:  # the file-format boundary: a damaged field is one line, whatever the field
        result = ContractResult.from_dict(data)
        _check_field_types(result, "")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunDirError(
            f"{path}: damaged contract result ({type(exc).__name__}: {str(exc)[:80]}): "
            "expected a contract.json written by loadgen"
        ) from None
    return result


_SIMPLE = {"str": str, "bool": bool, "int": int, "float": (int, float)}


def _check_field_types(obj: Any, where: str) -> None:
    """TypeError unless every str/bool/int/float field (optional or not) of these dataclasses holds that type."""
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            _check_field_types(item, f"{where}[{i}]")
        return
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is None:
        return
    for name, spec in fields.items():
        value = getattr(obj, name)
        kinds = [k.strip() for k in str(spec.type).split("|")]
        simple = [_SIMPLE[k] for k in kinds if k in _SIMPLE]
        if value is None and "None" in kinds:
            continue
        if simple and len(simple) == len(kinds) - ("None" in kinds):
            if not isinstance(
                value, tuple(t for group in simple for t in (group if isinstance(group, tuple) else (group,)))
            ):
                raise TypeError(f"{where}.{name} = {str(value)[:40]!r}: expected {spec.type}")
        _check_field_types(value, f"{where}.{name}")


def diff(result: ContractResult, reference_result: ContractResult) -> ContractDiff:
    """Compare a candidate's result with the reference candidate's, case by case."""
    ref = reference_result.by_id()
    cand = result.by_id()
    out: list[CaseDiff] = []
    for case_id in list(ref) + [i for i in cand if i not in ref]:
        r, c = ref.get(case_id), cand.get(case_id)
        r_failed = [o.kind for o in r.checks if not o.passed] if r else []
        c_failed = [o.kind for o in c.checks if not o.passed] if c else []
        if c is None:
            status = "missing"
        elif r is None:
            status = "extra"
        elif r.passed and c.passed:
            status = "same_pass"
        elif r.passed:
            status = "regressed"
        elif c.passed:
            status = "fixed"
        else:
            status = "same_fail" if sorted(r_failed) == sorted(c_failed) else "changed_checks"
        changed = bool(r and c and (r.observed.text or "").strip() != (c.observed.text or "").strip())
        out.append(CaseDiff(case_id, status, r_failed, c_failed, changed))
    return ContractDiff(out)


def render_messages_as_prompt(case: Case) -> str:
    """A completions-endpoint prompt for a chat case: ``Role: content`` blocks, then ``Assistant:``."""
    if case.request.prompt is not None:
        return case.request.prompt
    blocks = [f"{m.role.capitalize()}: {m.content}" for m in case.request.messages or []]
    return "\n\n".join(blocks) + "\n\nAssistant:"


def _body(case: Case, model: str, endpoint: str, stream: bool = False) -> dict[str, Any]:
    req = case.request
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stop:
        body["stop"] = list(req.stop)
    if endpoint == "chat":
        if req.messages is not None:
            body["messages"] = [m.model_dump() for m in req.messages]
        else:
            body["messages"] = [{"role": "user", "content": req.prompt}]
        if req.response_format is not None:
            body["response_format"] = dict(req.response_format)
    else:
        body["prompt"] = render_messages_as_prompt(case)
    return body


def _parse_response(data: Any, endpoint: str) -> Observed:
    """A whole (not streamed) answer, read by the driver's chunk walk: a field of the wrong type, a count out of
    range or a value nested too deep fails this case, saying so (the message or the text is the answer)."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        return Observed(None, http_status=200, error=f"unexpected response body: {_shown(data)}")
    choice = data["choices"][0]
    if endpoint == "chat" and isinstance(choice, dict) and "message" in choice:
        choice = {**choice, "delta": choice["message"] or {}}  # the walk reads a chat answer as one delta
    try:
        chunk = chunk_from_object({**data, "choices": [choice]})
    except SSEProtocolError as exc:
        return Observed(None, http_status=200, error=f"unexpected response body: {exc}")
    return _observed(chunk.text, chunk.finish_reason, chunk, chunk.model, chunk.system_fingerprint, chunk.error)


def _shown(data: Any) -> str:
    """The head of an answer that is not one, for the case's error (redacted, then cut, by ``_without_secrets``)."""
    try:
        return str(data)[:4096]
    except RecursionError:
        return f"a JSON {type(data).__name__} nested too deep"


def _observed(
    text: str, finish: str | None, usage: Chunk | None, model: str | None, fingerprint: str | None, error: str | None
) -> Observed:
    if error is not None:
        return Observed(None, http_status=200, error=f"in-answer error: {error}")
    completion, prompt = (usage.completion_tokens, usage.prompt_tokens) if usage is not None else (None, None)
    return Observed(text, finish, completion, prompt, model, fingerprint, 200)


def _parse_stream(raw: str, endpoint: str) -> Observed:
    """An SSE body read whole, each event read as the driver reads it (``parse_chunk``): the texts joined, the
    last finish_reason, usage from the last chunk that has it; a malformed event fails the case."""
    parts: list[str] = []
    finish = model = fingerprint = None
    usage: Chunk | None = None
    for line in raw.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = parse_chunk(payload.encode())
        except SSEProtocolError as exc:
            return Observed(None, http_status=200, error=f"malformed SSE event: {exc}")
        if chunk.error is not None:
            return _observed("", None, None, None, None, chunk.error)
        parts.append(chunk.text)
        model = model or chunk.model
        fingerprint = fingerprint or chunk.system_fingerprint
        finish = chunk.finish_reason or finish
        if chunk.completion_tokens is not None or chunk.prompt_tokens is not None:
            usage = chunk
    return _observed("".join(parts), finish, usage, model, fingerprint, None)


def _observe(response: httpx.Response, stream: bool, endpoint: str, secrets: tuple[str, ...]) -> Observed:
    """What a case's answer (not a 429 to retry) says: its error, or its stream or JSON answer read."""
    if response.status_code != 200:
        return Observed(
            None,
            http_status=response.status_code,
            # redacted whole, then cut (``redact``): a secret across a cut is never kept in part
            error=_redact(f"HTTP {response.status_code}: {response.text}", secrets),
        )
    if stream:
        return _parse_stream(response.text, endpoint)
    try:
        data = response.json()
    except ValueError:
        return Observed(None, http_status=200, error="response is not JSON")
    except RecursionError:
        return Observed(None, http_status=200, error="response is JSON nested too deep")
    return _parse_response(data, endpoint)


def _judge(case: Case, obs: Observed, secrets: tuple[str, ...]) -> tuple[Observed, list[CheckOutcome]]:
    """The observed answer without the run's secrets, and the case's checks of it."""
    obs = _without_secrets(obs, secrets)
    return obs, run_checks(case, obs)


def _retry_after(response: httpx.Response) -> float | None:

    return parse_retry_after(response.headers.get("retry-after"))


def _without_secrets(obs: Observed, secrets: tuple[str, ...]) -> Observed:
    """``obs`` with the key replaced in every text the server sent (a server may echo it in any of them)."""
    if not secrets:
        return replace(obs, error=redact(obs.error) if obs.error else obs.error)  # one line, cut

    def clean(value: str | None) -> str | None:
        return without_secrets(value, secrets) if value else value

    return replace(
        obs,
        text=clean(obs.text),
        finish_reason=clean(obs.finish_reason),
        response_model=clean(obs.response_model),
        system_fingerprint=clean(obs.system_fingerprint),
        error=redact(obs.error, secrets) if obs.error else obs.error,
    )


async def _replay_one(
    client: httpx.AsyncClient,
    case: Case,
    model: str,
    endpoint: str,
    path: str,
    secrets: tuple[str, ...],
    max_retries: int,
    max_retry_wait_s: float,
    stream: bool = False,
    timeout_s: float = 120.0,
) -> CaseResult:
    body = _body(case, model, endpoint, stream)
    settings = {**case.request.settings(), "endpoint": endpoint, "stream": stream}
    if endpoint == "completions" and case.request.messages is not None:
        settings["prompt_template"] = "role-blocks"
    retry_waits: list[float] = []
    attempts = 0
    start = time.perf_counter()
    obs: Observed
    while True:
        attempts += 1
        got = await bounded_request(
            client,
            "POST",
            path,
            json=body,
            headers={CASE_HEADER: case.id},
            timeout_s=timeout_s,
            max_bytes=ANSWER_MAX_BYTES,
        )
        response = got.response
        if response is None:
            obs = Observed(None, error=_redact(got.failure or "no answer", secrets))
            break
        if got.truncated:
            obs = Observed(
                None,
                http_status=response.status_code,
                error=f"answer longer than {ANSWER_MAX_BYTES} bytes: not read further",
            )
            break
        if response.status_code == 429 and attempts <= max_retries:
            wait = _retry_after(response)
            retry_waits.append(wait if wait is not None else -1.0)
            await anyio.sleep(min(max(wait or 1.0, 0.0), max_retry_wait_s))
            continue
        # read in a worker thread, as are the checks: an answer of up to 16 MiB took 2 s of Python (122,881 events),
        # and under load (``replay_under_load``) this loop is the measured run's too
        obs = await anyio.to_thread.run_sync(_observe, response, stream, endpoint, secrets)
        break
    obs, outcomes = await anyio.to_thread.run_sync(_judge, case, obs, secrets)
    return CaseResult(
        case_id=case.id,
        passed=all(o.passed for o in outcomes),
        checks=outcomes,
        settings=settings,
        observed=obs,
        attempts=attempts,
        retry_after_s=retry_waits,
        elapsed_ms=round((time.perf_counter() - start) * 1000, 3),
        rounds_failed=0 if all(o.passed for o in outcomes) else 1,
    )


def _base_and_query(target_url: str) -> tuple[str, httpx.QueryParams]:
    """(the server root the case paths join, the target's query, sent with every case as the run sends it).
    Joined to the base, the query put every case on ``/?query`` (404) instead of ``/v1/chat/completions?query``.
    """
    base, query = split_target_url(target_url, userinfo=True)  # httpx sends the URL's user:password as Basic
    return base, httpx.QueryParams(query)


def _api_key(api_key_env: str | None) -> str | None:
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise TargetError(f"--api-key-env {api_key_env}: {UNSET_API_KEY}")
    return key


async def replay_cases(
    cases: CaseSet | Iterable[Case],
    target_url: str,
    model: str | None,
    *,
    api_key_env: str | None = None,
    endpoint: Literal["chat", "completions"] = "chat",
    reference: ContractResult | None = None,
    mode: str = "alone",
    concurrency: int = 1,
    timeout_s: float = 120.0,
    max_retries: int = 3,
    max_retry_wait_s: float = 60.0,
    stream: bool = False,
) -> ContractResult:
    """Replay every case against ``target_url`` (OpenAI-compatible base URL) and check the answers.

    ``model`` None or empty: the first model ``GET /v1/models`` lists.
    With ``reference`` (the reference candidate's result), the result carries ``reference_diff``.
    """
    if endpoint not in ("chat", "completions"):
        raise TargetError(f"endpoint = {endpoint!r}: expected 'chat' or 'completions'")
    case_list = list(cases)
    sources = (
        list(cases.sources)
        if isinstance(cases, CaseSet)
        else sorted({c.source for c in case_list if c.source}, key=str)
    )
    if sources and isinstance(sources[0], str):
        sources = [{"path": s} for s in sources]
    key = _api_key(api_key_env)
    secrets = with_encodings(
        ((key,) if key else ()) + url_secrets(target_url)
    )  # httpx sends the URL's user:password as Basic
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if not model:
        model = await _first_served_model(target_url, api_key_env)
    base, query = _base_and_query(target_url)
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    started = utc_now_iso()
    results: dict[str, CaseResult] = {}
    limiter = anyio.CapacityLimiter(max(1, concurrency))
    # identity: the bytes read are the bytes bounded (bounded_request does not decode)
    headers["accept-encoding"] = "identity"
    async with httpx.AsyncClient(
        base_url=base, headers=headers, params=query, timeout=httpx.Timeout(timeout_s), trust_env=False
    ) as client:

        async def one(case: Case) -> None:
            async with limiter:
                results[case.id] = await _replay_one(
                    client, case, model, endpoint, path, secrets, max_retries, max_retry_wait_s, stream, timeout_s
                )

        async with anyio.create_task_group() as tg:
            for case in case_list:
                tg.start_soon(one, case)
    result = ContractResult(
        cases=[results[c.id] for c in case_list],
        target={"base_url": _redact_url(base), "model": model, "endpoint": endpoint, "api_key_env": api_key_env},
        mode=mode,
        sources=sources,
        started_utc=started,
        ended_utc=utc_now_iso(),
    )
    if any(c.observed.http_status is None and c.observed.text is None for c in result.cases):
        result.notes.append("some cases got no response (connection errors): they count as failures")
    if reference is not None:
        result.reference_diff = diff(result, reference)
    return result


def replay_cases_sync(*args: Any, **kwargs: Any) -> ContractResult:
    """:func:`replay_cases` from synchronous code."""
    return anyio.run(lambda: replay_cases(*args, **kwargs))


async def _first_served_model(target_url: str, api_key_env: str | None) -> str:
    """The first model ``GET /v1/models`` lists (what the driver also defaults to)."""
    key = _api_key(api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    base, query = _base_and_query(target_url)
    try:
        async with httpx.AsyncClient(base_url=base, headers=headers, params=query, trust_env=False) as client:
            got = await bounded_get(client, "/v1/models")
        data = got.response.json() if got.response is not None and not got.truncated else None
        return str(data["data"][0]["id"])  # type: ignore[index]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise TargetError(
            f"target {_redact_url(base)}: no model given and GET /v1/models lists none: expected a model"
        ) from None


async def replay_under_load(
    cases: CaseSet | Iterable[Case],
    run_options: RunOptions,
    *,
    delay_s: float = 1.0,
    rounds: int | None = None,
    reference: ContractResult | None = None,
    endpoint: Literal["chat", "completions"] | None = None,
    **replay_kwargs: Any,
) -> tuple[Path, ContractResult]:
    """Run a trace with the driver and, while it runs, replay the cases against the same target.

    The cases are replayed in ``rounds`` spread evenly over the trace's span, the first ``delay_s``
    after the run starts (so they meet a loaded server). ``rounds`` defaults to what the scenario's
    ``behavior.under_load_share`` asks for (that share of the trace's requests, in whole rounds), at
    least 1. A case passes only if it passes in every round; answers that differ between rounds are
    counted (temperature 0 should not depend on the batch it landed in). The result is written into
    the run directory as ``contract.json`` with ``mode: under_load``. Returns ``(run_dir, result)``.
    """

    case_list = list(cases)
    target_url = str(run_options.target_url)
    api_key_env = run_options.api_key_env
    scenario = None
    if run_options.scenario_path is not None:
        scenario = load_scenario(run_options.scenario_path)
    model = run_options.model or (scenario.model if scenario is not None else None)
    if model is None:
        model = await _first_served_model(target_url, api_key_env)
    if endpoint is None:
        ep = run_options.endpoint or (scenario.endpoint if scenario is not None else None)
        endpoint = "completions" if ep == "completions" else "chat"
    table, _ = read_trace(run_options.trace_path)
    offsets = table.column("scheduled_offset_ns").to_pylist()
    span_s = (max(offsets) / 1e9) if offsets else 0.0
    if rounds is None:
        share = scenario.behavior.under_load_share if scenario is not None else 0.0
        rounds = math.ceil(share * table.num_rows / max(1, len(case_list))) if share > 0 else 1
    rounds = max(1, int(rounds))
    step_s = max(0.0, span_s - delay_s) / rounds
    results: list[ContractResult] = []
    holder: dict[str, Any] = {}

    async def run() -> None:
        holder["run_dir"] = await run_trace(run_options)

    async def replay() -> None:
        start = anyio.current_time()
        for i in range(rounds):
            await anyio.sleep_until(start + delay_s + i * step_s)
            results.append(
                await replay_cases(
                    case_list,
                    target_url,
                    model,
                    api_key_env=api_key_env,
                    endpoint=endpoint,
                    mode="under_load",
                    **replay_kwargs,
                )
            )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        tg.start_soon(replay)
    run_dir = Path(holder["run_dir"])
    result = _merge_rounds(results)
    if isinstance(cases, CaseSet):
        result.sources = list(cases.sources)
    result.run_dir = str(run_dir)
    result.notes.append(
        f"replayed concurrently with the run's trace: {rounds} round(s) of {len(case_list)} case(s), "
        f"the first {delay_s:g} s after the run started, then every {step_s:.1f} s"
    )
    if reference is not None:
        result.reference_diff = diff(result, reference)
    write_contract(result, run_dir / CONTRACT_FILE)
    return run_dir, result


def _merge_rounds(results: list[ContractResult]) -> ContractResult:
    """One result from several rounds: per case the first failing round (else the first), with counts."""
    first = results[0]
    merged: list[CaseResult] = []
    for case in first.cases:
        runs = [r.by_id()[case.case_id] for r in results]
        chosen = next((c for c in runs if not c.passed), runs[0])
        merged.append(
            replace(
                chosen,
                rounds=len(runs),
                rounds_failed=sum(1 for c in runs if not c.passed),
                distinct_answers=len({c.observed.text for c in runs}),
            )
        )
    out = ContractResult(
        cases=merged,
        target=first.target,
        mode=first.mode,
        sources=first.sources,
        started_utc=first.started_utc,
        ended_utc=results[-1].ended_utc,
        notes=sorted({n for r in results for n in r.notes}),
    )
    unstable = [c.case_id for c in merged if c.distinct_answers > 1]
    if unstable:
        out.notes.append(f"answers differed between rounds under load for: {', '.join(unstable)}")
    return out
