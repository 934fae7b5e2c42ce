"""``loadgen handoff RUN_OR_PLAN_DIR --out BUNDLE`` | ``handoff verify BUNDLE`` | ``handoff rerun BUNDLE``."""

from __future__ import annotations

import argparse
import json
import sys

from . import flags

_USAGE = (
    "loadgen handoff RUN_OR_PLAN_DIR --out BUNDLE | loadgen handoff verify BUNDLE[.tar.gz] | "
    "loadgen handoff rerun BUNDLE --out RUN_DIR [--target URL --model NAME] [--experiment]"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "handoff",
        help="specialist handoff bundle: build, verify, rerun",
        usage=_USAGE,
        description="Build the smallest reproducible package for a failed budget (directory + "
        ".tar.gz with SHA256SUMS), verify one, or rerun one with one command.",
    )
    p.add_argument("args", nargs="+", metavar="RUN_OR_PLAN_DIR | verify BUNDLE | rerun BUNDLE")
    p.add_argument(
        "--out", help="build: bundle directory to create (BUNDLE.tar.gz is written beside it); rerun: run dir"
    )
    p.add_argument(
        "--target",
        type=flags.target_url,
        help="rerun: base URL of a real engine (default: the bundled simulated engine)",
    )
    p.add_argument("--model", help="rerun: served model name")
    p.add_argument(
        "--api-key-env", type=flags.api_key_env, help="rerun: NAME of the environment variable holding the API key"
    )
    p.add_argument("--experiment", action="store_true", help="rerun: apply the proposed one-variable change (sim only)")
    flags.writes_json(
        p.add_argument("--json", action="store_true", help="print JSON"),
        "handoff-build",
        "handoff-rerun",
        "handoff-verify",
    )
    p.set_defaults(func=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    from loadgen.util.errors import LoadgenError  # deferred: `loadgen --help` loads no library code

    first, rest = args.args[0], args.args[1:]
    if first in ("verify", "rerun"):
        if len(rest) != 1:
            raise LoadgenError(f"handoff {first}: expected exactly one BUNDLE, got {len(rest)}; usage: {_USAGE}")
        return _verify(rest[0], args) if first == "verify" else _rerun(rest[0], args)
    if rest:
        raise LoadgenError(f"handoff: unexpected argument {rest[0]!r}; usage: {_USAGE}")
    if not args.out:
        raise LoadgenError(f"handoff {first}: --out BUNDLE is required; usage: {_USAGE}")
    return _build(first, args)


def _build(source: str, args: argparse.Namespace) -> int:
    from ..handoff import build_bundle  # deferred: `loadgen --help` loads no library code
    from ..handoff.result import bundle_result  # deferred: as above

    info = build_bundle(source, args.out)
    if args.json:
        print(json.dumps(bundle_result(info).document(), indent=2))  # the published schema: handoff-build
        return 0
    print(f"bundle: {info.bundle_dir} ({len(info.files)} files) and {info.tarball}")
    print(f"from run: {info.run_dir}")
    if info.failures:
        for f in info.failures:
            print(f"failed: {f['reason']}")
    else:
        print("failed: nothing (bundled anyway)")
    e = info.experiment
    if e.get("variable"):
        print(f"proposed experiment: {e['variable']} {e.get('from')} → {e.get('to')} ({e['hypothesis']})")
    return 0


def _verify(bundle: str, args: argparse.Namespace) -> int:

    from ..handoff import verify_bundle  # deferred: `loadgen --help` loads no library code
    from ..handoff.result import verify_result  # deferred: as above

    result = verify_bundle(bundle)
    if args.json:  # the published schema: handoff-verify; the exit status says the same as `ok`
        print(json.dumps(verify_result(bundle, result).document(), indent=2))
        return 0 if result.ok else 1
    if result.ok:
        print(f"{bundle}: OK ({result.files_checked} files match SHA256SUMS)")
        return 0
    print(f"{bundle}: FAILED: {result.first_problem}", file=sys.stderr)
    for problem in result.problems[1:]:
        print(f"  also: {problem}", file=sys.stderr)
    return 1


def _rerun(bundle: str, args: argparse.Namespace) -> int:
    from loadgen.util.errors import LoadgenError  # deferred: `loadgen --help` loads no library code

    from ..handoff import rerun_bundle  # deferred: `loadgen --help` loads no library code
    from ..handoff.result import rerun_result  # deferred: as above

    if not args.out:
        raise LoadgenError(f"handoff rerun {bundle}: --out RUN_DIR is required")
    result = rerun_bundle(
        bundle,
        args.out,
        target_url=args.target,
        model=args.model,
        api_key_env=args.api_key_env,
        experiment=args.experiment,
    )
    if args.json:
        print(json.dumps(rerun_result(result).document(), indent=2))  # the published schema: handoff-rerun
        return 0
    print(f"run: {result.run_dir}")
    if result.experiment_applied:
        e = result.experiment_applied
        print(f"experiment applied: {e['variable']} {e['from']} → {e['to']}")
    for c in result.checks:
        print(
            f"{c.get('class')} {c.get('metric')} {c.get('percentile') or ''}: was {_num(c.get('observed'))} "
            f"(n={c.get('samples')}), now {_num(c.get('rerun_observed'))} (n={c.get('rerun_samples')}), "
            f"limit {_num(c.get('limit'))}: "
            f"{'fails' if c.get('rerun_passed') is False else 'passes' if c.get('rerun_passed') else 'not evaluated'}"
        )
    kinds = result.error_kinds
    if kinds["original"] or kinds["rerun"]:
        print(f"failed requests: was {_kinds(kinds['original'])}, now {_kinds(kinds['rerun'])}")
    if result.reproduced is None:
        print("nothing had failed in the original run; rerun done")
    elif result.experiment_applied:
        n_pass = sum(1 for c in result.checks if c.get("rerun_passed"))
        print(f"with the experiment: {n_pass} of {len(result.checks)} originally failing checks now pass")
    else:
        print("failure reproduced" if result.reproduced else "failure NOT reproduced" + _otherwise(kinds))
    return 0


def _kinds(kinds: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in kinds.items()) or "none"


def _otherwise(kinds: dict[str, dict[str, int]]) -> str:
    from ..handoff.rerun import failed_otherwise  # deferred: `loadgen --help` loads no library code

    if not failed_otherwise(kinds["original"], kinds["rerun"]):
        return ""
    return f" (the rerun's requests failed otherwise: {_kinds(kinds['rerun'])}; the original's: {_kinds(kinds['original'])})"


def _num(value) -> str:
    """A float to one decimal, a share below 1 to three significant digits (a 1% limit is 0.01, not 0.0)."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"
