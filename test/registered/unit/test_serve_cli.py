"""`detspec serve`: the flags it adds, read the way SGLang's own parser reads them, and its usage errors."""

import argparse
import sys

import pytest
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.cli import serve
from sglang_detspec.cli.main import main

register_cpu_ci(est_time=15, suite="detspec-unit-cpu")

ALGORITHM, DETERMINISTIC, REJECTION = serve.ALGORITHM, serve.DETERMINISTIC, serve.REJECTION
DESTS = {
    ALGORITHM: "speculative_algorithm",
    DETERMINISTIC: "enable_deterministic_inference",
    REJECTION: "speculative_use_rejection_sampling",
}


def sglang_reads(args):
    """Which of our three flags SGLang's own launch_server parser sees set in ``args``; None if it refuses them."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        ns, _ = parser.parse_known_args(args)
    except SystemExit:
        return None
    return {flag for flag, dest in DESTS.items() if getattr(ns, dest) not in (None, False)}


CASES = [
    ["--speculative-algorithm", "EAGLE"],
    ["--speculative-algo", "EAGLE"],
    ["--speculative-al=EAGLE"],
    ["--speculative-algorithm=EAGLE", "--enable-det"],
    ["--speculative-algo", "EAGLE", "--enable-deterministic", "--speculative-use-rej"],
    ["--enable-deterministic-inference"],
    ["--speculative-use-rejection-sampling"],
    [],
]


@pytest.mark.parametrize("extra", CASES, ids=lambda a: " ".join(a) or "none")
def test_flags_are_found_as_sglang_parses_them(extra):
    args = ["--model-path", "m", *extra]
    seen = sglang_reads(args)
    assert seen is not None
    assert serve.given_flags(args, serve.sglang_flags()) & set(DESTS) == seen


@pytest.mark.parametrize("extra", CASES, ids=lambda a: " ".join(a) or "none")
def test_command_turns_on_what_is_missing(extra):
    args = ["--model-path", "m", *extra]
    cmd = serve.server_command(args, python="py")
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"] and cmd[3 : 3 + len(args)] == args
    # What SGLang will see once the command runs: deterministic always, rejection
    # sampling whenever a speculative algorithm is set, each flag at most once.
    seen = sglang_reads(cmd[3:])
    assert DETERMINISTIC in seen
    assert (REJECTION in seen) == (ALGORITHM in seen or REJECTION in sglang_reads(args))
    added = cmd[3 + len(args) :]
    assert len(added) == len(set(added)) and not set(added) & sglang_reads(args)


def test_ambiguous_prefix_names_no_flag():
    # SGLang refuses '--speculative-a' (six flags start with it); nothing is added for it.
    args = ["--model-path", "m", "--speculative-a", "EAGLE"]
    assert sglang_reads(args) is None
    assert serve.resolve_flag("--speculative-a", serve.sglang_flags()) is None
    assert REJECTION not in serve.server_command(args, python="py")


def test_resolve_flag_follows_argparse_rules():
    flags = {"--alpha", "--alphabet", "--beta"}
    assert serve.resolve_flag("--beta", flags) == "--beta"
    assert serve.resolve_flag("--b=1", flags) == "--beta"
    assert serve.resolve_flag("--alpha", flags) == "--alpha"  # exact beats a longer match
    assert serve.resolve_flag("--alp", flags) is None  # ambiguous
    assert serve.resolve_flag("--alphab", flags) == "--alphabet"
    assert serve.resolve_flag("beta", flags) is None and serve.resolve_flag("--", flags) is None
    # After a bare '--' argparse reads only positionals.
    assert serve.given_flags(["--beta", "--", "--alphab"], flags) == {"--beta"}


CHAIN = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_dry_run_prints_the_completed_command(capsys, monkeypatch):
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    assert main(["serve", "--dry-run", "--", "--model-path", "m", "--speculative-algo", "EAGLE", *CHAIN]) == 0
    out = capsys.readouterr().out.split()
    assert out[1:] == ["-m", "sglang.launch_server", "--model-path", "m", "--speculative-algo", "EAGLE", *CHAIN,
                       DETERMINISTIC, REJECTION]


def test_added_flags_go_before_a_bare_double_dash():
    args = ["--model-path", "m", "--speculative-algorithm", "EAGLE", *CHAIN, "--", "--extra"]
    cmd = serve.server_command(args, python="py")
    assert cmd[3:] == [*args[:-2], DETERMINISTIC, REJECTION, "--", "--extra"]
    assert sglang_reads(cmd[3:]) == {ALGORITHM, DETERMINISTIC, REJECTION}


def test_speculative_run_needs_all_chain_flags(capsys):
    # Left to SGLang, a Llama target gets steps 5, topk 4, 8 draft tokens: a tree.
    assert main(["serve", "--dry-run", "--", "--model-path", "m", "--speculative-algorithm", "EAGLE",
                 "--speculative-eagle-top", "1"]) == 2
    err = capsys.readouterr().err
    assert "--speculative-num-steps, --speculative-num-draft-tokens not given" in err and "example:" in err


def test_no_speculative_algorithm_is_noted(capsys):
    assert main(["serve", "--dry-run", "--", "--model-path", "m"]) == 0
    assert "note: no --speculative-algorithm: sglang-detspec stays inactive" in capsys.readouterr().err


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


def test_help_is_plain_text(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    assert DETERMINISTIC in out and REJECTION in out and "SGLANG_PLUGINS" in out
    assert "example: detspec serve -- --model-path M --speculative-algorithm EAGLE" in out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
