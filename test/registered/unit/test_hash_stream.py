"""The keyed MurmurHash3 stream against the independent `mmh3` package."""

import random
import struct

import mmh3
import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.ops import Stream, hash_uniform, keyed_hash
from sglang_detspec.ops.hashing import uniform_from_hash

register_cpu_ci(est_time=20, suite="detspec-unit-cpu")

U32, U64 = 1 << 32, 1 << 64


def oracle(seed: int, salt: int, position: int, column: int) -> int:
    key = (seed + salt) % U64
    msg = struct.pack("<IIII", key & (U32 - 1), key >> 32, position, column)
    return mmh3.hash(msg, 0, signed=False)


def test_ten_thousand_random_keys_match_mmh3():
    rng = random.Random(2026)
    rows, cols = 500, 20  # 10^4 (seed, position, column) triples
    seeds = [rng.getrandbits(64) for _ in range(rows)]
    positions = [rng.getrandbits(32) for _ in range(rows)]
    columns = [rng.getrandbits(32) for _ in range(cols)]
    salt = rng.getrandbits(64)
    got = keyed_hash(seeds, positions, columns, salt=salt)
    assert got.shape == (rows, cols) and got.dtype == torch.int64
    want = torch.tensor([[oracle(s, salt, p, c) for c in columns] for s, p in zip(seeds, positions)])
    assert torch.equal(got, want)


@pytest.mark.parametrize("stream", list(Stream))
def test_endpoints_and_every_salt(stream):
    seeds = [0, U64 - 1, 1, 1 << 63, (1 << 63) - 1, U64 - stream.salt, U64 - stream.salt - 1]
    positions = [0, U32 - 1, 1, 12345, U32 - 1, 0, 7]
    columns = [0, 1, U32 - 1, 163_839, 2 * 163_840]
    got = keyed_hash(seeds, positions, columns, salt=stream)
    want = torch.tensor([[oracle(s, stream.salt, p, c) for c in columns] for s, p in zip(seeds, positions)])
    assert torch.equal(got, want)


def test_int64_seed_tensor_is_read_as_uint64_bits():
    # SGLang carries sampling_seed as int64: -1 must mean 2**64 - 1.
    t = keyed_hash(torch.tensor([-1, -(1 << 63)]), torch.tensor([3, 4]), [9], salt=Stream.DRAFT)
    p = keyed_hash([U64 - 1, 1 << 63], [3, 4], [9], salt=Stream.DRAFT)
    assert torch.equal(t, p)
    assert int(t[0, 0]) == oracle(U64 - 1, Stream.DRAFT.salt, 3, 9)


def test_uniform_endpoints_strictly_inside_unit_interval():
    h = torch.tensor([0, 1, U32 - 2, U32 - 1])
    u = uniform_from_hash(h)
    assert u.dtype == torch.float64
    assert float(u[0]) == 2.0**-33
    assert float(u[-1]) == 1.0 - 2.0**-33
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert bool(torch.isfinite(-torch.log(u)).all()) and bool((-torch.log(u) > 0).all())


def test_hash_uniform_is_midpoint_of_hash():
    u = hash_uniform([5, 6], [10, 11], range(100), salt=Stream.BONUS)
    h = keyed_hash([5, 6], [10, 11], range(100), salt=Stream.BONUS)
    assert torch.equal(u, (h.double() + 0.5) / 2**32)
    assert bool((u > 0).all()) and bool((u < 1).all())


def test_streams_are_separated():
    seeds, positions, cols = [42] * 4, [100] * 4, range(64)
    us = [hash_uniform(seeds, positions, cols, salt=s) for s in Stream]
    for i in range(len(us)):
        for j in range(i + 1, len(us)):
            assert (us[i] != us[j]).float().mean() > 0.99
    base = hash_uniform([42], [100], cols, salt=Stream.DRAFT)
    assert (base != hash_uniform([43], [100], cols, salt=Stream.DRAFT)).float().mean() > 0.99
    assert (base != hash_uniform([42], [101], cols, salt=Stream.DRAFT)).float().mean() > 0.99


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(seeds=[-1], positions=[0], columns=[0]), r"seeds\[0\].*uint64"),
        (dict(seeds=[U64], positions=[0], columns=[0]), r"seeds\[0\].*uint64"),
        (dict(seeds=[1.5], positions=[0], columns=[0]), r"seeds\[0\] must be an int"),
        (dict(seeds=[0], positions=[U32], columns=[0]), r"positions\[0\].*2\*\*32"),
        (dict(seeds=[0], positions=[-1], columns=[0]), r"positions\[0\]"),
        (dict(seeds=[0], positions=[0], columns=[U32]), r"columns.*2\*\*32"),
        (dict(seeds=[0, 1], positions=[0], columns=[0]), r"positions has 1 rows but the batch has B = 2"),
        (dict(seeds=torch.tensor([0], dtype=torch.int32), positions=[0], columns=[0]), r"seeds must be an int64"),
        (dict(seeds=torch.tensor([[0]]), positions=[0], columns=[0]), r"seeds must be 1-D"),
        (dict(seeds=[0], positions=torch.tensor([U32]), columns=[0]), r"positions holds 4294967296"),
    ],
)
def test_bad_arguments_raise_naming_argument_and_bound(kwargs, match):
    with pytest.raises(ValueError, match=match):
        keyed_hash(**kwargs)


def test_bad_salt():
    with pytest.raises(ValueError, match="salt"):
        keyed_hash([0], [0], [0], salt=U64)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
