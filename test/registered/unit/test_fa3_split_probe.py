"""The positional-split probe's arithmetic (benchmark/fa3_split_probe.py): split points and the LSE merge.

The FA3 calls run on a Hopper GPU only; the split rule and the merge are
checked here against direct softmax attention.
"""

import sys
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmark"))
import fa3_split_probe as probe  # noqa: E402


def test_the_split_point_leaves_every_tree_node_its_prefix():
    lens = torch.arange(1, 5000)
    s = probe.split_point(lens, 128, 64)
    assert (s % 128 == 0).all() and (s >= 0).all()
    # A node up to 65 keys past its request's prefix P (itself included) splits at or before P.
    for prefix in (0, 1, 127, 128, 1000, 4000):
        for extra in range(1, 66):
            assert int(probe.split_point(torch.tensor(prefix + extra), 128, 64)) <= prefix


def _attend(q, k, v):
    w = torch.softmax(q @ k.T, dim=-1)
    return w @ v, torch.logsumexp(q @ k.T, dim=-1)


def test_the_merge_of_two_parts_is_attention_over_both():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 16, generator=gen, dtype=torch.float64)
    k, v = torch.randn(40, 16, generator=gen, dtype=torch.float64), torch.randn(40, 16, generator=gen, dtype=torch.float64)
    whole, _ = _attend(q, k, v)
    o1, l1 = _attend(q, k[:23], v[:23])
    o2, l2 = _attend(q, k[23:], v[23:])
    merged = probe.merge(o1.unsqueeze(1), l1.unsqueeze(1), o2.unsqueeze(1), l2.unsqueeze(1)).squeeze(1)
    assert torch.allclose(merged, whole.to(merged.dtype), atol=1e-6)


def test_a_part_without_keys_gives_the_other_part_back_exactly():
    o2 = torch.randn(3, 2, 8).to(torch.bfloat16)
    lse2 = torch.randn(3, 2)
    nan_part = torch.full((3, 2, 8), float("nan")).to(torch.bfloat16)
    empty = torch.full((3, 2), float("-inf"))
    assert torch.equal(probe.merge(nan_part, empty, o2, lse2), o2)
    assert torch.equal(probe.merge(o2, lse2, nan_part, empty), o2)


@pytest.mark.parametrize("node, path", [(0, [0]), (5, [0, 1, 5]), (7, [0, 2, 7])])
def test_ancestors_run_from_the_root_to_the_node(node, path):
    assert probe.ancestors(node) == path


@pytest.mark.parametrize("argv, message", [
    (["--block", "0"], "block must lie in [1, 65536], got 0"),
    (["--depth", "-1"], "depth must lie in [0, 65536], got -1"),
    (["--chunk", "12"], "chunk must be a multiple of 8 in [8, 65536], got 12"),
    (["--batches", "1,0"], "batches must list integers in [1, 4096], got '1,0'"),
    (["--contexts", "2k"], "contexts must be comma-separated integers, got '2k'"),
])
def test_bad_arguments_are_named_before_any_gpu_work(capsys, argv, message):
    assert probe.main(argv) == 2
    assert message in capsys.readouterr().out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
