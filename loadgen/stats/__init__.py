"""Statistics shared by the driver, the ledger, trace stats and the analysis.

- ``percentiles``: the one percentile rule (nearest rank on sorted samples) and summaries with counts;
- ``confidence``: distribution-free intervals (order statistics for quantiles, Wilson for shares).
"""

__all__: list[str] = []  # modules are imported by name
