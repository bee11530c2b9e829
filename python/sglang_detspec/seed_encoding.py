"""How a request seed in [0, 2**64) is written into SGLang's ``sampling_seed``.

Kept apart from the HTTP client so the CLI can name the choices without
importing torch.
"""

from __future__ import annotations

_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1

SEED_ENCODINGS = ("uint64", "int64")


def sglang_seed(seed: int, encoding: str = "uint64") -> int:
    """The ``sampling_seed`` to send for a request seed in [0, 2**64).

    ``"uint64"`` sends the seed as is: a server with sglang-detspec active
    admits exactly [0, 2**64) (its request check, ``sglang_plugin/request_hook.py``).
    ``"int64"`` sends seeds >= 2**63 as the int64 with the same 64 bits, the
    only form stock SGLang admits (it checks [-2**63, 2**63),
    ``sampling_params.py:302-311``); its seeded samplers read the same bits.
    Both key the server's draws with exactly the seed the audit chose.

    Raises:
        ValueError: ``seed`` outside [0, 2**64), or an unknown ``encoding``.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _U64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    if encoding not in SEED_ENCODINGS:
        raise ValueError(f"encoding must be one of {SEED_ENCODINGS}, got {encoding!r}")
    return seed - _U64 if encoding == "int64" and seed > _I64_MAX else seed
