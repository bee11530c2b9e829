#!/usr/bin/env bash
# Installs this working tree next to SGLang in /tmp/site (SGLang's plugin loader finds entry points through
# dist-info metadata, not PYTHONPATH) and stamps the install with the tree's revision, which result files record
# (sglang_detspec/revision.py: an empty stamp, so null, where the tree has none). Run from the project root after
# the kit's env.sh. With LOG, pip's output goes there (its tail is printed when the install fails). Exit 1 when
# the install fails; a missing revision only warns.
#
#   bash scripts/h200/install_plugin.sh [LOG]
log=${1:-}
if [ -n "$log" ]; then
  python3 -m pip install -q --no-deps --no-index --no-build-isolation --upgrade --target /tmp/site . > "$log" 2>&1 \
    || { tail -n 20 "$log"; exit 1; }
else
  python3 -m pip install -q --no-deps --no-index --no-build-isolation --upgrade --target /tmp/site . || exit 1
fi
python3 -m sglang_detspec.revision --stamp-install /tmp/site/sglang_detspec --root . > /dev/null \
  || echo "install_plugin: no revision stamped (send .revision along, scripts/h200/README.md): results record null" >&2
exit 0
