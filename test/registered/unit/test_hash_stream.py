"""The keyed MurmurHash3 stream against the independent `mmh3` package."""

import random
import struct

import mmh3
import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.ops import Stream, hash_uniform, keyed_hash
from sglang_detspec.ops.hashing import uniform_from_hash
from sglang_detspec.ops.murmur import keyed_hash_int

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


DESIGN_SALTS = {
    "DRAFT": 0x44524146545F0000,
    "ACCEPT": 0x4143434550540000,
    "RESAMPLE": 0x524553414D500000,
    "BONUS": 0x424F4E5553000000,
    "TARGET": 0x5441524745540000,
    "SAMPLE": 0x53414D504C450000,
}


def test_salts_are_the_design_table():
    # Each salt spells (the start of) its stream's name in ASCII, zero padded to 8 bytes.
    assert {s.name: s.salt for s in Stream} == DESIGN_SALTS
    for name, salt in DESIGN_SALTS.items():
        spelled = salt.to_bytes(8, "big").rstrip(b"\0").replace(b"_", b"")
        assert len(spelled) >= 5 and name.encode().startswith(spelled)
    assert len(set(DESIGN_SALTS.values())) == len(DESIGN_SALTS)


@pytest.mark.parametrize("name", ["TARGET", "SAMPLE"])
def test_new_streams_match_mmh3_over_random_keys(name):
    rng = random.Random(name)
    salt = DESIGN_SALTS[name]
    seeds = [rng.getrandbits(64) for _ in range(40)]
    positions = [rng.getrandbits(32) for _ in range(40)]
    columns = [0, 1] if name == "SAMPLE" else [rng.getrandbits(18) for _ in range(25)]
    got = keyed_hash(seeds, positions, columns, salt=Stream[name])
    want = torch.tensor([[oracle(s, salt, p, c) for c in columns] for s, p in zip(seeds, positions)])
    assert torch.equal(got, want)


def random_cases(rng: random.Random, count: int):
    """(seed, position, column, stream) draws with the word edges mixed in."""
    seed_edges = [0, 1, (1 << 63) - 1, 1 << 63, U64 - 1]
    word_edges = [0, 1, (1 << 31) - 1, 1 << 31, U32 - 1]
    for i in range(count):
        stream = rng.choice(list(Stream))
        seed = rng.choice(seed_edges + [U64 - stream.salt, U64 - stream.salt - 1]) if i % 4 == 0 else rng.getrandbits(64)
        position = rng.choice(word_edges) if i % 5 == 0 else rng.getrandbits(32)
        column = rng.choice(word_edges) if i % 7 == 0 else rng.getrandbits(rng.choice([1, 18, 32]))
        yield seed, position, column, stream


def test_pure_python_stream_hash_matches_mmh3():
    rng = random.Random("pure python")
    for seed, position, column, stream in random_cases(rng, 2000):
        want = oracle(seed, stream.salt, position, column)
        assert keyed_hash_int(seed, position, column, salt=stream) == want
        assert keyed_hash_int(seed, position, column, salt=stream.salt) == want


def test_torch_keyed_hash_equals_the_pure_python_hash():
    rng = random.Random("torch vs python")
    for seed, position, column, stream in random_cases(rng, 300):
        got = keyed_hash([seed], [position], [column], salt=stream)
        assert int(got[0, 0]) == keyed_hash_int(seed, position, column, salt=stream), (seed, position, column, stream)


@pytest.mark.parametrize("args, match", [
    ((U64, 0, 0), r"^seed must be an int in \[0, 2\*\*64\)"),
    ((-1, 0, 0), r"^seed must be an int in \[0, 2\*\*64\)"),
    ((0, U32, 0), r"^position must be an int in \[0, 2\*\*32\)"),
    ((0, 0, -1), r"^column must be an int in \[0, 2\*\*32\)"),
    ((0, True, 0), r"^position must be an int"),
])
def test_pure_python_stream_hash_refuses_out_of_range_words(args, match):
    with pytest.raises(ValueError, match=match):
        keyed_hash_int(*args, salt=Stream.TARGET)


def test_pure_python_stream_hash_refuses_a_bad_salt():
    with pytest.raises(ValueError, match=r"^salt must be a Stream or an int in \[0, 2\*\*64\)"):
        keyed_hash_int(0, 0, 0, salt=U64)


def test_int64_seed_tensor_is_read_as_uint64_bits():
    # SGLang carries sampling_seed as int64: -1 must mean 2**64 - 1.
    t = keyed_hash(torch.tensor([-1, -(1 << 63)]), torch.tensor([3, 4]), [9], salt=Stream.DRAFT)
    p = keyed_hash([U64 - 1, 1 << 63], [3, 4], [9], salt=Stream.DRAFT)
    assert torch.equal(t, p)
    assert int(t[0, 0]) == oracle(U64 - 1, Stream.DRAFT.salt, 3, 9)


def test_uint64_tensor_numpy_array_and_scalar_seeds():
    np = pytest.importorskip("numpy")
    want = keyed_hash([U64 - 1, 5], [3, 3], [9, 10], salt=Stream.TARGET)
    as_u64 = torch.tensor([U64 - 1, 5], dtype=torch.uint64)
    assert torch.equal(keyed_hash(as_u64, [3, 3], [9, 10], salt=Stream.TARGET), want)
    assert torch.equal(keyed_hash(np.array([U64 - 1, 5], dtype=np.uint64), np.array([3, 3]), [9, 10],
                                  salt=Stream.TARGET), want)
    # One int broadcasts to every row.
    assert torch.equal(keyed_hash([U64 - 1, 5], 3, [9, 10], salt=Stream.TARGET), want)
    both = keyed_hash(7, 3, [9], salt=Stream.TARGET)
    assert both.shape == (1, 1) and int(both[0, 0]) == oracle(7, Stream.TARGET.salt, 3, 9)


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
