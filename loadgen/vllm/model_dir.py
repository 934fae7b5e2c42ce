"""A model directory vLLM can serve with no download: a shipped (or given) config.json plus a local tokenizer.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on a deterministic English-like corpus;
served with ``--load-format dummy`` the directory needs no weights either.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from loadgen.ledger.config import config_int, read_model_config_json
from loadgen.util.errors import EngineError
from loadgen.util.outputfile import make_output_dir

__all__ = ["make_model_dir", "model_config_path", "shipped_model_path", "shipped_models"]

DEFAULT_MODEL = "tiny-llama-gqa"

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from it his an were are which this be or had "
    "not but first one their its new after who they have her she two been other when there all during "
    "into school time may years more most only over city some world would where later up such used many "
    "can state about national out known university united then made system water number people market "
    "model token cache memory request latency throughput budget queue prefill decode stream server"
)
_WORDS = _WORD_TEXT.split()


def shipped_models() -> list[str]:
    """Names of the model configs shipped in loadgen/data/models (tiny CPU models and real shapes)."""
    root = resources.files("loadgen") / "data" / "models"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def shipped_model_path(name: str) -> Path:
    """The path of shipped model config ``name``; EngineError naming the shipped ones if there is none."""
    path = Path(str(resources.files("loadgen") / "data" / "models" / f"{name}.json"))
    if not path.is_file():
        raise EngineError(
            f"model config {name!r}: not shipped: expected a config.json path or one of {', '.join(shipped_models())}"
        )
    return path


def model_config_path(spec: str) -> Path:
    """A config.json (or model directory) path, or the name of a shipped model config (``loadgen vllm models``)."""
    path = Path(spec)
    if path.exists() or path.suffix == ".json" or len(path.parts) > 1:
        return path  # a path, found or not: a missing one is the reader's one line
    return shipped_model_path(spec)


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic English-like text to train a byte-level BPE on (no download)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(lines):
        n = int(rng.integers(6, 20))
        picks = rng.integers(0, len(_WORDS), n)
        digits = f" {int(rng.integers(0, 10_000))}" if rng.random() < 0.3 else ""
        out.append(" ".join(_WORDS[i] for i in picks) + digits + ".")
    return out


def _read_config(config: str | Path | None) -> tuple[Path, dict[str, Any]]:
    """The source config path (a path, a model directory or a shipped name; default tiny-llama-gqa) and its
    top-level JSON object, read by the ledger's one config reader (one-line EngineError when unusable)."""
    if config is None:
        src = shipped_model_path(DEFAULT_MODEL)
    elif Path(config).exists():
        src = Path(config)
    else:
        src = shipped_model_path(str(config))
    return read_model_config_json(src, EngineError)


def _train_tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    """A byte-level BPE with ``<s>``/``</s>`` as ids 0/1, trained on ``_corpus(seed)``."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    return tok


def make_model_dir(
    config: str | Path | None, out: str | Path, *, tokenizer_vocab: int | None = None, seed: int = 0
) -> Path:
    """Write ``out/config.json`` (a path or a shipped name; default tiny-llama-gqa) and a locally trained tokenizer.

    The tokenizer is a byte-level BPE trained with ``tokenizers`` on a deterministic corpus, with
    ``<s>``/``</s>`` as ids 0/1; the config's bos/eos ids are pointed at them. Served with
    ``--load-format dummy`` the directory needs no download and no weights.
    """
    src, cfg = _read_config(config)
    vocab = config_int(cfg, str(src), "vocab_size")
    if vocab < 300:
        raise EngineError(f"{src}: vocab_size = {vocab!r}: expected >= 300 for a byte-level tokenizer")
    max_len = config_int(cfg, str(src), "max_position_embeddings", required=False) or 2048
    out = make_output_dir(out, "a model directory (--out)", EngineError)
    tok = _train_tokenizer(min(vocab, tokenizer_vocab or 4096), seed)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "model_max_length": max_len,
                "clean_up_tokenization_spaces": False,
                "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:",
            },
            indent=2,
        )
    )
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    cfg["bos_token_id"], cfg["eos_token_id"] = 0, 1
    cfg.pop("pad_token_id", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    (out / "loadgen_model.json").write_text(
        json.dumps(
            {
                "source_config": str(src),
                "tokenizer_vocab": tok.get_vocab_size(),
                "seed": seed,
                "note": "config.json + locally trained byte-level BPE; serve with --load-format dummy",
            },
            indent=2,
        )
    )
    return out
