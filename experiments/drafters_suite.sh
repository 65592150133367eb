#!/usr/bin/env bash
# The drafters and trees on the default model, collected into a flat folder:
#   bash experiments/drafters_suite.sh OUT [TARGET_PATH]
# PARTS picks a subset of: train chains trees e2e (default: chains trees e2e).
#   train   trains the shipped drafts into specbench/checkpoints/smollm2_135m/ (GPU: minutes)
#   chains  every drafter, k = 4 chains, MT-Bench and HumanEval, temperature 0 and 0.7
#   trees   the model drafters and ngram_trie under SGLang's (5, 4, 8) and (3, 1, 4)
#   e2e     the end-to-end distribution check with the distilled draft model (standard and a lossy rule)
# PROMPTS and TOKENS size the decode runs (default 8 prompts x 96 tokens); RESULTS keeps the
# rows elsewhere than OUT/results. TPOT here is the hf engine's (overhead-bound, issue 6).
set -uo pipefail
out=${1:?usage: drafters_suite.sh OUT [TARGET_PATH]}
target=${2:-}
res=${RESULTS:-$out/results}
parts=" ${PARTS:-chains trees e2e} "
prompts=${PROMPTS:-8}
tokens=${TOKENS:-96}
mkdir -p "$res"
py=${PYTHON:-python3}
t=()
[ -n "$target" ] && t=("target.path=$target")
log="$out/log.txt"
quiet() { grep -v -E "it/s\]|Warning|warn\(" | tee -a "$log"; }
run() { echo "== $*" | tee -a "$log"; "$py" -m specbench "$@" "results_dir=$res" "${t[@]}" 2>&1 | quiet; }
ckpt=specbench/checkpoints/smollm2_135m

if [[ $parts == *" train "* ]]; then
  for d in draft_model eagle3; do
    echo "== train $d" | tee -a "$log"
    "$py" -m specbench.train drafter=$d out=$ckpt/$d "${t[@]}" ${TRAIN_ARGS:-} 2>&1 | quiet
  done
fi
size="dataset.num_prompts=$prompts max_new_tokens=$tokens"
if [[ $parts == *" chains "* ]]; then
  # shellcheck disable=SC2086
  run -m +drafter=ngram,ngram_trie,draft_model,layerskip,eagle3 k=4 dataset=mt_bench,humaneval temperature=0,0.7 $size
fi
if [[ $parts == *" trees "* ]]; then
  # shellcheck disable=SC2086
  run -m +drafter=ngram_trie,draft_model,layerskip,eagle3 +tree=sglang_5_4_8,sglang_3_1_4 dataset=mt_bench,humaneval $size
fi
if [[ $parts == *" e2e "* ]]; then
  for rule in "+rule=standard drafter.draft_sample_method=probabilistic" "+rule=thresholded rule.threshold_acc=0.5"; do
    # shellcheck disable=SC2086
    run +drafter=draft_model $rule temperature=0.7 distcheck=true distcheck_prompts=1 \
        distcheck_samples=${E2E_SAMPLES:-2000} dataset.num_prompts=1 max_new_tokens=16
  done
fi
"$py" - "$res" "$out" <<'PY'
import sys, pathlib
from specbench.analysis import load_results
res, out = map(pathlib.Path, sys.argv[1:])
load_results(res).to_csv(out / "rows.csv", index=False)
PY
