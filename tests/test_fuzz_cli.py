"""Fuzzing the real command with mutated inputs (issue 12): scenario, engine and plan TOML, trace Parquet,
model ``config.json`` and run ``manifest.json``, each fed to a command that reads it, in a subprocess.

Every outcome must be one of: success (the mutation left the file valid: exit 0, or 3 for a plan whose
budget ran out), or exactly one stderr line ``loadgen: error: ...`` with exit 2 and no output left behind.
Never a traceback, never another exit code. Examples per input kind: ``LOADGEN_FUZZ_EXAMPLES`` (default 8,
about a minute in all on two cores; raise it locally to fuzz harder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_process import run_loadgen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.trace.io import TRACE_METADATA_KEY

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("LOADGEN_FUZZ_EXAMPLES", "8"))
pytestmark = pytest.mark.slow  # long fuzzing: every CLI on many mutated inputs (the slow tier, run by .ci/run)

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ---- hostile values ------------------------------------------------------------------------------------

HOSTILE_NUMBERS = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e308",
    "-1e308",
    "1e9",
    "2147483647",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999999",
    "0.5",
    "-0.0",
    "1e-308",
]
HOSTILE_TOML_VALUES = HOSTILE_NUMBERS + [
    '""',
    '"x"',
    '"' + "y" * 5000 + '"',
    "true",
    "[]",
    "[1, -2, 3]",
    "{}",
    '[[1], ["a"]]',
    '"\\u0000"',
    '{ dist = "fixed", value = -5 }',
]
HOSTILE_JSON: list[Any] = [
    None,
    True,
    -1,
    0,
    2**31 - 1,
    2**63,
    10**30,
    1e308,
    float("nan"),
    float("inf"),
    -0.5,
    "",
    "x" * 5000,
    [],
    [1, "a", None],
    {},
    {"a": {"b": [1]}},
    "\udcff",
]


def _numbers(text: str) -> list[re.Match[str]]:
    return list(re.finditer(r"(?<![\w.\"-])-?\d+(?:\.\d+)?(?:e-?\d+)?(?![\w\"])", text))


def _value_lines(text: str) -> list[re.Match[str]]:
    return list(re.finditer(r"(?m)^(\s*[\w.\"-]+\s*=\s*)(.+)$", text))


@st.composite
def mutated_toml(draw: st.DrawFn, text: str) -> bytes:
    """A TOML file with one to three hostile edits: a number, a whole value, a line dropped, or raw bytes."""
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["number", "value", "drop", "bytes"]))
        if kind == "number" and _numbers(text):
            m = draw(st.sampled_from(_numbers(text)))
            text = text[: m.start()] + draw(st.sampled_from(HOSTILE_NUMBERS)) + text[m.end() :]
        elif kind == "value" and _value_lines(text):
            m = draw(st.sampled_from(_value_lines(text)))
            text = text[: m.start(2)] + draw(st.sampled_from(HOSTILE_TOML_VALUES)) + text[m.end(2) :]
        elif kind == "drop" and _value_lines(text):
            m = draw(st.sampled_from(_value_lines(text)))
            text = text[: m.start()] + text[m.end() :]
    raw = text.encode()
    if draw(st.integers(0, 9)) == 0:  # now and then: broken bytes
        cut = draw(st.integers(0, len(raw)))
        raw = raw[:cut] + draw(st.sampled_from([b"", b"\xff\xfe", b"\x00", b"[[[[", b"= = ="])) + raw[cut:]
    return raw


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:5]):
            out += _paths(v, (*prefix, i))
    return out


def _replace(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {**obj, head: _replace(obj[head], rest, value)}
    copy = list(obj)
    copy[head] = _replace(copy[head], rest, value)
    return copy


@st.composite
def mutated_json(draw: st.DrawFn, data: Any, *, top_level: bool = True) -> bytes:
    """JSON with hostile values at one to three paths (``top_level=False``: never the whole document)."""
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p or top_level]
        path = draw(st.sampled_from(paths))
        data = _replace(data, path, draw(st.sampled_from(HOSTILE_JSON)))
    raw = json.dumps(data).encode("utf-8", "surrogatepass")
    kind = draw(st.integers(0, 9))
    if kind == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif kind == 1:
        raw = b"[" * 50_000 + raw
    elif kind == 2:
        raw = raw.replace(b'"', b'"\xff', 1)
    return raw


# ---- running the command ---------------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(args: list[Any], work: Path, outputs: list[Path], ok_codes: tuple[int, ...] = (0,)) -> int:
    """Run ``loadgen ARGS``; assert a clean outcome; remove what a success wrote; return the exit code."""
    before = _snapshot(work)
    proc = run_loadgen(args, work, COLUMNS="200")
    err = proc.stderr
    assert "Traceback" not in err, f"{args}: traceback:\n{err[-3000:]}"
    assert proc.returncode in (*ok_codes, 2), f"{args}: exit {proc.returncode}:\n{err[-3000:]}"
    if proc.returncode == 2:
        lines = [line for line in err.splitlines() if not line.startswith("loadgen: warning:")]
        assert len(lines) == 1 and lines[0].startswith("loadgen: error: "), f"{args}: stderr:\n{err[-3000:]}"
        for out in outputs:
            assert not out.exists(), f"{args}: failed but left {out}"
        assert _snapshot(work) == before, f"{args}: failed but changed files under {work}"
    for out in outputs:
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
    return proc.returncode


# ---- fixtures: one valid input of each kind ------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-base")
    scenario = (
        (REPO / "scenarios" / "canonical.toml").read_text().replace('cases = ["contract/canonical.toml"]', "cases = []")
    )
    scenario = scenario.replace("rate_rps = 4.0\nduration_s = 60", "rate_rps = 4.0\nduration_s = 3", 1)
    (root / "s.toml").write_text(scenario)
    (root / "e.toml").write_text((REPO / "scenarios" / "engines" / "instant.toml").read_text())
    (root / "p.toml").write_text(
        (REPO / "scenarios" / "plans" / "quick.toml")
        .read_text()
        .replace('"../canonical.toml"', '"s.toml"')
        .replace("duration_s = 10", "duration_s = 2")
        .replace("rates_rps = [1, 2, 4, 8, 16]", "rates_rps = [2, 4]")
        .replace("repeats = 2", "repeats = 1")
        .replace("concurrency = [8, 64]", "concurrency = [8]")
    )
    shutil.copy(REPO / "loadgen" / "data" / "models" / "tiny-llama-gqa.json", root / "config.json")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args in (
        ["trace", "generate", "s.toml", "--trace", "steady", "--out", "t.parquet"],
        ["sim", "run", "t.parquet", "--engine", "e.toml", "--out", "run", "--scenario", "s.toml"],
    ):
        subprocess.run([sys.executable, "-m", "loadgen", *args], cwd=root, env=env, check=True, capture_output=True)
    return root


@pytest.fixture
def work(base: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "w"
    shutil.copytree(base, dest)
    return dest


def _fresh(work: Path, base: Path) -> Path:
    """Reset ``work`` to the base inputs (hypothesis reuses one function-scoped directory per test)."""
    shutil.rmtree(work)
    shutil.copytree(base, work)
    return work


# ---- the fuzz tests ----------------------------------------------------------------------------------------

SCENARIO_COMMANDS: list[Callable[[Path], tuple[list[Any], list[Path]]]] = [
    lambda w: (["scenario", "check", "m.toml"], []),
    lambda w: (["trace", "generate", "m.toml", "--trace", "steady", "--out", "o.parquet"], [w / "o.parquet"]),
    lambda w: (["analyze", "run", "--scenario", "m.toml", "--quiet", "--json", "a.json"], [w / "a.json"]),
]


@FUZZ
@given(data=st.data())
def test_mutated_scenarios(base: Path, work: Path, data: st.DataObject) -> None:
    work = _fresh(work, base)
    (work / "m.toml").write_bytes(data.draw(mutated_toml((base / "s.toml").read_text())))
    args, outputs = data.draw(st.sampled_from(SCENARIO_COMMANDS))(work)
    run_cli(args, work, outputs, ok_codes=(0, 3))


@FUZZ
@given(data=st.data())
def test_mutated_engine_configs(base: Path, work: Path, data: st.DataObject) -> None:
    work = _fresh(work, base)
    (work / "m.toml").write_bytes(data.draw(mutated_toml((base / "e.toml").read_text())))
    run_cli(["sim", "run", "t.parquet", "--engine", "m.toml", "--out", "o"], work, [work / "o"])


@FUZZ
@given(data=st.data())
def test_mutated_plans(base: Path, work: Path, data: st.DataObject) -> None:
    work = _fresh(work, base)
    (work / "m.toml").write_bytes(data.draw(mutated_toml((base / "p.toml").read_text())))
    run_cli(
        ["plan", "m.toml", "--sim-worksheet", "e.toml", "--out", "o", "--max-runs", "1", "--quiet"],
        work,
        [work / "o"],
        ok_codes=(0, 3),
    )


def _mutate_table(table: pa.Table, data: st.DataObject) -> pa.Table:
    """One hostile edit of a trace table: nulls, extremes, a wrong type, NaN, a dropped column, disorder, no rows."""
    name = data.draw(st.sampled_from(table.column_names))
    column = table.column(name).to_pylist()
    kind = data.draw(st.sampled_from(["null", "extreme", "type", "nan", "drop", "shuffle", "empty"]))
    if kind == "drop":
        return table.drop_columns([name])
    if kind == "empty":
        return table.slice(0, 0)
    if kind == "shuffle":
        return table.take(pa.array(list(reversed(range(table.num_rows))), pa.int64()))
    if kind == "type":
        new = pa.array([None if v is None else str(v) for v in column], pa.string())
    elif kind == "nan":
        new = pa.array(
            [
                float("nan") if i == 0 else (float(v) if isinstance(v, (int, float)) else None)
                for i, v in enumerate(column)
            ],
            pa.float64(),
        )
    else:
        current = table.column(name).type
        extremes: list[Any] = (
            ["", "r000001", "\x00", "x" * 10_000]
            if pa.types.is_string(current)
            else [-1, 2**31 - 1, 2**62, -(2**62), 0]
        )
        value = data.draw(st.sampled_from([None] if kind == "null" else extremes))
        if column:
            column[data.draw(st.integers(0, len(column) - 1))] = value
        new = None
        for target in (current, pa.int64(), None):
            try:
                new = pa.array(column, target)
                break
            except (pa.ArrowException, OverflowError):
                continue
        if new is None:
            return table
    return table.set_column(table.column_names.index(name), name, new)


@FUZZ
@given(data=st.data())
def test_mutated_traces(base: Path, work: Path, data: st.DataObject) -> None:
    work = _fresh(work, base)
    table = pq.read_table(base / "t.parquet")
    meta = json.loads(table.schema.metadata[TRACE_METADATA_KEY])
    table = table.replace_schema_metadata(None)
    for _ in range(data.draw(st.integers(0, 2))):
        table = _mutate_table(table, data)
    raw_meta = data.draw(mutated_json(meta)) if data.draw(st.booleans()) else json.dumps(meta).encode()
    pq.write_table(table.replace_schema_metadata({TRACE_METADATA_KEY: raw_meta}), work / "m.parquet")
    if data.draw(st.integers(0, 7)) == 0:  # flip bytes in the file itself
        raw = bytearray((work / "m.parquet").read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= 0xFF
        (work / "m.parquet").write_bytes(bytes(raw))
    command = data.draw(
        st.sampled_from(
            [
                (["trace", "stats", "m.parquet"], []),
                (["sim", "run", "m.parquet", "--engine", "e.toml", "--out", "o"], [work / "o"]),
            ]
        )
    )
    run_cli(command[0], work, command[1])


@FUZZ
@given(data=st.data())
def test_mutated_model_configs(base: Path, work: Path, data: st.DataObject) -> None:
    work = _fresh(work, base)
    config = json.loads((base / "config.json").read_text())
    (work / "m.json").write_bytes(data.draw(mutated_json(config)))
    run_cli(["ledger", "--model", "m.json", "--kv-cache-gib", "1"], work, [])


@FUZZ
@given(data=st.data())
def test_mutated_manifests(base: Path, work: Path, data: st.DataObject) -> None:
    work = _fresh(work, base)
    manifest = json.loads((base / "run" / "manifest.json").read_text())
    # the document as a whole (bytes, top-level type, nesting); field types wait for the typed manifest
    (work / "run" / "manifest.json").write_bytes(
        data.draw(
            st.one_of(
                st.sampled_from([b"", b"[]", b"null", b"42", b'"x"', b"\xff\xfe", b"[" * 50_000, b'{"a": NaN']),
                st.binary(max_size=64),
                mutated_json(manifest).map(lambda raw: raw[: len(raw) // 2]),
            )
        )
    )
    command = data.draw(
        st.sampled_from(
            [
                (["analyze", "run", "--quiet"], []),
                (["compare", "run", "run"], []),
                (["handoff", "run", "--out", "b"], [work / "b", work / "b.tar.gz"]),
            ]
        )
    )
    run_cli(command[0], work, command[1])


#: Query-string fields as a gateway or a hostile user may write them (issue 34): names and values with the
#: characters that split, quote or escape a query, and values that look like credentials.
QUERY_NAME = st.text(st.characters(blacklist_characters="=&#?", blacklist_categories=("Cs", "Cc")), max_size=12)
QUERY_VALUE = st.one_of(
    st.text(st.characters(blacklist_characters="&#", blacklist_categories=("Cs", "Cc")), min_size=1, max_size=24),
    st.sampled_from(["sk-live-0123456789abcdef", "S1", '"><script>', "%26x%3Dy", "a=b=c", "?x=y", "REDACTED"]),
)
QUERY = st.lists(st.tuples(QUERY_NAME, QUERY_VALUE), min_size=1, max_size=4)


@FUZZ
@given(fields=QUERY)
def test_every_query_value_is_redacted_and_every_name_kept(fields: list[tuple[str, str]]) -> None:
    """``redact_url`` on any query string: each value becomes REDACTED, each name is kept, in order."""
    from loadgen.util.redact import redact_url  # why: a pure function beside the CLI fuzz; no command needed

    query = "&".join(f"{name}={value}" for name, value in fields)
    redacted = redact_url(f"https://user:pw@example.com:8443/v1?{query}")
    assert redacted.startswith("https://example.com:8443/v1?")
    kept = redacted.split("?", 1)[1].split("&")
    assert kept == [f"{name}=REDACTED" for name, value in fields], (query, redacted)


@FUZZ
@given(data=st.data())
def test_mutated_manifest_urls(base: Path, work: Path, data: st.DataObject) -> None:
    """The readers take a manifest whose target URLs carry any query string (an older run's, or a hand-edited
    one): one line or success, never a traceback; a handoff bundle records no query value in its own files."""
    work = _fresh(work, base)
    manifest = json.loads((base / "run" / "manifest.json").read_text())
    fields = data.draw(QUERY)
    query = "&".join(f"{name}={value}" for name, value in fields)
    manifest["options"]["target_url"] = f"http://127.0.0.1:9/v1?{query}"
    manifest["target"]["base_url"] = data.draw(st.sampled_from([f"http://127.0.0.1:9?{query}", query, "", "?"]))
    (work / "run" / "manifest.json").write_text(json.dumps(manifest))
    command = data.draw(
        st.sampled_from(
            [
                (["analyze", "run", "--quiet", "--json", "a.json"], [work / "a.json"]),
                (["compare", "run", "run"], []),
                (["handoff", "run", "--out", "b"], [work / "b", work / "b.tar.gz"]),
            ]
        )
    )
    bundle = work / "b"
    if command[0][0] == "handoff":
        run_cli(command[0], work, [])
        secret = [f"{n}={v}" for n, v in fields if n and len(v) >= 6 and v != "REDACTED"]
        for path in bundle.rglob("*") if bundle.exists() else ():
            if path.is_file() and path.name not in ("manifest.json", "SHA256SUMS") and path.suffix != ".parquet":
                text = path.read_text(errors="replace")
                assert not any(field in text for field in secret), (path.name, query)
        for out in command[1]:
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        return
    run_cli(command[0], work, command[1])


def test_base_inputs_are_valid(base: Path, work: Path) -> None:
    """The unmutated inputs succeed, so every exit 2 above is the mutation's doing."""
    for name in ("s.toml", "e.toml", "p.toml"):
        tomllib.loads((base / name).read_text())
    assert run_cli(["scenario", "check", "s.toml"], work, []) == 0
    assert run_cli(["ledger", "--model", "config.json", "--kv-cache-gib", "1"], work, []) == 0
    assert run_cli(["trace", "stats", "t.parquet"], work, []) == 0
