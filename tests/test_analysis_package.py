"""The analysis package's boundary: public names, and no imports of the driver or the simulator."""

from __future__ import annotations

import ast
from pathlib import Path

import loadgen.analysis as analysis

PKG = Path(analysis.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against loadgen.analysis
                parts = ["loadgen", "analysis"][: max(0, 2 - (node.level - 1))]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_analysis_never_imports_driver_or_sim():
    files = sorted(PKG.rglob("*.py"))
    assert len(files) >= 8
    for path in files:
        for name in _imports(path):
            assert not name.startswith(("loadgen.driver", "loadgen.sim")), f"{path.name} imports {name}"
            assert name not in ("driver", "sim"), f"{path.name} imports {name}"


def test_all_is_exact_and_documented():
    assert sorted(analysis.__all__) == sorted(set(analysis.__all__))
    for name in analysis.__all__:
        assert hasattr(analysis, name), name
    for name in ("analyze_run", "Analysis", "render_console", "write_html"):
        assert name in analysis.__all__
        assert getattr(analysis, name).__doc__
    assert analysis.__doc__ and "driver" in analysis.__doc__
