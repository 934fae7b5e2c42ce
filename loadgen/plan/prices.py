"""The user's price table: what a candidate costs, so throughput becomes cost per million tokens.

A price table is a TOML file the user supplies (``scenarios/prices.toml`` is an *example* with made-up
numbers). Each ``[candidates.NAME]`` entry (NAME = the candidate's label: engine config name, served
model, or run/plan directory name) gives either ``usd_per_hour`` (self-hosted: what the hardware running
the candidate costs per hour) or ``usd_per_million_input_tokens`` / ``usd_per_million_output_tokens``
(a managed API); ``[default]`` applies to candidates not listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from loadgen.util.errors import ScenarioError
from loadgen.util.limits import InputModel
from loadgen.util.tomlfile import read_toml
from loadgen.util.validation import format_validation_error

__all__ = ["Price", "PriceTable", "load_prices", "cost_per_million"]


class Price(InputModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    usd_per_hour: float | None = Field(default=None, ge=0)
    usd_per_million_input_tokens: float | None = Field(default=None, ge=0)
    usd_per_million_output_tokens: float | None = Field(default=None, ge=0)
    note: str = ""

    @model_validator(mode="after")
    def _one_kind(self) -> Price:
        hourly = self.usd_per_hour is not None
        per_token = self.usd_per_million_input_tokens is not None or self.usd_per_million_output_tokens is not None
        if hourly == per_token:
            raise ValueError("expected usd_per_hour, or usd_per_million_input_tokens/usd_per_million_output_tokens")
        return self


class PriceTable(InputModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    currency: str = "USD"
    example: bool = False  # true: made-up numbers; reports say so beside every cost
    description: str = ""
    candidates: dict[str, Price] = {}
    default: Price | None = None
    source_path: str | None = Field(default=None, exclude=True)

    def price_for(self, *labels: str | None) -> tuple[str | None, Price | None]:
        """The first listed label's price, else the default (with the label that matched)."""
        for label in labels:
            if label and label in self.candidates:
                return label, self.candidates[label]
        return ("default", self.default) if self.default is not None else (None, None)


def load_prices(path: str | Path) -> PriceTable:
    """Read and validate a price table (one ScenarioError line on any problem)."""
    path = Path(path)
    data, _ = read_toml(path, "a price table TOML (see scenarios/prices.toml)")
    try:
        table = PriceTable.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(str(path), exc, PriceTable)) from None
    return table.model_copy(update={"source_path": str(path)})


def cost_per_million(price: Price, *, prompt_tok_s: float | None, output_tok_s: float | None) -> dict[str, Any]:
    """Cost per million output tokens and per million tokens (prompt + output) at the measured rates.

    Hourly: usd_per_hour / 3600 / tok_s × 1e6. Per-token: the listed prices, blended by the measured
    prompt/output mix for the total.
    """
    out: dict[str, Any] = {"per_million_output_tokens": None, "per_million_tokens": None, "basis": None}
    if price.usd_per_hour is not None:
        per_s = price.usd_per_hour / 3600.0
        out["basis"] = f"{price.usd_per_hour:g}/hour ÷ measured tokens/s"
        if output_tok_s:
            out["per_million_output_tokens"] = per_s / output_tok_s * 1e6
        total = (prompt_tok_s or 0.0) + (output_tok_s or 0.0)
        if total:
            out["per_million_tokens"] = per_s / total * 1e6
        return out
    pin = price.usd_per_million_input_tokens or 0.0
    pout = price.usd_per_million_output_tokens or 0.0
    out["basis"] = f"{pin:g} per M input + {pout:g} per M output tokens"
    if output_tok_s:
        out["per_million_output_tokens"] = (pin * (prompt_tok_s or 0.0) + pout * output_tok_s) / output_tok_s
    total = (prompt_tok_s or 0.0) + (output_tok_s or 0.0)
    if total:
        out["per_million_tokens"] = (pin * (prompt_tok_s or 0.0) + pout * (output_tok_s or 0.0)) / total
    return out
