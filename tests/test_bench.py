"""The main job's building block: `loadgen bench` launches the simulated engine, replays, analyses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loadgen.rundir.io import load_run

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_cli_on_the_embedded_simulator(tmp_path):
    text = (REPO / "scenarios" / "canonical.toml").read_text()
    short = text.replace("rate_rps = 4.0\nduration_s = 60", "rate_rps = 6.0\nduration_s = 4", 1)
    assert short != text
    scenario = tmp_path / "short.toml"
    scenario.write_text(short)
    out = tmp_path / "bench"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "bench",
            "--scenario",
            str(scenario),
            "--out",
            str(out),
            "--html",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "short-message" in res.stdout and "ttft" in res.stdout
    run = load_run(out / "run")
    counts = run.manifest.to_dict()["status_counts"]
    assert sum(counts.values()) == run.requests.num_rows > 0
    assert run.manifest.to_dict()["target"]["kind"] == "sim" and run.manifest.to_dict()["modelExecuted"] is False
    assert run.manifest.to_dict()["scenario"]["sha256"]
    assert (tmp_path / "r.html").stat().st_size > 10_000
    # the simulator was stopped: no server process left listening on the recorded URL
    with pytest.raises(httpx.TransportError):
        httpx.get(run.manifest.to_dict()["target"]["base_url"] + "/health", timeout=2)
