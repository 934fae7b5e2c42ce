"""Deterministic responder: what the simulated engine answers for a contract case.

The simulated engine streams filler text of the right token count, which no contract check could
pass. For a request that carries a contract case (header ``X-Loadgen-Case: ID``, or a
``[loadgen-case:ID]`` line in the prompt) it asks ``respond`` instead, which plays back the case's
frozen ``reference`` answer, honouring the request's stop sequences and ``max_tokens`` as a correct
engine would. An engine config can make a candidate *change behaviour* through its ``[behavior]``
section, so the checks and the reference diff are exercised end to end:

    [behavior]
    cases = ["my_cases.toml"]                 # extra case files (relative to the engine file)
    drift = { "target-capital" = "Lyon." }    # exact replacement answers by case id
    drift_kinds = ["abstention", "schema"]    # every case with such a check answers wrongly ("all" = every kind)

Shipped case files (``scenarios/contract/*.toml``) are always known unless ``default_cases = false``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from loadgen.util.limits import InputModel
from loadgen.workload import presets
from loadgen.workload.prompts import get_tokenizer

from .cases import CHECK_KINDS, Case, load_cases

__all__ = [
    "CASE_HEADER",
    "SHIPPED_CASES_DIR",
    "Answer",
    "BehaviorConfig",
    "find_case_id",
    "respond",
    "respond_full",
    "drift_answer",
    "token_pieces",
]

#: Request header naming the contract case (preferred over the in-prompt marker; real engines ignore it).
CASE_HEADER = "x-loadgen-case"
SHIPPED_CASES_DIR = presets.preset_dir("contract")

_MARKER = re.compile(r"\[loadgen-case:([A-Za-z0-9][A-Za-z0-9._-]{0,127})\]")
_CITATION = re.compile(r"\s?\[[A-Za-z]+-[A-Za-z0-9._:-]+\]")


class BehaviorConfig(InputModel):
    """An engine config's ``[behavior]`` table (validated; the simulated engine's config embeds it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cases: list[str] = []  # extra case files, relative to the engine config file
    default_cases: bool = True  # also know the shipped scenarios/contract/*.toml
    drift: dict[str, str] = {}  # case id -> the answer this candidate gives instead
    drift_kinds: list[str] = []  # check kinds this candidate breaks ("all" = every kind)

    @field_validator("drift_kinds")
    @classmethod
    def _kinds(cls, value: list[str]) -> list[str]:
        for kind in value:
            if kind not in CHECK_KINDS + ("all",):
                raise ValueError(f"{kind!r}: expected one of {', '.join(CHECK_KINDS + ('all',))}")
        return value


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str  # "stop" or "length"
    case_id: str
    drifted: bool


def _request_texts(body: Mapping[str, Any]) -> list[str]:
    texts: list[str] = []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        texts.append(prompt)
    elif isinstance(prompt, list):
        texts.extend(p for p in prompt if isinstance(p, str))
    for message in body.get("messages") or []:
        if isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):  # content parts
                texts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return texts


def find_case_id(body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> str | None:
    """The contract case a request carries (header first, then the prompt marker), else None."""
    if headers:
        for key, value in headers.items():
            if key.lower() == CASE_HEADER and value:
                return value.strip()
    for text in _request_texts(body):
        match = _MARKER.search(text)
        if match:
            return match.group(1)
    return None


@lru_cache(maxsize=32)
def _registry(paths: tuple[str, ...], mtimes: tuple[float, ...]) -> dict[str, Case]:
    del mtimes  # part of the cache key only: an edited file is reloaded
    registry: dict[str, Case] = {}
    for path in paths:
        for case in load_cases(path):
            registry[case.id] = case  # later files win
    return registry


def _case_files(behavior: Mapping[str, Any] | None, base_dir: Path | None) -> tuple[str, ...]:
    files: list[Path] = []
    if not behavior or behavior.get("default_cases", True):
        files.extend(sorted(SHIPPED_CASES_DIR.glob("*.toml")))
    for entry in (behavior or {}).get("cases", []) or []:
        path = Path(str(entry))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        files.append(path)
    return tuple(str(p) for p in files)


def _mtime(path: str) -> float:
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return -1.0


_WRONG_TARGET = "I believe the answer is something else entirely, but I would rather not commit to it."
_CONFIDENT = "Sure. The answer is 42, and that is stated clearly in the documents."
_FRENCH = "Voici la réponse: le modèle a changé de langue et répond maintenant en français pour cette question."
_ENGLISH = "Here is the answer: the model has switched languages and now replies in English for this question."


def drift_answer(case: Case, kinds: set[str]) -> str:
    """A deterministic wrong answer for ``case`` that breaks each check kind in ``kinds`` it has."""
    present = set(case.kinds())
    hit = present & kinds
    text = case.reference or ""
    if "abstention" in hit:
        text = _CONFIDENT
    elif "language" in hit:
        langs = [c.expected for c in case.checks if c.kind == "language"]
        text = _FRENCH if "en" in langs else _ENGLISH
    elif "target" in hit:
        text = _WRONG_TARGET
    if "citation" in hit:
        text = _CITATION.sub("", text)
    if "schema" in hit:
        text = "Here is the result you asked for: " + text.rstrip().rstrip("}")
    if "control" in hit:
        stop = case.request.stop[0] if case.request.stop else ""
        text = f"{text} {stop} " + " ".join(
            ["and", "then", "it", "keeps", "going"] * (case.request.max_tokens // 4 + 2)
        )
    return text


def _apply_stop_and_length(text: str, body: Mapping[str, Any], tokenizer: Any) -> tuple[str, str]:
    stops = body.get("stop") or []
    if isinstance(stops, str):
        stops = [stops]
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    if cut >= 0:
        text = text[:cut]
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    if isinstance(max_tokens, int) and max_tokens > 0:
        if tokenizer is None:
            tokenizer = get_tokenizer()
        ids = tokenizer.encode(text)
        if len(ids) > max_tokens:
            return tokenizer.decode(ids[:max_tokens]), "length"
    return text, "stop"


def respond_full(
    body: Mapping[str, Any],
    behavior: Mapping[str, Any] | BehaviorConfig | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    base_dir: str | Path | None = None,
    tokenizer: Any = None,
) -> Answer | None:
    """The answer for a contract-case request, or None when the request carries no known case.

    ``behavior`` is the engine config's ``[behavior]`` table; relative case files resolve against
    ``base_dir`` (the engine config's directory). ``tokenizer`` (``encode``/``decode``) enforces
    max_tokens; default cl100k_base. A drifted answer ignores stop sequences and max_tokens when the
    drift is of kind ``control``.
    """
    case_id = find_case_id(body, headers)
    if case_id is None:
        return None
    if isinstance(behavior, BaseModel):
        behavior = behavior.model_dump()
    base = Path(base_dir) if base_dir is not None else None
    files = _case_files(behavior, base)
    case = _registry(files, tuple(_mtime(p) for p in files)).get(case_id)
    if case is None:
        return None
    behavior = behavior or {}
    drift = behavior.get("drift") or {}
    kinds = set(behavior.get("drift_kinds") or [])
    if "all" in kinds:
        kinds = set(CHECK_KINDS)
    if case_id in drift:
        return Answer(str(drift[case_id]), "stop", case_id, True)
    if kinds & set(case.kinds()):
        text = drift_answer(case, kinds)
        if "control" in kinds and "control" in case.kinds():
            return Answer(text, "stop", case_id, True)
        text, finish = _apply_stop_and_length(text, body, tokenizer)
        return Answer(text, finish, case_id, True)
    if case.reference is None:
        return None
    text, finish = _apply_stop_and_length(case.reference, body, tokenizer)
    return Answer(text, finish, case_id, False)


def respond(
    body: Mapping[str, Any], behavior: Mapping[str, Any] | BehaviorConfig | None = None, **kwargs: Any
) -> str | None:
    """Just the text of :func:`respond_full` (None when the request is not a known contract case)."""
    answer = respond_full(body, behavior, **kwargs)
    return None if answer is None else answer.text


def token_pieces(text: str, tokenizer: Any) -> list[str]:
    """``text`` split into one string per token (for streaming an answer token by token).

    A token that ends inside a multi-byte character yields ``""`` and the character comes with the
    token that completes it, so ``"".join(pieces) == tokenizer.decode(tokenizer.encode(text))``.
    """
    ids = tokenizer.encode(text)
    pieces: list[str] = []
    prev = ""
    for k in range(1, len(ids) + 1):
        cur = tokenizer.decode(ids[:k])
        if k < len(ids) and (cur.endswith("\ufffd") or not cur.startswith(prev)):
            pieces.append("")
            continue
        pieces.append(cur[len(prev) :])
        prev = cur
    return pieces
