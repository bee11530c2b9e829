"""The audit schedule, its verdict, and the `detspec audit` command end to end."""

import json
from pathlib import Path
import subprocess
import sys

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.auditing import batch
from sglang_detspec.auditing.batch import DEFAULT_TRIALS, build_plan, group_sizes, judge, run_plan
from sglang_detspec.cli.audit import REFERENCE_MAX_POSITIONS
from sglang_detspec.cli.main import build_parser, main
from sglang_detspec.reference import ReferenceEngine, build_model_pair
from sglang_detspec.reference.samplers import KeyedSampler

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

VOCAB = 384


@pytest.fixture(scope="module")
def models():
    return build_model_pair()


def test_default_plan_covers_the_batch_shapes():
    plan = build_plan(25, seed=0, max_new_tokens=16, vocab_size=VOCAB, max_batch=32)
    trials = plan.trials
    assert len(trials) == 25 and [t.index for t in trials] == list(range(25))
    assert trials[0].kind == "solo" and trials[0].batches == ((plan.probe,),)
    assert {t.num_requests for t in trials} >= {1, 32}
    assert [t.kind for t in trials[1:]] == ["batch", "permuted", "split"] * 8
    probe_rows = set()
    for trial in trials:
        # The probe sits exactly where the trial says, and only there.
        assert trial.batches[trial.probe_batch][trial.probe_row] == plan.probe
        assert sum(b.count(plan.probe) for b in trial.batches) == 1
        probe_rows.add((trial.num_requests, trial.probe_row))
    for batch, permuted, split in zip(trials[1::3], trials[2::3], trials[3::3]):
        (members,) = batch.batches
        assert sorted(map(repr, permuted.batches[0])) == sorted(map(repr, members))
        assert permuted.probe_row != batch.probe_row
        assert len(split.batches) == 2 and all(split.batch_sizes)
        assert split.batches[0] + split.batches[1] == members
    # Rows vary: first, last and middle rows all occur.
    assert any(row == 0 for n, row in probe_rows if n > 1)
    assert any(row == n - 1 for n, row in probe_rows if n > 1)
    assert any(0 < row < n - 1 for n, row in probe_rows)


def test_plan_is_a_function_of_its_arguments():
    a = build_plan(10, seed=3, max_new_tokens=8, vocab_size=VOCAB)
    assert a == build_plan(10, seed=3, max_new_tokens=8, vocab_size=VOCAB)
    b = build_plan(10, seed=4, max_new_tokens=8, vocab_size=VOCAB)
    assert a.probe.sampling_seed == 3 and b.probe.sampling_seed == 4
    assert a.trials != b.trials


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_plan_has_exactly_the_requested_trials(n):
    plan = build_plan(n, vocab_size=VOCAB, max_batch=4)
    assert len(plan.trials) == n
    assert all(t.num_requests <= 4 for t in plan.trials)


def test_plan_and_cli_share_the_default_trial_count():
    assert DEFAULT_TRIALS == 25
    assert len(build_plan(vocab_size=VOCAB).trials) == DEFAULT_TRIALS
    assert build_parser().parse_args(["audit"]).trials == DEFAULT_TRIALS


def test_group_sizes_span_two_to_max():
    assert group_sizes(1, 32) == [32]
    sizes = group_sizes(8, 32)
    assert sizes[0] == 2 and sizes[-1] == 32 and sizes == sorted(sizes)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_trials=0), "num_trials"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_batch=1), "max_batch"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**64), "seed"),
    ],
)
def test_plan_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_plan(**{"num_trials": 4, "vocab_size": VOCAB, **kwargs})


def test_verdict_passes_seeded_and_fails_control(models):
    plan = build_plan(7, seed=1, max_new_tokens=6, vocab_size=VOCAB, max_batch=6)
    seeded = run_plan(ReferenceEngine(models, 2), plan)
    control = run_plan(ReferenceEngine.control(models, 2, seed=1), plan)
    assert seeded.unique_probe_outputs == 1 and seeded.varying_requests == 0
    assert control.unique_probe_outputs > 1
    assert seeded.mean_accept_length > 1
    ok = judge(seeded, control)
    assert ok.passed and ok.message.startswith("PASS") and ok.notes == ()
    # The control run in the seeded slot is what a batch-dependent backend looks like.
    bad = judge(control)
    assert not bad.passed
    assert bad.message.startswith("FAIL") and f"{control.unique_probe_outputs} different outputs" in bad.message
    assert any("requests of the seeded run changed" in n for n in bad.notes)
    # A control that never varied means the trials proved nothing: say so.
    assert any("control also gave 1" in n for n in judge(seeded, seeded).notes)


class RowKeyedSampler(KeyedSampler):
    """A seeded sampler with the bug the audit guards against: each draw keyed by the row's own
    ``sampling_seed`` but at ``position + row index``, so a request's uniforms depend on its slot in the
    batch (``docs/design.md`` §1 forbids exactly this). Otherwise the keyed sampler, unchanged."""

    name = "seeded-row-keyed"

    @staticmethod
    def slotted(positions):
        return positions + torch.arange(positions.shape[0], dtype=positions.dtype)

    def draft(self, probs, seeds, positions, draft_step):
        return super().draft(probs, seeds, self.slotted(positions), draft_step)

    def verify(self, draft_tokens, draft_probs, target_probs, seeds, positions):
        return super().verify(draft_tokens, draft_probs, target_probs, seeds, self.slotted(positions))

    def propose(self, probs, seeds, positions, num_samples=1):
        return super().propose(probs, seeds, self.slotted(positions), num_samples)

    def sample(self, probs, seeds, positions):
        return super().sample(probs, seeds, self.slotted(positions))

    def coupled_verify(self, draft_tokens, target_probs, seeds, positions):
        return super().coupled_verify(draft_tokens, target_probs, seeds, self.slotted(positions))

    def coupled_verify_tree(self, candidates, next_token, next_sibling, target_probs, seeds, positions):
        return super().coupled_verify_tree(candidates, next_token, next_sibling, target_probs, seeds,
                                           self.slotted(positions))


@pytest.mark.parametrize("verify", ["coupled", "rejection"])
def test_a_seeded_but_batch_dependent_sampler_fails_the_audit(models, verify):
    """Positive control: the requests carry their seeds, yet the audit must catch draws keyed by batch slot."""
    plan = build_plan(7, seed=1, max_new_tokens=6, vocab_size=VOCAB, max_batch=6)
    assert len({t.probe_row for t in plan.trials}) > 1  # the probe changes slot, or nothing could be caught
    honest = run_plan(ReferenceEngine(models, 2, verify=verify), plan)
    buggy = run_plan(ReferenceEngine(models, 2, verify=verify, sampler=RowKeyedSampler()), plan)
    assert judge(honest).passed
    probe_seeds = {t.batches[t.probe_batch][t.probe_row].sampling_seed for t in plan.trials}
    assert len(probe_seeds) == 1 and None not in probe_seeds  # one fixed seed: only the slot changes
    verdict = judge(buggy)
    assert not verdict.passed and buggy.unique_probe_outputs > 1, verdict.message
    assert verdict.message.startswith("FAIL") and f"{buggy.unique_probe_outputs} different outputs" in verdict.message


def test_verdict_needs_two_trials(models):
    one = run_plan(ReferenceEngine(models, 2), build_plan(1, max_new_tokens=2, vocab_size=VOCAB, max_batch=2))
    assert one.unique_probe_outputs == 1
    with pytest.raises(ValueError, match="needs the probe in at least 2 trials, the seeded run has 1"):
        judge(one)


def test_cli_audit_end_to_end_writes_json(tmp_path, capsys):
    out = tmp_path / "audit.json"
    argv = ["audit", "--trials", "7", "--max-new-tokens", "6", "--max-batch-size", "6", "-k", "2", "--seed", "5"]
    assert main([*argv, "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "PASS" in stdout and "unique probe outputs" in stdout
    assert "PASS: 1 unique output(s) across all configurations with coupled verify (rejection verify: " in (
        " ".join(stdout.split()))
    assert "audit passed" in stdout
    report = json.loads(out.read_text())
    assert report["passed"] is True and report["sections"] == {"changing_batch": True, "invariance": True}
    assert report["settings"] == {
        "mode": "coupled", "mode_source": "default", "trials": 7, "max_new_tokens": 6, "num_draft_tokens": 2, "max_batch_size": 6,
        "seed": 5, "control": True, "invariance": True, "vocab_size": VOCAB,
    }
    coupled, rejection = report["invariance"]["coupled"], report["invariance"]["rejection"]
    assert coupled["passed"] is True and coupled["unique_outputs"] == 1
    assert rejection["mode"] == "rejection" and rejection["unique_outputs"] > 1
    names = [row["name"] for row in coupled["rows"]]
    assert names[0] == "off" and len(names) > 3
    assert f"rejection verify: {rejection['unique_outputs']} across the same configurations)" in " ".join(stdout.split())
    assert report["probe"]["sampling_seed"] == 5
    seeded, control = report["runs"]["seeded"], report["runs"]["control"]
    assert seeded["unique_probe_outputs"] == 1
    assert control["unique_probe_outputs"] > 1
    assert len(seeded["trials"]) == len(control["trials"]) == 7
    for trial in seeded["trials"] + control["trials"]:
        assert len(trial["probe_output_ids"]) == 6
        assert sum(trial["probe_accept_lengths"]) == 6
        assert all(1 <= a <= 3 for a in trial["probe_accept_lengths"])
    assert len({tuple(t["probe_output_ids"]) for t in seeded["trials"]}) == 1
    assert 1 < seeded["mean_accept_length"] <= 3


def test_require_control_variation_fails_a_control_that_never_varied(tmp_path, monkeypatch):
    from sglang_detspec.reference import ReferenceEngine

    out = tmp_path / "audit.json"
    argv = ["audit", "--trials", "5", "--max-new-tokens", "6", "--max-batch-size", "6", "--seed", "5",
            "--no-invariance", "--require-control-variation", "--json", str(out)]
    assert main(argv) == 0  # the real control varies
    assert json.loads(out.read_text())["sections"] == {"changing_batch": True, "control_varied": True}
    # A "control" that is the seeded engine itself never varies: the audit must fail, not pass on the seeded run.
    monkeypatch.setattr(ReferenceEngine, "control", classmethod(
        lambda cls, models, k, seed, verify: cls(models, k, verify=verify)))
    assert main(argv) == 1
    assert json.loads(out.read_text())["sections"] == {"changing_batch": True, "control_varied": False}


def test_cli_audit_without_control(tmp_path):
    out = tmp_path / "seeded.json"
    argv = ["audit", "--trials", "3", "--max-new-tokens", "4", "--max-batch-size", "3", "--no-control",
            "--no-invariance"]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["runs"]) == ["seeded"] and "invariance" not in report


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_cli_rejection_mode_fails_the_invariance_section(tmp_path, capsys, monkeypatch, how):
    # Rejection verification is batch-invariant but not drafter-invariant: the
    # changing-batch section passes, the invariance section fails, so the audit does.
    # SGLANG_DETSPEC_VERIFY, the server's setting, also picks the in-process mode, and the header says so.
    out = tmp_path / "rejection.json"
    mode_args = ["--mode", "rejection"] if how == "flag" else []
    if how == "environment":
        monkeypatch.setenv("SGLANG_DETSPEC_VERIFY", "rejection")
    argv = ["audit", *mode_args, "--trials", "3", "--max-new-tokens", "8", "--max-batch-size", "3",
            "--no-control", "--json", str(out)]
    assert main(argv) == 1
    stdout = " ".join(capsys.readouterr().out.split())
    source = "--mode" if how == "flag" else "SGLANG_DETSPEC_VERIFY=rejection"
    assert f"rejection ({source}) verify, K=3 draft tokens" in stdout
    assert "PASS: the seeded probe request gave 1 unique output across 3 trials" in stdout
    assert "FAIL:" in stdout and "with rejection verify (coupled verify: 1 across the same configurations)" in stdout
    assert "audit failed: invariance" in stdout
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["settings"]["mode"] == "rejection"
    assert report["sections"] == {"changing_batch": True, "invariance": False}
    assert report["invariance"]["rejection"]["passed"] is False
    assert report["invariance"]["coupled"]["unique_outputs"] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trials", "0"], "argument --trials: must be >= 2, got 0"),
        (["--trials", "1"], "argument --trials: must be >= 2, got 1: one trial cannot show"),
        (["--trials", "many"], "argument --trials: expected an integer, got 'many'"),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1"),
        (["--num-draft-tokens", "0"], "argument --num-draft-tokens/-k: must be >= 1"),
        (["--max-batch-size", "1"], "argument --max-batch-size: must be in [2, 1024], got 1"),
        (["--max-batch-size", "1025"], "argument --max-batch-size: must be in [2, 1024], got 1025"),
        (["--max-batch-size", "100000"], "argument --max-batch-size: must be in [2, 1024], got 100000"),
        (["--seed", "-1"], "argument --seed: must be in [0, 2**64), got -1"),
        (["--seed", str(2**64)], "argument --seed: must be in [0, 2**64)"),
        (["--json", "/nonexistent-dir/x.json"], "argument --json: directory '/nonexistent-dir' does not exist"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--mode", "tree"], "argument --mode: invalid choice: 'tree'"),
    ],
)
def test_cli_rejects_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["audit", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # The audit's own usage, not the top-level one.
    assert err.startswith("usage: detspec audit [-h]") and f"detspec: error: {message}" in err


@pytest.mark.parametrize("args, code", [
    (["--trials", "x", "--json", "-"], "usage"),  # argparse's error
    (["--json=-", "--bogus"], "usage"),  # an unknown argument
    (["--json", "-", "--url", "http://127.0.0.1:9"], "usage"),  # the audit's own check: --url needs --vocab-size
])
def test_json_to_stdout_gets_an_error_object_after_an_argument_error(args, code, capsys):
    try:
        status = main(["audit", *args])
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    out, err = capsys.readouterr()
    obj = json.loads(out)
    assert obj["error"]["code"] == code and obj["error"]["message"] in err
    assert "detspec: error: " in err


def test_without_json_to_stdout_an_argument_error_prints_nothing_there(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--trials", "x", "--json", "out.json"])
    assert capsys.readouterr().out == ""


def test_cli_accepts_the_bounds_themselves():
    args = build_parser().parse_args(["audit", "--trials", "2", "--max-batch-size", "1024", "--seed", str(2**64 - 1)])
    assert (args.trials, args.max_batch_size, args.seed) == (2, 1024, 2**64 - 1)


@pytest.mark.parametrize(
    "args, got",
    [
        (["--max-new-tokens", "5000"], "5000 + 3"),
        (["-k", "5000"], "16 + 5000"),
        (["--max-new-tokens", "4070"], "4070 + 3"),
    ],
)
def test_cli_keeps_in_process_runs_within_the_models_positions(args, got, capsys):
    assert main(["audit", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: detspec audit")
    assert (
        "detspec: error: --max-new-tokens + --num-draft-tokens must be at most 4072 with the in-process "
        f"engine (with the longest prompt, 24 tokens, they must fit the reference models' 4096 positions), got {got}"
    ) in err


def test_cli_position_bound_is_the_models_and_refused_before_torch_loads():
    # The bound the CLI states up front is the reference models' own.
    assert build_model_pair().max_positions == REFERENCE_MAX_POSITIONS
    code = (
        "import sys\n"
        "from sglang_detspec.cli.main import main\n"
        "code = main(['audit', '--max-new-tokens', '100000'])\n"
        "print('exit', code, 'heavy:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "exit 2 heavy: []"
    assert "must be at most 4072" in done.stderr


def test_cli_help_explains_the_columns_and_the_limit(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for phrase in ("varying requests requests (probe and fillers) whose output changed between trials",
                   "between 1 and K+1 for K draft tokens per round", "(1-TV)/(1+TV), 1-TV",
                   "N + K must be at most 4072", "130 interrupted"):
        assert phrase in out, phrase


@pytest.mark.parametrize("columns", ["80", "200"])
def test_cli_help_fits_80_columns_and_keeps_quoted_commands_whole(monkeypatch, capsys, columns):
    # At 80 (piped) all of it fits; on a wider terminal argparse widens the options, not the epilog.
    from sglang_detspec.cli.audit import _EPILOG

    monkeypatch.setenv("COLUMNS", columns)
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    lines = capsys.readouterr().out.splitlines()
    checked = lines if columns == "80" else _EPILOG.splitlines()
    too_long = [line for line in checked if len(line) > 80]
    assert not too_long, too_long
    assert _EPILOG.strip().splitlines()[0] in lines
    assert any("`--mode rejection`" in line for line in lines)
    assert any("`SGLANG_DETSPEC_VERIFY=rejection`" in line for line in lines)


@pytest.mark.parametrize(
    "flag, env, expected",
    [
        (None, None, ("coupled", "default")),
        (None, "auto", ("coupled", "SGLANG_DETSPEC_VERIFY=auto")),
        (None, " ", ("coupled", "default")),  # blank counts as unset, as for the server
        (None, "coupled", ("coupled", "SGLANG_DETSPEC_VERIFY=coupled")),
        ("coupled", "rejection", ("coupled", "--mode")),  # the flag wins over the environment
    ],
)
def test_in_process_mode_comes_from_the_flag_then_the_environment(monkeypatch, flag, env, expected):
    from sglang_detspec.cli._audit_local import in_process_mode as _in_process_mode

    if env is None:
        monkeypatch.delenv("SGLANG_DETSPEC_VERIFY", raising=False)
    else:
        monkeypatch.setenv("SGLANG_DETSPEC_VERIFY", env)
    args = build_parser().parse_args(["audit", *(["--mode", flag] if flag else [])])
    assert _in_process_mode(args) == expected


def test_in_process_mode_names_a_bad_verify_setting(monkeypatch):
    from sglang_detspec.cli._audit_local import in_process_mode as _in_process_mode

    monkeypatch.setenv("SGLANG_DETSPEC_VERIFY", "tree")
    with pytest.raises(ValueError, match=r"SGLANG_DETSPEC_VERIFY must be one of auto, coupled or rejection, "
                       "got 'tree'"):
        _in_process_mode(build_parser().parse_args(["audit"]))


def test_triton_kernel_without_cuda_tensors_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_DETSPEC_KERNEL", "triton")
    assert main(["audit", "--trials", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "detspec: error: SGLANG_DETSPEC_KERNEL=triton cannot run the in-process audit")


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    # Where a user's Ctrl-C lands most often: while the models are built.
    monkeypatch.setattr("sglang_detspec.reference.build_model_pair", interrupted)
    assert main(["audit", "--trials", "2", "--no-invariance"]) == 130
    assert capsys.readouterr().err == "detspec: interrupted\n"


def test_ctrl_c_in_a_real_process_exits_130(tmp_path):
    import os
    import signal
    import time

    # SIGINT to a running `detspec audit`: the interpreter raises KeyboardInterrupt wherever it is.
    # A command started in the background by a non-interactive shell inherits SIGINT ignored, and Python
    # then installs no handler; a user's terminal gives Python's own, which the child sets explicitly.
    # The child says when its imports are done, the audit's lazy ones (torch, the reference engine) included,
    # then the audit runs for about 20 s. An interrupt inside an import is not the audit's: on a fresh clone
    # torch's first import outlasted a fixed wait, and SIGINT inside numpy's import left it half-built (exit 1).
    child = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "import torch, sglang_detspec.reference; from sglang_detspec.cli.main import main; "
             "print('imported', file=sys.stderr, flush=True); sys.exit(main())")
    proc = subprocess.Popen(
        [sys.executable, "-c", child, "audit", "--trials", "25"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr.readline().strip() == "imported"
    time.sleep(1)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]  # what the child said, should this fail again
    assert err.strip().splitlines()[-1] == "detspec: interrupted" and "Traceback" not in err


def test_cli_position_bound_admits_an_exact_fit(monkeypatch):
    # 24 (longest prompt) + 4069 + 3 = 4096 positions: past the check, the plan is built.
    class PlanBuilt(Exception):
        pass

    def build_plan_stub(*args, **kwargs):
        raise PlanBuilt

    monkeypatch.setattr(batch, "build_plan", build_plan_stub)
    with pytest.raises(PlanBuilt):
        main(["audit", "--max-new-tokens", "4069"])


def test_cli_help_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "from sglang_detspec.cli.main import main\n"
        "for argv in (['--help'], ['audit', '--help'], ['serve', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('heavy:', sorted(m for m in ('torch', 'transformers', 'sglang') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--max-batch-size" in out and out.splitlines()[-1] == "heavy: []"


def test_cli_rejects_directory_as_json_path(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--json", str(tmp_path)])
    assert exc.value.code == 2
    assert "is a directory" in capsys.readouterr().err


def test_cli_lists_audit_and_needs_a_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    # The description names exactly the subcommands that exist.
    assert "Deterministic speculative decoding for SGLang: audit and serve." in out
    assert "benchmark" not in out
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: detspec" in err and "detspec: error: give a command (audit, serve), e.g. detspec audit" in err
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_bad_environment_setting_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_DETSPEC_KERNEL", "bogus")
    assert main(["audit", "--trials", "2"]) == 2
    assert "detspec: error: SGLANG_DETSPEC_KERNEL must be one of auto, torch or triton, got 'bogus'" in (
        capsys.readouterr().err)


def test_invariance_section_fits_80_columns_when_piped():
    """Piped output gets rich's 80 columns: the table fits them, uncropped; the verdict stays one whole line."""
    import io

    from rich.console import Console

    from sglang_detspec.cli._audit_report import print_invariance_section
    from sglang_detspec.auditing.invariance import InvarianceReport, InvarianceRow

    rows = (InvarianceRow("off", "none", 0, 1, None, True, unique_outputs=1, mean_accept_length=1.0),
            InvarianceRow("chain K=3, random draft", "chain", 3, 1, "random", True, unique_outputs=1,
                          mean_accept_length=2.22, acceptance_rate=0.667, coupled_bound=0.53, one_minus_tv=0.69,
                          tested_positions=1234),
            InvarianceRow("tree 3x2", "tree", 3, 2, "close", False, note="trees need coupled verify"))
    reports = {mode: InvarianceReport(mode, (), (), rows, (unique,), unique, unique == 1, 0.1)
               for mode, unique in (("coupled", 1), ("rejection", 7))}
    out = io.StringIO()
    assert print_invariance_section(Console(file=out, width=80), reports, "rejection") is False
    lines = out.getvalue().splitlines()
    table = [line for line in lines if line and line[0] in "┏┃┡│└"]
    assert table and max(map(len, table)) <= 80
    assert all(line[-1] in "┓┃┩│┘" for line in table)  # the right border is there on every row
    assert "1234" in out.getvalue()
    assert ("FAIL: 7 unique output(s) across all configurations with rejection verify "
            "(coupled verify: 1 across the same configurations)") in lines
    assert "expected: rejection sampling's tokens depend on the drafter" in out.getvalue()  # a failure by design


def test_cli_audit_json_dash_writes_standard_output(capsys):
    argv = ["audit", "--trials", "3", "--max-new-tokens", "3", "--max-batch-size", "3", "-k", "2", "--seed", "5",
            "--no-invariance", "--json", "-"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # standard output holds the JSON alone
    assert report["passed"] is True and report["settings"]["trials"] == 3
    assert "audit passed" in captured.err and "unique probe outputs" in captured.err
    assert not Path("-").exists()


def test_cli_audit_says_what_changes_nothing(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "1")
    argv = ["audit", "--trials", "2", "--max-new-tokens", "2", "--max-batch-size", "2", "--no-invariance"]
    assert main(argv) == 0
    assert "note: SGLANG_DETSPEC_DISABLE=1 applies to SGLang servers with the plugin" in capsys.readouterr().err
    monkeypatch.delenv("SGLANG_DETSPEC_DISABLE")
    from sglang_detspec.cli import audit

    args = build_parser().parse_args(["audit", "--url", "http://127.0.0.1:9", "--vocab-size", "10", "--no-control",
                                      "--no-invariance"])
    assert audit._notes(args) == [
        "--no-control changes nothing with --url (the control runs the in-process engine only)",
        "--no-invariance changes nothing with --url (the invariance section runs the in-process engine only)",
    ]


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
