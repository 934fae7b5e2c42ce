"""``loadgen plan PLAN.toml --target URL | --sim ENGINE | --sim-worksheet ENGINE --out PLAN_DIR``."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from loadgen.util.errors import LoadgenError, PlanError, RecordWriteError

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="run (or resume) a load plan and write the capacity region")
    p.add_argument(
        "plan", help="plan TOML file, or a shipped plan's name (quick, canonical-region, fleet; see scenarios/plans/)"
    )
    p.add_argument("--out", required=True, help="plan directory; rerunning the same command resumes it")
    p.add_argument(
        "--target",
        type=flags.target_url,
        help="OpenAI-compatible base URL (cold cells are not achievable: loadgen did not launch it)",
    )
    p.add_argument("--model", help="served model name for --target")
    p.add_argument(
        "--api-key-env",
        type=flags.api_key_env,
        help="NAME of the env var holding the API key for --target (never recorded)",
    )
    p.add_argument(
        "--sim", metavar="ENGINE", help="launch the simulated engine (preset or TOML) on loopback; cold = restart it"
    )
    p.add_argument(
        "--sim-worksheet", metavar="ENGINE", help="the simulated engine in virtual time (fast, deterministic)"
    )
    p.add_argument(
        "--vllm",
        metavar="MODEL",
        help="launch real vLLM (LOADGEN_VLLM_PYTHON) on a model dir, config.json or "
        "shipped model name; cold = restart it",
    )
    p.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra vLLM flag, e.g. --vllm-arg=--max-num-seqs=8",
    )
    p.add_argument(
        "--time-budget-s",
        type=flags.seconds(),
        help="override the plan's total time budget (e.g. to extend it on resume)",
    )
    p.add_argument(
        "--max-runs", type=flags.count(0), help="start at most N runs in this invocation (the rest resumes later)"
    )
    p.add_argument(
        "--workers",
        type=flags.count(1, 1024),
        default=1,
        help="spread each measured run over N worker processes (live targets; default 1)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    flags.writes_json(
        p.add_argument(
            "--json", action="store_true", help="print region.json (a [fleet] plan: fleet.json) instead of the tables"
        ),
        "region",
        "fleet",
    )
    p.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:

    from loadgen.workload.presets import resolve  # deferred: `loadgen --help` loads no library code

    from ..plan import RESULT_FILE, format_region, run_plan_file  # deferred: `loadgen --help` loads no library code
    from ..plan.fleet import format_fleet  # deferred: `loadgen --help` loads no library code

    out = Path(args.out)
    fresh = not out.exists()
    try:
        result = run_plan_file(
            resolve("plans", args.plan) or args.plan,
            out,
            target_url=args.target,
            model=args.model,
            sim=args.sim,
            sim_worksheet=args.sim_worksheet,
            vllm=args.vllm,
            vllm_args=args.vllm_arg,
            api_key_env=args.api_key_env,
            max_new_runs=args.max_runs,
            time_budget_s=args.time_budget_s,
            workers=args.workers,
            log=None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True)),
        )
    except LoadgenError as exc:
        kept = any(out.glob(f"cells/*/rep*/{RESULT_FILE}")) or any(out.glob(f"replicas-*/cells/*/rep*/{RESULT_FILE}"))
        if not (fresh and out.is_dir() and not kept):
            raise
        shutil.rmtree(out, ignore_errors=True)  # nothing worth resuming: leave no partial plan directory
        if isinstance(exc, RecordWriteError):  # its "records flushed before it are kept" no longer holds
            raise PlanError(
                f"{exc.path}: cannot write: {exc.reason}; the plan stopped before any cell finished, and {out} was "
                "removed (nothing to resume)"
            ) from None
        raise
    engine = args.sim or args.sim_worksheet
    if engine:  # every figure from the simulated engine says whether its cost terms were calibrated
        from ..sim import load_engine_config  # deferred: `loadgen --help` loads no library code

        result.region["engine_calibration"] = load_engine_config(engine).calibration_label()
    if args.json:
        print(json.dumps(result.fleet or result.region, indent=2, default=str))
    elif result.fleet is not None:
        print(format_fleet(result.fleet))
        _print_profile_grid(result.plan_dir)
        print(f"\nplan directory: {result.plan_dir} (fleet.json, fleet.md; one plan per replica count in replicas-N/)")
    else:
        print(format_region(result.region))
        if engine:
            print(f"\n{result.region['engine_calibration']}")
        _print_profile_grid(result.plan_dir)
        print(f"\nplan directory: {result.plan_dir} (region.json, region.md, region-*.png, region.html)")
    return 0 if result.state.get("status") == "complete" else 3


def _print_profile_grid(plan_dir: Path) -> None:
    """One line: how much of the plan's runs a profiled engine priced past its profile's measured points."""
    from ..plan.coverage import plan_profile_grid  # deferred: `loadgen --help` loads no library code
    from ..sim.profile_grid import coverage_line  # deferred: as above

    runs, note = plan_profile_grid(plan_dir)
    if line := coverage_line(note):
        print(f"{line} (over the plan's {runs} run directories, extensions included)")
