#!/usr/bin/env bash
# GPU runs for the next session, batched into device calls of < 10 minutes (each call: `run` with
# carry [".whl", ".devdata"], starting with the pip line of README/device). State after session 3:
# benchmarks/RESULTS.md "Session 3".
set -u
case "${1:-}" in
  1)  # correctness of the dispatch paths, then the full e2e grid with the CUDA csrc + UT dispatch
      export VLLM_SPECLA_CPP_JIT=1
      python -m pytest -q tests/test_csrc.py -k cuda
      python -m pytest -q tests/test_kernel_ut_gpu.py tests/test_kernels_gpu.py tests/test_dispatch.py
      python benchmarks/bench_e2e.py --shapes flame,map --auto --snapshot-ks 4 --cuda-csrc --tag s4 \
          --out "$OUT/e2e_s4.jsonl"
      ;;
  2)  # kernel table with the new defaults (UT v5 sweep at B = 32 too), trees incl. UT, commit ratios
      python benchmarks/bench_ut.py --batches 128,32,256 --Ts 2,5,8,9 --budget-s 200 --out "$OUT/ut_s4.json"
      python benchmarks/bench_tree.py --batches 1,4,8,32,128 --nodes 8,16 --budget-s 120 --out "$OUT/tree_s4.json"
      VLLM_SPECLA_CPP_JIT=1 python benchmarks/bench_commit_cuda.py --impls cuda,triton,ut --out "$OUT/commit_s4.json"
      ;;
  *) echo "usage: $0 1|2 (one device call each)"; exit 2 ;;
esac
