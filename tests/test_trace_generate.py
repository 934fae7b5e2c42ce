"""Deterministic trace generation: byte-identical files, and sampled statistics that match the scenario."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.trace import generate_trace, read_trace, trace_stats
from loadgen.trace.generate import generate_trace_file
from loadgen.util.errors import TraceError
from loadgen.workload.scenario import load_scenario, parse_scenario

REPO = Path(__file__).resolve().parents[1]
CANONICAL = REPO / "scenarios" / "canonical.toml"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _generate_cli(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``loadgen trace generate`` of the canonical scenario's burst trace into ``out``."""
    cmd = [sys.executable, "-m", "loadgen", "trace", "generate", str(CANONICAL), "--trace", "burst"]
    return subprocess.run([*cmd, *args, "--out", str(out)], capture_output=True, text=True)


def test_same_scenario_and_seed_give_byte_identical_files_via_cli(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"t{i}.parquet"
        res = _generate_cli(out, "--seed", "7")
        assert res.returncode == 0, res.stderr
        outs.append(out)
    assert _sha(outs[0]) == _sha(outs[1])
    other = tmp_path / "other.parquet"
    generate_trace_file(load_scenario(CANONICAL), "burst", other, seed=8)
    assert _sha(other) != _sha(outs[0])


def test_a_trace_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "t.parquet"
    generate_trace_file(load_scenario(CANONICAL), "burst", out, seed=7)
    before = _sha(out)
    (tmp_path / "t.parquet.partial").mkdir()  # the write's temporary file cannot be made
    with pytest.raises(TraceError, match=r"t\.parquet: cannot write trace") as caught:
        generate_trace_file(load_scenario(CANONICAL), "burst", out, seed=8)
    assert ".partial" not in str(caught.value)
    assert _sha(out) == before  # the old trace is intact, not half overwritten
    folder = tmp_path / "folder"
    folder.mkdir()
    res = _generate_cli(folder)
    assert res.returncode == 2 and res.stderr.strip() == (
        f"loadgen: error: loadgen trace generate: argument --out: {folder}: is a directory, expected a file to write "
        "(see loadgen trace generate --help)"
    )
    assert not list(folder.iterdir())


def test_trace_metadata_names_generator_scenario_and_seed(tmp_path):
    s = load_scenario(CANONICAL)
    table, meta = read_trace(generate_trace_file(s, "steady", tmp_path / "t.parquet", seed=3))
    assert meta["scenario_sha256"] == s.sha256
    assert meta["seed"] == 3 and meta["generator_version"] == "1" and meta["mode"] == "open"
    assert table.num_rows > 0
    ids = table.column("request_id").to_pylist()
    assert len(set(ids)) == len(ids)


def test_long_threads_grow_their_context_turn_by_turn():
    s = load_scenario(CANONICAL)
    table, _ = generate_trace(s, "steady", seed=11)
    rows = [r for r in table.to_pylist() if r["conversation_id"]]
    assert rows, "expected long-thread conversations"
    by_conv: dict[str, list[dict]] = {}
    for r in rows:
        by_conv.setdefault(r["conversation_id"], []).append(r)
    multi = [turns for turns in by_conv.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        turns.sort(key=lambda r: r["turn_index"])
        assert [t["turn_index"] for t in turns] == list(range(len(turns)))
        for prev, cur in zip(turns, turns[1:]):
            # the next prompt carries the previous prompt and its reply, plus new input
            assert cur["prompt_tokens"] > prev["prompt_tokens"] + prev["output_tokens"]
            assert cur["scheduled_offset_ns"] >= prev["scheduled_offset_ns"]


def test_prefix_groups_prepend_shared_tokens_only_for_listed_classes():
    s = load_scenario(CANONICAL)
    table, _ = generate_trace(s, "steady", seed=5)
    rows = table.to_pylist()
    grouped = [r for r in rows if r["prefix_group"]]
    assert grouped and all(r["prefix_tokens"] == 256 for r in grouped)
    assert all(r["request_class"] in ("short-message", "burst") for r in grouped)
    assert all(r["prompt_tokens"] > 256 for r in grouped)
    share = len([r for r in grouped if r["request_class"] == "short-message"]) / max(
        1, len([r for r in rows if r["request_class"] == "short-message"])
    )
    assert 0.3 < share < 0.7


def test_unknown_trace_name_is_a_one_line_error():
    with pytest.raises(TraceError, match="traces.nope: no such trace"):
        generate_trace(load_scenario(CANONICAL), "nope")


def _scenario(process: dict, shares=(0.5, 0.3, 0.2), seed=1) -> object:
    names = ("short-message", "burst", "long-thread")
    classes = {}
    for name, share in zip(names, shares):
        cls = {
            "share": share,
            "input_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.6},
            "output_tokens": {"dist": "uniform", "low": 10, "high": 50},
            "cancel": {"share": 0.1, "after_tokens": {"dist": "fixed", "value": 5}},
        }
        if name == "long-thread":
            cls["thread"] = {"turns": {"dist": "fixed", "value": 1}, "think_time_s": {"dist": "fixed", "value": 1}}
        classes[name] = cls
    return parse_scenario({"name": "prop", "seed": seed, "classes": classes, "traces": {"t": process}})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.floats(0.5, 30), seed=st.integers(0, 2**31))
def test_poisson_mean_rate_and_exponential_gaps(rate, seed):
    duration = 4000 / rate  # ~4000 arrivals
    table, _ = generate_trace(_scenario({"process": "poisson", "rate_rps": rate, "duration_s": duration}), "t", seed)
    stats = trace_stats(table)
    n_expected = rate * duration
    assert abs(stats.requests - n_expected) < 5 * np.sqrt(n_expected)
    assert 0.9 < stats.iat_cv < 1.1


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cv=st.floats(0.3, 4.0), seed=st.integers(0, 2**31))
def test_gamma_arrivals_have_the_requested_burstiness(cv, seed):
    rate = 20.0
    table, _ = generate_trace(
        _scenario({"process": "gamma", "rate_rps": rate, "cv": cv, "duration_s": 1000}), "t", seed
    )
    stats = trace_stats(table)
    assert abs(stats.mean_rate_rps - rate) / rate < 0.1 + 0.05 * cv
    assert abs(stats.iat_cv - cv) / cv < 0.15


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shares=st.tuples(st.integers(1, 10), st.integers(1, 10), st.integers(1, 10)).map(
        lambda t: tuple(x / sum(t) for x in t)
    ),
    seed=st.integers(0, 2**31),
)
def test_class_shares_and_cancellation_share(shares, seed):
    table, _ = generate_trace(_scenario({"process": "poisson", "rate_rps": 50, "duration_s": 100}, shares), "t", seed)
    stats = trace_stats(table)
    n = stats.requests
    for name, share in zip(("short-message", "burst", "long-thread"), shares):
        got = stats.classes.get(name, {"share": 0.0})["share"]
        assert abs(got - share) < 4 * np.sqrt(share * (1 - share) / n) + 0.01
    cancelled = stats.cancellations / n
    assert abs(cancelled - 0.1) < 0.03


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(burst_rate=st.floats(10, 60), quiet_rate=st.floats(0.1, 3), seed=st.integers(0, 2**31))
def test_onoff_bursts_have_the_configured_rates(burst_rate, quiet_rate, seed):
    proc = {
        "process": "onoff",
        "quiet_rate_rps": quiet_rate,
        "burst_rate_rps": burst_rate,
        "burst_s": 5,
        "gap_s": 15,
        "duration_s": 2000,
    }
    table, _ = generate_trace(_scenario(proc), "t", seed)
    t = table.column("scheduled_offset_ns").to_numpy() / 1e9
    phase = t % 20
    in_burst = phase >= 15
    burst_measured = in_burst.sum() / (100 * 5)
    quiet_measured = (~in_burst).sum() / (100 * 15)
    assert abs(burst_measured - burst_rate) / burst_rate < 0.1
    assert abs(quiet_measured - quiet_rate) < 5 * np.sqrt(quiet_rate / 1500) + 0.05
    # bursty: the index of dispersion over 1 s windows is well above a Poisson process's 1. Not over 10 s:
    # those windows start at the first arrival, so when it lands mid-period each holds half a burst (IoD ~1).
    assert trace_stats(table).iod["1s"] > 2


def test_token_lengths_follow_the_distribution_with_clamps():
    s = _scenario({"process": "poisson", "rate_rps": 100, "duration_s": 100})
    table, _ = generate_trace(s, "t", 3)
    rows = [r for r in table.to_pylist() if r["request_class"] == "short-message"]
    prompts = np.array([r["prompt_tokens"] for r in rows])
    outputs = np.array([r["output_tokens"] for r in rows])
    assert abs(prompts.mean() - 300) / 300 < 0.05  # lognormal with arithmetic mean 300
    assert outputs.min() >= 10 and outputs.max() <= 50


def test_closed_loop_trace_has_the_requested_count_and_no_offsets():
    s = load_scenario(CANONICAL)
    table, meta = generate_trace(s, "closed")
    assert table.num_rows == s.traces["closed"].requests
    assert meta["mode"] == "closed" and meta["concurrency"] == 8
    assert set(table.column("scheduled_offset_ns").to_pylist()) == {0}


def test_class_order_in_the_file_does_not_change_the_trace(tmp_path):
    # a scenario rebuilt from a manifest (keys sorted) must regenerate the same trace
    from loadgen.rundir.manifest import Manifest
    from loadgen.workload.scenario import scenario_from_manifest, scenario_manifest

    s = load_scenario(CANONICAL)
    rebuilt = scenario_from_manifest(Manifest(scenario=scenario_manifest(s)))
    reordered = parse_scenario(
        {**s.model_dump(mode="json"), "classes": dict(reversed(list(s.model_dump(mode="json")["classes"].items())))}
    )
    a = generate_trace(s, "burst")[0]
    assert a.equals(generate_trace(rebuilt, "burst")[0])
    assert a.equals(generate_trace(reordered, "burst")[0])


def test_constant_rate_arrivals_are_evenly_spaced_and_need_no_seed():
    # long-thread has one turn here, so every session is one request: gaps of exactly 1/rate
    a, _ = generate_trace(_scenario({"process": "constant", "rate_rps": 8.0, "duration_s": 10}), "t", 1)
    b, _ = generate_trace(_scenario({"process": "constant", "rate_rps": 8.0, "duration_s": 10}), "t", 2)
    t = a.column("scheduled_offset_ns").to_numpy()
    assert len(t) == 80 and t[0] == 0 and np.all(np.diff(t) == 125_000_000)
    assert np.array_equal(t, b.column("scheduled_offset_ns").to_numpy())  # the seed only picks classes and lengths
    assert trace_stats(a).iat_cv < 1e-9


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.floats(0.0, 20.0), end=st.floats(0.0, 40.0), seed=st.integers(0, 2**31))
def test_ramp_arrivals_follow_the_linear_rate(start, end, seed):
    if start + end < 1:
        return
    duration = 400.0
    proc = {"process": "ramp", "start_rate_rps": start, "end_rate_rps": end, "duration_s": duration}
    table, meta = generate_trace(_scenario(proc), "t", seed)
    again, _ = generate_trace(_scenario(proc), "t", seed)
    assert table.equals(again)  # deterministic: same seed, same arrivals
    t = table.column("scheduled_offset_ns").to_numpy() / 1e9
    assert t.min() >= 0 and t.max() < duration
    for lo, hi in ((0, 100), (150, 250), (300, 400)):  # arrivals per window = the integral of the rate over it
        rate = lambda x: start + (end - start) * x / duration
        expected = (rate(lo) + rate(hi)) / 2 * (hi - lo)
        got = int(((t >= lo) & (t < hi)).sum())
        assert abs(got - expected) < 5 * np.sqrt(expected) + 3, (lo, hi, got, expected)


def test_ramp_and_constant_settings_are_validated():
    with pytest.raises(Exception, match="process 'ramp' needs end_rate_rps"):
        _scenario({"process": "ramp", "start_rate_rps": 1.0, "duration_s": 10})
    with pytest.raises(Exception, match="start_rate_rps or end_rate_rps above 0"):
        _scenario({"process": "ramp", "start_rate_rps": 0.0, "end_rate_rps": 0.0, "duration_s": 10})
    with pytest.raises(Exception, match="process 'constant' needs rate_rps"):
        _scenario({"process": "constant", "duration_s": 10})
