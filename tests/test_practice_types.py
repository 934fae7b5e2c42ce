"""The practice's decision.json is typed to its leaves: the workload's ``settings`` (the trace's recorded arrival
setting) and each ledger line's ``factors`` were open dicts. A trace whose recorded setting is not one the trace
generator writes is refused in one line before anything runs, never by the writer's own validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from result_schemas import assert_valid, schema_errors

from loadgen.practice_result import Workload
from loadgen.trace.io import read_trace, write_trace

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "traces" / "canonical-burst.parquet"
MODEL = REPO / "loadgen" / "data" / "models" / "llama-3.1-8b.json"


def _loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )


def test_a_trace_with_a_foreign_arrival_setting_is_refused_in_one_line(tmp_path: Path) -> None:
    table, meta = read_trace(TRACE)
    write_trace(table, tmp_path / "t.parquet", {**meta, "settings": {**meta["settings"], "process": "bursty"}})
    out = tmp_path / "out"
    refused = _loadgen("practice", "--trace", str(tmp_path / "t.parquet"), "--out", str(out), "--window-s", "5")
    line = refused.stderr.strip()
    assert refused.returncode == 2 and "\n" not in line and "Traceback" not in line, line[-2000:]
    assert f"{tmp_path / 't.parquet'}: metadata settings: process = 'bursty': expected" in line
    assert not out.exists() or not any(out.iterdir())


def test_the_workload_keeps_a_setting_an_older_generator_recorded_as_it_was() -> None:
    """The shipped trace was generated before ramp's start/end rates: its setting lacks them, and decision.json
    carries it as recorded (no key added)."""
    _, meta = read_trace(TRACE)
    assert "start_rate_rps" not in meta["settings"]
    workload = {
        **dict.fromkeys(("scenario", "trace", "trace_sha256"), "x"),
        **dict.fromkeys(("scenario_path", "scenario_sha256", "trace_name", "seed", "duration_s", "derived_from")),
        "requests": 1,
        "settings": meta["settings"],
        "requests_per_class": {},
        "budgets": {},
        "behavior_cases": [],
    }
    assert Workload.from_document(workload).document()["settings"] == meta["settings"]


def test_every_ledger_factor_is_typed(tmp_path: Path) -> None:
    """A ledger with LoRA adapters has a list factor (their targets); every factor validates against the
    published ledger schema (the CPU runtime line's GiB per process is an object of numbers: test_ledger), and a
    factor of another kind (an object of names) does not."""
    printed = _loadgen("ledger", "--model", str(MODEL), "--lora-count", "2", "--lora-rank", "16", "--json")
    assert printed.returncode == 0, printed.stderr[-2000:]
    ledger = json.loads(printed.stdout)
    adapters = next(line for line in ledger["lines"] if line["name"] == "adapters")
    assert isinstance(adapters["factors"]["targets"], list)
    assert_valid("ledger", ledger)
    adapters["factors"]["targets"] = {"q_proj": "all"}
    assert any(e.startswith("lines/") and "/factors/targets" in e for e in schema_errors("ledger", ledger))
