#!/usr/bin/env bash
# The distribution-check experiments of one session, on one machine, collected into a flat folder:
#   bash experiments/distcheck_suite.sh OUT [TARGET_PATH]
# TARGET_PATH defaults to the config's (the PyPI GGUF); on an offline GPU host pass a local .gguf.
# PARTS picks a subset (default: toy real greedy e2e); RESULTS keeps the rows elsewhere than
# OUT/results, so that several calls can add to one results directory.
set -uo pipefail
out=${1:?usage: distcheck_suite.sh OUT [TARGET_PATH]}
target=${2:-}
res=${RESULTS:-$out/results}
parts=" ${PARTS:-toy real greedy e2e} "
mkdir -p "$res"
py=${PYTHON:-python3}
t=()
[ -n "$target" ] && t=("target.path=$target")
log="$out/log.txt"
run() { echo "== $*" | tee -a "$log"; "$py" -m specbench "$@" "results_dir=$res" "${t[@]}" 2>&1 | grep -v -E "it/s\]|Warning" | tee -a "$log"; }

[[ $parts == *" toy "* ]] && run experiment=toy_rules rulecheck.draws=${TOY_DRAWS:-200000}
[[ $parts == *" real "* ]] && run experiment=real_rules dataset.num_prompts=2 rulecheck.positions=4 rulecheck.draws=${REAL_DRAWS:-100000}
[[ $parts == *" greedy "* ]] && run -m experiment=greedy_equality dataset.num_prompts=${GREEDY_PROMPTS:-16} max_new_tokens=${GREEDY_TOKENS:-96}
[[ $parts == *" e2e "* ]] && for rule in "+rule=standard" "+rule=thresholded rule.threshold_acc=0.5"; do
  # shellcheck disable=SC2086
  run +drafter=ngram drafter.min_n=1 $rule temperature=0.7 distcheck=true distcheck_prompts=1 \
      distcheck_samples=${E2E_SAMPLES:-2000} dataset.num_prompts=1 max_new_tokens=16
done
"$py" - "$res" "$out" <<'PY'
import sys, shutil, pathlib
from specbench.analysis import load_results
res, out = map(pathlib.Path, sys.argv[1:])
load_results(res).to_csv(out / "rows.csv", index=False)
for png in (res / "figures").glob("*.png"):
    shutil.copy(png, out / png.name)
PY
