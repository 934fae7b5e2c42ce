"""``loadgen sim validate --measured``: the worksheet beside the three shared real-vLLM runs, end to end through
the CLI: the measured figures are the files' (recomputed here from requests.jsonl), the errors follow from the
figures, the published simulator's errors are read as theirs, and the worst error lands in the engine TOML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from shared_paths import shared_trace

from loadgen.calibration.llmservingsim import import_llmservingsim_run
from loadgen.calibration.offline import FIGURES, compare_run, published_errors, replay_table
from loadgen.rundir.io import load_run
from loadgen.sim.config import load_engine_config
from loadgen.trace.io import read_trace

RUNS = ["RTX4090/Llama-3.1-8B", "RTXPRO6000/Llama-3.1-8B", "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507"]
ENGINE = """# a hand-set engine for the test (not evidence)
name = "test-gpu"
model = "m"
[scheduler]
max_num_seqs = 8
max_num_batched_tokens = 512
max_model_len = 32768
[kv]
block_size = 16
num_kv_blocks = 20000
[cost]
fixed_ms = 12.0
per_prefill_token_ms = 0.10
per_decode_seq_ms = 0.05
per_kv_token_ms = 0.00003
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("runs")
    return [
        import_llmservingsim_run(shared_trace(f"llmservingsim/bench/examples/{run}"), base / run.replace("/", "_"))
        for run in RUNS
    ]


def _raw_figures(run: str, anchor: str) -> dict[str, float]:
    """The measured figures from requests.jsonl by hand: latencies from the engine's queued instant, or from the
    frontend's arrival mapped onto the engine clock by the smallest queued - arrival offset."""
    folder = shared_trace(f"llmservingsim/bench/examples/{run}/vllm")
    rows = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines() if line.strip()]
    offset = min(r["queued_ts"] - r["arrival_time"] for r in rows)
    start = [r["queued_ts"] if anchor == "queued" else r["arrival_time"] + offset for r in rows]
    ttft = np.array([r["first_token_ts"] - a for r, a in zip(rows, start, strict=True)]) * 1e3
    tpot = np.array([(r["last_token_ts"] - r["first_token_ts"]) / (r["output_toks"] - 1) for r in rows]) * 1e3
    queue = np.array([r["scheduled_ts"] - r["queued_ts"] for r in rows]) * 1e3
    span = max(r["last_token_ts"] for r in rows) - min(start)
    return {
        "ttft_mean": ttft.mean(),
        "ttft_p90": np.percentile(ttft, 90),
        "e2e_p50": np.percentile(
            np.array([r["last_token_ts"] - a for r, a in zip(rows, start, strict=True)]) * 1e3, 50
        ),
        "tpot_p50": np.percentile(tpot, 50),
        "queue_p99": np.percentile(queue, 99),
        "throughput_rps": len(rows) / span,
    }


def test_cli_end_to_end_on_the_shared_runs(tmp_path, runs):
    engine = tmp_path / "engine.toml"
    engine.write_text(ENGINE)
    cmd = [sys.executable, "-m", "loadgen", "sim", "validate", "--measured", *map(str, runs), "--engine", str(engine)]
    res = subprocess.run(
        [*cmd, "--json", str(tmp_path / "v.json"), "--html", str(tmp_path / "v.html")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    result = json.loads((tmp_path / "v.json").read_text())
    assert [r["name"] for r in result["runs"]] == [p.name for p in runs]
    assert result["anchor"]["name"] == "workload" and "arrivals: workload" in res.stdout
    for run, got in zip(RUNS, result["runs"], strict=True):
        rows = {r["figure"]: r for r in got["rows"]}
        assert list(rows) == list(FIGURES)
        for figure, value in _raw_figures(run, "workload").items():
            assert rows[figure]["measured"] == pytest.approx(value, rel=1e-6), (run, figure)
        for row in rows.values():
            if row["signed_pct"] is not None:
                assert row["signed_pct"] == pytest.approx((row["predicted"] - row["measured"]) / row["measured"] * 100)
        pcts = [r["abs_pct"] for r in rows.values() if r["abs_pct"] is not None]
        assert got["mape_pct"] == pytest.approx(np.mean(pcts))
        assert abs(got["worst"]["signed_pct"]) == pytest.approx(max(pcts))
        assert {"running", "waiting"} <= set(got["series"])
        # the run's own scheduler settings replace the engine TOML's
        assert got["settings"]["max_num_seqs"] in (128, 256) and got["settings"]["max_num_batched_tokens"] == 2048
    assert result["runs"][0]["settings"]["num_kv_blocks_used"] == 2588  # logged by vLLM (RTX 4090)
    assert result["runs"][0]["settings"]["reserve_full_isl"] is True  # scheduler_reserve_full_isl, logged too
    assert result["runs"][0]["published"]["ttft_mean"] == 0.6  # theirs, from validation/summary.txt
    assert "theirs" in res.stdout and "<img" in (tmp_path / "v.html").read_text()
    worst = result["worst"]
    recorded = load_engine_config(engine).calibration or {}
    assert recorded["validated_error"].startswith(f"worst {worst['figure']} {worst['signed_pct']:+.1f}% against")
    assert recorded["validated_error"].endswith("(sim validate --measured, workload arrivals)")
    assert set(recorded["measured_validations"]) == {p.name for p in runs}
    assert {v["anchor"] for v in recorded["measured_validations"].values()} == {"workload"}
    assert engine.read_text().startswith("# a hand-set engine")  # the comments kept
    assert "arrivals: workload" in (tmp_path / "v.html").read_text()


def test_the_queued_anchoring_is_an_explicit_option(tmp_path, runs):
    """``--arrivals queued``: both sides from the engine's queued instant (the measured figures by hand), the
    anchoring named in the output; its predictions differ from the workload anchoring's."""
    engine = _engine_file(tmp_path)
    cmd = [sys.executable, "-m", "loadgen", "sim", "validate", "--measured", str(runs[0]), "--engine", str(engine)]
    res = subprocess.run([*cmd, "--arrivals", "queued", "--no-record", "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["anchor"]["name"] == "queued"
    rows = {r["figure"]: r for r in result["runs"][0]["rows"]}
    for figure, value in _raw_figures(RUNS[0], "queued").items():
        assert rows[figure]["measured"] == pytest.approx(value, rel=1e-6), figure
    workload = {r["figure"]: r for r in compare_run(runs[0], load_engine_config(engine)).rows}
    assert workload["ttft_mean"]["measured"] > rows["ttft_mean"]["measured"]  # the frontend's delay is kept
    assert workload["ttft_mean"]["predicted"] != rows["ttft_mean"]["predicted"]
    bad = subprocess.run([*cmd, "--arrivals", "sometime"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_the_workload_anchoring_replays_the_workloads_own_arrivals(runs):
    """Under ``workload`` the worksheet replays the imported workload itself (arrival instants and block hashes
    as the file has them); under ``queued`` the measured engine-queued instants."""
    data = load_run(runs[2], chunks=False)
    cols = data.requests.to_pydict()
    table, meta, _ = replay_table(runs[2], data.manifest, cols, "workload")
    workload, _ = read_trace(runs[2] / "workload.parquet")
    assert table.column("scheduled_offset_ns").to_pylist() == workload.column("scheduled_offset_ns").to_pylist()
    assert table.column("prompt_block_hashes").to_pylist() == workload.column("prompt_block_hashes").to_pylist()
    queued, _, _ = replay_table(runs[2], data.manifest, cols, "queued")
    assert queued.column("scheduled_offset_ns").to_pylist() == sorted(max(0, v) for v in cols["server_queued_ns"])


def test_replay_is_deterministic(runs):
    config = load_engine_config(_engine_file(runs[1].parent))
    first, second = compare_run(runs[1], config), compare_run(runs[1], config)
    assert first.rows == second.rows
    # a faster engine predicts shorter latencies on the same arrivals
    fast = config.model_copy(update={"cost": config.cost.model_copy(update={"per_prefill_token_ms": 0.01})})
    quicker = {r["figure"]: r["predicted"] for r in compare_run(runs[1], fast).rows}
    assert quicker["ttft_mean"] < {r["figure"]: r["predicted"] for r in first.rows}["ttft_mean"]


def _engine_file(where: Path) -> Path:
    path = where / "engine-det.toml"
    path.write_text(ENGINE)
    return path


def test_published_errors_are_read_as_written(tmp_path):
    summary = shared_trace("llmservingsim/bench/examples/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/validation/summary.txt")
    theirs = published_errors(summary)
    assert theirs["ttft_p50"] == -21.8 and theirs["tpot_mean"] == -1.7 and theirs["e2e_p99"] == -1.8
    assert len(theirs) == 15
    assert published_errors(tmp_path / "absent.txt") == {}


def test_a_folder_holding_no_run_is_refused_in_one_line(tmp_path):
    engine = _engine_file(tmp_path)
    cmd = [sys.executable, "-m", "loadgen", "sim", "validate", "--measured", str(tmp_path), "--engine", str(engine)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


ENGINES = Path(__file__).resolve().parents[1] / "scenarios" / "engines"
SHIPPED = {
    "RTX4090_Llama-3.1-8B": "rtx4090-llama-3.1-8b-tp1",
    "RTXPRO6000_Llama-3.1-8B": "rtxpro6000-llama-3.1-8b-tp1",
    "RTXPRO6000_Qwen3-30B-A3B-Instruct-2507": "rtxpro6000-qwen3-30b-a3b-tp1-ep2",
}


@pytest.mark.parametrize("run_name", list(SHIPPED))
def test_shipped_profiled_engines_meet_the_10_percent_goal(runs, run_name):
    """The worksheet is deterministic: each shared run's figures on its shipped engine (the default workload
    anchoring), every one held to the issue's goal; on the two RTX PRO 6000 runs the worst of the figures the
    published simulator reports (TTFT, TPOT, E2E) also beats its worst (the RTX 4090 run does not: see
    docs/predict-a-gpu.md, "Where it still misses")."""
    engine = SHIPPED[run_name]
    run = next(p for p in runs if p.name == run_name)
    cmd = [sys.executable, "-m", "loadgen", "sim", "validate", "--measured", str(run), "--engine"]
    res = subprocess.run(
        [*cmd, str(ENGINES / f"{engine}.toml"), "--no-record", "--json"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["runs"][0]
    rows = got["rows"]
    misses = [
        (r["figure"], round(r["signed_pct"], 1))
        for r in rows
        if r["signed_pct"] is not None and abs(r["signed_pct"]) > 10
    ]
    assert misses == []
    if run_name.startswith("RTXPRO6000"):
        ours = max(abs(r["signed_pct"]) for r in rows if r["figure"] in got["published"])
        assert ours < max(abs(v) for v in got["published"].values())


def test_recording_the_error_keeps_the_engine_files_comments(tmp_path, runs):
    """A shipped profiled engine says where each setting came from in its comments: recording the validated
    error edits the file, never rewrites it (twice: the second run replaces the first run's block)."""
    shipped = ENGINES / "rtx4090-llama-3.1-8b-tp1.toml"
    engine = tmp_path / shipped.name
    engine.write_text(shipped.read_text())
    (tmp_path / "profiles").symlink_to(ENGINES / "profiles")  # the profile path is relative to the engine file
    cmd = [sys.executable, "-m", "loadgen", "sim", "validate", str(engine), "--measured", str(runs[0])]
    for _ in range(2):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
    text = engine.read_text()
    comments = [ln for ln in shipped.read_text().splitlines() if "#" in ln]
    assert all(ln in text.splitlines() for ln in comments if "validated_error" not in ln)
    assert text.count("[calibration.measured_validations.") == 1 and text.count("validated_error =") == 1
    cal = load_engine_config(engine).calibration or {}
    assert cal["validated_error"].endswith("(sim validate --measured, workload arrivals)")
    assert "RTX4090" in next(iter(cal["measured_validations"]))


def test_an_engine_that_does_not_model_the_run_is_flagged_and_not_recorded(tmp_path, runs):
    """The RTX 4090 engine against the RTX PRO 6000 run (the GPU from the run's cluster config), and the TP 2
    engine against a TP 1 run: each difference is printed and the engine TOML is left as it was."""
    for shipped, run, expected in (
        ("rtx4090-llama-3.1-8b-tp1.toml", runs[1], "GPU: engine profiled on RTX4090"),
        ("rtxpro6000-llama-3.1-8b-tp2.toml", runs[1], "tensor parallel: engine tp 2, run tp 1"),
        ("rtxpro6000-qwen3-30b-a3b-tp1.toml", runs[2], "expert parallel: engine ep 1, run ep 2"),
    ):
        engine = tmp_path / shipped
        engine.write_text((ENGINES / shipped).read_text())
        if not (tmp_path / "profiles").exists():
            (tmp_path / "profiles").symlink_to(ENGINES / "profiles")
        before = engine.read_text()
        res = subprocess.run(
            [sys.executable, "-m", "loadgen", "sim", "validate", str(engine), "--measured", str(run), "--json", "-"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        result = json.loads(res.stdout)
        assert any(expected in m for m in result["runs"][0]["mismatches"]), result["runs"][0]["mismatches"]
        assert result.get("recorded") is None and engine.read_text() == before


def test_the_matching_engines_claim_their_runs(runs):
    for shipped, run in (
        ("rtx4090-llama-3.1-8b-tp1.toml", runs[0]),
        ("rtxpro6000-llama-3.1-8b-tp1.toml", runs[1]),
        ("rtxpro6000-qwen3-30b-a3b-tp1-ep2.toml", runs[2]),
    ):
        assert compare_run(run, load_engine_config(ENGINES / shipped)).mismatches == []
