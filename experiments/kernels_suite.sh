#!/usr/bin/env bash
# The GPU checks of engine.kernels (issue 6) in one device call, no model to carry:
#   bash experiments/kernels_suite.sh OUT
# tests      the kernels' test files whole on CUDA: attention (bf16 bit-identical caches, compile +
#            CUDA graph replay), gemv (bf16 at 1 to 48 rows); each autotuner over a few of its tiles
#            (tests/conftest.py's few_tiles)
# graphs     the other tests that skip without CUDA: the engine against transformers with the kernels
#            in CUDA graphs (and PDL), a sampled round's graphs against eager calls, the drafters'
#            graphs against eager rounds
# engine     engine_bench --parts a,b,m --kernels: decode at batch 1 with and without the kernels
#            (and without PDL) side by side, transformers' compiled step, generate; t(q), batch 48
# attention  kernel_bench --kernels attention,attention_tiles: one 8B layer against the engine's
#            torch path, and at batch 1 over BLOCK_M 16, 32, 64 and 4 or 8 warps
# fused      engine_bench --parts fused: matmul, PyTorch's fused and the kernel attention over batches
# profile    decode_profile --q Q (default 9): each projection alone with its folds at 1 and 9 rows,
#            and the profiler's kernel table of a verify forward of Q positions, kernels or not
# ab         gemv_ab.py: each projection at 1, 2, 4, 9, 16 rows and the forward at q = 1, 9 with the
#            gemv module BASELINE (e.g. specbench.kernels._gemv_base after
#            `git show SHA:kernels/gemv.py > kernels/_gemv_base.py`) and the current one, alternated
# wide       engine_bench --parts b --kernels --qs 1,9,16,17,24,33,48 --b-max-rows 16,64: goal b's pair
#            at context 512 and 4096, and past 16 positions the rows kernel (the default to 33) beside
#            torch's projections (gemv.max_rows(16)) and the rows kernel to 64 rows
# norm       kernel_bench --kernels norm: a forward's 65 norms past 16 rows in one CUDA graph,
#            gemv.norm_rows against torch's rms_norm (no autotuning: seconds)
# smollm2    engine_bench --shape smollm2 --parts a,b --kernels --b-without-kernels: the default
#            model's shape (random weights, no carry), decode and t(q) with the kernels and without
# ncu        Nsight Compute over gemv_ncu.py (tuned first, outside it): each projection once at 1 row,
#            9 rows (split K where tuned) and 9 rows unsplit; speed of light, memory, occupancy, warp
#            stalls (OUT/ncu.log)
# PARTS picks a subset (default: tests graphs engine attention fused profile, in that order); each part's log is OUT/<part>.log.
# TINY=1 passes --tiny to the benchmarks (a CPU check of the script, not a measurement).
set -uo pipefail
out=${1:?usage: kernels_suite.sh OUT}
parts=" ${PARTS:-tests graphs engine attention fused profile} "
py=${PYTHON:-python3}
tiny=()
[ -n "${TINY:-}" ] && tiny=(--tiny)
mkdir -p "$out"
# Autotuning results kept on disk (~/.triton/cache): the parts run in separate processes, and on a
# fresh machine tuning the rows kernel per shape took most of a call (results/2026-12-04-h200).
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
step() { local name=$1; shift; echo "== $name: $*"; "$@" > "$out/$name.log" 2>&1; echo "   exit $?"; tail -n 15 "$out/$name.log"; }
# pytest -v, unbuffered: each test's line reaches the log as it ends, so a cut call shows how far it got
[[ $parts == *" tests "* ]] && PYTHONUNBUFFERED=1 step tests "$py" -m pytest -v -rs --durations=15 \
    tests/test_attention.py tests/test_gemv.py
[[ $parts == *" graphs "* ]] && PYTHONUNBUFFERED=1 step graphs "$py" -m pytest -v -rs --durations=15 \
    tests/test_engines.py::test_attention_kernel_in_the_engine tests/test_engines.py::test_all_kernels_in_cuda_graphs_match_transformers \
    tests/test_sampled.py::test_cuda_graphs_draw_what_eager_calls_draw \
    tests/test_graphs.py::test_eagle_rounds_through_cuda_graphs_draft_what_eager_rounds_draft \
    tests/test_graphs.py::test_draft_model_greedy_chains_through_cuda_graphs_draft_what_eager_chains_draft
[[ $parts == *" engine "* ]] && step engine "$py" experiments/engine_bench.py "$out/engine" --parts a,b,m --kernels "${tiny[@]}"
[[ $parts == *" attention "* ]] && step attention "$py" experiments/kernel_bench.py "$out/attention" --kernels attention,attention_tiles \
    "${tiny[@]}"
[[ $parts == *" fused "* ]] && step fused "$py" experiments/engine_bench.py "$out/fused" --parts fused "${tiny[@]}"
[[ $parts == *" profile "* ]] && step profile "$py" experiments/decode_profile.py "$out/profile" --q "${Q:-9}" \
    --variants eager_kernels,eager_kernels_pdl,eager,layer "${tiny[@]}"
[[ $parts == *" ab "* ]] && step ab "$py" experiments/gemv_ab.py "$out/ab" --baseline "${BASELINE:?PARTS=ab needs BASELINE}" \
    "${tiny[@]}"
[[ $parts == *" wide "* ]] && step wide "$py" experiments/engine_bench.py "$out/wide" --parts b --kernels \
    --qs 1,9,16,17,24,33,48 --b-max-rows 16,64 "${tiny[@]}"
[[ $parts == *" norm "* ]] && step norm "$py" experiments/kernel_bench.py "$out/norm" --kernels norm "${tiny[@]}"
[[ $parts == *" smollm2 "* ]] && step smollm2 "$py" experiments/engine_bench.py "$out/smollm2" --shape smollm2 \
    --parts a,b --kernels --b-without-kernels --qs 1,2,3,4,5,9,16 "${tiny[@]}"
# ncu: gemv_ncu once outside the profiler first, so that its tuning is cached on disk: tuning
# under ncu ran past a call's limit; tuned beforehand, ncu's full set over its 12 launches took 41 s
# (results/2026-12-07-h100-ncu)
[[ $parts == *" ncu "* ]] && step ncu_tune "$py" experiments/gemv_ncu.py
[[ $parts == *" ncu "* ]] && step ncu ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
    "$py" experiments/gemv_ncu.py
exit 0
