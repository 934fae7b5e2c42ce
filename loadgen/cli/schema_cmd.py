"""``loadgen schema NAME [--out F]``: the published JSON Schema of a result (NAME: one of ``RESULT_NAMES``).

The checked-in copies are ``docs/schema/<name>.schema.json``; a test keeps them equal to this command's output.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from loadgen.util.outputfile import write_output_text

from . import flags

__all__ = ["RESULT_NAMES", "register", "result_schema"]

#: The published results, by the name the command takes.
RESULT_NAMES = (
    "analysis",
    "decision",
    "region",
    "fleet",
    "plan-state",
    "cell-result",
    "fidelity",
    "diff",
    "managed",
    "ledger",
    "reconciliation",
    "trace-stats",
    "runs-list",
    "runs-show",
    "calibration",
    "handoff-build",
    "handoff-rerun",
    "handoff-verify",
    "handoff-failure",
    "handoff-experiment",
    "handoff-workload",
    "handoff-observed",
    "practice",
    "contract",
    "validation-measured",
    "contract-diff",
    "vllm-log",
    "vllm-serve",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a result (" + ", ".join(RESULT_NAMES) + ")")
    p.add_argument("name", choices=RESULT_NAMES, help="which result")
    p.add_argument(
        "--out", metavar="FILE", type=flags.output_file, help="write the schema to this file instead of printing it"
    )
    p.set_defaults(func=_schema)


def result_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of result ``name`` (one of ``RESULT_NAMES``), with its ``$id`` and schema version."""
    from pydantic import BaseModel  # deferred: as above

    from ..analysis.model import ANALYSIS_SCHEMA_VERSION  # deferred: `loadgen --help` loads no library code
    from ..analysis.result import AnalysisResult  # deferred: as above
    from ..calibration import calibrate_result, offline_result  # deferred: as above
    from ..calibration.fidelity import FIDELITY_SCHEMA_VERSION, FidelityTable  # deferred: as above
    from ..contract.result import (  # deferred: as above
        CONTRACT_DIFF_SCHEMA_VERSION,
        CONTRACT_SCHEMA_VERSION,
        ContractDocument,
        ReferenceDiff,
    )
    from ..handoff import findings as handoff_findings  # deferred: as above
    from ..handoff import observed_file as handoff_observed  # deferred: as above
    from ..handoff import result as handoff_result  # deferred: as above
    from ..handoff import workload_file as handoff_workload  # deferred: as above
    from ..ledger import result as ledger_result  # deferred: as above
    from ..managed_result import MANAGED_COMPARISON_SCHEMA_VERSION, ManagedComparisonResult  # deferred: as above
    from ..plan import results, state  # deferred: as above
    from ..practice_result import PRACTICE_SCHEMA_VERSION, PracticeDecision  # deferred: as above
    from ..runs import catalog_result  # deferred: as above
    from ..runs.diff_result import DIFF_SCHEMA_VERSION, DiffDocument  # deferred: as above
    from ..trace import stats_result  # deferred: as above
    from ..util.resultmodel import json_schema  # deferred: as above
    from ..vllm import result as vllm_result  # deferred: as above

    table: dict[str, tuple[type[BaseModel], str | int, str]] = {
        "analysis": (AnalysisResult, ANALYSIS_SCHEMA_VERSION, "loadgen analyze --json: every number of one run"),
        "decision": (
            results.ComparisonResult,
            results.COMPARISON_SCHEMA_VERSION,
            "loadgen compare --json (and practice's decision.json comparison): the candidate decision",
        ),
        "region": (results.RegionResult, results.REGION_SCHEMA_VERSION, "a plan's region.json: its capacity region"),
        "fleet": (
            results.FleetResult,
            results.FLEET_SCHEMA_VERSION,
            "a [fleet] plan's fleet.json (and its loadgen plan --json): the fewest engines per rate step",
        ),
        "plan-state": (
            state.PlanState,
            state.PLAN_STATE_SCHEMA_VERSION,
            "a plan directory's plan.json: the state loadgen plan resumes from (internal; read back only by loadgen)",
        ),
        "cell-result": (
            state.CellResult,
            state.CELL_RESULT_SCHEMA_VERSION,
            "a plan cell run's cell_result.json: the run judged (internal; its presence marks the run finished)",
        ),
        "fidelity": (FidelityTable, FIDELITY_SCHEMA_VERSION, "loadgen sim validate: fidelity.json"),
        "diff": (DiffDocument, DIFF_SCHEMA_VERSION, "loadgen diff --json: per class, metric and quantile, the change"),
        "managed": (
            ManagedComparisonResult,
            MANAGED_COMPARISON_SCHEMA_VERSION,
            "loadgen managed compare --json: a local engine run and a managed API run side by side",
        ),
        "ledger": (
            ledger_result.LedgerResult,
            ledger_result.LEDGER_SCHEMA_VERSION,
            "loadgen ledger --json: where a device's memory goes",
        ),
        "reconciliation": (
            ledger_result.ReconciliationResult,
            ledger_result.RECONCILIATION_SCHEMA_VERSION,
            "loadgen ledger --reconcile SOURCE --json: the ledger's KV capacity against what vLLM reported",
        ),
        "trace-stats": (
            stats_result.TraceStatsResult,
            stats_result.TRACE_STATS_SCHEMA_VERSION,
            "loadgen trace stats FILE --json: a trace's metadata and statistics",
        ),
        "runs-list": (
            catalog_result.RunList,
            catalog_result.RUN_LIST_SCHEMA_VERSION,
            "loadgen runs list --json: the catalogued runs, newest first (an array of rows)",
        ),
        "runs-show": (
            catalog_result.RunShow,
            catalog_result.RUN_SHOW_SCHEMA_VERSION,
            "loadgen runs show RUN --json: one catalogued run and its headline figures per class",
        ),
        "calibration": (
            calibrate_result.CalibrationResult,
            calibrate_result.CALIBRATION_SCHEMA_VERSION,
            "loadgen sim calibrate --json: the engine TOML written, the fitted cost terms and the engine's limits",
        ),
        "handoff-build": (
            handoff_result.BundleDocument,
            handoff_result.HANDOFF_BUNDLE_SCHEMA_VERSION,
            "loadgen handoff RUN --out BUNDLE --json: the bundle built, what failed and the proposed experiment",
        ),
        "handoff-rerun": (
            handoff_result.RerunDocument,
            handoff_result.HANDOFF_RERUN_SCHEMA_VERSION,
            "loadgen handoff rerun BUNDLE --out RUN --json: the failing checks re-measured",
        ),
        "handoff-verify": (
            handoff_result.VerifyDocument,
            handoff_result.HANDOFF_VERIFY_SCHEMA_VERSION,
            "loadgen handoff verify BUNDLE --json: the bundle against its SHA256SUMS",
        ),
        "handoff-failure": (
            handoff_findings.FailureFile,
            handoff_findings.HANDOFF_FAILURE_SCHEMA_VERSION,
            "a handoff bundle's failure.json: what failed in the source run (hard and soft budgets, memory signals)",
        ),
        "handoff-experiment": (
            handoff_findings.Experiment,
            handoff_findings.HANDOFF_EXPERIMENT_SCHEMA_VERSION,
            "a handoff bundle's experiment.json: the one-variable experiment proposed from the first failure",
        ),
        "handoff-workload": (
            handoff_workload.WorkloadFile,
            handoff_workload.HANDOFF_WORKLOAD_SCHEMA_VERSION,
            "a handoff bundle's workload.json: the source run's scenario and trace, and how to regenerate the trace",
        ),
        "handoff-observed": (
            handoff_observed.ObservedAnalysis,
            handoff_observed.HANDOFF_OBSERVED_SCHEMA_VERSION,
            "a handoff bundle's observed.json: the source run's analysis without its per-second series",
        ),
        "practice": (
            PracticeDecision,
            PRACTICE_SCHEMA_VERSION,
            "loadgen practice: decision.json (and practice --json): the workload, ledgers, comparison and decision",
        ),
        "contract": (
            ContractDocument,
            CONTRACT_SCHEMA_VERSION,
            "a run's contract.json (and loadgen contract replay --out F): each behaviour case passed or not",
        ),
        "validation-measured": (
            offline_result.MeasuredValidation,
            offline_result.MEASURED_VALIDATION_SCHEMA_VERSION,
            "loadgen sim validate --measured RUN... --json: an engine's replay beside imported real-vLLM runs",
        ),
        "contract-diff": (
            ReferenceDiff,
            CONTRACT_DIFF_SCHEMA_VERSION,
            "loadgen contract diff RESULT REFERENCE (and contract.json's reference_diff): each case against the "
            "reference",
        ),
        "vllm-log": (
            vllm_result.VllmLogNotes,
            vllm_result.VLLM_LOG_SCHEMA_VERSION,
            "loadgen vllm parse-log LOG: what a vLLM startup log reports (a launched server's notes add ready_s: "
            "vllm serve's engine_notes, a vLLM run manifest's engine_notes.log)",
        ),
        "vllm-serve": (
            vllm_result.VllmServeReady,
            vllm_result.VLLM_SERVE_SCHEMA_VERSION,
            "loadgen vllm serve: the line printed once the server answers /health",
        ),
    }
    model, version, description = table[name]
    return json_schema(model, name, version, description)


def _schema(args: argparse.Namespace) -> int:
    text = json.dumps(result_schema(args.name), indent=2) + "\n"
    if args.out:
        write_output_text(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
