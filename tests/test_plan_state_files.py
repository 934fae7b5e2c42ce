"""A plan directory's state files (plan.json, each run's cell_result.json) are typed (``loadgen.plan.state``):
what ``loadgen plan`` writes validates against the published schemas ``plan-state`` and ``cell-result``; a resume
from a hand-edited or damaged one is one line (file, field, value, what was expected), exit 2, never a traceback;
one an older loadgen wrote (keys it lacked) resumes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from result_schemas import assert_valid

from loadgen.plan.files import write_plan_state

REPO = Path(__file__).resolve().parents[1]
PLAN = f"""name = "state"
scenario = "{REPO / "scenarios" / "canonical.toml"}"
trace = "steady"
duration_s = 4
classes = ["short-message"]
concurrency = [8, 64]
rates_rps = [2, 16]
repeats = 1
[start]
model_config = "{REPO / "loadgen" / "data" / "models" / "llama-3.1-8b.json"}"
[search]
mode = "bisect"
[stops]
contract_every_cell = false
"""
CELL = "cells/short-message.warm.c8.r0/rep1/cell_result.json"

Damage = Callable[[dict[str, Any]], object]

#: (file, damage, what the one line names): each of these was a traceback before the files were typed.
DAMAGES: list[tuple[str, Damage, str]] = [
    ("plan.json", lambda s: s["start"].update(lines=[]), "start.lines = []: expected"),
    ("plan.json", lambda s: s["start"]["lines"].update({"short-message.c64": "x"}), "start.lines.short-message.c64"),
    ("plan.json", lambda s: s.pop("plan"), "plan: missing; required"),
    ("plan.json", lambda s: s.pop("target"), "target: missing; required"),
    ("plan.json", lambda s: s.update(scenario="x"), "scenario = 'x': expected"),
    ("plan.json", lambda s: s.update(rate_steps="x"), "rate_steps = 'x': expected"),
    ("plan.json", lambda s: s.update(ledger="x"), "ledger = 'x': expected"),
    (CELL, lambda c: c.update(figures="x"), "figures"),
    (CELL, lambda c: c.pop("run_dir"), "run_dir: missing; required"),
    (CELL, lambda c: c.update(run_dir=5), "run_dir = 5: expected"),
    (CELL, lambda c: c.update(warm_state="x"), "warm_state = 'x': expected"),
    (CELL, lambda c: c.update(failed=["x"]), "failed[0] = 'x': expected"),
    (CELL, lambda c: c.update(stops=[{"detail": "d"}]), "stops[0].kind: missing; required"),
    (CELL, lambda c: c.update(inconclusive="x"), "inconclusive = 'x': expected"),
]


def _loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )


def _plan(tmp_path: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "plan.toml").write_text(PLAN)
    return _loadgen(
        "plan", str(tmp_path / "plan.toml"), "--out", str(out), "--sim-worksheet", "interactive-small-batch", *extra
    )


def _edit(path: Path, damage: Damage) -> None:
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))


@pytest.mark.slow  # ~40 s: a paused plan, then a resume per damage
def test_a_damaged_state_file_is_refused_in_one_line(tmp_path: Path) -> None:
    paused = tmp_path / "paused"
    assert _plan(tmp_path, paused, "--max-runs", "2").returncode == 3
    assert_valid("plan-state", json.loads((paused / "plan.json").read_text()))
    for marker in paused.glob("cells/*/rep*/cell_result.json"):
        assert_valid("cell-result", json.loads(marker.read_text()))
    for name, damage, expected in DAMAGES:
        out = tmp_path / "q"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(paused, out)
        _edit(out / name, damage)
        refused = _plan(tmp_path, out, "--quiet")
        line = refused.stderr.strip()
        assert refused.returncode == 2 and "Traceback" not in line and "\n" not in line, (name, expected, line[-600:])
        assert f"{out / name}: " in line and expected in line, line


@pytest.mark.slow  # ~15 s: a paused plan, then its resume
def test_a_state_an_older_loadgen_wrote_resumes(tmp_path: Path) -> None:
    """Keys added since the first plan state (rate_steps, harness; a record's order_index, contract, extensions,
    recovery, run_kind, requests_scheduled, a warm state's method) are optional: such a plan resumes, and
    finishes with files the schemas hold."""
    out = tmp_path / "p"
    assert _plan(tmp_path, out, "--max-runs", "2").returncode == 3
    _edit(out / "plan.json", lambda s: [s.pop(k) for k in ("rate_steps", "harness")])
    old = ("order_index", "contract", "extensions", "recovery", "run_kind", "requests_scheduled", "base_run_dir")
    for marker in out.glob("cells/*/rep*/cell_result.json"):
        _edit(marker, lambda c: [c.pop(k, None) for k in old] + [c["warm_state"].pop("method")])
    resumed = _plan(tmp_path, out, "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_valid("plan-state", json.loads((out / "plan.json").read_text()))
    assert_valid("region", json.loads((out / "region.json").read_text()))


def test_the_writer_refuses_a_key_its_model_does_not_declare(tmp_path: Path) -> None:
    """A key the state model does not describe is a bug, caught before plan.json is written."""
    state = {
        "kind": "loadgen.plan",
        "version": 1,
        "plan": {"name": "p", "scenario": "s.toml", "trace": "steady", "rates_rps": [1.0]},
        "plan_path": None,
        "plan_sha256": None,
        "scenario": {"name": "s", "path": "s.toml", "sha256": "0" * 64},
        "target": {"kind": "worksheet", "engine": "e", "engine_sha256": None, "engine_path": None},
        "created_utc": "2026-12-07T00:00:00+00:00",
        "invocations": [{"started_utc": "2026-12-07T00:00:00+00:00", "pid": 1}],
    }
    write_plan_state(tmp_path / "plan.json", state)
    assert_valid("plan-state", json.loads((tmp_path / "plan.json").read_text()))
    with pytest.raises(ValidationError, match="surprise"):
        write_plan_state(tmp_path / "plan.json", {**state, "surprise": 1})
