"""The central user story end to end through the real CLI: one trace against a local engine and against a
stand-in managed API (API key from the environment, another model name, a request quota answered with 429 +
Retry-After, a base URL under a path prefix), then ``managed compare``, ``compare``, a handoff bundle rerun
from another directory, and no trace of the key in any byte written or printed.

The local side is the simulated engine scraped with ``--scrape-metrics off`` (like a vLLM, whose /metrics has
no engine-busy time); the managed side is ``loadgen sim serve`` with a ``[managed]`` section.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from result_schemas import assert_valid

from loadgen.targets import launch_sim_server
from tests.cli_process import REPO, run_loadgen

KEY_ENV = "LOADGEN_TEST_WALK_KEY"
SECRET = "sk-WALKCANARY-5e1f0c9a8b7d"
PREFIX = "/openai"

MANAGED = f"""
[managed]
requests_per_minute = 6
response_models = ["gpt-walk-2026-01-15"]
system_fingerprints = ["fp_walk1"]
api_key_env = "{KEY_ENV}"
path_prefix = "{PREFIX}"
"""

pytestmark = pytest.mark.slow  # one ~20 s fixture: two 5 s runs against live simulated servers


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("walk")
    text = (REPO / "scenarios" / "canonical.toml").read_text().replace("duration_s = 60", "duration_s = 5")
    (tmp / "scenario.toml").write_text(text.replace('cases = ["contract/canonical.toml"]', "cases = []"))
    gen = run_loadgen(["trace", "generate", "scenario.toml", "--trace", "steady", "--out", "trace.parquet"], tmp)
    assert gen.returncode == 0, gen.stderr
    base = (REPO / "scenarios" / "engines" / "interactive-small-batch.toml").read_text()
    base = base.replace('name = "interactive-small-batch"', 'name = "managed-api"', 1)
    base = base.replace("fixed_ms = 6.0 ", "fixed_ms = 0.5 ", 1)  # a fast provider: more tokens per busy second
    engine = tmp / "managed-api.toml"
    engine.write_text(base.replace('model = "loadgen-sim"', 'model = "gpt-walk"', 1) + MANAGED)
    common = ["trace.parquet", "--scenario", "scenario.toml", "--progress", "off"]
    printed: list[str] = []
    with launch_sim_server("interactive-small-batch") as local:
        out = run_loadgen(
            ["run", *common, "--target", local.base_url, "--out", "local", "--scrape-metrics", "off"], tmp
        )
        assert out.returncode == 0, out.stderr
        printed.append(out.stdout + out.stderr)
    with launch_sim_server(str(engine), env={KEY_ENV: SECRET}) as managed:
        assert managed.base_url.endswith(PREFIX)  # the ready line gives the URL clients use, prefix included
        target = managed.base_url + "/v1"
        args = ["run", *common, "--target", target, "--model", "gpt-walk", "--api-key-env", KEY_ENV]
        out = run_loadgen([*args, "--vllm-extensions", "off", "--out", "managed"], tmp, **{KEY_ENV: SECRET})
        assert out.returncode == 0, out.stderr
        printed.append(out.stdout + out.stderr)
    return {"tmp": tmp, "printed": printed}


def _requests(run_dir: Path) -> list[dict[str, object]]:
    return pq.read_table(run_dir / "requests.parquet").to_pylist()


def test_a_base_url_under_a_path_prefix_posts_under_it(walk: dict[str, object]) -> None:
    """Before: the probes went to /openai/v1/models but every POST to /v1/completions (HTTP 404 for all)."""
    rows = _requests(Path(str(walk["tmp"])) / "managed")
    statuses = {(r["status"], r["http_status"]) for r in rows}
    assert ("ok", 200) in statuses, statuses
    assert not [r for r in rows if r["http_status"] == 404]
    assert any(r["http_status"] == 429 and r["retry_after_s"] for r in rows)
    manifest = json.loads((Path(str(walk["tmp"])) / "managed" / "manifest.json").read_text())
    assert manifest["target"]["base_url"].endswith(PREFIX)


def test_compare_ranks_every_candidate_on_one_throughput(walk: dict[str, object]) -> None:
    """Before: the managed stand-in's engine-busy capacity (153 tok/s) was set against the local engine's whole-run
    rate (24 tok/s), both called 'output tokens per second of engine busy time'."""
    tmp = Path(str(walk["tmp"]))
    out = run_loadgen(["compare", "local", "managed", "--allow-differences", "--out", "decision.json"], tmp)
    assert out.returncode == 0, out.stderr
    decision = json.loads((tmp / "decision.json").read_text())["decision"]
    assert decision["headline_throughput"]["basis"].startswith("output tokens/s over the whole run")
    assert "engine busy" not in out.stdout
    printed = walk["printed"]
    assert isinstance(printed, list)
    printed.append(out.stdout + out.stderr)


def _bundle_elsewhere(walk: dict[str, object], name: str) -> Path:
    """The managed run's handoff bundle, built, then unpacked from its tar.gz in another directory."""
    tmp = Path(str(walk["tmp"]))
    if not (tmp / "bundle.tar.gz").exists():
        out = run_loadgen(["handoff", "managed", "--out", "bundle"], tmp)
        assert out.returncode == 0, out.stderr
        printed = walk["printed"]
        assert isinstance(printed, list)
        printed.append(out.stdout + out.stderr)
    elsewhere = tmp / name
    elsewhere.mkdir()
    with tarfile.open(tmp / "bundle.tar.gz") as tar:
        tar.extractall(elsewhere, filter="data")
    verify = run_loadgen(["handoff", "verify", str(tmp / "bundle.tar.gz")], elsewhere)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return elsewhere


def test_rerun_of_a_managed_bundle_sends_the_key_the_run_read(walk: dict[str, object]) -> None:
    """Before: the rerun sent no key (every request HTTP 401, or 404 under the prefix) and said 'failure reproduced'."""
    elsewhere = _bundle_elsewhere(walk, "elsewhere")
    assert f"`{KEY_ENV}`" in (elsewhere / "bundle" / "README.md").read_text()
    out = run_loadgen(["handoff", "rerun", "bundle", "--out", "rerun"], elsewhere, **{KEY_ENV: SECRET})
    assert out.returncode == 0, out.stderr
    statuses = {r["http_status"] for r in _requests(elsewhere / "rerun")}
    assert 200 in statuses and not statuses & {401, 404}, statuses
    assert "failed requests: was http_429" in out.stdout
    assert "limit 0.01" in out.stdout  # the error-share limit, which printed as 0.0
    printed = walk["printed"]
    assert isinstance(printed, list)
    printed.append(out.stdout + out.stderr)


def test_a_rerun_failing_otherwise_is_not_the_failure_reproduced(walk: dict[str, object]) -> None:
    """A rerun with a wrong key: the stand-in answers GET /v1/models 401 as a provider does, so it is refused before
    a request is sent (it used to run, every request HTTP 401, 'failure NOT reproduced'); a rerun whose requests
    fail of no kind the original's did is still not the failure reproduced."""
    from loadgen.handoff.rerun import failed_otherwise

    elsewhere = _bundle_elsewhere(walk, "wrong-key")
    args = ["handoff", "rerun", "bundle", "--out", "rerun", "--api-key-env", "WALK_WRONG_KEY"]
    out = run_loadgen(args, elsewhere, **{KEY_ENV: SECRET, "WALK_WRONG_KEY": "sk-not-the-key"})
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "GET /v1/models answered HTTP 401: expected a valid API key (--api-key-env)" in out.stderr
    assert "sk-not-the-key" not in out.stderr + out.stdout and not (elsewhere / "rerun").exists()
    assert failed_otherwise({"http_429": 9}, {"http_4xx": 21}) and not failed_otherwise(
        {"http_429": 9}, {"http_429": 2}
    )


def test_a_bundle_of_quota_failures_proposes_the_offered_rate(walk: dict[str, object]) -> None:
    """Before: a run failing on 429s was handed off with 'scheduler.max_num_batched_tokens 512 → 1024'."""
    elsewhere = _bundle_elsewhere(walk, "experiment")
    experiment = json.loads((elsewhere / "bundle" / "experiment.json").read_text())
    assert experiment["variable"] == "offered rate (loadgen run --rate-limit-rps)", experiment
    assert "HTTP 429" in experiment["hypothesis"]
    out = run_loadgen(["handoff", "rerun", "bundle", "--out", "rerun", "--experiment"], elsewhere)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "not an engine setting this command can apply" in out.stderr


def test_managed_compare_says_what_differs_besides_the_endpoint(walk: dict[str, object]) -> None:
    """Before: nothing said the sides served different models or that only one was sent ignore_eos (the options
    compared were the requested ones: auto vs off); the 429 warning said the tails included the rejections."""
    tmp = Path(str(walk["tmp"]))
    out = run_loadgen(["managed", "compare", "local", "managed", "--json", "managed.json", "--out", "managed.md"], tmp)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp / "managed.json").read_text())
    assert_valid("managed", data)  # the published schema (loadgen schema managed)
    assert data["kind"] == "loadgen.managed_comparison" and data["version"] == 1
    warnings = "\n".join(data["warnings"])
    assert "different models ('loadgen-sim' vs 'gpt-walk')" in warnings
    assert "ignore_eos was sent to the local side only" in warnings
    assert "latency percentiles are over the requests it served" in warnings
    assert data["managed"]["output_tokens"]["source"] == "server usage"
    assert data["local"]["trace"]["sha256"] == data["managed"]["trace"]["sha256"]
    analysis = run_loadgen(["analyze", "local", "--json", "local-analysis.json"], tmp)
    assert analysis.returncode == 0, analysis.stderr
    ttft = json.loads((tmp / "local-analysis.json").read_text())["overall"]["metrics"]["ttft_ms"]
    assert data["local"]["latency_ms"]["overall"]["ttft_ms"]["p99"] == ttft["p99"]
    printed = walk["printed"]
    assert isinstance(printed, list)
    printed.append(out.stdout + out.stderr)


def test_no_byte_written_or_printed_holds_the_key(walk: dict[str, object]) -> None:
    """Every file the walk wrote (Parquet and the bundle's tar.gz decompressed included) and all it printed."""
    tmp = Path(str(walk["tmp"]))
    files = [p for p in tmp.rglob("*") if p.is_file()]
    assert len(files) > 20
    for path in files:
        data = path.read_bytes()
        assert SECRET.encode() not in data, path
        if path.suffix == ".parquet":
            assert SECRET not in str(pq.read_table(path).to_pylist()), path
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    extracted = tar.extractfile(member)
                    assert extracted is None or SECRET.encode() not in extracted.read(), (path, member.name)
    printed = walk["printed"]
    assert isinstance(printed, list) and len(printed) >= 2
    assert not [p for p in printed if SECRET in p]


def test_a_managed_api_is_not_priced_by_the_hour(walk: dict[str, object]) -> None:
    """Before: with the example price table the managed side matched its [default] usd_per_hour and was billed
    '2.5 USD/hour × run wall time', a price no provider charges."""
    tmp = Path(str(walk["tmp"]))
    prices = REPO / "scenarios" / "prices.toml"
    out = run_loadgen(["managed", "compare", "local", "managed", "--prices", prices, "--json", "priced.json"], tmp)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp / "priced.json").read_text())
    assert_valid("managed", data)  # with a cost on each side: per hour (local) and per token (managed)
    assert data["local"]["cost"]["total"] is not None  # the local engine: an hourly price applies
    managed = data["managed"]["cost"]
    assert managed["total"] is None and not managed["complete"], managed
    assert "basis" not in managed
    assert any("an hourly price does not apply" in w for w in data["warnings"])


def test_a_base_url_missing_the_prefix_is_refused_in_one_line(tmp_path: Path) -> None:
    """Before: the run went ahead and recorded every request as HTTP 404, exit 0."""
    engine = tmp_path / "prefixed.toml"
    engine.write_text(
        (REPO / "scenarios" / "engines" / "instant.toml").read_text() + '[managed]\npath_prefix = "/openai"\n'
    )
    gen = run_loadgen(
        ["trace", "generate", REPO / "scenarios" / "canonical.toml", "--trace", "steady", "--out", "t.parquet"],
        tmp_path,
    )
    assert gen.returncode == 0, gen.stderr
    with launch_sim_server(str(engine)) as server:
        root = server.base_url.removesuffix(PREFIX)
        out = run_loadgen(
            ["run", "t.parquet", "--target", root + "/v1", "--model", "loadgen-sim", "--out", "run"], tmp_path
        )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "answered HTTP 404" in out.stderr and "/openai/v1" in out.stderr
    assert not (tmp_path / "run").exists()
