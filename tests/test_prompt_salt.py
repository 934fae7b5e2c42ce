"""The prompt salt: other texts of the same token counts, sharing kept within a run, and one salt per measured run."""

from __future__ import annotations

from pathlib import Path

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
    salts = [target.driver_options(RunRequest(Path("t"), d, StateResult("warm", True)))["prompt_salt"] for d in runs]
    assert len(set(salts)) == 3 and salts[0] == run_salt(runs[0]) and salts[0].startswith("cells/a/rep1/")
    given = RunRequest(Path("t"), runs[0], StateResult("warm", True), run_options={"prompt_salt": ""})
    assert target.driver_options(given)["prompt_salt"] == ""  # the caller's word wins: unsalted
    long = Path("x" * 200, "y" * 200, "rep1")  # long directory names: hashed, within RunOptions' limit
    assert len(run_salt(long)) < 40 and run_salt(long) != run_salt(Path("x" * 200, "z" * 200, "rep1"))
