"""The vectorised request-id lookup against a dict: every id found at its row, every other id −1."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.analysis.idlookup import IdLookup
from loadgen.util.errors import RunDirError

# short alphabets make prefixes, equal lengths and near-misses common; "\x00" and non-ASCII included
_ID = st.text(alphabet=st.sampled_from(["a", "b", "-", "0", "é", "\x00", " "]), max_size=6)


def _reference(keys: list[str], queries: list[str | None]) -> list[int]:
    rows = {k: i for i, k in enumerate(keys)}
    return [rows.get(q, -1) if q is not None else -1 for q in queries]


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(_ID, unique=True, max_size=40),
    others=st.lists(st.one_of(_ID, st.none()), max_size=40),
    large=st.booleans(),
)
def test_law_lookup_equals_a_dict(keys, others, large):
    kind = pa.large_string() if large else pa.string()
    lookup = IdLookup(pa.array(keys, type=kind))
    queries = keys[::-1] + others + [k + "\x00" for k in keys[:3]] + [k[:-1] for k in keys[:3]]
    got = lookup.get_indexer(pa.array(queries, type=kind))
    assert got.tolist() == _reference(keys, queries)
    assert len(lookup) == len(keys)


def test_sliced_chunked_and_dictionary_queries():
    keys = [f"r{i}" for i in range(1, 200)] + ["long-request-id-0001", ""]
    lookup = IdLookup(pa.chunked_array([keys[:50], keys[50:]]))
    queries = pa.array(["x", "r7", "", "long-request-id-0001", "long-request-id-000", "r199", "r200"])
    expected = _reference(keys, queries.to_pylist())
    assert lookup.get_indexer(queries).tolist() == expected
    assert lookup.get_indexer(queries.slice(2, 3)).tolist() == expected[2:5]
    assert lookup.get_indexer(queries.dictionary_encode()).tolist() == expected
    assert lookup.get_indexer(pa.chunked_array([queries[:3], queries[3:]])).tolist() == expected
    assert lookup.get_indexer(pa.array([], type=pa.string())).tolist() == []
    assert IdLookup(pa.array([], type=pa.string())).get_indexer(queries).tolist() == [-1] * len(queries)


@pytest.mark.parametrize("ids", [["r1", "r2", "r1"], ["a\x00", "b", "a\x00"], ["same", "same"]])
def test_duplicate_ids_are_bad_input_naming_the_id(ids):
    with pytest.raises(RunDirError, match=re.escape(f"request_id {ids[0]!r} appears more than once")):
        IdLookup(pa.array(ids))
