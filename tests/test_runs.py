"""The run catalog and ``loadgen diff`` through the real CLI, on worksheet runs of the simulated engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.dataset as ds
import pytest
from result_schemas import assert_valid, schema_errors

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "scenarios" / "engines" / "interactive-small-batch.toml"
SCENARIO = REPO / "scenarios" / "canonical.toml"


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert res.returncode == 0, res.stderr[-2000:]
    return res


def _trace(tmp: Path, seed: int, name: str = "steady") -> Path:
    out = tmp / f"trace-{name}-{seed}.parquet"
    if not out.exists():
        _cli("trace", "generate", str(SCENARIO), "--trace", name, "--seed", str(seed), "--out", str(out))
    return out


def _worksheet(tmp: Path, trace: Path, out: str, engine: Path = ENGINE, seed: int = 0) -> Path:
    run = tmp / out
    _cli(
        "sim",
        "run",
        str(trace),
        "--engine",
        str(engine),
        "--scenario",
        str(SCENARIO),
        "--out",
        str(run),
        "--seed",
        str(seed),
    )
    return run


def _failing_engine(tmp: Path, error_rate: float, seed: int = 0) -> Path:
    """The same engine answering a seeded share of requests with an HTTP error at once."""
    text = ENGINE.read_text().replace("error_rate = 0.0", f"error_rate = {error_rate!r}\nerror_statuses = [500]")
    text = text.replace("\nseed = 0\n", f"\nseed = {seed}\n", 1)
    name = f"interactive-small-batch-failing-{error_rate:g}-{seed}"
    text = text.replace('name = "interactive-small-batch"', f'name = "{name}"')
    out = tmp / f"{name}.toml"
    out.write_text(text)
    return out


def _slower_engine(tmp: Path, factor: float) -> Path:
    """The same engine with every cost term × factor (a known slowdown)."""
    text = ENGINE.read_text()
    for key in ("fixed_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms"):
        line = next(ln for ln in text.splitlines() if ln.startswith(key))
        value = float(line.split("=")[1].split("#")[0])
        text = text.replace(line, f"{key} = {value * factor!r}")
    text = text.replace('name = "interactive-small-batch"', 'name = "interactive-small-batch-slower"')
    out = tmp / "slower.toml"
    out.write_text(text)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("runs")
    t1, t2 = _trace(tmp, 1), _trace(tmp, 2)
    return {
        "base": _worksheet(tmp, t1, "base"),
        "slower": _worksheet(tmp, t1, "slower", _slower_engine(tmp, 1.5)),
        "seed2": _worksheet(tmp, t2, "seed2"),
        "tmp": tmp,
    }


def test_diff_finds_a_known_slowdown_and_fails_ci(runs, tmp_path):
    res = _cli(
        "diff",
        str(runs["base"]),
        str(runs["slower"]),
        "--fail-on",
        "regression",
        "--json",
        str(tmp_path / "d.json"),
        check=False,
    )
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["verdict"] == "regressed"
    assert_valid("diff", data)  # the published schema (loadgen schema diff)
    assert data["kind"] == "loadgen.diff" and data["version"] == 2
    data["rows"][0]["interval"] = "wide"
    assert any(e.startswith("rows/0/interval") for e in schema_errors("diff", data))
    regressed = {(r["request_class"], r["metric"], r["quantile"]) for r in data["rows"] if r["verdict"] == "regressed"}
    # a 1.5x slower engine: the median TPOT and TTFT of the two large classes regress beyond the 5% threshold;
    # burst (15% of 240 requests) is slower too, by more than 30% at the median
    for cls in ("short-message", "long-thread"):
        assert {(cls, "tpot_ms", "p50"), (cls, "ttft_ms", "p50")} <= regressed
    burst = next(
        r for r in data["rows"] if (r["request_class"], r["metric"], r["quantile"]) == ("burst", "tpot_ms", "p50")
    )
    assert burst["change_pct"] > 30 and burst["verdict"] in ("regressed", "inconclusive")
    assert all(d >= 1.0 for r in data["rows"] if r["design_effect"] for d in r["design_effect"])
    for r in data["rows"]:
        if r["verdict"] == "regressed":
            lo, hi = r["interval"]
            assert lo > r["base"] * 0.05 and r["candidate"] > r["base"]  # the whole interval beyond +5%
    assert "REGRESSED" in res.stdout


def test_diff_of_two_seeds_of_one_engine_flags_nothing(runs, tmp_path):
    # independent traces of the same workload: the declared variable is the trace
    res = _cli(
        "diff",
        str(runs["base"]),
        str(runs["seed2"]),
        "--variable",
        "trace",
        "--fail-on",
        "regression",
        "--json",
        str(tmp_path / "d.json"),
    )
    data = json.loads((tmp_path / "d.json").read_text())
    assert_valid("diff", data)
    assert data["verdict"] != "regressed" and not [r for r in data["rows"] if r["verdict"] == "regressed"]
    assert data["differs_in"] and all(k.startswith("trace.") for k in data["differs_in"])
    assert "verdict:" in res.stdout


def test_diff_refuses_more_than_the_declared_variable(runs):
    res = _cli("diff", str(runs["base"]), str(runs["slower"]), "--variable", "trace", check=False)
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "more than the declared variable trace" in line and "target.engine" in line


def test_the_difference_interval_covers_by_construction():
    """The interval on a difference comes from each side's order-statistic interval: hand-checked ranks."""
    from loadgen.runs.diff import difference_interval, row_verdict
    from loadgen.stats.confidence import quantile_ci_ranks
    from loadgen.stats.percentiles import SortedParts

    base = np.arange(1000, dtype=np.float64)
    cand = base + 200.0
    lo_r, hi_r = quantile_ci_ranks(1000, 0.5, 0.99)
    lo, hi = difference_interval(SortedParts([base]), SortedParts([cand]), 0.5, 0.99)
    assert (lo, hi) == (cand[lo_r] - base[hi_r], cand[hi_r] - base[lo_r])
    assert (lo, hi) == (118.0, 282.0)  # ranks 458 and 540 of 1000 at 99%
    assert row_verdict((lo, hi), 500.0, 5.0) == "regressed"  # +200 of 500: its interval (118, 282) is wholly beyond +25
    assert row_verdict((lo - 100.0, hi), 500.0, 5.0) == "inconclusive"  # (18, 282): not wholly beyond +25
    assert row_verdict((-3.0, 4.0), 500.0, 5.0) == "no change"  # within ±25
    assert row_verdict((-3.0, 40.0), 500.0, 5.0) == "inconclusive"
    assert row_verdict((-60.0, -30.0), 500.0, 5.0) == "improved"


@pytest.mark.slow
def test_catalog_indexes_incrementally_and_reports_missing_runs(runs, tmp_path):
    root = tmp_path / "archive"
    root.mkdir()
    for name in ("base", "slower", "seed2"):
        shutil.copytree(runs[name], root / name)
    cat = tmp_path / "cat.duckdb"
    first = _cli("runs", "--catalog", str(cat), "index", str(root))
    assert "3 added, 0 updated, 0 unchanged" in first.stdout
    again = _cli("runs", "--catalog", str(cat), "index", str(root))
    assert "0 added, 0 updated, 3 unchanged" in again.stdout
    # a changed run is read again; a deleted one is reported, not an error
    manifest = root / "seed2" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"state": "complete"', '"state": "complete" '))
    shutil.rmtree(root / "slower")
    third = _cli("runs", "--catalog", str(cat), "index", str(root))
    assert "0 added, 1 updated, 1 unchanged, 1 missing" in third.stdout and "slower" in third.stdout
    listed = _cli("runs", "--catalog", str(cat), "list", "--json")
    assert_valid("runs-list", json.loads(listed.stdout))  # a missing run's row too
    rows = {Path(r["path"]).name: r for r in json.loads(listed.stdout)}
    assert rows["slower"]["present"] is False and rows["base"]["present"] is True
    assert rows["base"]["engine"] == "loadgen-sim" and rows["base"]["trace_seed"] == 1
    assert rows["seed2"]["trace_seed"] == 2 and rows["base"]["settings_sha256"] == rows["seed2"]["settings_sha256"]
    where = _cli("runs", "--catalog", str(cat), "list", "--where", "trace_seed = 2 and present", "--json")
    assert [Path(r["path"]).name for r in json.loads(where.stdout)] == ["seed2"]
    bad = _cli("runs", "--catalog", str(cat), "list", "--where", "no_such_column = 1", check=False)
    assert bad.returncode == 2 and "no_such_column" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_catalog_notices_a_requests_part_rewritten_in_place(runs, tmp_path):
    """The signature held the requests table's directory stat: a part rewritten under its own name (its mtime set
    back) left it as it was, and the catalog kept the old run's figures as current. Every part counts now, by
    size, mtime and ctime (which ``os.utime`` cannot set back)."""
    from loadgen.rundir.io import run_table_files
    from loadgen.rundir.schema import REQUESTS_FILE

    run = tmp_path / "base"
    shutil.copytree(runs["base"], run)
    cat = tmp_path / "cat.duckdb"
    _cli("runs", "--catalog", str(cat), "index", str(run))
    before = json.loads(_cli("runs", "--catalog", str(cat), "show", str(run), "--json").stdout)

    def rewrite(part: Path, data: bytes) -> None:
        st = part.stat()
        part.write_bytes(data)  # in place: same name, the table directory untouched
        os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns))

    part = run_table_files(run, REQUESTS_FILE)[0]
    rewrite(part, part.read_bytes())  # same bytes, same size and mtime: only the ctime moves
    assert "0 added, 1 updated, 0 unchanged" in _cli("runs", "--catalog", str(cat), "index", str(run)).stdout
    rewrite(part, run_table_files(runs["slower"], REQUESTS_FILE)[0].read_bytes())  # another run's rows
    assert "0 added, 1 updated, 0 unchanged" in _cli("runs", "--catalog", str(cat), "index", str(run)).stdout
    after = json.loads(_cli("runs", "--catalog", str(cat), "show", str(run), "--json").stdout)
    assert after["run"]["current"] is True and after["classes"] != before["classes"]
    assert "0 added, 0 updated, 1 unchanged" in _cli("runs", "--catalog", str(cat), "index", str(run)).stdout


def test_show_takes_a_path_on_disk_as_that_path_and_says_when_a_run_is_gone(runs, tmp_path):
    """`runs show NAME` where ./NAME is an uncatalogued run is refused (it matched another catalogued run whose
    path ends in NAME), and a catalogued run moved away since indexing shows present: false."""
    cat = tmp_path / "cat.duckdb"
    indexed = tmp_path / "elsewhere" / "base"
    shutil.copytree(runs["base"], indexed)
    _cli("runs", "--catalog", str(cat), "index", str(indexed))
    here = tmp_path / "here"
    shutil.copytree(runs["base"], here / "base")

    def show(key: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "loadgen", "runs", "--catalog", str(cat), "show", key, "--json"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)

    local = show("base", here)
    assert local.returncode == 2 and f"{here / 'base'} is not in the catalog" in local.stderr, local.stderr
    assert local.stdout == "" and len(local.stderr.strip().splitlines()) == 1
    assert json.loads(show("base", tmp_path).stdout)["run"]["present"] is True  # a unique end: the catalogued run
    shutil.move(indexed, tmp_path / "moved")
    assert json.loads(show(str(indexed), tmp_path).stdout)["run"]["present"] is False


def _analysis(run: Path, tmp: Path) -> dict:
    out = tmp / f"analysis-{run.name}.json"
    _cli("analyze", str(run), "--json", str(out))
    return json.loads(out.read_text())


def test_catalog_headline_figures_are_analyzes_own(runs, tmp_path):
    """Every figure `runs show` gives per class is the one `loadgen analyze` prints for that run (its window,
    cold-start rule, samples with planned abandonments, completed = ok requests done in the window per second).
    The catalog used to count ok requests over the scheduled span: one completed rate for every engine that
    ran a trace (11.1/s for a fast and a slow engine alike, where analyze said 4.8 and 4.0)."""
    cat = tmp_path / "cat.duckdb"
    _cli("runs", "--catalog", str(cat), "index", str(runs["base"]), str(runs["slower"]))
    completed = {}
    for name in ("base", "slower"):
        shown = json.loads(_cli("runs", "--catalog", str(cat), "show", name, "--json").stdout)
        assert_valid("runs-show", shown)
        assert shown["kind"] == "loadgen.catalog_run" and shown["version"] == 1
        analysis = _analysis(runs[name], tmp_path)
        for row in shown["classes"]:
            group = (
                analysis["overall"] if row["request_class"] == "overall" else analysis["classes"][row["request_class"]]
            )
            m = group["metrics"]
            assert row["scheduled"] == group["n_scheduled"] and row["ok"] == group["status_counts"]["ok"]
            assert row["failed"] == group["n_scheduled"] - group["status_counts"]["ok"] - group["abandoned"]
            for metric in ("ttft", "tpot", "e2e"):
                for q in ("p50", "p99"):
                    assert row[f"{metric}_{q}_ms"] == pytest.approx(m[f"{metric}_ms"][q], rel=1e-12), (metric, q)
            assert row["completed_rps"] == pytest.approx(group["completed_rps"], rel=1e-12)
        completed[name] = shown["classes"][-1]["completed_rps"]
    assert completed["slower"] < completed["base"]  # the same trace: only the engine's speed sets it
    # DuckDB reads the run's Parquet in place (the catalog keeps the path, never a copy)
    req = ds.dataset(runs["base"] / "requests.parquet").to_table()
    con = duckdb.connect(str(cat), read_only=True)
    path = con.execute("SELECT path FROM runs WHERE path LIKE '%base'").fetchone()[0]
    n = con.execute(f"SELECT count(*) FROM read_parquet('{path}/requests.parquet/*.parquet')").fetchone()[0]
    assert n == req.num_rows


@pytest.mark.slow
def test_export_mlflow_reads_back_through_mlflows_own_client(runs, tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'loadgen[mlflow]')")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = _cli("export", "mlflow", str(runs["base"]), "--tracking-uri", uri, "--experiment", "t")
    assert "1 exported, 0 unchanged" in res.stdout
    again = _cli("export", "mlflow", str(runs["base"]), "--tracking-uri", uri, "--experiment", "t")
    assert "0 exported, 1 unchanged" in again.stdout  # exported before, unchanged: no duplicate
    client = mlflow.tracking.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    manifest = json.loads((runs["base"] / "manifest.json").read_text())
    assert run.data.params["trace.seed"] == "1" and run.data.params["target.kind"] == "sim"
    assert run.data.params["harness.packages.pyarrow"] == manifest["harness"]["packages"]["pyarrow"]
    analysis = _analysis(runs["base"], tmp_path)  # the metrics are analyze's own figures
    burst = analysis["classes"]["burst"]["metrics"]["ttft_ms"]["p99"]
    assert run.data.metrics["burst.ttft_p99_ms"] == pytest.approx(burst, rel=1e-12)
    assert run.data.metrics["overall.ok"] == float(analysis["overall"]["status_counts"]["ok"])
    assert run.data.metrics["overall.completed_rps"] == pytest.approx(analysis["overall"]["completed_rps"], rel=1e-12)
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"manifest.json", "report.html"} <= names and not any(n.endswith(".parquet") for n in names)
    # exported by a loadgen whose headline figures were defined otherwise (its tag: the files' signature alone):
    # exported again with today's figures, not left "unchanged" with the old ones
    files_only = run.data.tags["loadgen.signature"].rsplit("|headline-v", 1)[0]
    client.set_tag(run.info.run_id, "loadgen.signature", files_only)
    older = _cli("export", "mlflow", str(runs["base"]), "--tracking-uri", uri, "--experiment", "t")
    assert "1 exported, 0 unchanged" in older.stdout, older.stdout


@pytest.mark.slow
def test_export_mlflow_skips_an_unreadable_run_and_exports_the_others(runs, tmp_path):
    """Was: the first unreadable run directory (a cut manifest, its request rows removed) stopped the export with
    one line, the runs after it not exported; now each such run is skipped with one line naming it and why, the
    readable ones are exported, and the export exits 2."""
    mlflow = pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'loadgen[mlflow]')")
    root = _unreadable_archive(runs["base"], tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    dirs = [str(root / "cut"), str(root / "emptied"), str(runs["base"])]
    res = _cli("export", "mlflow", *dirs, "--tracking-uri", uri, "--experiment", "t", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    skipped = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped ")]
    assert len(skipped) == 2, res.stderr
    assert skipped[0].startswith(f"skipped {root / 'cut'}: ") and "manifest.json: invalid JSON" in skipped[0]
    assert skipped[1].startswith(f"skipped {root / 'emptied'}: ") and "0 rows: expected" in skipped[1]
    assert "1 exported, 0 unchanged, 2 skipped (unreadable)" in res.stdout
    client = mlflow.tracking.MlflowClient(uri)
    exported = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert [r.data.tags["loadgen.path"] for r in exported] == [str(runs["base"].resolve())]


def test_pareto_front_marks_the_slower_engine_dominated(runs):
    res = _cli("runs", "pareto", str(runs["base"]), str(runs["slower"]), "--class", "short-message")
    lines = {ln.split("(")[-1].rstrip(")"): ln for ln in res.stdout.splitlines()[1:]}
    base, slower = lines[str(runs["base"])], lines[str(runs["slower"])]
    assert base.lstrip().startswith("*") and not slower.lstrip().startswith("*")  # same work, longer TTFT p99
    assert "config.name=interactive-small-batch-slower" in slower  # labelled by what differs


@pytest.mark.slow
def test_plan_writes_interactive_latency_throughput_curves(tmp_path):
    plan = REPO / "scenarios" / "plans" / "quick.toml"
    _cli("plan", str(plan), "--sim-worksheet", "interactive-small-batch", "--out", str(tmp_path / "plan"))
    page = (tmp_path / "plan" / "region.html").read_text()
    region = json.loads((tmp_path / "plan" / "region.json").read_text())
    assert "hard TTFT p99 budget 1500 ms" in page  # the canonical short-message budget
    for b in region["classes"]["short-message"]["warm"]["boundary"]:
        if b["max_inside_completed_rps"] is not None:
            assert f"warm c{b['concurrency']} boundary" in page
    ran = [c for c in region["classes"]["short-message"]["warm"]["cells"] if c["completed_rps"] is not None]
    assert ran and all(c["cell_id"] in page for c in ran)
    # the catalog of a plan: its row (kind plan) and its cells' runs (plan_cell) conform to the published schemas
    cat = tmp_path / "cat.duckdb"
    _cli("runs", "--catalog", str(cat), "index", str(tmp_path / "plan"))
    rows = json.loads(_cli("runs", "--catalog", str(cat), "list", "--json").stdout)
    assert_valid("runs-list", rows)
    assert {r["kind"] for r in rows} == {"run", "plan"} and any(r["plan_cell"] for r in rows)
    shown = json.loads(_cli("runs", "--catalog", str(cat), "show", str(tmp_path / "plan"), "--json").stdout)
    assert_valid("runs-show", shown)
    rows[0]["surprise"] = 1
    assert any("surprise" in e for e in schema_errors("runs-list", rows))


def test_a_catalog_of_another_layout_is_one_line_under_json(runs, tmp_path):
    """A catalog whose runs table lacks a published column (written by another loadgen) is refused in one line by
    `runs list --json` and `runs show --json`, where the table view still lists it."""
    cat = tmp_path / "cat.duckdb"
    _cli("runs", "--catalog", str(cat), "index", str(runs["base"]))
    with duckdb.connect(str(cat)) as db:
        db.execute("ALTER TABLE runs DROP COLUMN cpu_model")
    assert "base" in _cli("runs", "--catalog", str(cat), "list").stdout
    for args in (["list", "--json"], ["show", "base", "--json"]):
        res = _cli("runs", "--catalog", str(cat), *args, check=False)
        assert res.returncode == 2 and res.stdout == "", res.stderr
        assert f"{cat}: " in res.stderr and "cpu_model: Field required" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_the_catalog_result_models_name_every_column():
    """The published rows are the catalog's columns: a column added to the tables without its model fails here
    (and the CLI refuses to print it)."""
    from loadgen.runs.catalog import _CLASS_COLUMNS, LIVE_COLUMNS, RUN_COLUMNS
    from loadgen.runs.catalog_result import CatalogClass, CatalogRun

    assert list(CatalogRun.model_fields) == [*RUN_COLUMNS, *(c for c in LIVE_COLUMNS if c not in RUN_COLUMNS)]
    assert list(CatalogClass.model_fields) == list(_CLASS_COLUMNS)


@pytest.mark.browser
def test_the_diff_report_opens_offline_in_headless_chromium(runs, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("headless Chromium not installed (apt-get install -y chromium)")
    page = tmp_path / "diff.html"
    _cli("diff", str(runs["base"]), str(runs["slower"]), "--html", str(page))
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    errors = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln and ("Uncaught" in ln or "Error" in ln)]
    assert not errors, errors
    assert 'class="plotly-graph-div' in dom.stdout and "main-svg" in dom.stdout  # Plotly drew its figures
    assert "regressed" in dom.stdout


def test_the_error_share_interval_is_newcombes_hybrid_score():
    """Newcombe (1998, Stat. Med. 17:873, table II, method 10) by hand: 56/70 - 48/80 = 0.175, [0.0524, 0.3339];
    9/10 - 3/10 = 0.6, [0.1705, 0.8090]; 5/56 - 0/29 = 0.0893, [-0.0381, 0.1926]."""
    from loadgen.stats.confidence import newcombe_interval, wilson_interval

    for (k1, n1, k2, n2), (lo, hi) in (
        ((48, 80, 56, 70), (0.0524, 0.3339)),
        ((3, 10, 9, 10), (0.1705, 0.8090)),
        ((0, 29, 5, 56), (-0.0381, 0.1926)),
    ):
        got = newcombe_interval(k1, n1, k2, n2)
        assert got is not None and abs(got[0] - lo) < 5e-5 and abs(got[1] - hi) < 5e-5
    # the construction itself, from the two Wilson intervals: d - sqrt((p2-l2)^2+(u1-p1)^2), d + sqrt(...)
    (l1, u1), (l2, u2) = wilson_interval(48, 80), wilson_interval(56, 70)
    d = 0.8 - 0.6
    expected = (d - ((0.8 - l2) ** 2 + (u1 - 0.6) ** 2) ** 0.5, d + ((u2 - 0.8) ** 2 + (0.6 - l1) ** 2) ** 0.5)
    assert newcombe_interval(48, 80, 56, 70) == pytest.approx(expected, abs=1e-12)
    assert newcombe_interval(0, 0, 1, 2) is None


@pytest.mark.slow
def test_a_candidate_that_fails_a_third_of_its_requests_reads_regressed(runs, tmp_path):
    """Was: failed requests are in no latency sample, so a candidate failing a third of its requests read
    INCONCLUSIVE or "improved" with only a note; now each class has an error_share row, and it regresses."""
    failing = _worksheet(tmp_path, _trace(runs["tmp"], 1), "failing", _failing_engine(tmp_path, 0.33))
    res = _cli(
        "diff", str(runs["base"]), str(failing), "--fail-on", "regression", "--json", str(tmp_path / "d.json"),
        check=False,
    )  # fmt: skip
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr
    data = json.loads((tmp_path / "d.json").read_text())
    assert_valid("diff", data)
    share = {r["request_class"]: r for r in data["rows"] if r["metric"] == "error_share"}
    assert set(share) == {"short-message", "long-thread", "burst"}
    big = share["short-message"]
    assert big["quantile"] == "share" and big["base"] == 0.0 and big["failed"][0] == 0
    assert big["candidate"] == big["failed"][1] / big["n_candidate"] > 0.2
    assert big["verdict"] == "regressed" and big["interval"][0] > 0.01 and big["threshold_pp"] == 1.0
    # its level is the rows' Bonferroni level: K counts the 3 error-share rows with the 27 quantile rows
    assert data["row_level"] == pytest.approx(1 - 0.05 / 30)
    assert "error_share" in res.stdout and "REGRESSED" in res.stdout
    # an absolute threshold beyond what is possible: no row can regress on the share any more
    _cli("diff", str(runs["base"]), str(failing), "--threshold", "error_share=100", "--json", str(tmp_path / "e.json"))
    lenient = json.loads((tmp_path / "e.json").read_text())["rows"]
    assert all(r["verdict"] != "regressed" for r in lenient if r["metric"] == "error_share")


@pytest.mark.slow
def test_equal_failure_shares_do_not_regress(runs, tmp_path):
    """Two seeds of one engine that fails 10% of its requests: the error_share rows must not flag it."""
    pair = [
        _worksheet(tmp_path, _trace(runs["tmp"], 1), f"fail10-{seed}", _failing_engine(tmp_path, 0.1, seed))
        for seed in (1, 2)
    ]
    _cli(
        "diff", *map(str, pair), "--fail-on", "regression", "--json", str(tmp_path / "d.json"),
        "--variable", "target.engine",
    )  # fmt: skip
    rows = [r for r in json.loads((tmp_path / "d.json").read_text())["rows"] if r["metric"] == "error_share"]
    assert rows and all(r["verdict"] != "regressed" for r in rows)
    assert sum(r["failed"][0] for r in rows) > 0 and sum(r["failed"][1] for r in rows) > 0


@pytest.mark.slow
def test_the_scenario_sets_the_diff_thresholds_and_the_flag_overrides(runs, tmp_path):
    scenario = tmp_path / "lenient.toml"
    scenario.write_text(SCENARIO.read_text() + "\n[regression]\nthresholds_pct = { tpot_ms = 200.0 }\n")
    trace = tmp_path / "t.parquet"
    _cli("trace", "generate", str(scenario), "--trace", "steady", "--seed", "1", "--out", str(trace))
    pair = []
    for name, engine in (("b", ENGINE), ("c", _slower_engine(tmp_path, 1.5))):
        _cli(
            "sim",
            "run",
            str(trace),
            "--engine",
            str(engine),
            "--scenario",
            str(scenario),
            "--out",
            str(tmp_path / name),
        )
        pair.append(str(tmp_path / name))
    data = json.loads(
        _cli("diff", *pair, "--json", str(tmp_path / "d.json")).stdout and (tmp_path / "d.json").read_text()
    )
    tpot = [r for r in data["rows"] if r["metric"] == "tpot_ms" and r["verdict"] is not None]
    assert tpot and all(r["threshold_pct"] == 200.0 and r["verdict"] != "regressed" for r in tpot)
    _cli("diff", *pair, "--threshold", "tpot_ms=5", "--json", str(tmp_path / "d2.json"))
    flagged = json.loads((tmp_path / "d2.json").read_text())["rows"]
    assert any(r["metric"] == "tpot_ms" and r["verdict"] == "regressed" for r in flagged)
    bad = tmp_path / "bad.toml"
    bad.write_text(SCENARIO.read_text() + "\n[regression]\nthresholds_pct = { ttft_ms = -1.0 }\n")
    res = _cli("scenario", "check", str(bad), check=False)
    assert res.returncode == 2 and "regression.thresholds_pct" in res.stderr and "Traceback" not in res.stderr


def _unreadable_archive(base: Path, tmp_path: Path) -> Path:
    """An archive of two unreadable copies of ``base``: ``cut`` (its manifest cut short) and ``emptied`` (its
    request rows removed)."""
    root = tmp_path / "archive"
    for name in ("cut", "emptied"):
        shutil.copytree(base, root / name)
    manifest = root / "cut" / "manifest.json"
    manifest.write_text(manifest.read_text()[:300])
    for part in (root / "emptied" / "requests.parquet").iterdir():
        part.unlink()
    return root


def _catalog(tmp: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _cli("runs", "--catalog", str(tmp / "cat.duckdb"), *args, check=check)


def _listed(tmp: Path, *args: str) -> dict[str, dict]:
    return {Path(r["path"]).name: r for r in json.loads(_catalog(tmp, "list", "--json", *args).stdout)}


def test_list_and_show_say_what_changed_on_disk_since_the_last_index(runs, tmp_path):
    """A run deleted, moved or rewritten since the last index is said to be so by list and show (and --where
    sees it), never shown as present with its old figures; a run moved back is present again at the next index.
    Before, list said present until the next index, show gave a rewritten run's old figures as current, and a
    run that came back stayed present = false for good."""
    root = tmp_path / "archive"
    for name in ("base", "slower", "seed2"):
        shutil.copytree(runs[name], root / name)
    _catalog(tmp_path, "index", str(root))
    shutil.move(root / "slower", tmp_path / "away")
    shutil.rmtree(root / "seed2")
    shutil.copytree(runs["base"], root / "seed2")  # the same name run again: other figures, same path
    rows = _listed(tmp_path)
    assert rows["slower"]["present"] is False and rows["seed2"]["current"] is False
    assert rows["base"]["present"] is True and rows["base"]["current"] is True
    text = _catalog(tmp_path, "list").stdout
    assert "slower" in text.split("MISSING")[0].splitlines()[-1]
    assert "seed2" in text.split("CHANGED since indexed")[0].splitlines()[-1]
    assert list(_listed(tmp_path, "--where", "not present")) == ["slower"]
    assert "CHANGED since indexed" in _catalog(tmp_path, "show", str(root / "seed2")).stdout
    again = _catalog(tmp_path, "index", str(root)).stdout
    assert "0 added, 1 updated, 1 unchanged, 1 missing" in again, again
    assert _listed(tmp_path)["seed2"]["trace_seed"] == 1 and _listed(tmp_path)["seed2"]["current"] is True
    shutil.move(tmp_path / "away", root / "slower")  # back where it was indexed
    back = _catalog(tmp_path, "index", str(root)).stdout
    assert "0 added, 1 updated, 2 unchanged" in back, back
    assert json.loads(_catalog(tmp_path, "list", "--where", "not present", "--json").stdout) == []
    stored = duckdb.connect(str(tmp_path / "cat.duckdb"), read_only=True)
    assert stored.execute("SELECT count(*) FROM runs WHERE NOT present").fetchone()[0] == 0


def test_a_run_whose_writer_died_is_catalogued_as_killed(runs, tmp_path):
    """A manifest still saying running whose writer is gone is a killed run to the catalog, as to analyze; it
    said running, forever (the files of a dead run never change, so it was never read again)."""
    run = tmp_path / "archive" / "killed"
    shutil.copytree(runs["base"], run)
    manifest = json.loads((run / "manifest.json").read_text())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    manifest["state"] = "running"
    manifest["writer"] = (manifest.get("writer") or {}) | {"pid": dead.pid, "process_start_s": 0.0}
    (run / "manifest.json").write_text(json.dumps(manifest))
    _catalog(tmp_path, "index", str(run.parent))
    assert _listed(tmp_path)["killed"]["state"] == "killed"
    assert "state: killed" in _catalog(tmp_path, "show", str(run)).stdout


def test_a_second_catalog_user_waits_for_the_first(runs, tmp_path):
    """`runs list` (or a second `runs index`) while another process holds the catalog waits for it; it failed
    at once with DuckDB's 'Could not set lock on file' (exit 2)."""
    _catalog(tmp_path, "index", str(runs["base"]))
    holder = duckdb.connect(str(tmp_path / "cat.duckdb"))  # as a long `runs index` in another process would
    cmd = [sys.executable, "-m", "loadgen", "runs", "--catalog", str(tmp_path / "cat.duckdb"), "list", "--json"]
    waiting = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        waiting.wait(timeout=8)  # the lock is held: it waits (it used to give up at once, exit 2)
    except subprocess.TimeoutExpired:
        pass
    holder.close()
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert [Path(r["path"]).name for r in json.loads(out)] == ["base"]


def test_a_file_that_is_no_run_catalog_is_refused_and_left_alone(tmp_path, runs):
    """--catalog naming another DuckDB database: one line, exit 2, and index writes nothing into it. It said
    "--where None: Catalog Error: Table with name runs does not exist!", and index added its tables to it."""
    other = tmp_path / "warehouse.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE sales (amount INTEGER)")
    con.close()
    for args in (["list"], ["show", "base"], ["index", str(runs["base"])]):
        res = _cli("runs", "--catalog", str(other), *args, check=False)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "not a run catalog (tables: sales)" in res.stderr
    con = duckdb.connect(str(other), read_only=True)
    assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [("sales",)]


def test_a_catalog_of_an_older_version_says_its_figures_are_stale_and_is_read_again(runs, tmp_path):
    """A catalog indexed by a loadgen whose figures were defined otherwise: list says every row changed, and
    the next index reads every directory again (it kept the old figures as unchanged)."""
    _catalog(tmp_path, "index", str(runs["base"]))
    con = duckdb.connect(str(tmp_path / "cat.duckdb"))
    con.execute("UPDATE catalog_info SET value = '1' WHERE key = 'schema_version'")
    con.close()
    assert _listed(tmp_path)["base"]["current"] is False
    assert "0 added, 1 updated, 0 unchanged" in _catalog(tmp_path, "index", str(runs["base"])).stdout
    assert _listed(tmp_path)["base"]["current"] is True


_SOLO = """name = "solo"
seed = 7
[classes.chat]
share = 1.0
stream = true
input_tokens = { dist = "uniform", low = 50, high = 200 }
output_tokens = { dist = "uniform", low = 20, high = 60 }
[traces.steady]
process = "poisson"
rate_rps = 10.0
duration_s = 4
max_in_flight = 64
"""


def test_diff_refuses_runs_with_no_class_in_common(runs, tmp_path):
    """Even with --allow-differences, runs of two workloads with no class in common compare nothing: one line,
    exit 2. It printed an empty table with the verdict INCONCLUSIVE (exit 0)."""
    scenario = tmp_path / "solo.toml"
    scenario.write_text(_SOLO)
    trace = tmp_path / "solo.parquet"
    _cli("trace", "generate", str(scenario), "--trace", "steady", "--seed", "1", "--out", str(trace))
    solo = tmp_path / "solo"
    _cli("sim", "run", str(trace), "--engine", str(ENGINE), "--scenario", str(scenario), "--out", str(solo))
    res = _cli("diff", str(runs["base"]), str(solo), "--allow-differences", check=False)
    assert res.returncode == 2 and res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "no request class in common (base: burst, long-thread, short-message; candidate: chat)" in res.stderr


def test_diff_says_when_a_side_did_not_complete(runs, tmp_path):
    """A run that stopped early (interrupted, killed) is compared up to its stop: the diff says so, naming the
    run and how much of its schedule it recorded. It said nothing."""
    stopped = tmp_path / "stopped"
    shutil.copytree(runs["slower"], stopped)
    manifest = json.loads((stopped / "manifest.json").read_text())
    manifest["state"] = "interrupted"
    (stopped / "manifest.json").write_text(json.dumps(manifest))
    res = _cli("diff", str(runs["base"]), str(stopped))
    recorded, scheduled = manifest["requests_recorded"], manifest["scheduled_requests"]
    note = f"note: {stopped}: interrupted run ({recorded} request(s) recorded of {scheduled} scheduled)"
    assert note in res.stdout, res.stdout[-600:]
    assert str(runs["base"]) + ": " not in res.stdout  # the complete side gets no such note


def test_pareto_over_a_plans_cells_labels_each_point_by_its_cell(tmp_path):
    """The runs of a plan differ in their cell (concurrency, rate step), which the identity leaves out: every
    point was labelled by its directory name ('rep1', five times over). Each now names its cell."""
    plan = tmp_path / "quick"
    _cli("plan", "quick", "--sim-worksheet", "interactive-small-batch", "--out", str(plan), "--quiet")
    cells = sorted((plan / "cells").glob("*/rep1"))
    assert len(cells) >= 3
    res = _cli("runs", "pareto", *map(str, cells))
    lines = [ln for ln in res.stdout.splitlines()[1:] if ln.strip()]
    labels = [ln.split(" ms  ", 1)[1].rsplit("  (", 1)[0] for ln in lines]
    assert len(set(labels)) == len(cells), labels
    for label, line in zip(labels, lines):
        cell = line.rsplit("(", 1)[1].rstrip(")")
        cell_id = Path(cell).parent.name  # short-message.warm.c8.r2: concurrency 8
        concurrency = cell_id.split(".")[2].removeprefix("c")
        assert f"plan_cell.concurrency={concurrency}" in label and "plan_cell.rate_step=" in label, label


def test_show_matches_whole_path_components_and_names_the_ambiguous_ones(runs, tmp_path):
    """`runs show base` is .../base, not also .../rebase; `show slower` with two such runs names both. It matched
    any string ending ('base' was ambiguous with 'rebase'; '_' was a LIKE wildcard) and named no match."""
    root = tmp_path / "archive"
    for name in ("base", "rebase"):
        shutil.copytree(runs["base"], root / name)
    for where in ("a", "b"):
        shutil.copytree(runs["slower"], root / where / "slower")
    _catalog(tmp_path, "index", str(root))
    cwd = tmp_path / "elsewhere"  # no ./base here: the name is looked up in the catalog
    cwd.mkdir()

    def show(key: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "loadgen", "runs", "--catalog", str(tmp_path / "cat.duckdb"), "show", key]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)

    assert show("base").stdout.splitlines()[0] == f"run {root / 'base'}"
    assert show("rebase").stdout.splitlines()[0] == f"run {root / 'rebase'}"
    ambiguous = show("slower")
    assert ambiguous.returncode == 2 and len(ambiguous.stderr.strip().splitlines()) == 1
    assert f"2 catalogued runs match ({root / 'a' / 'slower'}, {root / 'b' / 'slower'})" in ambiguous.stderr
    assert show("b/slower").stdout.splitlines()[0] == f"run {root / 'b' / 'slower'}"
    assert show("ase").returncode == 2 and show("b_slower").returncode == 2


def test_index_tells_a_moved_run_from_a_deleted_one(runs, tmp_path):
    """A run moved within the indexed roots is reported as moved, with where it is now; a deleted one is not.
    Both were 'missing (moved or deleted)'."""
    root = tmp_path / "archive"
    for name in ("base", "slower"):
        shutil.copytree(runs[name], root / name)
    _catalog(tmp_path, "index", str(root))
    shutil.move(root / "base", root / "2026-12" / "base-renamed")
    shutil.rmtree(root / "slower")
    out = _catalog(tmp_path, "index", str(root)).stdout
    assert "1 added, 0 updated, 0 unchanged, 2 missing (1 moved, 1 deleted or out of reach" in out, out
    moved = f"  missing: {root / 'base'} (moved: the same run is catalogued at {root / '2026-12' / 'base-renamed'})"
    assert moved in out.splitlines() and f"  missing: {root / 'slower'}" in out.splitlines()


def test_an_unreadable_run_is_listed_as_such_and_keeps_what_could_be_read(runs, tmp_path):
    """A run whose manifest is cut short, or whose requests were removed, is listed with its problem; one whose
    manifest reads keeps its identity (found by --where engine = ...). list printed a bare path for both, and
    the second lost its identity."""
    root = _unreadable_archive(runs["base"], tmp_path)
    indexed = _catalog(tmp_path, "index", str(root))
    assert "2 unreadable" in indexed.stdout and indexed.returncode == 0
    lines = _catalog(tmp_path, "list").stdout.splitlines()
    cut = next(ln for ln in lines if ln.split()[1:2] == [str(root / "cut")])
    emptied = next(ln for ln in lines if ln.split()[1:2] == [str(root / "emptied")])
    assert "[UNREADABLE: " in cut and "manifest.json: invalid JSON" in cut, cut
    assert "[UNREADABLE: " in emptied and "0 rows: expected" in emptied, emptied
    found = _listed(tmp_path, "--where", "engine = 'loadgen-sim'")
    assert list(found) == ["emptied"] and found["emptied"]["trace_seed"] == 1


def test_a_run_path_that_is_not_utf8_is_reported_not_a_traceback(runs, tmp_path):
    """A run directory named with undecodable bytes is listed as unreadable and the rest is indexed; `runs show`
    of such a name, or of '' / '/', is refused in one line. Before: index died with a UnicodeEncodeError traceback
    (nothing recorded) and show blamed a '--where None' nobody passed."""
    import os

    root = tmp_path / "archive"
    shutil.copytree(runs["base"], root / "base")
    odd = os.fsencode(root) + b"/bad\xffname"
    shutil.copytree(runs["slower"], os.fsdecode(odd))
    res = _catalog(tmp_path, "index", str(root))
    assert "Traceback" not in res.stderr and "1 added, 0 updated, 0 unchanged, 1 unreadable" in res.stdout
    assert f"  unreadable: {root}/bad\\xffname: its path is not UTF-8 text: expected one (rename it)" in res.stdout
    assert set(_listed(tmp_path)) == {"base"}
    for key in (os.fsdecode(odd), "", "/"):
        cmd = [sys.executable, "-m", "loadgen", "runs", "--catalog", str(tmp_path / "cat.duckdb"), "show", key]
        shown = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert shown.returncode == 2 and shown.stderr.count("\n") == 1 and "Traceback" not in shown.stderr
        assert (
            "expected a run's path or the end of one, as UTF-8 text" in shown.stderr and "--where" not in shown.stderr
        )


def _bad_uris(tmp: Path) -> dict[str, tuple[str, str]]:
    """Tracking URIs MLflow cannot record to, each with the words of its refusal."""
    (tmp / "notes.txt").write_text("not a database")
    return {
        "garbage": ("garbage-uri", "expected sqlite:///PATH"),
        "bare-file": (str(tmp / "notes.txt"), "expected sqlite:///PATH"),
        "file-scheme": ((tmp / "store").as_uri(), "expected sqlite:///PATH"),
        "sqlite-not-db": (f"sqlite:///{tmp / 'notes.txt'}", "is no SQLite database"),
        "sqlite-dir": (f"sqlite:///{tmp}", "is a directory"),
        "sqlite-no-dir": (f"sqlite:///{tmp / 'none' / 'm.db'}", "is in no existing directory"),
        "http-refused": ("http://127.0.0.1:9", "MLflow could not record"),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["garbage", "bare-file", "file-scheme", "sqlite-not-db", "sqlite-dir", "sqlite-no-dir", "http-refused"]
)
def test_export_mlflow_refuses_a_tracking_uri_it_cannot_record_to_in_one_line(runs, tmp_path, case):
    """Was: MLflow's own retries (37 lines of them for a directory, minutes for a refused port) or a file store it
    will not update; a URI of one directory it could not write left nothing usable either. Now: one line, exit
    2, the file it named untouched and no store created."""
    pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'loadgen[mlflow]')")
    uri, said = _bad_uris(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    res = _cli("export", "mlflow", str(runs["base"]), "--tracking-uri", uri, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and said in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "notes.txt").read_text() == "not a database"


@pytest.mark.slow
@pytest.mark.parametrize(("field", "value"), [("duration_s", -1), ("trace", []), ("status_counts", {"ok": -3})])
def test_export_mlflow_of_only_damaged_runs_leaves_no_store(runs, tmp_path, field, value):
    """Was: every run skipped, yet an empty MLflow store (tables, an experiment) was created and MLflow's INFO lines
    were on stderr; now the one skipped line, exit 2, and no store file."""
    pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'loadgen[mlflow]')")
    run = tmp_path / "run"
    shutil.copytree(runs["base"], run)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, field: value}))
    res = _cli("export", "mlflow", str(run), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith(f"skipped {run}: ") and res.stderr.count("\n") == 1 and field in res.stderr
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "mlflow-artifacts").exists()


@pytest.mark.slow
def test_export_mlflow_skips_a_plan_whose_plan_json_is_damaged(runs, tmp_path):
    pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'loadgen[mlflow]')")
    plan = tmp_path / "plan"
    shutil.copytree(runs["base"], plan / "cells" / "c0" / "rep0")
    (plan / "plan.json").write_text('{"kind": "loadgen.plan", "version": "x"}')
    res = _cli("export", "mlflow", str(plan), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith(f"skipped {plan}: {plan / 'plan.json'}: ") and res.stderr.count("\n") == 1
    assert not (tmp_path / "m.db").exists()
