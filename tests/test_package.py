"""Package hygiene: public names, thin CLI, one-way data flow."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import loadgen
from loadgen.cli import COMMAND_MODULES, build_parser

PKG = Path(loadgen.__file__).parent
PACKAGES = sorted(
    "loadgen." + name for _, name, ispkg in pkgutil.iter_modules([str(PKG)]) if ispkg and name not in ("data", "cli")
)


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_declares_its_public_names_and_they_exist(package):
    module = importlib.import_module(package)
    assert module.__doc__ and module.__doc__.strip(), f"{package} has no docstring saying what it owns"
    assert hasattr(module, "__all__"), f"{package} has no __all__"
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names {name!r} but it is not defined"


def test_every_command_module_registers_and_help_lists_it():
    parser = build_parser()
    help_text = parser.format_help()
    missing = [name for name in COMMAND_MODULES if name not in help_text and (PKG / "cli" / f"{name}_cmd.py").exists()]
    assert not missing, f"commands not registered: {missing}"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                parts = path.relative_to(PKG.parent).with_suffix("").parts[: -node.level]
                base = ".".join(parts + ((base,) if base else ()))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from loadgen import driver`
    return names


@pytest.mark.parametrize("layer,forbidden", [("analysis", ("loadgen.driver", "loadgen.sim")), ("records.py", ("loadgen.driver", "loadgen.analysis"))])
def test_data_flows_one_way(layer, forbidden):
    paths = [PKG / layer] if layer.endswith(".py") else sorted((PKG / layer).rglob("*.py"))
    for path in paths:
        bad = [name for name in _imports(path) if name.startswith(forbidden)]
        assert not bad, f"{path.relative_to(PKG.parent)} imports {bad}: analysis reads records only"


def test_cli_version_and_unknown_command():
    res = subprocess.run([sys.executable, "-m", "loadgen", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("loadgen ")
    res = subprocess.run([sys.executable, "-m", "loadgen", "no-such-command"], capture_output=True, text=True)
    assert res.returncode == 2
