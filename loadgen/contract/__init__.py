"""Behaviour contract: frozen cases, their checks, replay against a candidate, and the reference diff.

Owns the case-file format (``scenarios/contract/*.toml``) and its loader, the checks by kind
(target, citation, abstention, language, schema, control), replay against an OpenAI-compatible
target alone or concurrently with a driver run (``contract.json`` in the run directory), the diff
against the reference candidate (a candidate that regresses is rejected before any cost
comparison), and the deterministic responder the simulated engine uses so the checks are tested
end to end. Against real engines nothing is simulated: a model that answers wrongly fails (vLLM
serving dummy weights answers gibberish, so every case fails there, which is the correct verdict).
"""

from __future__ import annotations

from .cases import CHECK_KINDS, Case, CaseSet, case_marker, load_case_refs, load_cases, parse_cases
from .checks import CheckOutcome, Observed, run_check, run_checks
from .language import detect_language
from .replay import (
    CONTRACT_FILE,
    CaseDiff,
    CaseResult,
    ContractDiff,
    ContractResult,
    diff,
    read_contract,
    replay_cases,
    replay_cases_sync,
    replay_under_load,
    write_contract,
)
from .responder import CASE_HEADER, find_case_id, respond, respond_full

__all__ = [
    "CHECK_KINDS",
    "CONTRACT_FILE",
    "CASE_HEADER",
    "Case",
    "CaseSet",
    "CaseResult",
    "CaseDiff",
    "CheckOutcome",
    "ContractDiff",
    "ContractResult",
    "Observed",
    "case_marker",
    "detect_language",
    "diff",
    "find_case_id",
    "load_case_refs",
    "load_cases",
    "parse_cases",
    "read_contract",
    "replay_cases",
    "replay_cases_sync",
    "replay_under_load",
    "respond",
    "respond_full",
    "run_check",
    "run_checks",
    "write_contract",
]
