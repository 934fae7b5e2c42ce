"""``loadgen sim run|serve|presets``: the simulated engine's two faces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadgen.util.errors import LoadgenError
from loadgen.util.outputfile import write_output_text

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulated engine: virtual-time worksheet or live OpenAI-compatible server")
    s = p.add_subparsers(dest="sim_command", required=True)
    _register_run(s)
    _register_serve(s)
    pre = s.add_parser("presets", help="list the shipped engine presets")
    pre.set_defaults(func=_presets)
    _register_calibrate(s)
    _register_validate(s)
    _register_engine(s)


def _register_engine(s: argparse._SubParsersAction) -> None:
    eng = s.add_parser(
        "engine",
        help="write a profiled engine TOML from a GPU's operator profile (LLMServingSim's format), for a GPU you "
        "profiled yourself or a published profile",
    )
    eng.add_argument("--profile", required=True, help="the profile's <dtype>/ folder (meta.yaml, tp<N>/)")
    eng.add_argument("--model-config", required=True, help="the model's Hugging Face config.json")
    eng.add_argument("--out", required=True, type=flags.output_file, help="the engine TOML to write")
    eng.add_argument("--name", default=None, help="the engine's name (default: the file's stem)")
    eng.add_argument("--tp", type=flags.count(1, 1024), default=None, help="tensor-parallel degree (default 1)")
    eng.add_argument(
        "--ep", type=flags.count(1, 1024), default=None, help="GPUs an MoE layer's experts are spread over (default 1)"
    )
    eng.add_argument("--collectives", default=None, help="measured collectives CSV for TP/EP > 1 (loadgen.sim.link)")
    eng.add_argument("--max-num-seqs", type=flags.count(1, 1 << 20), default=None, help="as vLLM is launched")
    eng.add_argument("--max-num-batched-tokens", type=flags.count(1, 1 << 24), default=None, help="as vLLM is launched")
    eng.add_argument("--max-model-len", type=flags.count(1, 1 << 24), default=None, help="as vLLM is launched")
    eng.add_argument(
        "--num-kv-blocks",
        type=flags.count(1, 1 << 32),
        default=None,
        help="the KV pool vLLM logged (default: the memory ledger's for the GPU's memory)",
    )
    eng.add_argument(
        "--device-memory-bytes",
        type=flags.count(1, 1 << 50),
        default=None,
        help="the GPU's total memory (cudaMemGetInfo's); default: the ledger's table for the profile's GPU",
    )
    eng.add_argument(
        "--gpu-memory-utilization", type=flags.fraction(), default=None, help="as vLLM is launched (default 0.9)"
    )
    eng.set_defaults(func=_write_engine)


def _register_run(s: argparse._SubParsersAction) -> None:
    run = s.add_parser("run", help="replay a trace in virtual time and write a run directory")
    run.add_argument("trace", help="trace .parquet file")
    run.add_argument("--engine", required=True, help="engine TOML file or preset name (loadgen sim presets)")
    run.add_argument("--out", required=True, help="run directory to create")
    run.add_argument("--seed", type=flags.seed, default=0, help="seed for step-time noise and faults (default 0)")
    run.add_argument("--scenario", default=None, help="scenario TOML the trace came from (recorded in the manifest)")
    run.set_defaults(func=_run)


def _register_serve(s: argparse._SubParsersAction) -> None:
    srv = s.add_parser("serve", help="live OpenAI-compatible server on loopback, engine in real time")
    srv.add_argument("--engine", required=True, help="engine TOML file or preset name")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=flags.port, default=8000, help="port (0 = any free port)")
    srv.add_argument("--tokenizer", default=None, help="tokenizer spec for prompt counting (default: the engine's)")
    srv.add_argument("--fault-log", default=None, help="append injected faults to this JSONL file")
    srv.add_argument("--seed", type=flags.seed, default=0, help="seed for step-time noise and faults (default 0)")
    srv.add_argument(
        "--header-timeout-s",
        type=flags.seconds(),
        default=30.0,
        help="a request must arrive whole within this long of its first byte, else 408 (default 30)",
    )
    srv.add_argument(
        "--idle-timeout-s",
        type=flags.seconds(),
        default=120.0,
        help="close a keep-alive connection idle this long (default 120)",
    )
    srv.set_defaults(func=_serve)


def _register_calibrate(s: argparse._SubParsersAction) -> None:
    cal = s.add_parser("calibrate", help="fit the cost model to a live engine and write a calibrated engine TOML")
    src = cal.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", help="base URL of the engine (vLLM or loadgen sim serve) with /metrics or /version")
    src.add_argument(
        "--from", dest="from_runs", nargs="+", metavar="RUN_DIR", help="refit from earlier calibration run dirs"
    )
    _vllm_flags(cal, src)
    cal.add_argument("--out", required=True, type=flags.output_file, help="engine TOML to write")
    cal.add_argument("--name", default=None, help="engine name in the TOML (default: the file stem)")
    cal.add_argument("--work-dir", default=None, help="where the calibration runs go (default: OUT.calibration-runs)")
    cal.add_argument("--engine-log", default=None, help="vLLM startup log: its scheduler limits (else vLLM's defaults)")
    cal.add_argument(
        "--tokenizer",
        default=None,
        help="prompt tokenizer spec, as for loadgen run (default: cl100k_base; --vllm: its own)",
    )
    cal.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="measure at once; by default the engine's step sizes are swept first (prompt lengths 1..64, then every "
        "8th up to its token budget), so a fresh engine's one-time per-shape costs land in no measurement",
    )
    flags.writes_json(cal.add_argument("--json", action="store_true", help="print the fit as JSON"), "calibration")
    cal.set_defaults(func=_calibrate)


def _register_validate(s: argparse._SubParsersAction) -> None:
    val = s.add_parser(
        "validate",
        help="held-out check: the target and the worksheet on the same traces, or (--measured) the worksheet beside "
        "imported runs of a real engine, offline",
    )
    val.add_argument("engine", nargs="?", default=None, help="engine TOML (a calibrated one, or any preset)")
    val.add_argument("--engine", dest="engine_flag", default=None, help="engine TOML (the same as the positional)")
    vsrc = val.add_mutually_exclusive_group(required=True)
    vsrc.add_argument("--target", help="base URL of the real engine")
    vsrc.add_argument(
        "--measured",
        nargs="+",
        metavar="RUN_DIR",
        help="offline: imported runs (loadgen import llmservingsim) replayed on the engine and compared",
    )
    _vllm_flags(val, vsrc)
    val.add_argument("--out", default=None, help="directory for the runs and fidelity.json / fidelity.html")
    val.add_argument(
        "--html", default=None, metavar="FILE", type=flags.output_file, help="(--measured) write the HTML page here"
    )
    val.add_argument(
        "--sensitivity",
        action="store_true",
        help="(--measured) also replay each run on every KV pool within 4 blocks of its own and, for a DP run, with "
        "vLLM's DP balancer's timing moved by 0-90 ms, and print the spread of the worst error and the MAPE: how "
        "much of the figures is chance (the recorded error stays the unperturbed replay's)",
    )
    val.add_argument(
        "--no-record",
        dest="record",
        action="store_false",
        help="(--measured) leave the engine TOML as it is (by default its validated_error is written)",
    )
    val.add_argument(
        "--arrivals",
        choices=("workload", "queued"),
        default="workload",
        help="(--measured) where each replayed request arrives and both sides' latencies start: workload = the "
        "imported workload's own arrival instants, as users arrive (default); queued = the measured engine's "
        "queued instant (no frontend delay; each prediction then waits out part of a step)",
    )
    val.add_argument(
        "--trace", action="append", default=None, metavar="PATH", help="trace to replay (default: canonical burst)"
    )
    val.add_argument(
        "--public",
        default=None,
        metavar="KIND:PATH",
        help="public trace (azure:CSV or mooncake:JSONL), scaled to the engine at each --load",
    )
    val.add_argument(
        "--load",
        action="append",
        type=flags.number(0, 100, low_open=True),
        default=None,
        help="offered load as a share of the cost model's capacity (default 0.5, 0.9, 1.3)",
    )
    val.add_argument("--duration-s", type=flags.seconds(), default=None, help="replay only this much of each trace")
    val.add_argument(
        "--repeats",
        type=flags.count(1, 100),
        default=1,
        help="measure each trace this many times; repeats are compared with the first (the engine's own "
        "repeatability, printed beside the worksheet's error)",
    )
    val.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="measure at once; by default the engine's step sizes are swept as calibrate does, and the first trace "
        "is replayed once (not compared) before any measurement, so no one-time cost of a fresh engine lands in one",
    )
    val.add_argument(
        "--anchor",
        action="store_true",
        help="(a calibrated TOML) also run the calibration workload on this launch, refit two speed factors (step "
        "terms, prefill terms), set the loads against this launch's capacity, and compare the worksheet anchored "
        "to it beside the one as calibrated: the launch's speed against the calibrated one's, measured",
    )
    val.add_argument(
        "--plan",
        default=None,
        metavar="PLAN",
        help="also run this plan (TOML or shipped name) on the target and on the worksheet and compare their "
        "capacity boundaries line by line (criterion: within one rate step)",
    )
    val.add_argument("--engine-log", default=None, help="vLLM startup log: the target's scheduler limits")
    val.add_argument(
        "--tokenizer",
        default=None,
        help="prompt tokenizer spec, as for loadgen run (default: cl100k_base; --vllm: its own)",
    )
    flags.writes_json(
        val.add_argument(
            "--json",
            nargs="?",
            const="-",
            default=None,
            metavar="FILE",
            type=flags.output_file,
            help="print JSON (or, with FILE, write it there)",
        ),
        "fidelity",
        "validation-measured",
    )
    val.set_defaults(func=_validate)


def _vllm_flags(parser: argparse.ArgumentParser, group: argparse._MutuallyExclusiveGroup) -> None:
    group.add_argument(
        "--vllm",
        metavar="MODEL",
        help="launch vLLM (LOADGEN_VLLM_PYTHON) on a model dir, config.json or shipped model name; "
        "pin it apart from the client with loadgen --client-cpus/--engine-cpus",
    )
    parser.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra vLLM flag, e.g. --vllm-arg=--max-num-seqs=8 (a held-out configuration for validate)",
    )


def _engine(args: argparse.Namespace, work_dir: Path):
    """The engine the command measures (``--target`` URL or a launched ``--vllm``), as a context manager."""
    from loadgen.calibration.measured import measured_engine  # deferred: `loadgen --help` loads no library code

    if args.vllm_arg and not args.vllm:
        raise LoadgenError(f"--vllm-arg {args.vllm_arg[0]!r}: expected with --vllm MODEL (loadgen launches that vLLM)")
    return measured_engine(
        work_dir, url=args.target, vllm=args.vllm, vllm_args=args.vllm_arg, log_notes=_log_notes(args.engine_log)
    )


def _run(args: argparse.Namespace) -> int:
    from loadgen.rundir.manifest import read_manifest  # deferred: `loadgen --help` loads no library code

    from ..sim.profile_grid import coverage_line  # deferred: `loadgen --help` loads no library code
    from ..sim.worksheet import run_worksheet  # deferred: `loadgen --help` loads no library code

    out = run_worksheet(args.trace, args.engine, args.out, seed=args.seed, scenario=args.scenario)
    manifest = read_manifest(out)
    notes = manifest.engine_notes
    rate = notes.output_tokens_per_busy_s
    print(
        f"{out}: simulated {notes.virtual_duration_s or 0:.1f} s, {notes.steps or 0} steps, "
        f"busy {notes.busy_s or 0:.1f} s, output {notes.output_tokens or 0} tokens"
        + (f" ({rate:.0f} tok/s busy)" if rate else "")
    )
    print((manifest.engine_config or {}).get("calibration_label", ""))
    grid_note = notes.profile_grid.model_dump(mode="json") if notes.profile_grid is not None else None
    if grid := coverage_line(grid_note):
        print(grid)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from ..sim.server import serve  # deferred: `loadgen --help` loads no library code

    return serve(
        args.engine,
        args.host,
        args.port,
        tokenizer=args.tokenizer,
        fault_log=args.fault_log,
        seed=args.seed,
        header_timeout_s=args.header_timeout_s,
        idle_timeout_s=args.idle_timeout_s,
    )


def _write_engine(args: argparse.Namespace) -> int:
    from ..sim.engine_writer import (  # deferred: light --help
        DEFAULT_UTILIZATION,
        ProfiledEngineSpec,
        profile_settings_beyond,
        write_profiled_engine,
    )

    spec = ProfiledEngineSpec(
        profile_dir=Path(args.profile),
        model_config=Path(args.model_config),
        tp=args.tp or 1,
        ep=args.ep or 1,
        collectives=Path(args.collectives) if args.collectives else None,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        num_kv_blocks=args.num_kv_blocks,
        device_memory_bytes=args.device_memory_bytes,
        gpu_memory_utilization=(
            DEFAULT_UTILIZATION if args.gpu_memory_utilization is None else args.gpu_memory_utilization
        ),
        name=args.name,
        given=frozenset(k for k in ("tp", "ep", "gpu_memory_utilization") if getattr(args, k) is not None),
    )
    config = write_profiled_engine(spec, Path(args.out))
    print(f"{args.out}: {config.calibration_label()}")
    sched = config.scheduler
    print(
        f"  KV pool {config.num_kv_blocks:,} blocks; max_num_seqs {sched.max_num_seqs}, max_num_batched_tokens "
        f"{sched.max_num_batched_tokens}, max_model_len {sched.max_model_len} (the file says where each came from)"
    )
    beyond = profile_settings_beyond(spec, sched.max_num_batched_tokens, sched.max_num_seqs, sched.max_model_len or 0)
    if beyond:
        print("  past the profile's measured points (steps there are priced by continuing its tables linearly):")
        for phrase in beyond:
            print(f"    {phrase}")
    return 0


def _presets(args: argparse.Namespace) -> int:
    from ..sim.config import list_presets, load_engine_config  # deferred: `loadgen --help` loads no library code

    for name in list_presets():
        print(f"{name:28s} {load_engine_config(name).description}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from loadgen.vllm.warmup import warmup_line  # deferred: `loadgen --help` loads no library code

    from ..calibration.calibrate import calibrate  # deferred: `loadgen --help` loads no library code
    from ..driver.options import RunSettings  # deferred: as above
    from ..sim.config import load_engine_config  # deferred: `loadgen --help` loads no library code

    out = Path(args.out)
    if args.from_runs:
        path, fit, limits = calibrate(
            out,
            run_dirs=[Path(d) for d in args.from_runs],
            name=args.name,
            settings=RunSettings(tokenizer=args.tokenizer or "cl100k_base"),
        )
    else:
        work = Path(args.work_dir) if args.work_dir else out.with_suffix(".calibration-runs")
        with _engine(args, work) as engine:
            path, fit, limits = calibrate(
                out,
                target_url=engine.url,
                work_dir=work,
                name=args.name,
                log_notes=engine.log_notes,
                engine_manifest=engine.manifest,
                engine_memory=engine.memory,
                warmup=args.warmup,
                settings=RunSettings(tokenizer=args.tokenizer or engine.tokenizer or "cl100k_base"),
            )
    runtime_gib = load_engine_config(path).measured_runtime_gib()
    if args.json:
        from ..calibration.calibrate_result import calibration_result  # deferred: as above

        print(json.dumps(calibration_result(path, fit, limits, runtime_gib).document()))  # schema: calibration
        return 0
    print(f"{path}: calibrated from {fit.observations} observations (limits: {limits.sources})")
    for term, value in fit.terms.items():
        print(f"  {term:24s} {value:.6g}" + ("  (fixed at 0)" if term in fit.dropped_terms else ""))
    print(f"  {'noise_sigma':24s} {fit.noise_sigma:.4g}")
    if q := fit.step_jitter_ms:
        print(f"  {'step_jitter_ms':24s} p1 {q[0]:+.3g} … p50 {q[4]:+.3g} … p99 {q[-1]:+.3g}")
    for key, value in fit.residual_pct.items():
        print(f"  residual {key:30s} {value:.2f} %")
    if warmed := (load_engine_config(path).calibration or {}).get("warmup"):
        print(f"  {warmup_line(warmed)}")
    if runtime_gib is not None:
        print(
            f"  runtime {runtime_gib:g} GiB measured beyond the ledger's model memory (loadgen ledger --runtime-from {path})"
        )
    return 0


def _validate(args: argparse.Namespace) -> int:
    from ..calibration.validate import (  # deferred: `loadgen --help` loads no library code
        ValidateOptions,
        format_table,
        validate,
    )
    from ..driver.options import RunSettings  # deferred: as above

    if args.engine and args.engine_flag and args.engine != args.engine_flag:
        raise LoadgenError(f"engine {args.engine!r} and --engine {args.engine_flag!r}: expected one engine")
    args.engine = args.engine or args.engine_flag
    if not args.engine:
        raise LoadgenError("sim validate: no engine: expected an engine TOML (ENGINE or --engine ENGINE)")
    if args.measured:
        return _validate_measured(args)
    if args.sensitivity:
        raise LoadgenError("sim validate --sensitivity: expected --measured RUN_DIR (it replays imported runs)")
    if not args.out:
        raise LoadgenError("sim validate --target/--vllm: --out is required (the directory for the runs)")
    public = None
    if args.public:
        kind, _, path = args.public.partition(":")
        if kind not in ("azure", "mooncake") or not path:
            raise LoadgenError(f"--public = {args.public!r}: expected azure:PATH or mooncake:PATH")
        public = (kind, Path(path))
    out = Path(args.out)
    with _engine(args, out) as engine:
        options = ValidateOptions(
            traces=tuple((Path(t).stem, Path(t)) for t in args.trace) if args.trace else None,
            public_trace=public,
            loads=tuple(args.load) if args.load else ValidateOptions.loads,
            duration_s=args.duration_s,
            log_notes=engine.log_notes,
            engine_manifest=engine.manifest,
            engine_memory=engine.memory,
            plan=args.plan,
            plan_target=engine.target,
            repeats=args.repeats,
            warmup=args.warmup,
            anchor=args.anchor,
        )
        tokenizer = args.tokenizer or engine.tokenizer or "cl100k_base"
        result = validate(Path(args.engine), engine.url, out, options, settings=RunSettings(tokenizer=tokenizer))
    _json_or_table(args.json, json.dumps(result, default=str, indent=1), format_table(result))
    return 0


def _json_or_table(json_arg: str | None, text: str, table: str) -> None:
    """``--json`` (``-``): print the JSON; ``--json FILE``: print the table and write the JSON to FILE."""
    if json_arg == "-":
        print(text)
        return
    print(table)
    if json_arg:
        write_output_text(json_arg, text + "\n")


def _validate_measured(args: argparse.Namespace) -> int:
    """``sim validate --measured RUN_DIR... --engine ENGINE.toml``: offline, against imported runs."""
    from ..calibration.offline import record_validated_error, validate_measured  # deferred: light --help
    from ..calibration.offline_report import format_offline, offline_html  # deferred: light --help
    from ..calibration.offline_result import MeasuredValidation  # deferred: light --help

    result = validate_measured([Path(p) for p in args.measured], args.engine, anchor=args.arrivals)
    if args.sensitivity:
        from ..calibration.sensitivity import add_sensitivity  # deferred: light --help

        add_sensitivity(result, args.engine, args.arrivals)
    engine_path = Path(args.engine)
    if args.record and engine_path.is_file():
        result["recorded"] = record_validated_error(engine_path, result)
    document = MeasuredValidation.from_document(result).document()  # the published schema: validation-measured
    _json_or_table(args.json, json.dumps(document, indent=1), format_offline(result))
    if args.html:
        write_output_text(args.html, offline_html(result))
    if result.get("recorded"):
        print(f"{engine_path}: validated_error = {result['recorded']}")
    return 0


def _log_notes(path: str | None) -> dict | None:
    """The facts a vLLM startup log reports (scheduler limits among them), or None without one."""
    if not path:
        return None
    from loadgen.vllm.log import parse_vllm_log_file  # deferred: `loadgen --help` loads no library code

    return parse_vllm_log_file(path)
