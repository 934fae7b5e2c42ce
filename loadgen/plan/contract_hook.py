"""Behaviour-contract replay for plans and comparisons (``loadgen.contract``), or a stated skip.

When the scenario configures frozen behaviour cases (``[behavior] cases``), a live target replays them
after a cell (the plan's behaviour-drift stop) and for each compared candidate (the comparison's second
judgement step). Whatever happens, the result is a dict with ``status`` ∈ {passed, failed, skipped,
not_configured} and a one-line ``summary`` saying why, never a silent gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.rundir.schema import CONTRACT_FILE
from loadgen.util.errors import LoadgenError

from ..contract.cases import load_case_refs
from ..contract.replay import read_contract, replay_cases_sync, write_contract

__all__ = ["CONTRACT_FILE", "contract_status_from_file", "replay_contract"]


def _skip(summary: str, status: str = "skipped") -> dict[str, Any]:
    return {"status": status, "summary": summary, "failures": []}


def replay_contract(
    scenario: Any,
    target_url: str | None,
    model: str | None,
    *,
    out_path: Path | None = None,
    reference: Any = None,
    api_key_env: str | None = None,
    concurrency: int = 8,
) -> dict[str, Any]:
    """Replay the scenario's behaviour cases against ``target_url``; write ``out_path`` (contract.json).

    Cases go ``concurrency`` at a time (default 8): a batching engine holds a lone request for its whole
    batching window, so one at a time would cost a window per case; each case's settings stay deterministic.
    """
    refs = list(getattr(getattr(scenario, "behavior", None), "cases", []) or []) if scenario is not None else []
    if not refs:
        return _skip("behaviour contract not configured (scenario [behavior] cases is empty)", "not_configured")
    if not target_url:
        return _skip("behaviour contract not replayed: the target has no live endpoint (virtual-time worksheet)")
    try:
        cases = load_case_refs(refs, scenario.base_dir())
        endpoint = "chat" if scenario.endpoint == "chat" else "completions"
        result = replay_cases_sync(
            cases,
            target_url,
            model or "",
            api_key_env=api_key_env,
            endpoint=endpoint,
            reference=reference,
            concurrency=concurrency,
        )
    except LoadgenError as exc:
        return _skip(f"behaviour contract not replayed: {exc}")
    if out_path is not None:
        write_contract(result, out_path)
    rejects = bool(result.reference_diff is not None and result.reference_diff.rejects)
    failed = (not result.passed) or rejects
    return {
        "status": "failed" if failed else "passed",
        "summary": result.summary(),
        "failures": result.failures[:20],
        "n_cases": len(result.cases),
        "n_passed": sum(c.passed for c in result.cases),
        "regressions": list(result.reference_diff.regressions) if result.reference_diff is not None else [],
        "path": str(out_path) if out_path else None,
        "_result": result,
    }


def contract_status_from_file(path: Path) -> dict[str, Any] | None:
    """Read a ``contract.json`` written by ``loadgen contract`` or a plan/practice (None when absent), through
    the one reader of contract results (``read_contract``: a damaged file is one RunDirError line naming it)."""
    path = Path(path)
    if not path.is_file():
        return None
    result = read_contract(path)
    diff = result.reference_diff
    passed, rejects = result.passed, bool(diff is not None and diff.rejects)
    n_cases, n_passed = len(result.cases), sum(c.passed for c in result.cases)
    summary = f"contract {'PASSED' if passed and not rejects else 'FAILED'}: {n_passed}/{n_cases} cases passed ({path})"
    if diff is not None and rejects:
        summary += f"; behaviour changed vs reference: {', '.join(diff.regressions)}"
    return {
        "status": "passed" if passed and not rejects else "failed",
        "summary": summary,
        "failures": result.failures[:20],
        "n_cases": n_cases,
        "n_passed": n_passed,
        "path": str(path),
    }
