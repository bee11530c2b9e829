"""The one request-seed check and its int64 mapping, and the torch-free request/audit modules."""

import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.request import Request
from sglang_detspec.ops.seed_encoding import I64_MAX, I64_MIN, U64, check_seed, from_int64, sglang_seed, to_int64

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")


@given(st.integers(0, U64 - 1))
def test_int64_mapping_keeps_the_64_bits(seed):
    # Independent oracle: the same 8 bytes read as unsigned and as signed.
    signed = struct.unpack("<q", struct.pack("<Q", seed))[0]
    assert to_int64(seed) == signed == sglang_seed(seed, "int64")
    assert from_int64(signed) == seed
    assert sglang_seed(seed) == check_seed(seed) == seed


def test_mapping_at_the_edges():
    assert [to_int64(s) for s in (0, I64_MAX, I64_MAX + 1, U64 - 1)] == [0, I64_MAX, I64_MIN, -1]
    assert [from_int64(v) for v in (I64_MIN, -1, 0, I64_MAX)] == [1 << 63, U64 - 1, 0, I64_MAX]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: check_seed(-1), r"seed must be an int in \[0, 2\*\*64\), got -1"),
        (lambda: check_seed(U64), r"seed must be an int in \[0, 2\*\*64\), got 18446744073709551616"),
        (lambda: check_seed(True, "sampling_seed"), r"sampling_seed must be an int in \[0, 2\*\*64\), got bool True"),
        (lambda: check_seed(1.0), r"got float 1.0"),
        (lambda: to_int64(U64, "seeds[3]"), r"seeds\[3\] must be an int in \[0, 2\*\*64\)"),
        (lambda: from_int64(I64_MAX + 1), r"seed must be an int in \[-2\*\*63, 2\*\*63\)"),
        (lambda: from_int64(I64_MIN - 1), r"seed must be an int in \[-2\*\*63, 2\*\*63\)"),
        (lambda: sglang_seed(1, "uint32"), r"encoding must be one of uint64 or int64, got 'uint32'"),
        (lambda: Request((1,), 1, 1.0, -1), r"sampling_seed must be an int in \[0, 2\*\*64\), got -1"),
    ],
)
def test_bad_seeds_name_the_argument_and_bound(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_request_types_audits_config_and_seed_rules_import_without_torch():
    # ops/__init__ imports the torch ops on first use, so its torch-free modules stay so.
    code = (
        "import sys\n"
        "import sglang_detspec.request, sglang_detspec.ops.seed_encoding, sglang_detspec.auditing\n"
        "import sglang_detspec.auditing.http_backend, sglang_detspec.auditing.server_seeds\n"
        "import sglang_detspec.cli.audit, sglang_detspec.cli._audit_server, sglang_detspec.cli._audit_report\n"
        "import sglang_detspec.config, sglang_detspec.ops, sglang_detspec.ops.kernel_choice\n"
        "import sglang_detspec.ops.murmur, sglang_detspec.ops.streams, sglang_detspec.seeds\n"
        "from sglang_detspec.ops import KERNELS, Stream\n"
        "print(sorted(m for m in ('torch', 'triton', 'transformers', 'sglang', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_reference_engine_speaks_the_torch_free_request_types():
    from sglang_detspec.reference import Request as EngineRequest
    from sglang_detspec.reference import RequestResult

    import sglang_detspec.request as plain

    assert EngineRequest is Request and RequestResult is plain.RequestResult


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
