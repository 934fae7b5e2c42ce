"""Load plans, capacity regions and candidate decisions: single runs turned into the answer.

This package owns the plan file (``spec``), its cells and their traces (``cells``) — the targets a plan
runs against, and how each reaches a warm or cold state, are ``loadgen.targets`` — the judgement of one run against
hard budgets and declared stop conditions (``checks``), the resumable step-up walk (``runner``), the
capacity region with its tables and plot (``region``), the behaviour-contract hook (``contract_hook``),
and the candidate comparison with its judgement order and price table (``compare``, ``prices``).
"""

from __future__ import annotations

from .cells import CellCoord, build_cell_trace, mean_rate_rps
from .compare import DEFAULT_VARIABLE, Comparison, compare_candidates, format_comparison, load_candidate
from .checks import FATAL_STOPS, STOP_KINDS, FailedCheck, RunJudgement, Stop, judge_run, unstable_tail
from .prices import PriceTable, cost_per_million, load_prices
from .region import build_region, format_region, load_region, plot_region, write_region
from .runner import PLAN_FILE, RESULT_FILE, PlanResult, run_plan, run_plan_file
from .spec import MIXED, PlanSpec, load_plan, parse_plan

__all__ = [
    "MIXED", "PlanSpec", "load_plan", "parse_plan",
    "CellCoord", "build_cell_trace", "mean_rate_rps",
    "STOP_KINDS", "FATAL_STOPS", "FailedCheck", "Stop", "RunJudgement", "judge_run", "unstable_tail",
    "PLAN_FILE", "RESULT_FILE", "PlanResult", "run_plan", "run_plan_file",
    "build_region", "write_region", "format_region", "plot_region", "load_region",
    "DEFAULT_VARIABLE", "Comparison", "compare_candidates", "format_comparison", "load_candidate",
    "PriceTable", "load_prices", "cost_per_million",
]
