"""The one TOML writer: None table values omitted, None in a list and non-finite numbers refused in one line."""

from __future__ import annotations

import math
import tomllib
from datetime import date

import pytest

from loadgen.util.errors import LoadgenError
from loadgen.util.tomlfile import dumps_toml


def test_round_trips_tables_lists_and_odd_keys_in_order() -> None:
    data = {
        "name": 'x "q" \\ é\n',
        "n": 3,
        "f": 0.5,
        "flag": True,
        "day": date(2026, 11, 29),
        "list": [1, 2],
        "t": {"a": "b", "inner": {"z": [{"k": 1}, {"k": 2}], "empty": {}}},
        "odd key": 1,
        "classes": {"b": 1, "a": 2},
    }
    text = dumps_toml(data, what="test data")
    assert tomllib.loads(text) == data
    assert list(tomllib.loads(text)["classes"]) == ["b", "a"]  # order kept: the trace generator depends on it


def test_none_table_values_are_omitted_at_every_depth() -> None:
    data = {"a": None, "t": {"b": None, "c": 1, "u": {"d": None}}, "rows": [{"k": 1, "gone": None}]}
    assert tomllib.loads(dumps_toml(data, what="test data")) == {"t": {"c": 1, "u": {}}, "rows": [{"k": 1}]}
    assert data["a"] is None and data["t"]["b"] is None  # the input is not changed


@pytest.mark.parametrize(
    "data,path,shown",
    [
        ({"t": {"xs": [1, None, 3]}}, "t.xs[1]", "None"),
        ({"rows": [{"k": [None]}]}, "rows[0].k[0]", "None"),
        ({"f": math.nan}, "f", "nan"),
        ({"t": {"u": {"limit": math.inf}}}, "t.u.limit", "inf"),
        ({"xs": [0.5, -math.inf]}, "xs[1]", "-inf"),
        ({"rows": [{"p99": math.nan}]}, "rows[0].p99", "nan"),
    ],
)
def test_none_in_a_list_and_non_finite_numbers_raise_one_line(data, path, shown) -> None:
    with pytest.raises(LoadgenError) as info:
        dumps_toml(data, what="engine config")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"engine config: {path} = {shown}:")


def test_a_value_toml_cannot_hold_raises() -> None:
    with pytest.raises(LoadgenError, match=r"^x: t\.when = .*expected a TOML value, not a set$"):
        dumps_toml({"t": {"when": {1}}}, what="x")
    with pytest.raises(LoadgenError, match=r"^x: 1: key is int: expected a string$"):
        dumps_toml({1: "a"}, what="x")  # type: ignore[dict-item]
