"""Contract cases: file format and loader errors, checks by kind, language heuristic, responder, diff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.contract import (
    CaseResult,
    ContractResult,
    Observed,
    case_marker,
    detect_language,
    diff,
    find_case_id,
    load_case_refs,
    load_cases,
    read_contract,
    respond,
    respond_full,
    run_checks,
    write_contract,
)
from loadgen.util.errors import ScenarioError
from loadgen.workload.prompts import get_tokenizer
from loadgen.workload.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "scenarios" / "contract" / "canonical.toml"

GOOD = """
version = 1
[defaults]
temperature = 0.0
seed = 7
max_tokens = 32

[[cases]]
id = "t1"
request.messages = [{ role = "user", content = "Capital of France?" }]
reference = "Paris is the capital."
checks = [{ kind = "target", pattern = "Paris" }]
"""


def write(tmp_path: Path, text: str, name: str = "cases.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_canonical_file_loads_with_every_kind() -> None:
    cases = load_cases(CANONICAL)
    kinds = {k for case in cases for k in case.kinds()}
    assert kinds == {"target", "citation", "abstention", "language", "schema", "control"}
    assert all(c.request.temperature == 0 and c.request.seed == 1234 for c in cases)
    assert cases.sources[0]["sha256"] and len(cases.sources[0]["sha256"]) == 64


def test_scenario_reference_resolves_relative_to_scenario() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "canonical.toml")
    cases = load_case_refs(scenario.behavior.cases, scenario.base_dir())
    assert len(cases) == len(load_cases(CANONICAL))


def test_defaults_apply_and_case_overrides(tmp_path: Path) -> None:
    case = load_cases(write(tmp_path, GOOD)).cases[0]
    assert case.request.settings() == {"temperature": 0.0, "seed": 7, "max_tokens": 32, "stop": []}


@pytest.mark.parametrize(
    "mutation, needle",
    [
        (
            ('kind = "target", pattern = "Paris"', 'kind = "target", pattern = "(unclosed"'),
            "case 't1': checks[0].pattern = '(unclosed': expected a valid regular expression",
        ),
        (('kind = "target", pattern = "Paris"', 'kind = "sentiment"'), "case 't1': checks[0]"),
        (('id = "t1"', 'id = "bad id!"'), "id = 'bad id!': expected letters"),
        (("max_tokens = 32", "max_tokens = 0"), "request.max_tokens = 0"),
        (
            ('kind = "target", pattern = "Paris"', 'kind = "language", expected = "xx"'),
            "expected = 'xx': expected one of",
        ),
        (('kind = "target", pattern = "Paris"', 'kind = "target"'), "expected exactly one of exact or pattern"),
        (("[defaults]", "[defaults]\ntop_p = 1"), "defaults.top_p: unknown field"),
    ],
)
def test_loader_errors_are_one_line_naming_file_case_field(
    tmp_path: Path, mutation: tuple[str, str], needle: str
) -> None:
    path = write(tmp_path, GOOD.replace(*mutation))
    with pytest.raises(ScenarioError) as info:
        load_cases(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert needle in message, message


def test_loader_rejects_duplicate_ids_and_missing_file(tmp_path: Path) -> None:
    dup = GOOD + GOOD[GOOD.index("[[cases]]") :]
    with pytest.raises(ScenarioError, match="case 't1': id = 't1': expected unique case ids"):
        load_cases(write(tmp_path, dup))
    with pytest.raises(ScenarioError, match="no such file"):
        load_cases(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match="case 'zz': not in this file"):
        load_cases(f"{write(tmp_path, GOOD)}#zz")


def test_schema_file_is_resolved_and_validated(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"type": "object", "required": ["a"]}')
    text = GOOD.replace('kind = "target", pattern = "Paris"', 'kind = "schema", schema_file = "s.json"')
    case = load_cases(write(tmp_path, text)).cases[0]
    assert run_checks(case, Observed('{"a": 1}'))[0].passed
    assert not run_checks(case, Observed('{"b": 1}'))[0].passed
    (tmp_path / "s.json").write_text('{"type": 12}')
    with pytest.raises(ScenarioError, match="schema_file = 's.json': expected a valid JSON Schema"):
        load_cases(tmp_path / "cases.toml")


def by_id(case_id: str):
    return load_cases(CANONICAL).by_id()[case_id]


@pytest.mark.parametrize(
    "case_id, good, bad",
    [
        ("target-arithmetic", Observed("51"), Observed("The answer is 51.")),
        (
            "citation-warranty",
            Observed("24 months [doc-2]; 30 days [doc-3]."),
            Observed("24 months [doc-2]; 30 days [doc-9]."),
        ),
        (
            "abstention-missing-fact",
            Observed("I'm sorry, the documents do not mention it."),
            Observed("The CEO's favourite colour is blue."),
        ),
        (
            "language-french",
            Observed("Le ciel est bleu parce que la lumière est diffusée par l'air."),
            Observed("The sky is blue because the light is scattered by the air."),
        ),
        (
            "schema-person",
            Observed('```json\n{"name": "Alice", "age": 31}\n```'),
            Observed('{"name": "Alice", "age": "31"}'),
        ),
        (
            "control-stop-sequence",
            Observed("red\ngreen\nblue\n", "stop", 6),
            Observed("red\ngreen\nblue\nEND", "stop", 7),
        ),
        (
            "control-max-tokens",
            Observed("Once upon a time there was a", "length", 8),
            Observed("Once upon a time there was a lighthouse keeper", "length", 9),
        ),
    ],
)
def test_each_check_kind_passes_and_fails(case_id: str, good: Observed, bad: Observed) -> None:
    case = by_id(case_id)
    assert all(o.passed for o in run_checks(case, good)), run_checks(case, good)
    outcomes = run_checks(case, bad)
    assert not all(o.passed for o in outcomes)
    failed = [o for o in outcomes if not o.passed][0]
    assert failed.expected and failed.got


def test_failed_request_fails_every_check_with_the_error() -> None:
    outcomes = run_checks(by_id("citation-warranty"), Observed(None, http_status=503, error="HTTP 503: busy"))
    assert [o.passed for o in outcomes] == [False, False]
    assert outcomes[0].got == "HTTP 503: busy"


def test_control_needs_reported_usage() -> None:
    outcome = run_checks(by_id("control-max-tokens"), Observed("Once upon", "length", None))[0]
    assert not outcome.passed and "no usage.completion_tokens" in outcome.got


@pytest.mark.parametrize(
    "text, lang",
    [
        ("The weather is nice today and we are going to the park with the children.", "en"),
        ("Le temps est beau aujourd'hui et nous allons au parc avec les enfants.", "fr"),
        ("Das Wetter ist heute schön und wir gehen mit den Kindern in den Park.", "de"),
        ("El tiempo es bueno hoy y vamos al parque con los niños.", "es"),
        ("今日は天気がいいので、子供たちと公園に行きます。", "ja"),
        ("今天天气很好，我们和孩子们去公园。", "zh"),
        ("Сегодня хорошая погода, и мы идём в парк с детьми.", "ru"),
        ("Paris.", "und"),
    ],
)
def test_language_heuristic(text: str, lang: str) -> None:
    assert detect_language(text).language == lang


def body_for(case, **extra):
    return {
        "model": "m",
        "messages": [m.model_dump() for m in case.request.messages],
        "max_tokens": case.request.max_tokens,
        "stop": case.request.stop,
        **extra,
    }


def test_responder_plays_reference_and_checks_pass() -> None:
    tok = get_tokenizer()
    for case in load_cases(CANONICAL):
        answer = respond_full(body_for(case), headers={"X-Loadgen-Case": case.id})
        assert answer is not None and not answer.drifted
        obs = Observed(answer.text, answer.finish_reason, tok.count(answer.text))
        assert all(o.passed for o in run_checks(case, obs)), (case.id, run_checks(case, obs))


def test_responder_honours_stop_and_max_tokens() -> None:
    stop_case, long_case = by_id("control-stop-sequence"), by_id("control-max-tokens")
    text = respond(body_for(stop_case), headers={"x-loadgen-case": stop_case.id})
    assert text == "red\ngreen\nblue\n"
    answer = respond_full(body_for(long_case), headers={"x-loadgen-case": long_case.id})
    assert answer.finish_reason == "length" and get_tokenizer().count(answer.text) == 8


def test_responder_recognises_marker_and_ignores_unknown() -> None:
    body = {"messages": [{"role": "user", "content": f"hello\n{case_marker('target-capital')}"}]}
    assert find_case_id(body) == "target-capital"
    assert respond(body) == "The capital of France is Paris."
    assert respond({"prompt": "no marker here"}) is None
    assert respond({"prompt": case_marker("not-a-case")}) is None


def test_responder_drift_breaks_every_kind() -> None:
    tok = get_tokenizer()
    for case in load_cases(CANONICAL):
        answer = respond_full(body_for(case), {"drift_kinds": ["all"]}, headers={"x-loadgen-case": case.id})
        assert answer.drifted
        obs = Observed(answer.text, answer.finish_reason, tok.count(answer.text))
        assert not all(o.passed for o in run_checks(case, obs)), case.id
    text = respond(
        body_for(by_id("target-capital")),
        {"drift": {"target-capital": "Lyon."}},
        headers={"x-loadgen-case": "target-capital"},
    )
    assert text == "Lyon."


def test_responder_loads_extra_case_files_relative_to_base_dir(tmp_path: Path) -> None:
    write(tmp_path, GOOD, "extra.toml")
    body = {"messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 32}
    assert (
        respond(body, {"cases": ["extra.toml"]}, headers={"x-loadgen-case": "t1"}, base_dir=tmp_path)
        == "Paris is the capital."
    )
    assert (
        respond(
            body,
            {"cases": ["extra.toml"], "default_cases": False},
            headers={"x-loadgen-case": "target-capital"},
            base_dir=tmp_path,
        )
        is None
    )


def result_with(outcomes: dict[str, tuple[bool, ...]], text: str = "x") -> ContractResult:
    from loadgen.contract import CheckOutcome

    cases = []
    for case_id, passes in outcomes.items():
        checks = [CheckOutcome(kind, p, "e", "g") for kind, p in zip(("target", "schema", "control"), passes)]
        cases.append(CaseResult(case_id, all(passes), checks, {"temperature": 0}, Observed(text)))
    return ContractResult(cases, {"base_url": "http://x"})


def test_diff_statuses_and_rejection(tmp_path: Path) -> None:
    ref = result_with({"a": (True,), "b": (True, True), "c": (False, True), "d": (False, True), "e": (True,)})
    cand = result_with(
        {"a": (True,), "b": (True, False), "c": (True, True), "d": (True, False), "f": (True,)}, text="y"
    )
    d = diff(cand, ref)
    status = {c.case_id: c.status for c in d.cases}
    assert status == {
        "a": "same_pass",
        "b": "regressed",
        "c": "fixed",
        "d": "changed_checks",
        "e": "missing",
        "f": "extra",
    }
    assert d.rejects and d.changed and set(d.regressions) == {"b", "d", "e"}
    assert diff(ref, ref).rejects is False and diff(ref, ref).changed is False
    assert all(c.output_changed for c in d.cases if c.status not in ("missing", "extra"))
    # results round-trip through contract.json
    cand.reference_diff = d
    back = read_contract(write_contract(cand, tmp_path / "contract.json"))
    assert back.to_dict() == cand.to_dict()
    assert back.failures == cand.failures and not back.passed


def test_cli_check_lists_cases_and_reports_errors(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "loadgen", "contract", "check", str(CANONICAL)], capture_output=True, text=True, cwd=ROOT
    )
    assert ok.returncode == 0 and "8 case(s) OK" in ok.stdout
    bad = write(tmp_path, GOOD.replace("max_tokens = 32", "max_tokens = -1"))
    res = subprocess.run(
        [sys.executable, "-m", "loadgen", "contract", "check", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "request.max_tokens = -1" in res.stderr


def test_rounds_under_load_merge_to_the_worst_round() -> None:
    from loadgen.contract.replay import _merge_rounds

    ok = result_with({"a": (True,), "b": (True,)}, text="same")
    bad = result_with({"a": (True,), "b": (False,)}, text="other")
    merged = _merge_rounds([ok, bad, ok])
    by_id = merged.by_id()
    assert not merged.passed and by_id["b"].rounds == 3 and by_id["b"].rounds_failed == 1
    assert by_id["a"].passed and by_id["a"].distinct_answers == 2
    assert any("answers differed between rounds" in n for n in merged.notes)
