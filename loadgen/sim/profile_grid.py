"""Where an operator profile stops measuring, and how much of a replay was priced past it.

An operator profile times its kernels on a grid: token counts up to its largest dense point, sequence counts up to
its largest per-sequence point, attention up to its largest prefill chunk, cached prefix, decode count and KV
length, and (MoE) the expert kernel up to its largest token count. Past the grid, ``loadgen.sim.profile``
continues each table linearly from its last two points: no measured point says the kernel keeps that slope (a
GEMM can change tiles, an attention kernel its split). So a prediction should say how much of it rests there.

- ``ProfileGrid``: a profile's largest point on each axis (``ProfileGrid.of``), the axes a step's composition
  passes (``beyond``), and the engine settings that let steps pass them (``settings_beyond``, read by the engine
  writer);
- ``GridCoverage``: a replay's count of steps, and of their profiled time, priced past the grid, by axis; the
  worksheet records it in the run's engine notes (``profile_grid``) and ``coverage_line`` says it in one line.

An axis is passed when a step's value is above the grid's largest point on it: a step's tokens (as charged: padded
to its CUDA-graph size), its sequences, its largest prefill chunk, its largest cached prefix, its decodes (past the
decode-only grid; decodes past the mixed grid's last count are priced from the decode-only grid, which is
measured), its longest decode KV, and the tokens a GPU's experts see (the step's, times the expert-parallel
degree).
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .profile import OperatorProfile

__all__ = ["AXES", "GridCoverage", "ProfileGrid", "coverage_line"]

#: The axes, in the order they are reported, with how each is named in a line.
AXES: dict[str, str] = {
    "tokens": "tokens in a step",
    "sequences": "sequences in a step",
    "prefill_chunk": "prefill chunk",
    "cached_prefix": "cached prefix",
    "decodes": "decodes in a step",
    "kv": "decode KV length",
    "expert_tokens": "tokens an expert kernel sees",
}
_NONE: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProfileGrid:
    """A profile's largest measured point on each axis (``expert_tokens`` None: not an MoE profile)."""

    tokens: int
    sequences: int
    prefill_chunk: int
    cached_prefix: int
    decodes: int
    kv: int
    expert_tokens: int | None = None

    @classmethod
    def of(cls, profile: OperatorProfile) -> ProfileGrid:
        """The grid of ``profile``: on an axis several tables share, the smallest of their largest points."""
        moe = [keys[-1] for keys, _ in profile.moe_us.values()]
        mixed = profile.mixed_wide or profile.mixed_attention  # the chunk grid that reaches furthest
        return cls(
            tokens=min(keys[-1] for keys, _ in profile.dense_us.values()),
            sequences=min(keys[-1] for keys, _ in profile.per_sequence_us.values()),
            prefill_chunk=mixed.pc[-1],
            cached_prefix=mixed.kp[-1],
            decodes=profile.decode_attention.nd[-1],
            kv=min(profile.decode_attention.kd[-1], mixed.kd[-1]),
            expert_tokens=min(moe) if moe else None,
        )

    def beyond(
        self, tokens: int, sequences: int, chunk: int, prefix: int, decodes: int, kv: float, expert_tokens: int
    ) -> tuple[str, ...]:
        """The axes a step's composition passes (empty: every term read between measured points)."""
        if (
            tokens <= self.tokens
            and sequences <= self.sequences
            and chunk <= self.prefill_chunk
            and prefix <= self.cached_prefix
            and decodes <= self.decodes
            and kv <= self.kv
            and (self.expert_tokens is None or expert_tokens <= self.expert_tokens)
        ):
            return _NONE
        values = (tokens, sequences, chunk, prefix, decodes, kv, expert_tokens)
        limits = astuple(self)  # the fields are the axes, in AXES order
        return tuple(a for a, v, lim in zip(AXES, values, limits, strict=True) if lim is not None and v > lim)

    def settings_beyond(self, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, ep: int) -> list[str]:
        """What an engine of these settings can run past the grid, one phrase each (empty: nothing)."""
        out = []
        if max_num_batched_tokens > self.tokens:
            out.append(f"max_num_batched_tokens {max_num_batched_tokens:,} > the profiled {self.tokens:,} tokens")
        if max_num_batched_tokens > self.prefill_chunk:
            out.append(f"prefill chunks up to {max_num_batched_tokens:,} tokens > the profiled {self.prefill_chunk:,}")
        if max_num_seqs > self.sequences:
            out.append(f"max_num_seqs {max_num_seqs:,} > the profiled {self.sequences:,} sequences")
        if max_num_seqs > self.decodes:
            out.append(f"up to {max_num_seqs:,} decodes in a step > the profiled {self.decodes:,}")
        if max_model_len > self.kv:
            out.append(f"max_model_len {max_model_len:,} > the profiled KV length {self.kv:,}")
        if self.expert_tokens is not None and max_num_batched_tokens * ep > self.expert_tokens:
            out.append(
                f"an expert kernel over up to {max_num_batched_tokens * ep:,} tokens (ep {ep}) > the profiled "
                f"{self.expert_tokens:,}"
            )
        return out


@dataclass
class GridCoverage:
    """A replay's steps priced from the profile: how many, and how much of their profiled time, passed its grid."""

    steps: int = 0
    steps_beyond: int = 0
    profiled_ns: float = 0.0
    profiled_ns_beyond: float = 0.0
    by_axis: dict[str, int] = field(default_factory=dict)

    def add(self, axes: tuple[str, ...], ns: float) -> None:
        """Count one step of profiled time ``ns`` that passed ``axes`` (empty: none)."""
        self.steps += 1
        self.profiled_ns += ns
        if axes:
            self.steps_beyond += 1
            self.profiled_ns_beyond += ns
            for axis in axes:
                self.by_axis[axis] = self.by_axis.get(axis, 0) + 1

    def to_dict(self, grid: ProfileGrid) -> dict[str, Any]:
        """The engine notes' ``profile_grid``: the counts, the share of profiled time, and the grid itself."""
        return {
            "steps": self.steps,
            "steps_beyond": self.steps_beyond,
            "profiled_s": self.profiled_ns / 1e9,
            "profiled_s_beyond": self.profiled_ns_beyond / 1e9,
            "by_axis": {a: self.by_axis[a] for a in AXES if a in self.by_axis},
            "grid": asdict(grid),
        }

    @staticmethod
    def merge(notes: list[dict[str, Any]]) -> dict[str, Any]:
        """Several engines' ``profile_grid`` notes as one (their grids are one profile's)."""
        by_axis: dict[str, int] = {}
        for n in notes:
            for axis, count in n["by_axis"].items():
                by_axis[axis] = by_axis.get(axis, 0) + count
        return {
            "steps": sum(n["steps"] for n in notes),
            "steps_beyond": sum(n["steps_beyond"] for n in notes),
            "profiled_s": sum(n["profiled_s"] for n in notes),
            "profiled_s_beyond": sum(n["profiled_s_beyond"] for n in notes),
            "by_axis": {a: by_axis[a] for a in AXES if a in by_axis},
            "grid": notes[0]["grid"],
        }


def coverage_line(note: dict[str, Any] | None) -> str | None:
    """One line for a replay's ``profile_grid`` note: every step within the grid, or how much passed it and where
    (None: no profiled step)."""
    if not note or not note.get("steps"):
        return None
    steps, beyond = note["steps"], note["steps_beyond"]
    if not beyond:
        return f"profile grid: all {steps:,} steps priced between measured points"
    share = 100.0 * note["profiled_s_beyond"] / note["profiled_s"] if note["profiled_s"] else 0.0
    grid = note["grid"]
    where = ", ".join(f"{AXES[a]} > {grid[a]:,} ({n:,})" for a, n in note["by_axis"].items())
    return (
        f"profile grid: {beyond:,} of {steps:,} steps ({share:.1f}% of the profiled step time) priced past the "
        f"profile's measured points, continued linearly: {where}"
    )
