#!/usr/bin/env bash
# The batched runner on the default model (issue 6, c and d), collected into a flat folder:
#   bash experiments/runner_suite.sh OUT [TARGET_PATH]
# PARTS picks a subset of: synthetic real sampling (default: all three).
#   synthetic  the timing control: acceptance dictated at a = 0.6 .. 0.9, k = 1 .. 8, batch 1
#   real       ngram, ngram_trie, draft_model, layerskip, eagle3 (k = 4 chains) on MT-Bench and
#              HumanEval, batch 1, 8 and 48, temperature 0 and 0.7
#   sampling   draft_model with draft_sample_method greedy and probabilistic, T = 0.7, each job in
#              a process of its own (in one process the second job's peak memory held 0.25 to 0.5
#              GB more than its q accounts for: results/2026-12-03-h200-afternoon)
#   eagle3_b8  eagle3 at batch 8, T = 0.7 alone (a re-run)
#   trees      eagle3 and draft_model (TREE_DRAFTERS) drafting +tree=sglang_5_4_8 (k = 5, topk 4,
#              8 nodes verified) at batch 1, 8 and 48, temperature 0 (TREE_TEMPS)
#   profiles   experiments/round_profile.py (where a round's time goes, phase by phase) on the
#              control (a = 0.8, k = 4), on ngram at MT-Bench batch 48, and on ngram at batch 1
#              and T = 0.7 (the Triton rule's round), into OUT/profiles/NAME.json (round_profile.json;
#              its table goes to the log; the Chrome traces and the job's results folder are dropped)
#   first_job  the same ngram job (MT-Bench, batch 8) twice in one process (seed=0,1: at T = 0 the
#              seed changes only the config hash), under warmup=full and warmup=short, each in a
#              fresh process: whether the first job of a process pays a one-time cost the
#              warm-up leaves in its numbers (2.2 x TPOT under short on an H100, results/2026-12-06-h100)
# TEMPS (default 0,0.7), DRAFTERS (default all five) and REAL_SIZES (default "1,8:16 48:48":
# batch sizes:prompts, a sweep each) narrow `real`; SYN_RATES (default
# "0.6 0.7 0.8 0.9") `synthetic`, whose coins are SYN_COINS (default quasi: the rates realised
# to within 2 %, so that the control times the runner, not the coins' luck); SAMPLING_BATCHES
# (default "1 8 48") `sampling`: a re-run of what a device call's limit cut.
# Sizes: SYN_PROMPTS x SYN_TOKENS (default 4 x 96) for the control; TOKENS new tokens (48) for
# real weights, with 16 prompts at batch 1 and 8 and 48 at batch 48 (every row busy).
# ENGINE_ARGS (default: engine=native engine.compile=true) picks the target's engine.
set -uo pipefail
out=${1:?usage: runner_suite.sh OUT [TARGET_PATH]}
target=${2:-}
res=${RESULTS:-$out/results}
parts=" ${PARTS:-synthetic real sampling} "
tokens=${TOKENS:-48}
mkdir -p "$res" "$out"
py=${PYTHON:-python3}
t=()
[ -n "$target" ] && t=("target.path=$target")
read -r -a engine <<< "${ENGINE_ARGS:-engine=native engine.compile=true}"
log="$out/log.txt"
quiet() { grep -v -E "it/s\]|Warning|warn\(" | tee -a "$log"; }
# OUT/rows.csv after every sweep, so that a call cut by its time limit still brings back the rows
# so far (the results folder itself is too deep for a device call to fetch)
# (collect RES CSV: the rows under RES into CSV, in the order they were written)
collect() {
  "$py" - "${1:-$res}" "${2:-$out/rows.csv}" <<'PY'
import sys
from specbench.analysis import load_results
rows = load_results(sys.argv[1])
(rows.sort_values("timestamp") if "timestamp" in rows else rows).to_csv(sys.argv[2], index=False)  # none yet: empty
PY
}
# A sweep runs in the background and is waited for, so that a TERM (timeout's) reaches the trap
# at once: it stops the sweep, and the rows of the jobs that ended are still collected.
run() {
  echo "== $*" | tee -a "$log"
  "$py" -m specbench "$@" "${engine[@]}" "results_dir=$res" "${t[@]}" 2>&1 | quiet &
  wait $!
  collect
}
stop() { kill $(jobs -p) 2>/dev/null; wait; collect; exit 143; }
trap stop TERM INT
# The prompt sets must resolve before any job starts: on an offline host every job fails on its
# fetch (72 failed jobs spent three device calls on 2026-12-05).
"$py" -m specbench.datasets mt_bench humaneval > /dev/null || exit 2  # offline: experiments/carry_datasets.sh

if [[ $parts == *" synthetic "* ]]; then
  # one process for every rate ([0.6],[0.7],...: Hydra sweeps the one-rate lists)
  rates=$(printf '[%s],' ${SYN_RATES:-0.6 0.7 0.8 0.9})
  run -m +drafter=synthetic "drafter.acceptance_rates=${rates%,}" drafter.coins="${SYN_COINS:-quasi}" k=1,2,3,4,5,6,7,8 \
      dataset.num_prompts="${SYN_PROMPTS:-4}" max_new_tokens="${SYN_TOKENS:-96}"
fi
real() {  # $1: batch sizes, $2: prompts, then extra overrides
  local batches=$1 prompts=$2
  shift 2
  run -m "$@" k=4 dataset=mt_bench,humaneval batch_size="$batches" dataset.num_prompts="$prompts" max_new_tokens="$tokens"
}
drafters=${DRAFTERS:-ngram,ngram_trie,draft_model,layerskip,eagle3}
temps=${TEMPS:-0,0.7}
if [[ $parts == *" real "* ]]; then
  # Every drafter in one sweep (one process): a process costs 30 to 50 s to start and compile,
  # a job after the first 10 to 15 s. Each job writes its rows as it ends; `collect` below
  # gathers them however the script ends.
  for size in ${REAL_SIZES:-1,8:16 48:48}; do  # batch sizes:prompts, one sweep each
    real "${size%:*}" "${size#*:}" +drafter="$drafters" temperature="$temps"
  done
fi
if [[ $parts == *" eagle3_b8 "* ]]; then
  real 8 16 +drafter=eagle3 temperature=0.7
fi
if [[ $parts == *" trees "* ]]; then
  trees() {  # $1: batch sizes, $2: prompts
    run -m +drafter="${TREE_DRAFTERS:-eagle3,draft_model}" +tree=sglang_5_4_8 temperature="${TREE_TEMPS:-0}" \
        dataset=mt_bench,humaneval batch_size="$1" dataset.num_prompts="$2" max_new_tokens="$tokens"
  }
  trees 1,8 16
  trees 48 48
fi
if [[ $parts == *" profiles "* ]]; then
  profile() {  # $1: the name, then the job's overrides
    local name=$1
    shift
    echo "== profile $name $*" | tee -a "$log"
    "$py" "$(dirname "$0")/round_profile.py" "$out/profiles/$name" "$@" "${engine[@]}" "${t[@]}" 2>&1 | quiet
    # the traces are too big to fetch, and a device call brings back files two folders deep at most:
    # OUT/x/profiles/NAME.json comes back, OUT/x/profiles/NAME/round_profile.json did not (2026-12-06)
    mv "$out/profiles/$name/round_profile.json" "$out/profiles/$name.json" 2> /dev/null  # none if the job failed (see the log)
    rm -rf "${out:?}/profiles/$name"
  }
  profile synthetic +drafter=synthetic "drafter.acceptance_rates=[0.8]" drafter.coins=quasi k=4 dataset.num_prompts=2 max_new_tokens=96
  # its drafting took 27.7 ms a round on an H100 at 1d7f320 (the torch search's padding), 0.24 ms at 4e92ceb
  profile ngram_mt_bench_b48 +drafter=ngram k=4 batch_size=48 dataset=mt_bench dataset.num_prompts=48 max_new_tokens=48
  # other_ms 0.37 ms a round at batch 1 with the Triton rule at a92c409, 0.05 at T = 0 (results/2026-12-06-h100)
  profile ngram_mt_bench_t07 +drafter=ngram k=4 temperature=0.7 dataset=mt_bench dataset.num_prompts=4 max_new_tokens=48
fi
if [[ $parts == *" first_job "* ]]; then
  for warmup in full short; do  # each its own process, and its own results (the baseline computed in job 1)
    first_res="$res/first_job_$warmup"
    echo "== first_job warmup=$warmup" | tee -a "$log"
    "$py" -m specbench -m +drafter=ngram k=4 batch_size=8 dataset=mt_bench dataset.num_prompts=16 \
        max_new_tokens="$tokens" seed=0,1 warmup="$warmup" "${engine[@]}" "results_dir=$first_res" "${t[@]}" 2>&1 | quiet &
    wait $!
    collect "$first_res" "$out/first_job_$warmup.csv"
  done
fi
if [[ $parts == *" sampling "* ]]; then
  for dataset in mt_bench humaneval; do
    for b in ${SAMPLING_BATCHES:-1 8 48}; do
      for method in greedy probabilistic; do  # one job a process: peak memory starts clean
        run +drafter=draft_model drafter.draft_sample_method="$method" temperature=0.7 k=4 dataset="$dataset" \
            batch_size="$b" dataset.num_prompts="$([ "$b" = 48 ] && echo 48 || echo 16)" max_new_tokens="$tokens"
      done
    done
  done
fi
