"""FA3 tree verify as one decode query per node: the key lists, the routing, the setting and the claim.

SGLang's FA3 backend imports sgl_kernel's CUDA library at module level, so it
cannot be built on a CPU machine; the kernel-level bit-for-bit check (node
queries against decode calls) is ``test/registered/cuda/test_tree_attention_cuda.py``
and the server-level one ``test/registered/e2e/test_forward_modes.py``. Here:
the node key lists against an independent walk up each node's parents, in
SGLang's cascade layout, eager and into CUDA-graph buffers; the forward hook's
routing; the environment setting and the start-up claim.
"""

import dataclasses
import logging
import types

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from _interpreter import run_interpreted

from sglang_detspec.config import (
    TREE_ATTENTION_ENV,
    DetSpecConfig,
    env_settings,
    logits_guarantee,
)
from sglang_detspec.ops.node_rows import ancestor_layout, node_key_lists
from sglang_detspec.sglang_plugin import fa3_split_hook as fsh
from sglang_detspec.sglang_plugin import tree_attention_hook as tah
from sglang_detspec.sglang_plugin.channels import TREE_BUFFERS, TREE_NODES

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

# SGLang's EAGLE tree order (a parent before its children): node 0 is the root.
PARENTS = [-1, 0, 0, 0, 0, 1, 1, 2]
N = len(PARENTS)


def path(i):
    """Node i's ancestors, root first, itself last: walked up its parents."""
    out = []
    while i >= 0:
        out.append(i)
        i = PARENTS[i]
    return out[::-1]


def cascade_layout(prefix_lens, width, gen):
    """SGLang's two cascade metadata tables for a batch: prefix slots and each node's ancestor slots.

    Returns (prefix_table [bs, width], draft_slots [bs, N], ancestor_table [bs*N, N],
    ancestor_lens [bs*N]). Ancestor rows list slots of the mask's True columns in column
    order, then the other columns (SGLang sorts the masked-out columns after them).
    """
    bs = len(prefix_lens)
    slots = torch.randperm(bs * (width + N), generator=gen).to(torch.int32).view(bs, width + N)
    prefix_table, draft_slots = slots[:, :width].contiguous(), slots[:, width:].contiguous()
    rows, lens = [], []
    for b in range(bs):
        for i in range(N):
            on = path(i)
            off = [j for j in range(N) if j not in on]
            rows.append(draft_slots[b, on + off])
            lens.append(len(on))
    return prefix_table, draft_slots, torch.stack(rows), torch.tensor(lens, dtype=torch.int32)


def test_ancestor_layout_is_sglangs_sorted_mask_columns():
    rows, lens = ancestor_layout(PARENTS)
    for i in range(N):
        mask = [j in path(i) for j in range(N)]  # the tree mask's row of node i
        # SGLang: keys = col if masked in else col + N, sorted: kept columns in order, then the rest.
        want = sorted(range(N), key=lambda j: j if mask[j] else j + N)
        assert rows[i] == want and lens[i] == sum(mask)


def test_each_node_row_is_its_decode_page_table():
    gen = torch.Generator().manual_seed(3)
    prefix_lens = torch.tensor([1, 17, 40, 40], dtype=torch.int32)
    width = 40
    prefix_table, draft_slots, anc, anc_lens = cascade_layout(prefix_lens, width, gen)
    table, lens = node_key_lists(prefix_table, prefix_lens, anc, anc_lens, N)
    assert table.shape == (len(prefix_lens) * N, width + N) and table.dtype == lens.dtype == torch.int32
    for b, p in enumerate(prefix_lens.tolist()):
        for i in range(N):
            r = b * N + i
            # The decode step of node i's token reads the prefix, then the path to it, itself last.
            want = prefix_table[b, :p].tolist() + draft_slots[b, path(i)].tolist()
            assert int(lens[r]) == len(want)
            assert table[r, : len(want)].tolist() == want, (b, i)


INTERPRETED = """
import torch
from sglang_detspec.ops.node_rows import node_key_lists
from sglang_detspec.ops.node_rows_triton import node_rows_triton
gen = torch.Generator().manual_seed(0)
bs, n, w = 3, 8, 2100  # a prefix longer than one 1024-entry block; an empty one; one as wide as the table
prefix_lens = torch.tensor([0, 1500, 2100], dtype=torch.int32)
prefix = torch.randint(0, 1 << 20, (bs, w), generator=gen, dtype=torch.int32)
anc = torch.randint(0, 1 << 20, (bs * n, n), generator=gen, dtype=torch.int32)
anc_lens = torch.randint(1, n + 1, (bs * n,), generator=gen, dtype=torch.int32)
want, want_lens = node_key_lists(prefix, prefix_lens, anc, anc_lens, n, kernel="torch")
out = torch.full((bs * n + 2, w + n + 1), -1, dtype=torch.int32)
out_lens = torch.full((bs * n + 2,), -1, dtype=torch.int32)
table, lens = out[: bs * n, : w + n], out_lens[: bs * n]
node_rows_triton(prefix, prefix_lens, anc, anc_lens, n, table, lens)
assert torch.equal(lens, want_lens), (lens, want_lens)
for r in range(bs * n):
    k = int(lens[r])
    assert torch.equal(table[r, :k], want[r, :k]), r
    assert (out[r, k + n:] == -1).all(), r  # nothing written past the ancestors
assert (out[bs * n:] == -1).all() and (out_lens[bs * n:] == -1).all()
print("equal")
"""


def test_the_triton_row_builder_under_tritons_interpreter_equals_the_torch_one():
    """The Triton kernel's logic on CPU (``TRITON_INTERPRET=1``, in a child process so no other kernel is
    interpreted); the GPU suite runs it compiled."""
    pytest.importorskip("triton", reason="needs Triton (its interpreter runs the kernel on CPU)")
    done = run_interpreted(INTERPRETED, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("equal"), done.stderr[-2000:]


def test_graph_buffers_are_filled_in_place_and_rows_past_the_batch_kept():
    gen = torch.Generator().manual_seed(5)
    prefix_lens = torch.tensor([3, 9], dtype=torch.int32)
    prefix_table, _, anc, anc_lens = cascade_layout(prefix_lens, 12, gen)
    eager = node_key_lists(prefix_table, prefix_lens, anc, anc_lens, N)
    # Graph buffers sized for more requests and a longer context than this replay.
    out_table = torch.full((4 * N, 64 + N), -7, dtype=torch.int32)
    out_lens = torch.full((4 * N,), -7, dtype=torch.int32)
    padded = torch.nn.functional.pad(prefix_table, (0, 64 - 12), value=-3)  # stale columns past the prefix
    table, lens = node_key_lists(padded, prefix_lens, anc, anc_lens, N, out_table, out_lens)
    assert table.data_ptr() == out_table.data_ptr() and lens.data_ptr() == out_lens.data_ptr()
    for r in range(2 * N):
        n = int(lens[r])
        assert n == int(eager[1][r]) and table[r, :n].tolist() == eager[0][r, :n].tolist()
    assert (out_table[2 * N :] == -7).all() and (out_lens[2 * N :] == -7).all()


@dataclasses.dataclass
class Meta:
    """The FlashAttentionMetadata fields the node path reads and sets (SGLang's class needs CUDA to import)."""

    cache_seqlens_int32: torch.Tensor = None
    max_seq_len_q: int = 1
    max_seq_len_k: int = 0
    cu_seqlens_q: torch.Tensor = None
    cu_seqlens_k: torch.Tensor = None
    page_table: torch.Tensor = None
    scheduler_metadata: torch.Tensor = None
    local_attn_metadata: object = None
    swa_spec_metadata: object = None
    swa_out_cache_loc: torch.Tensor = None


def check_rows(meta, prefix_table, prefix_lens, draft_slots):
    """Every node row of ``meta`` against the walk up its parents."""
    bs = len(prefix_lens)
    assert meta.page_table.shape[0] == meta.cache_seqlens_int32.shape[0] == bs * N
    for b, p in enumerate(prefix_lens.tolist()):
        for i in range(N):
            want = prefix_table[b, :p].tolist() + draft_slots[b, path(i)].tolist()
            assert int(meta.cache_seqlens_int32[b * N + i]) == len(want)
            assert meta.page_table[b * N + i, : len(want)].tolist() == want, (b, i)


def test_node_metadata_is_one_query_per_node():
    gen = torch.Generator().manual_seed(8)
    prefix_lens = torch.tensor([5, 11, 2], dtype=torch.int32)
    prefix_table, draft_slots, anc, anc_lens = cascade_layout(prefix_lens, 11, gen)
    normal = Meta(cache_seqlens_int32=prefix_lens, page_table=prefix_table, max_seq_len_q=N,
                  scheduler_metadata=torch.zeros(3), swa_out_cache_loc="kept")
    expand = Meta(cache_seqlens_int32=anc_lens, page_table=anc)
    buffers = {"page_table": torch.zeros(5 * N, 20 + N, dtype=torch.int32),
               "cache_seqlens": torch.zeros(5 * N, dtype=torch.int32),
               "cu_seqlens_q": torch.arange(5 * N + 1, dtype=torch.int32),
               "cu_seqlens_k": torch.zeros(5 * N + 1, dtype=torch.int32)}
    for into in (None, buffers):
        if into is not None:
            normal.page_table = torch.nn.functional.pad(prefix_table, (0, 20 - 11))  # a graph buffer's width
        meta = tah.node_metadata(normal, expand, N, into, kernel="torch")
        rows = 3 * N
        check_rows(meta, prefix_table, prefix_lens, draft_slots)
        assert meta.max_seq_len_q == 1 and meta.scheduler_metadata is None and meta.swa_out_cache_loc == "kept"
        assert meta.cu_seqlens_q.tolist() == list(range(rows + 1))
        assert meta.cu_seqlens_k.tolist() == [0, *torch.cumsum(meta.cache_seqlens_int32, 0).tolist()]
        assert meta.max_seq_len_k == normal.page_table.shape[1] + N
        if into is not None:  # views of the graph buffers, so a captured kernel reads what a replay writes
            for name, field in (("page_table", "page_table"), ("cache_seqlens", "cache_seqlens_int32"),
                                ("cu_seqlens_q", "cu_seqlens_q"), ("cu_seqlens_k", "cu_seqlens_k")):
                assert getattr(meta, field).data_ptr() == into[name].data_ptr(), name


def fa3_backend(**overrides):
    """A stand-in with the FlashAttentionBackend attributes the hooks read (the class needs CUDA to import)."""
    fields = dict(fa_impl_ver=3, use_mla=False, page_size=1, has_swa=False, local_attn_builder=None,
                  kv_cache_dtype_str="auto", attn_cp_size=1, fa_skip_kv_cache=False, is_draft_runner=False, topk=4,
                  speculative_num_draft_tokens=N, device="cpu", max_context_len=40)
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


NODES_BAG = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                          attention_backend="fa3", tree_attention="nodes", decode_attention="one_pass", source="server_args", kernel="torch")


@pytest.mark.parametrize("overrides, why", [
    ({}, None),
    ({"fa_impl_ver": 4}, "FA4"),
    ({"use_mla": True}, "MLA"),
    ({"page_size": 64}, "page size 64"),
    ({"has_swa": True}, "sliding-window"),
    ({"kv_cache_dtype_str": "fp8_e4m3"}, "fp8_e4m3 KV cache"),
    ({"attn_cp_size": 2}, "context parallelism"),
    ({"local_attn_builder": object()}, "local attention"),
    ({"fa_skip_kv_cache": True}, "skips the KV cache"),
])
def test_the_backend_check_logs_why_a_tree_keeps_the_cascade(bag, caplog, overrides, why):
    bag(NODES_BAG)
    backend = fa3_backend(**overrides)
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        tah.check_backend(None, backend)
    assert tah._serves(backend) is (why is None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if why is None:
        assert not warnings
    else:
        assert len(warnings) == 1 and why in warnings[0] and "'tokens', not 'bitwise'" in warnings[0]


def test_the_backend_check_leaves_other_servers_alone(bag, caplog):
    for config, backend in ((dataclasses.replace(NODES_BAG, tree_attention="cascade"), fa3_backend()),
                            (NODES_BAG, fa3_backend(is_draft_runner=True)),
                            (NODES_BAG, fa3_backend(topk=1)),
                            (dataclasses.replace(NODES_BAG, deterministic=False), fa3_backend(use_mla=True))):
        bag(config)
        with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
            tah.check_backend(None, backend)
        assert not tah._serves(backend) and not caplog.records


def verify_batch(target_verify=True):
    return types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_target_verify=lambda: target_verify))


def test_graph_capture_and_replay_fill_the_same_buffers(bag):
    bag(NODES_BAG)
    backend = fa3_backend()
    tah.check_backend(None, backend)
    tah.allocate_graph_buffers(None, backend, 4, 4 * N)
    buffers = TREE_BUFFERS.read(backend)
    assert buffers["page_table"].shape == (4 * N, 40 + N) and buffers["cache_seqlens"].shape == (4 * N,)
    gen = torch.Generator().manual_seed(2)
    # SGLang's graph metadata for a padded batch of 3: views of its [max_bs, context] buffers.
    sglang_table = torch.zeros(4, 40, dtype=torch.int32)
    sglang_lens = torch.zeros(4, dtype=torch.int32)
    for step, lens in enumerate(([0, 0, 0], [7, 1, 33], [40, 2, 9])):  # capture (zeros), then two replays
        prefix_lens = torch.tensor(lens, dtype=torch.int32)
        prefix_table, draft_slots, anc, anc_lens = cascade_layout(prefix_lens, 40, gen)
        sglang_table[:3].copy_(prefix_table)
        sglang_lens[:3].copy_(prefix_lens)
        backend.forward_metadata = Meta(cache_seqlens_int32=sglang_lens[:3], page_table=sglang_table[:3])
        backend.forward_metadata_spec_decode_expand = Meta(cache_seqlens_int32=anc_lens, page_table=anc)
        tah.build_after_graph_metadata(None, backend, verify_batch(), in_capture=step == 0)
        meta = TREE_NODES.read(backend)
        if step == 0:
            captured = meta
        assert meta is captured  # the object the captured kernels read, refilled in place
        check_rows(meta, prefix_table, prefix_lens, draft_slots)
    tah.build_after_graph_metadata(None, backend, verify_batch(False))  # a decode graph: no node metadata
    assert TREE_NODES.read(backend) is None


def test_eager_metadata_is_built_per_verify_and_cleared_otherwise(bag):
    bag(NODES_BAG)
    backend = fa3_backend()
    tah.check_backend(None, backend)
    gen = torch.Generator().manual_seed(4)
    prefix_lens = torch.tensor([3, 12], dtype=torch.int32)
    prefix_table, draft_slots, anc, anc_lens = cascade_layout(prefix_lens, 12, gen)
    backend.forward_metadata = Meta(cache_seqlens_int32=prefix_lens, page_table=prefix_table)
    backend.forward_metadata_spec_decode_expand = Meta(cache_seqlens_int32=anc_lens, page_table=anc)
    tah.build_after_eager_metadata(None, backend, verify_batch())
    check_rows(TREE_NODES.read(backend), prefix_table, prefix_lens, draft_slots)
    tah.build_after_eager_metadata(None, backend, verify_batch(False))
    assert TREE_NODES.read(backend) is None
    bag(dataclasses.replace(NODES_BAG, tree_attention="cascade"))
    tah.build_after_eager_metadata(None, backend, verify_batch())
    assert TREE_NODES.read(backend) is None


def test_forward_extend_hook_routes_only_a_tree_verify_with_node_metadata():
    """The routing, with a stand-in backend (SGLang's FA3 backend needs CUDA to import)."""
    seen = []

    class Backend:
        forward_metadata = "cascade prefix metadata"
        topk = 4

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            seen.append(("decode", self.forward_metadata, self.topk, save_kv_cache, kwargs))
            if kwargs.get("sinks") == "boom":
                raise RuntimeError("boom")
            return "decoded"

    def original(backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
        seen.append(("extend", backend.forward_metadata, backend.topk))
        return "extended"

    layer = types.SimpleNamespace(sliding_window_size=-1, is_cross_attention=False)
    algo = types.SimpleNamespace(is_uno=lambda: False)
    verify = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_target_verify=lambda: True),
                                   spec_algorithm=algo, encoder_lens=None)
    extend = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_target_verify=lambda: False),
                                   spec_algorithm=algo, encoder_lens=None)
    backend = Backend()
    assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, verify) == "extended"  # no node metadata
    TREE_NODES.write(backend, "node metadata")
    assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, verify, True, sinks=None) == "decoded"
    assert seen[-1] == ("decode", "node metadata", 1, True, {"sinks": None})
    assert (backend.forward_metadata, backend.topk) == ("cascade prefix metadata", 4)  # restored
    with pytest.raises(RuntimeError, match="boom"):
        tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, verify, sinks="boom")
    assert (backend.forward_metadata, backend.topk) == ("cascade prefix metadata", 4)  # restored on error too
    assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, extend) == "extended"
    for covered_not in (types.SimpleNamespace(sliding_window_size=512, is_cross_attention=False),
                        types.SimpleNamespace(sliding_window_size=-1, is_cross_attention=True)):
        assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, covered_not, verify) == "extended"
    assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, verify, return_lse=True) == "extended"
    for name in ("q_rope", "k_rope", "score_mod", "rel_bias"):
        assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, verify, **{name: "x"}) == "extended"
    assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, verify, True, "positional") == "extended"
    for other in (dict(encoder_lens="lens"), dict(spec_algorithm=types.SimpleNamespace(is_uno=lambda: True))):
        batch = types.SimpleNamespace(**{**vars(verify), **other})
        assert tah.verify_tree_as_decode(original, backend, 1, 2, 3, layer, batch) == "extended"
    assert seen[-1][0] == "extend" and sum(1 for x in seen if x[0] == "decode") == 2


def test_the_setting_and_the_claim():
    assert env_settings({})["tree_attention"] == "cascade"
    assert env_settings({TREE_ATTENTION_ENV: " Nodes "})["tree_attention"] == "nodes"
    with pytest.raises(ValueError, match=rf"{TREE_ATTENTION_ENV} must be one of cascade or nodes, got 'tiles'"):
        env_settings({TREE_ATTENTION_ENV: "tiles"})
    # Without the split (the default, under which every tree is bitwise and the node path stands down).
    assert logits_guarantee("fa3", 4, "nodes", "one_pass") == "bitwise"
    assert logits_guarantee("fa3", 4, "cascade", "one_pass") == "tokens"
    assert logits_guarantee("triton", 4, "nodes", "one_pass") == "tokens"  # the node path is FA3's
    assert logits_guarantee("fa3", 1, "cascade", "one_pass") == "bitwise"
    assert logits_guarantee("fa3", 4, "cascade") == logits_guarantee("fa3", 4, "nodes") == "bitwise"
    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                        attention_backend="fa3", tree_attention="nodes", decode_attention="one_pass", source="server_args")
    assert bag.logits == "bitwise" and "tree_attention='nodes'" in bag.describe()


def test_a_bitwise_tree_claim_requires_the_node_hooks(monkeypatch):
    """Where the bag claims bitwise trees through the node path, its FA3 hooks are required at start-up.

    On a CPU-only SGLang build the FA3 backend does not import, so start-up
    would name them instead of logging a claim nothing backs.
    """
    import dataclasses

    from sglang_detspec import sglang_plugin

    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                        attention_backend="fa3", tree_attention="nodes", decode_attention="one_pass", source="server_args")
    node_rows = {row.target for row in sglang_plugin.registry_rows() if row.hook.__module__ == tah.__name__}
    chain = dataclasses.replace(bag, eagle_topk=1)
    monkeypatch.setattr(sglang_plugin, "_fa3_backend_imports", lambda: True)
    assert len(node_rows) == 5 and sglang_plugin.required_by(bag) == node_rows
    assert sglang_plugin.required_by(chain) == set()  # a chain does not go through the node path
    # A head size whose FA3 decode parts from its prefill claims tokens by the head-size rule, and still runs it.
    small = dataclasses.replace(bag, head_dim=64)
    assert small.logits == "tokens" and sglang_plugin.required_by(small) == node_rows
    for other in (dataclasses.replace(bag, tree_attention="cascade"), dataclasses.replace(bag, attention_backend="triton")):
        assert sglang_plugin.required_by(other) == set()
    # Under the split (the default) the node path asked for is its fallback: both sets of hooks are required.
    split_rows = {row.target for row in sglang_plugin.registry_rows() if row.hook.__module__ == fsh.__name__}
    split_nodes = dataclasses.replace(bag, decode_attention="split")
    assert split_rows and sglang_plugin.required_by(split_nodes) == node_rows | split_rows
    assert sglang_plugin.required_by(dataclasses.replace(split_nodes, tree_attention="cascade")) == split_rows
    # ... and on nothing where it does not (no FA3 server can start there); the node path asked for still is,
    # the node path of the FA3 tree default (not set in the environment) is not.
    monkeypatch.setattr(sglang_plugin, "_fa3_backend_imports", lambda: False)
    asked = dataclasses.replace(bag, set_tree_settings=("tree_attention",))
    assert sglang_plugin.required_by(asked) == node_rows and sglang_plugin.required_by(chain) == set()
    assert sglang_plugin.required_by(bag) == set()
    bag = asked
    monkeypatch.undo()
    if not torch.cuda.is_available():
        assert not sglang_plugin._fa3_backend_imports()  # the FA3 backend does not import without CUDA
        problems = sglang_plugin.hook_problems(applied=False, config=bag)
        assert sorted(problems) == sorted(f"{t} is not found in SGLang 0.5.23" for t in node_rows)
        assert sglang_plugin.hook_problems(applied=False, config=dataclasses.replace(bag, tree_attention="cascade")) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU-only SGLang build, where FA3 does not import")
def test_start_up_stops_where_nothing_backs_a_bitwise_tree_claim(bag):
    """SGLang's start-up hook (``check_hooks_in_place``) names the missing FA3 hooks for a nodes bag, not for others."""
    from sglang_detspec import sglang_plugin

    nodes = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                          attention_backend="fa3", tree_attention="nodes", decode_attention="one_pass", source="server_args",
                          set_tree_settings=("tree_attention", "decode_attention"))

    def message(config):
        bag(config)
        try:
            sglang_plugin.check_hooks_in_place(None, None)
        except RuntimeError as err:
            return str(err)
        return ""

    assert f"{tah.FORWARD_EXTEND} is not found in SGLang 0.5.23" in message(nodes)
    assert tah.FA not in message(dataclasses.replace(nodes, tree_attention="cascade"))


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
