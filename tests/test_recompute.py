"""The outside recompute (benchmarks/recompute_run.py, DuckDB/numpy/scipy over the Parquet only) agrees with
``loadgen analyze --json`` on a live run of the newer workload kinds, and the determinism checks hold.

One run through the real CLI on ``loadgen sim serve``: user-named classes, planned cancellations, injected 5xx
errors, a non-streamed class, 2-token chunks, simulated reasoning, agent sessions with fan-out and tool calls,
budgets of every kind (TTFT, TTFAT, ITL, E2E, makespan). Every figure must match bit for bit, except the Wilson
bounds (loadgen's z is the stdlib's, a few ulp from the recompute's) and a mean summed in another order.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_process import REPO, run_loadgen

pytest.importorskip("scipy", reason="the outside recompute needs scipy (in the test extra: pip install -e '.[test]')")

SCENARIO = """\
name = "recompute"
seed = 11
endpoint = "chat"

[classes.chat]
share = 0.35
input_tokens = { dist = "uniform", low = 20, high = 300 }
output_tokens = { dist = "uniform", low = 1, high = 40 }
cancel = { share = 0.15, after_tokens = { dist = "fixed", value = 3 } }
[classes.chat.budgets]
ttft_ms = { p50 = 200, p99 = 800 }
itl_ms = { p99 = 60 }
e2e_ms = { p95 = 3000, hard = false }

[classes.think]
share = 0.25
input_tokens = { dist = "fixed", value = 200 }
output_tokens = { dist = "lognormal", mean = 30, sigma = 0.5, min = 1, max = 100 }
reasoning_tokens = { dist = "uniform", low = 10, high = 120 }
[classes.think.budgets]
ttft_ms = { p99 = 1000 }
ttfat_ms = { p95 = 3000 }
itl_ms = { p50 = 30 }

[classes.batch-sum]
share = 0.1
stream = false
input_tokens = { dist = "fixed", value = 400 }
output_tokens = { dist = "fixed", value = 30 }
[classes.batch-sum.budgets]
e2e_ms = { p99 = 5000 }

[classes.agent]
share = 0.3
input_tokens = { dist = "lognormal", mean = 200, sigma = 0.5 }
output_tokens = { dist = "lognormal", mean = 20, sigma = 0.5, min = 1 }
[classes.agent.budgets]
ttft_ms = { p95 = 1500 }
makespan_ms = { p99 = 20000 }
[classes.agent.thread]
turns = { dist = "uniform", low = 2, high = 4 }
think_time_s = { dist = "fixed", value = 0.05 }
wait_for_reply = true
[classes.agent.thread.fanout]
share = 0.4
width = { dist = "fixed", value = 2 }
turns = { dist = "fixed", value = 2 }
[classes.agent.thread.tool_calls]
share = 0.7
tokens = { dist = "uniform", low = 5, high = 20 }

[traces.steady]
process = "poisson"
rate_rps = 15
duration_s = 5
"""


def _engine(tmp: Path) -> Path:
    """interactive-small-batch with 2 tokens a decode step, coalesced events and 3% injected 5xx."""
    text = (REPO / "scenarios/engines/interactive-small-batch.toml").read_text()
    for old, new in (
        ("coalesce = false", "coalesce = true"),
        ("decode_tokens_per_step = 1 ", "decode_tokens_per_step = 2 "),
        ("error_rate = 0.0", "error_rate = 0.03"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    (tmp / "engine.toml").write_text(text)
    return tmp / "engine.toml"


def _ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def _script(name: str, *args: object) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "benchmarks" / name), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow  # ~20 s: a live run, two analyses and the recompute
def test_the_outside_recompute_matches_analyze_on_a_live_run(tmp_path: Path, sim_server) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(SCENARIO)
    traces = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for trace in traces:  # one seed, two processes
        _ok(run_loadgen(["trace", "generate", scenario, "--trace", "steady", "--out", trace], tmp_path))
    sim = sim_server(str(_engine(tmp_path)), "--seed", "3")
    run = tmp_path / "run"
    _ok(run_loadgen(["run", traces[0], "--target", sim.base_url, "--out", run, "--scenario", scenario], tmp_path))
    jsons = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in jsons:
        _ok(run_loadgen(["analyze", run, "--json", out, "--quiet"], tmp_path))

    res = _script("recompute_run.py", run, jsons[0])
    assert res.returncode in (0, 1), res.stderr[-2000:]
    matched = int(re.search(r"(\d+) figures match bit for bit", res.stdout).group(1))  # type: ignore[union-attr]
    assert matched > 500
    for line in res.stdout.splitlines():
        if line.startswith("MISMATCH"):
            # only last-bit differences of the Wilson bounds or of a mean summed in another order
            assert re.search(r"(_ci\[[01]\]|\.mean): .* \(\d ulp\)$", line), line

    det = _script(
        "recompute_determinism.py",
        *("--trace-a", traces[0], "--trace-b", traces[1], "--trace", traces[0], "--run-a", run),
        *("--json-a", jsons[0], "--json-b", jsons[1]),
    )
    assert det.returncode == 0, det.stdout + det.stderr[-2000:]
    assert "ok traces byte-identical" in det.stdout and "ok analysis JSON byte-identical" in det.stdout
    assert re.search(r"ok run: (\d+) of \1 waiting requests", det.stdout), det.stdout
