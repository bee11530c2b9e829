"""Fixtures several unit test files share."""

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from sglang_detspec.config import install_config, reset_config


@pytest.fixture(autouse=True)
def no_detspec_environment(monkeypatch):
    """Every test starts without SGLANG_DETSPEC_* settings, whatever the calling shell exports."""
    for name in [n for n in os.environ if n.startswith("SGLANG_DETSPEC_")]:
        monkeypatch.delenv(name)


# The E2E suites' folder: its modules import each other by bare name (``import _e2e``).
E2E_DIR = Path(__file__).resolve().parents[1] / "e2e"


@pytest.fixture(scope="session")
def e2e_import():
    """``e2e_import("_e2e")``: a module of ``test/registered/e2e`` imported by bare name, as its suites do.

    The folder is on ``sys.path`` only while the import runs; the suite's
    modules import their siblings at module level, so those stay in
    ``sys.modules`` for later calls.
    """
    def load(name: str):
        sys.path.insert(0, str(E2E_DIR))
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(str(E2E_DIR))

    return load


@pytest.fixture
def bag():
    """Install a config bag for one test (``bag(config)`` returns it), then forget it."""
    def use(config):
        return install_config(config)

    yield use
    reset_config()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A folder with a tiny Llama ``config.json``: enough for SGLang to resolve real ServerArgs.

    Head size 128 (``hidden_size`` / heads): above ``config.FA3_UNMASKED_DECODE_MAX_HEAD_DIM``, so an FA3 chain
    claims ``bitwise`` here; the head-size rule has tests of its own.
    """
    d = tmp_path_factory.mktemp("tiny_llama")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "torch_dtype": "float16",
    }))
    return str(d)


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """torch on one thread for a module's tests.

    The reference oracles run model forwards outside the engine (which holds one thread
    itself); at this model size more threads only contend, badly so on a shared host.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models():
    """The default tiny target/draft pair of the reference engine."""
    from sglang_detspec.reference import build_model_pair

    return build_model_pair()
