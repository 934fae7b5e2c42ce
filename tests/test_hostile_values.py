"""A hostile or odd server never costs a row, a secret or a hang: the second pass (values inside well-formed
answers, secrets said back escaped, commands besides ``loadgen run``).

Every case runs the real command against ``tests/hostile_server.py`` over loopback. The subprocess timeouts
only keep a regression from hanging the suite; no assertion is about time.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.parse
from pathlib import Path

import pytest
from hostile_server import MODEL, ODD_VALUES, hostile_server, read_record
from test_hostile_targets import PLAN, PLAN_SCENARIO, all_bytes, cli, run, trace  # noqa: F401 (trace: a fixture)

from loadgen.rundir.io import load_run

# The hostile-server tier (each test starts a misbehaving server process and runs the real CLI against it).
pytestmark = pytest.mark.slow

#: A key with a ``/`` (as base64 keys have): PHP's json_encode writes it back as ``\/``.
SLASH_KEY = "hk-Qz8vTq3W/mX7pLr2NcY5dKfh"
#: What each odd value (``ODD_VALUES``) makes of its request: (status, error_kind, a piece of the message).
EXPECTED = {
    "created-string": ("ok", None, None),
    "logprobs-monster": ("ok", None, None),
    "id-2MiB": ("error", "malformed_sse", "exceeds the cap"),
    "model-deep": ("error", "malformed_sse", "nested too deep"),
    "finish-deep": ("error", "malformed_sse", "nested too deep"),
    "error-deep": ("error", "malformed_sse", "nested too deep"),
}


#: The shipped contract cases, replayed against a hostile server.
CASES = Path(__file__).resolve().parents[1] / "scenarios" / "contract" / "canonical.toml"


def replay(
    cases: Path, base_url: str, out: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``loadgen contract replay`` of ``cases`` against ``base_url`` into ``out``, with ``args`` after the target."""
    return cli("contract", "replay", cases, "--target", base_url, "--model", MODEL, *args, "--out", out, env=env)


def said_forms(secret: str) -> dict[str, str]:
    """The forms a server may say ``secret`` back in, by name."""
    return {
        "as sent": secret,
        "upper-cased": secret.upper(),
        "lower-cased": secret.lower(),
        "\\u-escaped": "".join(f"\\u{ord(c):04x}" for c in secret),
        "\\/-escaped": secret.replace("/", "\\/"),
        "percent-encoded": urllib.parse.quote(secret, safe=""),
        "base64": base64.b64encode(secret.encode()).decode()[:-4],
    }


def assert_not_said(stored: str, secret: str) -> None:
    for name, form in said_forms(secret).items():
        assert form not in stored and json.dumps(form)[1:-1] not in stored, f"{name}: {form}"


def odd_variants(record: Path) -> dict[str, str]:
    """prompt sha256 -> the odd value its answer carried (``odd-values``' record)."""
    return {
        str(e["prompt_sha256"]): str(e["variant"]).removeprefix("odd:")
        for e in read_record(record)
        if str(e.get("variant", "")).startswith("odd:")
    }


def test_odd_values_in_a_stream_cost_only_their_request(tmp_path: Path, trace: Path) -> None:  # noqa: F811
    """Usage counts negative, fractional, strings, booleans, 1e30 or 2^63, a ``created`` string, a 2 MiB
    ``id``, a delta that is a list, tool calls that are a string, reasoning that is a number, a logprobs
    monster, and values nested 1000 deep: each fails at most its own request, as ``malformed_sse``. Before, a
    deep ``model``, ``finish_reason`` or error message raised RecursionError, recorded as kind ``client``
    (loadgen's own fault)."""
    record = tmp_path / "record.jsonl"
    with hostile_server("odd-values", record) as server:
        out = run(trace, server.base_url, tmp_path / "run", "--model", MODEL)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    variants = odd_variants(record)
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == 12 and {variants[r["prompt_sha256"]] for r in rows} == {n for n, _ in ODD_VALUES[:12]}
    for row in rows:
        variant = variants[row["prompt_sha256"]]
        status, kind, message = EXPECTED.get(variant, ("error", "malformed_sse", ""))
        assert (row["status"], row["error_kind"]) == (status, kind), (variant, row)
        assert message is None or message in row["error_message"], (variant, row["error_message"])


@pytest.mark.parametrize("stream", [False, True])
def test_odd_values_in_a_contract_answer_fail_only_their_case(tmp_path: Path, stream: bool) -> None:
    """``loadgen contract replay`` read each answer with ``.get`` and ``json.loads``: a usage that is a list, a
    choice that is a number or JSON nested 1000 deep ended the whole replay in a traceback (exit 1, no
    contract.json). Now each answer is read as the run reads a chunk: that case fails, saying why."""
    cases = tmp_path / "cases.toml"
    lines = ['version = 1\nname = "odd"\ndescription = "one plain case per odd value"']
    for i in range(len(ODD_VALUES)):
        lines.append(
            f'[[cases]]\nid = "c{i:02d}"\ndescription = "plain"\nrequest.prompt = "Say {i}."\nrequest.max_tokens = 8'
        )
        lines.append('[[cases.checks]]\nkind = "control"\nmax_tokens = true')
    cases.write_text("\n".join(lines) + "\n")
    record = tmp_path / "record.jsonl"
    with hostile_server("odd-values", record) as server:
        out = replay(
            cases, server.base_url, tmp_path / "c.json", "--endpoint", "completions", *(["--stream"] if stream else [])
        )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr  # cases failed, in the result
    variants = {e["variant"].removeprefix("odd:") for e in read_record(record) if e["variant"].startswith("odd:")}
    assert variants == {name for name, _ in ODD_VALUES}
    result = json.loads((tmp_path / "c.json").read_text())["cases"]
    assert len(result) == len(ODD_VALUES)
    passed = [c for c in result if c["passed"]]
    failed = [c["observed"] for c in result if not c["passed"]]
    # the ones whose odd value is not read (created, logprobs; usage replaced by the stream's usage event)
    assert len(passed) == 3, [c["observed"] for c in result]
    assert all(o["text"] is None and o["http_status"] == 200 and o["error"] for o in failed), failed
    assert sum("nested too deep" in o["error"] for o in failed) == 3, failed


def test_a_plan_whose_contract_answers_are_odd_completes(tmp_path: Path) -> None:
    """``loadgen plan --target URL`` replays the scenario's contract in its warm cells: an odd answer (a JSON
    nested 1000 deep, a usage that is a list) ended the whole plan in a traceback (exit 1). Now those cases
    fail in the cell's contract.json and the plan completes."""
    cases = CASES
    (tmp_path / "scenario.toml").write_text(PLAN_SCENARIO + f'\n[behavior]\ncases = ["{cases}"]\n')
    plan = PLAN.replace("SCENARIO", str(tmp_path / "scenario.toml")).replace('states = ["cold"]', 'states = ["warm"]')
    (tmp_path / "plan.toml").write_text(plan.replace("requests = 0", "requests = 3"))
    with hostile_server("odd-values") as server:
        args = ("--target", server.base_url + "/v1", "--model", MODEL, "--out", tmp_path / "plan")
        out = cli("plan", tmp_path / "plan.toml", *args, timeout=180)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    (contract,) = (tmp_path / "plan" / "cells").rglob("contract.json")
    observed = [c["observed"] for c in json.loads(contract.read_text())["cases"]]
    assert len(observed) == 8 and any("nested too deep" in (o["error"] or "") for o in observed), observed


def test_a_key_said_back_escaped_or_in_another_case_is_redacted(tmp_path: Path, trace: Path) -> None:  # noqa: F811
    """A 401 body that writes the key ``\\u``-escaped, ``/`` as ``\\/`` (PHP) or upper-cased got it into
    ``error_message`` (requests.parquet) and contract.json: only the form as sent was replaced. The
    ``www-authenticate`` and ``set-cookie`` headers that carry it are not stored at all."""
    env = {"HOSTILE_KEY": SLASH_KEY}
    with hostile_server("echo-escaped") as server:
        out = run(trace, server.base_url, tmp_path / "run", "--api-key-env", "HOSTILE_KEY", env=env)
        replayed = replay(CASES, server.base_url, tmp_path / "c.json", "--api-key-env", "HOSTILE_KEY", env=env)
    assert out.returncode == 0, out.stderr
    assert replayed.returncode == 1 and "Traceback" not in replayed.stderr, replayed.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == 12 and {r["error_kind"] for r in rows} == {"http_4xx"}
    assert all(r["error_message"].count("REDACTED") == 3 for r in rows), rows[0]["error_message"]
    observed = [c["observed"]["error"] for c in json.loads((tmp_path / "c.json").read_text())["cases"]]
    assert observed and all(o.count("REDACTED") == 3 for o in observed), observed[0]
    stored = json.dumps(rows) + json.dumps(observed)
    stored += (all_bytes(tmp_path / "run") + out.stdout.encode() + out.stderr.encode()).decode("latin-1")
    stored += replayed.stdout + replayed.stderr
    assert_not_said(stored, SLASH_KEY)


@pytest.mark.parametrize(
    ("behaviour", "why"), [("tls-answer", "a TLS record"), ("h2-answer", "an HTTP/2 SETTINGS frame")]
)
def test_an_answer_that_is_not_http1_is_a_malformed_head(tmp_path: Path, trace: Path, behaviour: str, why: str) -> None:  # noqa: F811
    """An answer whose first bytes are not ``HTTP/``: a TLS alert and the close (an https:// server asked over
    http://) was recorded ``connect``, "Server disconnected without sending a response", as if nothing had
    answered; an HTTP/2-only server's SETTINGS frame held each request to its TTFT timeout (``ttft_timeout``).
    Both are ``malformed_head`` at once, saying which."""
    with hostile_server(behaviour) as server:
        out = run(trace, server.base_url, tmp_path / "run", "--model", MODEL)
    assert out.returncode == 0, out.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == 12
    for row in rows:
        assert (row["status"], row["error_kind"]) == ("error", "malformed_head"), row
        assert row["error_message"].startswith(f"answer is not HTTP/1.1 ({why}"), row["error_message"]


def test_a_metrics_answer_trickled_is_a_skipped_scrape(tmp_path: Path, trace: Path) -> None:  # noqa: F811
    """``/metrics`` announces its answer and sends it one byte a second: each scrape ends at its bound, is
    counted skipped (no answer), and every request is recorded."""
    with hostile_server("metrics-trickle") as server:
        out = run(trace, server.base_url, tmp_path / "run", "--model", MODEL, "--scrape-metrics", "on")
    assert out.returncode == 0, out.stderr
    data = load_run(tmp_path / "run")
    assert data.requests.column("status").to_pylist() == ["ok"] * 12
    scrapes = data.manifest.to_dict()["metrics_scrapes"]
    assert scrapes["stored"] == 0 and scrapes["skipped"]["no answer"] >= 1, scrapes


def test_calibrate_refuses_an_engine_count_that_is_none(tmp_path: Path) -> None:
    """``loadgen sim calibrate --target URL`` read ``/v1/models``' max_model_len with ``int()``: "4096 tokens"
    and ``[4096]`` were a traceback, -4096 went on to calibrate a nonsense engine. Each is now one line."""
    with hostile_server("models-odd-len") as server:
        for said in ('"4096 tokens"', "[4096]", "-4096", "1e+30", "true"):
            out = cli("sim", "calibrate", "--target", server.base_url, "--out", tmp_path / "e.toml", timeout=60)
            assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
            assert f"/v1/models: max_model_len = {said}: expected a whole number" in out.stderr, out.stderr
            assert not (tmp_path / "e.toml").exists()


def test_the_calibration_warm_up_keeps_the_url_secrets(tmp_path: Path) -> None:
    """The step-size sweep before a calibration joined its paths to the whole target URL and said the URL as
    given when it failed: its password and query values went to the console, and the query string was not
    sent (``/v1/models`` came back 404 from a gateway that needs it: KeyError 'data'). Now the query is sent
    with every request, as by every other client, and what is said of the URL is redacted."""
    password, code = "S3cretPassw0rdXYZ", "S1queryvalue1"
    record = tmp_path / "record.jsonl"
    with hostile_server("echo-all", record) as server:
        url = server.base_url.replace("http://", f"http://user:{password}@") + f"/v1?code={code}"
        out = cli("sim", "calibrate", "--target", url, "--out", tmp_path / "e.toml", timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "warm-up: HTTP 500 for a 1-token token-id prompt" in out.stderr, out.stderr  # echo-all's first POST
    assert password not in out.stdout + out.stderr and code not in out.stdout + out.stderr, out.stderr
    posts = [e for e in read_record(record) if e["method"] == "POST"]
    assert posts and all(str(e["target"]).endswith(f"?code={code}") for e in posts), posts


def test_a_key_across_a_cut_of_what_a_message_shows_is_not_kept_in_part(tmp_path: Path, trace: Path) -> None:  # noqa: F811
    """What a message shows of a server's value is cut before loadgen knows it holds a secret: a field of the
    wrong type at its first 60 characters of JSON, an in-stream error at 500. A key across that cut was kept in
    part (9 to 12 of its characters in ``error_message``, then in contract.json). Now no 8 characters of it."""
    env = {"HOSTILE_KEY": SLASH_KEY}
    with hostile_server("echo-cut") as server:
        out = run(trace, server.base_url, tmp_path / "run", "--model", MODEL, "--api-key-env", "HOSTILE_KEY", env=env)
        replayed = replay(
            CASES,
            server.base_url,
            tmp_path / "c.json",
            "--endpoint",
            "completions",
            "--stream",
            "--api-key-env",
            "HOSTILE_KEY",
            env=env,
        )
    assert out.returncode == 0 and replayed.returncode == 1 and "Traceback" not in replayed.stderr, replayed.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == 12 and {r["error_kind"] for r in rows} == {"http_5xx", "malformed_sse"}, rows[0]
    observed = [c["observed"]["error"] for c in json.loads((tmp_path / "c.json").read_text())["cases"]]
    stored = json.dumps([r["error_message"] for r in rows]) + json.dumps(observed) + out.stdout + out.stderr
    stored += (all_bytes(tmp_path / "run") + (tmp_path / "c.json").read_bytes()).decode("latin-1")
    for i in range(len(SLASH_KEY) - 7):
        assert SLASH_KEY[i : i + 8] not in stored, SLASH_KEY[i : i + 8]


BIG_PROMPTS = """name = "big"
seed = 3
[classes.big]
share = 1.0
input_tokens = { dist = "fixed", value = 1000000 }
output_tokens = { dist = "fixed", value = 6 }
[traces.steady]
process = "poisson"
rate_rps = 3
duration_s = 2
"""


def test_a_server_that_never_reads_the_body_costs_the_ttft_timeout(tmp_path: Path) -> None:
    """4 MB prompts to a server that reads each POST's head and never its body: the socket's buffers fill, and
    the request is still written without waiting; each ends at its TTFT timeout (``ttft_timeout``), every row
    is written."""
    (tmp_path / "big.toml").write_text(BIG_PROMPTS)
    made = cli("trace", "generate", tmp_path / "big.toml", "--trace", "steady", "--out", tmp_path / "t.parquet")
    assert made.returncode == 0, made.stderr
    with hostile_server("never-read") as server:
        out = run(tmp_path / "t.parquet", server.base_url, tmp_path / "run", "--model", MODEL, "--tokenizer", "chars:4")
    assert out.returncode == 0, out.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert rows and {(r["status"], r["error_kind"]) for r in rows} == {("timeout", "ttft_timeout")}, rows[0]
    assert all(r["sent_ns"] is not None for r in rows)


def test_a_detokenize_answer_that_is_no_text_is_not_used(tmp_path: Path, trace: Path) -> None:  # noqa: F811
    """``/detokenize`` answered ``{"prompt": ["odd", "text"]}``: the default tokenizer trial took ``str()`` of it
    as text, so the run used the target's tokenizer (``auto: server``) and would build prompts holding
    "['odd', 'text']". Now it is no text: the run sizes prompts with cl100k_base and says why."""
    with hostile_server("detokenize-odd") as server:
        out = run(trace, server.base_url, tmp_path / "run", "--model", MODEL)
    assert out.returncode == 0, out.stderr
    assert "/detokenize prompt is a JSON list: expected text" in out.stderr, out.stderr
    data = load_run(tmp_path / "run")
    assert data.manifest.to_dict()["driver"]["tokenizer"] == "auto: cl100k_base"
    assert data.requests.column("status").to_pylist() == ["ok"] * 12
