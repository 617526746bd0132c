#!/usr/bin/env bash
# The GPU runs the next session should make, batched into three device calls of < 10 minutes
# (each call: `run` with carry [".whl", ".devdata"], starting with the pip line of README/device).
# Session 2 left these unrun (no device time left): see benchmarks/RESULTS.md and the closing note.
set -u
case "${1:-}" in
  1)  # correctness of everything written after the last GPU run (~3 min), then trees end to end
      python -m pytest -q tests/test_fused_gpu.py tests/test_kernels_gpu.py tests/test_tree_hld_gpu.py \
          -k "not chain_verify_vs_ref and not conv_verify_vs_ref"
      # draft trees in the decode runtime (CUDA graphs; W branches of depth K), chains alongside
      python benchmarks/bench_e2e.py --shapes flame --batches 1,16,64 --ks 2,4 --alphas 0.7,0.8 \
          --snapshot-ks 0 --tree-widths 2,4 --out "$OUT/e2e_trees.jsonl"
      ;;
  2)  # UT kernel: precision / config sweep (why is it 1.5-6x slower?) and HLD lane sweep
      python benchmarks/bench_ut.py --batches 128,1 --Ts 2,5,8 --budget-s 240 --out "$OUT/ut_sweep.json"
      python benchmarks/bench_tree.py --batches 1,8 --sweep-parallel --budget-s 150 --out "$OUT/tree_sweep.json"
      ;;
  3)  # CUDA csrc v2 vs Triton after the next kernel change (JIT needs the CPU op schemas too)
      VLLM_SPECLA_CPP_JIT=1 python -m pytest -q tests/test_csrc.py -k cuda
      VLLM_SPECLA_CPP_JIT=1 python benchmarks/bench_csrc_cuda.py --out "$OUT/csrc_cuda.json"
      ;;
  *) echo "usage: $0 1|2|3 (one device call each)"; exit 2 ;;
esac
