"""Committed files name no machine's folders, and the rewriter that keeps run artifacts so.

Run folders copied from a GPU machine (``docs/e2e/<run>/``, ``docs/benchmarks/.../<run>/``)
carry placeholders such as ``<site-packages>`` instead of that machine's interpreter,
site-packages, caches, checkout and result folders (``scripts/neutral_paths.py``; the H200
run scripts call it on their result folders). What may stay: the project's own folders
(``/tmp/detspec-*``), ``#!/usr/bin/env``, and the wheel kit's folders in the scripts that run
on the kit (``scripts/h200/``, ``benchmark/serving/run_h200.sh``), where they are instructions.
"""

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "neutral_paths.py"
SCANNED = ("docs", "README.md", "benchmark", "scripts", "test", "python")
# Scripts run on the wheel kit's machine: the kit's folders there are where they work.
KIT_FILES = ("scripts/h200/", "benchmark/serving/run_h200.sh")
# The rule's own definition names the paths it rewrites.
RULE_FILES = {str(SCRIPT.relative_to(ROOT)), str(Path(__file__).resolve().relative_to(ROOT))}


def _load():
    spec = importlib.util.spec_from_file_location("neutral_paths", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


neutral = _load()


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.decode().split("\0") if name]


def test_committed_files_name_no_machine_paths():
    found = []
    for name in tracked_files():
        path = ROOT / name
        if name in RULE_FILES or not path.is_file():  # not a file: deleted in the working tree
            continue
        text = neutral.read_text(path)
        if text is None:  # binary
            continue
        for line, found_path in neutral.machine_paths(text):
            if name.startswith(KIT_FILES) and any(
                    found_path == kit or found_path.startswith(kit + "/") for kit in neutral.KIT_PATHS):
                continue
            found.append(f"{name}:{line}: {found_path}")
    assert not found, ("machine paths in committed files (for a copied run folder: "
                       "python3 scripts/neutral_paths.py --results <its folder on the machine> FOLDER):\n"
                       + "\n".join(found[:40]) + (f"\n... {len(found) - 40} more" if len(found) > 40 else ""))


RESULTS = ["/tmp/il-1", "/tmp/r1"]
REPOS = ["/srv/checkout"]
CASES = [
    ("platform linux -- Python 3.12.3, pytest-9.1.1 -- /opt/torch/.venv/bin/python3",
     "platform linux -- Python 3.12.3, pytest-9.1.1 -- <python>"),
    ("rootdir: /srv/checkout", "rootdir: <repo>"),
    ('<failure message="skip">/srv/checkout/test/registered/cuda/test_x.py:98: no tile</failure>',
     '<failure message="skip"><repo>/test/registered/cuda/test_x.py:98: no tile</failure>'),
    ('  File "/tmp/site/sglang/srt/managers/scheduler.py", line 2120, in event_loop_overlap',
     '  File "<site-packages>/sglang/srt/managers/scheduler.py", line 2120, in event_loop_overlap'),
    ("/home/ci/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py:1775: in _call_impl",
     "<site-packages>/torch/nn/modules/module.py:1775: in _call_impl"),
    ("Python v3.12.3 (/usr/bin/python3.12)", "Python v3.12.3 (<python>)"),
    ("cd /root/.cache/sglang/deep_gemm/tmp/1-a && /usr/local/cuda/bin/nvcc k.cu -B/opt/gcc/bin/",
     "cd <cache>/sglang/deep_gemm/tmp/1-a && <cuda>/bin/nvcc k.cu -B<opt>/gcc/bin/"),
    ("PATH=/tmp/site/bin:/usr/local/cuda-12.8/bin:$PATH", "PATH=<site-packages>/bin:<cuda>/bin:$PATH"),
    (". /tmp/e2e/remote/env.sh; RESULTS=/tmp/e2e-r1 bash run.sh", ". <kit>/remote/env.sh; RESULTS=<tmp>/e2e-r1 bash run.sh"),
    ('"command": "/opt/torch/.venv/bin/python3 -m sglang.bench_serving --output-file /tmp/il-1/raw/a_c8.jsonl"',
     '"command": "<python> -m sglang.bench_serving --output-file <results>/raw/a_c8.jsonl"'),
    ("/tmp/il-10/raw and /tmp/tmpxft_1e92-6_sampling.ptx", "<tmp>/il-10/raw and <tmp>/tmpxft_1e92-6_sampling.ptx"),
    ('{"log": "failed\\n/tmp/r1/test_invariance/a.json"}', '{"log": "failed\\n<results>/test_invariance/a.json"}'),
    ("/home/ci/notes and /root", "<home>/notes and <home>"),
    # What stays: the project's own folders, shebangs, relative paths.
    ("--model-path /tmp/detspec-e2e-models/target", "--model-path /tmp/detspec-e2e-models/target"),
    ("#!/usr/bin/env python3", "#!/usr/bin/env python3"),
    ("bash benchmark/serving/run_h200.sh; ls a/tmp/b", "bash benchmark/serving/run_h200.sh; ls a/tmp/b"),
]


@pytest.mark.parametrize("line, expected", CASES)
def test_rewrite_keeps_what_follows_the_folder_and_is_idempotent(line, expected):
    out = neutral.neutralise(line, RESULTS, REPOS)
    assert out == expected
    assert neutral.neutralise(out, RESULTS, REPOS) == out
    assert neutral.machine_paths(out) == []


def test_default_checkout_is_this_one():
    assert neutral.REPO == ROOT
    assert neutral.neutralise(f"rootdir: {ROOT}") == "rootdir: <repo>"


def test_junit_files_get_escaped_placeholders_and_still_parse(tmp_path, capsys):
    import xml.etree.ElementTree as ElementTree

    junit = tmp_path / "suite.xml"
    junit.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest"><testcase classname="t" '
                     'name="x"><failure message="boom">File "/tmp/site/torch/x.py", line 1&#10;'
                     f'{ROOT}/test/t.py:3</failure></testcase></testsuite></testsuites>')
    assert neutral.main([str(junit)]) == 0
    text = junit.read_text()
    failure = ElementTree.fromstring(text).find(".//failure").text  # parses: the placeholders are escaped
    assert failure == 'File "<site-packages>/torch/x.py", line 1\n<repo>/test/t.py:3'
    assert neutral.machine_paths(text) == [] and neutral.neutralise(text, xml=True) == text
    # The committed JUnit files parse too.
    for committed in (ROOT / "docs").rglob("*.xml"):
        ElementTree.parse(committed)
    capsys.readouterr()


def test_cli_rewrites_a_folder_in_place_and_keeps_json_valid(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    out = str(run)
    rows = [{"command": f"/opt/torch/.venv/bin/python3 -m x --output-file {out}/raw/a.jsonl", "c": i} for i in (1, 8)]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "meta.json").write_text(json.dumps({"out": out, "argv": ["/usr/bin/python3.12", "-m", "y"]}, indent=1))
    (run / "logs" / "server.log").write_bytes(b"cut here \xe2\x82\n  File \"/tmp/site/torch/x.py\", line 1\n")
    (run / "stacks.txt.gz").write_bytes(gzip.compress(b"run (/tmp/site/sglang/a.py:3)\n"))
    png = b"\x89PNG\r\n\x1a\n\0\0/tmp/site/x"
    (run / "plot.png").write_bytes(png)

    assert neutral.main(["--check", out]) == 1
    capsys.readouterr()
    assert neutral.main(["--results", out, out]) == 0
    assert "4 files rewritten, 0 unchanged, 1 binary left alone" in capsys.readouterr().out

    results = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert [r["command"] for r in results] == ["<python> -m x --output-file <results>/raw/a.jsonl"] * 2
    assert json.loads((run / "meta.json").read_text()) == {"out": "<results>", "argv": ["<python>", "-m", "y"]}
    # A log cut inside a character keeps its bytes; a .gz is rewritten inside; a binary file is left alone.
    assert (run / "logs" / "server.log").read_bytes() == b"cut here \xe2\x82\n  File \"<site-packages>/torch/x.py\", line 1\n"
    assert gzip.decompress((run / "stacks.txt.gz").read_bytes()) == b"run (<site-packages>/sglang/a.py:3)\n"
    assert (run / "plot.png").read_bytes() == png

    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert neutral.main(["--results", out, out]) == 0
    assert "0 files rewritten" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert neutral.main(["--check", out]) == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
