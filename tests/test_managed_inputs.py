"""Hostile input against the managed-API surface through the real CLI: one line naming file, field and what was
expected, exit 2, no traceback, and never a key value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTANT = (ROOT / "scenarios" / "engines" / "instant.toml").read_text()
KEY = "sk-pasted-0123456789abcdef"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def _refused(res: subprocess.CompletedProcess[str]) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in out, out
    return res.stderr


@pytest.mark.parametrize(
    "managed,expected",
    [
        ('path_prefix = "/.."', "managed.path_prefix = '/..': expected '' or /SEGMENT"),
        ('path_prefix = "/openai/../v1"', "managed.path_prefix = '/openai/../v1': expected '' or /SEGMENT"),
        ('path_prefix = "/./openai"', "managed.path_prefix = '/./openai': expected '' or /SEGMENT"),
        ('path_prefix = "/openai/"', "no trailing slash"),
        ('path_prefix = "/%2e%2e"', "managed.path_prefix = '/%2e%2e': expected"),
        (f'api_key_env = "{KEY}"', "managed.api_key_env (value not shown): expected the NAME of an environment"),
    ],
)
def test_sim_serve_refuses_an_unreachable_prefix_and_a_key_in_place_of_its_name(
    tmp_path: Path, managed: str, expected: str
) -> None:
    """Before: path_prefix '/..' or '/./openai' was served (every client resolves the dot segment away before
    sending, so nothing could reach it: GET /../v1/models went out as /v1/models, HTTP 404), and a key written as
    api_key_env was printed ('env var sk-... (managed.api_key_env) is empty')."""
    engine = tmp_path / "managed.toml"
    engine.write_text(f"{INSTANT}\n[managed]\n{managed}\n")
    err = _refused(cli("sim", "serve", "--engine", str(engine), "--port", "0"))
    assert f"{engine}: " in err and expected in err
    assert KEY not in err
