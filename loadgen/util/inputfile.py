"""Reading a user-named input file's bytes, with the one-line errors every reader gives."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from loadgen.util.errors import LoadgenError

__all__ = ["read_input_bytes", "read_input_csv", "read_input_text"]


def read_input_bytes(path: Path, what: str, error: type[LoadgenError] = LoadgenError) -> bytes:
    """The bytes of ``path``; a missing, unreadable or unnameable file is ``error`` naming ``what`` was expected."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such file: expected {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror}): expected {what}") from None
    except ValueError:  # a NUL byte: no file can have this name
        raise error(f"{str(path)!r}: not a usable file name (NUL byte): expected {what}") from None


def read_input_text(path: Path, what: str, error: type[LoadgenError] = LoadgenError) -> str:
    """``read_input_bytes`` decoded as UTF-8; bytes that are not UTF-8 are ``error`` naming the first bad byte."""
    raw = read_input_bytes(path, what, error)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 (byte {exc.start}): expected {what}") from None


def read_input_csv(
    path: Path, what: str, error: type[LoadgenError] = LoadgenError, columns: tuple[str, ...] = ()
) -> list[dict[str, str]]:
    """The rows of a CSV file with a header (``read_input_text``); not CSV (a NUL byte, a field past the csv
    module's limit), an empty file, or a header without one of ``columns`` is ``error`` naming the file and the
    first missing column."""
    text = read_input_text(path, what, error)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = list(reader)
    except csv.Error as exc:
        raise error(f"{path}: not CSV ({exc}): expected {what}") from None
    header = list(reader.fieldnames or [])
    wanted = f" with columns {', '.join(columns)}" if columns else ""
    if not header:
        raise error(f"{path}: empty: expected {what}{wanted}")
    missing = [c for c in columns if c not in header]
    if missing:
        raise error(
            f"{path}: column {missing[0]!r}: missing: expected {what}{wanted} (the header has {', '.join(header)})"
        )
    return rows
