"""``loadgen managed compare LOCAL_RUN MANAGED_RUN``: side-by-side local engine vs managed API."""

from __future__ import annotations

import argparse
import json

from loadgen.util.outputfile import write_output_text

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("managed", help="compare a local engine run with a managed-API run of the same trace")
    s = p.add_subparsers(dest="managed_command", required=True)
    c = s.add_parser("compare", help="side-by-side report: tails, throughput, errors, quotas, cost, change controls")
    c.add_argument("local_run", help="run directory against the local engine")
    c.add_argument("managed_run", help="run directory against the managed endpoint (same trace)")
    c.add_argument(
        "--prices",
        help="price table TOML (as for loadgen compare): [candidates.MODEL_ID] per-million input/output "
        "token prices for the managed side, [candidates.ENGINE_CONFIG] usd_per_hour for the local one",
    )
    c.add_argument("--out", type=flags.output_file, help="write the Markdown report here")
    flags.writes_json(
        c.add_argument("--json", dest="json_out", type=flags.output_file, help="write the JSON report here"), "managed"
    )
    c.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:

    from ..managed import compare_managed  # deferred: `loadgen --help` loads no library code

    comparison = compare_managed(args.local_run, args.managed_run, prices=args.prices)
    text = comparison.render_markdown()
    if args.out:
        write_output_text(args.out, text)
    if args.json_out:
        write_output_text(args.json_out, json.dumps(comparison.to_dict(), indent=2, sort_keys=True) + "\n")
    print(text, end="")
    return 0
