"""A bundle's integrity: SHA256SUMS, the reproducible tar.gz, and verification of either form.

A bundle holds only regular files inside its own folder. Verification refuses, before reading any
content, a symbolic link, a hard link, a device or FIFO entry, and any name that leaves the bundle
(absolute or with a ``..`` part), whether in the directory, the tar.gz or SHA256SUMS: a link whose
target happens to match its checksum must not make a bundle pass.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import tarfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from loadgen.rundir.identity import sha256_file
from loadgen.util.errors import RunDirError
from loadgen.util.outputfile import output_partial

from .layout import SUMS_FILE

__all__ = ["VerifyResult", "verify_bundle", "write_sums", "write_tar"]


def write_sums(bundle_dir: Path) -> list[str]:
    """Write SHA256SUMS (``sha256sum -c`` format) for every file of the bundle; returns the names summed."""
    files = sorted(p for p in bundle_dir.rglob("*") if p.is_file() and p.name != SUMS_FILE)
    rels = [p.relative_to(bundle_dir).as_posix() for p in files]
    (bundle_dir / SUMS_FILE).write_text("".join(f"{sha256_file(bundle_dir / r)}  {r}\n" for r in rels))
    return rels


def write_tar(bundle_dir: Path, tarball: Path) -> None:
    """A reproducible tar.gz (sorted names, fixed mtimes/owners) with the bundle dir as its top folder."""
    with (
        output_partial(tarball) as partial,
        open(partial, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(bundle_dir.rglob("*")):
            if not path.is_file():
                continue
            info = tarfile.TarInfo(f"{bundle_dir.name}/{path.relative_to(bundle_dir).as_posix()}")
            info.size = path.stat().st_size
            info.mode = 0o644
            info.mtime = 0
            with open(path, "rb") as handle:
                tar.addfile(info, handle)


@dataclass
class VerifyResult:
    ok: bool
    files_checked: int
    problems: list[str]  # "FILE: what is wrong", first is the first bad file

    @property
    def first_problem(self) -> str | None:
        return self.problems[0] if self.problems else None


def verify_bundle(bundle: str | Path) -> VerifyResult:
    """Check every file of a bundle (directory or .tar.gz) against its SHA256SUMS; extra files are problems,
    and so are links, special files and names that leave the bundle (refused before any content is read)."""
    bundle = Path(bundle)
    if bundle.is_dir():
        return _verify_dir(bundle)
    if not bundle.is_file():
        raise RunDirError(f"{bundle}: no such file or directory: expected a handoff bundle (directory or .tar.gz)")
    return _verify_tar(bundle)


def _leaves_bundle(name: str) -> bool:
    """True for an absolute name or one with a ``..`` part (POSIX or Windows spelling)."""
    posix = PurePosixPath(name.replace("\\", "/"))
    return posix.is_absolute() or ".." in posix.parts or bool(re.match(r"[A-Za-z]:[\\/]", name))


def _refused(problems: list[str]) -> VerifyResult:
    return VerifyResult(False, 0, problems)


def _verify_dir(bundle: Path) -> VerifyResult:
    files: list[str] = []
    unsafe: list[str] = []
    for root, dirs, names in os.walk(bundle, followlinks=False):
        for name in sorted(dirs) + sorted(names):
            path = Path(root) / name
            rel = path.relative_to(bundle).as_posix()
            mode = path.lstat()
            if stat.S_ISLNK(mode.st_mode):
                unsafe.append(
                    f"{rel}: a symbolic link (to {os.readlink(path)}): a bundle holds only regular files; "
                    "refusing to follow it"
                )
            elif stat.S_ISDIR(mode.st_mode):
                continue
            elif not stat.S_ISREG(mode.st_mode):
                unsafe.append(f"{rel}: a device, FIFO or socket: a bundle holds only regular files")
            elif mode.st_nlink > 1:
                unsafe.append(
                    f"{rel}: a hard link ({mode.st_nlink} names for one file): a bundle holds only "
                    "regular files of its own"
                )
            else:
                files.append(rel)
    if unsafe:
        return _refused(unsafe)
    return _verify_entries(files, str(bundle), lambda n: (bundle / n).read_bytes())


def _tar_member_problem(member: tarfile.TarInfo) -> str | None:
    if _leaves_bundle(member.name):
        return (
            f"{member.name}: the archive entry's path leaves the bundle: a bundle holds only relative paths inside it"
        )
    if member.issym():
        return f"{member.name}: a symbolic link (to {member.linkname}): a bundle holds only regular files"
    if member.islnk():
        return f"{member.name}: a hard link (to {member.linkname}): a bundle holds only regular files"
    if not (member.isfile() or member.isdir()):
        return f"{member.name}: a device or FIFO entry: a bundle holds only regular files"
    return None


def _verify_tar(bundle: Path) -> VerifyResult:
    try:
        with tarfile.open(bundle, "r:*") as tar:
            all_members = tar.getmembers()
            unsafe = [p for p in map(_tar_member_problem, all_members) if p]
            if unsafe:
                return _refused(unsafe)
            members = [m for m in all_members if m.isfile()]
            tops = {m.name.split("/", 1)[0] for m in members}
            strip = tops.pop() + "/" if len(tops) == 1 and all("/" in m.name for m in members) else ""
            data = {m.name[len(strip) :]: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RunDirError(f"{bundle}: unreadable archive ({exc}): expected a handoff bundle .tar.gz") from None
    return _verify_entries(list(data), str(bundle), lambda n: data[n])


def _read_sums(raw: bytes) -> dict[str, str] | str:
    """SHA256SUMS as {name: digest}, or the problem line when it cannot be used."""
    expected: dict[str, str] = {}
    for n, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        m = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line.strip())
        if not m:
            return f"{SUMS_FILE}: line {n} unreadable: expected '<sha256>  <file>'"
        if _leaves_bundle(m.group(2)):
            return (
                f"{SUMS_FILE}: line {n} names {m.group(2)!r}, a path that leaves the bundle: expected a name inside it"
            )
        expected[m.group(2)] = m.group(1)
    return expected


def _verify_entries(entries: Collection[str], label: str, reader: Callable[[str], bytes]) -> VerifyResult:
    if SUMS_FILE not in entries:
        return VerifyResult(False, 0, [f"{SUMS_FILE}: missing from {label}"])
    expected = _read_sums(reader(SUMS_FILE))
    if isinstance(expected, str):
        return VerifyResult(False, 0, [expected])
    problems: list[str] = []
    for name in sorted(expected):
        if name not in entries:
            problems.append(f"{name}: listed in {SUMS_FILE} but missing")
            continue
        digest = hashlib.sha256(reader(name)).hexdigest()
        if digest != expected[name]:
            problems.append(f"{name}: sha256 {digest[:12]}… does not match {SUMS_FILE} ({expected[name][:12]}…)")
    for name in sorted(set(entries) - set(expected) - {SUMS_FILE}):
        problems.append(f"{name}: not listed in {SUMS_FILE}")
    return VerifyResult(not problems, len(expected), problems)
