"""`loadgen sim calibrate`: the robust fit on its own, and the KEY check — calibrating against a live
`loadgen sim serve` whose cost terms are known recovers them (real HTTP, real runs through the driver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from result_schemas import assert_valid

from loadgen.calibration.calibrate import (
    TERMS,
    EngineLimits,
    Observations,
    calibration_phases,
    engine_limits,
    fit_cost_model,
    with_step_jitter,
)
from loadgen.calibration.validate import FidelityRow
from loadgen.sim import load_engine_config
from loadgen.sim.config import JITTER_PROBABILITIES
from loadgen.util.pinning import affinity, format_cpus

REPO = Path(__file__).resolve().parents[1]

#: The known engine: costs large enough that loopback HTTP and a loaded 2-core host add little to a step.
TRUTH = {"fixed_ms": 20.0, "per_prefill_token_ms": 0.08, "per_decode_seq_ms": 1.5, "per_kv_token_ms": 0.004}
#: Stated tolerance of the recovered terms (relative): timing on a shared host jitters by a few ms per step.
TOLERANCE = 0.2


def _truth_toml(tmp_path: Path) -> Path:
    path = tmp_path / "truth.toml"
    cost = "\n".join(f"{k} = {v}" for k, v in TRUTH.items())
    path.write_text(
        'name = "truth"\n[scheduler]\nmax_num_seqs = 16\nmax_num_batched_tokens = 512\nmax_model_len = 4096\n'
        "[kv]\nblock_size = 16\nnum_kv_blocks = 4096\nenable_prefix_caching = false\n"
        f"[cost]\n{cost}\nnoise_sigma = 0.02\n"
    )
    return path


def test_fit_recovers_terms_despite_outliers():
    """Synthetic observations with 10% gross outliers: the Huber fit still lands on the truth."""
    rng = np.random.default_rng(0)
    truth = np.array([20.0, 0.08, 1.5, 0.004, 6.0])
    rows = []
    for _ in range(300):
        if rng.random() < 0.4:
            p = int(rng.integers(16, 2048))
            rows.append(([-(-p // 512), p, 0, p * 2, 1], False))
        else:
            b = int(rng.integers(1, 32))
            rows.append(([1, 0, b, b * int(rng.integers(32, 2000)), 0], True))
    x = np.array([r[0] for r in rows], dtype=float)
    is_decode = np.array([r[1] for r in rows])
    y = x @ truth * np.exp(rng.normal(0, 0.02, len(x)))
    y[rng.random(len(y)) < 0.1] *= 3  # e.g. a client that lost the CPU for a while
    fit = fit_cost_model(x, y, is_decode)
    for name, want in zip(TERMS, truth, strict=True):
        assert fit.terms[name] == pytest.approx(want, rel=0.05), name
    assert fit.noise_sigma < 0.1


def test_step_jitter_is_the_spread_of_single_gaps():
    """Raw decode gaps = the truth + a known skewed jitter: its quantiles come back, and replace noise_sigma."""
    rng = np.random.default_rng(1)
    truth = np.array([8.0, 0.0, 1.5, 0.0, 0.0])
    b = rng.integers(1, 9, 4000)
    raw_x = np.column_stack([np.ones(4000), np.zeros(4000), b, b * 200.0, np.zeros(4000)])
    jitter = rng.gamma(1.5, 2.0, 4000) - 3.0  # mean 0, a right tail
    obs = Observations(raw_x[:400], raw_x[:400] @ truth, np.ones(400, dtype=bool), raw_x, raw_x @ truth + jitter)
    fit = with_step_jitter(fit_cost_model(obs.x, obs.y, obs.is_decode), obs)
    assert fit.step_jitter_ms == pytest.approx(np.quantile(jitter, JITTER_PROBABILITIES), abs=1e-3)
    assert fit.noise_sigma == 0
    few = Observations(obs.x, obs.y, obs.is_decode, raw_x[:50], obs.raw_y[:50])
    assert with_step_jitter(fit_cost_model(obs.x, obs.y, obs.is_decode), few).step_jitter_ms == []


def test_negative_term_is_fixed_at_zero():
    x = np.array([[1, 0, b, 0, 0] for b in range(1, 20)], dtype=float)
    x[:, 3] = np.arange(19)[::-1] * 100  # KV feature anti-correlated with time: would fit negative
    y = 10 + 2 * x[:, 2]
    fit = fit_cost_model(x, y, np.ones(len(y), dtype=bool))
    assert all(v >= 0 for v in fit.terms.values())


def test_workload_respects_engine_limits():
    limits = EngineLimits(8, 256, 1024, 16, 100)
    phases = calibration_phases(limits)
    for ph in phases:
        assert all(p + ph.output_tokens <= 1024 for p in ph.prompts)
        if ph.kind == "decode":
            assert len(ph.prompts) <= 8
            assert len(ph.prompts) == 1 or sum(ph.prompts) <= 256  # every prefill fits one step
    assert {ph.kind for ph in phases} == {"prefill", "decode"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=REPO)


@pytest.mark.slow
def test_calibrate_recovers_known_sim_engine(sim_server, tmp_path):
    """KEY: real HTTP to a live sim serve with known terms; the fitted TOML recovers them within TOLERANCE."""
    sim = sim_server(str(_truth_toml(tmp_path)))
    out = tmp_path / "fitted.toml"
    res = _cli("sim", "calibrate", "--target", sim.base_url, "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert_valid("calibration", report)  # `loadgen schema calibration`
    assert report["limits"]["identity"]["engine"] == "loadgen-sim" and report["engine_toml"] == str(out)
    terms = report["fit"]["terms"]
    for name, want in TRUTH.items():
        assert terms[name] == pytest.approx(want, rel=TOLERANCE), (name, terms)
    cfg = load_engine_config(out)  # the worksheet and sim serve load it
    assert cfg.scheduler.max_num_batched_tokens == 512 and cfg.scheduler.max_num_seqs == 16  # read from the engine
    assert cfg.calibration["calibrated"] and len(cfg.calibration["calibration_runs"]) >= 5
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of nothing
    assert empty not in cfg.calibration["calibration_runs"].values()
    assert "calibrated against loadgen-sim" in cfg.calibration_label()
    # the step jitter, measured from every single decode gap, replaces the log-normal noise
    jitter = cfg.cost.step_jitter_ms
    assert len(jitter) == len(JITTER_PROBABILITIES) and jitter == sorted(jitter) and cfg.cost.noise_sigma == 0
    assert jitter[0] < 0 < jitter[-1] and abs(jitter[4]) < 0.25 * TRUTH["fixed_ms"], jitter  # median gap: the fit
    # where the client ran is recorded; a URL target was not launched by loadgen: no shared-CPU flag
    assert cfg.calibration["pinning"] == {"client_cpus": format_cpus(affinity() or ())}
    assert cfg.calibration["runs_flagged_shared_cpus"] == []
    # --from refits the same runs to the same terms, without the engine
    runs = sorted(str(p) for p in (tmp_path / "fitted.calibration-runs").iterdir() if p.is_dir())
    again = _cli("sim", "calibrate", "--from", *runs, "--out", str(tmp_path / "refit.toml"), "--json")
    assert again.returncode == 0, again.stderr
    refit = json.loads(again.stdout)
    assert_valid("calibration", refit)  # the limits as the runs recorded them
    assert refit["fit"]["terms"] == pytest.approx(terms)


def test_request_overhead_is_on_the_engine_cpu_only_for_an_engine_on_one_cpu():
    from loadgen.calibration.calibrate import one_engine_cpu

    assert one_engine_cpu({"pinning": {"client_cpus": "0", "engine_cpus": "1"}})
    assert not one_engine_cpu({"pinning": {"client_cpus": "0", "engine_cpus": "1-3"}})
    assert not one_engine_cpu({"pinning": {"engine_cpus": "1;2"}})  # runs that disagree: not known
    assert not one_engine_cpu({"pinning": {"client_cpus": "0"}}) and not one_engine_cpu({})  # a URL: not known


def test_calibrate_bad_input_is_one_line(tmp_path):
    res = _cli("sim", "calibrate", "--from", str(tmp_path), "--out", str(tmp_path / "x.toml"))
    assert res.returncode == 2 and res.stderr.startswith("loadgen: error:") and res.stderr.count("\n") == 1
    assert "uncalibrated preset" in load_engine_config("interactive-small-batch").calibration_label()


def test_engine_limits_keep_the_targets_query_and_refuse_a_server_that_is_no_engine(sim_server, tmp_path):
    """The limits are read through the target's root with its query string sent (base_url + "/version" put the
    path after the query); a server that is no engine is one line naming the URL redacted, not a JSONDecodeError
    traceback."""
    sim = sim_server("interactive-small-batch")
    limits = engine_limits(sim.base_url + "/v1?api_key=QUERYSECRET123")
    preset = load_engine_config("interactive-small-batch")
    assert (limits.max_num_seqs, limits.max_model_len) == (
        preset.scheduler.max_num_seqs,
        preset.scheduler.max_model_len,
    )
    assert "QUERYSECRET123" not in json.dumps(limits.to_dict())
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # the port line arrives before the server waits
    )
    try:
        port = int(web.stdout.readline().split(" port ")[1].split()[0])
        res = _cli("sim", "calibrate", "--target", f"http://u:PW123456@127.0.0.1:{port}", "--out", str(tmp_path / "x"))
    finally:
        web.terminate()
        web.wait(timeout=30)
    assert res.returncode == 2 and "/v1/models: HTTP 404, not a JSON object" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "PW123456" not in res.stderr and not (tmp_path / "x").exists()


#: A plan around the known engine's capacity for 16-token requests (~20 req/s at 16 sequences): 2 and 8 req/s
#: inside, 32 beyond capacity, so the boundary is set by capacity, not by a few ms of timing noise on a loaded
#: host. A p50 budget alone is conclusive after a few requests, so each cell is one short run.
PLAN_SCENARIO = """name = "boundary-check"
seed = 3
endpoint = "completions"
[classes.short-message]
share = 1.0
input_tokens = { dist = "fixed", value = 64 }
output_tokens = { dist = "fixed", value = 16 }
[classes.short-message.budgets]
ttft_ms = { p50 = 250, hard = true }
[errors]
ttft_timeout_s = 60
total_timeout_s = 120
error_rate_limit = 0.25  # conclusive (Wilson interval) after ~15 error-free requests, not ~380 as at 1%
[traces.steady]
process = "poisson"
rate_rps = 4
duration_s = 10
"""
PLAN = """name = "boundary-check"
scenario = "scenario.toml"
trace = "steady"
duration_s = 6
classes = ["short-message"]
states = ["warm"]
concurrency = [32]
rates_rps = [2, 8, 32]
repeats = 1
[stops]
contract_every_cell = false
"""


@pytest.mark.slow
def test_validate_against_live_sim_serve(sim_server, tmp_path):
    """Held-out check on a live sim serve of the same TOML: the worksheet is near-exact where the engine sets
    the timing (ITL, E2E, throughput, attainment); fidelity table in console, JSON and HTML; the validated
    error is written back into the TOML's [calibration]. ``--plan``: the same plan on the live engine and on
    the worksheet puts the capacity boundary on the same rate step (same engine, capacity-set boundary)."""

    truth = _truth_toml(tmp_path)
    sim = sim_server(str(truth))
    engine = tmp_path / "calibrated.toml"
    engine.write_text(
        truth.read_text()
        + '[calibration]\ncalibrated = true\nengine = "loadgen-sim (known terms)"\nhardware = "test"\n'
    )
    out = tmp_path / "val"
    azure = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    (tmp_path / "scenario.toml").write_text(PLAN_SCENARIO)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    args = ["sim", "validate", str(engine), "--target", sim.base_url, "--out", str(out), "--duration-s", "10"]
    args += ["--plan", str(plan), "--repeats", "2", "--anchor"]
    if azure.is_file():
        args += ["--public", f"azure:{azure}", "--load", "0.6"]
    res = _cli(*args)
    assert res.returncode == 0, res.stderr
    assert "error % = (worksheet − measured) / measured" in res.stdout and "canonical-burst" in res.stdout
    data = json.loads((out / "fidelity.json").read_text())
    assert_valid("fidelity", data)  # with repeats, an anchor and a plan boundary: every section typed
    anchored = data["anchored"]  # a calibrated TOML: the launch is anchored, and the worksheet compared both ways
    assert (out / "fidelity.html").read_text().count("<tr>") == len(data["rows"]) + 1 + len(anchored["rows"]) + 1
    # the same engine as the TOML: its speed factors are 1, within the calibration's own tolerance
    assert data["anchor"]["step_factor"] == pytest.approx(1.0, rel=TOLERANCE), data["anchor"]
    assert data["anchor"]["prefill_factor"] == pytest.approx(1.0, rel=TOLERANCE), data["anchor"]
    assert [(r["trace"], r["request_class"]) for r in anchored["rows"]] == [
        (r["trace"], r["request_class"]) for r in data["rows"]
    ]
    assert "anchor: this launch ran the calibration workload" in res.stdout
    traces = {r["trace"] for r in data["rows"]}
    assert "canonical-burst" in traces and (not azure.is_file() or "azure-load0.6" in traces)
    for row in data["rows"]:
        assert set(row["errors_pct"]) >= {"ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99"}
        if row["n_measured"] >= 20:
            assert abs(row["errors_pct"]["itl_p50"]) < 15, row
            assert abs(row["errors_pct"]["e2e_p50"]) < 15, row
        if row["attainment_diff_points"] is not None:
            assert abs(row["attainment_diff_points"]) <= 5, row
    # --repeats 2: every trace measured twice; the second against the first, per class, by the same rule
    assert sorted({r["trace"] for r in data["repeatability"]}) == sorted(f"{t} repeat 2" for t in traces)
    assert {r["request_class"] for r in data["repeatability"]} == {r["request_class"] for r in data["rows"]}
    assert "repeatability (measured again vs first, same engine, same trace)" in res.stdout
    # each measurement has prompts of its own (no repeat finds the first's in the prefix cache), same token counts
    first, again = (
        pq.read_table(out / d / "requests.parquet") for d in ("canonical-burst-measured", "canonical-burst-measured-2")
    )
    assert not set(first["prompt_sha256"].to_pylist()) & set(again["prompt_sha256"].to_pylist())
    assert sorted(first["target_prompt_tokens"].to_pylist()) == sorted(again["target_prompt_tokens"].to_pylist())
    measured = [Path(d) for k, d in data["runs"]["canonical-burst"].items() if k.startswith("measured")]
    salts = {json.loads((d / "manifest.json").read_text())["driver"]["prompt_salt"] for d in measured}
    assert len(measured) == len(salts) == 2 and None not in salts, salts
    # the warm-up: the first trace once, before any measurement, with prompts of its own, not compared
    warm = Path(data["warmup"])
    assert warm.name == "warmup" and (warm / "requests.parquet").exists() and "warm-up: the first trace" in res.stdout
    assert json.loads((warm / "manifest.json").read_text())["driver"]["prompt_salt"] not in salts
    boundary = data["plan_boundary"]
    assert [(r["request_class"], r["state"], r["concurrency"]) for r in boundary["lines"]] == [
        ("short-message", "warm", 32)
    ]
    line = boundary["lines"][0]
    assert line["measured_index"] == line["predicted_index"] == 1, line  # 8 req/s inside, 32 beyond capacity
    assert boundary["all_within"] and boundary["max_steps_apart"] == 0
    assert (out / "plan-measured" / "region.json").is_file() and (out / "plan-worksheet" / "region.json").is_file()
    assert "plan boundary (plan.toml)" in res.stdout and "within 1 rate step on every line" in res.stdout
    cfg = load_engine_config(engine)
    assert cfg.calibration["validated_error"].startswith("worst |error|")
    assert "plan boundary 0 rate step(s)" in cfg.calibration["validated_error"]
    assert "engine repeatability" in cfg.calibration["validated_error"]
    assert "anchored to each launch 10%/2 pts:" in cfg.calibration["validated_error"]
    assert "validated error worst |error|" in cfg.calibration_label()
    goal = data["goal"]  # every goal figure of every row sorted one way: within, within the engine's spread, missed
    kept = [r for r in data["rows"] if not r["client_lagged"]]
    named = sum(
        sum(r["errors_pct"].get(q) is not None for q in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"))
        + (r["attainment_diff_points"] is not None)
        for r in kept
    )
    assert goal["figures"] == named == goal["within"] + goal["within_engine_spread"] + len(goal["missed"]) > 0
    assert "figures within it" in res.stdout and " missed" in cfg.calibration["validated_error"]


def _row(trace: str, cls: str, lagged: bool = False, attain: float | None = None, **errors: float) -> FidelityRow:
    return FidelityRow(
        trace=trace,
        request_class=cls,
        n_measured=50,
        n_simulated=50,
        errors_pct=errors,
        attainment_diff_points=attain,
        client_lagged=lagged,
    )


def test_goal_check_sorts_each_figure_against_the_goal_and_the_engines_own_spread():
    """Within the goal; beyond it but within the engine's own repeat difference (the largest over repeats, same
    trace and class and figure); or missed. Rows the client lagged on count nowhere, nor do their repeats."""
    from loadgen.calibration.validate import goal_check, goal_line

    rows = [
        _row("burst", "a", ttft_p50=9.9, ttft_p99=-25.0, itl_p50=40.0, attain=2.0),
        _row("burst", "b", itl_p99=-30.0, attain=-5.0),
        _row("azure-load0.9", "a", ttft_p50=50.0),
        _row("azure-load1.3", "a", lagged=True, ttft_p50=99.0),
    ]
    floor = [
        _row("burst repeat 2", "a", ttft_p99=10.0, itl_p50=41.0),
        _row("burst repeat 3", "a", ttft_p99=-26.0),  # the larger of the two repeats counts
        _row("burst repeat 2", "b", itl_p99=5.0, attain=6.0),
        _row("azure-load0.9 repeat 2", "a", lagged=True, ttft_p50=80.0),  # lagged: no spread from it
    ]
    g = goal_check(rows, floor)
    assert (g["figures"], g["within"], g["within_engine_spread"]) == (7, 2, 3)
    assert g["missed"] == [["burst", "b", "itl_p99", -30.0, 5.0], ["azure-load0.9", "a", "ttft_p50", 50.0, None]]
    line = goal_line(g)
    assert line.startswith("goal (TTFT and ITL p50/p99 within 10%, attainment within 2 pts): 2 of 7 figures within it")
    assert line.endswith("(furthest: azure-load0.9 a ttft_p50 +50.0%, no repeat)"), line


def test_worksheet_output_states_calibration(tmp_path):
    """`loadgen sim run` (and the run's manifest) say whether the engine is calibrated."""
    out = tmp_path / "run"
    trace = REPO / "loadgen" / "traces" / "canonical-burst.parquet"
    res = _cli("sim", "run", str(trace), "--engine", "interactive-small-batch", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "uncalibrated preset" in res.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert "uncalibrated preset" in manifest["engine_config"]["calibration_label"]


def _validation(seqs: int, ttft_p50: float, repeat: float | None = None, memory: float | None = None) -> dict:
    summary = {"rows": 3, "rows_flagged_send_lag": 0, "max_abs_ttft_p50_error_pct": ttft_p50}
    summary |= {"max_abs_itl_p50_error_pct": 4.0, "max_abs_attainment_diff_points": 1.0}
    return {
        "target_limits": {"max_num_seqs": seqs, "max_num_batched_tokens": 512, "max_model_len": 4096},
        "summary": summary,
        "memory": {"error_pct": memory} if memory is not None else None,
        "repeatability_summary": {"max_abs_ttft_p50_error_pct": repeat} if repeat is not None else None,
        "plan_boundary": None,
    }


def test_validations_of_several_held_out_configurations_are_kept_and_the_worst_is_stated(tmp_path):
    """Each held-out configuration keeps its own record; the engine's label states the worst over all of them,
    and validating a configuration again replaces only its own record."""
    from loadgen.calibration.validate import _record_validation

    engine = tmp_path / "cal.toml"
    engine.write_text(_truth_toml(tmp_path).read_text() + '[calibration]\ncalibrated = true\nengine = "x"\n')
    _record_validation(engine, _validation(4, ttft_p50=30.0, repeat=50.0, memory=-1.5), tmp_path / "a")
    _record_validation(engine, _validation(2, ttft_p50=-8.0), tmp_path / "b")
    cal = load_engine_config(engine).calibration
    assert sorted(cal["validations"]) == ["seqs2-tokens512-len4096", "seqs4-tokens512-len4096"]
    said = cal["validated_error"]
    assert "ttft_p50 30.0%" in said and "engine repeatability 50.0%" in said and "peak memory 1.5%" in said, said
    assert said.endswith(
        "over 6 class rows on 2 held-out configurations (seqs4-tokens512-len4096, seqs2-tokens512-len4096)"
    )
    _record_validation(engine, _validation(4, ttft_p50=5.0), tmp_path / "c")  # seqs 4 again: replaces its record
    said = load_engine_config(engine).calibration["validated_error"]
    assert "ttft_p50 8.0%" in said and "repeatability" not in said and "2 held-out configurations" in said, said
    assert said in load_engine_config(engine).calibration_label()
