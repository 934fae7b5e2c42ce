"""``loadgen export mlflow RUN_OR_PLAN... [--tracking-uri URI]``: runs and plans into the trackers teams use."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export run and plan directories to a tracker (MLflow)")
    s = p.add_subparsers(dest="export_kind", required=True)
    ml = s.add_parser("mlflow", help="identity as params, headline figures per class as metrics, small files + HTML")
    ml.add_argument("dirs", nargs="+", metavar="RUN_OR_PLAN")
    ml.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite:///mlflow.db, local)")
    ml.add_argument("--experiment", default="loadgen", help="MLflow experiment name (default: loadgen)")
    ml.set_defaults(func=_mlflow)


def _mlflow(args: argparse.Namespace) -> int:
    from loadgen.runs.mlflow_export import DEFAULT_TRACKING_URI, export_mlflow  # deferred: optional dependency

    uri = args.tracking_uri or DEFAULT_TRACKING_URI
    report = export_mlflow(args.dirs, tracking_uri=uri, experiment=args.experiment)
    for line in report.exported:
        print(f"exported {line}")
    for path in report.unchanged:
        print(f"unchanged {path} (exported before; nothing new)")
    for line in report.skipped:
        print(f"skipped {line}", file=sys.stderr)
    skipped = f", {len(report.skipped)} skipped (unreadable)" if report.skipped else ""
    print(f"{uri}: {len(report.exported)} exported, {len(report.unchanged)} unchanged{skipped}")
    return 2 if report.skipped else 0  # 2: bad input, as a refused directory; the readable ones are exported
