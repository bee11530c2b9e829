"""Fixtures several unit test files share."""

import json
import os

import pytest
import torch

from sglang_detspec.config import install_config, reset_config


@pytest.fixture(autouse=True)
def no_detspec_environment(monkeypatch):
    """Every test starts without SGLANG_DETSPEC_* settings, whatever the calling shell exports."""
    for name in [n for n in os.environ if n.startswith("SGLANG_DETSPEC_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def bag():
    """Install a config bag for one test (``bag(config)`` returns it), then forget it."""
    def use(config):
        return install_config(config)

    yield use
    reset_config()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A folder with a tiny Llama ``config.json``: enough for SGLang to resolve real ServerArgs."""
    d = tmp_path_factory.mktemp("tiny_llama")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
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
