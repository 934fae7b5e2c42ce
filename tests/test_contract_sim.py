"""Contract replay against the real simulated engine (``loadgen sim serve``) through its responder hook.

The engine's ``[behavior]`` section decides what the candidate answers: the reference answers, or a
drift that must be caught by the checks and the reference diff. Also replayed *under load*: the
cases run while the driver replays a trace against the same server, and ``contract.json`` lands in
the run directory. Needs the sim's responder hook (``EngineConfig.behavior``), skipped otherwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from loadgen.contract import diff, load_cases, read_contract, replay_cases_sync, replay_under_load
from loadgen.sim.config import EngineConfig
from loadgen.targets import launch_sim_server as start_sim_server

pytestmark = pytest.mark.skipif(
    "behavior" not in EngineConfig.model_fields,
    reason="the simulated engine's contract responder hook is not wired yet (EngineConfig has no 'behavior')",
)

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "scenarios" / "contract" / "canonical.toml"
INSTANT = ROOT / "scenarios" / "engines" / "instant.toml"


def engine_file(tmp_path: Path, name: str, behavior: str = "", base: Path = INSTANT) -> Path:
    text = base.read_text().replace(f'name = "{base.stem}"', f'name = "{name}"', 1)
    path = tmp_path / f"{name}.toml"
    path.write_text(text + "\n[behavior]\n" + behavior + "\n")
    return path


@pytest.fixture(scope="module")
def reference_and_drifted(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("contract-sim")
    cases = load_cases(CANONICAL)
    with start_sim_server(str(engine_file(tmp, "reference"))) as sim:
        reference = replay_cases_sync(cases, sim.base_url, "loadgen-sim")
        streamed_completions = replay_cases_sync(
            cases, sim.base_url, "loadgen-sim", endpoint="completions", stream=True
        )
        streamed_chat = replay_cases_sync(cases, sim.base_url, "loadgen-sim", stream=True)
    drifted_engine = engine_file(
        tmp, "quantized-candidate", 'drift_kinds = ["abstention", "language"]\ndrift = { "target-arithmetic" = "52" }'
    )
    with start_sim_server(str(drifted_engine)) as sim:
        candidate = replay_cases_sync(cases, sim.base_url, "loadgen-sim", reference=reference)
    return cases, reference, candidate, (streamed_completions, streamed_chat)


def test_reference_engine_passes_every_case(reference_and_drifted) -> None:
    cases, reference, _, streamed = reference_and_drifted
    assert reference.passed, reference.failures
    for result in streamed:
        assert result.passed, result.failures
        assert [c.observed.text for c in result.cases] == [c.observed.text for c in reference.cases]
    by_id = reference.by_id()
    assert by_id["control-max-tokens"].observed.finish_reason == "length"
    assert by_id["control-max-tokens"].observed.completion_tokens == 8
    assert by_id["control-stop-sequence"].observed.text == "red\ngreen\nblue\n"
    assert by_id["language-french"].observed.text.startswith("Le ciel est bleu")


def test_drifted_engine_is_caught_and_rejected(reference_and_drifted) -> None:
    _, reference, candidate, _ = reference_and_drifted
    assert not candidate.passed
    assert {f["case_id"] for f in candidate.failures} == {
        "abstention-missing-fact",
        "language-french",
        "target-arithmetic",
    }
    d = candidate.reference_diff
    assert d is not None and d.rejects
    assert sorted(d.regressions) == ["abstention-missing-fact", "language-french", "target-arithmetic"]
    assert diff(reference, reference).rejects is False


@pytest.mark.slow
def test_under_load_replay_writes_contract_json_into_the_run(tmp_path: Path) -> None:
    from loadgen.driver import RunOptions
    from loadgen.trace.generate import generate_trace_file
    from loadgen.workload.scenario import load_scenario

    scenario_src = ROOT / "scenarios" / "canonical.toml"
    scen_dir = tmp_path / "scen"
    (scen_dir / "contract").mkdir(parents=True)
    text = scenario_src.read_text().replace(
        "duration_s = 60\nmax_in_flight = 256\nburst_shares", "duration_s = 6\nmax_in_flight = 256\nburst_shares"
    )
    (scen_dir / "canonical.toml").write_text(text)
    shutil.copy(CANONICAL, scen_dir / "contract" / "canonical.toml")
    scenario = load_scenario(scen_dir / "canonical.toml")
    trace = generate_trace_file(scenario, "burst", tmp_path / "burst.parquet", 3)
    cases = load_cases(CANONICAL)
    with start_sim_server(str(ROOT / "scenarios" / "engines" / "interactive-small-batch.toml")) as sim:
        options = RunOptions(
            trace_path=trace,
            target_url=sim.base_url,
            out_dir=tmp_path / "run",
            scenario_path=scen_dir / "canonical.toml",
            progress="off",
        )
        run_dir, result = anyio.run(lambda: replay_under_load(cases, options, delay_s=0.5, rounds=3))
    assert result.mode == "under_load" and result.passed, result.failures
    assert all(c.rounds == 3 and c.rounds_failed == 0 and c.distinct_answers == 1 for c in result.cases)
    assert "3 round(s) of 8 case(s)" in " ".join(result.notes)
    saved = read_contract(run_dir / "contract.json")
    assert saved.mode == "under_load" and saved.run_dir == str(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status_counts"]["ok"] > 0
    assert all(c.settings["temperature"] == 0 for c in saved.cases)
