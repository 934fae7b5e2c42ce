"""The workload sent is the workload asked for: prompts are sized with the target's own tokenizer by default,
a fallback says so, and a run whose server counted other prompt lengths than the trace says so beside its
verdict (issue 34). Against the live simulated engine (``loadgen sim serve``) over loopback, through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadgen.driver.jobs import AUTO_FALLBACK_TOKENIZER, ServerTokenizer, resolve_tokenizer

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "loadgen" / "traces" / "canonical-steady.parquet"
SCENARIO = REPO / "loadgen" / "scenarios" / "canonical.toml"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def _run(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    done = _cli(
        "run", str(TRACE), "--target", url, "--scenario", str(SCENARIO), "--out", str(out), "--deadline-s", "2", *extra
    )
    assert done.returncode == 0, done.stderr
    return done


def _ok_prompt_tokens(run: Path) -> tuple[list[int], list[int]]:
    rows = pq.read_table(run / "requests.parquet").to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok
    return [r["target_prompt_tokens"] for r in ok], [r["server_prompt_tokens"] for r in ok]


def test_prompts_are_sized_with_the_targets_tokenizer_by_default(sim_server, tmp_path):
    sim = sim_server("instant", "--tokenizer", "chars:2")  # counts 2 characters a token, unlike cl100k_base
    _run(sim.base_url, tmp_path / "auto")
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert manifest["driver"]["tokenizer"] == "auto: chars:2 (the target's)"
    target, server = _ok_prompt_tokens(tmp_path / "auto")
    assert server == target  # exact: the server counted what the trace asked for
    analysis = _cli("analyze", str(tmp_path / "auto"), "--json", str(tmp_path / "a.json"))
    assert analysis.returncode == 0, analysis.stderr
    assert json.loads((tmp_path / "a.json").read_text())["run"]["prompt_tokens_differ"] is None
    assert "workload:" not in analysis.stdout


@pytest.mark.slow  # ~8 s: two runs and their reports
def test_another_tokenizer_is_reported_beside_the_verdict(sim_server, tmp_path):
    sim = sim_server("instant", "--tokenizer", "chars:2")
    _run(sim.base_url, tmp_path / "cl100k", "--tokenizer", "cl100k_base")
    target, server = _ok_prompt_tokens(tmp_path / "cl100k")
    assert sum(server) > 1.5 * sum(target)  # cl100k_base tokens hold well over 2 characters each
    analysis = _cli(
        "analyze", str(tmp_path / "cl100k"), "--json", str(tmp_path / "a.json"), "--html", str(tmp_path / "a.html")
    )
    assert analysis.returncode == 0, analysis.stderr
    line = json.loads((tmp_path / "a.json").read_text())["run"]["prompt_tokens_differ"]
    assert line is not None and "another workload than the trace describes" in line and "cl100k_base" in line
    ratio = sum(server) / sum(target)
    assert f"counted {ratio:.2f}x the prompt tokens" in line
    verdict = analysis.stdout.split("╰")[0]  # the verdict panel, printed first
    assert "workload: the server counted" in verdict
    assert 'id="prompt-tokens"' in (tmp_path / "a.html").read_text()


def test_auto_falls_back_to_cl100k_base_with_a_warning_when_the_target_cannot_detokenize(sim_server):
    sim = sim_server("instant", "--tokenizer", "chars:2")  # /tokenize answers, /detokenize cannot (chars:N)
    tokenizer, name, warning = resolve_tokenizer("auto", sim.base_url, "loadgen-sim")
    assert name == AUTO_FALLBACK_TOKENIZER and tokenizer.name == AUTO_FALLBACK_TOKENIZER
    assert warning is not None and "no --tokenizer given" in warning and "/detokenize" in warning
    # a target whose /tokenize and /detokenize work is used as it is
    sim2 = sim_server("instant")
    server, name, warning = resolve_tokenizer("auto", sim2.base_url, "loadgen-sim")
    try:
        assert isinstance(server, ServerTokenizer) and name == "server" and warning is None
        assert server.decode(server.encode("Hello, world")) == "Hello, world"
    finally:
        server.close()
