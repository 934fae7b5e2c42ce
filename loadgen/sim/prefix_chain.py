"""A trace's prompt block hashes as the engine's prefix-cache chain, at the engine's own KV block size.

A trace may carry ``prompt_block_hashes`` (hash i = the chained hash of the first (i + 1) x B prompt tokens, B the
trace metadata's ``block_hash_tokens``). The engine caches whole blocks of its own size b. Engine block j (its
first (j + 1) x b tokens) is keyed by the first trace hash that covers it: the trace hash itself when the two end
together (exact: every b that is a multiple of B), else that hash and where the engine block ends inside it. Two
prompts then share an engine block only when they share the trace block around its end, which can miss a hit
vLLM would make (prompts that part inside that trace block) but never invents one. A Mooncake trace (B = 512) on
16-token blocks hits in whole 512-token steps, as its hashes allow.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["engine_block_chain"]

_MASK = (1 << 63) - 1


def engine_block_chain(
    hashes: Sequence[int], trace_block_tokens: int, block_size: int, prompt_tokens: int
) -> list[int]:
    """The engine's chain of block keys for a prompt of ``prompt_tokens`` whose trace hashes are ``hashes``:
    one per full engine block that the hashes cover (none past the prompt)."""
    if trace_block_tokens == block_size:
        return list(hashes[: prompt_tokens // block_size])
    covered = min(len(hashes) * trace_block_tokens, prompt_tokens)
    chain: list[int] = []
    for j in range(covered // block_size):
        end = (j + 1) * block_size
        k = -(-end // trace_block_tokens) - 1  # the trace block that holds the engine block's last token
        inside = end - k * trace_block_tokens
        chain.append(hashes[k] if inside == trace_block_tokens else hash((hashes[k], inside)) & _MASK)
    return chain
