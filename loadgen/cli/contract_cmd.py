"""``loadgen contract check|replay|under-load|diff``: frozen behaviour cases against a candidate."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("contract", help="replay frozen behaviour cases and diff against a reference")
    s = p.add_subparsers(dest="contract_command", required=True)

    chk = s.add_parser("check", help="validate case files and list their cases")
    chk.add_argument("cases", nargs="+", help="case files (TOML), FILE or FILE#CASE")
    chk.set_defaults(func=_check)

    rep = s.add_parser("replay", help="replay cases against an OpenAI-compatible target")
    rep.add_argument("cases", nargs="*", help="case files (TOML), FILE or FILE#CASE (default: --scenario's)")
    rep.add_argument("--scenario", help="take the cases from this scenario's [behavior] cases")
    _target_args(rep)
    rep.add_argument("--reference", help="the reference candidate's result (contract.json) to diff against")
    rep.add_argument("--concurrency", type=flags.count(), default=1, help="cases in flight at once (default 1)")
    flags.writes_json(rep.add_argument("--out", type=flags.output_file, help="write the result JSON here"), "contract")
    rep.set_defaults(func=_replay)

    load = s.add_parser("under-load", help="run a trace with the driver and replay the cases during it")
    load.add_argument("cases", nargs="+", help="case files (TOML), FILE or FILE#CASE")
    _target_args(load)
    load.add_argument("--trace", required=True, help="trace .parquet to run")
    load.add_argument("--scenario", help="scenario TOML (budgets, timeouts, endpoint)")
    load.add_argument("--run-out", required=True, help="run directory to create (contract.json goes in it)")
    load.add_argument(
        "--delay-s", type=flags.seconds(zero=True), default=1.0, help="start the cases this long after the run starts"
    )
    load.add_argument(
        "--rounds",
        type=flags.count(),
        default=None,
        help="replay the cases this many times spread over the run (default: scenario under_load_share)",
    )
    load.add_argument("--reference", help="the reference candidate's result (contract.json) to diff against")
    load.set_defaults(func=_under_load)

    d = s.add_parser(
        "diff",
        help="compare a candidate's contract result with the reference's; prints JSON "
        "(schema: loadgen schema contract-diff)",
    )
    d.add_argument("result", help="candidate contract.json (or run dir)")
    d.add_argument("reference", help="reference contract.json (or run dir)")
    d.set_defaults(func=_diff)


def _target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", type=flags.target_url, required=True, help="base URL of the OpenAI-compatible server")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--api-key-env", type=flags.api_key_env, help="NAME of the environment variable holding the API key")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat", help="default chat")
    p.add_argument("--stream", action="store_true", help="request SSE streaming (with the usage chunk)")


def _print_result(result) -> None:
    for case in result.cases:
        mark = "PASS" if case.passed else "FAIL"
        print(f"{mark}  {case.case_id}  [{', '.join(c.kind + ('' if c.passed else '✗') for c in case.checks)}]")
        for c in case.checks:
            if not c.passed:
                print(f"      {c.kind}: expected {c.expected}; got {c.got}")
    if result.reference_diff is not None:
        for cd in result.reference_diff.cases:
            if cd.status not in ("same_pass", "same_fail"):
                print(
                    f"DIFF  {cd.case_id}: {cd.status} (reference failed {cd.reference_failed or 'nothing'}, "
                    f"candidate failed {cd.candidate_failed or 'nothing'})"
                )
    print(result.summary())


def _check(args: argparse.Namespace) -> int:
    from ..contract import load_cases  # deferred: `loadgen --help` loads no library code

    cases = load_cases(*args.cases)
    for case in cases:
        print(
            f"{case.id}: {', '.join(case.kinds())}  (max_tokens {case.request.max_tokens}, "
            f"temperature {case.request.temperature:g}, seed {case.request.seed})"
        )
    print(f"{len(cases)} case(s) OK in {', '.join(s['path'] for s in cases.sources)}")
    return 0


def _cases(args: argparse.Namespace):
    from loadgen.util.errors import ScenarioError  # deferred: `loadgen --help` loads no library code

    from ..contract import load_case_refs, load_cases  # deferred: `loadgen --help` loads no library code

    if args.cases:
        return load_cases(*args.cases)
    if getattr(args, "scenario", None):
        from loadgen.workload.scenario import load_scenario  # deferred: `loadgen --help` loads no library code

        scenario = load_scenario(args.scenario)
        if not scenario.behavior.cases:
            raise ScenarioError(f"{args.scenario}: behavior.cases = []: expected case files to replay")
        return load_case_refs(scenario.behavior.cases, scenario.base_dir())
    raise ScenarioError("contract replay: no case files given: expected CASES or --scenario FILE")


def _replay(args: argparse.Namespace) -> int:
    from ..contract import (  # deferred: `loadgen --help` loads no library code
        read_contract,
        replay_cases_sync,
        write_contract,
    )

    reference = read_contract(args.reference) if args.reference else None
    result = replay_cases_sync(
        _cases(args),
        args.target,
        args.model,
        api_key_env=args.api_key_env,
        endpoint=args.endpoint,
        reference=reference,
        concurrency=args.concurrency,
        stream=args.stream,
    )
    if args.out:
        write_contract(result, args.out)
    _print_result(result)
    return 0 if result.passed and not (result.reference_diff and result.reference_diff.rejects) else 1


def _under_load(args: argparse.Namespace) -> int:

    import anyio  # deferred: `loadgen --help` loads no library code

    from ..contract import (  # deferred: `loadgen --help` loads no library code
        load_cases,
        read_contract,
        replay_under_load,
    )
    from ..driver import RunOptions  # deferred: `loadgen --help` loads no library code

    reference = read_contract(args.reference) if args.reference else None
    options = RunOptions(
        trace_path=Path(args.trace),
        target_url=args.target,
        out_dir=Path(args.run_out),
        model=args.model,
        scenario_path=Path(args.scenario) if args.scenario else None,
        api_key_env=args.api_key_env,
    )
    cases = load_cases(*args.cases)
    run_dir, result = anyio.run(
        lambda: replay_under_load(
            cases,
            options,
            delay_s=args.delay_s,
            rounds=args.rounds,
            reference=reference,
            endpoint=args.endpoint,
            stream=args.stream,
        )
    )
    _print_result(result)
    print(f"run: {run_dir} (contract.json written)")
    return 0 if result.passed and not (result.reference_diff and result.reference_diff.rejects) else 1


def _diff(args: argparse.Namespace) -> int:
    from ..contract import diff, read_contract  # deferred: `loadgen --help` loads no library code

    d = diff(read_contract(args.result), read_contract(args.reference))
    print(json.dumps(d.result().document(), indent=2))
    return 1 if d.rejects else 0
