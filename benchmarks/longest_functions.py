"""The longest functions in a source tree (prints figures; asserts nothing).

    python benchmarks/longest_functions.py [ROOT] [--top 10]

A function's length is the lines of its ``def`` including its body and docstring (decorators excluded),
as ``ast`` reports them (``end_lineno - lineno + 1``); nested functions are counted on their own as well
as inside their parent. Parameters are the positional, positional-only and keyword-only ones (``*args``
and ``**kwargs`` not counted).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def function_lengths(root: Path) -> list[tuple[int, int, str, str]]:
    """(lines, parameters, name, file:line) of every function under ``root``, longest first."""
    rows = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                params = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                rows.append((lines, params, node.name, f"{path}:{node.lineno}"))
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1] / "loadgen"))
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    for lines, params, name, where in function_lengths(Path(args.root))[: args.top]:
        print(f"{lines:4d} lines  {params:2d} params  {name:28s} {where}")


if __name__ == "__main__":
    main()
