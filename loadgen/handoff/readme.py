"""The bundle's README: the one-command rerun, what was observed, the proposed experiment, the contents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadgen.rundir.manifest import Manifest

__all__ = ["ReadmeFacts", "readme_text", "rerun_instructions"]


@dataclass(frozen=True)
class ReadmeFacts:
    """What the README states; every field is filled by the bundle builder."""

    title: str
    built_utc: str
    loadgen_version: str
    run_name: str
    run_kind: str
    model_executed: bool
    benchmark_executed: bool
    rerun_command: str
    rerun_note: str
    bundle_name: str
    failures: list[dict[str, Any]]
    experiment: dict[str, Any]
    scenario_note: str
    engine_toml: str | None  # how engine.toml was obtained; None when the bundle has none
    contract_result: bool  # the source run has a contract result, copied into contract/
    other_runs: int | None  # run directories in the source when more than one


def rerun_instructions(
    bundle_name: str, manifest: Manifest, model: str | None, has_engine_toml: bool
) -> tuple[str, str]:
    """The one rerun command and the paragraph explaining it, by the kind of the source run."""
    command, note = _rerun_command(bundle_name, manifest, model, has_engine_toml)
    key_env = manifest.options.get("api_key_env")
    if key_env:
        note += (
            f" The original run read its API key from the environment variable `{key_env}` (the key is in no file "
            f"here): set it before the rerun, which sends it as that run did (`--api-key-env NAME` names another)."
        )
    return command, note


def _rerun_command(bundle_name: str, manifest: Manifest, model: str | None, has_engine_toml: bool) -> tuple[str, str]:
    """The rerun command and its paragraph, by the kind of the source run."""
    options = manifest.options
    seed = options.get("seed")
    if manifest.run_kind == "simulated" and options.get("face") == "worksheet":
        note = (
            "Run it from the directory holding the bundle. It verifies the checksums, replays `trace.parquet` "
            "through the simulated engine in virtual time (`engine.toml`, seed "
            f"{seed}, as the original run), analyses the new run and prints whether the failing "
            "check reproduces; `--experiment` applies the proposed change first; `--target URL --model NAME` "
            "replays against a live server instead. Equivalent by hand: `loadgen sim run trace.parquet "
            f"--engine engine.toml --seed {seed} --scenario scenario.toml --out rerun-run`."
        )
        return f"loadgen handoff rerun {bundle_name} --out rerun-run", note
    if has_engine_toml:
        note = (
            "Run it from the directory holding the bundle. It verifies the checksums, starts the simulated "
            "engine's live server from `engine.toml`, replays `trace.parquet` in real time, analyses the new "
            "run and prints whether the failing check reproduces; `--experiment` applies the proposed change "
            "first. Equivalent by hand: `loadgen sim serve --engine engine.toml --port 8000` and "
            "`loadgen run trace.parquet --target http://127.0.0.1:8000 --scenario scenario.toml --out rerun-run`."
        )
        return f"loadgen handoff rerun {bundle_name} --out rerun-run", note
    note = (
        "Start the engine with the configuration in runtime.json on the same hardware first. The command "
        "verifies the checksums, replays `trace.parquet` against URL, analyses the new run and prints "
        "whether the failing check reproduces. Equivalent by hand: `loadgen run trace.parquet --target URL "
        "--scenario scenario.toml --out rerun-run`."
    )
    return f"loadgen handoff rerun {bundle_name} --target URL --model {model or 'MODEL'} --out rerun-run", note


def readme_text(facts: ReadmeFacts) -> str:
    """The README.md of a bundle (Markdown)."""
    lines = (
        _rerun_section(facts)
        + _observed_section(facts.failures)
        + _experiment_section(facts.experiment)
        + _contents_section(facts)
        + _closing(facts)
    )
    return "\n".join(lines) + "\n"


def _fmt_observed(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"
    return str(value)


def _rerun_section(facts: ReadmeFacts) -> list[str]:
    return [
        f"# Handoff: {facts.title}",
        "",
        (
            f"Built {facts.built_utc} by loadgen {facts.loadgen_version} from run `{facts.run_name}` "
            f"({facts.run_kind} run; modelExecuted={facts.model_executed}, benchmarkExecuted={facts.benchmark_executed})."
        ),
        "",
        "## Rerun with one command",
        "",
        "```sh",
        facts.rerun_command,
        "```",
        "",
        facts.rerun_note,
        "",
        "Check the bundle first: `loadgen handoff verify " + facts.bundle_name + "` (or the .tar.gz).",
        "",
    ]


def _failure_row(item: dict[str, Any]) -> str:
    notes = []
    if item.get("failures_as_inf"):
        notes.append(f"{item.get('failures_as_inf')} failed requests counted as +inf")
    if item.get("percentile") == "p99" and isinstance(item.get("samples"), int) and item["samples"] < 100:
        notes.append("p99 from fewer than 100 samples")
    return (
        f"| {item.get('class', '')} | {item.get('metric')} | {item.get('percentile') or ''} | "
        f"{_fmt_observed(item.get('limit'))} | {_fmt_observed(item.get('observed'))} | "
        f"{item.get('samples')} | {'; '.join(notes)} |"
    )


def _observed_section(failures: list[dict[str, Any]]) -> list[str]:
    lines = ["## What was observed", ""]
    if failures:
        lines.append("| class | metric | percentile | limit | measured | samples | note |")
        lines.append("|---|---|---|---|---|---|---|")
        lines += [_failure_row(item) for item in failures]
    else:
        lines.append(
            "No hard budget failed and no memory signal was seen in this run. The bundle is still "
            "complete, so the result can be reproduced or extended."
        )
    return lines + [
        "",
        (
            "Values are in ms for latency metrics, from `loadgen analyze` (failed requests count as +inf; a p99 "
            "from fewer than 100 samples is flagged). This package states what was measured at the client and, "
            "where the engine exposes it, its /metrics; it does not diagnose kernels or prescribe kernel work."
        ),
        "",
    ]


def _experiment_section(e: dict[str, Any]) -> list[str]:
    lines = ["## Proposed one-variable experiment (a proposal, not a measurement)", ""]
    if e.get("variable"):
        lines.append(
            f"- change **{e['variable']}** from `{e.get('from')}` to `{e.get('to')}`; keep everything else fixed"
        )
    lines.append(f"- why: {e['hypothesis']}")
    lines.append(f"- keep fixed: {', '.join(e['keep_fixed'])}")
    lines.append(f"- measure: {e['measure']}")
    return lines + [""]


def _contents_section(facts: ReadmeFacts) -> list[str]:
    lines = [
        "## Contents",
        "",
        "| file | what |",
        "|---|---|",
        "| identity.json | package (model), engine (name, version, config), hardware, harness, warm state, behaviour-relevant settings |",
        "| workload.json | workload generator settings: scenario name + sha256, trace name, seed, generator version; regenerate command |",
        "| scenario.toml | the scenario (classes, budgets, arrivals); " + facts.scenario_note + " |",
        "| trace.parquet | the exact trace replayed (arrival offsets and token counts; no prompt text) |",
        "| runtime.json | engine configuration and every run option (secrets redacted) |",
    ]
    if facts.engine_toml:
        lines.append("| engine.toml | simulated engine config (" + str(facts.engine_toml) + ") |")
    return lines + [
        "| contract/ | the expected behaviour contract (case files"
        + (", and the run's contract result" if facts.contract_result else "")
        + ") |",
        "| failure.json | failing thresholds with measured value and sample count; memory signals |",
        "| experiment.json | the proposed experiment |",
        "| observed.json | the full analysis of the run (per-class percentiles with n, rates, errors) |",
        "| manifest.json | the source run's manifest |",
        "| SHA256SUMS | sha256 of every file above (`sha256sum -c SHA256SUMS` also works) |",
        "",
    ]


def _closing(facts: ReadmeFacts) -> list[str]:
    lines = [
        (
            "Raw prompts are not included: prompts are regenerated deterministically from the trace (token counts, "
            "prefix groups) by the same loadgen version."
        ),
        "",
        "A candidate that fixes the failure must keep the expected behaviour: replay the contract against it with "
        "`loadgen contract replay contract/*.toml --target URL --model NAME`"
        + (
            " and compare with `contract/contract_result.json` (`loadgen contract diff`)."
            if facts.contract_result
            else "."
        ),
    ]
    if facts.other_runs:
        lines += [
            "",
            f"The source held {facts.other_runs} run directories; this bundle packages the first with a failure.",
        ]
    return lines
