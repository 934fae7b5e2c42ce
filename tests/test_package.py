"""Package hygiene: public names, thin CLI, one-way data flow."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
import types
import typing
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
    missing = [name for name in COMMAND_MODULES if name not in help_text]
    assert not missing, f"commands not registered: {missing}"


def test_a_missing_command_module_is_an_error_that_names_it():
    """A command module that cannot be found (a broken install, a renamed file) is never skipped in silence."""
    with pytest.raises(ModuleNotFoundError) as caught:
        build_parser(("run", "no_such_area"))
    assert caught.value.name == "loadgen.cli.no_such_area_cmd"
    assert "loadgen.cli.no_such_area_cmd" in str(caught.value)


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


@pytest.mark.parametrize(
    "layer,forbidden",
    [("analysis", ("loadgen.driver", "loadgen.sim")), ("rundir/schema.py", ("loadgen.driver", "loadgen.analysis"))],
)
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


def test_the_parser_loads_no_library_code():
    """Building the parser (every command pays for it, --help included) imports no numpy, pyarrow or library
    package: one command module that imported the library at registration once cost every call ~2 s of CPU."""
    code = (
        "import sys; from loadgen.cli import build_parser; build_parser(); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'pyarrow', 'pandas', 'httpx') "
        "or m.startswith(('loadgen.analysis', 'loadgen.driver', 'loadgen.sim', 'loadgen.targets', 'loadgen.plan')))))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [], f"building the parser imported: {res.stdout.strip()}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_edges(path: Path, modules: set[str]) -> set[str]:
    """Every loadgen module ``path`` imports at run time (function-local imports included, TYPE_CHECKING not)."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    edges: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                if f"{base}.{alias.name}" in modules:
                    edges.add(f"{base}.{alias.name}")
                elif base in modules:
                    edges.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    edges.discard(me)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _graph() -> dict[str, set[str]]:
    paths = sorted(PKG.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _import_edges(p, modules) for p in paths}


def test_no_import_cycles_between_modules():
    graph = {
        m: {e for e in edges if not m.startswith(e + ".")} for m, edges in _graph().items()
    }  # a package's own __init__
    assert _cycles(graph) == []


def test_no_import_cycles_between_packages():
    def top(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2])

    graph: dict[str, set[str]] = {}
    for module, edges in _graph().items():
        graph.setdefault(top(module), set()).update(
            top(e) for e in edges if top(e) != top(module) and top(e) != "loadgen"
        )
    assert _cycles(graph) == []


def test_function_local_imports_are_deferred_on_purpose():
    """Imports live at module level; a deferred one (a heavy or optional dependency) says why on its line."""
    undocumented = []
    for path in sorted(PKG.rglob("*.py")):
        lines = path.read_text().splitlines()
        for func in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "#" not in lines[node.lineno - 1]:
                    undocumented.append(
                        f"{path.relative_to(PKG.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                    )
    assert undocumented == [], "\n".join(undocumented)


def test_the_package_is_marked_typed_and_the_wheel_carries_the_marker():
    """PEP 561: without ``py.typed`` in the installed package, a user's ``mypy --strict`` script stops at every
    ``from loadgen... import`` ("missing library stubs or py.typed marker") and the typed results are Any."""
    import tomllib

    assert (PKG / "py.typed").is_file()
    pyproject = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["loadgen"]


def _invariant_union(hint: object) -> bool:
    """``list[A | B]`` (or a dict/set of a union, or an optional one): mypy refuses a caller's ``list[A]`` for it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_invariant_union(a) for a in args)
    return origin in (list, dict, set) and bool(args) and typing.get_origin(args[-1]) in (typing.Union, types.UnionType)


@pytest.mark.parametrize("package", PACKAGES)
def test_public_functions_take_what_a_typed_caller_holds(package):
    """A public function that takes ``list[str | Path]`` refuses a strict-typed user's ``list[Path]`` (lists are
    invariant: ``compare_candidates(runs)`` with ``runs = [run_worksheet(...), ...]`` failed ``mypy --strict``);
    such a parameter is a ``Sequence``."""
    module = importlib.import_module(package)
    functions = [getattr(module, name) for name in module.__all__ if inspect.isfunction(getattr(module, name))]
    bad = [
        f"{package}.{f.__name__}({arg}: {hint})"
        for f in functions
        for arg, hint in typing.get_type_hints(f).items()
        if arg != "return" and _invariant_union(hint)
    ]
    assert not bad, f"invariant container of a union (expected Sequence/Mapping): {bad}"
