"""The import graph of loadgen's top-level units (prints figures; asserts nothing).

rooms: the top-level units (subpackages and root modules of loadgen/); arrows: the distinct imports from one
unit to another (module-level and deferred ones alike); floors: the levels of that graph (the longest chain of
arrows, bottom floor 1, a cycle counted as one room); up-arrows: the arrows inside a cycle (the only way an
arrow can point up a floor). Then the lines per unit.

    python benchmarks/import_graph.py [REPO]
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path


def _imported(node: ast.AST, parts: tuple[str, ...]) -> list[str]:
    """The dotted names an import statement in module ``parts`` (loadgen, pkg, ..., mod) may name."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = list(parts[:-1])[: len(parts) - node.level]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return [mod] + [f"{mod}.{a.name}" for a in node.names]


def graph(repo: Path) -> tuple[set[str], dict[str, set[str]], collections.Counter[str]]:
    pkg = repo / "loadgen"
    units = {p.name for p in pkg.iterdir() if (p / "__init__.py").exists()}
    units |= {p.stem for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")}
    edges: dict[str, set[str]] = collections.defaultdict(set)
    lines: collections.Counter[str] = collections.Counter()
    for f in pkg.rglob("*.py"):
        parts = f.relative_to(repo).with_suffix("").parts
        src = parts[1]
        if src not in units:
            continue
        text = f.read_text()
        lines[src] += text.count("\n")
        for node in ast.walk(ast.parse(text)):
            for name in _imported(node, parts):
                bits = name.split(".")
                if len(bits) > 1 and bits[0] == "loadgen" and bits[1] in units and bits[1] != src:
                    edges[src].add(bits[1])
    return units, edges, lines


def _components(units: set[str], edges: dict[str, set[str]]) -> dict[str, int]:
    """Each unit's strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    comp: dict[str, int] = {}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w not in comp:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            k = len(set(comp.values()))
            while True:
                w = stack.pop()
                comp[w] = k
                if w == v:
                    break

    for v in sorted(units):
        if v not in index:
            visit(v)
    return comp


def main(repo: Path) -> None:
    units, edges, lines = graph(repo)
    comp = _components(units, edges)
    floor: dict[int, int] = {}

    def level(k: int) -> int:
        if k not in floor:
            below = [comp[w] for v in units if comp[v] == k for w in edges[v] if comp[w] != k]
            floor[k] = 1 + max((level(c) for c in below), default=0)
        return floor[k]

    up = sum(1 for v in units for w in edges[v] if comp[v] == comp[w])
    print(
        f"rooms {len(units)}  floors {max(level(k) for k in set(comp.values()))}  up-arrows {up}  "
        f"arrows {sum(len(e) for e in edges.values())}"
    )
    print("lines per unit: " + ", ".join(f"{u} {n}" for u, n in lines.most_common()))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
