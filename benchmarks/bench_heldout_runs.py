"""Benchmark: the shipped profiled GPU engines against public vLLM runs they were never fitted to (held out).

The engines under ``scenarios/engines/`` were built from LLMServingSim's operator profiles and checked on the three
shared runs (``benchmarks/bench_profiled.py``). casys-kaist/LLMServingSim publishes more runs; this script replays
two of them, unchanged engines, nothing fitted to them. The run files are not shipped: fetch each file below from
the public repository at the commit named (``git -C LLMServingSim show <commit>:<path> > <file>``) into ``--runs``
(default ``$XDG_CACHE_HOME/loadgen/heldout``, i.e. ``~/.cache/loadgen/heldout``), laid out as shown. The sha256,
size and lines are those of the files this script was measured on (each checked and printed on every run):

``rtx4090-llama8b-tp1/`` -- repository casys-kaist/LLMServingSim, folder ``bench/results/rtx4090-llama8b-tp1/``:
  RTX 4090, Llama-3.1-8B TP 1, vLLM 0.19.0, ``max_num_seqs`` 128 (the shared run: 256), the shared run's workload
  (``dataset_hash`` 05e48b32..., equal to ``../shared/traces/llmservingsim/workloads/sharegpt-llama-3.1-8b-300-sps10
  .jsonl``'s sha256, which is imported beside it). Its meta.json logs no KV block count and no device memory.

  - ``meta.json``                     commit a09fa560f737a5307a75f8311c1afb749713962f, 709 B, 22 lines
  - ``requests.jsonl``                commit 5bae11f9799dd59de86daa6412a3b465b80418c3, 70,263 B, 300 lines
  - ``timeseries.csv``                commit 5bae11f9799dd59de86daa6412a3b465b80418c3, 4,992 B, 174 lines (CRLF)
  - ``validation/rtx4090_summary.txt`` commit a09fa560f737a5307a75f8311c1afb749713962f, 1,022 B, 19 lines

``qwen3-32b-tp2-rtxpro6000/`` -- folder ``bench/examples/RTXPRO6000/Qwen3-32B/``: Qwen3-32B TP 2 on two RTX PRO
  6000 Blackwell Server Edition, vLLM 0.28.0 (the operator profile is vLLM 0.19.0's), ``max_num_seqs`` 128, 28,884
  KV blocks logged at ``gpu_memory_utilization`` 0.92, device 101,976,440,832 B. Its workload
  (``workloads/sharegpt-qwen3-32b-300-sps10.jsonl``) is not in the public repository: the import takes lengths and
  arrivals from requests.jsonl, with no prompt token ids, so no prefix sharing is replayed (the manifest's
  ``synthesized["workload"]`` says so; the run's timeseries.csv logs 20,480 of 258,691 prompt tokens, 7.9%, served
  from vLLM's prefix cache, which the replay computes).

  - ``vllm/meta.json``         commit 0d3de681adbd9c515fc378e94e3e625b6e250dad, 14,764 B, 490 lines
  - ``vllm/requests.jsonl``    commit 0d3de681adbd9c515fc378e94e3e625b6e250dad, 71,479 B, 300 lines
  - ``vllm/timeseries.csv``    commit 1b2cc02d67a2647c9f0d67bf07debf240aba82b5, 5,966 B, 138 lines (CRLF; the
    stored version nearest the run: its per-tick running counts and its summed prompt and generation tokens equal
    the ones requests.jsonl gives)
  - ``validation/summary.txt`` commit 0d3de681adbd9c515fc378e94e3e625b6e250dad, 1,022 B, 19 lines
  - ``config.json``            commit 3379622790a94334224947123b03e58f38e22c91, 610 B, 25 lines

For each run present: ``loadgen import llmservingsim`` into a temporary directory, then the comparison ``loadgen sim
validate --measured RUN --no-record`` prints (``compare_run``, workload arrivals) on the matching shipped engine:
every figure measured, predicted, our signed error and LLMServingSim's own (their ``validation/*summary.txt``, their
figures). The RTX 4090 run logs no KV pool, so it is replayed on three pools, each named: the ledger's for this GPU
and these settings (device memory as the shared RTX 4090 run logged it, the same card model; utilization 0.9,
the bench's default, logged on the shared run), the shared run's logged 2,588 blocks adjusted by the ledger's
difference between ``max_num_seqs`` 128 and 256 (vLLM 0.19's profile samples ``min(max_num_seqs,
max_num_batched_tokens)`` dummy rows: fewer rows, a smaller torch peak, more KV), and the 2,588 as logged (the
engine TOML's, what ``sim validate`` uses when a run logs none), then every pool within 4 blocks of the ledger's
(the run is chaotic in its pool: a preemption more or less moves its tail). The Qwen3-32B run's own 28,884 blocks are replayed,
and the ledger is set beside them for its logged settings. Deterministic: no GPU, no timing.

    python benchmarks/bench_heldout_runs.py --runs DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen.calibration.llmservingsim import find_run_folder, import_llmservingsim_run
from loadgen.calibration.offline import ANCHORS, compare_run
from loadgen.calibration.offline_report import format_offline
from loadgen.calibration.sensitivity import run_sensitivity
from loadgen.ledger import GIB, EngineSettings, compute_ledger, read_model_config
from loadgen.sim import EngineConfig, load_engine_config
from loadgen.sim.link import AssumedLink
from loadgen.util.errors import LoadgenError

SHARED = REPO.parent / "shared" / "traces" / "llmservingsim"
MODELS = REPO / "scenarios" / "engines" / "profiles" / "models"
#: run folder -> (engine, model config, {file: (sha256, bytes)}) as measured
RUNS: dict[str, tuple[str, str, dict[str, tuple[str, int]]]] = {
    "rtx4090-llama8b-tp1": (
        "rtx4090-llama-3.1-8b-tp1",
        "Llama-3.1-8B.json",
        {
            "meta.json": ("555b835cd317d00aa43f98fd44b015fa517fb7f0ff0354dec84ff15540d75058", 709),
            "requests.jsonl": ("971558081874ba0a1ba4586b6e01c699fb15a9ed7a4d2c602eccde40bfe508ac", 70_263),
            "timeseries.csv": ("9ea67fb3d89d8d3b38a70540e1ef01cc6ca0433a060c8442d03156ee7cf9b8fe", 4_992),
            "validation/rtx4090_summary.txt": (
                "9a3e168052b6478529111fabb474e4976b07eccd1e492e8ba2c9c81fdcca4242",
                1_022,
            ),
        },
    ),
    "qwen3-32b-tp2-rtxpro6000": (
        "rtxpro6000-qwen3-32b-tp2",
        "Qwen3-32B.json",
        {
            "vllm/meta.json": ("fb5130ed14f3b37e5baead57a303513f024df61f50cbcafe9eb34458448fd0b9", 14_764),
            "vllm/requests.jsonl": ("ef2f88a951b6b403ae1afd5c7d215169ee842f4eeac90aceb5bb7e1c1b1ba819", 71_479),
            "vllm/timeseries.csv": ("2bd9b960320458d5e289b332ad92dba90e580ff8afefb9c35646e1ec77e40084", 5_966),
            "validation/summary.txt": ("7171555a21843c8ae9f58409412e1bcc244739472c94cbee7168ee54b03460c4", 1_022),
            "config.json": ("50812cfb454693bd7c90482048a9ce8acda0f583fc53a9b8fd98d627d8a1b549", 610),
        },
    ),
}
#: The RTX 4090 run's workload: the shared run's (the same dataset_hash).
LLAMA_WORKLOAD = SHARED / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"
#: The shared RTX 4090 run (vLLM 0.19.0, max_num_seqs 256): its meta.json logs the device memory and the pool.
SHARED_4090_META = SHARED / "bench" / "examples" / "RTX4090" / "Llama-3.1-8B" / "vllm" / "meta.json"


def default_runs_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loadgen" / "heldout"


def _check_files(folder: Path, files: dict[str, tuple[str, int]]) -> None:
    """Print each file's sha256 against the one measured (a mismatch is printed, not refused)."""
    for name, (sha, size) in files.items():
        path = folder / name
        if not path.is_file():
            print(f"   {name}: absent")
            continue
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        state = "as measured" if got == sha else f"DIFFERS from the measured file ({size:,} B, sha256 {sha[:12]}...)"
        print(f"   {name}: {path.stat().st_size:,} B, sha256 {got[:12]}... {state}")


def _ledger_blocks(config: str, settings: dict[str, Any]) -> tuple[int, Any]:
    led = compute_ledger(read_model_config(MODELS / config), EngineSettings(**settings))
    return int(led.kv_cache_blocks or 0), led


def _with_blocks(cfg: EngineConfig, blocks: int) -> EngineConfig:
    """The engine with its KV pool set to ``blocks`` (its costs untouched)."""
    return cfg.model_copy(update={"kv": cfg.kv.model_copy(update={"num_kv_blocks": blocks, "kv_cache_gib": None})})


def _table(cfg: EngineConfig, run_dir: Path, anchor: str, label: str, source: str) -> dict[str, Any]:
    """The comparison ``sim validate --measured`` prints, the KV pool named by where it came from."""
    got = compare_run(run_dir, cfg, anchor).to_dict()
    got["settings"]["source"]["num_kv_blocks_used"] = source
    result = {
        "engine_label": f"{cfg.calibration_label()}\nKV pool: {label}",
        "anchor": {"name": anchor, "means": ANCHORS[anchor][1]},
        "runs": [got],
        "worst": None,
    }
    print(format_offline(result))
    notes = got["engine_notes"]
    print(f"  replay: preemptions {notes.get('preemptions')}, prefix-cache hit tokens {notes.get('prefix_cache_hits')}")
    print()
    return got


def _summary_line(got: dict[str, Any]) -> str:
    rows = {r["figure"]: r["signed_pct"] for r in got["rows"]}
    worst = got["worst"] or {}
    figures = ("ttft_mean", "tpot_mean", "e2e_mean", "queue_mean", "throughput_rps")
    return (
        ", ".join(f"{f} {rows[f]:+.1f}%" for f in figures)
        + f"; MAPE {got['mape_pct']:.1f}%, worst {worst.get('figure')} {worst.get('signed_pct', 0.0):+.1f}%"
    )


def rtx4090_pools(folder: Path) -> tuple[int, int, dict[str, Any], dict[str, Any]]:
    """The RTX 4090 run's KV pool as the ledger gives it for the run's own settings (``max_num_seqs`` 128), and
    for the shared run's (256), on the device memory and utilization the shared run logged (the same card model);
    with the run's meta.json and the shared run's."""
    _, config, _ = RUNS["rtx4090-llama8b-tp1"]
    meta = json.loads((find_run_folder(folder) / "meta.json").read_text())
    shared = json.loads(SHARED_4090_META.read_text())
    kwargs = meta["engine_kwargs"]
    common = {
        "max_num_batched_tokens": kwargs["max_num_batched_tokens"],
        "max_model_len": kwargs["max_model_len"],
        "tensor_parallel_size": kwargs["tensor_parallel_size"],
        "device_memory_gib": int(shared["hardware"]["device_total_memory_bytes"]) / GIB,
        "gpu_memory_utilization": shared["kv_cache"]["gpu_memory_utilization"],
        "block_size": shared["kv_cache"]["block_size"],
        "device_name": shared["hardware"]["device_name"],
    }
    held, _ = _ledger_blocks(config, common | {"max_num_seqs": kwargs["max_num_seqs"]})
    at_shared, _ = _ledger_blocks(config, common | {"max_num_seqs": shared["engine_kwargs"]["max_num_seqs"]})
    return held, at_shared, meta, shared


def heldout_replays(runs: Path, tmp: Path) -> list[tuple[str, Path, EngineConfig]]:
    """Each held-out run present under ``runs``, imported under ``tmp``, with its shipped engine on the pool its
    first table replays: the ledger's for the RTX 4090 run (it logs none), the logged one for Qwen3-32B."""
    out = []
    for name, (engine, _, _) in RUNS.items():
        if not (runs / name).is_dir():
            continue
        run = find_run_folder(runs / name)
        cfg = load_engine_config(engine)
        if name.startswith("rtx4090"):
            run_dir = import_llmservingsim_run(run, tmp / name, workload=LLAMA_WORKLOAD)
            cfg = _with_blocks(cfg, rtx4090_pools(runs / name)[0])
        else:
            run_dir = import_llmservingsim_run(run, tmp / name)
        out.append((name, run_dir, cfg))
    return out


def rtx4090(folder: Path, tmp: Path, anchor: str) -> None:
    engine, _, _ = RUNS["rtx4090-llama8b-tp1"]
    run_dir = import_llmservingsim_run(find_run_folder(folder), tmp / "rtx4090-llama8b-tp1", workload=LLAMA_WORKLOAD)
    held, at_shared, meta, shared = rtx4090_pools(folder)
    kwargs = meta["engine_kwargs"]
    device = int(shared["hardware"]["device_total_memory_bytes"])
    logged = int(shared["kv_cache"]["num_gpu_blocks"])
    print(
        f"   ledger (vLLM 0.19 accounting; device {device:,} B as the shared RTX 4090 run logged it, utilization "
        f"{shared['kv_cache']['gpu_memory_utilization']}): max_num_seqs {kwargs['max_num_seqs']} -> {held:,} blocks, "
        f"max_num_seqs {shared['engine_kwargs']['max_num_seqs']} -> {at_shared:,} (logged there: {logged:,}, "
        f"{(at_shared - logged) / logged:+.2%}); difference {held - at_shared:+,} blocks"
    )
    cfg = load_engine_config(engine)
    pools = (
        (
            held,
            f"{held:,} blocks: the ledger's for this GPU and these settings (max_num_seqs {kwargs['max_num_seqs']})",
        ),
        (
            logged + held - at_shared,
            f"{logged + held - at_shared:,} blocks: the shared run's logged {logged:,} + the ledger's max_num_seqs "
            f"difference {held - at_shared:+,}",
        ),
        (logged, f"{logged:,} blocks: the shared run's, as logged at max_num_seqs 256 (the engine TOML's)"),
    )
    print()
    sources = ("ledger", "logged at 256 + ledger difference", "logged at 256 (engine TOML)")
    for (blocks, label), source in zip(pools, sources, strict=True):
        _table(_with_blocks(cfg, blocks), run_dir, anchor, label, source)
    _pool_sweep(cfg, run_dir, anchor, held)


def _pool_sweep(cfg: EngineConfig, run_dir: Path, anchor: str, centre: int) -> None:
    """The same comparison on every pool within ``sensitivity.POOL_BLOCKS`` of ``centre`` (as ``sim validate
    --measured --sensitivity`` runs it): how much of one pool's figure is the run's sensitivity to its pool (a
    preemption more or less moves the tail) rather than the engine's costs."""
    cfg = _with_blocks(cfg, centre)
    for spread in run_sensitivity(run_dir, cfg, anchor, compare_run(run_dir, cfg, anchor).settings):
        print(f"   sensitivity, {spread.summary()}")
        for blocks, figure, worst, mape in zip(
            spread.settings, spread.worst_figures, spread.worst_abs_pct, spread.mape_pct, strict=True
        ):
            print(f"     {blocks:,}: worst {figure} {worst:.1f}%, MAPE {mape:.1f}%")
    print()


def qwen(folder: Path, tmp: Path, anchor: str) -> None:
    engine, config, _ = RUNS["qwen3-32b-tp2-rtxpro6000"]
    run = find_run_folder(folder)
    meta = json.loads((run / "meta.json").read_text())
    run_dir = import_llmservingsim_run(run, tmp / "qwen3-32b-tp2-rtxpro6000")
    kv, hw, kwargs = meta["kv_cache"], meta["hardware"], meta["engine_kwargs"]
    model_len = (meta.get("resolved_config") or {}).get("model_config", {}).get("max_model_len")
    settings = {
        "max_num_seqs": kwargs["max_num_seqs"],
        "max_num_batched_tokens": kwargs["max_num_batched_tokens"],
        "max_model_len": model_len,
        "tensor_parallel_size": kwargs["tensor_parallel_size"],
        "device_memory_gib": hw["device_total_memory_bytes"] / GIB,
        "gpu_memory_utilization": kv["gpu_memory_utilization"],
        "block_size": kv["block_size"],
        "device_name": hw["device_name"],
    }
    fusion = kwargs.get("compilation_config", {}).get("pass_config", {}).get("fuse_allreduce_rms")
    if fusion is not None:  # logged: the run set it (off); capability 12.0 would have it off anyway
        settings["allreduce_rms_fusion"] = bool(fusion)
    blocks, led = _ledger_blocks(config, settings)
    logged = int(kv["num_gpu_blocks"])
    per_block = led.kv.bytes_per_block
    usable = int(hw["device_total_memory_bytes"] * kv["gpu_memory_utilization"])
    lo, hi = usable - (logged + 1) * per_block, usable - logged * per_block
    graph = led.line("graph_comm_buffers")
    others = sum(line.bytes for line in led.lines if line.name not in ("kv_cache", "safety_margin", "runtime"))
    others -= graph.bytes
    print(
        f"   ledger (vLLM 0.19 accounting, no CUDA graph estimate; device {hw['device_total_memory_bytes']:,} B x "
        f"{kv['gpu_memory_utilization']}, TP {kwargs['tensor_parallel_size']}, max_model_len {model_len}, "
        f"max_num_seqs {kwargs['max_num_seqs']}): {blocks:,} blocks vs logged {logged:,} ({(blocks - logged) / logged:+.2%})"
    )
    print(
        f"   with weights, forward and sampler as derived, vLLM 0.28's non-torch increase + CUDA graph estimate was "
        f"{(lo - others) / GIB:.3f}-{(hi - others) / GIB:.3f} GiB per GPU (the ledger assumes "
        f"{graph.factors['non_torch_gib']:g} GiB non-torch, {graph.factors['non_torch_source']}, and 0 GiB graph "
        "estimate); "
        f"every GiB of graph estimate is {GIB // per_block} blocks fewer"
    )
    print()
    cfg = load_engine_config(engine)
    _table(cfg, run_dir, anchor, f"{logged:,} blocks: logged by this run", "logged by vLLM")
    profile = cfg.cost.profile
    assert profile is not None
    assumed = AssumedLink()  # what an engine that states no link is priced on
    links = {
        "free": (0.0, 1e6),
        f"assumed ({assumed.latency_us:g} us + {assumed.gb_per_s:g} GB/s)": (assumed.latency_us, assumed.gb_per_s),
    }
    for name, (latency_us, gb_per_s) in links.items():
        update = {"collectives": None, "link_latency_us": latency_us, "link_gb_per_s": gb_per_s}
        other = cfg.model_copy(
            update={"cost": cfg.cost.model_copy(update={"profile": profile.model_copy(update=update)})}
        )
        print(
            f"   sensitivity (not a fit; the shipped TOML is unchanged): the TP collectives (2 all-reduces a layer) "
            f"costed on the shipped {profile.link().describe()}; on a link {name}: "
            f"{_summary_line(compare_run(run_dir, other, anchor).to_dict())}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=None, help=f"the run folders (default {default_runs_dir()})")
    parser.add_argument("--arrivals", choices=sorted(ANCHORS), default="workload")
    args = parser.parse_args()
    runs = args.runs or default_runs_dir()
    present = [name for name in RUNS if (runs / name).is_dir()]
    if not present:
        print(
            f"{runs}: none of {', '.join(RUNS)}: expected the held-out runs fetched from casys-kaist/LLMServingSim "
            "as this script's docstring lists (pass --runs DIR)",
            file=sys.stderr,
        )
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        for name in present:
            engine, _, files = RUNS[name]
            print(f"== {name} ({runs / name}) on the shipped engine {engine}")
            _check_files(runs / name, files)
            try:
                (rtx4090 if name.startswith("rtx4090") else qwen)(runs / name, Path(tmp), args.arrivals)
            except (LoadgenError, KeyError, ValueError) as exc:
                print(f"{runs / name}: {exc!s:.300}", file=sys.stderr)
                sys.exit(2)


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
