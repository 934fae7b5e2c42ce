"""Readable text rendering of a ledger: one row per line with bytes, GiB and the filled-in formula."""

from __future__ import annotations

from .compute import Ledger
from .settings import GIB

__all__ = ["format_ledger"]


def format_ledger(ledger: Ledger) -> str:
    m, kv = ledger.model, ledger.kv
    out = [
        f"model {m.architecture} ({m.source}): {m.num_layers} layers, attention {kv.attention}, "
        f"{ledger.parameters['total']:,} parameters; max_model_len {ledger.max_model_len}; per device (tp {ledger.engine.tensor_parallel_size})",
        f"KV bytes/token {ledger.kv_bytes_per_token:,} = {kv.formula()}"
        + (f"; sliding window {kv.sliding_window} on {kv.sliding_layers} layers" if kv.sliding_layers else ""),
    ]
    if ledger.kv_cache_blocks is not None:
        out.append(
            f"KV cache: {ledger.kv_cache_blocks:,} blocks × {kv.block_size} = {ledger.kv_cache_tokens:,} token slots; "
            f"vLLM would report {ledger.vllm_kv_cache_size_tokens:,} tokens, max concurrency "
            f"{ledger.max_concurrency_at_max_len:.2f}x at {ledger.max_model_len:,} tokens/request"
        )
    out.append("")
    out.append(f"{'line':<20} {'bytes':>18} {'GiB':>10}  {'kind':<8} formula")
    for line in ledger.lines:
        out.append(f"{line.name:<20} {line.bytes:>18,} {line.bytes / GIB:>10.3f}  {line.kind:<8} {line.formula}")
    out.append(f"{'total':<20} {ledger.total_bytes:>18,} {ledger.total_bytes / GIB:>10.3f}")
    if ledger.classes:
        out.append("")
        out.append(
            f"{'class':<14} {'p50 len':>8} {'p99 len':>8} {'blk p50':>8} {'blk p99':>8} {'seqs p50':>9} {'seqs p99':>9} {'p50+prefix':>10} {'limit p99':>9}"
        )
        for c in ledger.classes:
            out.append(
                f"{c.name:<14} {c.total_p50:>8.0f} {c.total_p99:>8.0f} {c.blocks_p50:>8} {c.blocks_p99:>8} "
                f"{c.max_seqs_p50:>9,} {c.max_seqs_p99:>9,} {c.max_seqs_p50_prefix_shared:>10,} {c.limit_p99:>9,}"
            )
        out.append(f"(limit p99 = min(KV-limited sequences at p99 length, max_num_seqs {ledger.engine.max_num_seqs}))")
    for note in ledger.notes:
        out.append(f"note: {note}")
    return "\n".join(out)
