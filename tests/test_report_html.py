"""HTML and console reports: self-contained file, plots embedded; renders in headless Chromium."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_analysis_run import build_run, known_chunks, known_requests, scenario_two_classes

from loadgen.analysis import analyze_run, render_console, write_html

S = 1_000_000_000


def _rich_run(tmp_path: Path) -> Path:
    reqs, chunks = known_requests(), known_chunks()
    metrics = []
    for t in range(4):
        metrics += [
            (t * S // 4, "vllm:kv_cache_usage_perc", {}, 0.1 * t),
            (t * S // 4, "vllm:num_requests_running", {}, t),
            (t * S // 4, "vllm:num_requests_waiting", {}, 3 - t),
        ]
    return build_run(tmp_path / "run", reqs, chunks, scenario=scenario_two_classes(), metrics=metrics)


def test_html_is_self_contained_with_plots(tmp_path):
    a = analyze_run(_rich_run(tmp_path))
    path = write_html(a, tmp_path / "report.html")
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert len(re.findall(r'<img alt="plot" src="data:image/png;base64,', text)) == 3  # CDFs, timeline, lengths
    # the interactive timeline: Plotly's script inlined once, and the figure's three panels on one time axis
    assert text.count("<h2>Timeline, interactive") == 1 and "rangeslider" in text and "TTFT short-message" in text
    markup = re.sub(r"<script[^>]*>.*?</script>", "", text, flags=re.S)  # Plotly's bundle quotes links in its code
    assert not re.search(r'(src|href)="(https?:)?//', markup)  # nothing fetched from elsewhere
    assert not re.search(r"<script[^>]+src=", text)  # every script inline
    assert "FAIL" in text and "short-message ttft_ms p99 inf" in text  # verdict with its reasons
    assert "Little" in text and "KV" in text


def test_console_report_puts_verdict_first(tmp_path):
    from rich.console import Console

    a = analyze_run(_rich_run(tmp_path))
    buf = io.StringIO()
    render_console(a, Console(file=buf, width=140, color_system=None))
    out = buf.getvalue()
    assert out.index("FAIL") < out.index("short-message")
    assert "ERRORED RUN" in out and "p99 from fewer than 100 samples" in out
    assert "Little's Law" in out and "KV peak 30.0%" in out


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.mark.browser
def test_html_renders_in_headless_chromium(tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("headless Chromium not installed (apt-get install -y chromium)")
    a = analyze_run(_rich_run(tmp_path))
    page = write_html(a, tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    # --dump-dom runs the page's scripts; the error hook in the page would put "JS error" in the title
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    env = dict(os.environ, HOME=str(tmp_path))
    dom = subprocess.run(common + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, env=env)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<title>loadgen report</title>" in dom.stdout, dom.stdout[:500]
    assert 'id="verdict"' in dom.stdout
    console_errors = [
        line for line in dom.stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)
    ]
    assert not console_errors, console_errors
    run = subprocess.run(
        common + [f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert img.shape[0] >= 1000 and img.shape[1] >= 1000
    assert img.std() > 10  # not blank: text, tables and plots
    assert (img < 128).mean() > 0.01  # some dark pixels (text/lines)
