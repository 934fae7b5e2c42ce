"""The run catalog: every run and plan directory found under some roots, in one local DuckDB file.

``Catalog.index(roots)`` walks the roots for run directories (a ``manifest.json`` beside a requests table) and
plan directories (a ``plan.json``), and records for each its identity (package versions, engine, model, GPU,
scenario, trace and settings hashes), state and headline figures per class (``headline``). A directory is
read again only when its signature changed: the sizes and modification times of its manifest and of every
part file of its requests table. The catalog holds pointers and summaries, never copies of the Parquet, and can
be rebuilt from the directories at any time (delete the file, index again). A directory indexed before and now
missing (moved or deleted) is marked ``present = false`` and reported, not an error.

Deeper questions go to the Parquet itself, in place, with DuckDB (``docs/runs.md`` has examples).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from loadgen.plan.compare import identity_of
from loadgen.plan.files import PLAN_FILE, REGION_FILE
from loadgen.rundir.manifest import Manifest, read_manifest
from loadgen.rundir.schema import MANIFEST_FILE, REQUESTS_FILE
from loadgen.util.errors import LoadgenError, RunDirError
from loadgen.util.jsonfile import read_json_object

from .headline import HEADLINE_COLUMNS, headline_figures

__all__ = ["CATALOG_ENV", "RUN_COLUMNS", "Catalog", "IndexReport", "default_catalog_path"]

#: Environment variable naming the catalog file (default: ``$XDG_CACHE_HOME/loadgen/catalog.duckdb``).
CATALOG_ENV = "LOADGEN_CATALOG"
_SCHEMA_VERSION = 1

#: The ``runs`` table: one row per run or plan directory (``kind``), keyed by its absolute path.
RUN_COLUMNS: dict[str, str] = {
    "path": "VARCHAR PRIMARY KEY",
    "kind": "VARCHAR",  # run | plan
    "present": "BOOLEAN",
    "signature": "VARCHAR",
    "indexed_utc": "VARCHAR",
    "state": "VARCHAR",
    "run_kind": "VARCHAR",  # measured | simulated | imported (runs)
    "started_utc": "VARCHAR",
    "loadgen_version": "VARCHAR",
    "python": "VARCHAR",
    "packages": "VARCHAR",  # JSON {name: version}
    "target_kind": "VARCHAR",
    "engine": "VARCHAR",
    "engine_version": "VARCHAR",
    "model": "VARCHAR",
    "gpu": "VARCHAR",
    "cpu_model": "VARCHAR",
    "scenario_name": "VARCHAR",
    "scenario_sha256": "VARCHAR",
    "trace_name": "VARCHAR",
    "trace_sha256": "VARCHAR",
    "trace_seed": "BIGINT",
    "settings_sha256": "VARCHAR",  # sha256 of the run's identity keys under options, target.engine, warm_state
    "requests_recorded": "BIGINT",
    "plan_cell": "VARCHAR",  # JSON, a run inside a plan
    "plan_name": "VARCHAR",  # plans
    "cells": "BIGINT",  # plans: runs recorded in plan.json
    "region": "VARCHAR",  # plans: region.json's summary line, when written
    "problem": "VARCHAR",  # why a directory could not be read (it stays listed)
}
_CLASS_TYPES = {name: "VARCHAR" if name == "request_class" else "BIGINT" for name in HEADLINE_COLUMNS[:4]}
_CLASS_COLUMNS: dict[str, str] = {"path": "VARCHAR"} | {
    name: _CLASS_TYPES.get(name, "DOUBLE") for name in HEADLINE_COLUMNS
}


_ARROW = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_()}
_RUNS_ARROW = pa.schema([(k, _ARROW[v.split()[0]]) for k, v in RUN_COLUMNS.items()])
_CLASSES_ARROW = pa.schema([(k, _ARROW[v]) for k, v in _CLASS_COLUMNS.items()])


def default_catalog_path() -> Path:
    """``$LOADGEN_CATALOG``, else ``$XDG_CACHE_HOME/loadgen/catalog.duckdb`` (``~/.cache`` by default)."""
    if os.environ.get(CATALOG_ENV):
        return Path(os.environ[CATALOG_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "loadgen" / "catalog.duckdb"


@dataclass
class IndexReport:
    """What one ``index`` call did."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    missing: list[str] = field(default_factory=list)  # indexed before, gone now (moved or deleted)
    problems: list[str] = field(default_factory=list)  # found but unreadable: path: why

    def summary(self) -> str:
        text = f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged"
        if self.missing:
            text += f", {len(self.missing)} missing (moved or deleted; kept with present = false)"
        if self.problems:
            text += f", {len(self.problems)} unreadable (listed with their problem)"
        return text


def _stat_sig(path: Path) -> str:
    st = path.stat()
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"


def _signature(directory: Path, kind: str) -> str:
    """Sizes and mtimes of what the catalog reads of a directory: changes when any of it does. A table's part
    files are never rewritten in place (each is written whole, then renamed in), so the table directory's mtime
    changes whenever a part is added or removed."""
    if kind == "plan":
        names = [directory / PLAN_FILE, directory / REGION_FILE]
        return "|".join(_stat_sig(p) for p in names if p.exists())
    return f"{_stat_sig(directory / MANIFEST_FILE)}|{_stat_sig(directory / REQUESTS_FILE)}"


def _walk(roots: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """(directory, "run" | "plan") under the roots, without descending into a run's tables."""
    for root in roots:
        if not root.is_dir():
            raise RunDirError(f"{root}: not a directory: expected a directory holding run or plan directories")
        for here, dirs, files in os.walk(root):
            path = Path(here)
            if PLAN_FILE in files:
                yield path.resolve(), "plan"
            if MANIFEST_FILE in files and (REQUESTS_FILE in dirs or REQUESTS_FILE in files):
                yield path.resolve(), "run"
                dirs[:] = [d for d in dirs if not d.endswith(".parquet")]
            dirs.sort()


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def _settings_sha256(manifest: Manifest) -> str:
    ident = identity_of(manifest)
    keys = {k: v for k, v in ident.items() if k.startswith(("options", "target.engine", "warm_state"))}
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()


def _gpu(manifest: Manifest) -> str | None:
    gpus = manifest.host.gpus if manifest.host else []
    names = [str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")]
    return f"{len(names)}x {names[0]}" if names else None


def _run_row(path: Path, manifest: Manifest) -> dict[str, Any]:
    harness, engine, target = manifest.harness, manifest.target.engine, manifest.target
    return {
        "state": manifest.state,
        "run_kind": manifest.run_kind,
        "started_utc": manifest.started_utc,
        "loadgen_version": harness.version if harness else None,
        "python": harness.python if harness else None,
        "packages": _json(harness.packages if harness else None),
        "target_kind": target.kind,
        "engine": engine.name if engine else None,
        "engine_version": engine.version if engine else None,
        "model": target.model,
        "gpu": _gpu(manifest),
        "cpu_model": manifest.host.cpu_model if manifest.host else None,
        "scenario_name": manifest.scenario.name if manifest.scenario else None,
        "scenario_sha256": manifest.scenario.sha256 if manifest.scenario else None,
        "trace_name": manifest.trace.name if manifest.trace else None,
        "trace_sha256": manifest.trace.sha256 if manifest.trace else None,
        "trace_seed": manifest.trace.seed if manifest.trace else None,
        "settings_sha256": _settings_sha256(manifest),
        "requests_recorded": manifest.requests_recorded,
        "plan_cell": _json(manifest.plan_cell),
    }


def _plan_row(path: Path) -> dict[str, Any]:
    state = read_json_object(path / PLAN_FILE, "plan state")
    region = read_json_object(path / REGION_FILE, "plan region") if (path / REGION_FILE).exists() else None
    plan: dict[str, Any] = state["plan"] if isinstance(state.get("plan"), dict) else {}
    scenario: dict[str, Any] = state["scenario"] if isinstance(state.get("scenario"), dict) else {}
    harness: dict[str, Any] = state["harness"] if isinstance(state.get("harness"), dict) else {}
    cells = state.get("cells")
    return {
        "state": str(state.get("status") or "running"),
        "started_utc": state.get("created_utc"),
        "loadgen_version": harness.get("version"),
        "python": harness.get("python"),
        "packages": _json(harness.get("packages")),
        "scenario_name": scenario.get("name"),
        "scenario_sha256": scenario.get("sha256"),
        "settings_sha256": state.get("plan_sha256"),
        "plan_name": str(plan.get("name")) if plan.get("name") is not None else None,
        "cells": len(cells) if isinstance(cells, dict) else None,
        "region": _json({"cells_used": region.get("cells_used"), "runs_used": region.get("runs_used")})
        if region
        else None,
    }


class Catalog:
    """One DuckDB catalog file: ``with Catalog(path) as cat: cat.index([root]); cat.list("engine = 'x'")``."""

    def __init__(self, path: Path | str | None = None, *, read_only: bool = False) -> None:
        self.path = Path(path) if path is not None else default_catalog_path()
        if read_only and not self.path.exists():
            raise RunDirError(f"{self.path}: no run catalog: expected one made by `loadgen runs index DIR`")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        try:
            self.db = duckdb.connect(str(self.path), read_only=read_only)
            if not read_only:
                self._create()
        except duckdb.Error as exc:
            if new:  # a catalog this call began (a full disk): no empty file to be refused later as "not valid"
                self._remove_unfinished()
            raise RunDirError(f"{self.path}: cannot open the run catalog: {_first_line(exc)}") from exc

    def _remove_unfinished(self) -> None:
        """Close and delete a catalog file (and its write-ahead log) this call created and could not finish."""
        db = getattr(self, "db", None)
        if db is not None:
            with contextlib.suppress(duckdb.Error):
                db.close()
        for path in (self.path, self.path.with_name(self.path.name + ".wal")):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def _create(self) -> None:
        runs = ", ".join(f"{k} {v}" for k, v in RUN_COLUMNS.items())
        classes = ", ".join(f"{k} {v}" for k, v in _CLASS_COLUMNS.items())
        self.db.execute(f"CREATE TABLE IF NOT EXISTS runs ({runs})")
        self.db.execute(f"CREATE TABLE IF NOT EXISTS classes ({classes})")
        self.db.execute("CREATE TABLE IF NOT EXISTS catalog_info (key VARCHAR PRIMARY KEY, value VARCHAR)")
        self.db.execute("INSERT OR REPLACE INTO catalog_info VALUES ('schema_version', ?)", [str(_SCHEMA_VERSION)])

    # ---- indexing ----------------------------------------------------------------------------------
    def index(self, roots: Iterable[Path | str]) -> IndexReport:
        """Index every run and plan directory under ``roots``; unchanged ones are not read again."""
        paths = [Path(r) for r in roots]
        known = dict(self.db.execute("SELECT path, signature FROM runs").fetchall())
        report, seen = IndexReport(), set()
        rows: list[dict[str, Any]] = []
        class_rows: list[tuple[Any, ...]] = []
        for directory, kind in _walk(paths):
            key = str(directory)
            seen.add(key)
            try:
                sig = _signature(directory, kind)
            except OSError as exc:  # vanished while walking
                report.problems.append(f"{key}: {exc.strerror or exc}")
                continue
            if known.get(key) == sig:
                report.unchanged += 1
                continue
            row, headlines = self._read(directory, kind, report)
            rows.append({"path": key, "kind": kind, "present": True, "signature": sig} | row)
            class_rows += [(key, *(getattr(h, c) for c in HEADLINE_COLUMNS)) for h in headlines]
            if key in known:
                report.updated += 1
            else:
                report.added += 1
        try:
            self._store(rows, class_rows)
        except duckdb.Error as exc:  # a full disk at commit: the transaction is rolled back, the rows are as before
            with contextlib.suppress(duckdb.Error):
                self.db.execute("ROLLBACK")
            raise RunDirError(
                f"{self.path}: cannot write the run catalog ({_first_line(exc)}): nothing of this index was recorded"
            ) from None
        try:
            self._mark_missing(paths, seen, report)
        except duckdb.Error as exc:
            raise RunDirError(
                f"{self.path}: cannot write the run catalog ({_first_line(exc)}): {len(rows)} directories were "
                "recorded, the ones gone were not marked missing"
            ) from None
        return report

    def _read(self, directory: Path, kind: str, report: IndexReport) -> tuple[dict[str, Any], list[Any]]:
        try:
            if kind == "plan":
                return _plan_row(directory), []
            manifest = read_manifest(directory)
            return _run_row(directory, manifest), headline_figures(directory)
        except (LoadgenError, OSError, ValueError) as exc:
            report.problems.append(f"{directory}: {exc}")
            return {"problem": str(exc)}, []

    def _store(self, rows: list[dict[str, Any]], class_rows: list[tuple[Any, ...]]) -> None:
        """Replace the rows of these paths, in one transaction (Arrow tables: DuckDB's fast path)."""
        if not rows:
            return
        now = datetime.now(UTC).isoformat(timespec="seconds")
        runs = pa.Table.from_pylist([r | {"indexed_utc": now} for r in rows], schema=_RUNS_ARROW)
        classes = pa.Table.from_pylist([dict(zip(_CLASS_COLUMNS, row)) for row in class_rows], schema=_CLASSES_ARROW)
        self.db.register("new_runs", runs)
        self.db.register("new_classes", classes)
        try:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM classes WHERE path IN (SELECT path FROM new_runs)")
            self.db.execute("DELETE FROM runs WHERE path IN (SELECT path FROM new_runs)")
            self.db.execute(f"INSERT INTO runs SELECT {', '.join(RUN_COLUMNS)} FROM new_runs")
            self.db.execute(f"INSERT INTO classes SELECT {', '.join(_CLASS_COLUMNS)} FROM new_classes")
            self.db.execute("COMMIT")
        finally:
            self.db.unregister("new_runs")
            self.db.unregister("new_classes")

    def _mark_missing(self, roots: list[Path], seen: set[str], report: IndexReport) -> None:
        """Rows whose directory is gone (under the indexed roots and not found, or anywhere and not on disk):
        present = false (kept, reported)."""
        prefixes = tuple(str(r.resolve()).rstrip("/") + "/" for r in roots)
        for (path,) in self.db.execute("SELECT path FROM runs WHERE present").fetchall():
            if path in seen:
                continue
            if path.startswith(prefixes) or str(path) + "/" in prefixes or not Path(path).exists():
                report.missing.append(path)
        if report.missing:
            self.db.executemany("UPDATE runs SET present = false WHERE path = ?", [(p,) for p in report.missing])

    # ---- queries -----------------------------------------------------------------------------------
    def rows(self, where: str | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Rows of ``runs`` (newest first) matching the SQL condition ``where`` over its columns."""
        sql = (
            "SELECT * FROM runs" + (f" WHERE {where}" if where else "") + " ORDER BY started_utc DESC NULLS LAST, path"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._dicts(sql, where)

    def classes(self, path: str) -> list[dict[str, Any]]:
        """The headline rows of one run, per class then ``overall``."""
        return self._dicts(
            "SELECT * FROM classes WHERE path = ? ORDER BY request_class = 'overall', request_class", None, [path]
        )

    def find(self, key: str) -> dict[str, Any]:
        """One row by path (absolute or relative to here) or by a unique suffix of its path; ``present`` says
        whether its directory is on disk now. A directory on disk that is not catalogued is refused, never
        matched by suffix to another run of the same name."""
        here = Path(key).resolve()
        exact = self._dicts("SELECT * FROM runs WHERE path = ?", None, [str(here)])
        if exact:
            return exact[0] | {"present": bool(exact[0]["present"]) and here.is_dir()}
        if here.exists():
            raise RunDirError(
                f"runs show {key}: {here} is not in the catalog: expected a catalogued run (loadgen runs index {key})"
            )
        matches = self._dicts("SELECT * FROM runs WHERE path LIKE ?", None, ["%" + key.rstrip("/")])
        if len(matches) == 1:
            return matches[0] | {"present": bool(matches[0]["present"]) and Path(matches[0]["path"]).is_dir()}
        what = "no catalogued run" if not matches else f"{len(matches)} catalogued runs"
        raise RunDirError(f"runs show {key}: {what} match: expected a path or a unique end of one (loadgen runs list)")

    def _dicts(self, sql: str, where: str | None, params: list[Any] | None = None) -> list[dict[str, Any]]:
        try:
            cur = self.db.execute(sql, params or [])
        except duckdb.Error as exc:
            text = str(exc).splitlines()[0]
            raise RunDirError(f"--where {where!r}: {text}: expected an SQL condition over the runs columns") from exc
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
