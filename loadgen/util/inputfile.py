"""Reading a user-named input file's bytes, with the one-line errors every reader gives."""

from __future__ import annotations

from pathlib import Path

from loadgen.util.errors import LoadgenError

__all__ = ["read_input_bytes"]


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
