#!/usr/bin/env bash
# On an H200 machine after the wheel install (README.md here): runs end-to-end suite files of
# test/registered/e2e against real SGLang servers, all files at once, one pytest process per
# file, each pinned to one GPU (CUDA_VISIBLE_DEVICES). The tiny models' servers share a GPU:
# the default server flags fix each server's KV pool (--max-total-tokens).
#
#   bash scripts/h200/run_e2e_suite.sh FILE[@GPU]... [pytest args]
#
#   FILE      a test file (or FILE::test); @GPU pins it to that GPU index, otherwise the
#             files take the GPUs of $GPUS (default: every GPU nvidia-smi lists) in turn.
#   RESULTS   folder for the results (default /tmp/detspec-e2e-results): one subfolder per
#             file with one JSON per check, the server logs and pytest's log; summary.json.
#             At the end its machine paths become placeholders (scripts/neutral_paths.py).
#   ARCHIVE   if set, everything in RESULTS is also packed into this .tgz (outside RESULTS),
#             even when the time limit stops the run.
#   DETSPEC_E2E_BUDGET_S  seconds the whole command may take (default 580, for a 600 s
#             limit): pytest runs get what is left after the set-up, minus 25 s to stop
#             leftover servers and pack the archive.
#   DETSPEC_E2E_INSTALLED=1  skip the install: for a second run beside a first one in the same
#             command, started once the first wrote $RESULTS/.setup-done (its install and models
#             done), so the first one's servers keep their imports; or for a later command on
#             the same machine. Either way SGLang's `sglang` command and py-spy are written again
#             when missing (another pip --target run, the serving benchmark's, replaces their folder).
#
# Arguments not ending in .py (or .py@N, .py::...) go to every pytest (e.g. -k "not concurrent").
# Server flags: DETSPEC_E2E_SERVER_ARGS / DETSPEC_E2E_MTP_SERVER_ARGS (test/registered/e2e/_e2e.py);
# with sgl-kernel's FA3 library installed (pack_fa3.py) the multi-layer servers use FA3.
set -uo pipefail
t0=$(date +%s)
budget=${DETSPEC_E2E_BUDGET_S:-580}
# RESULTS and ARCHIVE are taken relative to the caller's folder, before the cd below.
results=$(realpath -m "${RESULTS:-/tmp/detspec-e2e-results}"); mkdir -p "$results"
rm -f "$results/.setup-done"
archive=${ARCHIVE:+$(realpath -m "$ARCHIVE")}
case $archive in "$results"/*) echo "ARCHIVE must lie outside RESULTS ($results)" >&2; exit 2 ;; esac
files=(); gpus_of=(); args=()
for a in "$@"; do
  case $a in
    *.py@*|*.py::*@*) files+=("${a%@*}"); gpus_of+=("${a##*@}") ;;
    *.py|*.py::*) files+=("$a"); gpus_of+=("") ;;
    *) args+=("$a") ;;
  esac
done
cd "$(dirname "$0")/../.."
. /tmp/e2e/remote/env.sh
pids=()
finish() {  # stop pytest runs still going (interrupted), then pack what was written
  for pid in "${pids[@]+"${pids[@]}"}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  # Results that end up in docs/ name no machine folders (interpreter, site-packages, this folder).
  python3 scripts/neutral_paths.py --results "$results" "$results" || echo "run_e2e_suite: machine paths left in $results" >&2
  if [ -n "$archive" ]; then tar czf "$archive" -C "$(dirname "$results")" "$(basename "$results")"; fi
}
trap finish EXIT
[ ${#files[@]} -gt 0 ] || { echo "usage: $0 TEST_FILE[@GPU]... [pytest args]" >&2; exit 2; }

export PATH=/tmp/site/bin:$PATH
if [ "${DETSPEC_E2E_INSTALLED:-0}" = 1 ]; then
  [ -d /tmp/site/sglang ] && [ -d /tmp/site/sglang_detspec ] \
    || { echo "run_e2e_suite: DETSPEC_E2E_INSTALLED=1 but nothing is installed" >&2; exit 1; }
else
  bash scripts/h200/install_plugin.sh || exit 1
fi
# py-spy, when the kit carries its wheel (.e2e/tools/): a request that hangs gets the server's
# stacks written next to its results (_e2e.RunningServer.dump_stacks). Only the binary is needed;
# the script does nothing where it is in place.
bash "$(dirname "$0")/install_py_spy.sh"
# popen_launch_server runs the `sglang` console script. The wheels were unpacked with zipfile,
# which writes no console scripts, and any pip --upgrade --target (this script's above, the serving
# benchmark's) replaces /tmp/site/bin with this package's scripts: write SGLang's own entry point
# (sglang.cli.main:main) as the command whenever it is missing.
if [ ! -x /tmp/site/bin/sglang ]; then
  mkdir -p /tmp/site/bin
  cat > /tmp/site/bin/sglang <<'PY'
#!/usr/bin/env python3
import sys

from sglang.cli.main import main

# The guard matters: SGLang starts its scheduler with multiprocessing's spawn, which re-runs
# this file as the child's main module; unguarded, each child would start a whole server.
if __name__ == "__main__":
    sys.exit(main())
PY
  chmod +x /tmp/site/bin/sglang
fi

# A run that skips everything must not pass as a GPU run.
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "run_e2e_suite: no CUDA GPU visible to torch" >&2; exit 1; }
read -r -a gpus <<< "${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | tr '\n' ' ')}"
echo "GPUs: ${gpus[*]}; multi-layer EAGLE extra server flags: ${DETSPEC_E2E_MTP_SERVER_ARGS:-$(python3 -c \
  'import sys; sys.path.insert(0, "test/registered/e2e"); import _e2e; print(_e2e.default_mtp_server_args())')}"

# The tiny models are written once per machine and reused by the following commands; written
# here, before the parallel runs, so no two processes write the same folder. The marker names
# the generator's version: an older set (no tokenizer, no EAGLE3, MiMo or MoE / MLA / FP8 folders, or
# MoE / MLA / FP8 targets whose layer outputs are too small to move the logits, or DeepSeek
# targets narrower than SGLang's fused NEXTN norm takes) is written again.
export DETSPEC_E2E_MODELS=${DETSPEC_E2E_MODELS:-/tmp/detspec-e2e-models}
marker="$DETSPEC_E2E_MODELS/.complete-v6"
[ -f "$marker" ] || { python3 scripts/make_tiny_models.py "$DETSPEC_E2E_MODELS" && touch "$marker"; } || exit 1
touch "$results/.setup-done"  # a second run of this command may start (DETSPEC_E2E_INSTALLED=1)
# A healthy start takes 70-150 s on an H200 (more while many servers start at once). A start that
# hangs costs this once: the harness passes HF_HUB_OFFLINE=ON, which SGLang's helper does not
# retry online as it does "1" (_e2e.server_env).
export DETSPEC_E2E_LAUNCH_TIMEOUT=${DETSPEC_E2E_LAUNCH_TIMEOUT:-300}
limit=$(( budget - ($(date +%s) - t0) - 25 ))
[ $limit -ge 60 ] || { echo "run_e2e_suite: only $limit s left for the tests" >&2; exit 1; }
echo "set-up took $(( $(date +%s) - t0 )) s; each pytest run may take $limit s"
start=$(date +%s)
names=()
for i in "${!files[@]}"; do
  f=${files[$i]}; gpu=${gpus_of[$i]:-${gpus[$(( i % ${#gpus[@]} ))]}}
  name=$(basename "${f%%::*}" .py); names+=("$name")
  mkdir -p "$results/$name"
  echo "$name: GPU $gpu"
  # --show-capture=no: the server output is in the server_*.log files, not repeated in failure reports.
  CUDA_VISIBLE_DEVICES=$gpu DETSPEC_E2E_OUT="$results/$name" timeout -k 5 "$limit" \
    python3 -m pytest -v -p no:cacheprovider --show-capture=no "$f" ${args[@]+"${args[@]}"} \
    > "$results/$name/pytest.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; r=$?
  echo "${names[$i]}: pytest exit $r (all runs up to this one done after $(( $(date +%s) - start )) s)"
  [ $r -eq 0 ] || rc=$r
done
pids=()
for pid_file in "$results"/*/server_*.pid; do  # written by the suite while a server it started runs
  [ -e "$pid_file" ] || continue
  echo "stopping the server left by pytest: $pid_file"
  python3 -c "import sys; from sglang.srt.utils import kill_process_tree; kill_process_tree(int(sys.argv[1]))" \
    "$(cat "$pid_file")" || true
  rm -f "$pid_file"
done
for name in "${names[@]}"; do
  echo "== $name"
  grep -E "(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) +\[|^=+ .*(passed|failed|error|skipped)" \
    "$results/$name/pytest.log" | sed -e 's/^test\/registered\/e2e\///' | tail -n 20
done
# One line per check: the JSON results' verdicts and first problems (summary.json has them all).
python3 - "$results" <<'PY'
import json, pathlib, sys
root = pathlib.Path(sys.argv[1]); rows = []
for path in sorted(root.glob("*/*.json")):
    try:
        data = json.loads(path.read_text())
    except ValueError:
        continue
    if "passed" in data:
        rows.append({"file": f"{path.parent.name}/{path.name}", "passed": data["passed"],
                     "figure_only": data.get("figure_only", False), "problems": data.get("problems", [])[:3]})
(root / "summary.json").write_text(json.dumps(rows, indent=1))
print(f"{sum(r['passed'] for r in rows)} of {len(rows)} result files passed")
for r in rows:
    if not r["passed"]:
        print(f"FAILED {r['file']}: {'; '.join(r['problems'])[:400]}")
PY
exit $rc
