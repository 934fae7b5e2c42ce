"""Argument types for numeric flags: finite, in range, one line when not (``argument --seed: -1: expected ...``).

argparse turns an ``ArgumentTypeError`` into ``loadgen: error: ... argument --flag: MESSAGE`` and exit 2
(see ``loadgen.cli.LoadgenParser``), so a bad flag never reaches library code as NaN, inf or -1.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from loadgen.util.inputs import api_key_env_problem, header_problem, target_url_problem
from loadgen.util.limits import MAX_CONCURRENCY, MAX_OFFSET_NS, MAX_PARAM, MAX_SEED, MAX_TIMEOUT_S
from loadgen.util.redact import redact_url

__all__ = [
    "DURATION",
    "JSON_SCHEMAS",
    "ROUTE_HELP",
    "MAX_OFFSET_S",
    "api_key_env",
    "count",
    "fraction",
    "header",
    "integer",
    "number",
    "output_file",
    "port",
    "seconds",
    "seed",
    "send_lag_ms",
    "target_url",
    "writes_json",
]


#: ``--route`` of compare and practice: which classes decide where interactive traffic goes.
ROUTE_HELP = "interactive (streaming classes), all, or class names (comma list)"


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """An integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer in {lo}..{hi}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value}: expected an integer in {lo}..{hi}")
        return value

    parse.__name__ = "integer"
    return parse


def number(lo: float, hi: float, *, low_open: bool = False) -> Callable[[str], float]:
    """A finite float in [lo, hi] (``low_open``: (lo, hi])."""
    low = "(" if low_open else "["

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value > hi or value < lo or (low_open and value == lo):
            raise argparse.ArgumentTypeError(f"{text}: expected a finite number in {low}{lo:g}, {hi:g}]")
        return value

    parse.__name__ = "number"
    return parse


#: A seed for numpy (non-negative, int64).
seed = integer(0, MAX_SEED)
#: A TCP port (0 = any free port).
port = integer(0, 65535)
#: A bound on the client's send-lag p99, in milliseconds (positive).
send_lag_ms = number(0.0, MAX_PARAM, low_open=True)


def count(lo: int = 1, hi: int = MAX_CONCURRENCY) -> Callable[[str], int]:
    """A count of things (requests, slots, runs)."""
    return integer(lo, hi)


def seconds(hi: float = MAX_TIMEOUT_S, *, zero: bool = False) -> Callable[[str], float]:
    """A duration in seconds: positive (``zero``: or 0) and finite, at most ``hi``."""
    return number(0.0, hi, low_open=not zero)


def fraction() -> Callable[[str], float]:
    """A share in (0, 1]."""
    return number(0.0, 1.0, low_open=True)


#: The latest offset a trace may hold, in seconds (one year).
MAX_OFFSET_S = MAX_OFFSET_NS / 1e9
#: A trace window or run length, in seconds.
DURATION = seconds(MAX_OFFSET_S)


def target_url(text: str) -> str:
    """An http(s) base URL; the error never shows its password or query values."""
    problem = target_url_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{redact_url(text)!r}: {problem}")
    return text


def api_key_env(text: str) -> str:
    """``--api-key-env``: the NAME of the variable holding the key; the error never shows what was given (a key
    pasted here by mistake must not reach the terminal or logs)."""
    problem = api_key_env_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def output_file(text: str) -> str:
    """A file a command writes (a report, a trace, an engine file): never one a run directory or handoff bundle
    owns (its manifest, a table's part, a summed bundle file), so no output replaces the records it came from."""
    from loadgen.rundir.io import run_owns  # why: only when the flag is given; `loadgen --help` loads no library

    owned = run_owns(text)
    if owned:
        raise argparse.ArgumentTypeError(f"{text}: {owned}: expected a file a run directory or bundle does not own")
    if text != "-" and Path(text).is_dir():  # refused now, not after the work whose result it was to hold
        raise argparse.ArgumentTypeError(f"{text}: is a directory, expected a file to write")
    return text


#: The attribute of an option that writes JSON: the published results (``loadgen schema NAME``) it writes.
JSON_SCHEMAS = "result_schemas"


def writes_json(action: argparse.Action, *schemas: str) -> argparse.Action:
    """Mark ``action`` (an option that prints or writes JSON) with the published results it writes, and name
    them in its help; a test walks the parser and refuses a JSON option without one."""
    setattr(action, JSON_SCHEMAS, schemas)
    action.help = f"{action.help or 'JSON'} (schema: loadgen schema {'|'.join(schemas)})"
    return action


def header(text: str) -> tuple[str, str]:
    """``NAME:VALUE`` as one header (no CR/LF: a value cannot smuggle a second header); the value is never shown."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    problem = "expected NAME:VALUE" if not sep or not name else header_problem(name, value)
    if problem:
        raise argparse.ArgumentTypeError(f"{name[:40]!r}: {problem}")
    return name, value
