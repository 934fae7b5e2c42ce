"""Scenario validation: the shipped scenario loads; bad files give one-line errors naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.rundir.manifest import Manifest
from loadgen.util.errors import ScenarioError
from loadgen.workload.scenario import load_scenario, scenario_from_manifest, scenario_manifest

REPO = Path(__file__).resolve().parents[1]
CANONICAL = REPO / "scenarios" / "canonical.toml"


def test_canonical_scenario_loads_with_three_classes_and_traces():
    s = load_scenario(CANONICAL)
    assert set(s.classes) == {"short-message", "long-thread", "burst"}
    assert {"steady", "burst"} <= set(s.traces)
    assert s.classes["short-message"].budgets.ttft_ms.hard is True
    assert len(s.sha256) == 64
    assert s.privacy.retain_prompt_text is False


def test_manifest_roundtrip_rebuilds_the_same_scenario():
    s = load_scenario(CANONICAL)
    again = scenario_from_manifest(Manifest(scenario=scenario_manifest(s)))
    assert again == s


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


BASE = CANONICAL.read_text()


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            "ttft_ms = { p50 = 300, p99 = 1500, hard = true }",
            "ttft_ms = { p50 = -5, p99 = 1500, hard = true }",
            "classes.short-message.budgets.ttft_ms.p50 = -5: expected",
        ),
        ("share = 0.6", "share = 0.7", "shares sum to 1.1; expected 1"),
        ('process = "poisson"', 'process = "weibull"', "traces.steady.process = 'weibull'"),
        (
            "rate_rps = 4.0\nduration_s = 60\nmax_in_flight = 256\n\n[traces.burst]",
            "duration_s = 60\nmax_in_flight = 256\n\n[traces.burst]",
            "process 'poisson' needs rate_rps",
        ),
        (
            'input_tokens = { dist = "uniform", low = 256, high = 1024 }',
            'input_tokens = { dist = "uniform", low = 256, high = 10 }',
            "high (10.0) must be >= low (256.0)",
        ),
        ("[classes.burst", "[classes.Burst", "classes: name 'Burst': expected a class name of 1-64 lower-case"),
        ("[classes.burst", '[classes."burst 2"', "classes: name 'burst 2': expected a class name"),
        ("[classes.burst", "[classes.overall", "classes: name 'overall': expected a class name other than"),
        ("[classes.burst", "[classes.bursty", "traces.burst.burst_shares.burst: not a class of this scenario"),
        ("seed = 20261129", "seed = 20261129\ncolour = 'red'", "colour = 'red': unknown field"),
        # a misspelt field names the one it most likely meant (it said only "unknown field", and for a required
        # one reported "share: missing; required" first, the typo hidden in "+1 more")
        ("share = 0.6", "shares = 0.6", "classes.short-message.shares = 0.6: unknown field (did you mean 'share'?)"),
        ("ttft_ms = { p50 = 300", "ttft = { p50 = 300", "budgets.ttft: unknown field (did you mean 'ttft_ms'?)"),
        ("rate_rps = 4.0", "rate = 4.0", "traces.steady.rate = 4.0: unknown field (did you mean 'rate_rps'?)"),
        ("ttft_timeout_s = 30", "ttft_timeout = 30", "unknown field (did you mean 'ttft_timeout_s'?)"),
        ("retain_prompt_text = false", "retain_prompt = false", "(did you mean 'retain_prompt_text'?)"),
    ],
)
def test_bad_scenarios_give_one_line_errors(tmp_path, old, new, expected):
    assert old in BASE
    path = _write(tmp_path, BASE.replace(old, new))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected in message, message


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="invalid TOML"):
        load_scenario(_write(tmp_path, "name = "))
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "absent.toml")


def test_cli_scenario_check_reports_ok_and_errors(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "loadgen", "scenario", "check", str(CANONICAL)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert "ok: scenario 'canonical'" in ok.stdout
    bad = _write(tmp_path, BASE.replace("share = 0.6", "share = 0.6x"))
    res = subprocess.run(
        [sys.executable, "-m", "loadgen", "scenario", "check", str(bad)], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "invalid TOML" in res.stderr


def test_a_misspelt_plan_or_price_field_names_the_one_meant(tmp_path):
    """Plans, price tables and engine TOMLs go through the same one-line error as scenarios, and name the field meant too."""
    from loadgen.plan import load_prices
    from loadgen.plan.spec import load_plan
    from loadgen.sim.config import load_engine_config

    plan = tmp_path / "plan.toml"
    plan.write_text((REPO / "scenarios" / "plans" / "quick.toml").read_text().replace("\nrepeats =", "\nrepeat ="))
    with pytest.raises(ScenarioError, match=r"repeat = 2: unknown field \(did you mean 'repeats'\?\)"):
        load_plan(plan)
    prices = tmp_path / "prices.toml"
    prices.write_text((REPO / "scenarios" / "prices.toml").read_text().replace("\nusd_per_hour", "\nusd_per_hr", 1))
    with pytest.raises(ScenarioError, match=r"unknown field \(did you mean 'usd_per_hour'\?\)"):
        load_prices(prices)
    engine = tmp_path / "engine.toml"
    shipped = (REPO / "scenarios" / "engines" / "interactive-small-batch.toml").read_text()
    engine.write_text(shipped.replace("\nmax_num_seqs", "\nmax_num_seq", 1))
    with pytest.raises(
        ScenarioError, match=r"scheduler.max_num_seq = \d+: unknown field \(did you mean 'max_num_seqs'\?\)"
    ):
        load_engine_config(engine)
