"""``loadgen analyze``: the real command, exit codes, JSON and HTML outputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from test_analysis_run import build_run, known_chunks, known_requests, scenario_two_classes

from loadgen.cli import main

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_analyze_command_writes_json_and_html_and_exits_zero_on_failed_budgets(tmp_path):
    run = build_run(tmp_path / "run", known_requests(), known_chunks(), scenario=scenario_two_classes())
    out = _run("analyze", str(run), "--json", str(tmp_path / "a.json"), "--html", str(tmp_path / "a.html"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.lstrip().startswith("╭") and "FAIL" in out.stdout.split("\n")[1]  # verdict first
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["schema_version"] == "1" and doc["verdict"]["passed"] is False
    assert (tmp_path / "a.html").stat().st_size > 10_000
    failing = _run("analyze", str(run), "--fail-on-budget", "--quiet")
    assert failing.returncode == 3


def test_window_and_scenario_options(tmp_path):
    run = build_run(tmp_path / "run", known_requests(), known_chunks())  # no scenario in the manifest
    scen = tmp_path / "s.toml"
    scen.write_text(
        (REPO / "scenarios" / "canonical.toml").read_text().replace('cases = ["contract/canonical.toml"]', "cases = []")
    )
    assert (
        main(
            [
                "analyze",
                str(run),
                "--scenario",
                str(scen),
                "--window",
                "0:0.25",
                "--quiet",
                "--json",
                str(tmp_path / "w.json"),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["window"]["start_s"] == 0 and doc["window"]["end_s"] == 0.25
    assert doc["overall"]["n_scheduled"] == 5 and doc["checks"]  # budgets from --scenario


def test_bad_input_exits_two_with_one_line(tmp_path):
    out = _run("analyze", str(tmp_path / "missing"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "no such directory: expected a loadgen run directory" in out.stderr
    out = _run("analyze", str(tmp_path), "--window", "abc")
    assert out.returncode == 2 and "start:end" in out.stderr


def test_analyze_refuses_rows_copied_in_from_another_run(tmp_path):
    run = build_run(tmp_path / "run", known_requests(), known_chunks(), scenario=scenario_two_classes())
    other = [dict(r, request_id=f"other-{r['request_id']}") for r in known_requests()]
    second = build_run(tmp_path / "second", other, scenario=scenario_two_classes())
    assert _run("analyze", str(run), "--quiet").returncode == 0
    for k, part in enumerate(sorted((second / "requests.parquet").iterdir())):
        shutil.copy(part, run / "requests.parquet" / f"part-9{k:05d}.parquet")
    out = _run("analyze", str(run), "--quiet")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "rows from another run" in line and f"expected at most {len(known_requests())}" in line


def test_analyze_refuses_impossible_instants(tmp_path):
    rows = known_requests()
    rows[0] = dict(rows[0], done_ns=rows[0]["scheduled_ns"] - 1)  # done before it was scheduled
    run = build_run(tmp_path / "run", rows, known_chunks(), scenario=scenario_two_classes())
    out = _run("analyze", str(run), "--quiet")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "request_id 'r1': done_ns = -1 is before scheduled_ns = 0" in line


def test_a_run_of_a_newer_record_schema_says_so(tmp_path):
    """A run written by a newer loadgen (record schema 9) is analysed, with a note that what it added is not read;
    one of this version's schema gets no such note."""
    run = build_run(tmp_path / "run", known_requests(), known_chunks(), scenario=scenario_two_classes())
    plain = _run("analyze", str(run), "--json", str(tmp_path / "plain.json"), "--quiet")
    assert plain.returncode == 0, plain.stderr
    assert not any("record schema" in n for n in json.loads((tmp_path / "plain.json").read_text())["notes"])
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["schema_version"] = "9"
    (run / "manifest.json").write_text(json.dumps(manifest))
    newer = _run("analyze", str(run), "--json", str(tmp_path / "newer.json"), "--quiet")
    assert newer.returncode == 0, newer.stderr
    notes = json.loads((tmp_path / "newer.json").read_text())["notes"]
    assert any("newer record schema ('9'; this loadgen reads 1 to 3)" in n for n in notes), notes
    manifest["manifest_version"] = 99
    (run / "manifest.json").write_text(json.dumps(manifest))
    newer = _run("analyze", str(run), "--json", str(tmp_path / "newer.json"), "--quiet")
    assert newer.returncode == 0, newer.stderr
    notes = json.loads((tmp_path / "newer.json").read_text())["notes"]
    assert any(n.startswith("manifest version 99 is newer than this loadgen's (2)") for n in notes), notes
