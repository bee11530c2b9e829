"""`detspec serve`: the command it runs, read by SGLang's own parser; its start-up check; its help and usage errors."""

import argparse
import json
import re
import shlex
import sys

import pytest
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.cli import dry_run as dry_report, messages, serve
from sglang_detspec.cli.main import main
from sglang_detspec.sglang_plugin import startup

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

DETERMINISTIC = serve.DETERMINISTIC
REJECTION = "--speculative-use-rejection-sampling"
CHAIN = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]


@pytest.fixture(autouse=True)
def plain_env(monkeypatch):
    # The outcome of the start-up check depends on these; each test sets what it needs.
    for name in ("SGLANG_PLUGINS", "SGLANG_DETSPEC_DISABLE", "SGLANG_DETSPEC_KERNEL", "SGLANG_DETSPEC_VERIFY"):
        monkeypatch.delenv(name, raising=False)


def sglang_parse(args):
    """``args`` parsed by a fresh copy of SGLang's launch_server parser (as prepare_server_args builds it)."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(args)


def dry_run(capsys, args):
    """``(exit status, stdout, stderr)`` of ``detspec serve --dry-run -- args``."""
    rc = main(["serve", "--dry-run", "--verbose", "--", *args])
    out, err = capsys.readouterr()
    return rc, out, err


# -- the command ---------------------------------------------------------------------------

CASES = [
    ["--speculative-algorithm", "EAGLE", *CHAIN],
    ["--speculative-algo", "EAGLE", *CHAIN],
    ["--speculative-al=EAGLE", *CHAIN, "--enable-det"],
    ["--speculative-algo", "EAGLE", *CHAIN, "--enable-deterministic", "--speculative-use-rej"],
    ["--enable-deterministic-inference"],
    ["--speculative-use-rejection-sampling"],
    [],
]


class _Terminal:
    """A stderr that says it is a terminal, as a user's shell is."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_messages_wrap_to_a_terminal_and_stay_one_line_elsewhere(capsys, monkeypatch):
    message = "note: " + " ".join(f"word{i}" for i in range(60)) + "\n  - a listed refusal"
    messages.say(message)
    assert capsys.readouterr().err == f"detspec: {message}\n"
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("COLUMNS", "60")
    messages.say(message)
    lines = terminal.text.splitlines()
    assert len(lines) > 3 and all(len(line) <= 59 for line in lines)
    assert all(line.startswith("    ") for line in lines[1:-1]) and lines[-1] == "  - a listed refusal"
    assert " ".join(line.strip() for line in lines[:-1]) == f"detspec: {message.splitlines()[0]}"


@pytest.mark.parametrize("extra", CASES, ids=lambda a: " ".join(a) or "none")
def test_command_turns_on_deterministic_inference_once(extra):
    args = ["--model-path", "m", *extra]
    cmd = serve.server_command(args, python="py")
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"] and cmd[3 : 3 + len(args)] == args
    before, after = sglang_parse(args), sglang_parse(cmd[3:])
    added = cmd[3 + len(args) :]
    assert after.enable_deterministic_inference
    assert added == ([] if before.enable_deterministic_inference else [DETERMINISTIC])
    # The verify mode is the user's (or SGLANG_DETSPEC_VERIFY's) to pick: rejection sampling is never added.
    assert after.speculative_use_rejection_sampling == before.speculative_use_rejection_sampling


def test_deterministic_flag_from_a_config_file_counts(tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text("model-path: m\nenable-deterministic-inference: true\n")
    assert serve.server_command(["--config", str(config)], python="py")[3:] == ["--config", str(config)]


@pytest.mark.parametrize("args, words", [
    (["--model-path", "m", "--speculative-a", "EAGLE"], "ambiguous option: --speculative-a"),
    (["--speculative-algorithm", "EAGLE"], "--model-path"),
    (["--model-path", "m", "--", "--extra"], "unrecognized arguments"),
    (["--model-path", "m", "--speculative-eagle-topk", "one"], "invalid int value"),
], ids=["ambiguous", "no-model", "bare-dashes", "bad-value"])
def test_arguments_sglang_refuses_stop_serve(capsys, args, words):
    with pytest.raises(SystemExit):
        sglang_parse(args)  # SGLang itself refuses them
    capsys.readouterr()
    rc, out, err = dry_run(capsys, args)
    assert rc == 2 and out == ""
    assert "detspec: error: SGLang's launch_server refuses these arguments:" in err and words in err


@pytest.mark.parametrize("args, words", [
    (["--model-path", "m", "--verbose"], "--verbose is detspec serve's own: put it before '--'"),
    (["--verbose", "--", "--model-path", "m"], "--verbose is detspec serve's own"),
    (["--model-path", "m", "--dry-run", "--verbose"], "--dry-run and --verbose are detspec serve's own: put them"),
])
def test_serves_own_flag_after_the_dashes_is_pointed_back_before_them(capsys, args, words):
    rc, out, err = dry_run(capsys, args)
    assert rc == 2 and out == ""
    assert words in err


def test_a_serve_flag_before_the_command_is_pointed_after_it(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--dry-run", "serve", "--", "--model-path", "m"])
    assert exc.value.code == 2
    assert "--dry-run is serve's: put it after 'serve' (detspec serve --dry-run ...)" in capsys.readouterr().err
    # A flag serve does not have gets serve's own hint, not the advice to move it.
    with pytest.raises(SystemExit):
        main(["--bogus", "serve", "--", "--model-path", "m"])
    err = capsys.readouterr().err
    assert "after 'serve'" not in err and "unrecognized arguments: --bogus" in err


def test_dry_run_prints_the_completed_command(capsys):
    rc, out, _ = dry_run(capsys, ["--model-path", "m", "--speculative-algo", "EAGLE", *CHAIN])
    assert rc == 0
    words = shlex.split(out)
    assert words[0] == sys.executable
    assert words[1:] == ["-m", "sglang.launch_server", "--model-path", "m", "--speculative-algo", "EAGLE", *CHAIN,
                         DETERMINISTIC]


def test_dry_run_shows_the_settings_it_checked_and_the_start_up_state(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_VERIFY", "coupled")
    monkeypatch.setenv("SGLANG_DETSPEC_TREE_ATTENTION", "nodes")
    rc, out, err = dry_run(capsys, ["--model-path", "m", "--speculative-algo", "EAGLE", *CHAIN,
                                    "--attention-backend", "triton"])
    assert rc == 0
    # The printed command carries the settings the check read, so running it checks the same server.
    words = shlex.split(out)
    assert words[:2] == ["SGLANG_DETSPEC_TREE_ATTENTION=nodes", "SGLANG_DETSPEC_VERIFY=coupled"]
    # A coupled EAGLE chain: start-up turns SGLang's sampled-draft path on, and the dry run says so.
    assert "rejection_sampling=True" in err and "sampled-draft path on" in err
    # The node path asked for on Triton attention is named, not silently ignored.
    assert "SGLANG_DETSPEC_TREE_ATTENTION=nodes applies to the FA3 backend only" in err


@pytest.mark.parametrize("extra, blocker", [
    (["--speculative-token-map", "hot.pt"], "reduced vocabulary"),
    (["--enable-watermark"], "--enable-watermark"),
], ids=["token-map", "watermark"])
def test_a_chain_whose_sampled_drafts_sglang_refuses_keeps_the_plugins_draft_hooks(capsys, extra, blocker):
    """Where SGLang refuses its sampled-draft flag, start-up does not turn it on: the dry run must not either."""
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algo", "EAGLE", *CHAIN,
                                  "--attention-backend", "triton", *extra])
    assert rc == 0
    line = start_up_line(err)
    assert "active=True" in line and "rejection_sampling=False" in line and "verify='coupled'" in line
    assert "sampled-draft path is not available" in err and blocker in err
    assert "sampled-draft path on" not in err


@pytest.mark.parametrize("local_target", [False, True], ids=["flags-as-typed", "sglang-resolution"])
def test_an_eagle3_chain_over_hot_tokens_stays_active_and_coupled(capsys, tmp_path, local_target):
    """EAGLE3 drafts over a reduced vocabulary (``draft_vocab_size``): the plugin's draft hooks draw the chain.

    With a local target SGLang's resolution runs here and start-up's own check reads it; without, the flags."""
    draft = tmp_path / "eagle3"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                                                   "vocab_size": 1024, "draft_vocab_size": 256}))
    target = "m"
    if local_target:
        target = write_llama(tmp_path / "target")
    rc, _, err = dry_run(capsys, ["--model-path", target, "--speculative-algorithm", "EAGLE3", *CHAIN,
                                  "--speculative-draft-model-path", str(draft), "--attention-backend", "triton"])
    assert rc == 0
    line = start_up_line(err)
    assert "active=True" in line and "rejection_sampling=False" in line and "reduced_draft_vocab=True" in line
    assert "sampled-draft path is not available" in err and "sampled-draft path on" not in err


def test_plugin_is_admitted_by_sglangs_loader(capsys, monkeypatch):
    assert serve.plugin_installed()
    assert "SGLANG_PLUGINS" not in serve.server_env({})  # unset: SGLang loads every installed plugin
    assert serve.server_env({"SGLANG_PLUGINS": "a"})["SGLANG_PLUGINS"] == "a,detspec"
    assert serve.server_env({"SGLANG_PLUGINS": " a, detspec"})["SGLANG_PLUGINS"] == " a, detspec"
    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    rc, out, _ = dry_run(capsys, ["--model-path", "m"])
    assert rc == 0 and out.startswith("SGLANG_PLUGINS=other,detspec ")


# -- the start-up check: the server's own, before anything starts --------------------------

CHECK_CASES = {
    "chain": (["--speculative-algorithm", "EAGLE", *CHAIN], {}),
    "chain-rejection": (["--speculative-algorithm", "EAGLE", *CHAIN, REJECTION], {}),
    "chain-rejection-coupled": (["--speculative-algorithm", "EAGLE", *CHAIN, REJECTION],
                                {"SGLANG_DETSPEC_VERIFY": "coupled"}),
    "tree": (["--speculative-algorithm", "EAGLE", *TREE], {}),
    "tree-rejection": (["--speculative-algorithm", "EAGLE", *TREE, REJECTION], {}),
    "tree-rejection-abbreviated": (["--speculative-algo", "nextn", "--speculative-num-st", "3",
                                    "--speculative-eagle-top", "4", "--speculative-num-dr", "8",
                                    "--speculative-use-rej"], {}),
    "missing-chain-flags-rejection": (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1",
                                       REJECTION], {}),
    "block-verification": (["--speculative-algorithm", "EAGLE", *CHAIN, REJECTION,
                            "--speculative-use-block-verification"], {}),
    "rl-on-policy": (["--speculative-algorithm", "EAGLE", *CHAIN, REJECTION, "--rl-on-policy-target", "fsdp"], {}),
    "ngram-rejection": (["--speculative-algorithm", "NGRAM", *CHAIN, REJECTION], {}),
    "no-speculation": ([], {}),
    "disabled-tree-rejection": (["--speculative-algorithm", "EAGLE", *TREE, REJECTION],
                                {"SGLANG_DETSPEC_DISABLE": "1"}),
}


def server_refusal(cmd):
    """The problems the server's BEFORE hook raises for ``cmd`` on a real ServerArgs record; None if it starts."""
    try:
        startup.check_raw_flags(ServerArgs.from_cli_args(sglang_parse(cmd[3:])))
    except ValueError as exc:
        return str(exc).split("\n  - ")[1:]
    return None


@pytest.mark.parametrize("name", CHECK_CASES)
def test_dry_run_refuses_exactly_what_the_server_refuses(capsys, monkeypatch, name):
    args, env = CHECK_CASES[name]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = ["--model-path", "m", *args]
    refusal = server_refusal(serve.server_command(args))
    rc, out, err = dry_run(capsys, args)
    if refusal is None:
        assert rc == 0 and "sglang.launch_server" in out, err
    else:
        assert rc == 2 and out == "" and "this server would stop at start-up" in err
        assert all(problem in err for problem in refusal), (refusal, err)


# -- SGLang's own refusal of attention backends under deterministic inference ----------------

def sglang_admits_backend(backend):
    """Whether SGLang's own deterministic-inference check admits ``--attention-backend backend``.

    SGLang runs it in its resolution pipeline (handle_deterministic_inference), before the plugin's hook.
    """
    from sglang.srt.arg_groups.overrides import _deterministic_attention_backend, resolved_view

    record = ServerArgs.from_cli_args(sglang_parse(["--model-path", "m", "--attention-backend", backend, DETERMINISTIC]))
    try:
        _deterministic_attention_backend(resolved_view(record))
    except ValueError:
        return False
    return True


ATTENTION_BACKENDS = serve.sglang_parser()._option_string_actions["--attention-backend"].choices


@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
def test_the_check_refuses_exactly_the_attention_backends_sglang_refuses(backend):
    _, problems = serve.startup_check(["--model-path", "m", "--attention-backend", backend, DETERMINISTIC], {},
                                      check_hooks=False)
    refused = [p for p in problems if p.code == "attention_backend"]
    assert bool(refused) == (not sglang_admits_backend(backend)), problems


def test_sglang_refuses_some_backends_the_check_is_tested_on():
    # The parametrized test above compares both ways; it needs backends on either side of SGLang's rule.
    admitted = [b for b in ATTENTION_BACKENDS if sglang_admits_backend(b)]
    assert "trtllm_mha" not in admitted and "torch_native" not in admitted and "fa3" in admitted


@pytest.mark.parametrize("backend", ["trtllm_mha", "torch_native"])
@pytest.mark.parametrize("disabled", [False, True], ids=["plugin-on", "plugin-disabled"])
def test_dry_run_stops_on_an_attention_backend_sglang_refuses(capsys, monkeypatch, backend, disabled):
    from sglang.srt.server_args import DETERMINISTIC_ATTENTION_BACKEND_CHOICES

    if disabled:  # SGLang refuses the backend whether or not the plugin runs
        monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "1")
    rc, out, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                    "--attention-backend", backend])
    assert rc == 2 and out == "" and "flags check passed" not in err
    assert f"--attention-backend {backend} is refused by SGLang under {DETERMINISTIC}" in err
    assert f"it admits only {', '.join(DETERMINISTIC_ATTENTION_BACKEND_CHOICES)}" in err
    assert "[refusal: attention_backend]" in err


def start_up_line(err):
    """The bag the dry run printed: the text after 'flags check passed (...): '."""
    return next(line for line in err.splitlines() if "flags check passed" in line).split(": ", 2)[2]


def test_fa4_passes_with_a_not_measured_note_and_without_the_triton_setting(capsys):
    rc, out, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                    "--attention-backend", "fa4"])
    assert rc == 0 and "sglang.launch_server" in out
    assert "note: attention backend fa4: not measured" in err
    line = start_up_line(err)
    assert "attention_backend='fa4'" in line and "logits='tokens'" in line
    # The decode setting changes Triton's decode only; FA4 trees keep SGLang's cascade.
    assert "decode_attention=" not in line and "tree_attention=" not in line
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "triton"])
    assert rc == 0 and "note: attention backend" not in err and "decode_attention='split'" in start_up_line(err)


def test_ngram_dry_run_shows_its_bfs_breadth_not_a_top_k(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "one_pass")  # where a tree claims less than a chain
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "NGRAM",
                                  "--speculative-eagle-topk", "1", "--attention-backend", "fa3"])
    assert rc == 0
    line = start_up_line(err)
    # SGLang serves NGRAM with top-k = --speculative-ngram-max-bfs-breadth (10) whatever the top-k flag says.
    assert "eagle_topk=" not in line and "ngram_max_bfs_breadth=10" in line and "logits='tokens'" in line
    assert "reduced_draft_vocab=" not in line and "multi_layer_eagle=" not in line  # no draft model
    assert "note: NGRAM is wired and CPU-tested but has not yet run on a server" in err


def test_adaptive_dry_run_lists_steps_for_a_chain_and_none_for_a_tree(capsys):
    """SGLang runs --speculative-adaptive for EAGLE chains only (it turns the flag off for trees at start-up):
    the dry run, which reads the flags as typed, must say the same."""
    base = ["--model-path", "m", "--speculative-algorithm", "EAGLE", "--attention-backend", "fa3",
            "--speculative-adaptive"]
    rc, _, err = dry_run(capsys, [*base, *CHAIN])
    assert rc == 0 and "adaptive_steps=(0, 1, 3, 5, 7)" in start_up_line(err)
    assert "by batch size and accept rate" in err and "its serving cost is not measured" in err
    rc, _, err = dry_run(capsys, [*base, *TREE])
    assert rc == 0 and "adaptive_steps=()" in start_up_line(err) and "--speculative-adaptive (" not in err


def test_without_an_attention_backend_the_dry_run_says_why_it_claims_tokens(capsys):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN])
    assert rc == 0 and "logits='tokens'" in start_up_line(err)
    assert "without --attention-backend SGLang picks it on the GPU at start-up" in err
    # The last line, which a script reads, says what naming a backend would claim.
    assert err.splitlines()[-1].startswith("detspec: claim: logits='tokens' (") and (
        "no --attention-backend, so the server's pick decides; named, for a dense target (its config.json was not "
        "read): fa3 'bitwise', triton 'bitwise')" in err.splitlines()[-1])
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--kv-cache-dtype", "fp8_e4m3"])
    assert err.splitlines()[-1].endswith(": fa3 'tokens', triton 'tokens')")


@pytest.mark.parametrize("extra, why", [
    (["--attention-backend", "fa3", *TREE], "a tree (top-k 4) verified with SGLang's cascade attention: "
                                            "SGLANG_DETSPEC_DECODE_ATTENTION=split makes it bitwise"),
    (["--attention-backend", "triton", *TREE], "a tree (top-k 4) on triton: its verify mask interleaves"),
    (["--attention-backend", "flashinfer", *CHAIN], "flashinfer attention: bitwise verify = decode is proven on"),
    (["--attention-backend", "fa3", "--page-size", "16", *CHAIN],
     "fa3 with a KV page size of 16: decode and prefill were seen to tile keys apart"),
    (["--attention-backend", "fa3", "--kv-cache-dtype", "fp8_e4m3", *CHAIN],
     "--kv-cache-dtype fp8_e4m3: the plugin's exact attention paths are measured with SGLang's default KV cache"),
])
def test_every_tokens_claim_says_why(capsys, monkeypatch, extra, why):
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "one_pass")  # trees claim tokens without the split
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *extra])
    assert rc == 0 and "logits='tokens'" in start_up_line(err)
    assert f"note: logits='tokens' because of {why}" in err


@pytest.mark.parametrize("extra, noted", [
    ([], True), (["--cuda-graph-backend-prefill", "disabled"], False), (["--disable-cuda-graph"], False),
    (["--disable-prefill-cuda-graph"], False),
    # SGLang's precedence: the prefill backend flag beats the disable flags.
    (["--disable-prefill-cuda-graph", "--cuda-graph-backend-prefill", "full"], True),
])
def test_prefill_cuda_graphs_on_are_noted(capsys, extra, noted):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "fa3", *extra])
    assert rc == 0 and ("SGLang's prefill CUDA graphs are on (its default" in err) is noted


@pytest.mark.parametrize("family, said", [(None, False), ("dense", False), ("mla+moe", False),
                                          ("mla+moe+fp8", True), ("moe+fp8", True)])
def test_the_prefill_graph_note_says_how_the_fp8_rows_ran(family, said):
    from sglang_detspec.cli.dry_run import PREFILL_GRAPH_FP8, prefill_graph_notes
    from sglang_detspec.model_family import label_traits

    (note,) = prefill_graph_notes(argparse.Namespace(), label_traits(family))
    assert (PREFILL_GRAPH_FP8 in note) is said
    assert prefill_graph_notes(argparse.Namespace(disable_prefill_cuda_graph=True), label_traits(family)) == []


@pytest.mark.parametrize("extra, reason", [
    ([], None),
    (["--max-running-requests", "8"], "the bound 16 is not below --max-running-requests 8"),
    (["--attn-dp-size", "2", "--tp-size", "2"], "attention data parallelism"),
    (["--dp-size", "2", "--enable-dp-attention"], "attention data parallelism"),
    (["--pp-size", "2"], "pipeline parallelism"),
])
def test_the_dry_run_says_where_the_switching_tree_is_not_applied(capsys, monkeypatch, extra, reason):
    """The server's own rule (shape_rules.not_applied_reason), from the flags as typed."""
    monkeypatch.setenv("SGLANG_DETSPEC_TREE_CHAIN_BATCH", "16")
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *TREE,
                                  "--attention-backend", "fa3", *extra])
    assert rc == 0
    if reason is None:
        assert "decode batches of more than 16 requests draft a chain" in err and "not applied" not in err
    else:
        assert f"SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 not applied: {reason}" in err
        assert "decode batches of more than 16 requests draft a chain" not in err


@pytest.mark.parametrize("extra, reason, idle", [
    ([], None, None),
    # The token bound gives the chain batches of any size: applied, the batch bound idle.
    (["--max-running-requests", "8"], None,
     "SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 is not below --max-running-requests 8: only the token bound acts"),
    (["--max-total-tokens", "12288"], None,
     "SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288 is not below the KV pool's 12288 tokens: only batches whose requests "
     "share cached prefixes can pass it"),
    (["--max-total-tokens", "20480"], None, None),
    (["--max-running-requests", "16"], None,  # the edge: a bound equal to the cap never fires either
     "SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 is not below --max-running-requests 16: only the token bound acts"),
    (["--max-running-requests", "17"], None, None),
    (["--pp-size", "2"], "pipeline parallelism", None),
])
def test_the_dry_run_states_the_token_bound(capsys, monkeypatch, extra, reason, idle):
    monkeypatch.setenv("SGLANG_DETSPEC_TREE_CHAIN_BATCH", "16")
    monkeypatch.setenv("SGLANG_DETSPEC_TREE_CHAIN_TOKENS", "12288")
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *TREE,
                                  "--attention-backend", "fa3", *extra])
    assert rc == 0
    note = "or whose summed sequence length is above 12288 tokens draft a chain"
    assert (idle in " ".join(err.split())) if idle else ("only the token bound acts" not in err
                                                        and "can pass it" not in err)
    if reason is None:
        assert note in err and "not applied" not in err
    else:
        assert (f"SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 and SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288 not applied: "
                f"{reason}") in err and note not in err


def write_llama(folder) -> str:
    """A small Llama ``config.json`` in ``folder`` (created), enough for SGLang's resolution to run here."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1024,
        "max_position_embeddings": 2048}))
    return str(folder)


@pytest.mark.parametrize("algorithm", ["NEXTN", "STANDALONE"])
def test_a_draft_algorithm_left_without_a_draft_path_is_warned_of(capsys, tmp_path, algorithm):
    """SGLang fills the draft path only for targets that carry their draft layer; a Llama target does not."""
    target = write_llama(tmp_path)
    flags = ["--model-path", target, "--speculative-algorithm", algorithm, *CHAIN, "--attention-backend", "fa3"]
    rc, _, err = dry_run(capsys, flags)
    assert rc == 0 and f"warning: --speculative-algorithm {algorithm} without --speculative-draft-model-path" in err
    rc, _, err = dry_run(capsys, [*flags, "--speculative-draft-model-path", target])
    assert rc == 0 and "without --speculative-draft-model-path" not in err


@pytest.mark.parametrize("topk, noted", [("4", True), ("1", False)])
def test_a_multi_layer_eagle_tree_is_said_to_be_unmeasured(capsys, topk, noted):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", "--enable-multi-layer-eagle",
                                  "--speculative-num-steps", "3", "--speculative-eagle-topk", topk,
                                  "--speculative-num-draft-tokens", "8" if topk == "4" else "4",
                                  "--attention-backend", "fa3"])
    assert rc == 0 and ("multi-layer EAGLE drafting a tree" in err) is noted, err


def test_where_sglangs_resolution_stopped_is_named(capsys, tmp_path):
    """A bare ``assert`` of SGLang's gives no message: the note names the file, line and source instead."""
    target = write_llama(tmp_path)
    rc, _, err = dry_run(capsys, ["--model-path", target, "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--speculative-draft-model-path", target, "--attention-backend", "fa3",
                                  "--attn-dp-size", "2"])
    assert rc == 0
    assert re.search(r"warning: SGLang's own argument resolution failed one of its checks on these flags here "
                     r"\(AssertionError at sglang/srt/\S+\.py:\d+: assert ", err), err


def test_the_disable_setting_is_quoted_as_set(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "yes")
    rc, _, err = dry_run(capsys, ["--model-path", "m"])
    assert rc == 0 and "stays inactive (SGLANG_DETSPEC_DISABLE=yes is set)" in err


def test_an_unreadable_model_is_noted_and_a_readable_one_is_not(capsys, tmp_path):
    rc, _, err = dry_run(capsys, ["--model-path", "nonexistent-M", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "fa3"])
    assert rc == 0 and "config.json could not be read here ('nonexistent-M'): the claim above" in err
    # The claim line says it holds for a dense target, and what the families people speculate with would claim.
    assert err.splitlines()[-1] == (f"detspec: claim: logits='bitwise' ({dry_report.DENSE_ASSUMED}; with experts "
                                    "'bitwise', MLA with experts 'tokens', the same in FP8 'tokens', dense in FP8 "
                                    "'tokens')")
    rc, _, err = dry_run(capsys, ["--model-path", "nonexistent-M", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "triton"])
    assert err.splitlines()[-1].endswith("with experts 'bitwise', MLA with experts 'bitwise', the same in FP8 "
                                         "'bitwise', dense in FP8 'tokens')")
    # What start-up does to an MLA target: an NGRAM server is refused (its drafts are trees at any breadth).
    rc, _, err = dry_run(capsys, ["--model-path", "nonexistent-M", "--speculative-algorithm", "NGRAM",
                                  "--attention-backend", "triton"])
    assert "MLA with experts refused at start-up (mla_tree), the same in FP8 refused" in err.splitlines()[-1]
    # Where MoE targets claim 'tokens' follows the runs on record (model_family.MEASURED_BITWISE).
    assert ("as do MLA targets outside triton and MoE targets outside fa3 and triton or on another MoE runner than "
            "SGLang's Triton one," in " ".join(err.split()))
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    rc, _, err = dry_run(capsys, ["--model-path", str(tmp_path), "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "fa3"])
    assert rc == 0 and "could not be read" not in err and dry_report.DENSE_ASSUMED not in err
    assert err.splitlines()[-1] == "detspec: claim: logits='bitwise'"
    # A repository id not in the Hugging Face cache: the note says how to fetch its config alone.
    rc, _, err = dry_run(capsys, ["--model-path", "no-such-owner/no-such-model", "--speculative-algorithm", "EAGLE",
                                  *CHAIN, "--attention-backend", "fa3"])
    assert rc == 0 and ("`hf download no-such-owner/no-such-model config.json` puts it in the Hugging Face cache"
                        in err)


@pytest.mark.parametrize("decode, head_dim, backend, claim, fa3_claim", [
    ("one_pass", 64, "fa3", "tokens", None), ("one_pass", 32, "fa3", "tokens", None),
    ("one_pass", 128, "fa3", "bitwise", None), ("one_pass", 64, "triton", "bitwise", None),
    ("one_pass", 64, None, "tokens", "tokens"), ("one_pass", 128, None, "tokens", "bitwise"),
    # The prefix / tail split (the default): every head size FA3 takes.
    ("split", 64, "fa3", "bitwise", None), ("split", 32, None, "tokens", "bitwise"),
    ("split", 512, None, "tokens", "tokens"),
])
def test_the_dry_run_states_the_fa3_head_size_rule(capsys, tmp_path, monkeypatch, decode, head_dim, backend, claim,
                                                   fa3_claim):
    """Without the split FA3 at head sizes up to 64 claims tokens, with the reason; with no backend named, a note
    says what SGLang's fa3 pick would claim."""
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", decode)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "hidden_size": 4 * head_dim, "num_attention_heads": 4}))
    flags = ["--attention-backend", backend] if backend else []
    rc, _, err = dry_run(capsys, ["--model-path", str(tmp_path), "--speculative-algorithm", "EAGLE", *CHAIN, *flags])
    assert rc == 0 and f"logits='{claim}'" in start_up_line(err)
    assert (f"because of fa3 at head size {head_dim}" in err) is (backend == "fa3" and claim == "tokens")
    noted = f"at this target's head size ({head_dim}) an FA3 server claims"
    assert (noted in err) is (fa3_claim is not None)
    if fa3_claim:
        assert f"{noted} '{fa3_claim}'" in err
    if backend is None:  # with an fp8_e5m2 KV cache SGLang serves its pick on Triton: no FA3 note
        rc, _, err = dry_run(capsys, ["--model-path", str(tmp_path), "--speculative-algorithm", "EAGLE", *CHAIN,
                                      "--kv-cache-dtype", "fp8_e5m2"])
        assert rc == 0 and noted not in err
        assert "on every backend logits='tokens' because of --kv-cache-dtype fp8_e5m2" in err  # the rule is said


TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]


@pytest.mark.parametrize("backend, extra, claim, note", [
    ("triton", [], "bitwise", "positional-split Triton kernels were measured bitwise on one H200"),
    ("triton", ["--page-size", "16"], "tokens", "the split kernels read pages of 1 token"),
    ("fa3", ["--kv-cache-dtype", "fp8_e4m3"], "tokens", "--kv-cache-dtype fp8_e4m3: the plugin's exact"),
    ("fa3", [], "bitwise", "the prefix / tail split (two FA3 calls per row"),
    # The default setting, so nothing to say where it changes nothing (a setting that does: the next test).
    ("flashinfer", [], "tokens", "bitwise verify = decode is proven on triton and fa3 only"),
    (None, [], "tokens", "at this target's head size (128) an FA3 server claims 'bitwise'"),
])
def test_the_dry_run_says_where_split_makes_a_tree_bitwise(capsys, monkeypatch, tmp_path, backend, extra, claim,
                                                           note):
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "split")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "hidden_size": 512, "num_attention_heads": 4}))
    flags = (["--attention-backend", backend] if backend else []) + extra
    rc, _, err = dry_run(capsys, ["--model-path", str(tmp_path), "--speculative-algorithm", "EAGLE",
                                  "--speculative-draft-model-path", str(tmp_path), *TREE, *flags])
    assert rc == 0 and f"logits='{claim}'" in start_up_line(err)
    assert note in err and "changes nothing" not in err
    if "--kv-cache-dtype" in extra:  # the flags show the split cannot serve: no note describes it
        assert "two FA3 calls per row" not in err


@pytest.mark.parametrize("extra, limit", [(["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3"),
                                          (["--page-size", "16"], "KV page size 16")])
def test_the_node_path_is_not_said_to_stand_by_where_neither_fa3_path_serves(capsys, monkeypatch, extra, limit):
    monkeypatch.setenv("SGLANG_DETSPEC_TREE_ATTENTION", "nodes")
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *TREE,
                                  "--attention-backend", "fa3", *extra])
    assert rc == 0 and "logits='tokens'" in start_up_line(err)
    assert f"SGLANG_DETSPEC_TREE_ATTENTION=nodes changes nothing with {limit}" in err
    assert "stands by" not in err and "two FA3 calls per row" not in err


@pytest.mark.parametrize("kv_dtype, backend", [("fp8_e5m2", "triton"), ("fp8_e4m3", "fa3"), ("auto", "fa3")])
def test_the_dry_run_reads_the_backend_sglang_switches_an_fp8_e5m2_fa3_server_to(capsys, kv_dtype, backend):
    # SGLang's own resolution pass decides (FA3 reads FP8 as e4m3 only); its answer is asked, not restated.
    from sglang.srt.arg_groups.overrides import _attention_backend_fa3_fp8_fallback as sglang_pass

    view = argparse.Namespace(attention_backend="fa3", kv_cache_dtype=kv_dtype)
    assert sglang_pass(view).get("attention_backend", "fa3") == backend
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "fa3", "--kv-cache-dtype", kv_dtype])
    assert rc == 0 and f"attention_backend='{backend}'" in start_up_line(err)
    switched = f"SGLang serves --attention-backend fa3 with --kv-cache-dtype {kv_dtype} on triton"
    assert (switched in err) == (backend == "triton")
    assert "FlashAttention3 only supports" not in err  # SGLang's warning is for servers; the note says it here
    if backend == "triton":  # the Triton split's limits apply, not FA3's
        assert "Triton kernels cannot serve this server (--kv-cache-dtype fp8_e5m2)" in err


@pytest.mark.parametrize("decode, outside", [("torch_native", True), ("triton", False)])
def test_a_decode_backend_sglang_would_not_admit_is_named(capsys, decode, outside):
    # SGLang refuses --attention-backend torch_native under deterministic inference, not the split flags.
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--prefill-attention-backend", "fa3", "--decode-attention-backend", decode])
    assert rc == 0 and "logits='tokens'" in start_up_line(err)
    assert "two backends, which round apart" in err
    assert (f"and {decode} is not among them: nothing vouches for its batch invariance" in err) is outside
    assert "positional-split Triton kernels" not in err  # a pair claims tokens: no split note speaks for it


@pytest.mark.parametrize("flags", [["--prefill-attention-backend", "triton", "--decode-attention-backend", "triton"],
                                   ["--attention-backend", "fa3", "--decode-attention-backend", "triton"],
                                   # explicit prefill / decode backends win over SGLang's fp8_e5m2 switch
                                   ["--attention-backend", "fa3", "--prefill-attention-backend", "fa3",
                                    "--decode-attention-backend", "fa3", "--kv-cache-dtype", "fp8_e5m2"]])
def test_no_switch_note_where_sglang_switches_nothing(capsys, flags):
    # Split prefill / decode backends make the bag's backend differ from --attention-backend as typed.
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN, *flags])
    assert rc == 0 and "flags check passed" in err
    assert "SGLang serves --attention-backend" not in err


@pytest.mark.parametrize("extra, limit", [(["--page-size", "16"], "KV page size 16"),
                                          (["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3")])
def test_the_dry_run_says_when_the_triton_split_stands_down(capsys, extra, limit):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "triton", *extra])
    assert rc == 0
    assert f"Triton kernels cannot serve this server ({limit}): the target keeps the one-pass" in err
    assert "were measured bitwise on one H200" not in err  # no note describes the split that does not run
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "triton"])
    assert rc == 0 and "cannot serve this server" not in err


def test_the_dry_run_says_a_decode_setting_changes_nothing_on_other_backends(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "one_pass")
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "flashinfer"])
    assert rc == 0 and ("SGLANG_DETSPEC_DECODE_ATTENTION=one_pass applies to the triton and fa3 backends only; "
                        "with flashinfer attention it changes nothing") in err


def test_a_server_without_speculative_decoding_says_why_it_claims_tokens_too(capsys):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--attention-backend", "flashinfer"])
    assert rc == 0 and "logits='tokens'" in start_up_line(err)
    assert "note: logits='tokens' because of flashinfer attention" in err


@pytest.mark.parametrize("budget, words", [(None, "spends up to 60 s compiling DeepGEMM"),
                                            ("120", "spends up to 120 s compiling DeepGEMM"),
                                            ("0", "SGLANG_DETSPEC_GEMM_WARMUP_S=0: DeepGEMM's matmul kernels compile")])
def test_the_dry_run_says_what_the_deepgemm_warm_up_will_spend(capsys, monkeypatch, budget, words):
    if budget is not None:
        monkeypatch.setenv("SGLANG_DETSPEC_GEMM_WARMUP_S", budget)
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "fa3"])
    assert rc == 0 and words in err


@pytest.mark.parametrize("shape, noted", [(TREE, True), (CHAIN, False)])
def test_the_dry_run_says_a_tree_server_compiles_sglangs_kv_move_at_start_up(capsys, shape, noted):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *shape,
                                  "--attention-backend", "fa3"])
    assert rc == 0 and ("compiles SGLang's move of each verify's accepted KV slots" in err) is noted


@pytest.mark.parametrize("flags, words", [(["--dp-size", "2"], "--dp-size 2: not yet measured"),
                                          (["--tp-size", "2", "--dp-size", "2"], "--tp-size 2, --dp-size 2: not yet measured"),
                                          (["--pp-size", "2"], "--pp-size 2: not yet measured"),
                                          (["--tp-size", "2", "--attn-dp-size", "2"],
                                           "--tp-size 2, --attn-dp-size 2: not yet measured"),
                                          ([], None)])
def test_the_dry_run_says_parallel_servers_are_not_measured(capsys, flags, words):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "fa3", *flags])
    assert rc == 0
    assert ("not yet measured with the plugin" not in err) if words is None else (words in err)
    lines = err.splitlines()
    if words is not None:  # a warning on the line right under the claim it qualifies
        passed = next(i for i, line in enumerate(lines) if "flags check passed" in line)
        assert lines[passed + 1].startswith("detspec: warning: ") and words in lines[passed + 1], lines[passed:passed + 2]
    # The claim again as the last line before the command: the one-GPU rule's, the sizes named, pointing to the
    # warning where there is one. "m" is no model folder here: the claim is marked as for a dense target too.
    parallel = words.removesuffix(": not yet measured") if words else ""
    marks = [f"on one GPU; at {parallel} not measured, see the warning above"] * bool(words) + [dry_report.DENSE_ASSUMED]
    assert lines[-1].startswith(f"detspec: claim: logits='bitwise' ({'; '.join(marks)}; with experts "), lines[-1]


@pytest.mark.parametrize("flags, said", [
    (["--model-path", "/nonexistent/M"], "--model-path /nonexistent/M: no such file or folder"),
    (["--model-path", "m", "--speculative-draft-model-path", "./no-draft"],
     "--speculative-draft-model-path ./no-draft: no such file or folder"),
])
def test_a_model_path_that_names_nothing_here_stops_serve(capsys, monkeypatch, flags, said):
    def started(*_):
        raise AssertionError("a server was started")

    monkeypatch.setattr(serve, "_serve", started)
    rc = main(["serve", "--", *flags, "--speculative-algorithm", "EAGLE", *CHAIN])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == f"detspec: error: {said}", err
    # A dry run may run on another machine than the server's: it notes a missing target and goes on.
    rc, _, err = dry_run(capsys, [*flags, "--speculative-algorithm", "EAGLE", *CHAIN, "--attention-backend", "fa3"])
    assert rc == 0 and ("no such file or folder on this machine (a real start stops on it)" in err) == (
        flags[1].startswith("/"))


def test_verbose_needs_a_dry_run(capsys, monkeypatch):
    def started(*_):
        raise AssertionError("a server was started")

    monkeypatch.setattr(serve, "_serve", started)
    assert main(["serve", "--verbose", "--", "--model-path", "m"]) == 2
    assert capsys.readouterr().err.startswith("detspec: error: --verbose needs --dry-run")


def test_a_note_keeps_its_first_clause_and_what_is_not_measured():
    cut = dry_report.CUT_MARK
    assert dry_report.brief_note("a (b; c) d; e; f") == f"a (b; c) d {cut}"
    assert dry_report.brief_note("nothing to cut (x; y)") == "nothing to cut (x; y)"
    # What no run measured qualifies what the server does: it stays, once, with the cut marked where it was.
    assert dry_report.brief_note("runs X at 0.9x; on H100 (a; b); other shapes are not measured") == (
        f"runs X at 0.9x; {cut} other shapes are not measured")
    assert dry_report.brief_note("runs X; A not measured; fig; A not measured; fig") == f"runs X; A not measured {cut}"
    assert dry_report.brief_note("runs X; no run used pages") == "runs X; no run used pages"


def test_the_dry_run_cuts_its_notes_unless_verbose(capsys):
    flags = ["--model-path", "m", "--speculative-algorithm", "EAGLE", *TREE, "--attention-backend", "fa3"]
    rc = main(["serve", "--dry-run", "--", *flags])
    brief = capsys.readouterr().err.splitlines()
    rc_verbose, _, verbose = dry_run(capsys, flags)
    verbose = verbose.splitlines()
    assert rc == rc_verbose == 0
    # The same lines up to the notes and the same claim line last; each note cut at its first clause, or whole.
    notes = [line for line in verbose if line.startswith("detspec: note: ")]
    said = [line for line in brief if line == f"detspec: note: {dry_report.CUT_NOTE}"]
    cut = [line for line in brief if line.startswith("detspec: note: ") and line not in said]
    assert len(said) == 1 and "--verbose prints them whole" in said[0]
    assert len(cut) == len(notes) and any(line.endswith(dry_report.CUT_MARK) for line in cut)
    for short, whole in zip(cut, notes):
        if short == whole:
            continue
        kept = [part.replace(dry_report.CUT_MARK, "").strip() for part in short.split("; ")]
        kept = [part for part in kept if part]
        assert dry_report.CUT_MARK in short and whole.startswith(kept[0] + ";")
        assert len(set(kept)) == len(kept) and all(part in whole for part in kept), short
    assert brief[-1] == verbose[-1] and brief[-1].startswith("detspec: claim: ")
    assert sum(map(len, brief)) < 0.75 * sum(map(len, verbose))


def test_a_bitwise_claim_has_no_tokens_note(capsys):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN,
                                  "--attention-backend", "fa3"])
    assert rc == 0 and "logits='bitwise'" in start_up_line(err) and "because of" not in err


def test_bounds_are_left_to_sglang_where_the_plugin_does_not_serve(capsys, monkeypatch):
    """A disabled plugin, or an algorithm whose top-k SGLang sets itself, meets SGLang's own rules only."""
    monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "1")
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--attention-backend", "fa3", "--speculative-algorithm",
                                  "EAGLE", "--speculative-eagle-topk", "0"])
    assert rc == 0 and "must be >= 1" not in err


@pytest.mark.parametrize("extra, message", [
    (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "0"],
     "--speculative-eagle-topk must be >= 1 with --speculative-algorithm EAGLE, got 0"),
    (["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "0"],
     "--speculative-ngram-max-bfs-breadth must be >= 1 with --speculative-algorithm NGRAM, got 0"),
    (["--page-size", "0"], "--page-size must be >= 1, got 0"),
])
def test_flags_out_of_their_bound_are_named(capsys, extra, message):
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--attention-backend", "fa3", *extra])
    assert rc != 0 and message in err


def test_a_tree_with_rejection_sampling_is_refused_up_front(capsys):
    # Rejection-mode verification takes chains only; the check above must have refusals to compare.
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *TREE, REJECTION])
    assert rc == 2 and "--speculative-eagle-topk" in err


def test_tokenizer_workers_are_refused_up_front_like_the_server_does(capsys, monkeypatch):
    args = ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN, "--tokenizer-worker-num", "2"]
    rc, out, err = dry_run(capsys, args)
    assert rc == 2 and out == "" and "--tokenizer-worker-num 2 is not supported" in err
    monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "1")  # an inactive plugin refuses nothing
    rc, out, _ = dry_run(capsys, args)
    assert rc == 0 and "sglang.launch_server" in out


def test_an_inactive_run_is_noted(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "1")
    rc, out, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN])
    assert rc == 0 and "sglang.launch_server" in out
    assert ("note: sglang-detspec stays inactive (SGLANG_DETSPEC_DISABLE=1 is set): SGLang's own sampling runs"
            in err)
    assert "DetSpecConfig(" not in err and "flags" not in err


# -- usage ---------------------------------------------------------------------------------

def test_sglang_flags_without_dashes_get_a_hint(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--dry-run", "--model-path", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --model-path; put '--' before SGLang's launch_server arguments" in err
    assert "detspec serve [--dry-run] -- --model-path M" in err
    # Other subcommands keep argparse's plain message.
    with pytest.raises(SystemExit):
        main(["audit", "--model-path", "x"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --model-path x" in err and "put '--'" not in err


def test_no_launch_arguments(capsys):
    assert main(["serve", "--dry-run"]) == 2
    assert "give SGLang's launch_server arguments after '--'" in capsys.readouterr().err
    assert main(["serve"]) == 2


def test_sglangs_own_help_is_passed_through(capsys):
    rc, out, _ = dry_run(capsys, ["--help"])
    assert rc == 0 and shlex.split(out)[1:] == ["-m", "sglang.launch_server", "--help"]


def serve_help(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_help_never_breaks_a_flag(capsys, monkeypatch, columns):
    out = serve_help(capsys, monkeypatch, columns)
    known = set(serve.sglang_parser()._option_string_actions) | {"--dry-run", "--verbose", "--help"}
    # A flag wrapped at a line end reads as "--speculative-", which names no flag.
    flags = set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", out))
    assert DETERMINISTIC in flags and "--speculative-eagle-topk" in flags
    assert flags <= known, flags - known


def test_help_example_can_be_copied_and_passes_the_check(capsys, monkeypatch):
    out = serve_help(capsys, monkeypatch, 60)
    assert "``" not in out and DETERMINISTIC in out and "SGLANG_PLUGINS" in out
    # The example sits under the description, before the options, ending at the first blank line.
    example = out.split("example:\n", 1)[1].split("\n\n", 1)[0]
    assert out.index("example:") < out.index("--dry-run  ")
    # A shell drops each backslash-newline (line continuation) before splitting into words.
    words = shlex.split(example.replace("\\\n", ""))
    assert words[:3] == ["detspec", "serve", "--"]
    rc, cmd, err = dry_run(capsys, words[3:])
    assert rc == 0, err
    assert shlex.split(cmd)[3:] == [*words[3:], DETERMINISTIC]
    # The claim the help explains is the one the example's dry run makes.
    assert "logits='bitwise'" in start_up_line(err) and "claims logits='bitwise'" in out


def test_help_usage_line_shows_the_separator(capsys, monkeypatch):
    usage = serve_help(capsys, monkeypatch, 80).splitlines()[0]
    assert usage.startswith("usage: detspec serve") and " -- " in usage


def test_top_level_help_names_a_first_step_that_runs(capsys):
    from sglang_detspec.cli.main import FIRST_STEPS, build_parser
    parser = build_parser()
    assert parser.epilog == FIRST_STEPS
    # Every command the first steps quote is one the parser accepts.
    for quoted in re.findall(r"'detspec (\w+)", FIRST_STEPS):
        assert quoted in parser._subparsers._group_actions[0].choices or quoted == "COMMAND"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "first steps: 'detspec audit'" in " ".join(capsys.readouterr().out.split())


def test_help_says_which_runs_had_prefill_cuda_graphs_on(capsys, monkeypatch):
    out = " ".join(serve_help(capsys, monkeypatch, 80).split())
    assert "were on in the serving benchmark" in out
    assert "every E2E file that runs CUDA graphs (all but the controls), the forward-mode matrix" in out
    assert dry_report.PREFILL_GRAPH_SUITES in out
    assert "except the two-GPU file (never run)" in out and "model-families file" not in out
    # The example keeps SGLang's default, so its dry run says which runs had them on.
    assert "--cuda-graph-backend-prefill" not in serve.EXAMPLE


# The light demo venv has this package but no SGLang: serve must say so, not trace back.
# `python -S` leaves site-packages (and so SGLang) off the path, as in that venv.
NO_SGLANG_SERVE = """
import sys
sys.path.insert(0, sys.argv[1])
from sglang_detspec.cli.main import main
sys.exit(main(["serve", "--dry-run", "--verbose", "--", "--model-path", "M"]))
"""


def test_serve_without_sglang_says_how_to_get_it():
    import subprocess
    from pathlib import Path

    package_root = str(Path(serve.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-S", "-c", NO_SGLANG_SERVE, package_root],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "SGLang is not installed in this environment" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("decode, noted", [(None, True), ("sglang", False)])
def test_the_dry_run_says_the_node_path_stands_by_under_the_split(capsys, monkeypatch, decode, noted):
    monkeypatch.setenv("SGLANG_DETSPEC_TREE_ATTENTION", "nodes")
    if decode:
        monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", decode)
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *TREE,
                                  "--attention-backend", "fa3"])
    assert rc == 0 and ("SGLANG_DETSPEC_TREE_ATTENTION=nodes stands by on fa3" in err) is noted



@pytest.mark.parametrize("extra, described", [
    ([], True), (["--page-size", "16"], False),
    (["--speculative-num-steps", "3", "--speculative-eagle-topk", "8", "--speculative-num-draft-tokens", "80"], False),
])
def test_the_split_note_is_left_out_where_the_flags_show_the_split_cannot_serve(capsys, extra, described):
    flags = TREE if not extra or extra[0] == "--page-size" else []
    rc, _, err = dry_run(capsys, ["--model-path", "m", "--speculative-algorithm", "EAGLE", *flags, *extra,
                                  "--attention-backend", "fa3"])
    assert rc == 0 and ("the prefix / tail split (two FA3 calls per row" in err) is described


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_refusals_survive_pickling():
    """A refusal or a start-up refusal error crossing a process boundary keeps its message (and a refusal its code)."""
    import pickle

    from sglang_detspec.config import DetSpecConfig, Refusal
    from sglang_detspec.sglang_plugin.startup import RefusedError

    r = pickle.loads(pickle.dumps(Refusal("rejection_tree", "trees need coupled mode")))
    assert (r, r.code) == ("trees need coupled mode", "rejection_tree")
    err = RefusedError(DetSpecConfig(deterministic=True), [Refusal("rejection_tree", "trees need coupled mode")])
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, ValueError) and str(back) == str(err) and "[refusal: rejection_tree]" in str(back)
