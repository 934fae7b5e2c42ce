"""Every JSON option of the CLI names the published results it writes (``flags.writes_json``): walked from the
parser itself, so a new one without a schema fails here with no list of commands kept by hand."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from loadgen.cli import build_parser
from loadgen.cli.flags import JSON_SCHEMAS, output_file, writes_json
from loadgen.cli.schema_cmd import RESULT_NAMES


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """(command path, option) for every option of ``parser`` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif action.option_strings:
            yield path, action


def _writes_json(action: argparse.Action) -> bool:
    """Named --json..., or a file to write (``flags.output_file``) whose help says JSON."""
    named = any("json" in o for o in action.option_strings)
    return named or (action.type is output_file and "JSON" in (action.help or ""))


def _json_options_without_schema(parser: argparse.ArgumentParser) -> list[str]:
    """Options that print or write JSON naming no published result (``flags.writes_json``)."""
    return [
        f"{path} {action.option_strings[0]}"
        for path, action in _options(parser, "loadgen")
        if _writes_json(action) and not _names_published(getattr(action, JSON_SCHEMAS, ()))
    ]


def _names_published(schemas: tuple[str, ...]) -> bool:
    return bool(schemas) and set(schemas) <= set(RESULT_NAMES)


def test_every_json_option_names_a_published_schema() -> None:
    """A new --json (or an option whose help says it writes JSON) without `flags.writes_json(..., NAME)` naming a
    result `loadgen schema` publishes fails here; no list of commands is kept by hand."""
    parser = build_parser()
    assert _json_options_without_schema(parser) == []
    named = {s for _, a in _options(parser, "loadgen") for s in getattr(a, JSON_SCHEMAS, ())}
    assert {"handoff-build", "handoff-rerun", "handoff-verify", "calibration"} <= named
    # the walk is not vacuous: an unmarked --json, and one naming no published result, are both found
    toy = argparse.ArgumentParser(prog="toy")
    sub = toy.add_subparsers()
    sub.add_parser("plain").add_argument("--json", action="store_true")
    writes_json(sub.add_parser("marked").add_argument("--json", action="store_true"), "no-such-result")
    assert _json_options_without_schema(toy) == ["loadgen plain --json", "loadgen marked --json"]
