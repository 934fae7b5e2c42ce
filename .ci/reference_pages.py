"""Writes the generated reference pages, so they cannot drift from the code:

- docs/reference/cli.md from loadgen's argparse parsers (`loadgen.cli.build_parser`, every subparser walked);
- docs/reference/schema.md from the run-directory format (`loadgen.rundir.schema`: file names, Arrow schemas with
  the comments beside each field, statuses, error kinds).

    python .ci/reference_pages.py            # rewrite the pages
    python .ci/reference_pages.py --check    # exit 1 when a committed page differs (tests/test_docs.py runs it)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI_PAGE = REPO / "docs" / "reference" / "cli.md"
SCHEMA_PAGE = REPO / "docs" / "reference" / "schema.md"
WIDTH = "100"  # argparse wraps usage lines at $COLUMNS: fixed, so the page is the same on every terminal

HEADER = """# Command reference

Generated from the argparse parsers (`loadgen.cli.build_parser`) by `python .ci/reference_pages.py`; a test fails
when this page differs from what the parsers say, so do not edit it by hand. `loadgen COMMAND --help` prints the
same text.
"""


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each direct subcommand, in registration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                yield name, helps.get(name, ""), sub


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        if isinstance(action.metavar, str):
            metavar = " " + action.metavar
        elif action.choices:
            metavar = " {" + ",".join(str(c) for c in action.choices) + "}"
        else:
            metavar = " " + action.dest.upper()
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        text = formatter._expand_help(action) if action.help else ""
        lines.append(f"- {_flags(action)}: {' '.join(text.split())}".rstrip(": "))
    return lines


def _section(path: str, summary: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    out = [f"{'#' * min(depth, 4)} `{path}`", ""]
    text = " ".join((parser.description or summary).split())
    if text:
        out += [text, ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    arguments = _arguments(parser)
    if arguments:
        out += [*arguments, ""]
    for name, help_text, sub in _subcommands(parser):
        out += _section(f"{path} {name}", help_text, sub, depth + 1)
    return out


def render_cli() -> str:
    os.environ["COLUMNS"] = WIDTH
    from loadgen.cli import build_parser  # why: after COLUMNS is set, which argparse reads when formatting

    parser = build_parser()
    lines = [HEADER, "## `loadgen`", "", "```text", parser.format_usage().strip(), "```", ""]
    lines += [*_arguments(parser), ""]
    for name, help_text, sub in _subcommands(parser):
        lines += _section(f"loadgen {name}", help_text, sub, 2)
    return "\n".join(lines).rstrip() + "\n"


SCHEMA_HEADER = """# Run-directory schema

Generated from `loadgen/rundir/schema.py` by `python .ci/reference_pages.py` (a test fails when this page differs),
so it is the format the code writes. What the tables mean, and how they are written and read, is in
[run directories](../run-directory.md); the metrics computed from them in [metric definitions](../metrics.md).
"""

_FIELD = re.compile(r'pa\.field\("(\w+)",\s*([^,]+?\))(,\s*nullable=False)?\)(?:,)?\s*(?:#\s*(.*))?$')
_ITEM = re.compile(r'^\s*"(\w+)",\s*#\s*(.*)$')


def _block(source: str, name: str) -> list[str]:
    """The source lines of `NAME = ...(` up to its closing line, and the `#:` comment above it."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name} = "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(")"))
    doc = lines[start - 1][3:].strip() if lines[start - 1].startswith("#:") else ""
    return [doc, *lines[start + 1 : end]]


def _fields_table(source: str, name: str) -> list[str]:
    doc, *body = _block(source, name)
    out = [doc, "", "| column | Arrow type | required | meaning |", "|---|---|---|---|"] if doc else []
    pending = ""
    for line in body:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending = (pending + " " + stripped.lstrip("# ")).strip()
            continue
        match = _FIELD.search(stripped)
        if match:
            if pending:  # a comment line above a group of fields names the group
                out.append(f"| *{pending}* | | | |")
            column, arrow, required, comment = match.groups()
            meaning = (comment or "").replace("|", "\\|")
            arrow = arrow.removeprefix("pa.").replace("()", "").rstrip("_")
            out.append(f"| `{column}` | {arrow} | {'yes' if required else ''} | {meaning} |")
            pending = ""
    return [*out, ""]


def render_schema() -> str:
    from loadgen.rundir import schema  # why: after sys.path holds this checkout

    source = Path(schema.__file__).read_text()
    lines = [SCHEMA_HEADER]
    lines += [f"Schema version {schema.SCHEMA_VERSION}. Files in a run directory:", ""]
    lines += [f"- `{schema.MANIFEST_FILE}`: the identity of everything that ran (the typed `Manifest`)"]
    for f in (schema.REQUESTS_FILE, schema.CHUNKS_FILE, schema.SERVER_METRICS_FILE):
        lines.append(f"- `{f}/`: a directory of Parquet part files, read as one table")
    lines += [f"- `{schema.CONTRACT_FILE}`: the behaviour-contract result, when one was replayed", ""]
    for title, name in (
        (f"## `{schema.REQUESTS_FILE}`", "REQUESTS_SCHEMA"),
        (f"## `{schema.CHUNKS_FILE}`", "CHUNKS_SCHEMA"),
        (f"## `{schema.SERVER_METRICS_FILE}`", "SERVER_METRICS_SCHEMA"),
        ("## Traces (input to a run)", "TRACE_SCHEMA"),
    ):
        lines += [title, "", *_fields_table(source, name)]
    since = ", ".join(f"`{c}` (version {v})" for c, v in schema.COLUMNS_SINCE.items())
    lines += [f"Request columns added after version 1, read back as null from older runs: {since}.", ""]
    lines += ["## Statuses", "", "Every scheduled request ends with exactly one of: "]
    lines[-1] += ", ".join(f"`{s}`" for s in schema.STATUSES) + "."
    lines += ["", "## Error kinds", "", "| `error_kind` | when |", "|---|---|"]
    for line in _block(source, "ERROR_KINDS")[1:]:
        item = _ITEM.match(line)
        if item:
            lines.append(f"| `{item.group(1)}` | {item.group(2)} |")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    sys.path.insert(0, str(REPO))
    stale = []
    for page, text in ((CLI_PAGE, render_cli()), (SCHEMA_PAGE, render_schema())):
        if "--check" not in sys.argv[1:]:
            page.write_text(text)
        elif not page.exists() or page.read_text() != text:
            stale.append(str(page.relative_to(REPO)))
    if stale:
        print(f"stale: {', '.join(stale)}: run python .ci/reference_pages.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
