"""A behaviour contract's result (``contract.json`` in a run directory; ``loadgen contract replay --out F``) as a
typed result.

``ContractDocument`` (schema version ``CONTRACT_SCHEMA_VERSION``, the document's ``version``; ``loadgen schema
contract``); ``replay.write_contract`` checks each document against it before writing it. ``ReferenceDiff`` is
both its ``reference_diff`` and what ``loadgen contract diff`` prints (``loadgen schema contract-diff``, schema
version ``CONTRACT_DIFF_SCHEMA_VERSION``: the document has no version field, as it is the same object as the
contract's ``reference_diff``; the schema's ``$id`` gives it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from loadgen.util.resultmodel import Number, ResultModel

__all__ = ["CONTRACT_DIFF_SCHEMA_VERSION", "CONTRACT_SCHEMA_VERSION", "ContractDocument", "ReferenceDiff"]

#: ``contract.json``'s ``version``.
CONTRACT_SCHEMA_VERSION = 1
#: The ``contract-diff`` schema's version (``loadgen contract diff``'s document has no version field).
CONTRACT_DIFF_SCHEMA_VERSION = 1


class ContractTarget(ResultModel):
    """The endpoint replayed against (its URL redacted; the key's variable NAME only, never the key); a result
    rebuilt from an older file may lack keys, which are then absent."""

    base_url: str | None = None
    model: str | None = None
    endpoint: str | None = Field(None, description="chat or completions")
    api_key_env: str | None = None


class Source(ResultModel):
    """A case file the cases came from."""

    path: str
    sha256: str


class FailedCheck(ResultModel):
    """One failed check of a case."""

    case_id: str
    kind: str
    expected: str
    got: str


class CheckOutcome(ResultModel):
    """One check of a case: what it expected and what came back."""

    kind: str
    passed: bool
    expected: str
    got: str


class Observed(ResultModel):
    """What came back for one case (``text`` null: the request failed; cut at 4000 characters)."""

    text: str | None
    finish_reason: str | None
    completion_tokens: int | None = Field(description="usage.completion_tokens as the server reported it")
    prompt_tokens: int | None = Field(description="usage.prompt_tokens as the server reported it")
    response_model: str | None
    system_fingerprint: str | None
    http_status: int | None
    error: str | None
    text_truncated: bool | None = Field(None, description="present (true) when text was cut")


class CaseResult(ResultModel):
    """One case: passed or not, each check, what was sent and what came back."""

    case_id: str
    passed: bool
    checks: list[CheckOutcome]
    # the case's own request settings (temperature, max_tokens, response_format ... as its file set them), with
    # endpoint and stream: the keys are the case author's, so the object stays open
    settings: dict[str, Any]
    observed: Observed
    attempts: int = Field(description="requests sent for the case (retries after 429 included)")
    retry_after_s: list[Number] = Field(description="each Retry-After waited, s")
    elapsed_ms: Number | None
    rounds: int = Field(description="under load: times the case was replayed (a count)")
    rounds_failed: int = Field(description="rounds that failed (a count)")
    distinct_answers: int = Field(description="different answer texts over the rounds (a count)")


class CaseDiff(ResultModel):
    """One case against the reference: same_pass, same_fail, regressed, fixed, changed_checks, missing, extra."""

    case_id: str
    status: str
    reference_failed: list[str] = Field(description="the check kinds the reference failed on this case")
    candidate_failed: list[str] = Field(description="the check kinds the candidate failed on this case")
    output_changed: bool = Field(description="both answered and the answer texts differ (outer spaces ignored)")


class ReferenceDiff(ResultModel):
    """The candidate's contract against a reference candidate's (``loadgen contract diff``; exit 1 when it
    ``rejects``)."""

    rejects: bool = Field(description="a case regressed, changed its failed checks or is missing: reject")
    changed: bool = Field(description="a case's pass/fail differs from the reference's (improvements too)")
    regressions: list[str] = Field(description="ids of the cases regressed, changed_checks or missing")
    outputs_changed: list[str] = Field(description="ids of the cases whose answer text differs from the reference's")
    cases: list[CaseDiff]


class ContractDocument(ResultModel):
    """Per-case pass/fail of a behaviour contract on one candidate; ``passed`` only when every case passed."""

    kind: Literal["loadgen.contract_result"]
    version: int = Field(description=f"the schema version ({CONTRACT_SCHEMA_VERSION})")
    passed: bool
    mode: str = Field(description="alone or under_load")
    n_cases: int
    n_passed: int
    target: ContractTarget
    sources: list[Source]
    started_utc: str | None
    ended_utc: str | None
    run_dir: str | None = Field(description="under load: the run the cases were mixed into")
    notes: list[str]
    failures: list[FailedCheck]
    response_models: list[str]
    system_fingerprints: list[str]
    reference_diff: ReferenceDiff | None
    cases: list[CaseResult]
