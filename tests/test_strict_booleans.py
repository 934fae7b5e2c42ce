"""Every boolean of a user's TOML (scenario, engine config and its [behavior], plan, prices) takes a TOML boolean
only: pydantic's lax mode once read "yes", "off", "no" or 1 as one, so `stream = "no"` streamed. Each is now one
line naming the file and the field, exit 2, and nothing written (InputModel, loadgen.util.limits)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CANONICAL = (REPO / "scenarios" / "canonical.toml").read_text()
INSTANT = (REPO / "scenarios" / "engines" / "instant.toml").read_text()
QUICK = (REPO / "scenarios" / "plans" / "quick.toml").read_text()
PRICES = (REPO / "scenarios" / "prices.toml").read_text()
STEADY = REPO / "loadgen" / "traces" / "canonical-steady.parquet"


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *map(str, args)], capture_output=True, text=True)


def _edit(text: str, pattern: str, new: str) -> str:
    edited = re.sub(pattern, new, text, count=1, flags=re.M)
    assert edited != text, pattern
    return edited


CASES = {
    "scenario-stream": ("s.toml", CANONICAL, r"^stream = true", 'stream = "no"', "classes.short-message.stream = 'no'"),
    "scenario-stream-int": ("s.toml", CANONICAL, r"^stream = true", "stream = 0", "classes.short-message.stream = 0"),
    "scenario-hard": ("s.toml", CANONICAL, r"hard = true", 'hard = "yes"', ".budgets.ttft_ms.hard = 'yes'"),
    "scenario-privacy": (
        "s.toml",
        CANONICAL,
        r"^retain_prompt_text = false",
        'retain_prompt_text = "no"',
        "privacy.retain_prompt_text = 'no'",
    ),
    "engine-kv": ("e.toml", INSTANT, r"^enable_prefix_caching = false", 'enable_prefix_caching = "yes"', "kv."),
    "engine-scheduler": ("e.toml", INSTANT, r"^chunked_prefill = true", 'chunked_prefill = "off"', "scheduler."),
    "engine-behavior": (
        "e.toml",
        INSTANT + "\n[behavior]\n",
        r"^\[behavior\]$",
        '[behavior]\ndefault_cases = "no"',
        "",
    ),
    "plan-stops": ("p.toml", QUICK, r"^contract_every_cell = false", 'contract_every_cell = "no"', "stops."),
    "prices-example": ("prices.toml", PRICES, r"^example = true", 'example = "yes"', "example = 'yes'"),
}


def _command(name: str, path: Path, out: Path) -> list[object]:
    if name == "s.toml":
        return ["trace", "generate", path, "--trace", "steady", "--out", out]
    if name == "e.toml":
        return ["sim", "run", STEADY, "--engine", path, "--out", out]
    if name == "p.toml":
        return ["plan", path, "--sim-worksheet", "instant", "--max-runs", "1", "--out", out]
    run = out.parent / "run"  # a real run to compare (the prices are read after the directories)
    assert _cli("sim", "run", STEADY, "--engine", "instant", "--out", run).returncode == 0
    return ["compare", run, run, "--prices", path, "--out", out]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_boolean_given_as_text_or_a_number_is_one_line(tmp_path: Path, case: str) -> None:
    name, text, pattern, new, said = CASES[case]
    path = tmp_path / name
    text = text.replace('scenario = "../canonical.toml"', f'scenario = "{REPO / "scenarios" / "canonical.toml"}"')
    path.write_text(_edit(text, pattern, new))
    res = _cli(*_command(name, path, tmp_path / "out"))
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    field = new.splitlines()[-1].split(" = ")[0]
    assert f"{path}: " in res.stderr and said in res.stderr and f"{field} = " in res.stderr, res.stderr
    assert "expected true or false" in res.stderr and not (tmp_path / "out").exists()
