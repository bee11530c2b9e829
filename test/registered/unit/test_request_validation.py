"""Bad requests get a clear error before the scheduler; a missing hook target stops start-up.

Request validation goes through SGLang's own ``TokenizerManager.generate_request``
(the ``served`` of ``test_request_seeds.py``, model vocabulary 1000): token
ids outside the vocabulary, non-integer ids and ``n < 1`` are refused with a
``ValueError`` naming the field, index, value and bound (SGLang's HTTP server
answers it with 400), and never reach the scheduler. The hook table: every
required target resolves in the installed SGLang and is wrapped after
``load_plugins``; a target that is missing or unpatched is named, with the
SGLang version, by the start-up check and by ``detspec serve --dry-run``.
"""

import re
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig
from sglang_detspec.sglang_plugin import input_hook
from test_request_seeds import ACTIVE, generate, hooked, model_with_tokenizer, served, server_args  # noqa: F401

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

SAMPLED = {"temperature": 1.0, "max_new_tokens": 4, "sampling_seed": 3}


@pytest.mark.parametrize("input_ids, message", [
    ([5000, 7], "input_ids[0] = 5000 is outside the model's vocabulary: token ids must be in [0, 1000)"),
    ([1, -1], "input_ids[1] = -1 is outside the model's vocabulary: token ids must be in [0, 1000)"),
    ([1, 2, 1000], "input_ids[2] = 1000 is outside"),
    ([1, 2.0], "input_ids[1] must be an integer token id in [0, 1000), got 2.0"),
    ([True, 2], "input_ids[0] must be an integer token id in [0, 1000), got True"),
])
def test_out_of_vocabulary_and_non_integer_ids_are_refused(served, bag, input_ids, message):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(message)):
        generate(served, input_ids=input_ids, sampling_params=dict(SAMPLED))
    assert served.sent == []  # nothing reached the scheduler


def test_batched_and_parallel_requests_are_checked_per_request(served, bag):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape("input_ids[1] = 4096 is outside")):
        generate(served, input_ids=[[1, 2], [3, 4096]], sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    with pytest.raises(ValueError, match=re.escape("input_ids[0] = -5 is outside")):
        generate(served, input_ids=[-5, 2], sampling_params={**SAMPLED, "n": 3})
    outs = generate(served, input_ids=[[1, 2], [3, 999]], sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    assert len(outs) == 2  # ids at the bounds pass


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True, None])
def test_n_below_one_or_not_an_integer_is_refused(served, bag, n):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(f"n must be an integer >= 1 (samples per prompt), got {n!r}")):
        generate(served, input_ids=[1, 2], sampling_params={**SAMPLED, "n": n})


def test_only_runs_that_are_ours_are_checked(served, bag):
    for inactive in (DetSpecConfig(source="server_args"),  # no --enable-deterministic-inference
                     DetSpecConfig(deterministic=True, disabled=True, source="server_args")):  # DISABLE=1
        bag(inactive)  # SGLang's own path, untouched
        served.sent.clear()
        generate(served, input_ids=[1000], sampling_params=dict(SAMPLED))
        assert len(served.sent) == 1


def test_multimodal_requests_and_text_vocabularies_are_left_to_sglang(served):
    from types import SimpleNamespace

    calls = []
    text_model = SimpleNamespace(vocab_size=16512, hf_text_config=SimpleNamespace(vocab_size=168064))
    assert input_hook.embedding_rows(text_model) == 168064
    tm = SimpleNamespace(model_config=SimpleNamespace(vocab_size=1000, hf_text_config=None))
    with_image = SimpleNamespace(image_data=["img"], sampling_params={})
    input_hook.validate_request(lambda *a: calls.append(a), tm, with_image, [128256, 5])
    assert len(calls) == 1  # placeholder ids beyond the vocabulary: SGLang's processors own them


def test_check_input_ids_accepts_tensors_and_empty():
    torch = pytest.importorskip("torch")
    input_hook.check_input_ids(torch.tensor([0, 999]), 1000)
    input_hook.check_input_ids([], 1000)
    with pytest.raises(ValueError, match=re.escape("input_ids[1] = 1000")):
        input_hook.check_input_ids(torch.tensor([0, 1000]), 1000)


# -- the hook table ---------------------------------------------------------------


def test_every_required_target_resolves_and_is_wrapped(hooked):
    rows = sglang_plugin.hook_table()
    required = [r for r in rows if not r.absent_ok and r.kind in sglang_plugin.REGISTRY_KINDS]
    assert required and all(sglang_plugin._resolve(r.target) is not None for r in required)
    assert sglang_plugin.hook_problems() == []


def fake_table(monkeypatch, *extra):
    rows = sglang_plugin.hook_table()
    monkeypatch.setattr(sglang_plugin, "hook_table", lambda: [*rows, *extra])


def test_a_missing_or_unpatched_target_is_named_with_the_sglang_version(hooked, monkeypatch, bag):
    missing = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.fast_sample_renamed", print, "AROUND")
    unpatched = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.select_top_k_tokens", print, "AROUND")
    optional = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.gone", print, "AROUND", "optional")
    fake_table(monkeypatch, missing, unpatched, optional)
    problems = sglang_plugin.hook_problems()
    assert problems == [
        "sglang.srt.speculative.spec_utils.fast_sample_renamed is not found in SGLang 0.5.23",
        "sglang.srt.speculative.spec_utils.select_top_k_tokens (SGLang 0.5.23) was not patched by SGLang's "
        "hook registry",
    ]
    bag(DetSpecConfig(deterministic=True, source="server_args"))
    with pytest.raises(RuntimeError, match="fast_sample_renamed is not found in SGLang 0.5.23"):
        sglang_plugin.check_hooks_in_place(None, None)
    bag(DetSpecConfig(source="server_args"))  # not ours: SGLang's own code runs anyway
    assert sglang_plugin.check_hooks_in_place(None, None) is None


def test_serve_dry_run_reports_a_missing_target(hooked, monkeypatch, model_dir):
    from sglang_detspec.cli import serve

    fake_table(monkeypatch, sglang_plugin.Hook("sglang.srt.layers.sampler.no_such_sampler", print, "AROUND"))
    _, problems = serve.startup_check(["--model-path", model_dir, "--enable-deterministic-inference"], {})
    assert "sglang.srt.layers.sampler.no_such_sampler is not found in SGLang 0.5.23" in problems


def test_docs_list_every_hooked_symbol():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "plugin.md").read_text()
    for row in sglang_plugin.hook_table():
        owner_and_name = ".".join(row.target.rsplit(".", 2)[-2:])  # e.g. TokenizerManager._validate_one_request
        assert owner_and_name in doc, row.target


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
