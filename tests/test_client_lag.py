"""A run whose client fell behind its schedule is no evidence about its target: the comparison leaves its budgets
unjudged ("unmeasured"), and the practice measures such a candidate again, launched fresh, keeping every attempt.

The bound is set below any real send lag (1 ns) so that every run here counts as lagged, whatever the host does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.analysis import analyze_run
from loadgen.analysis.budgets import client_lag_line
from loadgen.plan import compare_candidates
from loadgen.practice import MEASURE_ATTEMPTS, PracticeOptions, format_practice, run_practice
from loadgen.rundir.manifest import read_manifest

TINY_MS = 1e-6


@pytest.fixture(scope="module")
def lagged_practice(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The practice against two live sim servers (two engines), 3 s of the burst trace, every run "lagged"."""
    from loadgen.targets.sim import launch_sim_server

    out = tmp_path_factory.mktemp("lag") / "practice"
    with launch_sim_server("interactive-small-batch") as a, launch_sim_server("throughput-large-batch") as b:
        result = run_practice(
            out, PracticeOptions(window_s=3.0, targets=(a.base_url, b.base_url), max_send_lag_ms=TINY_MS)
        )
    return {"result": result, "decision": json.loads((out / "decision.json").read_text()), "out": out}


@pytest.mark.slow
def test_a_lagged_candidate_is_measured_again_and_every_attempt_kept(lagged_practice: dict) -> None:
    decision, out = lagged_practice["decision"], lagged_practice["out"]
    discarded = decision["discarded_runs"]
    assert sorted(discarded) == ["candidate-a", "candidate-b"]
    for label, runs in discarded.items():
        # attempts 1 .. N-1 discarded, each a whole readable run with its send lag over the bound; the last stands
        assert [Path(r["run_dir"]).name for r in runs] == [label] + [
            f"{label}-attempt{k}" for k in range(2, MEASURE_ATTEMPTS)
        ]
        for run in runs:
            manifest = read_manifest(Path(run["run_dir"]))
            assert manifest.send_lag_ns and manifest.send_lag_ns["p99"] > 0
            assert manifest.practice == {"candidate": label}
            assert "the client fell behind its schedule" in run["why"]
        assert decision["candidates"][label] == str(out / f"{label}-attempt{MEASURE_ATTEMPTS}")


@pytest.mark.slow
def test_the_comparison_judges_no_budget_of_a_lagged_run(lagged_practice: dict) -> None:
    decision = lagged_practice["decision"]
    cands = decision["comparison"]["candidates"]
    assert [c["verdict"] for c in cands] == ["unmeasured", "unmeasured"]
    for c in cands:
        step = c["steps"][0]
        assert step["result"] == "unmeasured" and step["why"][0].startswith("the client fell behind its schedule")
        assert all(line.startswith("not judged: ") for line in step["why"][1:])
        assert c["rejected_at"] is None
    # neither chosen nor rejected on budgets: the decision says which to measure again, and why
    assert decision["decision"]["chosen"] is None and decision["decision"]["rejected"] == []
    assert [u["label"] for u in decision["decision"]["unmeasured"]] == ["candidate-a", "candidate-b"]
    text = format_practice(lagged_practice["result"])
    assert "unmeasured: candidate-a: the client fell behind its schedule" in text
    assert f"measured again: candidate-b: {decision['discarded_runs']['candidate-b'][0]['run_dir']} discarded" in text


@pytest.mark.slow
def test_the_same_runs_are_judged_under_the_default_bound(lagged_practice: dict) -> None:
    paths = list(lagged_practice["decision"]["candidates"].values())
    comp = compare_candidates(paths)
    lags = [c["context"]["measurement"]["send_lag_p99_ms"] for c in comp.candidates]
    # a loopback run of a few requests keeps its schedule well inside 50 ms unless the host stalls
    if all(lag is not None and lag <= 50.0 for lag in lags):
        assert all(c["verdict"] != "unmeasured" for c in comp.candidates)
        assert comp.decision.unmeasured == []


@pytest.mark.slow
def test_compare_cli_takes_the_bound(lagged_practice: dict) -> None:
    paths = list(lagged_practice["decision"]["candidates"].values())
    cmd = [sys.executable, "-m", "loadgen", "compare", *paths, "--json"]
    tiny = subprocess.run([*cmd, "--max-send-lag-ms", "0.000001"], capture_output=True, text=True, timeout=120)
    assert tiny.returncode == 4, tiny.stderr  # nothing chosen
    assert [c["verdict"] for c in json.loads(tiny.stdout)["candidates"]] == ["unmeasured", "unmeasured"]
    for bad in ("0", "-1", "nan", "inf", "x"):
        proc = subprocess.run([*cmd, "--max-send-lag-ms", bad], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "--max-send-lag-ms" in proc.stderr and "expected a finite number" in proc.stderr


def test_client_lag_line_bounds() -> None:
    assert client_lag_line(None) is None and client_lag_line(50.0) is None and client_lag_line(0.2) is None
    line = client_lag_line(50.5)
    assert line and "send-lag p99 50.5 ms > 50 ms" in line
    assert client_lag_line(2.0, bound_ms=1.0) and client_lag_line(2.0, bound_ms=2.0) is None
    assert "send-lag p99 0.020 ms > 0.001 ms" in (client_lag_line(0.02, bound_ms=0.001) or "")  # not "0.0 ms"


@pytest.mark.slow
def test_analyze_says_when_the_client_fell_behind(lagged_practice: dict, tmp_path: Path) -> None:
    run = Path(lagged_practice["decision"]["candidates"]["candidate-a"])
    kept = analyze_run(run).run
    assert kept["send_lag_p99_ms"] == read_manifest(run).send_lag_ns["p99"] / 1e6
    # the same real run, its recorded send-lag p99 rewritten to 80 ms (a host stall cannot be ordered on demand)
    copy = tmp_path / "lagged"
    shutil.copytree(run, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["send_lag_ns"]["p99"] = 80_000_000
    (copy / "manifest.json").write_text(json.dumps(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "analyze", str(copy), "--json", str(tmp_path / "a.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},  # one line on the console
    )
    assert proc.returncode == 0, proc.stderr
    assert "measurement: the client fell behind its schedule (send-lag p99 80.0 ms > 50 ms)" in proc.stdout
    assert json.loads((tmp_path / "a.json").read_text())["run"]["client_fell_behind"].startswith("the client fell")
