"""Against a real vLLM (CPU build here): replay a short three-class trace, check the records, reconcile the ledger.

Needs env LOADGEN_VLLM_PYTHON (``export LOADGEN_VLLM_PYTHON=$(bash .ci/vllm.sh | tail -1)``); skipped
otherwise. One server per configuration per session: tiny Llama (GQA) with a small and a large
--max-num-seqs, then tiny Qwen2 and a tiny DeepSeek-V2 (MLA) for more exact ledger reconciliations. Run dirs are kept under
ci-artifacts/vllm/ with a summary.json (analyzer TTFT p99, output tok/s, wall times).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from result_schemas import assert_valid

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "ci-artifacts" / "vllm"
KV_GIB = 1
MAX_MODEL_LEN = 1000  # not a multiple of the CPU block size (128): exercises vLLM's concurrency rounding

SCENARIO = """
name = "vllm-ci"
description = "Short three-class trace for the real-vLLM CI tier."
seed = 7
endpoint = "completions"

[classes.short-message]
share = 0.5
stream = true
input_tokens = { dist = "lognormal", mean = 48, sigma = 0.4, min = 8, max = 160 }
output_tokens = { dist = "uniform", low = 8, high = 24 }
[classes.short-message.budgets]
ttft_ms = { p99 = 5000, hard = true }

[classes.long-thread]
share = 0.25
stream = true
input_tokens = { dist = "uniform", low = 64, high = 128 }
output_tokens = { dist = "uniform", low = 12, high = 24 }
thread = { turns = { dist = "fixed", value = 2 }, think_time_s = { dist = "fixed", value = 1 } }
[classes.long-thread.budgets]
ttft_ms = { p99 = 8000, hard = true }

[classes.burst]
share = 0.25
stream = true
input_tokens = { dist = "uniform", low = 128, high = 256 }
output_tokens = { dist = "uniform", low = 8, high = 16 }
[classes.burst.budgets]
ttft_ms = { p99 = 8000, hard = true }

[errors]
ttft_timeout_s = 60
total_timeout_s = 120

[traces.ci]
process = "onoff"
quiet_rate_rps = 1.0
burst_rate_rps = 12.0
burst_s = 4
gap_s = 6
duration_s = 14
max_in_flight = 128
burst_shares = { short-message = 0.3, long-thread = 0.1, burst = 0.6 }
"""


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    value = os.environ.get("LOADGEN_VLLM_PYTHON")
    if not value:
        pytest.skip("env LOADGEN_VLLM_PYTHON is unset: run `export LOADGEN_VLLM_PYTHON=$(bash .ci/vllm.sh | tail -1)`")
    if not Path(value).exists():
        pytest.skip(f"LOADGEN_VLLM_PYTHON={value} does not exist")
    return Path(value)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="session")
def ci_trace(workdir) -> tuple[Path, Path]:
    from loadgen.trace import generate_trace, write_trace
    from loadgen.workload.scenario import load_scenario

    scenario_path = workdir / "vllm-ci.toml"
    scenario_path.write_text(SCENARIO)
    table, meta = generate_trace(load_scenario(scenario_path), "ci")
    trace_path = write_trace(table, workdir / "vllm-ci.parquet", meta)
    return scenario_path, Path(trace_path)


def _model_dir(workdir: Path, name: str) -> Path:
    from loadgen.vllm import make_model_dir

    out = workdir / name
    if not (out / "config.json").exists():
        make_model_dir(name, out)
    return out


#: Every launch in this tier starts vLLM eager: its default start-up compiles the model with Inductor (54-132 s
#: per launch in CI, never a cache hit: the cache key holds the model path and the scheduler limits), eager
#: starts in the time of its imports (~45 s here). What these tests check does not depend on compilation; the
#: manifest records enforce_eager from the log. The calibrate -> validate round calibrates and validates the
#: same eager engine (a user's `sim calibrate --vllm` keeps vLLM's default unless given --vllm-arg).
EAGER = ["--enforce-eager"]


def _server(vllm_python: Path, model_dir: Path, log: Path, **kw):
    from loadgen.vllm import VllmConfig, VllmServer

    cfg = VllmConfig(
        model_dir=model_dir,
        python=vllm_python,
        kv_cache_gib=KV_GIB,
        max_model_len=MAX_MODEL_LEN,
        log_path=log,
        extra_args=EAGER,
        **kw,
    )
    server = VllmServer(cfg).start()
    try:
        server.wait_healthy(900)
    except BaseException:
        server.stop()
        raise
    return server


_TIMES: dict[str, float] = {}


def _replay(server, scenario_path: Path, trace_path: Path, name: str) -> Path:
    from loadgen.driver import RunOptions
    from loadgen.targets.vllm import measure_with_server

    out = ARTIFACTS / name
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    options = RunOptions(
        trace_path=trace_path,
        target_url=server.base_url,
        out_dir=out,
        scenario_path=scenario_path,
        tokenizer=f"hf:{server.config.model_dir / 'tokenizer.json'}",
        scrape_interval_s=0.5,
        warm_state="cold",
        warm_actions=["fresh vLLM server, no prior requests"],
        progress="off",
    )
    t0 = time.monotonic()
    run_dir = measure_with_server(server, options)  # also reconciles the ledger into engine_notes
    _TIMES[name] = time.monotonic() - t0
    return run_dir


def _ledger(model_dir: Path, block_size: int = 128, **engine):
    from loadgen.ledger import EngineSettings, compute_ledger, read_model_config

    return compute_ledger(
        read_model_config(model_dir / "config.json"),
        EngineSettings(kv_cache_gib=KV_GIB, block_size=block_size, max_model_len=MAX_MODEL_LEN, device="cpu", **engine),
    )


@pytest.fixture(scope="session")
def llama_runs(vllm_python, workdir, ci_trace) -> dict[str, Path]:
    """The same trace against tiny Llama with --max-num-seqs 2 and 64 (one server each, sequentially)."""
    scenario_path, trace_path = ci_trace
    model_dir = _model_dir(workdir, "tiny-llama-gqa")
    runs: dict[str, Path] = {}
    for label, seqs in (("max-num-seqs-2", 2), ("max-num-seqs-64", 64)):
        t0 = time.monotonic()
        server = _server(vllm_python, model_dir, workdir / f"llama-{label}.log", max_num_seqs=seqs)
        _TIMES[f"{label}-startup"] = time.monotonic() - t0
        try:
            runs[label] = _replay(server, scenario_path, trace_path, label)
        finally:
            server.stop()
    return runs


def test_every_request_accounted_for(llama_runs, ci_trace):
    from loadgen.rundir.schema import STATUSES
    from loadgen.trace import read_trace

    trace, _ = read_trace(ci_trace[1])
    for label, run_dir in llama_runs.items():
        req = pq.read_table(run_dir / "requests.parquet").to_pylist()
        assert sorted(r["request_id"] for r in req) == sorted(trace.column("request_id").to_pylist()), label
        assert all(r["status"] in STATUSES for r in req)
        ok = [r for r in req if r["status"] == "ok"]
        assert len(ok) == len(req), (
            f"{label}: {[(r['status'], r['error_kind'], r['error_message']) for r in req if r['status'] != 'ok'][:3]}"
        )
        for r in ok:
            assert r["scheduled_ns"] <= r["sent_ns"] <= r["first_token_ns"] <= r["last_token_ns"] <= r["done_ns"]
            assert r["server_prompt_tokens"] and r["server_output_tokens"] == r["target_output_tokens"]
            # the client counted the prompt it sent with the served tokenizer: the server agrees exactly
            assert r["server_prompt_tokens"] == r["client_prompt_tokens"]
            assert abs(r["server_prompt_tokens"] - r["target_prompt_tokens"]) <= 2
        chunks = pq.read_table(run_dir / "chunks.parquet").to_pylist()
        by_req: dict[str, list[int]] = {}
        for c in chunks:
            by_req.setdefault(c["request_id"], []).append(c["arrival_ns"])
        for r in ok:
            times = by_req[r["request_id"]]
            assert times == sorted(times) and len(times) >= 2
            assert min(times) >= r["sent_ns"] and max(times) <= r["done_ns"]


def test_server_metrics_scraped(llama_runs):
    """Scraped vLLM counters agree with the client's records; the small config's limit shows in its gauges."""
    for label, run_dir in llama_runs.items():
        metrics = pq.read_table(run_dir / "server_metrics.parquet").to_pylist()
        names = {m["name"] for m in metrics}
        for needed in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info",
            "vllm:prefix_cache_queries_total",
            "vllm:num_preemptions_total",
            "vllm:iteration_tokens_total_bucket",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket",
        ):
            assert needed in names, f"{label}: {needed} not scraped"
        assert len({m["time_ns"] for m in metrics}) >= 5  # scraped throughout the run, not once
        last_t = max(m["time_ns"] for m in metrics)

        def final(name: str) -> float:
            series: dict[str, tuple[int, float]] = {}
            for m in metrics:
                if m["name"] == name and m["time_ns"] >= series.get(m["labels"], (-1, 0.0))[0]:
                    series[m["labels"]] = (m["time_ns"], m["value"])
            return sum(v for _, v in series.values())

        req = pq.read_table(run_dir / "requests.parquet").to_pylist()
        ok = [r for r in req if r["status"] == "ok"]
        assert final("vllm:prompt_tokens_total") == sum(r["server_prompt_tokens"] for r in ok)
        assert final("vllm:generation_tokens_total") == sum(r["server_output_tokens"] for r in ok)
        assert final("vllm:request_success_total") == len(ok)
        assert last_t >= max(r["done_ns"] for r in ok)  # a final scrape after the last request
        running = [m["value"] for m in metrics if m["name"] == "vllm:num_requests_running"]
        if label == "max-num-seqs-2":
            assert max(running) <= 2  # the engine limit shows in its own metrics


def test_manifest_identifies_vllm(llama_runs):
    for label, run_dir in llama_runs.items():
        m = json.loads((run_dir / "manifest.json").read_text())
        assert m["target"]["kind"] == "vllm"
        engine = m["target"]["engine"]
        assert engine["name"] == "vllm" and engine["version"] == "0.32.0"
        assert "--max-num-seqs" in engine["config"]["args"] and engine["config"]["env"][
            "VLLM_CPU_KVCACHE_SPACE"
        ] == str(KV_GIB)
        notes = m["engine_notes"]["log"]
        assert notes["kv_cache_size_tokens"] > 0 and notes["max_concurrency"] > 0 and notes["init_engine_s"] > 0
        assert notes["non_default_args"]["load_format"] == "dummy"
        assert notes["engine_config"]["enforce_eager"] is True  # how it ran (EAGER) is on record
        mem = m["engine_notes"]["memory"]
        assert mem["samples"] > 0 and mem["rss_high_water_bytes"] > 256 << 20  # a real process tree
        assert m["modelExecuted"] is True and m["benchmarkExecuted"] is True
        assert (run_dir / "vllm.log").is_file()
        assert m["engine_notes"]["ledger_reconcile"]["ok"] is True  # recorded by measure_with_server
        assert mem["ledger_total_bytes"] == m["engine_notes"]["ledger_reconcile"]["ledger_total_bytes"]
        # the ledger's total, runtime line included, predicts the process tree's peak RSS: the ratio is reported in
        # summary.json (the goal is within 10%; 0.97-0.98 on the host the runtime default was measured on,
        # 1.10 on a host with AMX); asserted here is only that the ledger is the right size, not how close it is
        assert 0.75 <= mem["rss_high_water_over_ledger"] <= 1.33, mem
        assert mem["runtime_measured_bytes"] > 0
        assert m["behavior_relevant"]["prefix_caching"] is True and m["behavior_relevant"]["quantization"] is None


def test_ledger_reconciles_llama_run_dir(llama_runs):
    from loadgen.ledger import read_model_config
    from loadgen.vllm import reconcile

    for label, run_dir in llama_runs.items():
        model = read_model_config(ROOT / "loadgen" / "data" / "models" / "tiny-llama-gqa.json")
        result = reconcile(model, None, run_dir)
        quantities = {r.quantity for r in result.rows}
        assert {"kv_cache_size_tokens", "kv_cache_blocks", "block_size"} <= quantities
        assert result.ok, result.format()
        blocks = next(r for r in result.rows if r.quantity == "kv_cache_blocks")
        assert blocks.engine == (1 << 30) // (4 * 128 * 2 * 4 * 32 * 2) == 4096


# name, KV bytes per token over all layers (hand-computed). The block size is the engine's own (vLLM picks it
# by backend: the CPU MLA backend forces 16, AMX_MLA on a host with AMX tiles keeps 128), so the expected
# blocks are 1 GiB // (block × bytes per token) at the block size the engine reports, not one machine's constant.
OTHER_ARCHITECTURES = [
    # Qwen2: 6 layers × 2 (K,V) × 2 KV heads × 64 × 2 B — tied embeddings, q/k/v bias, uneven block count
    ("tiny-qwen2", 6 * 2 * 2 * 64 * 2),
    # DeepSeek-V2 MLA: 3 layers × (kv_lora_rank 64 + rope 16) × 2 B, no factor 2
    ("tiny-deepseek-v2-mla", 3 * (64 + 16) * 2),
]


@pytest.mark.parametrize("name, bytes_per_token", OTHER_ARCHITECTURES, ids=[a[0] for a in OTHER_ARCHITECTURES])
def test_ledger_reconciles_other_architectures(vllm_python, workdir, name, bytes_per_token):
    """More architectures, exact: the ledger predicts vLLM's block size, block count and logged KV cache size."""
    import subprocess
    import sys

    import httpx

    from loadgen.driver import parse_prometheus_text
    from loadgen.ledger import read_model_config
    from loadgen.ledger.kv import cdiv, vllm_cpu_block_size
    from loadgen.vllm.log import parse_vllm_log

    model_dir = _model_dir(workdir, name)
    t0 = time.monotonic()
    server = _server(vllm_python, model_dir, workdir / f"{name}.log", max_num_seqs=8)
    _TIMES[f"{name}-startup"] = time.monotonic() - t0
    try:
        text = httpx.get(server.base_url + "/metrics", timeout=10).text
        info = next(labels for n, labels, _ in parse_prometheus_text(text) if n == "vllm:cache_config_info")
        log = server.log_path
    finally:
        server.stop()
    kept = ARTIFACTS / f"{name}-startup.log"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log, kept)
    block_size = int(info["block_size"])  # what the engine chose on this host
    model = read_model_config(model_dir / "config.json")
    notes = parse_vllm_log(kept.read_text(errors="replace"))
    assert_valid("vllm-log", notes)  # a real vLLM's startup log: keys and types as `loadgen schema vllm-log` says
    backend = notes.get("attention_backend")
    assert vllm_cpu_block_size(model.is_mla, backend=backend) == block_size  # the ledger's rule agrees
    blocks = (1 << 30) // (block_size * bytes_per_token)
    led = _ledger(model_dir, block_size=block_size)
    assert led.kv_cache_blocks == blocks == int(info["num_gpu_blocks"])
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "ledger",
            "--model",
            str(model_dir / "config.json"),
            "--reconcile",
            str(kept),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    data = json.loads(cli.stdout)
    assert cli.returncode == 0 and data["ok"], cli.stdout + cli.stderr
    assert_valid("reconciliation", data)  # the published schema, on a real vLLM's log
    row = next(r for r in data["rows"] if r["quantity"] == "kv_cache_size_tokens")
    per_request = cdiv(MAX_MODEL_LEN, block_size)
    assert row["engine"] == row["ledger"] == int(blocks / per_request * MAX_MODEL_LEN)


def test_setup_reuses_working_venv(vllm_python):
    """`loadgen vllm setup` on an existing working venv returns its python without reinstalling."""
    from loadgen.vllm import setup_venv

    messages: list[str] = []
    t0 = time.monotonic()
    py = setup_venv(vllm_python.parent.parent, cuda=False, log=messages.append)
    assert py == vllm_python.parent.parent / "bin" / "python" and messages == [f"vllm venv ok: {py}"]
    assert time.monotonic() - t0 < 120


def test_analyzer_summary(llama_runs):
    """Record what the analyzer says about both configurations (TTFT p99, output tok/s) as a CI artifact."""
    analysis = pytest.importorskip("loadgen.analysis")
    summary: dict[str, object] = {"times_s": {k: round(v, 1) for k, v in _TIMES.items()}, "runs": {}}
    for label, run_dir in llama_runs.items():
        a = analysis.analyze_run(run_dir)
        overall = a.overall
        ttft = overall.metrics.get("ttft_ms", {})
        entry = {
            "run_dir": str(run_dir.relative_to(ROOT)),
            "ttft_p99_ms": ttft.get("p99"),
            "ttft_p50_ms": ttft.get("p50"),
            "output_tok_s": overall.output_tok_s,
            "completed_rps": overall.completed_rps,
            "verdict": a.verdict,
            "rss_high_water_over_ledger": json.loads((run_dir / "manifest.json").read_text())["engine_notes"][
                "memory"
            ].get("rss_high_water_over_ledger"),
            "classes": {
                n: {"ttft_p99_ms": g.metrics.get("ttft_ms", {}).get("p99"), "n": g.n_scheduled}
                for n, g in a.classes.items()
            },
        }
        summary["runs"][label] = entry
        assert entry["ttft_p99_ms"] is not None and entry["output_tok_s"] and entry["output_tok_s"] > 0
    (ARTIFACTS / "summary.json").write_text(json.dumps(summary, indent=2, default=str))


def test_calibrate_then_validate_a_held_out_config(vllm_python, workdir):
    """measure → fit → predict → verify on the real engine: ``sim calibrate --vllm`` at --max-num-seqs 8, then
    ``sim validate --vllm`` at a configuration calibration never saw (--max-num-seqs 4, --max-num-batched-tokens
    512), client and engine pinned to separate cores where there are two. The fidelity table is kept as a CI
    artifact (``ci-artifacts/vllm/calibration/``); its figures are reported, not asserted (they are timings)."""
    import subprocess
    import sys

    from loadgen.sim import load_engine_config
    from loadgen.util.pinning import affinity
    from loadgen.vllm.warmup import warmup_line

    model = _model_dir(workdir, "tiny-llama-gqa")
    out = ARTIFACTS / "calibration"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cpus = sorted(affinity() or {0})
    pin = ["--client-cpus", str(cpus[0]), "--engine-cpus", ",".join(map(str, cpus[1:]))] if len(cpus) > 1 else []
    env = {**os.environ, "LOADGEN_VLLM_PYTHON": str(vllm_python), "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB)}
    common = ["--vllm", str(model), f"--vllm-arg=--max-model-len={MAX_MODEL_LEN}", "--json"]
    common += [f"--vllm-arg={flag}" for flag in EAGER]

    def loadgen(*args: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", *pin, "sim", *args, *common],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    toml = out / "tiny-llama-cpu.toml"
    fit = loadgen("calibrate", "--out", str(toml), "--vllm-arg=--max-num-seqs=8")
    cfg = load_engine_config(toml)
    # the scheduler limits come from the engine itself: vLLM-CPU's API-server default budget, the CPU block size
    assert cfg.scheduler.max_num_seqs == 8 and cfg.scheduler.max_num_batched_tokens == 2048
    assert cfg.kv.block_size == 128 and cfg.calibration["calibrated"]
    assert all(v >= 0 for v in fit["fit"]["terms"].values()) and fit["fit"]["observations"] >= 20
    if pin:
        assert cfg.calibration["pinning"]["engine_cpus"] and cfg.calibration["runs_flagged_shared_cpus"] == []
        # an engine on one CPU shares it with its API server: the request overhead takes time from the steps
        assert cfg.cost.request_overhead_on_engine_cpu == (len(cpus) == 2)
    # the runtime beyond the ledger's model memory is measured on the engine calibration launched, not assumed
    memory = cfg.calibration["memory"]
    assert memory["peak_basis"] == "RSS of the process tree" and memory["samples"] > 0
    assert memory["runtime_gib"] == fit["runtime_gib"] == cfg.measured_runtime_gib() > 0
    assert memory["peak_bytes"] == memory["runtime_bytes"] + sum(memory["model_memory_bytes"].values())
    # the same peak by kind: what the tree holds (anonymous + shared) and its mapped files; the kernel's own peaks
    assert 0 < memory["held_high_water_bytes"] <= memory["peak_bytes"] <= memory["hwm_sum_bytes"]
    assert memory["held_high_water_bytes"] + memory["file_backed_high_water_bytes"] >= memory["peak_bytes"]
    # every step size up to what one step holds was met once before anything was measured (on a host loaded enough
    # that two requests in a row take 2.4 s, the sweep stops there: where a first-time cost is under 1%)
    warmup = cfg.calibration["warmup"]
    assert "skipped" not in warmup and warmup["budget_tokens"] == MAX_MODEL_LEN - 1 and warmup["lengths"] > 64
    assert warmup["largest_tokens"] == MAX_MODEL_LEN - 1 or "stopped below" in warmup_line(warmup)
    result = loadgen(
        "validate",
        str(toml),
        "--out",
        str(out / "validate"),
        "--duration-s",
        "12",
        "--vllm-arg=--max-num-seqs=4",
        "--vllm-arg=--max-num-batched-tokens=512",
        "--anchor",
    )
    assert result["target_limits"]["max_num_seqs"] == 4 and result["target_limits"]["max_num_batched_tokens"] == 512
    assert result["rows"] and all(r["n_measured"] == r["n_simulated"] for r in result["rows"])
    assert (out / "validate" / "fidelity.html").is_file()
    assert "validated error" in load_engine_config(toml).calibration_label()
    assert result["shape_warmup"]["budget_tokens"] == 512 and "skipped" not in result["shape_warmup"]
    # the launch under test is anchored: two speed factors refitted on the calibration workload, both tables kept
    anchor = result["anchor"]
    assert 0.2 <= anchor["step_factor"] <= 5 and 0.2 <= anchor["prefill_factor"] <= 5 and anchor["observations"] > 0
    assert len(result["anchored"]["rows"]) == len(result["rows"]) and result["anchored"]["goal"]["figures"] > 0
    # held out: the ledger with the calibrated runtime predicts the validation engine's peak; reported, not asserted
    held_out = result["memory"]
    assert held_out["runtime_source"] == "calibration" and held_out["runtime_gib"] == memory["runtime_gib"]
    assert held_out["measured_peak_bytes"] > 0 and held_out["ledger_total_bytes"] > held_out["runtime_gib"] * (1 << 30)
    assert "peak memory" in load_engine_config(toml).calibration_label()  # fidelity.json keeps the figures


def test_practice_against_two_real_vllm_configurations(vllm_python: Path, tmp_path: Path) -> None:
    from loadgen.practice import PracticeOptions, run_practice

    # eager start-up: the default compiles each configuration for 1-2 minutes (see EAGER above)
    result = run_practice(
        tmp_path / "practice", PracticeOptions(engine="vllm", window_s=20.0, vllm_args=("--enforce-eager",))
    )
    comp = result.decision["comparison"]
    assert {c["label"] for c in comp["candidates"]} == {"vllm-small-batch", "vllm-large-batch"}
    for cand in comp["candidates"]:
        manifest = json.loads((Path(cand["path"]) / "manifest.json").read_text())
        assert manifest["target"]["kind"] == "vllm" and manifest["modelExecuted"] is True
        assert "--enforce-eager" in manifest["target"]["engine"]["config"]["args"]  # the extra flag was passed
    assert result.decision["decision"]["why"]
    assert set(result.decision["prediction"]) == {"vllm-small-batch", "vllm-large-batch"}
