# Sourced from the project root by the GPU machine's smoke scripts, after the wheel install: the kit's
# environment, this working tree installed next to SGLang in /tmp/site (SGLang's plugin loader finds entry
# points through dist-info metadata, not PYTHONPATH), its console scripts on PATH, and $out (OUT, default
# /tmp/detspec-out) created. Returns 1 when the install fails.
. /tmp/e2e/remote/env.sh
out=${OUT:-/tmp/detspec-out}; mkdir -p "$out"
bash scripts/h200/install_plugin.sh || return 1
export PATH=/tmp/site/bin:$PATH
