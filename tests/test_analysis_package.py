"""The analysis package's public names (its import boundary is checked in test_package.py)."""

from __future__ import annotations

import loadgen.analysis as analysis


def test_all_is_exact_and_documented():
    assert sorted(analysis.__all__) == sorted(set(analysis.__all__))
    for name in analysis.__all__:
        assert hasattr(analysis, name), name
    for name in ("analyze_run", "Analysis", "render_console", "write_html"):
        assert name in analysis.__all__
        assert getattr(analysis, name).__doc__
    assert analysis.__doc__ and "driver" in analysis.__doc__
