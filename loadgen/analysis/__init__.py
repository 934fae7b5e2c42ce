"""Analysis: run directory → per-class tails, rates, budget verdicts, stability, reports.

This package owns every metric formula (``metrics``), the budget and failure policy (``budgets``), the
steady-interval test and Little's Law (``stability``), the server-metrics join (``server_metrics``), and the console/HTML/JSON reports. It reads run directories
only (``loadgen.rundir``) and never imports the driver or the simulator, so a measured,
simulated or imported run is analysed by the same code.
"""

from __future__ import annotations

from .analyze import DEFINITIONS, analyze_run, parse_window
from .budgets import FAILURE_POLICY, Check
from .model import ANALYSIS_SCHEMA_VERSION, METRICS, Analysis, GroupSummary
from .report_console import render_console
from .report_html import write_html

__all__ = [
    "analyze_run",
    "parse_window",
    "Analysis",
    "GroupSummary",
    "Check",
    "METRICS",
    "ANALYSIS_SCHEMA_VERSION",
    "DEFINITIONS",
    "FAILURE_POLICY",
    "render_console",
    "write_html",
]

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and not isinstance(_obj, (str, tuple, dict)):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
