"""The prompt salt: other texts of the same token counts, sharing kept within a run, and one salt per measured run."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from loadgen.driver import RunOptions, RunSettings
from loadgen.targets.base import RunRequest, StateResult, Target, run_salt
from loadgen.workload.prompts import PromptSynth


def test_a_salt_gives_other_texts_of_the_same_token_counts_and_keeps_sharing():
    plain, salted, other = PromptSynth("cl100k_base"), PromptSynth("cl100k_base", salt="a"), PromptSynth(salt="b")
    for n in (1, 7, 130):
        texts = [s.text("r1", n) for s in (plain, salted, other)]
        assert len(set(texts)) == 3
        assert [len(salted.tokenizer.encode(t)) for t in texts] == [n, n, n]
    assert plain.text("r1", 50) == PromptSynth("cl100k_base", salt="").text("r1", 50)  # no salt: the old texts
    a, b = salted.text("r1", 300, "system", 256), salted.text("r2", 280, "system", 256)
    assert a[:900] == b[:900] != plain.text("r1", 300, "system", 256)[:900]  # members share the salted prefix


class _Live(Target):
    kind = "url"
    run_defaults = None


def test_each_measured_run_through_a_target_is_salted_apart_unless_told():
    target = _Live()
    runs = [Path("plan/cells/a/rep1"), Path("plan/cells/b/rep1"), Path("plan/cells/a/rep2")]
    salts = [target.driver_options(RunRequest(Path("t"), d, StateResult("warm", True))).prompt_salt for d in runs]
    assert len(set(salts)) == 3 and salts[0] == run_salt(runs[0]) and salts[0].startswith("cells/a/rep1/")
    given = RunRequest(Path("t"), runs[0], StateResult("warm", True), settings=RunSettings(prompt_salt=""))
    assert target.driver_options(given).prompt_salt == ""  # the caller's word wins: unsalted
    long = Path("x" * 200, "y" * 200, "rep1")  # long directory names: hashed, within RunOptions' limit
    assert len(run_salt(long)) < 40 and run_salt(long) != run_salt(Path("x" * 200, "z" * 200, "rep1"))


def test_driver_options_are_typed_layers_the_request_over_the_target_over_the_salt():
    """A target's defaults (workers), the request's labels (plan cell, repeat) and the caller's settings reach
    ``RunOptions`` typed: each layer's explicitly set fields win, even when set to the default value."""
    target = _Live()
    target.run_defaults = RunSettings(workers=4, tokenizer="chars:4", prompt_salt="target")
    request = RunRequest(
        Path("t.parquet"),
        Path("plan/cells/a/rep2"),
        StateResult("warm", True),
        repeat=2,
        plan_cell={"cell_id": "a"},
        settings=RunSettings(tokenizer="cl100k_base", endpoint="chat"),
    )
    settings = target.driver_options(request)
    assert isinstance(settings, RunSettings) and settings.trace_path is None  # a template: no replay yet
    assert (settings.workers, settings.tokenizer, settings.endpoint) == (4, "cl100k_base", "chat")
    assert (settings.prompt_salt, settings.repeat, settings.plan_cell) == ("target", 2, {"cell_id": "a"})
    options = settings.options(trace_path=request.trace_path, target_url="http://127.0.0.1:9/", out_dir=request.out_dir)
    assert isinstance(options, RunOptions) and options.target_url == "http://127.0.0.1:9"  # validated once, here
    assert (options.workers, options.repeat, options.endpoint, options.out_dir) == (4, 2, "chat", request.out_dir)
    assert list(RunOptions.model_fields) == list(RunSettings.model_fields)  # one field order: the manifest's
    back_to_one = RunSettings(workers=4).over(RunSettings(workers=1))  # set to the default: still wins
    assert back_to_one.workers == 1 and RunSettings(workers=4).over(None).workers == 4
    with pytest.raises(ValidationError, match="target_url"):
        settings.options(trace_path=request.trace_path, target_url="ftp://x", out_dir=request.out_dir)
    with pytest.raises(ValidationError, match="out_dir"):
        settings.options(trace_path=request.trace_path, target_url="http://127.0.0.1:9")
