"""The SGLang plugin against the real SGLang 0.5.23: loading, config bag, hooks, validation.

Nothing of SGLang is faked: SGLang's own loader loads the entry point, real
``ServerArgs`` are built from CLI flags and resolved by SGLang, and SGLang's
own draft-proposal and verify entry points are called on CPU tensors.
"""

import dataclasses
import json
import logging
import os
import sys
import types

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig, current_config, reset_config
from sglang_detspec.ops import Stream, exponential_race, verify_chain
from sglang_detspec.sglang_plugin import resolve, verify_hook
from sglang_detspec.sglang_plugin.verify_hook import VerifyContext

register_cpu_ci(est_time=120, suite="detspec-unit-cpu")

# Rejection mode: the seeded rejection-sampling chain (coupled mode is tested in test_coupled_plugin.py).
ACTIVE = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4,
                       rejection_sampling=True, verify="rejection", source="server_args")
INACTIVE = dataclasses.replace(ACTIVE, deterministic=False)


@pytest.fixture(scope="module")
def loaded():
    """SGLang's own loader, called twice, plus a direct second register(): harmless."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    load_plugins()
    sglang_plugin.register()
    yield
    reset_config()


def unwrap_depth(fn) -> int:
    depth = 0
    while hasattr(fn, "__wrapped__"):
        fn, depth = fn.__wrapped__, depth + 1
    return depth


# -- loading -------------------------------------------------------------------


def test_sglang_loader_discovers_the_entry_point():
    from sglang.srt.plugins import load_plugins_by_group

    found = load_plugins_by_group(sglang_plugin.ENTRY_POINT_GROUP)
    assert sglang_plugin.ENTRY_POINT_NAME in found
    func, dist = found[sglang_plugin.ENTRY_POINT_NAME]
    assert func is sglang_plugin.register and dist == "sglang-detspec"


def test_sglang_plugins_whitelist_filters_it(monkeypatch):
    from sglang.srt.plugins import load_plugins_by_group

    monkeypatch.setenv("SGLANG_PLUGINS", "some-other-plugin")
    assert sglang_plugin.ENTRY_POINT_NAME not in load_plugins_by_group(sglang_plugin.ENTRY_POINT_GROUP)
    monkeypatch.setenv("SGLANG_PLUGINS", f"x, {sglang_plugin.ENTRY_POINT_NAME}")
    assert sglang_plugin.ENTRY_POINT_NAME in load_plugins_by_group(sglang_plugin.ENTRY_POINT_GROUP)


HOOKED = {
    "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding",
    "sglang.srt.runtime_context.publish",
    "sglang.srt.speculative.spec_utils.fast_sample",
    "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker._draft_extend_for_prefill",
    "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker._draft_extend_for_decode",
    "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner."
    "MultiLayerEagleDraftExtendCudaGraphRunner._sample_draft_proposal",
    "sglang.srt.speculative.eagle_utils.eagle_sample",
    "sglang.kernels.ops.speculative.verify_sampling.chain_speculative_sampling_triton",
    "sglang.kernels.ops.speculative.verify_sampling.tree_speculative_sampling_target_only",
    "sglang.srt.layers.sampler.sampling_from_probs_torch",
    "sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch",
    "sglang.kernels.ops.sampling.softmax",
    "sglang.srt.speculative.eagle_utils._verify_coins",
    "sglang.kernels.ops.sampling.renorm.top_k_renorm_prob",
    "sglang.kernels.ops.sampling.renorm.top_p_renorm_prob",
    "sglang.srt.sampling.sampling_params.SamplingParams.verify",
    "sglang.srt.entrypoints.api_contract.generate_contract_error",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode",
    "sglang.srt.speculative.spec_utils.renorm_draft_probs",
    "sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.capture_one_shape",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.execute",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
    "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling",
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__",
    "sglang.srt.layers.layernorm.RMSNorm.forward_cuda",
    "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs",
    "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft",
    *(f"sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend.{name}" for name in (
        "__init__", "init_cuda_graph_state", "init_forward_metadata", "init_forward_metadata_out_graph",
        "init_forward_metadata_in_graph", "forward_extend", "forward_decode")),
}
# Targets SGLang itself wraps (functools.wraps decorators such as torch.no_grad): their depth before any hook.
SGLANG_WRAPPERS = {"sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs": 1}
# SGLang's FA3 backend module loads sgl_kernel's CUDA library when imported: CUDA builds only.
CUDA_MODULES = ("sglang.srt.layers.attention.flashattention_backend",)
# Names SGLang leaves None where the platform has no kernel (CPU-only builds).
KERNEL_ONLY = {
    "sglang.kernels.ops.speculative.verify_sampling.tree_speculative_sampling_target_only",
    "sglang.kernels.ops.sampling.renorm.top_k_renorm_prob",
    "sglang.kernels.ops.sampling.renorm.top_p_renorm_prob",
}


def test_every_hook_applied_exactly_once(loaded):
    import pkgutil

    per_target = {}
    for target, hook, kind, _ in sglang_plugin.registry_rows():
        per_target[target] = per_target.get(target, 0) + 1
    seed_targets = {row.target for row in sglang_plugin.registry_rows() if row.hook.__module__.endswith(".request_seeds")}
    assert set(per_target) == HOOKED | seed_targets  # request seeds: their own module and tests
    absent, unimportable = set(), set()
    for target, count in per_target.items():
        obj_path, attr = target.rsplit(".", 1)
        try:
            current = getattr(pkgutil.resolve_name(obj_path), attr)
        except (ImportError, AttributeError):  # pkgutil reports a module that failed to import as a missing attribute
            unimportable.add(target)
            continue
        if current is None:
            absent.add(target)  # no kernel on this platform: left alone
            continue
        assert unwrap_depth(current) == count + SGLANG_WRAPPERS.get(target, 0), target
    assert absent <= KERNEL_ONLY
    assert all(t.startswith(CUDA_MODULES) for t in unimportable), unimportable
    for target in unimportable:  # optional rows: registration skipped them, start-up does not ask for them
        assert next(row for row in sglang_plugin.hook_table() if row.target == target).absent_ok
    if not torch.cuda.is_available():
        assert absent == KERNEL_ONLY
        # Methods of the backend's class (module.Class.method).
        assert {t[:t.index(m) + len(m)] for t in unimportable for m in CUDA_MODULES if t.startswith(m)} \
            == set(CUDA_MODULES)


def test_docs_hook_table_is_generated_from_the_hook_table():
    """docs/plugin.md's hook table is exactly ``hook_table_markdown()`` (``make docs-hooks`` rewrites it)."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "scripts" / "gen_hook_doc.py"
    spec = importlib.util.spec_from_file_location("gen_hook_doc", script)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.DOC.read_text()
    assert gen.splice(text, sglang_plugin.hook_table_markdown()) == text, "run `make docs-hooks`"
    # The check sees a stale row.
    assert gen.splice(text, sglang_plugin.hook_table_markdown() + "| stale |\n") != text
    with pytest.raises(ValueError, match="marker"):
        gen.splice("no markers here", "table")


def test_every_patch_is_a_row_and_names_a_real_sglang_class():
    """Rows beyond the registry's (SWAP, PATCH, FIELD, ATTR) name an SGLang class that exists (or, for a PATCH
    of a module's own binding, a module attribute that exists), and a hook of the table."""
    import pkgutil
    import types

    rows = sglang_plugin.hook_table()
    assert {r.kind for r in rows} == set(sglang_plugin.KINDS)
    registry_hooks = {r.hook for r in rows if r.kind in sglang_plugin.REGISTRY_KINDS}
    for row in rows:
        if row.kind in sglang_plugin.REGISTRY_KINDS:
            continue
        parts = row.target.split(".")
        cls_at = next((i for i, p in enumerate(parts) if p[:1].isupper()), None)
        if cls_at is None and row.kind == "ATTR":  # a module-level value the hook sets (SGLang's override slot)
            assert hasattr(pkgutil.resolve_name(".".join(parts[:-1])), parts[-1]), row.target
            assert row.hook in registry_hooks, row
            continue
        if cls_at is None:
            assert row.kind == "PATCH", row  # a module's own binding, swapped for one call
            owner = ".".join(parts[:-1])
            assert isinstance(pkgutil.resolve_name(owner), types.ModuleType) and callable(
                pkgutil.resolve_name(row.target)), row.target
            assert row.hook.__module__ in {h.__module__ for h in registry_hooks}, row
            continue
        owner = ".".join(parts[: cls_at + 1])
        if owner.startswith(CUDA_MODULES) and not torch.cuda.is_available():
            continue  # the module loads sgl_kernel's CUDA library
        assert isinstance(pkgutil.resolve_name(owner), type), row.target
        # The change is made by a registered hook, or by a helper a registered hook calls.
        assert row.hook in registry_hooks or row.hook.__module__ in {h.__module__ for h in registry_hooks}, row


def test_no_hook_module_keeps_its_own_list_of_rows():
    for name in ("request_seeds", "topk_draft_hook"):
        assert not hasattr(getattr(sglang_plugin, name), "HOOKS"), name


def test_targets_absent_on_this_platform_stay_none(loaded):
    # Hooking a None target would make the registry rebind every None-valued
    # module attribute in the process.
    from sglang.kernels.ops.sampling import renorm

    if torch.cuda.is_available():
        pytest.skip("the renorm ops exist on CUDA builds; this checks the CPU-only case")
    assert renorm.top_k_renorm_prob is None and renorm.top_p_renorm_prob is None


def test_call_sites_bound_by_from_import_see_the_hooks(loaded):
    from sglang.kernels.ops.speculative import verify_sampling
    from sglang.srt.speculative import (
        eagle_utils,
        eagle_worker_common,
        eagle_worker_v2,
        multi_layer_eagle_draft_extend_cuda_graph_runner as mtp_runner,
        spec_utils,
    )

    hooked_fast_sample = spec_utils.fast_sample
    assert hooked_fast_sample.__wrapped__.__module__ == "sglang.srt.speculative.spec_utils"
    assert eagle_worker_v2.fast_sample is hooked_fast_sample  # EAGLE v2 draft-extend for prefill
    assert mtp_runner.fast_sample is hooked_fast_sample  # single-CUDA-graph MTP runner
    assert eagle_worker_common.eagle_sample is eagle_utils.eagle_sample
    assert unwrap_depth(eagle_utils.eagle_sample) == 1
    assert eagle_utils.chain_speculative_sampling_triton is verify_sampling.chain_speculative_sampling_triton
    assert unwrap_depth(eagle_utils.chain_speculative_sampling_triton) == 1


# -- the config bag from real ServerArgs ------------------------------------------


def server_args(model_dir, flags: str):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    # --device cuda resolves without touching a GPU; triton attention is what
    # deterministic inference accepts.
    argv = ["--model-path", model_dir, "--device", "cuda", "--attention-backend", "triton",
            "--speculative-draft-model-path", model_dir, *flags.split()]
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    sa.resolve_once()
    return sa


DET = "--enable-deterministic-inference --speculative-use-rejection-sampling"
BAG_CASES = [
    (f"--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
     f"--speculative-num-draft-tokens 4 {DET}", dict(algorithm="EAGLE", num_steps=3, eagle_topk=1,
                                                      num_draft_tokens=4, multi_layer_eagle=False,
                                                      verify="rejection"), True),
    (f"--speculative-algorithm nextn --speculative-num-steps 2 --speculative-eagle-topk 1 "
     f"--speculative-num-draft-tokens 3 {DET}", dict(algorithm="EAGLE", num_steps=2, num_draft_tokens=3), True),
    (f"--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
     f"--speculative-num-draft-tokens 4 {DET}", dict(algorithm="EAGLE3"), True),
    (f"--speculative-algorithm EAGLE --enable-multi-layer-eagle --speculative-num-steps 2 "
     f"--speculative-eagle-topk 1 --speculative-num-draft-tokens 3 {DET}",
     dict(algorithm="EAGLE", multi_layer_eagle=True, num_steps=2), True),
    ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
     "--speculative-num-draft-tokens 4 --speculative-use-rejection-sampling",
     dict(deterministic=False, rejection_sampling=True), False),
    ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
     "--speculative-num-draft-tokens 8 --enable-deterministic-inference",
     dict(deterministic=True, rejection_sampling=False, eagle_topk=4, verify="coupled"), True),
    ("--enable-deterministic-inference", dict(deterministic=True, algorithm=None, verify="coupled"), True),
]


@pytest.mark.parametrize("flags, expect, active", BAG_CASES)
def test_real_server_args_resolve_into_the_bag(loaded, model_dir, flags, expect, active):
    reset_config()
    sa = server_args(model_dir, flags)
    bag = resolve.config_from_server_args(sa)
    for field, value in expect.items():
        assert getattr(bag, field) == value, field
    assert bag.active is active
    # SGLang's resolution ran our AFTER hook, which installed the same bag.
    assert current_config() == bag
    with pytest.raises(dataclasses.FrozenInstanceError):
        bag.kernel = "torch"


def test_env_settings_reach_the_bag(loaded, model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_KERNEL", "torch")
    sa = server_args(model_dir, BAG_CASES[0][0])
    assert resolve.config_from_server_args(sa).kernel == "torch"
    monkeypatch.setenv("SGLANG_DETSPEC_KERNEL", "cuda")
    with pytest.raises(ValueError, match="SGLANG_DETSPEC_KERNEL must be one of"):
        resolve.config_from_server_args(sa)
    reset_config()


# -- the bag of every process: installed when SGLang publishes its runtime context ----------------


@pytest.fixture
def context():
    """SGLang's runtime context put back after the test (its publishes would outlive it), the bag forgotten."""
    from sglang.srt.runtime_context import restore_context, snapshot_context

    saved = snapshot_context()
    yield
    restore_context(saved)
    reset_config()


def startup_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("sglang-detspec ")
            and "DetSpecConfig(" in r.getMessage()]


def test_publish_installs_the_bag_of_the_published_context(loaded, model_dir, context, caplog):
    from sglang.srt.runtime_context import publish

    sa = server_args(model_dir, BAG_CASES[3][0])
    reset_config()  # a process that was handed a resolved record: nothing installed yet
    caplog.set_level(logging.WARNING, logger="sglang_detspec")
    caplog.clear()  # the resolution's own line
    assert current_config().source == "env" and not current_config().active
    assert publish(sa, role="test") is not None  # the hook leaves publish's own result alone
    bag = current_config()
    assert bag.source == "runtime_context" and bag.active and bag.multi_layer_eagle and bag.verify == "rejection"
    assert current_config() is bag  # a plain getter: the installed bag as is
    assert startup_lines(caplog) == [f"sglang-detspec active: {bag.describe()}"]
    publish(sa, role="test")  # re-publishing the same record changes nothing and logs nothing
    assert current_config() is bag and len(startup_lines(caplog)) == 1


@pytest.mark.parametrize("flags", [flags for flags, _, _ in BAG_CASES] + ["--tokenizer-worker-num 2"])
def test_the_launchers_publish_keeps_the_bag_its_resolution_installed(loaded, model_dir, context, caplog, flags):
    """The launcher publishes the record it resolved: the runtime context gives the same bag (tokenizer workers
    included), so the one from resolution stays, with its one start-up line."""
    from sglang.srt.runtime_context import publish

    caplog.set_level(logging.WARNING, logger="sglang_detspec")
    reset_config()
    sa = server_args(model_dir, flags)
    resolved = current_config()
    assert resolved.source == "server_args" and len(startup_lines(caplog)) == 1
    publish(sa, role="tokenizer")
    assert current_config() is resolved and len(startup_lines(caplog)) == 1
    assert dataclasses.replace(resolve.config_from_runtime_context(), source="server_args") == resolved
    if "--tokenizer-worker-num 2" in flags:
        assert resolved.tokenizer_workers == 2


def test_a_scheduler_process_resolves_the_fa3_tree_defaults_as_its_launcher(loaded, model_dir, context):
    """The runtime context's "spec" namespace has no backend: the defaults come from the record read beside it."""
    from sglang.srt.runtime_context import publish

    flags = ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
             "--speculative-num-draft-tokens 8 --enable-deterministic-inference --attention-backend fa3")
    reset_config()
    sa = server_args(model_dir, flags)  # head size 128 (model_dir)
    launcher = current_config()
    assert (launcher.tree_attention, launcher.decode_attention, launcher.chain_at_batch, launcher.chain_at_tokens) == (
        "nodes", "sglang", 16, 12288)
    reset_config()  # a scheduler process: handed the resolved record, nothing installed yet
    publish(sa, role="scheduler")
    scheduler = current_config()
    assert scheduler.source == "runtime_context"
    assert dataclasses.replace(scheduler, source="server_args") == launcher


def test_republishing_another_record_replaces_the_bag(loaded, model_dir, context, caplog):
    """SGLang's re-publish is last-publish-wins (a process that rebuilds an engine): so is the bag."""
    from sglang.srt.runtime_context import publish

    first = server_args(model_dir, BAG_CASES[0][0])
    second = server_args(model_dir, BAG_CASES[4][0])  # resolved before: its publish brings no new resolution
    reset_config()
    caplog.set_level(logging.WARNING, logger="sglang_detspec")
    publish(first, role="tokenizer")
    assert current_config().active and current_config().source == "runtime_context"
    publish(second, role="tokenizer")
    bag = current_config()
    assert bag.source == "runtime_context" and not bag.deterministic and not bag.active
    assert startup_lines(caplog)[-1] == f"sglang-detspec inactive (SGLang's own sampling runs): {bag.describe()}"


def test_a_role_that_may_not_read_the_bags_namespaces_keeps_its_bag(loaded, model_dir, context, monkeypatch):
    """Under SGLANG_ROLE_NAMESPACES=enforce the DP controller may not read "spec"; it runs no hooked site."""
    from sglang.srt import runtime_context

    sa = server_args(model_dir, BAG_CASES[0][0])
    reset_config()
    monkeypatch.setattr(runtime_context, "_ROLE_NS_MODE", "enforce")  # what the variable sets at import
    runtime_context.publish(sa, role="dp_controller")
    assert current_config().source == "env"
    with pytest.raises(LookupError, match="outside the declared set"):
        resolve.config_from_runtime_context()


# What a scheduler process does (scheduler.py, run_scheduler_process): its module is imported (to unpickle the
# entry point), load_plugins() applies the hooks, then the entry calls ``publish`` through the module's own
# ``from sglang.srt.runtime_context import publish`` binding with the record the launcher pickled.
SCHEDULER_ENTRY = """
import dataclasses, json, logging, pickle, sys
from sglang.srt.managers import scheduler
from sglang.srt import runtime_context
from sglang.srt.plugins import load_plugins
from sglang_detspec.config import current_config

lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger("sglang_detspec").addHandler(handler)
before = current_config().source
load_plugins()
with open(sys.argv[1], "rb") as f:
    record = pickle.load(f)
scheduler.publish(record, role="scheduler")
bag = current_config()
print(json.dumps({
    "before": before, "bag": dataclasses.asdict(bag), "active": bag.active, "coupled_drafts": bag.coupled_drafts,
    "lines": [line for line in lines if "DetSpecConfig(" in line],
    "rebound": scheduler.publish is runtime_context.publish and hasattr(scheduler.publish, "__wrapped__"),
}))
"""


def test_a_fresh_scheduler_process_gets_its_bag_when_it_publishes(loaded, model_dir, tmp_path):
    import pickle
    import subprocess

    flags = ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
             "--speculative-num-draft-tokens 4 --enable-deterministic-inference")
    sa = server_args(model_dir, flags)  # the launcher: coupled chain, sampled drafts declared on the record
    reset_config()
    (tmp_path / "record.pkl").write_bytes(pickle.dumps(sa))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DETSPEC_") and k != "SGLANG_PLUGINS"}
    done = subprocess.run([sys.executable, "-c", SCHEDULER_ENTRY, str(tmp_path / "record.pkl")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["before"] == "env" and got["rebound"]
    bag = got["bag"]
    assert bag["source"] == "runtime_context" and got["active"]
    # coupled verify kept although the declared rejection-sampling flag is on (auto would pick rejection)
    assert bag["verify"] == "coupled" and bag["rejection_sampling"] and got["coupled_drafts"]
    assert (bag["algorithm"], bag["num_steps"], bag["eagle_topk"], bag["num_draft_tokens"]) == ("EAGLE", 3, 1, 4)
    assert len(got["lines"]) == 1 and got["lines"][0].startswith("sglang-detspec active: DetSpecConfig(active=True")


# -- start-up validation through SGLang's real resolution ---------------------------


@pytest.mark.parametrize("flags, match", [
    (f"--speculative-algorithm EAGLE {DET}", "--speculative-num-steps, --speculative-eagle-topk, "
     "--speculative-num-draft-tokens not set: rejection mode verifies chains, so give all three"),
    (f"--speculative-algorithm EAGLE --speculative-eagle-topk 1 {DET}",
     "--speculative-num-steps, --speculative-num-draft-tokens not set"),
    (f"--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
     f"--speculative-num-draft-tokens 8 {DET}", "rejection mode verifies chains only: set --speculative-eagle-topk 1"),
    (f"--speculative-algorithm STANDALONE --speculative-num-steps 3 --speculative-eagle-topk 1 "
     f"--speculative-num-draft-tokens 4 {DET}", "--speculative-algorithm STANDALONE is not supported in rejection mode"),
    (f"--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
     f"--speculative-num-draft-tokens 4 --speculative-use-block-verification {DET}",
     "--speculative-use-block-verification is not supported"),
    (f"--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
     f"--speculative-num-draft-tokens 4 --rl-on-policy-target fsdp {DET}", "--rl-on-policy-target is not supported"),
])
def test_startup_refuses_what_it_cannot_make_deterministic(loaded, model_dir, flags, match):
    with pytest.raises(ValueError, match="sglang-detspec cannot make this run deterministic") as err:
        server_args(model_dir, flags)
    assert match in str(err.value)


def test_disable_setting_lets_sglang_decide(loaded, model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "1")
    flags = (f"--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
             f"--speculative-num-draft-tokens 4 --speculative-use-block-verification {DET}")
    bag = resolve.config_from_server_args(server_args(model_dir, flags))
    assert bag.disabled and not bag.active
    reset_config()


def test_refusals_only_for_our_runs():
    bad = dict(algorithm="NGRAM", eagle_topk=8, block_verification=True, rl_on_policy=True, verify="rejection")
    assert DetSpecConfig(deterministic=False, rejection_sampling=True, **bad).refusals() == []
    assert DetSpecConfig(deterministic=True, disabled=True, **bad).refusals() == []
    # algorithm, tree, rl-on-policy, block verification
    assert len(DetSpecConfig(deterministic=True, rejection_sampling=True, **bad).refusals()) == 4
    # Coupled mode serves NGRAM trees: only the two unsupported flags remain.
    coupled = DetSpecConfig(deterministic=True, rejection_sampling=True, **{**bad, "verify": "coupled"})
    assert len(coupled.refusals()) == 2
    assert ACTIVE.refusals() == []
    # The bag itself refuses to be active for what start-up would refuse.
    for field, value in bad.items():
        if field != "verify":
            assert not dataclasses.replace(ACTIVE, **{field: value}).active, field


# -- SGLang's own entry points, on CPU tensors ---------------------------------------


def draft_inputs(b=6, v=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, v, generator=gen) * 2
    temperatures = torch.rand(b, 1, generator=gen) + 0.5
    seeds = torch.randint(-(1 << 62), 1 << 62, (b,), generator=gen)
    positions = torch.randint(0, 1 << 20, (b,), generator=gen, dtype=torch.int32)
    return logits, temperatures, seeds, positions


def test_sglang_sample_draft_proposal_uses_the_draft_stream(loaded, bag):
    from sglang.srt.speculative import eagle_worker_v2, spec_utils

    bag(ACTIVE)
    logits, temps, seeds, pos = draft_inputs()
    for step in (0, 2):
        q, q_x, x = spec_utils.sample_draft_proposal(logits, temps, sampling_seed=seeds, positions=pos,
                                                     draft_step=step)
        assert torch.allclose(q, torch.softmax(logits / temps, dim=-1), atol=1e-6)
        assert torch.equal(x, exponential_race(q, seeds, pos, stream=Stream.DRAFT, draft_step=step))
        assert torch.equal(q_x, q.gather(1, x))
        # the EAGLE v2 prefill draft-extend binding is the same hook
        p2, x2 = eagle_worker_v2.fast_sample(q, 1, sampling_seed=seeds, positions=pos, draft_step=step)
        assert torch.equal(x2, x) and torch.equal(p2, q_x)


def test_greedy_rows_keep_sglang_argmax_rule(loaded, bag):
    from sglang.srt.speculative import spec_utils

    bag(ACTIVE)
    logits, temps, seeds, pos = draft_inputs()
    top_ks = torch.tensor([1, 0, 1, 50, 1, 1 << 30], dtype=torch.int32)
    q, _, x = spec_utils.sample_draft_proposal(logits, temps, top_ks, sampling_seed=seeds, positions=pos)
    greedy = top_ks <= 1
    assert torch.equal(x[greedy, 0], q.argmax(dim=-1)[greedy])
    seeded = exponential_race(q, seeds, pos, stream=Stream.DRAFT)[:, 0]
    assert torch.equal(x[~greedy, 0], seeded[~greedy])


def test_inactive_bag_runs_sglang_original(loaded, bag, monkeypatch):
    from sglang.srt.speculative import spec_utils

    bag(INACTIVE)
    logits, temps, seeds, pos = draft_inputs()
    probs = torch.softmax(logits, dim=-1)
    original = spec_utils.fast_sample.__wrapped__

    # SGLang's seeded branch on CPU needs sgl_kernel's CPU murmur op; whatever
    # it does here, the hooked function must do the same.
    def outcome(fn, **kw):
        try:
            return fn(probs, 1, **kw)
        except Exception as err:  # noqa: BLE001 - compare SGLang's own failure mode
            return type(err), str(err)

    seeded = dict(sampling_seed=seeds, positions=pos, draft_step=1)
    got, want = outcome(spec_utils.fast_sample, **seeded), outcome(original, **seeded)
    assert isinstance(want[0], type), "SGLang's seeded branch ran on CPU: compare tensors instead"
    assert got == want  # our wrapper delegated: same error from SGLang's own code
    # Unseeded: SGLang's multinomial path runs on CPU and is reproduced draw for draw.
    monkeypatch.setenv("SGLANG_OPT_USE_GUMBEL_SAMPLE", "0")
    torch.manual_seed(3)
    a = spec_utils.fast_sample(probs)
    torch.manual_seed(3)
    assert all(torch.equal(x, y) for x, y in zip(a, original(probs)))


def chain_inputs(b=5, k=3, v=64, seed=1):
    gen = torch.Generator().manual_seed(seed)
    w = k + 1
    q = torch.softmax(torch.randn(b, k, v, generator=gen), -1)
    p = torch.softmax(torch.randn(b, w, v, generator=gen), -1)
    p[:, :k] = 0.2 * p[:, :k] + 0.8 * q
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, k)
    root = torch.randint(0, v, (b, 1), generator=gen)
    candidates = torch.cat([root, drafts], dim=1)
    retrive_index = torch.arange(b * w).reshape(b, w)  # build_chain_tree's flat layout
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen)
    seq_lens = torch.randint(10, 1000, (b,), generator=gen)
    return candidates, retrive_index, q, p, seeds, seq_lens


def test_sglang_chain_sampler_entry_point_runs_verify_chain(loaded, bag):
    """SGLang's eagle_sample cannot reach its rejection-sampling branch on CPU
    (``_verify_uses_greedy`` is true on CPU), and the unhooked chain sampler is
    a Triton kernel; the hooked entry point itself runs here."""
    from sglang.srt.speculative import eagle_utils

    bag(ACTIVE)
    candidates, ri, q, p, seeds, seq_lens = chain_inputs()
    b, w = candidates.shape
    predicts = torch.zeros(b * w, dtype=torch.int32)
    accept_index = torch.full((b, w), -1, dtype=torch.int32)
    accept_num = torch.empty(b, dtype=torch.int32)
    with verify_hook.verify_context(VerifyContext(seeds, seq_lens + 1, None, None)):
        eagle_utils.chain_speculative_sampling_triton(
            predicts, accept_index, accept_num, candidates, ri, None, None,
            torch.rand(b, w - 1), torch.rand(b), p, q, 1.0, 1.0, True,
        )
    tokens, acc = verify_chain(candidates[:, 1:], q, p, seeds, seq_lens + 1)
    assert torch.equal(accept_num.long(), acc)
    assert acc.float().mean() > 0.5  # accepted drafts, residual and bonus all exercised
    for r in range(b):
        n = int(acc[r])
        assert predicts[r * w : r * w + n + 1].tolist() == tokens[r, : n + 1].tolist()
        assert (predicts[r * w + n + 1 : (r + 1) * w] == 0).all()  # untouched slots
        assert accept_index[r, : n + 1].tolist() == ri[r, : n + 1].tolist()
        assert (accept_index[r, n + 1 :] == -1).all()


def test_eagle_sample_hook_publishes_keys_only_while_active(loaded, bag):
    # A probe stands in for eagle_sample's body, which on CPU takes the greedy
    # path before any chain sampler runs (see the test above).
    seen = []

    def body(verify_input, batch, logits_output):
        seen.append(verify_hook.published())
        return "result"

    info = types.SimpleNamespace(sampling_seed=torch.tensor([5, 6]), has_watermark_candidates=False)
    batch = types.SimpleNamespace(sampling_info=info, seq_lens=torch.tensor([10, 20]))
    logits_output = object()
    bag(ACTIVE)
    assert verify_hook.seeded_eagle_sample(body, None, batch, logits_output) == "result"
    assert torch.equal(seen[-1].seeds, torch.tensor([5, 6]))
    assert torch.equal(seen[-1].positions, torch.tensor([11, 21]))  # the token after the root at seq_lens
    assert seen[-1].logits_output is logits_output and seen[-1].sampling_info is info
    assert verify_hook.published() is None
    bag(INACTIVE)
    verify_hook.seeded_eagle_sample(body, None, batch, logits_output)
    assert seen[-1] is None


def test_target_filter_matches_sglang_cut_in_token_id_order(loaded):
    from sglang.srt.layers import sampler

    from sglang_detspec.ops import id_ordered_filtered_probs

    gen = torch.Generator().manual_seed(4)
    b, v = 6, 50
    probs = torch.softmax(torch.randn(b, v, generator=gen) * 2, dim=-1)
    top_ks = torch.tensor([1, 5, 1 << 30, 1 << 30, 20, v], dtype=torch.int32)
    top_ps = torch.tensor([1.0, 1.0, 0.5, 1.0, 0.9, 1.0])
    ours = id_ordered_filtered_probs(probs, top_ks, top_ps)
    # SGLang's own sorted cut, unseeded, asked for its filtered weights.
    original = sampler.top_k_top_p_min_p_sampling_from_probs_torch.__wrapped__
    _, probs_sort, probs_idx, _ = original(probs, top_ks, top_ps, torch.zeros(b), False, None,
                                           torch.zeros(b, dtype=torch.int64), return_filtered_probs=True)
    sglang_cut = torch.zeros_like(probs).scatter_(1, probs_idx.long(), probs_sort)
    assert torch.equal(ours, sglang_cut)
    # Rows that asked for no truncation keep their probabilities bit for bit,
    # so they draw what SGLang's simple path draws.
    for r in (3, 5):
        assert torch.equal(ours[r], probs[r])
    assert int((ours[0] > 0).sum()) == 1 and int(ours[0].argmax()) == int(probs[0].argmax())
    # min-p after the top-k/top-p cut, as SGLang's unseeded path applies it.
    min_ps = torch.tensor([0.0, 0.3, 0.0, 0.0, 0.05, 0.0])
    _, probs_sort, probs_idx, _ = original(probs, top_ks, top_ps, min_ps, True, None,
                                           torch.zeros(b, dtype=torch.int64), return_filtered_probs=True)
    sglang_cut = torch.zeros_like(probs).scatter_(1, probs_idx.long(), probs_sort)
    ours = id_ordered_filtered_probs(probs, top_ks, top_ps, min_ps)
    assert torch.equal(ours, sglang_cut)
    assert torch.equal(ours[3], probs[3]) and not torch.equal(ours[1], probs[1])


def test_renorm_hooks_keep_rows_that_ask_for_no_truncation(loaded, bag):
    from sglang_detspec.sglang_plugin.probs_hook import (
        top_k_renorm_keep_neutral,
        top_p_renorm_keep_neutral,
    )

    # The renorm kernels are flashinfer's (CUDA only); a plain renormalisation
    # stands in for them to check what the hook keeps and what it passes on.
    def renorm(probs, param):
        return probs / probs.sum(dim=-1, keepdim=True) * 0.999

    probs = torch.softmax(torch.randn(4, 30), dim=-1)
    bag(ACTIVE)
    out = top_k_renorm_keep_neutral(renorm, probs, torch.tensor([1, 1 << 30, 30, 3]))
    assert torch.equal(out[1], probs[1]) and torch.equal(out[2], probs[2])
    assert torch.equal(out[0], renorm(probs, None)[0]) and torch.equal(out[3], renorm(probs, None)[3])
    out = top_p_renorm_keep_neutral(renorm, probs, torch.tensor([1.0, 0.5, 1.0, 0.9]))
    assert torch.equal(out[0], probs[0]) and torch.equal(out[1], renorm(probs, None)[1])
    bag(INACTIVE)
    assert torch.equal(top_k_renorm_keep_neutral(renorm, probs, torch.tensor([1 << 30] * 4)), renorm(probs, None))


def test_a_coupled_verify_computes_none_of_sglangs_target_probabilities(loaded, bag):
    """Inside a coupled verify the softmax, renorm and coins hooks hand back stand-ins and never call SGLang's op.

    The stand-ins have the shapes SGLang's eagle_sample goes on with (V wide
    with the rejection flag, whose check compares widths with the draft
    distributions; one column without it) and no memory per row. Outside a
    verify, and in rejection mode, SGLang's ops run.
    """
    from sglang.kernels.ops import sampling as sampling_ops

    from sglang_detspec.sglang_plugin import probs_hook

    def never(*args, **kwargs):
        raise AssertionError("SGLang's op ran inside a coupled verify")

    logits = torch.randn(6, 50)
    temps = torch.full((6, 1), 0.5)
    ctx = VerifyContext(torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), None, None)
    softmax = sampling_ops.softmax.__wrapped__
    chain = dataclasses.replace(ACTIVE, verify="coupled")  # start-up declares the rejection flag for chains
    tree = dataclasses.replace(chain, eagle_topk=4, num_draft_tokens=8, rejection_sampling=False)
    for config, width in ((chain, 50), (tree, 1)):
        bag(config)
        with verify_hook.verify_context(ctx):
            probs = probs_hook.skip_in_coupled_verify(never, logits, temperatures=temps)
            assert probs.shape == (6, width) and probs.stride() == (0, 0) and not probs.any()
            assert probs_hook.top_k_renorm_keep_neutral(never, probs, torch.full((6,), 5)) is probs
            assert probs_hook.top_p_renorm_keep_neutral(never, probs, torch.full((6,), 0.5)) is probs
            coins, final = probs_hook.skip_coins_in_coupled_verify(
                never, sampling_info=None, seq_lens=None, draft_token_num=3, candidates=torch.zeros(2, 3), device="cpu")
            assert coins.shape == (2, 3) and final.shape == (2,) and not coins.any() and not final.any()
        # Outside a verify (the sampler's and the drafts' softmax): SGLang's.
        assert torch.equal(probs_hook.skip_in_coupled_verify(softmax, logits, temps), softmax(logits, temps))
    bag(ACTIVE)  # rejection mode reads SGLang's probabilities
    with verify_hook.verify_context(ctx):
        assert torch.equal(probs_hook.skip_in_coupled_verify(softmax, logits, temps), torch.softmax(logits / temps, -1))


def test_renorm_hooks_ask_flashinfer_for_its_deterministic_mode(loaded, bag):
    """flashinfer's renorm sums a row with float atomics unless ``is_deterministic``; the hooks set it when active.

    The kernels run only on CUDA, so a function with flashinfer 0.7.2's signature
    (checked against the installed flashinfer below) records what it is passed;
    SGLang's lazy loader wraps it as on CUDA. Kernels without the flag (ROCm's
    Triton renorm) are called as SGLang calls them.
    """
    import inspect

    import flashinfer.sampling
    from sglang.utils import LazyImport

    from sglang_detspec.sglang_plugin.probs_hook import (
        top_k_renorm_keep_neutral,
        top_p_renorm_keep_neutral,
    )

    for name in ("top_k_renorm_probs", "top_p_renorm_probs"):
        parameters = inspect.signature(getattr(flashinfer.sampling, name)).parameters
        assert list(parameters)[2] == "is_deterministic" and parameters["is_deterministic"].default is False

    calls = []

    def flashinfer_like(probs, top, is_deterministic=False):
        calls.append(is_deterministic)
        return probs / probs.sum(dim=-1, keepdim=True)

    def without_the_flag(probs, top):
        calls.append(None)
        return probs

    module = types.ModuleType("detspec_test_renorm")
    module.renorm = flashinfer_like
    sys.modules[module.__name__] = module
    try:
        lazy = LazyImport(module.__name__, "renorm")
        probs = torch.softmax(torch.randn(3, 20), dim=-1)
        bag(ACTIVE)
        top_k_renorm_keep_neutral(lazy, probs, torch.tensor([5, 20, 3]))
        top_p_renorm_keep_neutral(flashinfer_like, probs, torch.tensor([0.5, 1.0, 0.9]))
        top_k_renorm_keep_neutral(flashinfer_like, probs, torch.tensor([5, 20, 3]), False)  # given positionally
        top_k_renorm_keep_neutral(without_the_flag, probs, torch.tensor([5, 20, 3]))
        assert calls == [True, True, False, None]
        calls.clear()
        bag(INACTIVE)
        top_k_renorm_keep_neutral(lazy, probs, torch.tensor([5, 20, 3]))
        top_p_renorm_keep_neutral(flashinfer_like, probs, torch.tensor([0.5, 1.0, 0.9]))
        assert calls == [False, False]  # SGLang's own call, untouched
    finally:
        del sys.modules[module.__name__]


def sglang_params(seed):
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=4, temperature=1.0, sampling_seed=seed)
    params.normalize(None)
    return params


@pytest.mark.parametrize("seed, match", [
    (-1, r"sampling_seed must be in \[0, 2\*\*64 - 1\].*got -1"),
    (-(2**63), r"sampling_seed must be in \[0, 2\*\*64 - 1\]"),
    (2**64, r"sampling_seed must be in \[0, 2\*\*64 - 1\].*got 18446744073709551616"),
    (1.5, r"sampling_seed must be an integer in \[0, 2\*\*64 - 1\], got float 1.5"),
    ("7", r"sampling_seed must be an integer.*got str '7'"),
    (True, r"sampling_seed must be an integer.*got bool True"),
])
def test_request_validation_refuses_seeds_outside_uint64(loaded, bag, seed, match):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=match):
        sglang_params(seed).verify(4096)  # SGLang's own method, hooked


@pytest.mark.parametrize("seed", [0, 7, 2**63 - 1, 2**63, 2**64 - 1])
def test_request_validation_carries_uint64_seeds_as_int64_bits(loaded, bag, seed):
    bag(ACTIVE)
    params = sglang_params(seed)
    params.verify(4096)
    # SGLang's seed tensor is int64; our ops read its bits as unsigned.
    carried = torch.tensor([params.sampling_seed], dtype=torch.int64)
    assert int(carried[0]) % 2**64 == seed


@pytest.mark.parametrize("seed, match", [
    ("18446744073709551616", r"^sampling_seed must be in \[0, 2\*\*64 - 1\].*got 1.8446744073709552e\+19 "
     r"\(beyond 64-bit integers.*\) \(schema check: invalid type"),
    ("-9223372036854775809", r"^sampling_seed must be in \[0, 2\*\*64 - 1\].*beyond 64-bit integers"),
    ("1.5", r"^sampling_seed must be an integer.*got float 1.5 \(schema check: invalid type: floating point `1.5`"),
    ('"7"', r"^sampling_seed must be an integer.*got str '7' \(schema check"),
    ("true", r"^sampling_seed must be an integer.*got bool True \(schema check"),
])
def test_schema_gate_refusals_name_sampling_seed(loaded, bag, seed, match):
    import orjson
    from sglang.srt.entrypoints import api_contract, http_server

    # Parsed as SGLang's server parses bodies (ORJSONRequest.json): orjson turns
    # integers beyond 64 bits into floats, which the schema gate then refuses.
    body = orjson.loads(f'{{"input_ids": [1, 2], "sampling_params": {{"sampling_seed": {seed}}}}}')
    bag(INACTIVE)
    plain = http_server.generate_contract_error(body)  # the binding /generate calls, hooked
    assert plain is not None and "sampling_seed" not in plain  # SGLang's own words
    bag(ACTIVE)
    import re

    assert re.search(match, http_server.generate_contract_error(body))
    assert re.search(r"\(error code: sampling_seed_[a-z_]+\)$", http_server.generate_contract_error(body))  # code last
    assert api_contract.generate_contract_error(body) == http_server.generate_contract_error(body)
    batch = {"input_ids": [[1], [2]], "sampling_params": [{"sampling_seed": 3}, body["sampling_params"]]}
    assert http_server.generate_contract_error(batch).startswith("sampling_params[1]: sampling_seed must be")


def test_float_seed_messages_tell_range_from_type():
    from sglang_detspec.sglang_plugin.request_rules import check_sampling_seed

    # orjson turns integers outside [-2**63, 2**64) into floats: those are range errors ...
    for seed in (2.0**64, 1e30, float("inf"), -(2.0**63), -1e19):
        with pytest.raises(ValueError, match=r"must be in \[0, 2\*\*64 - 1\].*beyond 64-bit integers"):
            check_sampling_seed(seed)
    # ... a float inside it was sent as a float: a type error.
    for seed in (9.3e18, 1e19, 5.0, -1.0, float("nan"), -0.0):
        with pytest.raises(ValueError, match=r"must be an integer in \[0, 2\*\*64 - 1\], got float"):
            check_sampling_seed(seed)


def test_schema_gate_verdicts_unchanged(loaded, bag):
    from sglang.srt.entrypoints import http_server

    bag(ACTIVE)
    # Admitted bodies stay admitted (the integer range check is verify's, after the gate).
    for seed in (0, 2**63, 2**64 - 1, -1, None):
        assert http_server.generate_contract_error({"input_ids": [1], "sampling_params": {"sampling_seed": seed}}) is None
    # A refusal that is not (only) about the seed keeps SGLang's message as is.
    for body in (
        {"input_ids": "x", "sampling_params": {"sampling_seed": 5}},
        {"input_ids": [1], "sampling_params": {"sampling_seed": 1.5, "temperature": "hot"}},
        {"input_ids": [[1], [2]], "sampling_params": [1, {"sampling_seed": 1.5}]},
    ):
        assert http_server.generate_contract_error(body) == http_server.generate_contract_error.__wrapped__(body)
    # Negative seeds pass the gate (the seed check in verify refuses them).
    body = {"input_ids": [1], "sampling_params": {"sampling_seed": -1, "temperature": "hot"}}
    assert "sampling_seed" not in http_server.generate_contract_error(body)


def test_request_validation_is_sglang_own_when_inactive(loaded, bag):
    bag(INACTIVE)
    params = sglang_params(-1)
    params.verify(4096)  # SGLang 0.5.23 admits negative seeds
    assert params.sampling_seed == -1
    with pytest.raises(ValueError, match=r"sampling_seed must be in \[-2\*\*63, 2\*\*63 - 1\]"):
        sglang_params(2**63).verify(4096)


def test_no_wired_site_reads_server_args_or_environment():
    # docs/design.md §5: only config.py reads the environment and only resolve.py reads SGLang's args.
    root = os.path.dirname(sglang_plugin.__file__)
    for name in ("draft_hook.py", "verify_hook.py", "topk_draft_hook.py", "target_sampler_hook.py", "attention_hook.py",
                 "probs_hook.py", "tree_attention_hook.py", "norm_hook.py", "positions.py"):
        text = open(os.path.join(root, name)).read()
        assert "os.environ" not in text and "server_args" not in text and "get_spec" not in text, name


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))


# -- KV rows: a tree's decode reserve fits the request-to-token row ------------------------------------

ROW_CASES = [
    # flags, SGLang's own headroom, the plugin's (2 * max(steps * topk, draft tokens) at page size 1)
    ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
     "--speculative-num-draft-tokens 8 --enable-deterministic-inference", 12, 24),
    ("--speculative-algorithm EAGLE --speculative-num-steps 5 --speculative-eagle-topk 8 "
     "--speculative-num-draft-tokens 16 --enable-deterministic-inference", 20, 80),
    ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
     "--speculative-num-draft-tokens 4 --enable-deterministic-inference", 8, 8),
    # SGLang's own tree (not deterministic): the plugin is inactive and leaves SGLang's number
    ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
     "--speculative-num-draft-tokens 8", 12, 12),
]


@pytest.mark.parametrize("flags, sglang_extra, extra", ROW_CASES)
def test_the_kv_row_holds_a_decode_steps_reserve(loaded, model_dir, context, flags, sglang_extra, extra):
    """The headroom SGLang's KV configurator reads (its own binding) holds one decode step's reserve."""
    from sglang.srt.mem_cache import allocation_sizing, kv_cache_configurator
    from sglang.srt.runtime_context import publish

    sa = server_args(model_dir, flags)
    publish(sa, role="test")
    original = allocation_sizing.get_req_to_token_extra_context_len
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    assert original() == sglang_extra  # SGLang 0.5.23's formula: 4 + draft tokens at page size 1
    assert kv_cache_configurator.get_req_to_token_extra_context_len() == extra
    assert extra >= allocation_sizing.get_alloc_reserve_per_decode() or not current_config().active


# -- draft shape by batch size: the published values a chain state is built under -----------------------


@pytest.mark.parametrize("graph_flags, bound, want", [
    ("", 16, "above"),  # SGLang's own capture sizes, cut to those above the bound
    ("--cuda-graph-bs-decode 1 2 4 8 16 24 32", 16, [24, 32]),
    ("--cuda-graph-bs-decode 1 2 4 8 16", 16, "disabled"),  # no size above the bound: the chain runs eagerly
    ("--disable-cuda-graph", 16, "disabled"),
    ("--cuda-graph-bs-decode 1 2 4 8 16 24 32", 0, [1, 2, 4, 8, 16, 24, 32]),  # a token bound: every size
])
def test_a_chain_state_is_built_under_sglangs_own_leaves(loaded, model_dir, context, graph_flags, bound, want):
    """The leaves the build overrides exist in SGLang's published context, take effect, and come back."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
    from sglang.srt.runtime_context import get_context, get_exec, get_spec, publish
    from sglang_detspec.sglang_plugin import shape_hook

    sa = server_args(model_dir, "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
                                f"--speculative-num-draft-tokens 8 --enable-deterministic-inference {graph_flags}")
    publish(sa, role="test")
    saved = shape_hook.published_shape()
    assert saved["speculative_eagle_topk"] == 4 and saved["speculative_num_draft_tokens"] == 8
    sizes = list(get_exec().graph.cuda_graph_config.decode.bs or [])
    get_context().override("test", **shape_hook.capture_overrides(4, bound))  # SGLang refuses a non-leaf name
    assert get_spec().speculative_eagle_topk == 1 and get_spec().speculative_num_draft_tokens == 4
    if want == "disabled":
        assert check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    else:
        # What SGLang's get_batch_sizes_to_capture reads.
        got = get_exec().graph.cuda_graph_config.decode.bs
        assert got == ([b for b in sizes if b > bound] if want == "above" else want) and got and min(got) > bound
        assert not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    get_context().override("test", **saved)
    assert shape_hook.published_shape() == saved
    assert list(get_exec().graph.cuda_graph_config.decode.bs or []) == sizes


@pytest.mark.parametrize("flags, max_running, words", [
    ("", 48, None),
    ("--pp-size 2", 48, "pipeline parallelism"),
    ("--tp-size 2 --dp-size 2 --enable-dp-attention", 48, "attention data parallelism"),
    ("", 16, "the bound 16 is not below --max-running-requests 16"),
])
def test_a_serving_process_keeps_its_tree_where_ranks_or_the_bound_forbid(loaded, model_dir, flags, max_running,
                                                                           words):
    from sglang_detspec.sglang_plugin import shape_rules

    sa = server_args(model_dir, "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
                                f"--speculative-num-draft-tokens 8 --enable-deterministic-inference {flags}")
    reason = shape_rules.not_applied_reason(sa, max_running, 16)
    assert reason is None if words is None else words in reason
    # A token bound gives the chain batches of any size: a batch bound above the scheduler's is then no reason,
    # the ranks still are.
    with_tokens = shape_rules.not_applied_reason(sa, max_running, 16, 8192)
    assert with_tokens is None if words is None or "bound" in words else words in with_tokens


@pytest.mark.parametrize("flags, bound, max_running, want", [
    ("", 16, 48, 16),  # the tree state serves batches up to the bound
    ("", 0, 48, 48),  # no switch: the tree at every batch size
    ("--pp-size 2", 16, 48, 48),  # not applied under pipeline parallelism
    ("", 64, 48, 48),  # a batch bound above the scheduler's, applied with a token bound: the scheduler's
])
def test_the_kv_move_is_warmed_for_the_batches_the_tree_verifies(loaded, model_dir, flags, bound, max_running,
                                                                  want):
    from sglang_detspec.sglang_plugin import warmup_hook

    sa = server_args(model_dir, "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
                                f"--speculative-num-draft-tokens 8 --enable-deterministic-inference {flags}")
    tree = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                         tree_chain_batch=bound, page_size=1, source="server_args")
    assert warmup_hook.tree_verify_batches(tree, sa, max_running) == want
    # A token bound sends long batches of any size to the chain but leaves the tree every size: same batches.
    long = dataclasses.replace(tree, tree_chain_tokens=8192)
    assert warmup_hook.tree_verify_batches(long, sa, max_running) == want
    assert warmup_hook.tree_verify_batches(dataclasses.replace(long, tree_chain_batch=0), sa, max_running) == max_running


def test_a_failed_chain_build_leaves_the_worker_and_the_published_context_as_they_were(loaded, model_dir, context,
                                                                                      monkeypatch):
    """SGLang's own worker classes, not initialised (their __init__ loads models): the build's first SGLang call
    fails on them, and the tree state and every published value must come back."""
    from sglang.srt.runtime_context import get_context, publish
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
    from sglang_detspec.sglang_plugin import shape_hook

    publish(server_args(model_dir, "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
                                   "--speculative-num-draft-tokens 8 --enable-deterministic-inference"), role="test")
    worker, draft = object.__new__(EAGLEWorkerV2), object.__new__(EagleDraftWorker)
    worker.topk, worker.speculative_num_steps, worker.speculative_num_draft_tokens = 4, 3, 8
    draft.topk, draft.speculative_num_steps, draft.speculative_num_draft_tokens = 4, 3, 8
    draft.draft_attn_backend, draft.cuda_graph_runner = "draft backend", "draft graph"
    draft.draft_extend_attn_backend, draft.cuda_graph_runner_for_draft_extend = "extend backend", "extend graph"
    draft.draft_runner = types.SimpleNamespace(attn_backend="extend backend", draft_attn_backend="draft backend")
    worker._draft_worker = draft
    worker._target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
        attn_backend="target backend", decode_cuda_graph_runner="verify graph"))
    tree, published = shape_hook.current_state(worker), shape_hook.published_shape()
    seen = {}
    original_override = type(get_context()).override

    def override(self, source, **fields):  # records what the build published before it failed
        seen.setdefault(source, fields)
        return original_override(self, source, **fields)

    monkeypatch.setattr(type(get_context()), "override", override)
    with pytest.raises(AttributeError):  # the draft worker has no model runner state
        shape_hook.build_chain_state(worker, 16)
    assert seen[shape_hook._CAPTURE_SOURCE]["speculative_eagle_topk"] == 1  # it failed after publishing the chain
    assert shape_hook._RESTORE_SOURCE in seen
    assert shape_hook.current_state(worker) == tree and shape_hook.published_shape() == published
    assert (worker.topk, draft.topk, draft.speculative_num_draft_tokens) == (4, 4, 8)
