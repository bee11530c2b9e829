"""The chunked-prefill probe's bookkeeping (benchmark/fa3_chunk_probe.py): chunk ranges and row comparison.

The FA3 calls run on a Hopper GPU only.
"""

import sys
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmark"))
import fa3_chunk_probe as probe  # noqa: E402


@pytest.mark.parametrize("length, chunk", [(1, 1), (1100, 256), (512, 256), (255, 256), (2100, 512)])
def test_chunks_cover_every_row_once_in_order(length, chunk):
    ranges = probe.chunks_of(length, chunk)
    assert [r for s, e in ranges for r in range(s, e)] == list(range(length))
    assert all(e - s == chunk for s, e in ranges[:-1]) and 0 < ranges[-1][1] - ranges[-1][0] <= chunk


def test_a_bad_range_is_named():
    with pytest.raises(ValueError, match="length and chunk must be >= 1, got 0 and 256"):
        probe.chunks_of(0, 256)


def test_rows_differing_in_one_bit_are_found():
    a = torch.zeros(5, 2, 3, dtype=torch.bfloat16)
    b = a.clone()
    b[3, 1, 2] = torch.finfo(torch.bfloat16).tiny  # one bit apart
    b[0, 0, 0] = -0.0  # equal values, other bits: counted
    assert probe.differing_rows(a, b) == [0, 3]
    nan = torch.full((2, 4), float("nan"), dtype=torch.bfloat16)
    assert probe.differing_rows(nan, nan.clone()) == []  # the same NaN bits


def test_rows_are_grouped_in_inclusive_runs():
    assert probe.ranges([5, 1, 2, 3, 9, 10]) == {"runs": [[1, 3], [5, 5], [9, 10]], "of": 3}
    assert probe.ranges([]) == {"runs": [], "of": 0}
    assert probe.ranges(list(range(0, 40, 2)), limit=3) == {"runs": [[0, 0], [2, 2], [4, 4]], "of": 20}


def test_the_two_row_layout_ends_each_request_at_its_position():
    rows, cu = probe.two_row_layout(5)
    assert rows.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4] and cu.tolist() == [0, 1, 3, 5, 7, 9]
    assert rows[(cu[1:] - 1).long()].tolist() == [0, 1, 2, 3, 4]
    assert (cu[1:] - cu[:-1]).tolist() == [1, 2, 2, 2, 2]  # position p's request: rows p - 1 and p


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
