"""A small, deterministic, offline language identifier for contract checks (stdlib only).

Non-Latin scripts are told apart by Unicode block (zh, ja, ko, ru, uk, el, ar, he, hi, th); Latin-script
languages by the share of words that are common function words of each language (en, fr, de, es,
it, pt, nl, sv, pl). It is good enough for "did the answer come back in the expected language" on a
sentence or more; answers under three words give ``und`` (undetermined), which fails a language check
rather than guessing. It is a heuristic: cases should have answers of a sentence or longer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loadgen.workload.words import ENGLISH_WORDS

__all__ = ["SUPPORTED_LANGUAGES", "LanguageGuess", "detect_language"]

_STOPWORDS: dict[str, frozenset[str]] = {
    # the common English words of the prompt vocabulary, and five function words it lacks
    "en": frozenset(ENGLISH_WORDS) | {"an", "it", "or", "we", "you"},
    "fr": frozenset(
        [
            "le",
            "la",
            "les",
            "de",
            "des",
            "du",
            "et",
            "est",
            "un",
            "une",
            "pour",
            "que",
            "qui",
            "dans",
            "en",
            "sur",
            "pas",
            "au",
            "aux",
            "ce",
            "cette",
            "il",
            "elle",
            "ne",
            "se",
            "sont",
            "avec",
            "par",
            "plus",
            "nous",
            "vous",
            "je",
        ]
    ),
    "de": frozenset(
        [
            "der",
            "die",
            "das",
            "und",
            "ist",
            "nicht",
            "ein",
            "eine",
            "zu",
            "den",
            "von",
            "mit",
            "sich",
            "des",
            "auf",
            "für",
            "im",
            "dem",
            "auch",
            "es",
            "an",
            "werden",
            "aus",
            "er",
            "sie",
            "wir",
            "ich",
            "bei",
            "oder",
        ]
    ),
    "es": frozenset(
        [
            "el",
            "la",
            "los",
            "las",
            "de",
            "del",
            "y",
            "es",
            "en",
            "un",
            "una",
            "que",
            "por",
            "para",
            "con",
            "no",
            "se",
            "su",
            "al",
            "lo",
            "como",
            "más",
            "pero",
            "sus",
            "le",
            "ya",
            "o",
            "este",
            "está",
            "son",
        ]
    ),
    "it": frozenset(
        [
            "il",
            "lo",
            "la",
            "gli",
            "le",
            "di",
            "del",
            "della",
            "e",
            "è",
            "un",
            "una",
            "che",
            "per",
            "con",
            "non",
            "si",
            "da",
            "in",
            "al",
            "sono",
            "come",
            "anche",
            "ma",
            "più",
            "questo",
            "nel",
            "alla",
        ]
    ),
    "pt": frozenset(
        [
            "o",
            "a",
            "os",
            "as",
            "de",
            "do",
            "da",
            "dos",
            "das",
            "e",
            "é",
            "um",
            "uma",
            "que",
            "para",
            "com",
            "não",
            "se",
            "em",
            "no",
            "na",
            "por",
            "mais",
            "como",
            "mas",
            "ao",
            "são",
            "foi",
            "seu",
            "sua",
        ]
    ),
    "nl": frozenset(
        [
            "de",
            "het",
            "een",
            "en",
            "van",
            "is",
            "dat",
            "niet",
            "in",
            "op",
            "te",
            "voor",
            "met",
            "zijn",
            "er",
            "aan",
            "ook",
            "als",
            "maar",
            "om",
            "dan",
            "bij",
            "wordt",
            "door",
            "naar",
            "ik",
        ]
    ),
    "sv": frozenset(
        [
            "och",
            "att",
            "det",
            "som",
            "en",
            "är",
            "på",
            "för",
            "med",
            "inte",
            "av",
            "till",
            "den",
            "har",
            "de",
            "jag",
            "om",
            "ett",
            "var",
            "så",
            "men",
            "ska",
            "kan",
            "från",
            "eller",
        ]
    ),
    "pl": frozenset(
        [
            "i",
            "w",
            "nie",
            "na",
            "się",
            "z",
            "do",
            "to",
            "że",
            "jest",
            "jak",
            "o",
            "po",
            "co",
            "tak",
            "za",
            "od",
            "ale",
            "przez",
            "dla",
            "być",
            "jego",
            "już",
            "oraz",
            "są",
            "tylko",
        ]
    ),
}

_SCRIPTS: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    ("ja", ((0x3040, 0x30FF),)),  # hiragana/katakana (checked before han)
    ("ko", ((0xAC00, 0xD7AF), (0x1100, 0x11FF))),
    ("zh", ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))),
    ("el", ((0x0370, 0x03FF),)),
    ("ar", ((0x0600, 0x06FF),)),
    ("he", ((0x0590, 0x05FF),)),
    ("hi", ((0x0900, 0x097F),)),
    ("th", ((0x0E00, 0x0E7F),)),
    ("ru", ((0x0400, 0x04FF),)),
)

SUPPORTED_LANGUAGES = tuple(sorted(set(_STOPWORDS) | {s for s, _ in _SCRIPTS} | {"uk"}))

_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)


@dataclass(frozen=True)
class LanguageGuess:
    language: str  # ISO 639-1, or "und"
    confidence: float  # 0..1: share of evidence for the winner
    words: int


def _script_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ch in text:
        cp = ord(ch)
        if cp < 0x0370:
            continue
        for lang, ranges in _SCRIPTS:
            if any(lo <= cp <= hi for lo, hi in ranges):
                counts[lang] = counts.get(lang, 0) + 1
                break
    return counts


def detect_language(text: str) -> LanguageGuess:
    """Best guess of the language of ``text`` (``und`` when there is too little evidence)."""
    words = [w.lower() for w in _WORD.findall(text)]
    scripts = _script_counts(text)
    letters = sum(1 for ch in text if ch.isalpha())
    non_latin = sum(scripts.values())
    if letters and non_latin / letters >= 0.5:
        if "ja" in scripts:  # kana present: Japanese even with many kanji
            return LanguageGuess("ja", scripts["ja"] / non_latin, len(words))
        lang, n = max(scripts.items(), key=lambda kv: kv[1])
        if lang == "ru" and any(ch in text for ch in "іїєґІЇЄҐ"):
            lang = "uk"
        return LanguageGuess(lang, n / non_latin, len(words))
    if len(words) < 3:
        return LanguageGuess("und", 0.0, len(words))
    scores = {lang: sum(1 for w in words if w in stop) for lang, stop in _STOPWORDS.items()}
    best = max(scores.values())
    if best == 0:
        return LanguageGuess("und", 0.0, len(words))
    winners = sorted(lang for lang, s in scores.items() if s == best)
    if len(winners) > 1:
        return LanguageGuess("und", 0.0, len(words))
    total = sum(scores.values())
    return LanguageGuess(winners[0], best / total, len(words))
