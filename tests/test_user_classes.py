"""Classes are the user's: five user-named classes through the real CLI, end to end.

trace generate → run on the live simulated engine (``loadgen sim serve``) and on the worksheet → analyze
(tables, CDFs, budgets per class) → plan (``classes = [...]``) → compare (routes by class name) → handoff.
Nothing may assume the seed's three classes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadgen.rundir.io import read_run_table
from loadgen.rundir.schema import REQUESTS_FILE
from loadgen.util.errors import ScenarioError
from loadgen.workload.scenario import class_name_problem, class_order, load_scenario

REPO = Path(__file__).resolve().parents[1]
FIVE = ("chat", "rag", "code", "agent", "batch-summarise")

SCENARIO = """\
name = "five-classes"
seed = 7
endpoint = "completions"

[classes.chat]
share = 0.3
input_tokens = { dist = "uniform", low = 20, high = 80 }
output_tokens = { dist = "uniform", low = 8, high = 24 }
[classes.chat.budgets]
ttft_ms = { p99 = 5000 }

[classes.rag]
share = 0.2
input_tokens = { dist = "uniform", low = 300, high = 600 }
output_tokens = { dist = "fixed", value = 16 }
[classes.rag.budgets]
ttft_ms = { p50 = 4000 }
itl_ms = { p99 = 2000 }

[classes.code]
share = 0.2
input_tokens = { dist = "fixed", value = 120 }
output_tokens = { dist = "uniform", low = 20, high = 40 }
cancel = { share = 0.2, after_tokens = { dist = "fixed", value = 4 } }

[classes.agent]
share = 0.2
input_tokens = { dist = "fixed", value = 60 }
output_tokens = { dist = "fixed", value = 12 }
thread = { turns = { dist = "fixed", value = 3 }, think_time_s = { dist = "fixed", value = 0.1 } }
[classes.agent.budgets]
e2e_ms = { p99 = 20000, hard = false }

[classes.batch-summarise]
share = 0.1
stream = false
input_tokens = { dist = "fixed", value = 400 }
output_tokens = { dist = "fixed", value = 30 }
[classes.batch-summarise.budgets]
e2e_ms = { p99 = 30000 }

[traces.steady]
process = "poisson"
rate_rps = 12
duration_s = 8
"""


def cli(*args: str, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.parametrize(
    "name,good",
    [
        ("chat", True),
        ("batch-summarise", True),
        ("tool_use2", True),
        ("9", True),
        ("Chat", False),  # a case-blind file system would merge it with "chat"
        ("a/b", False),
        ("../x", False),
        ("<b>", False),
        ("a b", False),
        ("-x", False),
        ("", False),
        ("x" * 65, False),
        ("overall", False),  # the all-classes group of every report
        ("mixed", False),  # a plan's mixed cells
        ("interactive", False),  # compare --route words
    ],
)
def test_class_name_rule(name: str, good: bool) -> None:
    assert (class_name_problem(name) is None) is good


def test_class_order_is_canonical_then_by_name() -> None:
    assert class_order(["rag", "burst", "agent", "short-message"]) == ["short-message", "burst", "agent", "rag"]


def test_a_bad_class_name_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(SCENARIO.replace("[classes.rag", "[classes.RAG").replace("classes.rag.", "classes.RAG."))
    with pytest.raises(ScenarioError, match="classes: name 'RAG': expected a class name"):
        load_scenario(path)
    res = cli("scenario", "check", str(path))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def _plan(tmp: Path, scenario: Path) -> Path:
    plan = tmp / "plan.toml"
    plan.write_text(
        f'name = "five"\nscenario = "{scenario}"\ntrace = "steady"\nduration_s = 5\n'
        'classes = ["rag", "batch-summarise", "mixed"]\nstates = ["warm"]\nconcurrency = [64]\n'
        "rates_rps = [2, 6]\nrepeats = 1\n[stops]\ncontract_every_cell = false\n"
    )
    return plan


@pytest.mark.slow  # ~45 s: trace, live run, analysis, plan, compare and handoff
def test_five_user_named_classes_end_to_end(tmp_path: Path, sim_server) -> None:
    scenario = tmp_path / "five.toml"
    scenario.write_text(SCENARIO)
    ok(cli("scenario", "check", str(scenario)))
    trace = tmp_path / "trace.parquet"
    ok(cli("trace", "generate", str(scenario), "--trace", "steady", "--out", str(trace)))
    table = pq.read_table(trace).to_pydict()
    assert set(table["request_class"]) == set(FIVE)
    agent_turns = [t for c, t in zip(table["request_class"], table["turn_index"], strict=True) if c == "agent"]
    assert set(agent_turns) == {0, 1, 2}  # the user's class carries its own thread settings

    # the live simulated engine over HTTP, then the worksheet in virtual time
    sim = sim_server("instant")
    live = tmp_path / "live"
    ok(cli("run", str(trace), "--target", sim.base_url, "--out", str(live), "--scenario", str(scenario)))
    rows = read_run_table(live, REQUESTS_FILE).to_pydict()
    assert sorted(set(rows["request_class"])) == sorted(FIVE)
    statuses = {(c, s) for c, s in zip(rows["request_class"], rows["status"], strict=True)}
    assert all(s == "ok" for c, s in statuses if c != "code")  # code abandons a share after 4 tokens
    runs = {}
    for engine in ("interactive-small-batch", "throughput-large-batch"):
        runs[engine] = tmp_path / engine
        ok(cli("sim", "run", str(trace), "--engine", engine, "--out", str(runs[engine]), "--scenario", str(scenario)))

    # analysis: a table, CDFs and budget checks per user-named class
    for run in (live, runs["interactive-small-batch"]):
        out = tmp_path / f"{run.name}.json"
        html = tmp_path / f"{run.name}.html"
        text = ok(cli("analyze", str(run), "--json", str(out), "--html", str(html)))
        doc = json.loads(out.read_text())
        assert set(doc["classes"]) == set(FIVE)
        for name in FIVE:
            assert doc["classes"][name]["metrics"]["e2e_ms"]["n"] > 0, name
            assert name in text and f">{name}<" in html.read_text()
        checked = {(c["class"], c["metric"]) for c in doc["checks"]}
        assert {("chat", "ttft_ms"), ("rag", "ttft_ms"), ("rag", "itl_ms"), ("batch-summarise", "e2e_ms")} <= checked
        assert ("agent", "e2e_ms") in checked and ("code", "ttft_ms") not in checked

    # compare: a route of user-named classes, and the streaming ones for "interactive"
    res = json.loads(ok(cli("compare", *map(str, runs.values()), "--route", "rag,agent", "--json")))
    assert all(c["route_classes"] == ["rag", "agent"] for c in res["candidates"])
    res = json.loads(ok(cli("compare", *map(str, runs.values()), "--route", "interactive", "--json")))
    assert all(c["route_classes"] == ["agent", "chat", "code", "rag"] for c in res["candidates"])
    bad = cli("compare", *map(str, runs.values()), "--route", "chat,nope")
    assert bad.returncode == 2 and "'nope' is not a class of the scenario" in bad.stderr

    # a plan of user-named classes on the worksheet, and plan directories compared by region
    plans = []
    for engine in runs:
        plans.append(tmp_path / f"plan-{engine}")
        ok(cli("plan", str(_plan(tmp_path, scenario)), "--sim-worksheet", engine, "--out", str(plans[-1])))
    region = json.loads(ok(cli("compare", *map(str, plans), "--route", "rag", "--json")))
    assert all("rag" in c["capacity"] for c in region["candidates"])

    # handoff: with the scenario file gone, the bundle rebuilds it from the manifest in the generator's class
    # order, and verify regenerates the same trace from it
    scenario.unlink()
    bundle = tmp_path / "bundle"
    ok(cli("handoff", str(runs["throughput-large-batch"]), "--out", str(bundle)))
    rebuilt = load_scenario(next(bundle.rglob("scenario.toml")))
    assert list(rebuilt.classes) == class_order(FIVE)
    ok(cli("handoff", "verify", str(bundle)))


def test_an_imported_trace_takes_a_safe_class_name(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    good = cli("trace", "import", "azure", str(azure), "--out", str(tmp_path / "t.parquet"), "--request-class", "rag")
    assert good.returncode == 0, good.stderr
    assert pq.read_table(tmp_path / "t.parquet").column("request_class").to_pylist() == ["rag"]
    bad = cli("trace", "import", "azure", str(azure), "--out", str(tmp_path / "u.parquet"), "--request-class", "a/b")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--request-class = 'a/b': expected" in bad.stderr
