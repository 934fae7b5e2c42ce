"""Load plans, capacity regions and candidate decisions: single runs turned into the answer.

This package owns the plan file (``spec``), its cells and their traces (``cells``) — the targets a plan
runs against, and how each reaches a warm or cold state, are ``loadgen.targets`` — the judgement of one run against
hard budgets and declared stop conditions (``checks``), the step-up walk policy (``walk``: pure, no
I/O), the execution of one run of a cell (``execute``), the resumable plan invocation (``runner``),
the plan directory's file names (``files``), the capacity region with its tables and plot
(``region``), the behaviour-contract hook (``contract_hook``), and the candidate comparison with its
judgement order and price table (``compare``, ``prices``).
"""

from __future__ import annotations

from .cells import CellCoord, build_cell_trace, mean_rate_rps
from .checks import (
    FATAL_STOPS,
    STOP_KINDS,
    FailedCheck,
    RunJudgement,
    Stop,
    judge_run,
    unstable_tail,
)
from .compare import (
    DEFAULT_VARIABLE,
    Comparison,
    compare_candidates,
    format_comparison,
    load_candidate,
)
from .prices import PriceTable, cost_per_million, load_prices
from .region import build_region, format_region, load_region, plot_region, write_region
from .runner import PLAN_FILE, RESULT_FILE, PlanResult, run_plan, run_plan_file
from .spec import MIXED, PlanSpec, load_plan, parse_plan

__all__ = [
    "DEFAULT_VARIABLE",
    "FATAL_STOPS",
    "MIXED",
    "PLAN_FILE",
    "RESULT_FILE",
    "STOP_KINDS",
    "CellCoord",
    "Comparison",
    "FailedCheck",
    "PlanResult",
    "PlanSpec",
    "PriceTable",
    "RunJudgement",
    "Stop",
    "build_cell_trace",
    "build_region",
    "compare_candidates",
    "cost_per_million",
    "format_comparison",
    "format_region",
    "judge_run",
    "load_candidate",
    "load_plan",
    "load_prices",
    "load_region",
    "mean_rate_rps",
    "parse_plan",
    "plot_region",
    "run_plan",
    "run_plan_file",
    "unstable_tail",
    "write_region",
]
