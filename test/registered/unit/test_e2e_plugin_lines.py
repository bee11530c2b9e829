"""The E2E suites' server harness (``test/registered/e2e/_e2e``): the check of a deterministic server's plugin lines
(``plugin_problems``), its log names and its reuse of running servers.

Real ``RunningServer`` and ``LogSink`` objects over a log file written here;
the lines are the plugin's own strings (its start-up line, the warm-up lines
of ``gemm_warmup_hook`` and ``warmup_hook``).
"""

import os
import subprocess
import sys
import types

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.sglang_plugin import gemm_warmup_hook as gemms

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

ACTIVE = "[2026-12-04 15:48:47] sglang-detspec active: DetSpecConfig(active=True, logits='bitwise', verify='coupled')"
WARMED = f"[2026-12-04 15:49:47] {gemms.WARMED_LOG}: 120 launches over 6 weight shapes"
SKIPPED = f"[2026-12-04 15:49:47] {gemms.SKIPPED_LOG}: compute capability 10.x: ..."


@pytest.fixture
def e2e(e2e_import):
    return e2e_import("_e2e")


def server_with(e2e, tmp_path, lines, env=()):
    sink = e2e.LogSink(tmp_path / "server.log")
    sink.write("\n".join(lines) + "\n")
    config = e2e.ServerConfig(name="coupled_chain_det_cuda_graph", model="m", args=(), deterministic=True,
                              cuda_graph=True, env=tuple(env), verify="coupled")
    return e2e.RunningServer(config, "http://127.0.0.1:1", None, sink, 0.0)


@pytest.mark.parametrize("lines, problem", [
    ([ACTIVE, WARMED], None),
    ([ACTIVE, SKIPPED], None),
    ([ACTIVE], "no DeepGEMM warm-up line"),
    ([ACTIVE, WARMED, f"[t] {gemms.FAILED_LOG}; its kernels compile at first use"], "a start-up warm-up failed"),
    ([ACTIVE, WARMED, "[t] sglang-detspec: start-up kernel warm-up failed (plans); kernels compile at first use"],
     "a start-up warm-up failed"),
    (["[t] sglang-detspec inactive (SGLang's own sampling runs): ..."], "did not log itself active"),
])
def test_the_plugin_lines_a_deterministic_server_must_log(e2e, tmp_path, monkeypatch, lines, problem):
    monkeypatch.setattr(e2e, "hopper", lambda: False)  # the GPU rule has its own test below
    problems = e2e.plugin_problems(server_with(e2e, tmp_path, lines))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize("lines, env, problem", [
    ([ACTIVE, WARMED], (), None),
    ([ACTIVE, SKIPPED], (), "DeepGEMM was not warmed on Hopper"),
    ([ACTIVE, SKIPPED], (("SGLANG_DETSPEC_GEMM_WARMUP_S", "0"),), None),
])
def test_on_hopper_the_warm_up_must_have_run(e2e, tmp_path, monkeypatch, lines, env, problem):
    monkeypatch.setattr(e2e, "hopper", lambda: True)
    problems = e2e.plugin_problems(server_with(e2e, tmp_path, lines, env))
    assert problems == [] if problem is None else (len(problems) == 1 and problem in problems[0]), problems


def fa3_lines():
    from sglang_detspec.sglang_plugin import fa3_split_hook as fsh

    return {"down": f"[t] sglang-detspec: {fsh.STANDS_DOWN} at head size 128 for a server that verifies no trees",
            "on": f"[t] sglang-detspec: {fsh.SPLIT_ON} (head size 64; decode = prefill = verify checked ...)",
            "off": f"[t] sglang-detspec: {fsh.SPLIT_OFF} (a 16-token page): the target keeps SGLang's FA3 calls"}


@pytest.mark.parametrize("logged, head_dim, trees, problem", [
    (("down",), 128, False, None),
    (("on",), 128, False, "stands down"),  # the split where SGLang's calls would do: the cost the rule removes
    (("on",), 128, True, None),
    (("down",), 128, True, "prefix / tail split in every forward mode"),
    (("on",), 64, False, None),
    (("on", "off"), 64, False, "prefix / tail split in every forward mode"),
    ((), 96, False, "stands down"),
])
def test_an_fa3_server_logs_the_attention_path_its_shape_takes(e2e, tmp_path, logged, head_dim, trees, problem):
    lines = fa3_lines()
    server = server_with(e2e, tmp_path, [ACTIVE, *(lines[k] for k in logged)])
    found = e2e.fa3_path_problem(server, "split", head_dim, trees)
    assert (found is None) if problem is None else (problem in found), found
    assert e2e.fa3_path_problem(server, "sglang", head_dim, trees) is None  # the split not asked for


@pytest.mark.parametrize("logged, trees, problem", [
    (("off",), False, None),
    (("off",), True, None),
    (("down",), False, "not used on FA3"),  # at pages above one token even a chain's check cannot run
    (("on", "off"), True, "not used on FA3"),
])
def test_at_pages_above_one_token_an_fa3_server_logs_the_split_not_used(e2e, tmp_path, logged, trees, problem):
    lines = fa3_lines()
    server = server_with(e2e, tmp_path, [ACTIVE, *(lines[k] for k in logged)])
    found = e2e.fa3_path_problem(server, "split", 128, trees, split_serves=e2e.split_can_serve("fa3", 16, None))
    assert (found is None) if problem is None else (problem in found and "cannot serve these flags" in found), found


@pytest.mark.parametrize("backend, page_size, dtype, serves", [
    ("fa3", 1, None, True), ("fa3", 1, "auto", True), ("fa3", 16, None, False), ("fa3", 1, "bf16", False),
    ("fa3", 1, "fp8_e4m3", False), ("triton", 1, "bf16", True), ("triton", 1, "fp8_e5m2", False),
    ("triton", 16, "auto", False),
])
def test_where_the_split_can_serve_the_suites_flags(e2e, backend, page_size, dtype, serves):
    assert e2e.split_can_serve(backend, page_size, dtype) is serves


@pytest.mark.parametrize("args, page_size, dtype", [
    (None, 1, None),  # the suite's default flags
    ("--attention-backend triton --page-size 16", 16, None),
    ("--page-size=16 --kv-cache-dtype fp8_e4m3 --page-size 32", 32, "fp8_e4m3"),  # the last one wins
])
def test_the_claim_reads_the_page_size_and_kv_dtype_every_server_runs_with(e2e, monkeypatch, args, page_size, dtype):
    if args is None:
        monkeypatch.delenv("DETSPEC_E2E_SERVER_ARGS", raising=False)
    else:
        monkeypatch.setenv("DETSPEC_E2E_SERVER_ARGS", args)
    assert e2e.served_page_size() == page_size
    assert e2e.common_flag("--kv-cache-dtype") == dtype


@pytest.mark.parametrize("value", ["0", "-4", "sixteen"])
def test_a_page_size_that_is_no_positive_integer_names_the_variable(e2e, monkeypatch, value):
    monkeypatch.setenv("DETSPEC_E2E_SERVER_ARGS", f"--page-size {value}")
    with pytest.raises(ValueError, match="DETSPEC_E2E_SERVER_ARGS: --page-size must be a positive integer"):
        e2e.served_page_size()


@pytest.mark.parametrize("page_size, cached, hit", [
    (1, 99, True),  # SGLang matches all but the last input token
    (1, 96, False),
    (16, 96, True),  # 100 tokens: six whole pages of 16
    (16, 80, False),  # a whole page of the prompt not served from the cache
])
def test_a_cache_hit_is_every_whole_page_of_the_prompt(e2e_import, monkeypatch, page_size, cached, hit):
    requests = e2e_import("_requests")
    monkeypatch.setattr(requests, "post", lambda *a, **k: {"status": 200, "text": "", "body": None})

    def send(server, prompts, params, want):
        return [requests.Generated(output_ids=(7,) * want, logprobs=None, sampling_seed=None, verify_ct=None,
                                   completion_tokens=want, retractions=0, finish_reason=None, cached_tokens=cached)
                for _ in prompts]

    first = send(None, [[1] * 100], [{}], 40)
    again, problems = requests.resend_over_cache(types.SimpleNamespace(url="http://127.0.0.1:1"), send,
                                                 [[1] * 100], [{}], first, 32, 8, page_size)
    assert len(again) == 1
    assert (problems == []) if hit else ("not served from the radix cache" in problems[0]), problems


def test_a_restarted_server_logs_beside_its_first_log(e2e, tmp_path, monkeypatch):
    """A server started again under the same name (the reliability file's restart) keeps the first log."""
    monkeypatch.setenv("DETSPEC_E2E_OUT", str(tmp_path))
    config = e2e.ServerConfig(name="coupled_chain_det_cuda_graph", model="m", args=(), deterministic=True,
                              cuda_graph=True, env=(), verify="coupled")
    servers = e2e.Servers("test_reliability")
    names = []
    for _ in range(3):
        path = servers._log_path(config)
        e2e.LogSink(path).close()  # the sink creates the file, as a launch does
        names.append(path.name)
    assert names == ["server_test_reliability-coupled_chain_det_cuda_graph.log",
                     "server_test_reliability-coupled_chain_det_cuda_graph.2.log",
                     "server_test_reliability-coupled_chain_det_cuda_graph.3.log"]


def test_asking_for_a_server_that_failed_to_start_leaves_the_others_running(e2e, tmp_path, monkeypatch):
    """A failed start is not retried, so asking for it again (an audit thread beside others) must not stop the
    servers the others are using, as a start of a missing server would."""
    monkeypatch.setenv("DETSPEC_E2E_OUT", str(tmp_path))
    servers = e2e.Servers("test_families")
    up = e2e.ServerConfig(name="none_det", model="m", args=(), deterministic=True, cuda_graph=True, env=())
    down = e2e.ServerConfig(name="chain_det", model="m", args=(), deterministic=True, cuda_graph=True, env=())
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sink = e2e.LogSink(tmp_path / "up.log")
    try:
        servers.running[up.name] = e2e.RunningServer(up, "http://127.0.0.1:1", process, sink, 0.0)
        servers.failed[down.name] = "server chain_det did not become healthy within 300 s"
        with pytest.raises(RuntimeError, match="chain_det did not become healthy"):
            servers.ensure(down)
        assert up.name in servers.running, "asking for the failed configuration stopped the running server"
        assert servers.running[up.name].process.poll() is None
        assert servers.ensure(up).process is process
    finally:
        process.kill()
        process.wait()
        sink.close()


@pytest.mark.parametrize("fixed", [True, False])
def test_a_server_that_fails_to_start_is_launched_once(e2e, tmp_path, monkeypatch, fixed):
    """SGLang's real ``popen_launch_server`` relaunches online when ``HF_HUB_OFFLINE`` is ``"1"``; the harness's
    environment keeps the server offline without that second launch (the unfixed call shows the retry happens)."""
    import huggingface_hub.constants

    # A stand-in for the `sglang` command that fails at once, writing the offline setting it was given.
    starts = tmp_path / "starts"
    command = tmp_path / "bin" / "sglang"
    command.parent.mkdir()
    command.write_text(f'#!/bin/sh\necho "$HF_HUB_OFFLINE" >> {starts}\nexit 1\n')
    command.chmod(0o755)
    monkeypatch.setenv("PATH", f"{command.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    helpers = e2e.sglang_test_helpers()
    env = e2e.server_env(()) if fixed else None
    with pytest.raises(Exception):
        helpers.popen_launch_server(str(tmp_path), f"http://127.0.0.1:{e2e.free_port()}", timeout=60, env=env,
                                    device="cuda")
    launches = starts.read_text().split()
    assert launches == (["ON"] if fixed else ["1", "0"])
    # The value the server was given is offline to huggingface_hub, the reader SGLang's loader asks.
    assert huggingface_hub.constants._is_true("ON")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
