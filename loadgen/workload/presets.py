"""Shipped presets: the canonical scenario, engine configs, contract cases, plans, the price example, canonical traces.

One source of truth: the files live in the top-level ``scenarios/`` and ``traces/`` directories of the source
tree, where users see them. The package maps them in as ``loadgen/scenarios`` and ``loadgen/traces`` (symbolic
links in the source tree; a built wheel carries them as package data), and this module reads them through
``importlib.resources`` so an installed loadgen finds them in site-packages. ``copy_presets`` is
``loadgen scenario init DIR``: the presets, copied out for editing.

    resolve("engines", "instant")          -> .../scenarios/engines/instant.toml
    resolve("engines", "my-engine.toml")   -> my-engine.toml (an existing path wins)
    canonical_scenario()                   -> .../scenarios/canonical.toml
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from loadgen.util.errors import ScenarioError

__all__ = [
    "KINDS",
    "canonical_scenario",
    "canonical_trace",
    "copy_presets",
    "list_presets",
    "preset_dir",
    "presets_root",
    "prices_example",
    "resolve",
]

#: Preset kinds: a sub-directory of ``scenarios/`` ("" is the top level: scenarios and the price example).
KINDS = ("", "engines", "contract", "plans")


def _package_dir(name: str) -> Path:
    """``loadgen/<name>`` as a filesystem path (a zipped install cannot serve presets as files)."""
    found = resources.files("loadgen") / name
    if not isinstance(found, Path):  # pragma: no cover - only a zip import
        raise ScenarioError(f"loadgen/{name}: inside a zip archive: expected loadgen installed as files (pip install)")
    return found.resolve()  # the source tree's link resolves to the top-level directory users see


def presets_root() -> Path:
    """The shipped ``scenarios/`` directory (source tree or installed package)."""
    return _package_dir("scenarios")


def preset_dir(kind: str) -> Path:
    """The directory holding presets of ``kind`` (one of KINDS)."""
    if kind not in KINDS:
        raise ValueError(f"preset kind {kind!r}: expected one of {KINDS}")
    return presets_root() / kind if kind else presets_root()


def list_presets(kind: str) -> list[str]:
    """Names (file stems) of the shipped presets of ``kind``."""
    return sorted(p.stem for p in preset_dir(kind).glob("*.toml"))


def resolve(kind: str, name_or_path: str | Path) -> Path | None:
    """An existing path as given, else the shipped preset ``<kind>/<name>.toml``, else None."""
    path = Path(name_or_path)
    if path.exists():
        return path
    text = str(name_or_path)
    if path.suffix == ".toml" or "/" in text or "\\" in text or not text:
        return None  # a file name is a path (a preset name may hold dots: rtx4090-llama-3.1-8b-tp1)
    preset = preset_dir(kind) / f"{text}.toml"
    return preset if preset.is_file() else None


def canonical_scenario() -> Path:
    """The canonical scenario (three request classes, steady and burst traces)."""
    return presets_root() / "canonical.toml"


def prices_example() -> Path:
    """The example price table (made-up numbers)."""
    return presets_root() / "prices.toml"


def canonical_trace(name: str) -> Path | None:
    """A shipped canonical trace (``steady`` or ``burst``), or None when this install has none."""
    path = _package_dir("traces") / f"canonical-{name}.parquet"
    return path if path.is_file() else None


def copy_presets(dest: str | Path, *, force: bool = False) -> list[Path]:
    """Copy every shipped preset under ``dest`` (same layout as ``scenarios/``); returns the files written.

    Refuses (ScenarioError, nothing written) when a file would be overwritten and ``force`` is false.
    """
    root = presets_root()
    out = Path(dest)
    profiles = root / "engines" / "profiles"  # the operator profiles the profiled engines read (relative paths)
    sources = sorted({p for p in root.rglob("*.toml") if p.is_file()} | {p for p in profiles.rglob("*") if p.is_file()})
    targets = [out / p.relative_to(root) for p in sources]
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"{out}: not a directory: expected a directory to copy the presets into")
    clash = [t for t in targets if t.exists()]
    if clash and not force:
        raise ScenarioError(f"{clash[0]}: already exists: expected a directory without presets (or --force)")
    written = []
    for src, dst in zip(sources, targets):
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        except OSError as exc:
            raise ScenarioError(f"{dst}: cannot write ({exc.strerror}): expected a writable directory") from None
        written.append(dst)
    return written
