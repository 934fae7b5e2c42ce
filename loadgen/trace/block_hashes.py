"""Prompt block hashes: the one definition of how a prompt's token ids become a trace's ``prompt_block_hashes``.

Hash i stands for the first (i + 1) x B tokens of the prompt (B = ``TOKEN_BLOCK_TOKENS``, vLLM's KV block size):
each is blake2b-64 over the previous block's hash and this block's token ids, as vLLM chains its block hashes,
so two prompts share hash i exactly when their first (i + 1) x B tokens are equal. Only full blocks are hashed
(vLLM caches only full blocks). The value is a signed int64 (Arrow's int64).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["BLOCK_HASH_RULE", "TOKEN_BLOCK_TOKENS", "chained_block_hashes"]

#: Tokens per hashed block for token-id imports (vLLM's KV block size on CUDA).
TOKEN_BLOCK_TOKENS = 16
#: How the hashes were made, for a trace's metadata.
BLOCK_HASH_RULE = "blake2b-64(previous hash as int64 LE || block token ids as int64 LE), full blocks only"


def chained_block_hashes(token_ids: Sequence[int], block_tokens: int = TOKEN_BLOCK_TOKENS) -> list[int]:
    """The chained hash of every full ``block_tokens`` block of ``token_ids``, in order."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens = {block_tokens}: expected >= 1")
    ids = np.asarray(token_ids, dtype="<i8")
    out: list[int] = []
    prev = 0
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        digest = hashlib.blake2b(
            prev.to_bytes(8, "little", signed=True) + ids[start : start + block_tokens].tobytes(), digest_size=8
        ).digest()
        prev = int.from_bytes(digest, "little", signed=True)
        out.append(prev)
    return out
