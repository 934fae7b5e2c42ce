"""Plans and the practice against a vLLM server that loadgen launches and restarts (cold cells).

Without a real vLLM here, a stand-in ``vllm.entrypoints.openai.api_server`` module execs the simulated
engine's live server on the port vLLM was given (``--max-num-seqs`` ≤ 16 → the interactive preset, else the
throughput preset), so the launcher, health wait, restarts, log capture and driver all run for real.
The real-vLLM variant runs only under the ``vllm`` marker with LOADGEN_VLLM_PYTHON set.
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from pathlib import Path

import pytest

from loadgen.plan import load_plan, run_plan
from loadgen.targets import VllmTarget

REPO = Path(__file__).resolve().parents[1]

STANDIN = """
import os, sys
argv = sys.argv
port = argv[argv.index("--port") + 1]
seqs = int(argv[argv.index("--max-num-seqs") + 1]) if "--max-num-seqs" in argv else 8
engine = os.environ.get("STANDIN_ENGINE") or ("interactive-small-batch" if seqs <= 16 else "throughput-large-batch")
served = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else "loadgen-sim"
from loadgen.sim.config import PRESETS_DIR
text = (PRESETS_DIR / f"{engine}.toml").read_text().replace('model = "loadgen-sim"', f'model = "{served}"', 1)
path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"standin-{engine}-{port}.toml")
open(path, "w").write(text)
print(f"INFO standin vLLM: serving {engine} as {served} on port {port}", flush=True)
bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
print(f"INFO standin cpus {sorted(os.sched_getaffinity(0))} bind {bind}", flush=True)
os.execv(sys.executable, [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", path,
                          "--host", "127.0.0.1", "--port", port])
"""


@pytest.fixture()
def standin_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "site" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(textwrap.dedent(STANDIN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "site"), str(REPO)]))
    monkeypatch.setenv("LOADGEN_VLLM_PYTHON", sys.executable)
    return tmp_path


PLAN = """
name = "vllm-cold"
scenario = "{scenario}"
trace = "steady"
duration_s = 2
classes = ["short-message"]
states = ["warm", "cold"]
concurrency = [64]
rates_rps = [4]
repeats = 2
[start]
mode = "lowest"
[warmup]
requests = 2
rate_rps = 20
[stops]
contract_every_cell = false
send_lag_p99_ms = 60000  # about cold restarts, not the client: a busy host's lag must not stop the cell
[confidence]
extend = false  # this test is about cold restarts: one run per repeat
"""


@pytest.mark.slow
def test_plan_restarts_a_launched_vllm_for_cold_cells(standin_vllm: Path) -> None:
    from loadgen.vllm import VllmConfig

    tmp = standin_vllm
    plan = tmp / "plan.toml"
    plan.write_text(PLAN.format(scenario=REPO / "scenarios" / "canonical.toml"))
    config = VllmConfig(model_dir=tmp, served_model_name="loadgen-sim", max_num_seqs=8)
    with VllmTarget(config, tmp / "out" / "vllm-logs", model="loadgen-sim", tokenizer="cl100k_base") as target:
        result = run_plan(load_plan(plan), target, tmp / "out")
        starts = target.starts
    region = result.region["classes"]["short-message"]
    cold = region["cold"]["cells"][0]
    assert cold["repeats"] == 2 and cold["status"] in ("inside", "outside", "inconclusive")
    assert "vLLM restarted" in cold["warm_state"][0]["actions"][0]
    warm_actions = [a for state in region["warm"]["cells"][0]["warm_state"] for a in state["actions"]]
    # the step sizes are swept once per server process, before the warm-up set (the stand-in is the simulated
    # engine, which has no per-shape cost, so the sweep says why it sent nothing)
    assert warm_actions[0] == "step-size warm-up: none (the simulated engine has no per-shape cost)"
    assert sum(a.startswith("step-size warm-up") for a in warm_actions) == 1
    assert starts == 1 + 2  # the launch, then one restart per cold run
    manifest = json.loads((tmp / "out" / cold["run_dirs"][0] / "manifest.json").read_text())
    assert manifest["target"]["kind"] == "vllm" and manifest["warm_state"]["state"] == "cold"
    assert (tmp / "out" / cold["run_dirs"][0] / "vllm.log").is_file()
    assert manifest["plan_target"]["server_starts"] >= 2


@pytest.mark.slow
def test_practice_vllm_path_with_the_standin(standin_vllm: Path) -> None:
    from loadgen.practice import PracticeOptions, format_practice, run_practice

    result = run_practice(standin_vllm / "practice", PracticeOptions(engine="vllm", window_s=20.0))
    comp = result.decision["comparison"]
    by = {c["label"]: c for c in comp["candidates"]}
    assert set(by) == {"vllm-small-batch", "vllm-large-batch"}
    assert by["vllm-large-batch"]["rejected_at"] == "hard budgets"
    assert any(b["metric"] == "ttft_ms" and b["percentile"] == "p99" for b in by["vllm-large-batch"]["breaches"])
    assert "KV bytes/token" in result.ledgers["vllm-small-batch"]
    for cand in comp["candidates"]:
        assert json.loads((Path(cand["path"]) / "manifest.json").read_text())["target"]["kind"] == "vllm"
    # each candidate predicted by the default preset under the limits its live engine reported, beside the measurement
    prediction = json.loads((result.out_dir / "decision.json").read_text())["prediction"]
    assert set(prediction) == {"vllm-small-batch", "vllm-large-batch"}
    for label, entry in prediction.items():
        assert entry["engine"] == "interactive-small-batch" and entry["calibrated"] is False, entry
        assert entry["limits"]["identity"]["engine"] == "loadgen-sim"  # the stand-in's own /version
        assert set(entry["classes"]) == set(result.decision["workload"]["requests_per_class"]), label
        for cls in entry["classes"].values():
            for key in ("ttft_p50", "ttft_p99", "itl_p50", "e2e_p99", "completed_rps"):
                assert math.isfinite(cls["error_pct"][key]), (label, key, cls)
                assert cls["predicted"][key] > 0 and cls["measured"][key] > 0, (label, key, cls)
            assert math.isfinite(cls["attainment_diff_points"])
            assert 0 <= cls["predicted"]["attainment"] <= 1 and 0 <= cls["measured"]["attainment"] <= 1
    assert (
        prediction["vllm-large-batch"]["limits"]["max_num_seqs"]
        > prediction["vllm-small-batch"]["limits"]["max_num_seqs"]
    )
    text = format_practice(result)
    assert "PREDICTED vs MEASURED: engine interactive-small-batch: uncalibrated preset" in text
    section = text.split("PREDICTED vs MEASURED")[1]
    assert "vllm-small-batch: max_num_seqs" in section and "vllm-large-batch: max_num_seqs" in section
