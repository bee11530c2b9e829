"""Property tests (hypothesis) over shapes and edge values of the samplers."""

import pytest
import torch
from hypothesis import given, settings, strategies as st
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.ops import Stream, exponential_race, hash_uniform, verify_chain

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

U32, U64 = 1 << 32, 1 << 64

seeds_st = st.integers(0, U64 - 1)
pos_st = st.integers(0, U32 - 1)
weight_st = st.sampled_from([0.0, 1e-38, 1e-6, 0.5, 1.0, 3.0, 1e30])


@st.composite
def race_case(draw):
    b = draw(st.integers(1, 5))
    v = draw(st.integers(1, 40))
    rows = [draw(st.lists(weight_st, min_size=v, max_size=v)) for _ in range(b)]
    for r in rows:  # each row needs a positive weight
        if max(r) == 0:
            r[draw(st.integers(0, v - 1))] = 1.0
    seeds = draw(st.lists(seeds_st, min_size=b, max_size=b))
    positions = draw(st.lists(pos_st, min_size=b, max_size=b))
    step = draw(st.integers(0, min(50, U32 // v - 1)))
    stream = draw(st.sampled_from(list(Stream)))
    if stream is not Stream.DRAFT:
        step = 0
    return torch.tensor(rows, dtype=torch.float64), seeds, positions, step, stream


@settings(max_examples=150, deadline=None)
@given(race_case())
def test_race_winner_is_positive_and_equals_materialized_definition(case):
    w, seeds, positions, step, stream = case
    v = w.shape[1]
    got = exponential_race(w, seeds, positions, stream=stream, draft_step=step)[:, 0]
    u = hash_uniform(seeds, positions, range(step * v, step * v + v), salt=stream)
    assert torch.equal(got, (w * (1.0 / -torch.log(u))).argmax(dim=1))
    assert bool((w.gather(1, got.unsqueeze(1)) > 0).all())


@settings(max_examples=100, deadline=None)
@given(race_case(), st.integers(1, 6))
def test_top_k_distinct_positive_and_row_independent(case, k):
    w, seeds, positions, step, stream = case
    k = min(k, int((w > 0).sum(dim=1).min()))
    got = exponential_race(w, seeds, positions, stream=stream, draft_step=step, num_samples=k)
    for row in range(w.shape[0]):
        ids = got[row].tolist()
        assert len(set(ids)) == k and all(w[row, i] > 0 for i in ids)
        alone = exponential_race(w[row : row + 1], [seeds[row]], [positions[row]], stream=stream,
                                 draft_step=step, num_samples=k)
        assert alone[0].tolist() == ids
    # The first of the top-k is the single draw.
    single = exponential_race(w, seeds, positions, stream=stream, draft_step=step)
    assert torch.equal(got[:, :1], single)


@st.composite
def verify_case(draw):
    b = draw(st.integers(1, 4))
    k = draw(st.integers(0, 4))
    v = draw(st.integers(1, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    q = torch.rand(b, k, v, generator=gen) * (torch.rand(b, k, v, generator=gen) > 0.3)
    q[..., 0] += 1e-3  # the drafted token needs q > 0
    p = torch.rand(b, k + 1, v, generator=gen) * (torch.rand(b, k + 1, v, generator=gen) > 0.3)
    p[..., -1] += 1e-3
    q = q / q.sum(dim=-1, keepdim=True)  # verification takes probability rows
    p = p / p.sum(dim=-1, keepdim=True)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, k) if k else torch.zeros(b, 0, dtype=torch.int64)
    seeds = draw(st.lists(seeds_st, min_size=b, max_size=b))
    positions = draw(st.lists(st.integers(0, U32 - 1 - k), min_size=b, max_size=b))
    return x, q, p, seeds, positions


@settings(max_examples=150, deadline=None)
@given(verify_case())
def test_verify_output_structure(case):
    x, q, p, seeds, positions = case
    b, k = x.shape
    tok, acc = verify_chain(x, q, p, seeds, positions)
    assert tok.shape == (b, k + 1) and acc.shape == (b,)
    for r in range(b):
        n = int(acc[r])
        assert 0 <= n <= k
        assert tok[r, :n].tolist() == x[r, :n].tolist()
        assert (tok[r, n + 1 :] == -1).all()
        emitted = int(tok[r, n])
        # The emitted token has positive target mass (the residual lies under p).
        assert p[r, n, emitted] > 0
        if n < k:
            # A rejected draft token failed its coin: it cannot have had q[x] <= p[x].
            assert q[r, n, x[r, n]] > p[r, n, x[r, n]] or p[r, n, x[r, n]] == 0
        # Each row alone gives the same result.
        t1, a1 = verify_chain(x[r : r + 1], q[r : r + 1], p[r : r + 1], [seeds[r]], [positions[r]])
        assert t1[0].tolist() == tok[r].tolist() and int(a1) == n


def test_every_ops_export_is_the_function_not_a_submodule_of_the_same_name():
    """Importing every ops submodule first must not let a module shadow an exported name."""
    import importlib
    import pkgutil
    import types

    import sglang_detspec.ops as ops

    submodules = [
        importlib.import_module(f"sglang_detspec.ops.{info.name}")
        for info in pkgutil.iter_modules(ops.__path__)
        if not info.name.endswith("_triton") and info.name not in ("triton_blocks", "triton_hash", "triton_config")
    ]
    for name in ops.__all__:
        value = getattr(ops, name)
        assert not isinstance(value, types.ModuleType), name
        # The export is the object its defining submodule holds (ops/__init__ imports it, no copy).
        holders = [m for m in submodules if name in vars(m)]
        assert holders and all(vars(m)[name] is value for m in holders), name


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
