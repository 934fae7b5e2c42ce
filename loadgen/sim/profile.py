"""A step's time from an operator profile of a GPU: the profiled cost model of the simulated engine.

An operator profile (LLMServingSim's profiler format, vLLM 0.19, ``<GPU>/<org>/<model>/<dtype>/``: ``meta.yaml``
and per tensor-parallel degree ``tp<N>/``) times ONE transformer layer's operators on the GPU:

- ``attention.csv``: one attention layer for a batch of one prefill chunk (``prefill_chunk`` new tokens over
  ``kv_prefill`` cached ones) and ``n_decode`` decodes of ``kv_decode`` tokens each, on doubling grids;
- ``dense.csv``: each dense operator of a layer by the step's token count (``qkv_proj``, ``o_proj``, ...), and
  the once-per-step ``embedding`` and ``final_layernorm``;
- ``per_sequence.csv``: ``lm_head`` and ``sampler`` by the step's sequence count;
- ``moe.csv`` (MoE models): the expert layer by tokens and activated experts.

A step of the engine is priced as (all times per GPU, µs):

    step = Σ_dense-op count × op(T) × layers + embedding(T) + final_layernorm(T)      T = tokens in the step
         + moe(T, experts activated by T) × MoE layers                                (MoE models)
         + (attention(largest chunk, its cached prefix, decodes, mean decode KV)
            + Σ other chunks: attention(chunk, its cached prefix, 0, 0)) × layers
         + lm_head(S) + sampler(S)                                                    S = sequences in the step
         + 2 all-reduces × layers of T × hidden × 2 B                                 (TP > 1)
         + (all-gather + reduce-scatter of T × hidden × 2 B local) × MoE layers       (EP > 1: dispatch, combine)
         + 1 all-reduce of the data-parallel ranks' 4 × ep int32 batch description    (EP > 1: the DP sync)

each collective priced by the engine's link (``loadgen.sim.link``: a measured NCCL table, or an assumed
latency + bandwidth).

Every table is read linearly on each axis between profiled points (a kernel's time is close to linear in each
axis: decode attention is a KV read, ``a + b × n × kv``), held at the first non-zero point below it (a 5-token
chunk costs what the 16-token one does), and extrapolated linearly from the last two points above the grid,
except a mixed step's decodes past the mixed grid's last decode count: those add what they add in the decode-only
grid (``OperatorProfile._layer_attention_us``).
A profile may hold two full grids of steps with a chunk (the RTX PRO 6000 profiles: a fine x1.5 one to a
1,384-token chunk beside the doubling one to 2,048): the fine one is read where it brackets the step, the
doubling one where the fine one would continue past its last point or hold its first (``_attention``).
How much of a replay was priced past every grid is counted by ``loadgen.sim.profile_grid``.
A step's largest prefill chunk shares the decodes' row of the table and every other chunk adds its own attention
(vLLM's varlen kernel attends each sequence to its own keys; ``Engine._profile_ns``); decodes are read at their
mean KV length (the uniform batch that reads the same KV), corrected for mixed lengths by the profile's fitted
``skew`` table where it has one. Layer norms count twice per layer (before attention and before the MLP).
An MoE layer's activated experts are the expected distinct experts of uniform top-k routing over its tokens;
with expert parallelism (``ep`` GPUs, data-parallel ranks equally loaded, vLLM's all-gather / reduce-scatter
exchange, vLLM 0.19's default ``all2all_backend``) a GPU holds E/ep experts and runs them over the whole
group's ep × T tokens; ranks of unequal token counts exchange at the largest rank's, and in a CUDA-graph step
(``dp_padded``) every rank is padded to it (``group_delta_us``). Each
step the data-parallel ranks first all-reduce a 4 × dp int32 tensor over NCCL (vLLM 0.19
``coordinate_batch_across_dp``: token counts, micro-batching, CUDA-graph mode). The lockstep of the
data-parallel ranks (each step waits for the slowest) is the worksheet's (``_lockstep``). A step within the largest
CUDA graph replays one captured at the next capture size, so its token-count terms (dense ops, MoE, all-reduces)
are priced at that padded count (``cudagraph_tokens``; the engine's ``cuda_graphs``); its attention and
per-sequence terms at the real counts (vLLM's attention metadata and its logits rows leave the padding out). Not
modelled: CPU time between steps (vLLM 0.19 schedules asynchronously), the MoE router's own GEMM, the GPU-to-CPU
sync the DP all-reduce forces.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.util.errors import ScenarioError
from loadgen.util.inputfile import read_input_csv, read_input_text

from ..ledger.config import ModelConfig, read_model_config
from .interp import interp_axis
from .link import AssumedLink, Link

__all__ = [
    "OperatorProfile",
    "cudagraph_capture_sizes",
    "cudagraph_tokens",
    "dp_padded",
    "expected_experts",
    "fit_linear_cost",
    "interp_axis",
    "load_profile",
    "profile_meta",
]

#: The link of a ``[cost.profile]`` that states none: AssumedLink's defaults (LLMServingSim's cluster config for
#: its PCIe machines).
ASSUMED_LINK = AssumedLink()
#: Dense operators that run twice per decoder layer (input and post-attention RMSNorm).
TWICE_PER_LAYER = frozenset({"layernorm"})
#: Dense operators that run once per step, not per layer.
ONCE_PER_STEP = frozenset({"embedding", "final_layernorm"})
#: The dense operators every profiled decoder step runs (``dense.csv``); a model with a dense MLP in some layer
#: also runs ``DENSE_MLP``; ``per_sequence.csv`` holds ``PER_SEQUENCE``.
STEP_OPERATORS = frozenset({"embedding", "final_layernorm", "layernorm", "qkv_proj", "rotary_emb", "o_proj"})
DENSE_MLP = frozenset({"gate_up_proj", "act_fn", "down_proj"})
PER_SEQUENCE = frozenset({"lm_head", "sampler"})
#: The columns of ``skew_fit.csv`` that name a bucket of the fit.
_SKEW_KEYS = ("pc", "n_label", "skew_rate_label", "kv_big_label", "kp_label")


def _bracket(axis: Sequence[int], x: float, zero_alone: bool) -> tuple[int, int, float]:
    """(lower index, upper index, weight of the upper) of ``x`` on a profile axis. ``zero_alone``: 0 is exact and
    a positive ``x`` is held at the first positive point below it (the axis' 0 row has no neighbours)."""
    if x <= 0:
        return 0, 0, 0.0
    first = 1 if zero_alone and axis[0] == 0 and len(axis) > 1 else 0
    if x <= axis[first]:
        return first, first, 0.0
    i = bisect.bisect_right(axis, x)
    if i >= len(axis):
        i = len(axis) - 1
    x0, x1 = axis[i - 1], axis[i]
    return i - 1, i, (x - x0) / (x1 - x0)


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int | None = None) -> list[int]:
    """vLLM 0.19's default CUDA graph capture sizes (config/vllm.py ``_set_cudagraph_sizes``): 1, 2, 4, then steps
    of 8 below 256, then of 16, up to min(2 x max_num_seqs, 512, max_num_batched_tokens); the largest of them is
    ``max_cudagraph_capture_size``."""
    bound = min(2 * max_num_seqs, 512)
    if max_num_batched_tokens is not None:
        bound = min(bound, max_num_batched_tokens)
    return [size for size in (1, 2, 4) if size <= bound] + [
        *range(8, min(bound + 1, 256), 8),
        *range(256, bound + 1, 16),
    ]


def cudagraph_tokens(tokens: int, sizes: Sequence[int]) -> int:
    """The tokens vLLM 0.19's model forward runs for a step of ``tokens``: the smallest capture size (``sizes``,
    ascending) at least ``tokens``, where one is, as the step then replays that CUDA graph (FULL for a decode-only
    batch, PIECEWISE otherwise: ``CudagraphDispatcher.dispatch``); past the largest, the step runs without a
    graph, unpadded."""
    if tokens <= 0 or not sizes or tokens > sizes[-1]:
        return tokens
    return sizes[bisect.bisect_left(sizes, tokens)]


def dp_padded(max_rank_tokens: int, sizes: Sequence[int]) -> bool:
    """Whether vLLM 0.19 pads a data-parallel step's ranks to the busiest one's token count: when the step runs
    CUDA graphs on every rank (``coordinate_batch_across_dp`` syncs the graph mode as the minimum over the ranks
    and pads when it is not NONE), i.e. the busiest rank's tokens are within the largest of the capture
    ``sizes`` (none: the engine runs no graphs). Larger steps run eager and unpadded."""
    return bool(sizes) and max_rank_tokens <= sizes[-1]


def expected_experts(experts: int, top_k: int, tokens: float, ep: int = 1) -> float:
    """Distinct experts one GPU activates for ``tokens`` tokens of uniform top-k routing over ``experts``,
    holding experts / ep of them while ep data-parallel ranks each send it as many tokens."""
    local = experts / ep
    return local * (1.0 - (1.0 - top_k / experts) ** (tokens * ep))


@dataclass(frozen=True)
class _Attention:
    """The 4-axis attention grid: ``t[pc][kp][nd][kd]`` in µs (None where the profile has no row)."""

    pc: list[int]
    kp: list[int]
    nd: list[int]
    kd: list[int]
    t: list[list[list[list[float | None]]]]
    kp_first: int = field(init=False)  # the first positive cached prefix and decode KV: below them the grid holds
    kd_first: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kp_first", _first_positive(self.kp))
        object.__setattr__(self, "kd_first", _first_positive(self.kd))

    def at(self, pc: float, kp: float, nd: float, kd: float) -> float:
        """One attention layer (µs) for prefill chunk ``pc`` over ``kp`` cached tokens and ``nd`` decodes of
        ``kd`` KV tokens each: linear in each axis between the profiled points (16 corners at most)."""
        a0, a1, wa = _bracket(self.pc, pc, True)
        b0, b1, wb = _bracket(self.kp, kp if pc > 0 else 0, False)
        c0, c1, wc = _bracket(self.nd, nd, True)
        d0, d1, wd = _bracket(self.kd, kd if nd > 0 else 0, True)
        total = 0.0
        t = self.t
        for i, wi in ((a0, 1.0 - wa), (a1, wa)):
            if wi == 0.0:
                continue
            ti = t[i]
            for j, wj in ((b0, 1.0 - wb), (b1, wb)):
                if wj == 0.0:
                    continue
                tj = ti[j]
                for k, wk in ((c0, 1.0 - wc), (c1, wc)):
                    if wk == 0.0:
                        continue
                    tk = tj[k]
                    for m, wm in ((d0, 1.0 - wd), (d1, wd)):
                        if wm == 0.0:
                            continue
                        v = tk[m]
                        if v is None:
                            raise ScenarioError(
                                f"attention profile: no row at prefill_chunk={self.pc[i]}, kv_prefill={self.kp[j]}, "
                                f"n_decode={self.nd[k]}, kv_decode={self.kd[m]}: expected a full grid"
                            )
                        total += wi * wj * wk * wm * v
        return total


@dataclass(frozen=True)
class _Skew:
    """The profile's fitted mixed-length correction: a decode batch of mixed KV lengths takes
    t_mean + alpha x (t_max - t_mean), t_mean at the mean KV length and t_max at the longest, alpha per bucket
    of (prefill chunk, decodes, skew rate, longest KV, cached prefix) as the profiler fitted it (``skew_fit.csv``),
    else its pooled ``alpha_default``. skew rate = (mean - min) / (max - min)."""

    bins: dict[str, list[float]]  # n, skew_rate, kv_big, kp: bucket edges, right-inclusive
    labels: dict[str, list[str]]
    alpha: dict[tuple[str, ...], float]
    alpha_default: float

    def _label(self, axis: str, value: float) -> str:
        edges, labels = self.bins[axis], self.labels[axis]
        i = bisect.bisect_left(edges, value, 1, len(labels)) - 1
        return labels[max(0, min(i, len(labels) - 1))]

    def at(self, pc: int, decodes: int, skew_rate: float, kv_max: float, kp: int) -> float:
        key = (
            str(pc),
            self._label("n", decodes),
            self._label("skew_rate", skew_rate),
            self._label("kv_big", kv_max),
            self._label("kp", kp),
        )
        return self.alpha.get(key, self.alpha_default)


@dataclass(frozen=True)
class OperatorProfile:
    """One GPU × model × TP degree's operator profile, composed into a step-time function (module docstring)."""

    source: str
    gpu: str
    vllm_version: str
    model: str
    tp: int
    layers: int
    dense_us: dict[str, tuple[list[int], list[float]]]  # per operator: (tokens, µs)
    per_sequence_us: dict[str, tuple[list[int], list[float]]]  # per operator: (sequences, µs)
    moe_us: dict[int, tuple[list[int], list[float]]]  # per activated experts: (tokens, µs)
    moe_layers: int
    experts: int
    top_k: int
    ep: int
    hidden_size: int
    decode_attention: _Attention  # steps without a prefill chunk
    mixed_attention: _Attention  # steps with one
    skew: _Skew | None  # the mixed-length correction, where the profile fitted one
    link: Link  # prices the collectives (loadgen.sim.link)
    # steps with a prefill chunk the mixed grid does not bracket (past its last point, under its first positive
    # one): the profile's doubling grid, where it reaches further (None: the mixed grid is already the widest).
    mixed_wide: _Attention | None = None
    _group_delta: dict[tuple[int, int, int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def tokens_us(self, tokens: int) -> float:
        """Everything in a step that depends on its token count (µs): dense ops, MoE, all-reduces."""
        if tokens <= 0:
            return 0.0
        total = 0.0
        for name, (keys, values) in self.dense_us.items():
            count = 1 if name in ONCE_PER_STEP else self.layers * (2 if name in TWICE_PER_LAYER else 1)
            total += count * interp_axis(keys, values, tokens)
        if self.moe_layers:
            total += self.moe_layers * self.moe_at(tokens)
            if self.ep > 1:  # every rank as loaded as this one; unequal ranks: group_delta_us
                total += self.moe_layers * self.exchange_us(tokens) + self.dp_sync_us()
        if self.tp > 1:
            total += 2 * self.layers * self.all_reduce_us(tokens)
        return total

    def all_reduce_us(self, tokens: float) -> float:
        """One tensor-parallel all-reduce of ``tokens`` hidden states (bf16) over the TP group (µs)."""
        return self.link.all_reduce_us(tokens * self.hidden_size * 2, self.tp)

    def exchange_us(self, max_rank_tokens: float) -> float:
        """One MoE layer's dispatch and combine over the expert-parallel group (µs): vLLM 0.19's default
        ``allgather_reducescatter`` all2all all-gathers every rank's hidden states (bf16) and reduce-scatters the
        expert outputs back. Ranks of unequal token counts: with CUDA graphs vLLM pads every rank to the largest
        count (``coordinate_batch_across_dp``); without, ``all_gatherv`` / ``reduce_scatterv`` are grouped NCCL
        broadcasts / reduces, one per rank, whose largest sets the time: both priced as the equal-rank collective
        at the largest rank's ``max_rank_tokens``. The router's top-k weights and ids gathered with the hidden
        states (8 B a token per expert) are not counted."""
        local = max_rank_tokens * self.hidden_size * 2
        return self.link.all_gather_us(local, self.ep) + self.link.reduce_scatter_us(local, self.ep)

    def dp_sync_us(self) -> float:
        """The data-parallel ranks' per-step all-reduce (µs): vLLM 0.19 ``_run_ar``, a 4 × dp int32 tensor over
        the DP group's NCCL communicator (dp = ep here: the group's engines are its data-parallel ranks)."""
        return self.link.all_reduce_us(4 * self.ep * 4, self.ep)

    def group_delta_us(
        self, tokens: int, group_tokens: int, max_rank_tokens: int | None = None, graph_sizes: Sequence[int] = ()
    ) -> float:
        """How much longer (µs; negative: shorter) a step of ``tokens`` takes on a rank of an expert-parallel group
        whose ranks together run ``group_tokens``, the busiest ``max_rank_tokens`` (default: the larger of this
        rank's and the rest's, exact for 2 ranks), than ``tokens_us`` priced it (every rank as loaded as this
        one, at its CUDA-graph size among ``graph_sizes``): the experts run over the group's actual tokens, the
        exchange at the busiest rank's (``exchange_us``). In a CUDA-graph step (``dp_padded``) vLLM pads every
        rank to the busiest's count and that to its capture size, so the expert kernel runs over ep x that many
        rows (the experts activated still by the group's actual tokens) and the exchange moves that many."""
        if not self.moe_layers or self.ep <= 1:
            return 0.0
        busiest = max(tokens, group_tokens - tokens) if max_rank_tokens is None else max_rank_tokens
        key = (tokens, group_tokens, busiest, graph_sizes[-1] if graph_sizes else 0)  # the sizes follow their largest
        known = self._group_delta.get(key)
        if known is not None:
            return known
        charged = cudagraph_tokens(tokens, graph_sizes)
        assumed = self._moe_over(charged * self.ep, charged * self.ep) + self.exchange_us(charged)
        if dp_padded(busiest, graph_sizes):
            rows = cudagraph_tokens(busiest, graph_sizes)
            actual = self._moe_over(group_tokens, self.ep * rows) + self.exchange_us(rows)
        else:
            actual = self._moe_over(group_tokens, group_tokens) + self.exchange_us(busiest)
        delta = self._group_delta[key] = self.moe_layers * (actual - assumed)
        return delta

    def _moe_over(self, routed_tokens: float, seen_tokens: float) -> float:
        """The expert kernel of one GPU (µs) over ``seen_tokens`` with the experts ``routed_tokens`` activate."""
        active = expected_experts(self.experts, self.top_k, routed_tokens / self.ep, self.ep)
        counts = sorted(self.moe_us)
        by_count = [interp_axis(*self.moe_us[c], seen_tokens) for c in counts]
        return interp_axis(counts, by_count, active)

    def moe_at(self, tokens: float) -> float:
        """One MoE layer (µs) on one GPU: the expert kernel over the tokens it sees (with expert parallelism, the
        whole group's: ep x ``tokens``) and its expected activated experts, linear between the profiled expert
        counts."""
        return self._moe_over(tokens * self.ep, tokens * self.ep)

    def sequences_us(self, sequences: int) -> float:
        """The once-per-step ops that depend on the sequence count (µs): lm_head, sampler."""
        if sequences <= 0:
            return 0.0
        return sum(interp_axis(keys, values, sequences) for keys, values in self.per_sequence_us.values())

    def attention_us(
        self,
        prefill_tokens: int,
        prefill_cached: int,
        decodes: int,
        decode_kv_sum: int,
        decode_kv_max: int = 0,
        decode_kv_min: int = 0,
    ) -> float:
        """Attention of a whole step over all layers (µs); ``decode_kv_sum`` is the decodes' KV tokens summed,
        ``decode_kv_max`` / ``_min`` the longest and shortest (0: as long as the mean; no skew correction)."""
        if prefill_tokens <= 0 and decodes <= 0:
            return 0.0
        kd = decode_kv_sum / decodes if decodes else 0.0
        t_mean = self._layer_attention_us(prefill_tokens, prefill_cached, decodes, kd)
        if self.skew is None or decodes < 2 or decode_kv_max <= kd or decode_kv_max <= decode_kv_min:
            return self.layers * t_mean
        rate = (kd - decode_kv_min) / (decode_kv_max - decode_kv_min)
        alpha = self.skew.at(prefill_tokens, decodes, rate, decode_kv_max, prefill_cached)
        t_max = self._layer_attention_us(prefill_tokens, prefill_cached, decodes, decode_kv_max)
        if alpha <= 0 or t_max <= t_mean:
            return self.layers * t_mean
        return self.layers * (t_mean + alpha * (t_max - t_mean))

    def _layer_attention_us(self, prefill_tokens: int, prefill_cached: int, decodes: int, kd: float) -> float:
        """One layer's attention (µs). A step with a prefill chunk reads the mixed grid; past its last decode count
        (the profilers sweep decodes to 128 with a chunk, to 256 without), the decodes beyond it add what they add
        in the decode-only grid at the same KV length, rather than the mixed grid's last slope continued: that
        slope, 64 to 128 decodes, holds a jump (up to 3.7x on the RTX 4090) no profiled point says goes on."""
        if prefill_tokens <= 0:
            return self.decode_attention.at(0, 0, decodes, kd)
        grid = self.mixed_attention
        wide = self.mixed_wide
        if wide is not None and (
            prefill_tokens > grid.pc[-1]
            or prefill_cached > grid.kp[-1]
            or kd > grid.kd[-1]
            or 0 < prefill_cached < grid.kp_first
            or 0 < kd < grid.kd_first
        ):
            grid = wide  # measured where the finer grid would extrapolate, or hold its first point
        last = grid.nd[-1]
        if decodes <= last or self.decode_attention.nd[-1] <= last:
            return grid.at(prefill_tokens, prefill_cached, decodes, kd)
        beyond = self.decode_attention.at(0, 0, decodes, kd) - self.decode_attention.at(0, 0, last, kd)
        return grid.at(prefill_tokens, prefill_cached, last, kd) + beyond

    def step_us(
        self,
        prefill_tokens: int,
        prefill_cached: int,
        decodes: int,
        decode_kv_sum: int,
        seqs: int,
        decode_kv_max: int = 0,
        decode_kv_min: int = 0,
    ) -> float:
        """One engine step (µs) from its composition (the module docstring's sum)."""
        tokens = prefill_tokens + decodes
        attention = self.attention_us(
            prefill_tokens, prefill_cached, decodes, decode_kv_sum, decode_kv_max, decode_kv_min
        )
        return self.tokens_us(tokens) + self.sequences_us(seqs) + attention

    def identity(self) -> dict[str, Any]:
        """Where this cost model came from (recorded in manifests and labels)."""
        return {
            "profile": self.source,
            "gpu": self.gpu,
            "vllm_version": self.vllm_version,
            "model": self.model,
            "tp": self.tp,
            "ep": self.ep,
            "layers": self.layers,
            "moe_layers": self.moe_layers,
            "link": self.link.describe(),
        }


_CSV_WHAT = "an operator profile CSV (loadgen sim engine --profile)"


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of one profile table: unreadable, not UTF-8, not CSV, without one of ``columns`` or with no rows
    is one ScenarioError line naming the file."""
    rows = read_input_csv(path, _CSV_WHAT, ScenarioError, columns)
    if not rows:
        raise ScenarioError(f"{path}: no rows under the header: expected {_CSV_WHAT}, a row per measured point")
    return rows


def _number(path: Path, row: dict[str, str], field: str, signed: bool = False) -> float:
    try:
        value = float(row[field])
    except (KeyError, TypeError, ValueError):
        raise ScenarioError(f"{path}: {field} = {row.get(field)!r}: expected a number") from None
    if value != value or abs(value) == float("inf") or (value < 0 and not signed):
        raise ScenarioError(f"{path}: {field} = {value!r}: expected a finite number{'' if signed else ' >= 0'}")
    return value


def _by_layer(path: Path, key: str, required: frozenset[str]) -> dict[str, tuple[list[int], list[float]]]:
    """A dense / per-sequence table: per operator, its sorted (key, µs) points; every ``required`` operator has
    some (one the table lacks would be priced at nothing)."""
    points: dict[str, dict[int, float]] = {}
    for row in _read_rows(path, ("layer", key, "time_us")):
        points.setdefault(row["layer"], {})[int(_number(path, row, key))] = _number(path, row, "time_us")
    absent = sorted(required - set(points))
    if absent:
        raise ScenarioError(
            f"{path}: layer {absent[0]!r}: no rows: expected every operator of the model's step "
            f"({', '.join(sorted(required))})"
        )
    return {name: (sorted(p), [p[k] for k in sorted(p)]) for name, p in points.items()}


def _attention(path: Path) -> tuple[_Attention, _Attention, _Attention | None]:
    """The attention rows as full grids: decode-only steps (no prefill chunk: decodes x KV), steps with a prefill
    chunk (4 axes), each the largest grid its rows fill (``_full_grid``), and, where that chunk grid stops short
    of the largest chunk, prefix or KV the rows hold, the largest full grid that keeps those (None otherwise).
    The profilers sweep more decodes without a chunk (to 256) than with one (to 128): past 128, a mixed step's
    further decodes are priced from the decode-only grid (``OperatorProfile._layer_attention_us``)."""
    rows = [
        (int(_number(path, r, "prefill_chunk")), int(_number(path, r, "kv_prefill")))
        + (int(_number(path, r, "n_decode")), int(_number(path, r, "kv_decode")), _number(path, r, "time_us"))
        for r in _read_rows(path, ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))
    ]
    decode = _grid(path, [r for r in rows if r[0] == 0 and r[2] > 0], "decode-only", (0, 0, 2, 2))
    mixed_rows = [r for r in rows if r[0] > 0]
    mixed = _grid(path, mixed_rows, "prefill-chunk", (2, 1, 2, 2))
    largest = [max(r[i] for r in mixed_rows) for i in range(4)]
    if [mixed.pc[-1], mixed.kp[-1], mixed.nd[-1], mixed.kd[-1]] == largest:
        return decode, mixed, None
    # the profiler's doubling grid through each axis's largest value (and 0)
    chain = [r for r in mixed_rows if all(_doubles_to(int(r[i]), int(largest[i])) for i in range(4))]
    try:
        wide = _grid(path, chain, "prefill-chunk", (2, 1, 2, 2))
    except ScenarioError:
        return decode, mixed, None  # the rows past the chunk grid fill no doubling grid
    if [wide.pc[-1], wide.kp[-1], wide.nd[-1], wide.kd[-1]] != largest:
        return decode, mixed, None  # no full grid reaches further
    return decode, mixed, wide


def _first_positive(axis: Sequence[int]) -> int:
    """An axis's first positive point (a grid axis holds at most one 0, first; 0 for an axis of 0 alone)."""
    return next((v for v in axis if v > 0), 0)


def _doubles_to(value: int, largest: int) -> bool:
    """``value`` is 0 or ``largest`` halved a whole number of times."""
    if value <= 0:
        return value == 0
    ratio, rest = divmod(largest, value)
    return rest == 0 and ratio & (ratio - 1) == 0


def _grid(
    path: Path, part: list[tuple[int, int, int, int, float]], kind: str, need: tuple[int, int, int, int]
) -> _Attention:
    """One full grid of ``part`` (``_full_grid``), with at least ``need`` positive points an axis."""
    cells = {(r[0], r[1], r[2], r[3]): r[4] for r in part}
    keys = list(cells)
    axes = _full_grid(cells, [sorted({k[i] for k in keys}) for i in range(4)]) if part else [[]] * 4
    positive = [len([v for v in a if v > 0]) for a in axes]
    if any(got < want for got, want in zip(positive, need, strict=True)):
        raise ScenarioError(f"{path}: {kind} rows fill no grid of 2 points an axis: expected the attention grid")
    t = [[[[cells.get((a, b, c, d)) for d in axes[3]] for c in axes[2]] for b in axes[1]] for a in axes[0]]
    return _Attention(axes[0], axes[1], axes[2], axes[3], t)


def _full_grid(cells: dict[tuple[int, int, int, int], float], axes: list[list[int]]) -> list[list[int]]:
    """The axes cut to a grid every needed point of which has a row (decode KV exactly when decodes): while
    one is missing, drop the positive axis value missing the largest share of its points. A profile may hold a
    second grid beside its doubling one: the RTX PRO 6000 profiles add chunks and KV lengths on a x1.5 grid,
    which this keeps (it is finer) but which stops at a 1,384-token chunk where the doubling grid reaches 2,048
    (``_attention`` keeps that one too, for the chunks past it)."""
    index = [{v: i for i, v in enumerate(a)} for a in axes]
    present = np.zeros([len(a) for a in axes], dtype=bool)
    for key in cells:
        present[tuple(index[k][v] for k, v in enumerate(key))] = True
    zero = [np.array([v == 0 for v in a]) for a in axes]
    needed = np.broadcast_to(zero[2][:, None] == zero[3][None, :], present.shape)
    keep = [np.ones(len(a), dtype=bool) for a in axes]
    while True:
        grid = np.ix_(*keep)
        missing = needed[grid] & ~present[grid]
        if not missing.any():
            return [[v for v, kept in zip(a, k, strict=True) if kept] for a, k in zip(axes, keep, strict=True)]
        best = (-1.0, 0, 0)
        for k in range(4):
            others = tuple(j for j in range(4) if j != k)
            share = missing.sum(axis=others) / np.maximum(needed[grid].sum(axis=others), 1)
            for i, value in zip(np.flatnonzero(keep[k]), share, strict=True):
                if axes[k][i] > 0 and value > best[0]:
                    best = (float(value), k, int(i))
        if best[0] < 0:
            return [[0]] * 4  # nothing left to drop: no grid
        keep[best[1]][best[2]] = False


def _moe(path: Path) -> dict[int, tuple[list[int], list[float]]]:
    points: dict[int, dict[int, float]] = {}
    for row in _read_rows(path, ("tokens", "activated_experts", "time_us")):
        experts = int(_number(path, row, "activated_experts"))
        points.setdefault(experts, {})[int(_number(path, row, "tokens"))] = _number(path, row, "time_us")
    return {e: (sorted(p), [p[k] for k in sorted(p)]) for e, p in points.items()}


def _skew(root: Path, tp: int) -> _Skew | None:
    """The profile's skew fit for TP ``tp`` (meta.yaml's ``skew_fit`` block and ``tp<N>/skew_fit.csv``), or None
    where it fitted none (``enabled: false``, as in the RTX 4090 profile)."""
    text = _meta_text(root)
    block = text[text.find("\nskew_fit:") + 1 :] if "\nskew_fit:" in text else ""
    if not re.search(r"^  enabled: true", block, re.M):
        return None
    bins: dict[str, list[float]] = {}
    labels: dict[str, list[str]] = {}
    for axis in ("n", "skew_rate", "kv_big", "kp"):
        edges = re.search(rf"^    {axis}_bins: \[(.*)\]", block, re.M)
        names = re.search(rf"^    {axis}_labels: \[(.*)\]", block, re.M)
        if edges is None or names is None:
            raise ScenarioError(f"{root / 'meta.yaml'}: skew_fit.bucket_axes.{axis}_bins: expected bins and labels")
        bins[axis] = [float(v) for v in edges.group(1).split(",")]
        labels[axis] = [v.strip() for v in names.group(1).split(",")]
    default = re.search(rf"^    {tp}:\n(?:      .*\n)*?      alpha_default: ([0-9.eE+-]+)", block, re.M)
    alpha: dict[tuple[str, ...], float] = {}
    path = root / f"tp{tp}" / "skew_fit.csv"
    for row in _read_rows(path, _SKEW_KEYS + ("alpha",)):  # meta.yaml says the profile fitted it: it must be there
        alpha[tuple(row[name] for name in _SKEW_KEYS)] = _number(path, row, "alpha", signed=True)
    return _Skew(bins, labels, alpha, float(default.group(1)) if default else 0.0)


def _meta_text(root: Path) -> str:
    """The text of the profile's meta.yaml (one ScenarioError line when missing, unreadable or not UTF-8)."""
    return read_input_text(root / "meta.yaml", "the profile's meta.yaml (loadgen sim engine --profile)", ScenarioError)


def profile_meta(root: Path) -> dict[str, str]:
    """The top-level ``key: value`` scalars of the profile's meta.yaml (gpu, vllm_version, model, tp_degrees):
    all this module reads of it, without a YAML dependency."""
    text = _meta_text(root)
    meta: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            meta[key.strip()] = value.strip().strip("'\"")
    return meta


@functools.lru_cache(maxsize=16)
def load_profile(
    root: str,
    tp: int,
    model_config: str,
    ep: int = 1,
    link: Link = ASSUMED_LINK,
) -> OperatorProfile:
    """Read the profile under ``root`` (the ``<dtype>/`` folder holding meta.yaml and ``tp<N>/``) for TP degree
    ``tp``, composed for the model whose Hugging Face config.json is ``model_config`` (its layer count and MoE
    layers), its collectives priced by ``link``. Cached: engines of one config share it."""
    base = Path(root)
    meta = profile_meta(base)
    folder = base / f"tp{tp}"
    if not folder.is_dir():
        raise ScenarioError(f"{base}: tp = {tp}: no tp{tp}/ folder: expected one of {meta.get('tp_degrees')}")
    model: ModelConfig = read_model_config(model_config)
    moe_path = folder / "moe.csv"
    if not moe_path.exists() and (base / "tp1" / "moe.csv").exists():
        moe_path = base / "tp1" / "moe.csv"  # the expert kernel is profiled once, at tp1
    moe = _moe(moe_path) if model.is_moe and moe_path.exists() else {}
    if model.is_moe and not moe:
        raise ScenarioError(f"{folder}: model {model.source} is MoE: expected moe.csv in the profile")
    if tp > 1:
        link.check("all_reduce", tp)
    if moe and ep > 1:
        for collective in ("all_gather", "reduce_scatter", "all_reduce"):
            link.check(collective, ep)
    decode, mixed, wide = _attention(folder / "attention.csv")
    return OperatorProfile(
        source=str(base),
        gpu=str(meta.get("gpu", "?")),
        vllm_version=str(meta.get("vllm_version", "?")),
        model=str(meta.get("model", "?")),
        tp=tp,
        layers=model.num_layers,
        dense_us=_by_layer(
            folder / "dense.csv",
            "tokens",
            STEP_OPERATORS | (DENSE_MLP if len(model.moe_layers) < model.num_layers or not moe else frozenset()),
        ),
        per_sequence_us=_by_layer(folder / "per_sequence.csv", "sequences", PER_SEQUENCE),
        moe_us=moe,
        moe_layers=len(model.moe_layers) if moe else 0,
        experts=int(model.num_experts or 0),
        top_k=int(model.num_experts_per_tok or 0),
        ep=ep,
        hidden_size=model.hidden_size,
        decode_attention=decode,
        skew=_skew(base, tp),
        mixed_attention=mixed,
        mixed_wide=wide,
        link=link,
    )


def fit_linear_cost(profile: OperatorProfile, max_num_seqs: int, max_num_batched_tokens: int) -> dict[str, float]:
    """The linear cost terms (``CostModel``: fixed + per prefill token + per decode sequence + per KV token read,
    ms) fitted by least squares to the profile's step times over the steps an engine of these limits takes:
    decode-only steps (1 to ``max_num_seqs`` decodes, mean KV 128-8,192), prefill chunks (64 tokens to the budget,
    0-8,192 cached) and mixed steps. A term that fits negative is dropped and the rest refitted."""
    rows: list[tuple[int, int, int, float]] = []  # (prefill tokens, decodes, KV tokens read, µs)
    seqs = sorted({min(max_num_seqs, 2**k) for k in range(12)} | {max_num_seqs})
    kvs = (128, 512, 1024, 2048, 4096, 8192)
    for b in seqs:
        for kv in kvs:
            rows.append((0, b, b * kv, profile.step_us(0, 0, b, b * kv, b)))
    chunks = sorted({min(max_num_batched_tokens, 64 * 2**k) for k in range(12)})
    for chunk in chunks:
        for cached in (0, 1024, 4096, 8192):
            rows.append((chunk, 0, cached + chunk, profile.step_us(chunk, cached, 0, 0, 1)))
            for b in seqs:
                if chunk + b <= max_num_batched_tokens and b < max_num_seqs:
                    rows.append(
                        (chunk, b, cached + chunk + b * 1024, profile.step_us(chunk, cached, b, b * 1024, b + 1))
                    )
    x = np.array([(1.0, p, d, k) for p, d, k, _ in rows])
    y = np.array([us for *_, us in rows])
    keep = [0, 1, 2, 3]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        negative = [k for k, c in zip(keep, coef, strict=True) if c < 0]
        if not negative:
            break
        keep.remove(negative[0])
    terms = dict.fromkeys(range(4), 0.0) | {k: float(c) for k, c in zip(keep, coef, strict=True)}
    names = ("fixed_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms")
    return {name: terms[i] / 1e3 for i, name in enumerate(names)}
