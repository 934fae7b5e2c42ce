"""loadgen: workload-specific capacity evidence for LLM serving.

Scenario → deterministic trace → open-loop run (real engine or simulated) → run directory →
analysis → load plan, capacity region and candidate decision. See README.md and DESIGN.md.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
