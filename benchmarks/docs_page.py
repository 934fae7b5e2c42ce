"""The one writer of docs/benchmarks.md: each benchmark script replaces its own section there with what it printed.

    with recorded(__file__):   # in a script's `if __name__ == "__main__":`
        status = main()

Everything the script prints is echoed as usual and kept; when the script ends without an exception and with
status 0, its section (between `<!-- begin NAME -->` and `<!-- end NAME -->`; NAME is the script's file name,
and its subcommand when it has one) is replaced by the date (UTC), the
host (CPU model, cores, memory, GPUs, load average), loadgen's version and git sha, the exact command and the
printed figures. A script without a section gets one at the end of the page. `LOADGEN_BENCH_DOCS=0` leaves the
page alone (a trial run, a script imported by a test).
"""

from __future__ import annotations

import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "benchmarks.md"
sys.path.insert(0, str(REPO))

from loadgen.rundir.identity import harness_identity, host_identity, utc_now_iso


class _Tee(io.TextIOBase):
    """Writes through to the real stream and keeps a copy."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream = stream
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _host_line() -> str:
    host = host_identity()
    memory_gib = (host.memory_bytes or 0) / 2**30
    gpus = ", ".join(g.get("name", "?") for g in host.gpus) or "no GPU"
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{host.cpu_model}, {host.cpu_count} cores, {memory_gib:.0f} GiB, {gpus}; load average {load} at the end"


def section(name: str, command: str, printed: str) -> str:
    """The Markdown section of one script's run."""
    harness = harness_identity()
    sha = f"at {harness.git_sha[:12]}" if harness.git_sha else "(no git sha found)"
    return "\n".join(
        [
            f"<!-- begin {name} -->",
            f"## {name}",
            "",
            f"Written by the script on {utc_now_iso()[:16].replace('T', ' ')} UTC. Host: {_host_line()}. "
            f"loadgen {harness.version} {sha}, Python {harness.python}.",
            "",
            "```bash",
            command,
            "```",
            "",
            "```text",
            printed.rstrip(),
            "```",
            f"<!-- end {name} -->",
        ]
    )


def replace_section(page: str, name: str, text: str) -> str:
    """`page` with `name`'s section replaced by `text` (appended when the page has none)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    if begin in page and end in page:
        head, rest = page.split(begin, 1)
        return head + text + rest.split(end, 1)[1]
    return page.rstrip() + "\n\n" + text + "\n"


@contextmanager
def recorded(script: str) -> Iterator[None]:
    """Tee stdout; on a clean end (no exception, exit status 0) write it as the script's section."""
    name = Path(script).name
    if sys.argv[1:] and not sys.argv[1].startswith("-"):  # a script with subcommands: a section for each
        name = f"{name} {sys.argv[1]}"
    tee = _Tee(sys.stdout)  # type: ignore[arg-type]
    real, sys.stdout = sys.stdout, tee  # type: ignore[assignment]
    try:
        yield
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
        _write(name, tee.kept.getvalue())
        raise
    else:
        _write(name, tee.kept.getvalue())
    finally:
        sys.stdout = real


def portable(text: str) -> str:
    """`text` with this machine's paths written as anyone's: the checkout as `.`, a temporary directory as
    `$TMPDIR/tmp…` and the home directory as `~` (the page records what ran, not where)."""
    text = text.replace(f"{REPO}/", "").replace(str(REPO), ".")
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/tmp[A-Za-z0-9_]+", "$TMPDIR/tmp…", text)
    return text.replace(f"{Path.home()}/", "~/")


def _write(name: str, printed: str) -> None:
    if os.environ.get("LOADGEN_BENCH_DOCS", "1") == "0" or not printed.strip():
        return
    command = shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    page = PAGE.read_text() if PAGE.exists() else "# Benchmarks\n"
    PAGE.write_text(replace_section(page, name, section(name, portable(command), portable(printed))))
    print(f"(figures written to {PAGE})", file=sys.stderr)
