"""``loadgen import llmperf|vllm|llmservingsim FILE --out RUN_DIR``: other tools' per-request results → a run
directory."""

from __future__ import annotations

import argparse

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import another tool's per-request results as a run directory")
    s = p.add_subparsers(dest="import_kind", required=True)
    llm = s.add_parser("llmperf", help="LLMPerf individual/*.json (instants synthesized from durations)")
    llm.add_argument("file")
    llm.add_argument("--out", required=True, help="new run directory")
    llm.add_argument(
        "--concurrency",
        type=flags.count(),
        default=None,
        help="slots for placing requests (default: the matching summary's num_concurrent_requests, else 1)",
    )
    llm.add_argument("--summary", default=None, help="LLMPerf summary JSON (default: ../summary/<same name>)")
    llm.add_argument("--class", dest="request_class", default="imported", help="request class to record")
    llm.set_defaults(func=_llmperf)
    vl = s.add_parser("vllm", help="vLLM bench serve result saved with --save-detailed")
    vl.add_argument("file")
    vl.add_argument("--out", required=True, help="new run directory")
    vl.add_argument("--concurrency", type=flags.count(), default=None, help="slots when the file has no start_times")
    vl.add_argument("--class", dest="request_class", default="imported", help="request class to record")
    vl.set_defaults(func=_vllm)
    ls = s.add_parser("llmservingsim", help="LLMServingSim bench run of a real vLLM (meta.json, requests.jsonl, ...)")
    ls.add_argument("run", help="the run folder (holding meta.json and requests.jsonl, or their vllm/)")
    ls.add_argument("--out", required=True, help="new run directory")
    ls.add_argument(
        "--workload", default=None, help="the workload JSONL it replayed (default: found by dataset_path, hash-checked)"
    )
    ls.add_argument("--class", dest="request_class", default="imported", help="request class to record")
    ls.set_defaults(func=_llmservingsim)


def _llmperf(args: argparse.Namespace) -> int:
    from loadgen.rundir.foreign import import_llmperf  # deferred: `loadgen --help` loads no library code

    out = import_llmperf(
        args.file, args.out, concurrency=args.concurrency, request_class=args.request_class, summary=args.summary
    )
    print(_imported(args.file, out, "instants synthesized; see manifest 'synthesized'"))
    return 0


def _vllm(args: argparse.Namespace) -> int:
    from loadgen.rundir.foreign import import_vllm_bench  # deferred: `loadgen --help` loads no library code

    out = import_vllm_bench(args.file, args.out, request_class=args.request_class, concurrency=args.concurrency)
    print(_imported(args.file, out))
    return 0


def _llmservingsim(args: argparse.Namespace) -> int:
    from loadgen.calibration.llmservingsim import import_llmservingsim_run  # deferred: `loadgen --help` is light

    out = import_llmservingsim_run(args.run, args.out, workload=args.workload, request_class=args.request_class)
    print(_imported(args.run, out, "clocks reconciled; see manifest 'synthesized'"))
    return 0


def _imported(source: str, out: object, note: str = "") -> str:
    """One line: what was imported where, how many requests by outcome, and the model, engine and GPU it names."""
    from loadgen.rundir.manifest import read_manifest  # deferred: `loadgen --help` loads no library code

    m = read_manifest(str(out))
    outcomes = ", ".join(f"{n} {status}" for status, n in sorted(m.status_counts.items()) if n)
    engine = m.target.engine
    what = [
        f"{m.requests_recorded or 0:,} requests" + (f" ({outcomes})" if outcomes else ""),
        *([f"model {m.target.model}"] if m.target.model else []),
        *([f"{engine.name} {engine.version or ''}".rstrip()] if engine is not None and engine.name else []),
        *sorted({str(g["device_name"]) for g in (m.host.gpus if m.host else []) if g.get("device_name")}),
    ]
    return f"imported {source} → {out}: " + "; ".join(what) + (f" ({note})" if note else "")
