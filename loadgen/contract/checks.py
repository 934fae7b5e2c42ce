"""Checks by kind: each takes a case, one observed response, and says pass/fail with expected vs got.

Checks are pure functions of the response text and the usage the server reported; they never call
the network, so the same checks run against the simulated engine's responder and real engines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import jsonschema

from .cases import (
    DEFAULT_REFUSAL_PATTERNS,
    AbstentionCheck,
    Case,
    CitationCheck,
    ControlCheck,
    LanguageCheck,
    SchemaCheck,
    TargetCheck,
)
from .language import detect_language

__all__ = ["Observed", "CheckOutcome", "run_check", "run_checks", "extract_json"]

_MAX_SHOWN = 300


@dataclass(frozen=True)
class Observed:
    """What came back for one case (``text`` is None when the request failed)."""

    text: str | None
    finish_reason: str | None = None
    completion_tokens: int | None = None  # usage.completion_tokens as the server reported it
    prompt_tokens: int | None = None
    response_model: str | None = None
    system_fingerprint: str | None = None
    http_status: int | None = None
    error: str | None = None  # one line when the request itself failed


@dataclass(frozen=True)
class CheckOutcome:
    kind: str
    passed: bool
    expected: str
    got: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _short(text: str | None) -> str:
    if text is None:
        return "<no response>"
    text = " ".join(text.split())
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"


def extract_json(text: str) -> Any:
    """Parse the answer as JSON; a single ```json fenced block is accepted (raises ValueError)."""
    stripped = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*\n(.*?)\n?```", stripped, re.DOTALL)
    if fence:
        stripped = fence.group(1)
    return json.loads(stripped)


def _target(check: TargetCheck, obs: Observed, case: Case) -> CheckOutcome:
    text = obs.text or ""
    flags = re.IGNORECASE if check.ignore_case else 0
    if check.exact is not None:
        a, b = text.strip(), check.exact.strip()
        ok = a.lower() == b.lower() if check.ignore_case else a == b
        return CheckOutcome("target", ok, f"exactly {b!r}", _short(obs.text))
    ok = re.search(check.pattern or "", text, flags) is not None
    return CheckOutcome("target", ok, f"matches /{check.pattern}/", _short(obs.text))


def _citation(check: CitationCheck, obs: Observed, case: Case) -> CheckOutcome:
    text = obs.text or ""
    missing = [s for s in check.sources if check.format.format(id=s) not in text]
    expected = "cites " + ", ".join(check.format.format(id=s) for s in check.sources)
    if check.allowed is not None:
        # anything shaped like a citation that is not allowed is a fabricated source
        head, _, tail = check.format.partition("{id}")
        cited = re.findall(re.escape(head) + r"([A-Za-z0-9._:-]+)" + re.escape(tail), text)
        extra = sorted({c for c in cited if c not in set(check.allowed) | set(check.sources)})
        expected += f" and only {', '.join(sorted(set(check.allowed) | set(check.sources)))}"
    else:
        extra = []
    got = []
    if missing:
        got.append("missing " + ", ".join(missing))
    if extra:
        got.append("not allowed " + ", ".join(extra))
    return CheckOutcome("citation", not missing and not extra, expected, "; ".join(got) or "all cited")


def _abstention(check: AbstentionCheck, obs: Observed, case: Case) -> CheckOutcome:
    patterns = check.patterns or list(DEFAULT_REFUSAL_PATTERNS)
    text = obs.text or ""
    hit = next((p for p in patterns if re.search(p, text, re.IGNORECASE)), None)
    return CheckOutcome("abstention", hit is not None, "declines (a refusal pattern matches)", _short(obs.text))


def _language(check: LanguageCheck, obs: Observed, case: Case) -> CheckOutcome:
    guess = detect_language(obs.text or "")
    return CheckOutcome(
        "language",
        guess.language == check.expected,
        f"language {check.expected}",
        f"language {guess.language} (confidence {guess.confidence:.2f}, {guess.words} words)",
    )


def _schema(check: SchemaCheck, obs: Observed, case: Case) -> CheckOutcome:

    schema = check.schema_ or {}
    expected = "JSON valid against the case's schema"
    try:
        value = extract_json(obs.text or "")
    except ValueError as exc:
        return CheckOutcome(
            "schema", False, expected, f"not JSON ({exc.__class__.__name__}: {str(exc)[:80]}): {_short(obs.text)}"
        )
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return CheckOutcome("schema", False, expected, f"invalid at {where}: {error.message[:200]}")
    return CheckOutcome("schema", True, expected, "valid")


def _control(check: ControlCheck, obs: Observed, case: Case) -> CheckOutcome:
    text = obs.text or ""
    expected: list[str] = []
    problems: list[str] = []
    req = case.request
    if check.max_tokens:
        expected.append(f"completion_tokens <= {req.max_tokens}")
        if obs.completion_tokens is None:
            problems.append("no usage.completion_tokens reported")
        elif obs.completion_tokens > req.max_tokens:
            problems.append(f"completion_tokens {obs.completion_tokens}")
    if check.stop and req.stop:
        expected.append("no stop sequence in output")
        found = [s for s in req.stop if s in text]
        if found:
            problems.append(f"stop sequence {found[0]!r} present")
    if check.pattern is not None:
        expected.append(f"matches /{check.pattern}/")
        if re.search(check.pattern, text) is None:
            problems.append(f"no match for /{check.pattern}/")
    if check.not_pattern is not None:
        expected.append(f"does not match /{check.not_pattern}/")
        if re.search(check.not_pattern, text) is not None:
            problems.append(f"matches /{check.not_pattern}/")
    if check.max_words is not None:
        n = len(text.split())
        expected.append(f"<= {check.max_words} words")
        if n > check.max_words:
            problems.append(f"{n} words")
    if check.finish_reasons is not None:
        expected.append(f"finish_reason in {check.finish_reasons}")
        if obs.finish_reason not in check.finish_reasons:
            problems.append(f"finish_reason {obs.finish_reason!r}")
    return CheckOutcome("control", not problems, "; ".join(expected) or "nothing", "; ".join(problems) or "respected")


_DISPATCH: dict[str, Callable[[Any, Observed, Case], CheckOutcome]] = {
    "target": _target,
    "citation": _citation,
    "abstention": _abstention,
    "language": _language,
    "schema": _schema,
    "control": _control,
}


def run_check(check: Any, obs: Observed, case: Case) -> CheckOutcome:
    """One check against one observed response; a failed request fails every check."""
    if obs.text is None:
        return CheckOutcome(check.kind, False, f"a response ({check.kind} check)", obs.error or "<no response>")
    return _DISPATCH[check.kind](check, obs, case)


def run_checks(case: Case, obs: Observed) -> list[CheckOutcome]:
    return [run_check(check, obs, case) for check in case.checks]
