#!/usr/bin/env bash
# On the GPU machine after the wheel install: py-spy's binary from the kit's wheel (.e2e/tools/,
# copied to /tmp/e2e/tools/) into /tmp/site/bin (callers put it on PATH). Only the binary is
# needed. A kit without the wheel installs nothing (callers check `command -v py-spy`).
set -euo pipefail
command -v py-spy >/dev/null && exit 0
for w in /tmp/e2e/tools/py_spy-*.whl; do
  [ -e "$w" ] || continue
  mkdir -p /tmp/site/bin
  python3 - "$w" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/py-spy"))
    with open("/tmp/site/bin/py-spy", "wb") as f:
        f.write(z.read(name))
os.chmod("/tmp/site/bin/py-spy", 0o755)
PY
done
