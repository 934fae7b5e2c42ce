"""Frozen behaviour cases: the TOML case-file format and its loader.

A case file holds ``[defaults]`` (temperature, seed, max_tokens, stop) and ``[[cases]]``, each with an
``id``, a ``request`` (``messages`` or ``prompt``, plus deterministic settings), an optional
``reference`` answer (what the reference candidate said when the case was frozen; the simulated
engine's responder plays it back) and ``[[cases.checks]]`` by kind: target, citation, abstention,
language, schema, control. Any problem is one ``ScenarioError`` line naming file, case, field, value
and what was expected. See ``scenarios/contract/canonical.toml`` for a documented example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from loadgen.util.errors import ScenarioError
from loadgen.util.jsonfile import read_json
from loadgen.util.limits import InputModel
from loadgen.util.tomlfile import read_toml
from loadgen.util.validation import format_validation_error

from .language import SUPPORTED_LANGUAGES

__all__ = [
    "CHECK_KINDS",
    "Message",
    "CaseRequest",
    "TargetCheck",
    "CitationCheck",
    "AbstentionCheck",
    "LanguageCheck",
    "SchemaCheck",
    "ControlCheck",
    "Check",
    "Case",
    "CaseSet",
    "load_cases",
    "load_case_refs",
    "parse_cases",
    "case_marker",
    "DEFAULT_REFUSAL_PATTERNS",
]

CHECK_KINDS = ("target", "citation", "abstention", "language", "schema", "control")

#: Phrases that count as declining when an abstention check gives no patterns (case-insensitive).
DEFAULT_REFUSAL_PATTERNS = (
    r"\bI (?:can(?:no|')t|am unable to|am not able to|won't|will not|do not|don't) (?:answer|help|provide|assist|say|know|determine|find)",
    r"\bI(?:'m| am) (?:sorry|afraid)\b",
    r"\b(?:not|no) (?:enough )?(?:information|evidence|mention|data) (?:in|from|about|on)\b",
    r"\bthe (?:provided |given )?(?:sources?|documents?|context) (?:do(?:es)? not|don't|doesn't) (?:say|mention|contain|state|cover)",
    r"\bunable to (?:answer|determine|verify)\b",
    r"\bcannot be (?:answered|determined)\b",
)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def case_marker(case_id: str) -> str:
    """The in-prompt marker the simulated engine's responder recognises (the header is preferred)."""
    return f"[loadgen-case:{case_id}]"


class _Model(InputModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_regex(value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"expected a valid regular expression ({exc})") from None
    return value


class Message(_Model):
    role: Literal["system", "user", "assistant"]
    content: str


class CaseRequest(_Model):
    """The request sent for a case; temperature/seed/max_tokens/stop fall back to the file's defaults."""

    messages: list[Message] | None = None
    prompt: str | None = None
    max_tokens: int = Field(ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0, le=2)
    seed: int | None = Field(default=None, ge=0)
    stop: list[str] = []
    response_format: dict[str, Any] | None = None  # e.g. {type = "json_object"}; chat only

    @model_validator(mode="after")
    def _one_input(self) -> CaseRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("expected exactly one of messages or prompt")
        if self.messages is not None and not any(m.role == "user" for m in self.messages):
            raise ValueError("messages: expected at least one user message")
        return self

    def settings(self) -> dict[str, Any]:
        """The deterministic settings recorded with every result."""
        return {
            "temperature": self.temperature,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
        }


class TargetCheck(_Model):
    """The answer equals ``exact`` (after trimming; ``ignore_case`` optional) or matches ``pattern``."""

    kind: Literal["target"]
    exact: str | None = None
    pattern: str | None = None
    ignore_case: bool = False

    _re = field_validator("pattern")(_check_regex)

    @model_validator(mode="after")
    def _one(self) -> TargetCheck:
        if (self.exact is None) == (self.pattern is None):
            raise ValueError("expected exactly one of exact or pattern")
        return self


class CitationCheck(_Model):
    """Every id in ``sources`` is cited (as ``format``); with ``allowed``, nothing else may be cited."""

    kind: Literal["citation"]
    sources: list[str] = Field(min_length=1)
    format: str = "[{id}]"
    allowed: list[str] | None = None

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        if "{id}" not in value:
            raise ValueError('expected a format containing {id}, e.g. "[{id}]"')
        return value


class AbstentionCheck(_Model):
    """The answer declines: it matches one of ``patterns`` (default: common refusal phrases)."""

    kind: Literal["abstention"]
    patterns: list[str] | None = None

    @field_validator("patterns")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        for p in value or []:
            _check_regex(p)
        return value


class LanguageCheck(_Model):
    """The answer is written in ``expected`` (ISO 639-1), judged by ``loadgen.contract.language``."""

    kind: Literal["language"]
    expected: str

    @field_validator("expected")
    @classmethod
    def _known(cls, value: str) -> str:

        if value not in SUPPORTED_LANGUAGES:
            raise ValueError(f"expected one of {', '.join(SUPPORTED_LANGUAGES)}")
        return value


class SchemaCheck(_Model):
    """The answer is JSON (a ```json fence is allowed) valid against ``schema`` or ``schema_file``."""

    kind: Literal["schema"]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    schema_file: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one(self) -> SchemaCheck:
        if (self.schema_ is None) == (self.schema_file is None):
            raise ValueError("expected exactly one of schema or schema_file")
        if self.schema_ is not None:
            _validate_schema(self.schema_)
        return self


class ControlCheck(_Model):
    """Instruction and decoding controls: max tokens and stop respected, patterns, word limit, finish reason."""

    kind: Literal["control"]
    max_tokens: bool = True  # usage.completion_tokens <= request.max_tokens
    stop: bool = True  # no stop sequence appears in the answer
    pattern: str | None = None  # instruction followed: the answer matches
    not_pattern: str | None = None  # instruction followed: the answer does not match
    max_words: int | None = Field(default=None, ge=1)
    finish_reasons: list[str] | None = None  # allowed finish reasons

    _re = field_validator("pattern", "not_pattern")(_check_regex)


Check = Annotated[
    TargetCheck | CitationCheck | AbstentionCheck | LanguageCheck | SchemaCheck | ControlCheck,
    Field(discriminator="kind"),
]


def _validate_schema(schema: dict[str, Any]) -> None:

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"expected a valid JSON Schema ({exc.message})") from None


class Case(_Model):
    id: str
    description: str = ""
    tags: list[str] = []
    request: CaseRequest
    reference: str | None = None  # the reference candidate's answer when frozen (the sim plays it back)
    checks: list[Check] = Field(min_length=1)
    # where it came from (set by the loader)
    source: str | None = Field(default=None, exclude=True)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError("expected letters, digits, '.', '_' or '-' (at most 128)")
        return value

    def kinds(self) -> list[str]:
        return [c.kind for c in self.checks]


@dataclass(frozen=True)
class CaseSet:
    """Cases loaded from one or more files, with each file's sha256 (recorded with results)."""

    cases: tuple[Case, ...]
    sources: tuple[dict[str, str], ...]  # {path, sha256}

    def __iter__(self):
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)

    def by_id(self) -> dict[str, Case]:
        return {c.id: c for c in self.cases}


_FILE_KEYS = {"version", "name", "description", "defaults", "cases"}
_DEFAULT_KEYS = {"temperature", "seed", "max_tokens", "stop"}


def parse_cases(data: dict[str, Any], source: str = "<cases>", base_dir: Path | None = None) -> list[Case]:
    """Validate a case-file mapping; raise ScenarioError with one line on the first problem."""
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise ScenarioError(f"{source}: {unknown[0]}: unknown field: expected one of {', '.join(sorted(_FILE_KEYS))}")
    version = data.get("version", 1)
    if version != 1:
        raise ScenarioError(f"{source}: version = {version!r}: expected 1")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ScenarioError(f"{source}: defaults = {defaults!r}: expected a table")
    bad = sorted(set(defaults) - _DEFAULT_KEYS)
    if bad:
        raise ScenarioError(
            f"{source}: defaults.{bad[0]}: unknown field: expected one of {', '.join(sorted(_DEFAULT_KEYS))}"
        )
    raw_cases = data.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise ScenarioError(f"{source}: cases: missing or empty: expected at least one [[cases]] table")
    seen: set[str] = set()
    out: list[Case] = []
    for index, raw in enumerate(raw_cases):
        if not isinstance(raw, dict):
            raise ScenarioError(f"{source}: cases[{index}] = {raw!r}: expected a table")
        label = f"case {raw['id']!r}" if isinstance(raw.get("id"), str) else f"cases[{index}]"
        raw = dict(raw)
        request = raw.get("request")
        if isinstance(request, dict):
            raw["request"] = {**defaults, **request}
        try:
            case = Case.model_validate(raw)
        except ValidationError as exc:
            message = format_validation_error(f"{source}: {label}", exc)
            # drop the discriminator tag pydantic puts in the location (checks[0].target.pattern)
            message = re.sub(r"(checks\[\d+\])\.(?:" + "|".join(CHECK_KINDS) + r")\b", r"\1", message)
            raise ScenarioError(message) from None
        if case.id in seen:
            raise ScenarioError(f"{source}: {label}: id = {case.id!r}: expected unique case ids")
        seen.add(case.id)
        checks = []
        for ci, check in enumerate(case.checks):
            if isinstance(check, SchemaCheck) and check.schema_file is not None:
                check = _resolve_schema_file(check, source, label, ci, base_dir)
            checks.append(check)
        if isinstance(case.request.response_format, dict) and case.request.prompt is not None:
            raise ScenarioError(f"{source}: {label}: request.response_format: expected messages (chat) when set")
        out.append(case.model_copy(update={"checks": checks, "source": source}))
    return out


def _resolve_schema_file(check: SchemaCheck, source: str, label: str, index: int, base_dir: Path | None) -> SchemaCheck:
    path = Path(check.schema_file or "")
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    field = f"checks[{index}].schema_file = {check.schema_file!r}"
    try:
        schema = read_json(path, "a JSON Schema file", ScenarioError)
    except ScenarioError as exc:
        raise ScenarioError(f"{source}: {label}: {field}: {exc}") from None
    try:
        _validate_schema(schema)
    except ValueError as exc:
        raise ScenarioError(f"{source}: {label}: {field}: {exc}") from None
    return check.model_copy(update={"schema_": schema})


def _read_file(path: Path) -> tuple[dict[str, Any], str]:

    return read_toml(path, "a contract case file (TOML)")


def load_cases(*paths: str | Path, only: list[str] | None = None) -> CaseSet:
    """Load one or more case files (``path`` or ``path#case-id``); ids must be unique across files."""
    cases: list[Case] = []
    sources: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for spec in paths:
        text = str(spec)
        path_text, _, pick = text.partition("#")
        path = Path(path_text)
        data, sha = _read_file(path)
        loaded = parse_cases(data, str(path), path.parent)
        if pick:
            chosen = [c for c in loaded if c.id == pick]
            if not chosen:
                raise ScenarioError(
                    f"{path}: case {pick!r}: not in this file: expected one of {', '.join(c.id for c in loaded)}"
                )
            loaded = chosen
        for case in loaded:
            if case.id in seen:
                raise ScenarioError(
                    f"{path}: case {case.id!r}: id already used in {seen[case.id]}: expected unique case ids"
                )
            seen[case.id] = str(path)
        cases.extend(loaded)
        if not any(s["path"] == str(path) for s in sources):
            sources.append({"path": str(path), "sha256": sha})
    if only:
        known = {c.id for c in cases}
        missing = [i for i in only if i not in known]
        if missing:
            raise ScenarioError(f"case {missing[0]!r}: not found in {', '.join(s['path'] for s in sources)}")
        cases = [c for c in cases if c.id in set(only)]
    return CaseSet(tuple(cases), tuple(sources))


def load_case_refs(refs: list[str], base_dir: Path) -> CaseSet:
    """Resolve a scenario's ``behavior.cases`` (``file`` or ``file#case``, relative to the scenario)."""
    specs = []
    for ref in refs:
        path_text, sep, pick = ref.partition("#")
        path = Path(path_text)
        if not path.is_absolute():
            path = base_dir / path
        specs.append(f"{path}{sep}{pick}")
    return load_cases(*specs)
