"""Writing a file the user named, whole or not at all; the twin of ``inputfile``.

The text goes to ``<name>.partial`` beside the target, is optionally checked there, and is renamed over the
target: a reader never finds half a file, a refused or interrupted write leaves neither the partial nor a changed
target, and an error names the file the user gave, not the partial (nor nothing: a full disk's failed write() names
no file). A target that is a directory is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from loadgen.util.errors import LoadgenError

__all__ = ["PARTIAL_SUFFIX", "make_output_dir", "output_partial", "write_output_text"]

#: The suffix of the temporary file a write goes through.
PARTIAL_SUFFIX = ".partial"


@contextlib.contextmanager
def output_partial(path: str | Path) -> Iterator[Path]:
    """The temporary file to write ``path`` through: renamed over ``path`` when the block ends cleanly, removed
    when anything escapes it (``path`` untouched). ``path``'s folder is made if missing; a folder at ``path`` is
    refused before the block runs; an OSError of the block that names the temporary file names ``path``."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, expected a file to write", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        try:
            yield partial
        except OSError as exc:  # name the user's file: the partial is ours (a failed write() names no file)
            if exc.filename not in (None, str(partial)):
                raise
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a folder of that name is not ours to remove
            partial.unlink(missing_ok=True)
        raise


def write_output_text(path: str | Path, text: str, check: Callable[[Path], object] | None = None) -> Path:
    """Write ``text`` to ``path`` through ``output_partial``.

    ``check``, if given, is called with the temporary file before it replaces ``path``; whatever it raises
    propagates, with the temporary file removed and ``path`` untouched.
    """
    with output_partial(path) as partial:
        partial.write_text(text, encoding="utf-8")
        if check is not None:
            try:
                check(partial)
            except LoadgenError as exc:  # name the user's file, as an OSError does: the partial is ours
                message = str(exc)
                if str(partial) not in message or type(exc).__init__ is not LoadgenError.__init__:
                    raise
                raise type(exc)(message.replace(str(partial), f"{path} (not written)")) from None
    return Path(path)


def make_output_dir(path: str | Path, what: str, error: type[LoadgenError] = LoadgenError) -> Path:
    """Make the directory the user named for a command's output (its parents too; an existing one is kept); a
    file at ``path`` or above it, or a directory that cannot be made, is ``error`` naming ``what`` was expected."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise error(f"{path}: is a file: expected {what}") from None
    except NotADirectoryError:
        raise error(f"{path}: a file stands in its path: expected {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot create ({exc.strerror}): expected {what}") from None
    return path
