"""The ``loadgen`` command: parse arguments, call one library function, print, exit.

Each area registers its subcommands from its own module (``loadgen/cli/<area>_cmd.py`` with a
``register(subparsers)`` function), so the CLI stays thin and areas do not collide.
This is the one place where errors become exit codes: a bad flag (argparse), a LoadgenError or an
OSError on a file the user named → one line ``loadgen: error: ...`` on stderr and exit 2; Ctrl-C → exit
130, SIGTERM → 143, SIGHUP → 129 (both stop the way Ctrl-C does: ``loadgen.util.interrupts``); anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

from loadgen.util import interrupts, pinning
from loadgen.util.errors import LoadgenError

from .. import __version__

__all__ = ["LoadgenParser", "build_parser", "entry", "main"]


class LoadgenParser(argparse.ArgumentParser):
    """argparse with one-line errors (``loadgen: error: loadgen run: argument --x: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"loadgen: error: {self.prog}: {message} (see {self.prog} --help)\n")


#: Areas in the order their commands are listed by --help.
COMMAND_MODULES = (
    "bench",
    "scenario",
    "trace",
    "ledger",
    "sim",
    "run",
    "analyze",
    "import",
    "vllm",
    "plan",
    "compare",
    "diff",
    "runs",
    "export",
    "practice",
    "contract",
    "handoff",
    "managed",
    "schema",
)


def build_parser(modules: tuple[str, ...] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The parser of every command in ``modules`` (``loadgen/cli/<name>_cmd.py``); a missing one is an error
    that names it (ModuleNotFoundError), never a command silently absent."""
    parser = LoadgenParser(prog="loadgen", description="Workload-specific capacity evidence for LLM serving.")
    parser.add_argument("--version", action="version", version=f"loadgen {__version__}")
    parser.add_argument(
        "--client-cpus",
        metavar="LIST",
        help="pin loadgen and its workers to these CPUs (e.g. 0 or 0-3,8); see --engine-cpus",
    )
    parser.add_argument(
        "--engine-cpus",
        metavar="LIST",
        help="pin every engine loadgen launches (simulated engine, vLLM and its OpenMP threads) to these CPUs",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in modules:
        importlib.import_module(f"loadgen.cli.{name}_cmd").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    interrupts.install()
    try:
        _pin(args)
        rc = args.func(args)
    except LoadgenError as exc:
        print(f"loadgen: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"loadgen: interrupted ({interrupts.signal_name()})", file=sys.stderr)
        return interrupts.exit_code()
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except OSError as exc:  # a file or port the user named: unreadable, unwritable, full disk
        if not interrupts.caused_by_interrupt(exc):
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"loadgen: error: {_one_line(where + (exc.strerror or str(exc)))}", file=sys.stderr)
            return 2
        print(f"loadgen: interrupted ({interrupts.signal_name()})", file=sys.stderr)
        return interrupts.exit_code()
    except Exception as exc:
        if not interrupts.caused_by_interrupt(exc):
            raise
        print(f"loadgen: interrupted ({interrupts.signal_name()})", file=sys.stderr)
        return interrupts.exit_code()
    return int(rc or 0)


def _pin(args: argparse.Namespace) -> None:
    """``--client-cpus`` pins this process (workers inherit it); ``--engine-cpus`` is handed to launchers."""
    if args.engine_cpus is not None:
        engine = pinning.parse_cpus(args.engine_cpus, what="--engine-cpus")
        os.environ[pinning.ENGINE_CPUS_ENV] = pinning.format_cpus(engine)
    if args.client_cpus is not None:
        pinning.pin(0, pinning.parse_cpus(args.client_cpus, what="--client-cpus"))


def _one_line(text: str) -> str:
    """A message as one line (a multi-line detail from a library is joined, never split over lines)."""
    return " | ".join(part.strip() for part in text.splitlines() if part.strip()) or text


def entry() -> None:
    """The program (``loadgen`` and ``python -m loadgen``): ``main``, then exit with its status.

    A run stopped by a signal exits with 128 + the signal's number through ``os._exit`` once its
    output is flushed: CPython re-raises SIGINT at exit (status -2) whenever the KeyboardInterrupt that
    stopped it was raised inside code it ran through its own entry points (a module being imported at
    that instant), even though ``main`` handled it; everything loadgen must close is closed by then.
    """
    code = main()
    if code > 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
