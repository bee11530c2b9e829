#!/usr/bin/env bash
# On the GPU machine after the wheel install: one command of the serving benchmark (models
# written unless present, servers, bench_serving at concurrency 1/8/32/128 with repetitions,
# profile, report). Results land in $OUT (default /tmp/detspec-serving), also packed into
# $ARCHIVE when set; extra arguments go to serving_run.py, e.g. --configs bd --profile d, or
# --breakdown (GPU time per step by kernel class) or --interleave (at most three servers, rounds
# in alternating order with equal prompt counts: paired ratios to (a), (b), (g)), or both on the
# same servers (--breakdown --interleave: the breakdown first).
# At the end the machine paths in $OUT become placeholders (scripts/neutral_paths.py).
# A 600 s command holds (b) and one or two more configurations (scripts/h200/README.md);
# serving_report.py OUT1 OUT2 ... --out DIR merges several commands into one report.
#   COMMAND_LIMIT_S=590 bash benchmark/serving/run_h200.sh --configs bd --profile d
set -uo pipefail
out=$(realpath -m "${OUT:-/tmp/detspec-serving}"); mkdir -p "$out"
archive=${ARCHIVE:+$(realpath -m "$ARCHIVE")}  # taken relative to the caller's folder, before the cd
cd "$(dirname "$0")/../.."
# The wheel kit's environment (scripts/h200/README.md); elsewhere run serving_run.py directly.
[ -f /tmp/e2e/remote/env.sh ] || { echo "run_h200.sh: needs the H200 wheel kit (/tmp/e2e/remote/env.sh); on a machine with SGLang installed run: python benchmark/serving/serving_run.py --out OUT --models DIR" >&2; exit 2; }
. /tmp/e2e/remote/env.sh
bash scripts/h200/install_plugin.sh "$out/pip.log" || exit 1
# py-spy for --host-profile (serving_host.py), when the kit carries its wheel.
export PATH=/tmp/site/bin:$PATH
bash scripts/h200/install_py_spy.sh || echo "run_h200.sh: py-spy not installed; --host-profile cells will be listed as missing" >&2
# Budget: the caller's limit minus install time minus a margin for the final report.
budget=${BUDGET_S:-$(( ${COMMAND_LIMIT_S:-590} - SECONDS - 20 ))}
timeout -k 10 $(( budget + 15 )) python3 benchmark/serving/serving_run.py --out "$out" --models "${MODELS:-/tmp/detspec-serving-models}" \
  --budget-s "$budget" "$@"
rc=$?
# Results that end up in docs/ name no machine folders (interpreter, site-packages, this folder).
python3 scripts/neutral_paths.py --results "$out" "$out" || echo "run_h200.sh: machine paths left in $out" >&2
# ARCHIVE: everything in the result folder packed into one file (for a caller that fetches few files).
if [ -n "$archive" ]; then tar czf "$archive" -C "$(dirname "$out")" "$(basename "$out")"; fi
tail -n 5 "$out/serving.md" 2>/dev/null
head -n 40 "$out/breakdown.md" 2>/dev/null
cat "$out"/profile_*.txt 2>/dev/null | head -n 12
head -n 60 "$out/host.md" 2>/dev/null
head -n 80 "$out/window.md" 2>/dev/null
exit $rc
