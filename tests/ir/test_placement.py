from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplan import ir


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_shards_reassemble_to_the_global_size(size: int, parts: int) -> None:
    sizes = ir.shard_sizes(size, parts)
    assert len(sizes) == parts and sum(sizes) == size
    assert max(sizes) - min(s for s in sizes if s) <= max(sizes) if any(sizes) else True


@given(st.sampled_from([ir.Replicate(), ir.Partial(), ir.Shard(0), ir.Shard(1), ir.Shard(-1)]))
def test_placements_print_short_and_parse_back(p) -> None:
    assert ir.parse_placement(str(p)) == p
    assert len(str(p)) <= 5
