"""The docs cannot drift: the command reference and the run-directory schema are generated from the code, the
README keeps its two commands and its links, and each benchmark script writes its own section of
docs/benchmarks.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from docs_page import portable, replace_section  # noqa: E402  (benchmarks/ is not a package)


def test_the_reference_pages_are_what_the_code_says() -> None:
    check = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "reference_pages.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    schema = (REPO / "docs" / "reference" / "schema.md").read_text()
    assert "| `first_token_ns` | int64 |" in schema and "| `worker_lost` |" in schema
    for command in ("bench", "run", "analyze", "plan", "compare", "handoff", "sim calibrate", "vllm serve"):
        assert f"`loadgen {command}`" in page


def test_the_readme_starts_with_its_two_commands_and_every_link_resolves() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("pip install -e . && loadgen practice ")
    assert block[1].startswith("pip install -e '.[test]' && python -m pytest -q ")
    assert len(readme.splitlines()) <= 80, "the README is two screens; the rest belongs in docs/"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links
    for link in links:
        assert (REPO / link).exists(), link


def test_a_section_is_replaced_in_place_and_the_rest_is_kept() -> None:
    page = (
        "# B\n\nintro\n\n<!-- begin a.py -->\nold a\n<!-- end a.py -->\n\n<!-- begin b.py -->\nb\n<!-- end b.py -->\n"
    )
    new = replace_section(page, "a.py", "<!-- begin a.py -->\nnew a\n<!-- end a.py -->")
    assert new == page.replace("old a", "new a")
    added = replace_section(new, "c.py", "<!-- begin c.py -->\nc\n<!-- end c.py -->")
    assert added.startswith(new.rstrip()) and added.endswith("<!-- begin c.py -->\nc\n<!-- end c.py -->\n")


def test_the_page_records_no_path_of_this_machine() -> None:
    """A benchmark's command and figures name the checkout, a temporary directory and the home directory as
    anyone's (`.`, `$TMPDIR/tmp…`, `~`): the page says what ran, not where."""
    tmp = Path(tempfile.gettempdir()) / "tmpa3jkusab"
    text = f"run x ({tmp}/rtx4090)  --runs {Path.home()}/.cache/loadgen/heldout  {REPO}/scenarios/engines {REPO}"
    assert portable(text) == "run x ($TMPDIR/tmp…/rtx4090)  --runs ~/.cache/loadgen/heldout  scenarios/engines ."


def _bench(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, str]:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n<!-- begin bench_x.py -->\nold\n<!-- end bench_x.py -->\n\nkept\n")
    script = tmp_path / "bench_x.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "benchmarks")!r})
        import docs_page
        docs_page.PAGE = docs_page.Path({str(page)!r})
        with docs_page.recorded(__file__):
            {body}
        """)
    )
    done = subprocess.run([sys.executable, str(script), "--rate", "5"], capture_output=True, text=True, cwd=tmp_path)
    return done, page.read_text()


def test_a_benchmark_script_writes_its_figures_date_host_and_command(tmp_path: Path) -> None:
    done, page = _bench(tmp_path, 'print("rate 5 req/s: p99 1.25 ms"); sys.exit(0)')
    assert done.returncode == 0, done.stderr
    assert "rate 5 req/s: p99 1.25 ms" in done.stdout  # still printed
    assert "old" not in page and page.endswith("kept\n")
    assert "rate 5 req/s: p99 1.25 ms" in page and "python benchmarks/bench_x.py --rate 5" in page
    assert re.search(r"Written by the script on \d{4}-\d\d-\d\d \d\d:\d\d UTC\. Host: .+ cores", page)


def test_a_failed_benchmark_leaves_the_page_alone(tmp_path: Path) -> None:
    done, page = _bench(tmp_path, 'print("half a figure"); sys.exit(1)')
    assert done.returncode == 1
    assert "old" in page and "half a figure" not in page


@pytest.mark.slow  # ~15 s: two worksheet runs, a plan, and mypy over the package
def test_the_python_examples_of_results_md_run_as_written_and_pass_mypy_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ```python block of docs/results.md runs as written, and type-checks as a user's strict script: the
    package's own modules are followed silently, as an installed (py.typed) package's are."""
    mypy = pytest.importorskip("mypy.api")
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "results.md").read_text(), re.S)
    assert len(blocks) >= 2
    scripts = []
    for i, code in enumerate(blocks):
        script = tmp_path / f"example{i}.py"
        script.write_text(code)
        scripts.append(str(script))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert res.returncode == 0, f"block {i}: {res.stderr[-2000:]}"
    monkeypatch.setenv("MYPYPATH", str(REPO))
    out, err, status = mypy.run(
        ["--strict", "--follow-imports=silent", "--cache-dir", str(tmp_path / ".mypy_cache"), *scripts]
    )
    assert status == 0, out + err
