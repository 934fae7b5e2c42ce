"""Console report: the verdict first, then one compact table per class (rich)."""

from __future__ import annotations

import math
from typing import Any

from rich.markup import escape

from .model import METRICS, Analysis, GroupSummary, stop_sentence


def stability_sentence(s: dict[str, Any]) -> str:
    """The stability verdict in one line: both sides of Little's Law, or why it was not applied."""
    if s.get("applied"):
        apart = s.get("relative_difference")
        return (
            f"stable over {s['interval_s'][0]:.1f}–{s['interval_s'][1]:.1f} s: Little's Law L = "
            f"{s['L']:.2f} in system vs λ·W = {s['lambda_rps']:.3f}/s × {s['W_s']:.3f} s = "
            f"{s['lambda_W']:.2f} ({'λ·W = 0: no relative difference' if apart is None else f'{apart:.1%} apart'})"
        )
    return f"Little's Law not applied: {s.get('reason')}"


__all__ = ["fmt_ci", "fmt_ms", "fmt_share", "render_console", "stability_sentence", "stop_sentence"]


def fmt_ms(value: float | None) -> str:
    """A latency in ms for tables: None → '—', +inf → 'inf'."""
    if value is None:
        return "—"
    if math.isinf(value):
        return "inf"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_ci(ci: list[float] | None) -> str:
    """A 95% interval of a latency: '[low, high]' ('-inf' / 'inf' where the sample does not bound it)."""
    if not ci:
        return ""
    low = "-inf" if math.isinf(ci[0]) and ci[0] < 0 else fmt_ms(ci[0])
    return f"[{low}, {fmt_ms(ci[1])}]"


def fmt_share(value: float | None, ci: list[float] | None = None) -> str:
    """A share as a percentage, with its 95% interval when known."""
    if value is None:
        return "—"
    return f"{value:.1%}" + (f" [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else "")


def _rate(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:,.2f} {unit}"


def _verdict_text(a: Analysis) -> tuple[str, str]:
    if a.verdict == "no budgets":
        head, style = "NO BUDGETS (numbers only)", "bold yellow"
    elif a.verdict == "no data":
        head, style = "NO DATA: no requests in the window", "bold yellow"
    elif a.verdict == "pass":
        head, style = "PASS: every hard budget met (95% intervals within the limits)", "bold green"
    elif a.verdict == "inconclusive":
        head = (
            f"INCONCLUSIVE: no hard budget failed, {len(a.hard_inconclusive)} hard check(s) straddle "
            "their limit (more requests needed)"
        )
        style = "bold yellow"
    else:
        head, style = f"FAIL: {len(a.hard_failures)} hard check(s) failed", "bold red"
    if a.errored:
        head += f"  [ERRORED RUN: error share {a.error_share:.1%} > {a.error_rate_limit:.1%}]"
        style = "bold red"
    return head, style


def _budget_cell(a: Analysis, cname: str, metric: str) -> str:
    parts = []
    for c in a.checks:
        if c.class_name == cname and c.metric == metric:
            mark = {"pass": "ok", "fail": "FAIL" if c.hard else "warn", "inconclusive": "?"}.get(c.outcome, "n/a")
            if c.inconclusive and c.more_requests is not None:
                mark += f" (+{c.more_requests:,} req)"
            parts.append(f"{c.percentile}≤{c.limit:g} {mark}")
    return ", ".join(parts)


def _class_table(a: Analysis, g: GroupSummary) -> Any:
    from rich.table import Table  # deferred: heavy dependency, loaded only when used

    title = (
        f"{g.name}: {g.n_scheduled} scheduled · "
        + " ".join(f"{k} {v}" for k, v in g.status_counts.items() if v)
        + (f" (abandoned {g.abandoned})" if g.abandoned else "")
    )
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in ("metric (ms)", "n", "p50", "p95", "p99", "mean", "max", "budget"):
        t.add_column(col, justify="left" if col in ("metric (ms)", "budget") else "right")
    for metric in METRICS:
        s = g.metrics[metric]
        ci = s.get("ci") or {}
        cells = {
            q: fmt_ms(s[q])
            + ("*" if q == "p99" and s["n"] and s["p99_low_sample"] else "")
            + (f"\n{escape(fmt_ci(ci.get(q)))}" if ci.get(q) else "")
            for q in ("p50", "p95", "p99")
        }
        t.add_row(
            metric.removesuffix("_ms"),
            str(s["n"]),
            cells["p50"],
            cells["p95"],
            cells["p99"],
            fmt_ms(s["mean"]),
            fmt_ms(s["max"]),
            _budget_cell(a, g.name, metric),
        )
    return t


def _server_line(sv: dict[str, Any]) -> str:
    """The server-metrics summary in one line: KV peak, running/waiting, preemptions, prefix hits, tokens/step."""
    bits = []
    if "kv_cache_usage" in sv:
        bits.append(f"KV peak {sv['kv_cache_usage']['peak']:.1%}")
    for key in ("running", "waiting"):
        if key in sv:
            bits.append(f"{key} max {sv[key]['max']:g}")
    if "preemptions" in sv:
        bits.append(f"preemptions {sv['preemptions']['increase']:g}")
    if sv.get("prefix_cache", {}).get("hit_rate") is not None:
        bits.append(f"prefix hit {sv['prefix_cache']['hit_rate']:.1%}")
    if "batch_tokens_per_step" in sv and sv["batch_tokens_per_step"]["mean"] is not None:
        bits.append(f"tokens/step {sv['batch_tokens_per_step']['mean']:.1f}")
    return "server: " + (" · ".join(bits) if bits else f"{sv.get('samples', 0)} samples")


def _replica_table(section: dict[str, Any]) -> Any:
    """Per replica (several target URLs): requests routed, sent, completed, failed, TTFT and ITL p50/p99."""
    from rich.table import Table  # deferred: heavy dependency, loaded only when used

    title = "per replica (requests of the tables above, by the target URL they were routed to)"
    if section.get("not_routed"):
        title += f" · {section['not_routed']} never routed (not dispatched)"
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in ("#", "target", "routed", "sent", "completed", "failed", "TTFT p50/p99 ms", "ITL p50/p99 ms"):
        t.add_column(col, justify="left" if col in ("target",) else "right")
    for r in section["replicas"]:
        ttft, itl = r["ttft_ms"], r["itl_ms"]
        failed = str(r["failed"]) + (
            "\n" + escape(", ".join(f"{k} {v}" for k, v in r["error_kinds"].items())) if r["error_kinds"] else ""
        )
        t.add_row(
            str(r["target_index"]),
            escape(str(r["base_url"])),
            str(r["n_scheduled"]),
            str(r["sent"]),
            str(r["completed"]),
            failed,
            f"{fmt_ms(ttft['p50'])}/{fmt_ms(ttft['p99'])} (n={ttft['n']})",
            f"{fmt_ms(itl['p50'])}/{fmt_ms(itl['p99'])} (n={itl['n']})",
        )
    return t


def render_console(analysis: Analysis, console: Any = None) -> None:
    """Print the report to ``console`` (a ``rich.console.Console``; stdout by default)."""
    from rich.console import Console  # deferred: heavy dependency, loaded only when used
    from rich.panel import Panel  # deferred: heavy dependency, loaded only when used

    a = analysis
    console = console or Console()
    console.print(Panel("\n".join(_verdict_lines(a)), title="verdict", expand=False))
    _print_rates(console, a)
    _print_classes(console, a)
    if a.replicas:
        console.print()
        console.print(_replica_table(a.replicas))
    console.print()
    console.print(stability_sentence(a.stability))
    _print_context(console, a)
    for note in a.notes:
        console.print(f"note: {note}", style="dim")


def _verdict_lines(a: Analysis) -> list[str]:
    """The verdict panel: how the run stopped, whether the client kept up, the verdict and each failed check."""
    head, style = _verdict_text(a)
    lines = [f"[{style}]{head}[/{style}]"]
    for c in a.hard_failures:
        lines.append(f"  [red]✗[/red] {escape(c.reason)}")
    for c in a.hard_inconclusive:
        lines.append(f"  [yellow]?[/yellow] {escape(c.reason)}")
    for c in a.soft_failures:
        lines.append(f"  [yellow]![/yellow] {escape(c.reason)} (soft)")
    stop = stop_sentence(a.run.get("stop") or {})
    if stop:
        lines.insert(0, f"[bold yellow]{stop}[/bold yellow]")
    if a.run.get("prompt_tokens_differ"):
        lines.insert(0, f"[bold yellow]workload: {escape(a.run['prompt_tokens_differ'])}[/bold yellow]")
    if a.run.get("client_fell_behind"):
        lines.insert(0, f"[bold yellow]measurement: {escape(a.run['client_fell_behind'])}[/bold yellow]")
    return lines


def _print_rates(console: Any, a: Analysis) -> None:
    """The run, its window, the three rates (offered, sent, completed) and goodput."""
    run = a.run
    target = run.get("target") or {}
    console.print(
        f"run {a.run_dir} · {run.get('run_kind')} · scenario {run.get('scenario')} · "
        f"model {target.get('model')} · {run.get('requests')} requests, {run.get('chunk_rows')} chunk rows"
    )
    w = a.window
    console.print(
        f"window {w['start_s']:.3f}–{w['end_s']:.3f} s ({w['duration_s']:.3f} s{', default' if w['default'] else ''})"
    )
    o = a.overall
    note = "" if a.rates_meaningful else "  [yellow](instants synthesized: rates not measured)[/yellow]"
    if a.window.get("rates_unmeasured") and o.n_scheduled:
        note += f"  [yellow](rates not measured: {escape(a.window['rates_unmeasured'])})[/yellow]"
    console.print(
        f"offered {_rate(o.offered_rps, 'req/s')} · sent {_rate(o.send_rps, 'req/s')} · completed "
        f"{_rate(o.completed_rps, 'req/s')} · prompt {_rate(o.prompt_tok_s, 'tok/s')} · output "
        f"{_rate(o.output_tok_s, 'tok/s')}{note}"
    )
    if o.n_eligible is not None:  # a scenario judged the run (goodput is None where rates are not measured)
        console.print(
            f"goodput {_rate(o.goodput_rps, 'req/s')} ({o.n_good_completed} completions in the window met every "
            f"hard budget) · attainment {fmt_share(o.attainment, o.attainment_ci)} ({o.n_good}/{o.n_eligible} "
            f"requests scheduled in the window) · error share {fmt_share(a.error_share, a.error_share_ci)}"
        )


def _print_classes(console: Any, a: Analysis) -> None:
    """One table per class (and the overall one when there are several), each with its failures, TTFT by
    turn and goodput; then the tables' legend."""
    groups = list(a.classes.values())
    if len(groups) != 1:
        groups.append(a.overall)
    for g in groups:
        console.print()
        console.print(_class_table(a, g))
        extra = []
        if g.error_kinds:
            extra.append("failures: " + ", ".join(f"{k} {v}" for k, v in g.error_kinds.items()))
        if g.ttft_by_turn and g is not a.overall:
            extra.append(
                "TTFT p50/p99 by turn: "
                + "; ".join(
                    f"{t}: {fmt_ms(s['p50'])}/{fmt_ms(s['p99'])} ms (n={s['n']})" for t, s in g.ttft_by_turn.items()
                )
            )
        if g.sessions and g is not a.overall:
            span = g.sessions["makespan_ms"]
            extra.append(
                f"sessions {g.sessions['n_sessions']} ({g.sessions['n_incomplete']} incomplete): makespan p50/p99 "
                f"{fmt_ms(span['p50'])}/{fmt_ms(span['p99'])} ms (n={span['n']}; first step scheduled -> last done)"
            )
        if g.goodput_rps is not None and g is not a.overall:
            extra.append(
                f"goodput {_rate(g.goodput_rps, 'req/s')}, attainment {fmt_share(g.attainment, g.attainment_ci)}"
            )
        if extra:
            console.print("  " + " · ".join(extra))
    console.print(
        "  \\[low, high]: 95% confidence interval (order statistics; inf = not bounded by this many samples) · "
        "* p99 from fewer than 100 samples · budget ? = inconclusive (+N more requests of the class)",
        style="dim",
    )


def _print_context(console: Any, a: Analysis) -> None:
    """What the run ran on: warm state, engine notes, behaviour-relevant settings, server metrics, token counts."""
    wc = a.warm_cold
    console.print(
        f"warm state: {wc['state']}"
        + (f" ({'; '.join(wc['actions'])})" if wc.get("actions") else "")
        + (
            f" · {wc['n_cold']} cold request(s) apart, cold TTFT p50 {fmt_ms(wc['cold']['ttft_ms']['p50'])} ms"
            if wc.get("n_cold")
            else ""
        )
    )
    if wc.get("engine_notes"):
        console.print("engine: " + "; ".join(f"{k}={v}" for k, v in wc["engine_notes"].items()))
    cache = {k: v for k, v in (wc.get("behavior_relevant") or {}).items() if v is not None}
    if cache:
        console.print("behaviour-relevant settings: " + "; ".join(f"{k}={v}" for k, v in cache.items()))
    if a.server:
        console.print(_server_line(a.server))
    tok = a.overall.tokens.get("output", {})
    if tok:
        console.print(
            f"output tokens (ok requests): target {tok['target']}, client {tok['client']}, server "
            f"{tok['server']}; server−client {tok['server_minus_client']}, server−target "
            f"{tok['server_minus_target']}"
        )
