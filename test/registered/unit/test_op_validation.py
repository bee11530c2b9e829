"""Every bad input to the samplers raises ValueError naming the argument and the bound."""

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.ops import Stream, exponential_race, verify_chain
from sglang_detspec.ops.choices import one_of

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

U32, U64 = 1 << 32, 1 << 64
W = torch.ones(2, 8)


def race(**kw):
    args = dict(weights=W, seeds=[1, 2], positions=[3, 4], stream="draft")
    args.update(kw)
    return exponential_race(args.pop("weights"), args.pop("seeds"), args.pop("positions"), **args)


def with_value(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


RACE_CASES = [
    (dict(weights=with_value(W, (0, 3), float("nan"))), "weights contains NaN"),
    (dict(weights=with_value(W, (1, 0), float("inf"))), "weights contains inf"),
    (dict(weights=with_value(W, (1, 0), -0.5)), "weights contains negative"),
    (dict(weights=with_value(W, 1, 0.0)), r"weights has an all-zero row at index \[1\]"),
    (dict(weights=torch.ones(2, 8, dtype=torch.int64)), "weights must be a floating tensor"),
    (dict(weights=torch.ones(8)), "weights must have 2 dims"),
    (dict(weights=torch.ones(2, 0)), "empty vocabulary"),
    (dict(seeds=[1]), "seeds has 1 rows but the batch has B = 2"),
    (dict(seeds=[1, U64]), r"seeds\[1\] = 18446744073709551616 is outside uint64"),
    (dict(seeds=[-3, 1]), r"seeds\[0\] = -3 is outside uint64"),
    (dict(seeds=torch.tensor([1.0, 2.0])), r"seeds must be an int64 tensor \(uint64 bits\) or a torch.uint64"),
    (dict(seeds=torch.tensor([1, 2], dtype=torch.int32)), r"pass seeds.to\(torch.int64\)"),
    (dict(seeds="12"), r"seeds must be an int64 tensor \[B\] \(uint64 bits.*one int for every row; got str"),
    (dict(seeds=U64), r"seeds = 18446744073709551616 is outside uint64"),
    (dict(seeds=torch.tensor([[1, 2]])), "seeds must be 1-D"),
    (dict(positions=[0, U32]), r"positions\[1\] = 4294967296 is outside \[0, 2\*\*32 - 1\]"),
    (dict(positions=torch.tensor([0, U32])), r"positions holds 4294967296, outside \[0, 2\*\*32 - 1\]"),
    (dict(positions=torch.tensor([-1, 0])), r"positions holds -1"),
    (dict(positions=torch.tensor([0.0, 1.0])), r"positions must be an integer tensor \(int64, int32, uint32 or uint64\)"),
    (dict(positions=U32), r"positions = 4294967296 is outside \[0, 2\*\*32 - 1\]"),
    (dict(positions=1.5), r"positions must be an integer tensor \[B\], .*or one int for every row; got float"),
    (dict(positions=[1, 2, 3]), "positions has 3 rows"),
    (dict(stream="coins"), "stream must be one of"),
    (dict(num_samples=0), r"num_samples must be an int in \[1, V = 8\]"),
    (dict(num_samples=9), r"num_samples must be an int in \[1, V = 8\]"),
    (dict(weights=with_value(W, (0, slice(2, None)), 0.0), num_samples=3), "weights row 0 has only 2 positive"),
    (dict(draft_step=-1), "draft_step must be a non-negative int"),
    (dict(draft_step=U32 // 8), r"draft_step \* V .* reach 2\*\*32"),
    (dict(draft_step=1, stream="bonus"), "draft_step applies to the DRAFT stream only"),
    (dict(kernel="cuda"), "kernel must be one of"),
    (dict(kernel=None), r"kernel must be one of auto, torch or triton, got None"),
    (dict(weights=with_value(W.double(), (0, 1), 1e300)), "above 1e290"),
    (dict(weights=with_value(W.double(), (1, 2), 5e-324)), "subnormal"),
    (dict(kernel="triton"), "kernel='triton' needs CUDA tensors"),
]


@pytest.mark.parametrize("kwargs, match", RACE_CASES)
def test_race_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        race(**kwargs)


def test_largest_draft_step_that_fits_is_accepted():
    # columns (U32/8 - 1) * 8 .. U32 - 1 are all valid uint32 words
    assert race(draft_step=U32 // 8 - 1).shape == (2, 1)


B, K, V = 2, 3, 6
X = torch.zeros(B, K, dtype=torch.int64)
Q = torch.full((B, K, V), 1 / V)
P = torch.full((B, K + 1, V), 1 / V)


def verify(**kw):
    args = dict(draft_tokens=X, draft_probs=Q, target_probs=P, seeds=[1, 2], positions=[3, 4])
    args.update(kw)
    return verify_chain(**args)


VERIFY_CASES = [
    (dict(draft_tokens=X.float()), "draft_tokens must be an int64 or int32 tensor"),
    (dict(draft_tokens=X[0]), "draft_tokens must be 2-D"),
    (dict(draft_tokens=with_value(X, (1, 2), V)), r"draft_tokens holds 6, outside \[0, V = 6\)"),
    (dict(draft_tokens=with_value(X, (0, 0), -1)), r"draft_tokens holds -1"),
    (dict(draft_probs=Q[:, :2]), r"draft_probs must be \[B, K, V\] = \(2, 3, 6\)"),
    (dict(target_probs=P[:, :3]), r"target_probs must be \[B, K\+1, V\] = \(2, 4, 6\)"),
    (dict(target_probs=torch.full((B, K + 1, V + 1), 0.1)), r"draft_probs must be \[B, K, V\] = \(2, 3, 7\)"),
    (dict(draft_probs=Q.double()), "must share a dtype"),
    (dict(draft_probs=with_value(Q, (0, 1, 2), float("nan"))), "draft_probs contains NaN"),
    (dict(target_probs=with_value(P, (0, 1, 2), -1.0)), "target_probs contains negative"),
    (dict(target_probs=with_value(P, (1, 3), 0.0)), r"target_probs has an all-zero row at index \[1, 3\]"),
    (dict(seeds=[1, 2, 3]), "seeds has 3 rows"),
    (dict(seeds=[1, -1]), r"seeds\[1\] = -1 is outside uint64"),
    (dict(positions=[0, U32 - K]), r"positions\[1\] = 4294967293 is outside \[0, 2\*\*32 - 4\]"),
    (dict(positions=torch.tensor([0, U32 - K])), r"positions holds 4294967293, outside \[0, 2\*\*32 - 4\].*4 consecutive"),
    (dict(kernel="triton"), "kernel='triton' needs CUDA tensors"),
    (dict(kernel=None), "kernel must be one of"),
    (dict(draft_probs=Q * 100), r"draft_probs row \[0, 0\] sums to 100\.0\d*, not 1 within 0.001"),
    (dict(target_probs=P * 0.5), r"target_probs row \[0, 0\] sums to 0.5"),
    (dict(draft_probs=with_value(Q, (1, 2), torch.tensor([0.0, 0.2, 0.2, 0.2, 0.2, 0.2]))),
     r"draft_tokens\[1, 2\] = 0 has draft probability 0"),
]


@pytest.mark.parametrize("kwargs, match", VERIFY_CASES)
def test_verify_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        verify(**kwargs)


def test_last_valid_position_is_accepted():
    tok, acc = verify(positions=[0, U32 - K - 1])
    assert tok.shape == (B, K + 1) and acc.shape == (B,)


def test_check_false_skips_only_value_checks():
    # Metadata checks still run without value checks (the CUDA-graph path).
    with pytest.raises(ValueError, match="seeds has 1 rows"):
        race(seeds=[1], check=False)
    with pytest.raises(ValueError, match="positions holds"):
        race(positions=torch.tensor([U32, 6]))
    assert race(positions=torch.tensor([U32, 6]), check=False).shape == (2, 1)


@pytest.mark.parametrize("columns, match", [
    ([1.7], r"columns\[0\] must be an int, got float"),
    ([True], r"columns\[0\] must be an int, got bool"),
    ([1 << 63], r"columns\[0\] = 9223372036854775808 is outside \[0, 2\*\*32\)"),
    ([-1], r"columns\[0\] = -1 is outside"),
    (5, "columns must be an integer tensor or a sequence of ints, got int"),
    ("12", "columns must be an integer tensor or a sequence of ints, got str"),
    (torch.tensor([0.5]), "columns must be an int64 or int32 tensor"),
    (torch.tensor([[1]]), "columns must be 1-D"),
])
def test_hash_columns_rejected(columns, match):
    from sglang_detspec.ops import keyed_hash

    with pytest.raises(ValueError, match=match):
        keyed_hash([1], [2], columns)


def test_numpy_arrays_are_refused_when_ambiguous():
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match="seeds as a NumPy array must have an integer dtype, got float64"):
        race(seeds=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"seeds holds -1, outside uint64"):
        race(seeds=np.array([-1, 2]))
    with pytest.raises(ValueError, match=r"positions holds -3, outside \[0, 2\*\*32\)"):
        race(positions=np.array([-3, 2]))
    # Host arrays are range-checked even with check=False (no device read needed).
    for dtype in (np.uint64, np.int64):
        with pytest.raises(ValueError, match=r"positions holds 4294967296, outside \[0, 2\*\*32 - 1\]"):
            exponential_race(torch.rand(2, 8), [1, 2], np.array([2**32, 0], dtype=dtype),
                             stream=Stream.TARGET, check=False)


def test_equivalent_seed_and_position_forms_give_equal_draws():
    np = pytest.importorskip("numpy")
    base = race(seeds=[U64 - 2, 9], positions=[5, 5])
    forms = [
        dict(seeds=torch.tensor([U64 - 2, 9], dtype=torch.uint64), positions=5),
        dict(seeds=np.array([U64 - 2, 9], dtype=np.uint64), positions=np.array([5, 5], dtype=np.uint32)),
        dict(seeds=torch.tensor([-2, 9]), positions=torch.tensor(5)),
        dict(seeds=[np.uint64(U64 - 2), 9], positions=torch.tensor([5, 5], dtype=torch.int32)),
    ]
    for kw in forms:
        assert torch.equal(race(**kw), base), kw
    # One seed for every row.
    one = race(seeds=9, positions=[5, 5])
    assert torch.equal(one, race(seeds=[9, 9], positions=[5, 5]))
    tok, acc = verify(seeds=np.array([1, 2]), positions=3)
    t2, a2 = verify(seeds=[1, 2], positions=[3, 3])
    assert torch.equal(tok, t2) and torch.equal(acc, a2)


def test_numpy_integers_are_ints():
    np = pytest.importorskip("numpy")
    from sglang_detspec.ops import keyed_hash

    a = keyed_hash([np.uint64(7)], [np.int64(3)], [np.int32(9)])
    assert torch.equal(a, keyed_hash([7], [3], [9]))


@pytest.mark.parametrize("allowed, text", [
    (("auto",), "auto"),
    (("uint64", "int64"), "uint64 or int64"),
    ((64, 128, 256), "64, 128 or 256"),
    ((Stream.DRAFT, Stream.BONUS), "DRAFT or BONUS"),
    ((torch.bfloat16, torch.float16, torch.float32), "bfloat16, float16 or float32"),
])
def test_allowed_values_read_as_typed(allowed, text):
    # Error messages list the values as a user types them, not as a Python tuple.
    assert one_of(allowed) == text
    assert one_of(iter(allowed)) == text


def test_nothing_allowed_is_a_bug():
    with pytest.raises(ValueError, match="allowed must name at least one value"):
        one_of(())


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
