"""The test tiers: the default command skips each slow tier that pyproject.toml declares, and .ci/run runs them all."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _declared_markers() -> set[str]:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {line.split(":", 1)[0].strip() for line in ini["markers"]}


def _default_expression() -> str:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    args = shlex.split(ini["addopts"])
    return args[args.index("-m") + 1]


def test_the_default_command_skips_every_declared_tier() -> None:
    expression = _default_expression()
    skipped = set(re.findall(r"not (\w+)", expression))
    assert skipped == _declared_markers(), expression
    assert re.fullmatch(r"not \w+( and not \w+)*", expression), expression  # only exclusions: nothing else is lost


def test_ci_runs_every_tier_the_default_command_skips() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && python -m pytest -q\n" in ci  # the README's command, as written there
    tiers = re.findall(r'^python -m pytest -q -m "([^"]+)"$', ci, re.M)
    assert len(tiers) == 1, tiers
    assert set(tiers[0].split(" or ")) == _declared_markers()
