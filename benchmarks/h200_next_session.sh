#!/usr/bin/env bash
# The GPU cases of every session, one device call each (< 10 minutes), run in the repository root on the device:
#   python3 -m pip install -q --no-index --no-deps --target "$HOME/fla" .whl/*.whl && export PYTHONPATH=$HOME/fla:$PWD
#   export PYTHONUNBUFFERED=1 VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16; bash benchmarks/h200_next_session.sh CASE
# where .whl holds fla's wheels (`pip download --no-deps flash-linear-attention==0.6.0 fla-core==0.6.0 einops`) and
# .devdata the trained model's data, carried for the cases that use them. Each case's comment says what it measures,
# on which card, and its timeouts; cases marked "as run" kept their session's commands, and the history at the end of
# this file says which of them no longer run as written. Results: benchmarks/RESULTS.md, one section per session.
#
# NEXT, on an H200 (issue 5's and 6's verdicts; an H100 adds nothing new): s49a, the short form (~390 s: both CUDA
# kernels built, recover with PDL on / off, issue 6's batch-1 rows); with more time s37g (issue 6's batch-1 rows at
# the precheck default) and s48d (recover with PDL: issue 5's 8x256x256 batch-32 recover, 4.44x before PDL), then
# s43b (issue 5's tables) and s47a (the precheck's A/B). With only ~4 minutes left: s51a (recover's PDL on / off).
# On any card: nothing queued. Session 53 (an H100): s52a, s53b (its four timed-out scripts again) and s53c (cut at
# 150 s of the last device time, no failure; the core-model packing it checked was reverted after it).
set -u
S='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r.get("alpha"),r.get("tree_width"),r.get("draft_vocab"),r.get("draft_weights"),round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows"),r.get("tag"),r.get("policy")) for r in map(json.loads,sys.stdin)]'
# the session-15+ skinny GEMM calls: its JIT build, and a GPU test run kept whole under $OUT (s15a's pytest crash was
# cut from the tail of the output)
skinny_build() {  # [TIMEOUT]
  export MAX_JOBS=16
  timeout "${1:-240}" python -c "from vllm_specla.ops import _cpp; print('skinny built', _cpp.load_cuda_gemm())" 2>&1 | tail -3
}
pytest_log() {  # NAME TIMEOUT PYTEST_ARGS...
  local name=$1 t=$2
  shift 2
  timeout "$t" python -X faulthandler -m pytest -q "$@" > "$OUT/pytest_$name.txt" 2>&1
  echo "pytest rc $?"
  grep -E "passed|failed|error|Error|Fatal|File .*test_" "$OUT/pytest_$name.txt" | head -12
}
csrc_ratios() {  # JSON of bench_csrc_cuda.py -> per configuration: Triton us, then each CUDA column's us / ratio
  python -c 'import sys,json
for r in json.load(open(sys.argv[1])):
  print(r["shape"], r["batch"], r["T"], r["kind"], "triton %.2f" % r["triton_us"],
        " ".join("%s %.2f/%.3f" % (k[5:-3] or "dflt", r[k], r.get(k[:-3] + "_over_triton", 0)) for k in r if k.startswith("cuda") and k.endswith("_us")))' "$1"
}
ncu_ar_cold() {  # NAME BATCH METRICS [RG_AR]: Nsight Compute (caches flushed) of one-token AR, CUDA against Triton,
  # the chosen metrics appended to $OUT/ncu_NAME.txt (RG_AR unset: the binding's default)
  local name=$1 b=$2 metrics=$3 ar=${4:-}
  echo "== cold, rg_ar ${ar:-default}, batch $b" | tee -a "$OUT/ncu_$name.txt"
  VLLM_SPECLA_CUDA_RG_AR=$ar timeout 60 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 \
      --section SpeedOfLight --section LaunchStats --section Occupancy -o "$OUT/ncu_$name" -f \
      python benchmarks/ncu_chain.py --ar --batch "$b" 2>&1 | tail -1
  ncu -i "$OUT/ncu_$name.ncu-rep" --page details --csv > "$OUT/ncu_${name}_details.csv" 2>&1
  python benchmarks/ncu_details.py "$OUT/ncu_${name}_details.csv" --metrics "$metrics" | tee -a "$OUT/ncu_$name.txt"
  rm -f "$OUT/ncu_$name.ncu-rep" "$OUT/ncu_${name}_details.csv"
}
# s48d / s49a: `python -c "$RP" on|off SCRIPT ARGS...` runs SCRIPT with recover's PDL as it is (on) or stubbed off in
# triton_recover only
RP='import runpy, sys, types
from vllm_specla.ops import triton_recover as tr
if sys.argv[1] == "off":
    tr._pdl = types.SimpleNamespace(enabled=lambda t: False, launch_kw=lambda on: {})
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")'
case "${1:-}" in
  s48f)  # (as run on an H100 in session 48: slower at every config, removed, commit 9189880 keeps it; its 3-entry configs
        # now raise) the recover kernel in the one-token chain kernel's [BV, K/KI, KI]
        # tile layout (s48e: at full clocks recover moved a one-token launch's DRAM bytes in 5-10 % more time; the
        # layout and its loop are what differ): its GPU tests, then BV/warps/KI configs (4/1/16: ar_large's) beside A
        # replay launches at batch 32 / 128, the default 8/2 first and last (timeouts 120 + 300 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s48f 120 tests/test_kernels_gpu.py -k "recover or every_accepted"
      timeout 300 python benchmarks/bench_kernels.py --batches 32,128 --Ts "" --budget-s 280 \
          --recover-configs 8/2,4/1/16,4/1/32,4/1/64,8/1/16,8/1/32,8/2/16,8/2/32,16/2/16,8/2 \
          --json "$OUT/kernels_s48f.json" 2>&1 | grep -E "^recover|^GPU|Error" | cut -c1-3000
      ;;
  s48e)  # (any card) s48c without flushing the caches: does the replay baseline's launches, passing over the same state
        # back to back, read part of it from L2 (the graph-timed gap between recover and one launch)? Application replay
        # (each metric pass reruns the script, so each launch sees the caches its predecessors left), DRAM bytes read /
        # written, L2 hit rate and duration of one recover (A = 5) and the 5 one-token launches after it, batch 32, both
        # shapes (state 67 / 101 MB against a 50 MB L2) (timeouts 2 x 200 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      for SH in 8x256x256 6x256x512; do
        echo "== $SH batch 32"
        timeout 200 ncu --kernel-name regex:"_recover_kernel|_chain_verify" --launch-skip 12 --launch-count 6 \
            --replay-mode application --cache-control none --clock-control none \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
            --csv --page raw python benchmarks/ncu_recover.py --shape $SH --batch 32 --A 5 > "$OUT/ncu_s48e_$SH.csv" 2>&1
        python -c 'import csv, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith("\"")))
for r in rows[1:]:
    print(r["Kernel Name"][:16], " ".join("%s %s" % (k.split("__")[1], r[k]) for k in r if k.startswith(("gpu__", "dram__", "lts__"))))' \
            "$OUT/ncu_s48e_$SH.csv"
      done
      ;;
  s52a)  # (as run on an H100 in session 53: bench_kernels, bench_conv, bench_norms and bench_prefill hit their
        # timeouts, s53b reran them; only 8 of its files came back, the device returns at most 8) (any card) the
        # GPU-only benchmark scripts once each at small sizes after session 52 moved their flag checks
        # to benchmarks/_flags.py (CI runs only their flag errors): Triton / cuBLAS paths, nothing built
        # (VLLM_SPECLA_CUDA_KERNELS=0), fla from PYTHONPATH; each prints its last lines (timeouts sum to 455 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      export VLLM_SPECLA_CUDA_KERNELS=0
      run1() {  # TIMEOUT SCRIPT ARGS...
        local t=$1 s=$2; shift 2
        echo "== $s $*"; timeout "$t" python "benchmarks/$s" "$@" > "$OUT/s52a_${s%.py}.txt" 2>&1
        echo "rc $?"; grep -v "^\s*$" "$OUT/s52a_${s%.py}.txt" | tail -3 | cut -c1-300
      }
      run1 45 bench_kernels.py --shapes 8x256x256 --batches 8 --Ts 1,5 --budget-s 30 --recover-configs 8/2 \
          --json "$OUT/s52a_kernels.json"
      run1 45 bench_tree.py --shapes 8x256x256 --batches 1 --nodes 16 --trees binary --budget-s 30 \
          --out "$OUT/s52a_tree.json"
      run1 60 bench_ut.py --shapes 8x256x256 --batches 8 --Ts 1,5 --replay-Ts 5 --no-sweep --no-accuracy --impls ut \
          --kinds verify,step --budget-s 40 --out "$OUT/s52a_ut.json"
      run1 30 bench_commit_cuda.py --impls triton --batches 32 --replays 4 --out "$OUT/s52a_commit.json"
      run1 30 bench_conv.py --batches 8 --layers 4 --out "$OUT/s52a_conv.json"
      run1 30 bench_norms.py --rows 64 --heads 8x256 --layers 4 --out "$OUT/s52a_norms.json"
      run1 60 bench_e2e.py --shapes flame --batches 1 --ks 4 --alphas 0.8 --snapshot-ks "" --steps 8 \
          --no-cuda-csrc --out "$OUT/s52a_e2e.jsonl"
      run1 40 step_breakdown.py --shapes tiny --batches 2 --modes ar,specla --steps 2 --no-cuda-csrc \
          --out "$OUT/s52a_step.json"
      run1 30 ar_breakdown.py --shape tiny --batches 1 --out "$OUT/s52a_ar.jsonl"
      run1 30 bench_prefill.py --shapes map --rows 1 --lens 512 --iters 1 --out "$OUT/s52a_prefill.json"
      run1 25 bench_fp8_gemv.py --shapes flame --modes bf16,fp8 --passes 2 --replays 2 --out "$OUT/s52a_fp8.jsonl"
      run1 30 bench_blas.py --shapes flame --ms 1 --settings default,cublas --layers 2 --out "$OUT/s52a_blas.json"
      ;;
  s53c)  # (as run on an H100 in session 53, with the pytest timeout at 150 s) (any card) after session 53 packed the core GDN model's projections (models/gdn.py PackedProjections) and
        # refused other model types in load_fla_checkpoint: the GPU tests of the files that build that model on CUDA
        # (Triton / cuBLAS, nothing built; timeout 280 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      export VLLM_SPECLA_CUDA_KERNELS=0
      pytest_log s53c 280 -x tests/test_decode_runtime_gpu.py tests/test_fused_gpu.py tests/test_prefill_gpu.py
      ;;
  s53b)  # (as run on a warm H100 in session 53) s52a's four timed-out scripts again with longer timeouts (45-75 s;
        # the C++ CPU ops already built): bench_prefill still printed no row in 75 s
      export VLLM_SPECLA_CUDA_KERNELS=0
      for c in "60 bench_conv.py --batches 8 --layers 4 --out $OUT/conv.json" \
               "60 bench_kernels.py --shapes 8x256x256 --batches 8 --Ts 1,5 --budget-s 40 --json $OUT/kernels.json" \
               "75 bench_prefill.py --shapes map --rows 1 --lens 256 --iters 1 --out $OUT/prefill.json" \
               "45 bench_norms.py --rows 64 --heads 8x256 --layers 4 --out $OUT/norms.json"; do
        set -- $c; t=$1; shift; echo "== $*"
        timeout "$t" python benchmarks/"$@" 2>&1 | grep -v "^\s*$" | tail -6 | cut -c1-250; echo "rc ${PIPESTATUS[0]}"
      done
      ;;
  s51a)  # (an H200 only: it exits at once on another card) the shortest verdict for ~4 minutes of device time left:
        # recover with PDL on and off only (issue 5's 8x256x256 batch-32 recover row: 4.44x in session 46, before PDL;
        # Triton, nothing built) (timeouts 2 x 50 = 100 s)
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
      for P in on off; do
        echo "== recover PDL $P"
        timeout 50 python -c "$RP" $P benchmarks/bench_kernels.py --batches 32,128 --Ts "" --budget-s 45 \
            --recover-configs 8/2 --json "$OUT/kernels_s51a_$P.json" 2>&1 | grep -E "^recover|^GPU|Error" | cut -c1-600
      done
      ;;
  s49a)  # (an H200 only: it exits at once on another card) the short form of s48d and s37g for a session with ~8
        # minutes of device time left: both CUDA kernels built (as a user's first start), recover with PDL on and off
        # (issue 5's 8x256x256 batch-32 recover row: 4.44x in session 46, before PDL), then issue 6's batch-1 rows
        # once at the precheck default, as s37g's runs (timeouts 200 + 2 x 50 + 90 = 390 s)
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
      timeout 200 python -c "from vllm_specla.ops import _cpp; print('built', _cpp.load_cuda_kernels())" 2>&1 | tail -1
      for P in on off; do
        echo "== recover PDL $P"
        timeout 50 python -c "$RP" $P benchmarks/bench_kernels.py --batches 32,128 --Ts "" --budget-s 45 \
            --recover-configs 8/2 --json "$OUT/kernels_s49a_$P.json" 2>&1 | grep -E "^recover|^GPU|Error" | cut -c1-600
      done
      timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 --alphas 0.8 \
          --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s49a" \
          --out "$OUT/e2e_s49a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s48d)  # (any card; an H200 for issue 5's verdicts) the commit kernels (recover, conv_commit) with programmatic
        # dependent launch (session 48: s48c's Nsight Compute put one recover launch at one one-token launch's time, while
        # in 21-launch graphs recover took ~3 us more: the one-token chain kernel launches with PDL, recover did not).
        # Their GPU tests and the PDL graph test; then recover vs replay (bench_kernels, 8/2, A = 3 / 5 / 8) and issue
        # 5's fused / sep / step table (bench_commit_cuda, CUDA verify) with recover's PDL on and off (off: ops/pdl.py
        # stubbed in triton_recover only, through runpy) (timeouts 120 + 150 + 2 x 50 + 2 x 90 = 550 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s48d 120 tests/test_fused_gpu.py tests/test_kernels_gpu.py -k "pdl or recover or commit or every_accepted"
      timeout 150 python -c "from vllm_specla.ops import _cpp; print('csrc', _cpp.load_cuda())" 2>&1 | tail -1
      for P in on off; do
        echo "== recover PDL $P"
        timeout 50 python -c "$RP" $P benchmarks/bench_kernels.py --batches 32,128 --Ts "" --budget-s 45 \
            --recover-configs 8/2 --json "$OUT/kernels_s48d_$P.json" 2>&1 | grep -E "^recover|^GPU|Error" | cut -c1-600
      done
      for P in on off; do
        echo "== recover PDL $P"
        timeout 90 python -c "$RP" $P benchmarks/bench_commit_cuda.py --impls cuda --batches 32,128 --replays 20 \
            --out "$OUT/commit_s48d_$P.json" 2>&1 | tail -9
      done
      ;;
  s48c)  # (any card) what the recover kernel waits on (sessions 45-48: every cheaper fold was slower): Nsight Compute of
        # one recover (A = 5, the default 8/2) and the 5 one-token launches of the replay baseline on the same state,
        # 8x256x256 batch 32 (issue 5's miss) then 6x256x512 batch 32, caches flushed (ncu's default); the details
        # page's headline metrics and the raw page's warp-stall ratios (timeouts 2 x 150 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      for SH in 8x256x256 6x256x512; do
        echo "== $SH batch 32"
        timeout 150 ncu --kernel-name regex:"_recover_kernel|_chain_verify" --launch-skip 12 --launch-count 6 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
            --section WarpStateStats --section SchedulerStats -o "$OUT/ncu_s48c_$SH" -f \
            python benchmarks/ncu_recover.py --shape $SH --batch 32 --A 5 2>&1 | tail -2
        ncu -i "$OUT/ncu_s48c_$SH.ncu-rep" --page details --csv > "$OUT/ncu_s48c_${SH}_details.csv" 2>&1
        python benchmarks/ncu_details.py "$OUT/ncu_s48c_${SH}_details.csv" --metrics "Duration,DRAM Throughput,\
Memory Throughput,L2 Hit Rate,L1/TEX Hit Rate,Registers Per Thread,Achieved Occupancy,Theoretical Occupancy,\
Block Limit Registers,Warp Cycles Per Issued Instruction,Issued Warp Per Scheduler,Executed Ipc Active,\
Mem Busy,Max Bandwidth,L2 Compression Input Sectors" | head -40
        ncu -i "$OUT/ncu_s48c_$SH.ncu-rep" --page raw --csv > "$OUT/ncu_s48c_${SH}_raw.csv" 2>&1
        python -c 'import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith("\""))]
for r in rows[1:3]:  # (row 0: units) the recover launch, then the first one-token launch
    st = sorted(((float(v.replace(",", "")), k.split("issue_stalled_")[1].split("_per")[0]) for k, v in r.items()
                 if "issue_stalled_" in k and k.endswith("per_issue_active.ratio") and v.replace(",", "").replace(".", "").isdigit()), reverse=True)
    print(r["Kernel Name"][:24], " ".join("%s %.2f" % (n, x) for x, n in st[:8]))' "$OUT/ncu_s48c_${SH}_raw.csv"
        rm -f "$OUT/ncu_s48c_$SH.ncu-rep"
      done
      ;;
  s48b)  # (as run on an H100 in session 48: U = 2 / 4 slower at every config at A = 5 / 8, removed, commit e567007
        # keeps it; its 3-entry configs now raise) the recover kernel with U factors' loads issued together (session
        # 48; U = 1: each factor's loads wait for the fold of the one before, as session 45's prefetch depth 0 but
        # without its register rotation); its GPU tests, then configs BV/warps/U beside A replay launches at batch 32 /
        # 128, the default 8/2 first and last (timeouts 120 + 300 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s48b 120 tests/test_kernels_gpu.py -k "recover or every_accepted"
      timeout 300 python benchmarks/bench_kernels.py --batches 32,128 --Ts "" --budget-s 280 \
          --recover-configs 8/2,8/2/2,8/2/4,4/1/2,4/1/4,8/1/2,8/1/4,16/2/2,8/2 \
          --json "$OUT/kernels_s48b.json" 2>&1 | grep -E "^recover|^GPU|Error" | cut -c1-3000
      ;;
  s48a)  # (as run on an H100 in session 48: slower at every K-tile, removed, commit c081a3d keeps it; its 3-entry configs
        # now raise) the recover kernel tiled along K as well (session 48: the flush is
        # elementwise, so a [BV, BK] tile loads A (BV + BK) factor floats per BV BK state elements: 0.64 of the tile's
        # bytes at [8, 256], A = 5; 0.23 at [32, 64]); its GPU tests, then the configs beside A replay launches at batch
        # 32 / 128, 8/2 (the default, full K) first and last (timeouts 120 + 420 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s48a 120 tests/test_kernels_gpu.py -k "recover or every_accepted"
      timeout 420 python benchmarks/bench_kernels.py --batches 32,128 --Ts "" --budget-s 400 \
          --recover-configs 8/2,8/2/128,16/2/128,32/2/64,64/2/32,16/1/64,32/1/32,16/2/64,32/4/64,32/4/128,64/4/64,8/2 \
          --json "$OUT/kernels_s48a.json" 2>&1 | grep -E "^recover|^GPU|Error" | cut -c1-3000
      ;;
  s47a)  # (any card; an H200 gives issue 6's rows) the precheck's auto rule end to end: batch 1, K = 7, flame and map,
        # 0 / auto (the default: windows, and one-token rows at <= 8 pairs) / windows only (auto with
        # PRECHECK_AR_MAX_PAIRS = 0: batch-1 AR and draft passes keep the per-token test), twice, each a process (the
        # CUDA kernels built first), then bench_kernels at batch 1 / 2 with 0 / auto (timeouts 150 + 6 x 50 + 2 x 60 =
        # 570 s; session 47's H100 ran it in 304 s with the build)
      nvidia-smi --query-gpu=name --format=csv,noheader
      timeout 150 python -c "from vllm_specla.ops import _cpp; print('loaded', _cpp.load_cuda_kernels())" 2>&1 | tail -2
      E2E="--shapes flame,map --batches 1 --ks 7 --alphas 0.8 --snapshot-ks '' --skinny-gemm on --draft-weights fp8"
      for R in 1 2; do
        for P in 0 auto windows; do
          M=$P; AR=8; [ "$P" = windows ] && { M=auto; AR=0; }
          VLLM_SPECLA_RESCALE_PRECHECK=$M timeout 50 python -c "import runpy, shlex, sys
from vllm_specla.ops import triton_chain as tc
tc.PRECHECK_AR_MAX_PAIRS = $AR
sys.argv = ['bench_e2e.py'] + shlex.split(sys.argv[1])
runpy.run_path('benchmarks/bench_e2e.py', run_name='__main__')" "$E2E --tag s47a_${P}_r$R --out $OUT/e2e_s47a.jsonl" \
              2>&1 | grep "^{" | python -c "$S"
        done
      done
      for P in 0 auto; do
        echo "== VLLM_SPECLA_RESCALE_PRECHECK=$P"
        VLLM_SPECLA_RESCALE_PRECHECK=$P timeout 60 python benchmarks/bench_kernels.py --batches 1,2 --Ts 1,5,8 \
            --budget-s 45 --json "$OUT/kernels_s47a_$P.json" 2>&1 | grep -E "^\[|^GPU|Error|fail" | cut -c1-1500
      done
      ;;
  s46f)  # (any card; the verdict rows are s46g's) the chain kernel's renormalisation precheck (session 46,
        # VLLM_SPECLA_RESCALE_PRECHECK: its loops without the per-fold / per-token test where no prefix of a program's
        # decays reaches RESCALE_MIN; sm_90 SASS 261 -> 179 instructions per pending factor, 692 -> 538 per token at
        # verify_small): its GPU tests, then bench_kernels' table at batch 1 / 2 / 128 with the test everywhere (0)
        # and by shape (auto), one process each (timeouts 200 + 2 x 110 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s46f 200 tests/test_kernels_gpu.py -k "rescale_precheck or chain_tile_configs or pending_prefetch \
          or chain_verify_vs_ref or every_accepted or out_slots or ar_decode or token_strided or bf16_inputs \
          or snapshot_baseline or window_too_long"
      for P in 0 auto; do
        echo "== VLLM_SPECLA_RESCALE_PRECHECK=$P"
        VLLM_SPECLA_RESCALE_PRECHECK=$P timeout 110 python benchmarks/bench_kernels.py --batches 1,2,128 --Ts 1,5,8 \
            --budget-s 95 --json "$OUT/kernels_s46f_$P.json" 2>&1 | grep -E "^\[|^GPU|Error|fail" | cut -c1-1500
      done
      ;;
  s46g)  # (an H200 for issue 6's verdict) s46f end to end: batch 1, K = 7 (issue 6's 2.2x; AR is batch-1 one-token
        # rows, precheck on under auto too), flame and map, alternating 0 / auto twice, each a process (the CUDA kernels
        # built first: ~110 s on a fresh machine) (timeouts 200 + 4 x 70 = 480 s)
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
      export MAX_JOBS=16
      timeout 200 python -c "from vllm_specla.ops import _cpp; print('loaded', _cpp.load_cuda_kernels())" 2>&1 | tail -2
      for R in 1 2; do
        for P in 0 auto; do
          VLLM_SPECLA_RESCALE_PRECHECK=$P timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 \
              --ks 7 --alphas 0.8 --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s46g_${P}_r$R" \
              --out "$OUT/e2e_s46g.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s46a)  # (an H200 for issue 5's verdict) the recover kernel's scaled fold (/1: Mt += (v~ / sc) k^T, one FMA per
        # element and factor; session 46's SASS: 70 instead of 93 instructions per factor at 8/2) beside the plain
        # fold at batch 32 / 128 (s46b: 8/2 best, 8x256x256 batch 32 4.44x), its GPU tests first (timeouts 120 + 200 s).
        # As run in session 47 (an H100); the scaled fold was removed after it: its three-entry configs now raise
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s46a 120 tests/test_kernels_gpu.py -k "recover or every_accepted"
      timeout 200 python benchmarks/bench_kernels.py --batches 32,128 --Ts "" \
          --recover-configs 8/2/0,8/2/1,4/1/1,8/1/1,16/2/1,4/1/0 --json "$OUT/kernels_s46a.json" 2>&1 \
          | grep -E "^recover|^GPU|Error" | cut -c1-2000
      ;;
  s45d)  # (an H200 for issue 5's verdict) the recover kernel's tile configs at batch 32 / 128 beside A replay launches
        # (H200 batch 32 missed 4.5x by 1.8 % / 3.8 % in s43b; on the H100, s45a, 4/1 was faster than 8/1
        # there at A <= 5 (1.1-2.4 %), slower at batch 128, A = 8); /1: session 46's split fold (the factors folded into
        # an accumulator while the state tile's loads are in flight), its GPU tests first (timeouts 120 + 300 s). As
        # run in session 46; the split fold was removed after it, and the scaled fold that took its /1 configs in
        # session 47: those configs now raise
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s45d 120 tests/test_kernels_gpu.py -k "recover or every_accepted"
      timeout 300 python benchmarks/bench_kernels.py --batches 32,128 --Ts "" \
          --recover-configs 8/1,4/1,2/1,16/1,8/2,4/2,8/1/1,4/1/1,2/1/1,4/2/1 --json "$OUT/kernels_s45d.json" 2>&1 \
          | grep -E "^recover|^GPU|Error" | cut -c1-2000
      ;;
  s45c)  # (any card) s44g again with the build first (s44g as run in session 45: its first arm was killed by its 110 s
        # timeout while nvcc built, and the lock file torch left hung the next three arms; _cpp._build_and_load now
        # removes such a lock): the build as a user's first start gets it (timed; one "building" warning per
        # extension), then s44g's arms on the cached build, then (stale) a leftover torch lock file planted in the
        # skinny GEMM's build directory: one "removing" warning, both kernels loaded (timeouts 200 + 6 x 60 = 560 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      export MAX_JOBS=16
      start=$(date +%s)
      timeout 200 python -c "from vllm_specla.ops import _cpp; print('loaded', _cpp.load_cuda_kernels(), _cpp._CUDA_KERNEL_ERRORS)" 2>&1 | tail -6
      echo "build secs $(( $(date +%s) - start ))"
      R='import sys,json;[print(r["tag"],r["mode"],round(r["step_ms"],3),"csrc",r["cuda_csrc"],"skinny",r["gemv_rows"]["skinny"]) for r in map(json.loads,sys.stdin)]'
      for ARM in nocpp cpp disabled strict off stale; do
        case $ARM in
          nocpp) E="VLLM_SPECLA_CPP_JIT=0" ;; cpp) E="VLLM_SPECLA_CPP_JIT=1" ;;
          disabled) E="VLLM_SPECLA_DISABLE_CPP=1" ;; strict) E="VLLM_SPECLA_DISABLE_CPP=1 VLLM_SPECLA_CUDA_KERNELS=1" ;;
          off) E="VLLM_SPECLA_CUDA_KERNELS=0" ;;
          stale) E="VLLM_SPECLA_CPP_JIT=1"
                 touch "$(python -c "from torch.utils.cpp_extension import _get_build_directory as d; print(d('vllm_specla_gemm_jit', False))")/lock" ;;
        esac
        echo "== $ARM ($E)"
        env $E timeout 60 python benchmarks/bench_e2e.py --shapes flame --batches 64 --ks 4 --alphas 0.8 \
            --snapshot-ks "" --tag s45c_$ARM --out "$OUT/e2e_s45c.jsonl" > "$OUT/s45c_$ARM.txt" 2>&1
        echo "rc $?"; grep -E "vllm_specla|Error|error" "$OUT/s45c_$ARM.txt" | tail -4 | cut -c1-400
        grep "^{" "$OUT/s45c_$ARM.txt" | python -c "$R"
      done
      ;;
  s45a)  # (as run on an H100, benchmarks/RESULTS.md "Session 45"; the prefetch was removed after it, commit cf720c1 keeps
        # it: its three-part configs are refused now) the recover kernel's factor prefetch (triton_recover PF): its GPU tests, then recover
        # of A = 3 / 5 / 8 factors at 8 (BV / warps / PF) configs beside A replay launches, batch 32 / 128, both
        # shapes (timeouts 150 + 200 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log recover_s45a 120 tests/test_kernels_gpu.py tests/test_kernel_ut_gpu.py -k "recover or every_accepted"
      timeout 200 python benchmarks/bench_kernels.py --batches 32,128 --Ts "" \
          --recover-configs 8/1/0,8/1/2,8/1/4,4/1/0,4/1/4,16/1/4,16/2/4,32/4/4 \
          --json "$OUT/kernels_s45a.json" 2>&1 | grep -E "^recover|^GPU|B=(32|128):|Error" | cut -c1-2000
      ;;
  s44g)  # (as run on an H100 in session 45: see s45c) the CUDA kernels as the default (session 44): bench_e2e without csrc flags, (nocpp) without the C++
        # CPU extension imported (load_cuda_kernels JIT-builds it, then the chain verify: the record's cuda_csrc true;
        # flame batch 64 K = 4 ~6.04 ms on the H200), (cpp) with it JIT-built at import (the same), (disabled)
        # VLLM_SPECLA_DISABLE_CPP=1 (one warning naming it; the skinny GEMM built, cuda_csrc false, ~7.16 ms), (strict)
        # that with VLLM_SPECLA_CUDA_KERNELS=1 (the RuntimeError), (off) VLLM_SPECLA_CUDA_KERNELS=0 (cuda_csrc false,
        # skinny None); timeouts 5 x 110 s
      nvidia-smi --query-gpu=name --format=csv,noheader
      export MAX_JOBS=16
      R='import sys,json;[print(r["tag"],r["mode"],round(r["step_ms"],3),"csrc",r["cuda_csrc"],"skinny",r["gemv_rows"]["skinny"]) for r in map(json.loads,sys.stdin)]'
      for ARM in nocpp cpp disabled strict off; do
        case $ARM in
          nocpp) E="VLLM_SPECLA_CPP_JIT=0" ;; cpp) E="VLLM_SPECLA_CPP_JIT=1" ;;
          disabled) E="VLLM_SPECLA_DISABLE_CPP=1" ;; strict) E="VLLM_SPECLA_DISABLE_CPP=1 VLLM_SPECLA_CUDA_KERNELS=1" ;;
          off) E="VLLM_SPECLA_CUDA_KERNELS=0" ;;
        esac
        echo "== $ARM ($E)"
        env $E timeout 110 python benchmarks/bench_e2e.py --shapes flame --batches 64 --ks 4 --alphas 0.8 \
            --snapshot-ks "" --tag s44g_$ARM --out "$OUT/e2e_s44g.jsonl" > "$OUT/s44g_$ARM.txt" 2>&1
        echo "rc $?"; grep -E "vllm_specla|Error|error" "$OUT/s44g_$ARM.txt" | tail -3 | cut -c1-400
        grep "^{" "$OUT/s44g_$ARM.txt" | python -c "$R"
      done
      ;;
  s43a)  # session 43's ask: on an H200, s36b (issue 6's verdicts); on another card, s42f (~2 min)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      exec bash "$0" s42f
      ;;
  s43d)  # (any card; an H200 for the verdict rows) s43a's grid at batch 64 / 256 ran 10-18 % longer SpecLA steps than
        # s13e's with the CUDA csrc: the same rows with and without --cuda-csrc in one call (timeouts 150 + 4 x 100
        # = 550 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      for SH in map flame; do
        for ARM in triton csrc; do
          timeout 100 python benchmarks/bench_e2e.py --shapes $SH --batches 64,256 --ks 4 --alphas 0.8 --snapshot-ks "" \
              $([ $ARM = csrc ] && echo --cuda-csrc) --tag s43d_$ARM --out "$OUT/e2e_s43d.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s43c)  # (an H200; s43b cut to little device time) s37a's tree table (batch 1 / 8 / 32) and Triton kernel table, without
        # the CUDA csrc build and its commit table (timeouts 150 + 120 = 270 s)
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
      timeout 150 python benchmarks/bench_tree.py --batches 1,8,32 --nodes 16,32 --trees binary,beam4 \
          --shapes 6x256x512,8x256x256 --pending 0 --budget-s 120 --out "$OUT/tree_s43c.json" 2>&1 | grep -E "^B=|worst|^--"
      timeout 120 python benchmarks/bench_kernels.py --batches 32,128 --Ts 1,5 --budget-s 100 \
          --json "$OUT/kernels_s43c.json" 2>&1 | grep -E "target|copy|fail" | head -30
      ;;
  s43b)  # (an H200 after s43a's s36b) issue 5's kernel verdicts at today's code: s37a's body without its H200 branch
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
      S37A_BODY=1 exec bash "$0" s37a
      ;;
  s42f)  # (any card; after the review of s42e) the prompt conv's tests again (int32 / host row tensors) and the model
        # prefill test, which now also compares conv windows from garbage-filled slots (timeout 200 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log prefill_conv_f 200 tests/test_prefill_conv.py "tests/test_prefill_gpu.py::test_gdn_model_prefill_on_cuda"
      ;;
  s42e)  # (any card; after s42c: our Triton verify-window conv was faster than fla's conv in 11 of 12 cases) the CUDA
        # prompt conv is now ours: its tests (and the batched form's), the model prefill test, and the conv table again
        # (timeouts 220 + 120 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log prefill_conv_e 220 tests/test_prefill_conv.py "tests/test_prefill_gpu.py::test_gdn_model_prefill_on_cuda"
      timeout 120 python benchmarks/bench_prefill.py --ops conv --rows 1,16,64 --lens 512,2048 \
          --out "$OUT/prefill_conv_s42e.json" 2>&1 | tail -14
      ;;
  s42d)  # on an H200, s36b (issue 6's verdicts); on another card, s42c
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      exec bash "$0" s42c
      ;;
  s42c)  # (any card; after s42b: the batched torch conv took 8.7 ms a layer for 16 prompts of 2,048 tokens on an
        # H100, more than fla's recurrence) fla's Triton conv as the CUDA prompt conv: its tests against the per-row
        # reference (and the batched form's again), then the conv's speed: batched / reference / our verify-window
        # Triton conv / fla, side by side (timeouts 200 + 150 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log prefill_conv_c 200 tests/test_prefill_conv.py "tests/test_prefill_gpu.py::test_gdn_model_prefill_on_cuda"
      timeout 150 python benchmarks/bench_prefill.py --ops conv --rows 1,16,64 --lens 512,2048 \
          --out "$OUT/prefill_conv_s42c.json" 2>&1 | tail -14
      ;;
  s42a)  # session 42's ask: on an H200, s36b (issue 6's verdicts); on another card, s42b
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      exec bash "$0" s42b
      ;;
  s42b)  # (any card) the batched prompt conv (bit for bit against the per-row reference, no host sync) and its speed
        # side by side, then s41b (the prefill GPU tests that never ran: beta in (0, 2) at both GDN-1.3B shapes, fla's
        # calls and the batched conv spied on in the model) (timeouts 60 + 90 + 420 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log prefill_conv 60 tests/test_prefill_conv.py
      timeout 90 python benchmarks/bench_prefill.py --ops conv --rows 1,16,64 --lens 512,2048 \
          --out "$OUT/prefill_conv_s42b.json" 2>&1 | tail -12
      bash "$0" s41b
      ;;
  s41c)  # (any card; s41b cut to what fits little device time) the model prefill test with fla's calls spied on, the
        # forced reference, beta in (0, 2) at the small GVA shape, and the CUDA-vs-CPU state-slot model test
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log prefill_c 280 -k "model_prefill or forced or True-True-lens2-shape0 or state_slot_model" \
          tests/test_prefill_gpu.py tests/test_fused_gpu.py
      ;;
  s41b)  # (any card) after the review of s41a: the prefill GPU tests again (fla calls spied on, beta in (0, 2)) and the
        # CUDA-vs-CPU state-slot model test, whose prefill now forces the reference (fla's tf32 is compared at 5e-3)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log prefill_b 420 tests/test_prefill_gpu.py "tests/test_fused_gpu.py::test_state_slot_model_cuda_matches_cpu"
      ;;
  s41a)  # (any card) session 41's prefill op: fla's chunk kernel on CUDA against the reference, its GPU tests and
        # speed side by side (fla wheels in .whl); then, on an H200 only, the next call is s36b
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log prefill 330 tests/test_prefill_gpu.py
      timeout 240 python benchmarks/bench_prefill.py --rows 1,16,64 --lens 512,2048 --out "$OUT/prefill_s41a.json" 2>&1 | tail -16
      ;;
  s39g)  # session 39's last code (the pending prefetch only in its measured regime, _pend_prefetch): on an H200, s37g
        # (issue 6's batch-1 verdict rows); else the chain kernel's and the runtime's GPU tests (timeout 150 s)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s37g; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s39g 150 tests/test_kernels_gpu.py tests/test_decode_runtime_gpu.py tests/test_dispatch.py \
          -k "prefetch or tile_configs or accepted or chain or batch1 or fp8_draft or acceptance_control or rule"
      ;;
  s39f)  # (as run; REDUCE_KO_FIRST was removed after it, commit a8b5c85 keeps it)
        # the serial kernels' key-tile sums in-thread first (REDUCE_KO_FIRST; 200 -> 95 shuffles per window token in
        # the CPU-compiled SASS): their GPU tests, per-layer times (AR T = 1, verify / step T = 5 / 8 at batch 1 / 2) in
        # the old order then the new, then batch 1 end to end (K = 7, float8 draft passes): old, new, new with the
        # one-token conv + recurrence launch (CONV_STEP, whose step kernel had the same sums) (timeouts 100 + 2 x 35 +
        # 120 + 3 x 75 = 515 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s39f 100 tests/test_kernels_gpu.py tests/test_conv_step_gpu.py -k "chain or step or prefetch or accepted or tile"
      for KF in 0 1; do
        VLLM_SPECLA_REDUCE_KO_FIRST=$KF timeout 35 python benchmarks/bench_ut.py --no-sweep --no-accuracy --batches 1,2 \
            --Ts 1,5,8 --impls ser --kinds ar,verify,step --budget-s 30 --out "$OUT/ut_s39f_ko$KF.json" 2>&1 \
            | grep -E "^\[|^fail" | sed "s|^|ko_first $KF |"
      done
      skinny_build 120
      for A in 0,0 1,0 1,1; do
        VLLM_SPECLA_REDUCE_KO_FIRST=${A%,*} VLLM_SPECLA_CONV_STEP=${A#*,} timeout 75 python benchmarks/bench_e2e.py \
            --shapes flame,map --batches 1 --ks 7 --alphas 0.8 --snapshot-ks "" --skinny-gemm on --draft-weights fp8 \
            --tag "s39f_ko${A%,*}_step${A#*,}" --out "$OUT/e2e_s39f.jsonl" 2>&1 | grep "^{" | python -c "$S" \
            | sed "s|^|ko,step $A |"
      done
      ;;
  s39e)  # session 39's final code: on an H200, s37g (issue 6's batch-1 verdict rows, with the pending prefetch); else
        # the chain kernel's and the runtime's GPU tests, the serial kernel's configs for batch-1 / 2 SpecLA steps
        # now that the pending factors load ahead (TUNED verify_small 8/1/32/1 was swept on verify windows with
        # nothing pending), then batch 1, K = 6 / 7 end to end at the defaults (timeouts 150 + 60 + 120 + 90 = 420 s)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s37g; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s39e 150 tests/test_kernels_gpu.py tests/test_decode_runtime_gpu.py \
          -k "prefetch or tile_configs or accepted or chain or batch1 or fp8_draft or acceptance_control"
      timeout 60 python benchmarks/bench_ut.py --no-sweep --no-accuracy --batches 1,2 --Ts 5,8 --impls ser \
          --ser-configs 4/1/32/1,4/1/16/1,8/1/16/1,16/2/32/1 --kinds verify,step --budget-s 55 \
          --out "$OUT/ut_s39e.json" 2>&1 | grep -E "^\[|^fail"
      skinny_build 120
      timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights fp8 --tag s39e --out "$OUT/e2e_s39e.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s39c)  # (as run; TOKEN_PREFETCH was removed after it)
        # the serial chain kernel's prefetch depths (TOKEN_PREFETCH, PENDING_PREFETCH): its GPU tests, then per-layer
        # times at batch 1 / 2 (verify and SpecLA-step windows of 5 / 8 tokens, the steps with as many pending factors)
        # at five depth pairs, the default first and last (timeouts 120 + 6 x 45 = 390 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s39c 120 tests/test_kernels_gpu.py -k "prefetch or tile_configs or accepted or chain"
      for TP in 1,0 1,2 1,4 2,0 2,4 1,0; do
        VLLM_SPECLA_TOKEN_PREFETCH=${TP%,*} VLLM_SPECLA_PENDING_PREFETCH=${TP#*,} timeout 45 python \
            benchmarks/bench_ut.py --no-sweep --no-accuracy --batches 1,2 --Ts 5,8 --impls ser --kinds verify,step \
            --budget-s 40 --out "$OUT/ut_s39c_${TP/,/_}.json" 2>&1 | grep -E "^\[|^fail" | sed "s|^|tok,pend $TP |"
      done
      ;;
  s39d)  # (as run; GLUE_LATE_LAUNCH was removed after it)
        # end to end at batch 1 (K = 7, float8 draft passes, the skinny GEMM built, both shapes): the serial kernel's
        # pending-factor prefetch (PENDING_PREFETCH 4: s39c's best) and the glue kernels' late dependent launch
        # (GLUE_LATE_LAUNCH), each alone and together, between two runs of the defaults (timeouts 120 + 5 x 75 = 495 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      skinny_build 120
      for A in 0,0 4,0 0,1 4,1 0,0; do
        VLLM_SPECLA_PENDING_PREFETCH=${A%,*} VLLM_SPECLA_GLUE_LATE_LAUNCH=${A#*,} timeout 75 python \
            benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --draft-weights fp8 --tag "s39d_pend${A%,*}_late${A#*,}" --out "$OUT/e2e_s39d.jsonl" \
            2>&1 | grep "^{" | python -c "$S" | sed "s|^|pend,late $A |"
      done
      ;;
  s39a)  # (as run; UT_ONE and bench_ut.py's ut1 impl were removed after it)
        # session 39's one-launch UT form (UT_ONE) on the card that comes: its GPU tests (the "one" runs of the UT
        # file, the wiring test), then per-layer kernel times at batch 1 / 2 / 4 (verify and SpecLA-step windows of 5
        # and 8 tokens; the serial kernel, the multi-launch UT form, the one-launch form at its default config and
        # four others), then 16 / 32-node trees with 3 pending at batch 1 / 4, UT_ONE off then on
        # (timeouts 150 + 170 + 2 x 80 = 480 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s39a 150 tests/test_kernel_ut_gpu.py tests/test_dispatch.py -k "one or dispatch"
      timeout 170 python benchmarks/bench_ut.py --no-sweep --no-accuracy --batches 1,2,4 --Ts 5,8 \
          --impls ser,ut,ut1 --ut1-configs 16/2/16/3,16/1/16/3,32/4/16/3,64/4/16/2 --kinds verify,step \
          --budget-s 150 --out "$OUT/ut_s39a.json" 2>&1 | grep -E "^\[|^fail|^GPU"
      for O in 0 1; do
        VLLM_SPECLA_UT_ONE=$O timeout 80 python benchmarks/bench_tree.py --batches 1,4 --nodes 16,32 --trees binary \
            --shapes 8x256x256,6x256x512 --pending 3 --budget-s 65 --out "$OUT/tree_s39a_one$O.json" 2>&1 \
            | grep -E "^B=|^--" | sed "s|^|one$O |"
      done
      ;;
  s39b)  # (never run; UT_ONE was removed)
        # the one-launch form end to end at batch 1 (K = 6 / 7, float8 draft passes, the skinny GEMM built): UT_ONE off
        # / auto / off, both shapes; on an H200 the off rows are also issue 6's verdict rows (s37g's runs)
        # (timeouts 120 + 3 x 90 = 390 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      skinny_build 120
      for O in 0 auto 0; do
        VLLM_SPECLA_UT_ONE=$O timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 \
            --alphas 0.8 --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s39b_one$O" \
            --out "$OUT/e2e_s39b.jsonl" 2>&1 | grep "^{" | python -c "$S" | sed "s|^|one$O |"
      done
      ;;
  s38h)  # (as run in a warm H100 left by s37g) the final code's fold, -inf, chain and tree GPU tests (timeout 150 s)
      timeout 150 python -m pytest -q tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py \
          -k "fold or minus_inf or tree_vs_sequential or vs_ref_small" > "$OUT/pytest_s38h.txt" 2>&1
      echo "rc $?"; tail -3 "$OUT/pytest_s38h.txt"
      ;;
  s38g)  # (after the review of s38a-s38f) on an H200, s37g; else the UT / tree GPU tests at the review's fixes (the fold
        # leaves rows with nothing pending unwritten, runs its dot at tf32x3, new fold tests), then the prep at 2 warps
        # in split launches (PREP_WARPS_SPLIT, the default now) against 1 once more: 16-node trees at batch 1-8, both
        # shapes, 3 pending (timeouts 170 + 2 x 80 = 330 s)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s37g; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s38g 170 -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py
      for W in default 1; do
        timeout 80 python benchmarks/bench_tree.py --batches 1,2,4,8 --nodes 16 --trees binary,beam4 \
            --shapes 8x256x256,6x256x512 --pending 3 --budget-s 65 $([ $W = default ] || echo --prep-warps $W) \
            --out "$OUT/tree_s38g_w$W.json" 2>&1 | grep -E "^B=|^--" | sed "s|^|w$W |"
      done
      ;;
  s38f)  # (as run in a warm H100 left by s36b) the fold end to end: batch 64, K = 4, a 2-wide tree, both shapes, the
        # fold off, then the default (timeouts 2 x 150 s)
      for F in 0 auto; do
        VLLM_SPECLA_UT_FOLD=$F timeout 150 python benchmarks/bench_e2e.py --shapes map,flame --batches 64 --ks 4 \
            --alphas 0.8 --snapshot-ks "" --tree-widths 2 --tag s38f_fold$F --out "$OUT/e2e_s38f.jsonl" 2>&1 \
            | grep "^{" | python -c "$S" | sed "s|^|fold$F |"
      done
      ;;
  s38e)  # (as run in a warm H100 left by s36b) the decode runtime's and the tree kernels' GPU tests at the fold's final
        # rule (timeout 250 s)
      timeout 250 python -m pytest -q -x tests/test_decode_runtime_gpu.py tests/test_tree_hld_gpu.py > "$OUT/pytest_s38e.txt" 2>&1
      echo "rc $?"; tail -5 "$OUT/pytest_s38e.txt"
      ;;
  s38d)  # (after s38c) on an H200, s37g (the batch-1 2.2x, K = 6 / 7, within the device time left); else the fold's
        # rule (UT_FOLD auto: launches that are not split, 16-token chunks) against the fold off once more: trees of
        # 16 nodes at batch 16-128 (new rows) and the chain steps of s38c (timeouts 2 x 90 + 2 x 90 = 360 s; run with
        # `0 auto` at commit 773451f, whose auto folded every launch that is not split with 16-token chunks: for these
        # rows the `1` below)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s37g; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      for F in 0 1; do
        VLLM_SPECLA_UT_FOLD=$F timeout 90 python benchmarks/bench_tree.py --batches 16,32,64,128 --nodes 16 \
            --trees binary --shapes 8x256x256,6x256x512 --pending 3 --budget-s 75 \
            --out "$OUT/tree_s38d_fold$F.json" 2>&1 | grep -E "^B=|^--" | sed "s|^|fold$F |"
      done
      for F in 0 1; do
        VLLM_SPECLA_UT_FOLD=$F timeout 90 python benchmarks/bench_commit_cuda.py --impls ut --batches 32,128 \
            --replays 20 --out "$OUT/commit_s38d_fold$F.json" 2>&1 | tail -6 | sed "s|^|fold$F |"
      done
      ;;
  s38c)  # (after s38b: with 3 pending factors a tree launch reads and writes the state in the recover kernel, then
        # reads it again for the products: 39.5 us at batch 8 on map's heads against 24.2 with nothing pending, s37f)
        # on an H200, s36b; else the pending factors folded into the UT kernel's state pass (UT_FOLD: the committed
        # chunk written back, 2 state passes instead of 3): the UT / tree GPU tests (both forms), the chain step A/B
        # (bench_commit_cuda --impls ut: fused = fold, sep = recover + verify) with the fold off / on for chains, the
        # tree table at batch 1-32 with the fold off / on for trees (timeouts 170 + 2 x 90 + 2 x 90 = 530 s; run with
        # `0 auto` at commit 6cc335f, whose auto folded every tree launch: the `1` below)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s38c 170 -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py
      for F in 0 1; do
        VLLM_SPECLA_UT_FOLD=$F timeout 90 python benchmarks/bench_commit_cuda.py --impls ut,triton --batches 32,128 \
            --replays 20 --out "$OUT/commit_s38c_fold$F.json" 2>&1 | tail -10 | sed "s|^|fold$F |"
      done
      for F in 0 1; do
        VLLM_SPECLA_UT_FOLD=$F timeout 90 python benchmarks/bench_tree.py --batches 1,2,4,8,32 --nodes 16,32 \
            --trees binary --shapes 8x256x256,6x256x512 --pending 3 --budget-s 75 \
            --out "$OUT/tree_s38c_fold$F.json" 2>&1 | grep -E "^B=|^--" | sed "s|^|fold$F |"
      done
      ;;
  s38b)  # (after s38a: at batch 1-4 the split launch's products kernel, M k / M q of the raw q / k, took 13.1-15.8 /
        # 21.1-24.8 us at 16 / 32 nodes on both head shapes, about as long as the 1-warp prep; prep at 4 warps 9.9 us did not
        # move the graph-timed tree, so the products are the critical path) on an H200, s36b; else the products'
        # per-kernel time at batch 1 over configs of fewer, longer key chunks (KC 32-128) and narrower V tiles, and
        # with plain tf32 / ieee dots (is it the tf32x3 split?), then the graph-timed tree table at batch 1-8 with
        # the sweep's best config at 16 nodes, prep at 4 warps (timeouts 2 x 90 + 2 x 100 = 380 s)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      for SH in 6x256x512 8x256x256; do
        timeout 90 python benchmarks/prof/ut_prep_split.py --sweep --shape $SH --batches 1 --nodes 16,32 \
            --configs 32/2/16/3,32/2/32/3,32/2/64/2,32/4/64/2,32/4/128/1,16/1/64/2,16/2/64/2,16/2/128/1,64/4/64/2,16/1/32/3 \
            --prep-warps "" --precisions tf32,ieee --out "$OUT/ut_sweep_s38b_$SH.json" 2>&1 | grep -v Warn
      done
      BEST=$(python -c 'import json,sys
r=[x for f in sys.argv[1:] for x in json.load(open(f)) if x["N"]==16 and x["what"].startswith("cfg")]
tot={}
[tot.__setitem__(x["what"].split()[1], tot.get(x["what"].split()[1], 0) + x["other_us"] + x["vtile_us"]) for x in r]
print(min(tot, key=tot.get))' "$OUT"/ut_sweep_s38b_*.json 2>/dev/null)
      echo "best config at 16 nodes (products + V-tile, both shapes): $BEST"
      for CFG in default $BEST; do
        timeout 100 python benchmarks/bench_tree.py --batches 1,2,4,8 --nodes 16,32 --trees binary \
            --shapes 8x256x256,6x256x512 --pending 3 --budget-s 80 --prep-warps 4 \
            $([ "$CFG" = default ] || echo --ut-config "$CFG") \
            --out "$OUT/tree_s38b_${CFG//\//-}.json" 2>&1 | grep -E "^B=|^--" | sed "s|^|$CFG |"
      done
      ;;
  s38a)  # session 38's first call: on an H200, s36b (the verdicts); on another card, where batch-1 trees lose their
        # time (UT 20-32 us against 60-141 us of per-node replay, 2.9-5.3x, the 8x target's gap): per-kernel device
        # times at batch 1 / 4 with the prep kernel at 1 / 2 / 4 / 8 warps (its 1-warp [BT, BT] chain is the longest
        # kernel there), then the graph-timed tree table at batch 1-8 with 3 pending factors at the default prep warps
        # and at 2 / 4; then issue 5's chain-verify row (B = 128, T = 8, <= 300 us), not run on the H100 (timeouts
        # 2 x 75 + 3 x 100 + 100 = 550 s)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      for SH in 6x256x512 8x256x256; do
        timeout 75 python benchmarks/prof/ut_prep_split.py --sweep --shape $SH --batches 1,4 --nodes 16,32 \
            --configs 32/2/16/3 --prep-warps 1,2,4,8 --out "$OUT/ut_sweep_s38a_$SH.json" 2>&1 | grep -v Warn
      done
      for W in default 2 4; do
        timeout 100 python benchmarks/bench_tree.py --batches 1,2,4,8 --nodes 16,32 --trees binary \
            --shapes 8x256x256,6x256x512 --pending 3 --budget-s 80 $([ $W = default ] || echo --prep-warps $W) \
            --out "$OUT/tree_s38a_w$W.json" 2>&1 | grep -E "^B=|^--" | sed "s|^|w$W |"
      done
      timeout 100 python benchmarks/bench_kernels.py --batches 128 --Ts 8 --budget-s 80 \
          --json "$OUT/kernels_s38a.json" 2>&1 | grep -E "^GPU|^-- |^128 |T=8|fail" | head -20
      ;;
  s37h)  # (review of s37f) the new tree rule sends every tree of a 16-32-position bank at batch 1-7 to UT, also trees
        # smaller than 16 nodes, and s37d-s37f ran with no pending factors: UT against the heavy-light / walk kernels
        # at 8 / 12 / 16 nodes, batch 1 / 2 / 4, 3 pending factors (as a step folds), both head shapes (timeout 150 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      timeout 150 python benchmarks/bench_tree.py --batches 1,2,4 --nodes 8,12,16 --trees binary,beam4 \
          --shapes 8x256x256,6x256x512 --pending 3 --budget-s 130 --out "$OUT/tree_s37h.json" 2>&1 | grep -E "^B=|^--"
      ;;
  s37g)  # the batch-1 half of s36b (which runs it first) on an H200 only (it exits at once on another card): issue
        # 6's 2.2x, K = 6 / 7, float8 draft passes, twice (alone: for the end of a session with ~6 minutes of device time
        # left) (timeouts 120 + 2 x 60 = 240 s)
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
      skinny_build 120
      for R in 1 2; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s37g_r$R" \
            --out "$OUT/e2e_s37g.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s37f)  # session 37's tree changes on the card that comes (no H200 branch: a check of code, not a verdict): the UT
        # kernel's one config (TUNED_UT; the small-batch launches had taken an unswept slower one) and UT for 16-32-node
        # trees at any batch without a host plan (UT_TREE_SMALL_BATCH_MIN_NODES 25 -> 16). The UT and tree GPU tests,
        # then the tree table at batch 1 / 8 with today's rule (timeouts 200 + 120 = 320 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      pytest_log s37f 200 -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py
      timeout 120 python benchmarks/bench_tree.py --batches 1,8 --nodes 16,32 --trees binary,beam4 \
          --shapes 8x256x256,6x256x512 --pending 0 --budget-s 100 --out "$OUT/tree_s37f.json" 2>&1 | grep -E "^B=|worst|^--"
      ;;
  s37d)  # on an H200, s36b (the verdicts); on another card: why map's 8x256x256 heads miss 8x at batch 8 (s37a: UT 34.0 /
        # 71.2 us at 16 / 32 nodes against flame's 27.1 / 49.9). Its launch has 8 x 8 x 8 = 512 programs at BV = 32,
        # under pick_config_ut's LARGE_PROGRAMS (528), so it takes the unswept "small" config (32/4/16/2); flame's 768
        # take "large" (32/2/16/3). Per-kernel times of configs and prep warps (ut_prep_split.py --sweep), then the
        # graph-timed tree table with the default and the sweep's two best configs (timeouts 200 + 3 x 100 = 500 s)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      timeout 200 python benchmarks/prof/ut_prep_split.py --sweep --shape 8x256x256 --batches 8 --nodes 16,32 \
          --configs 32/2/16/3,16/1/16/2,16/2/16/2,16/2/16/3,32/2/16/2,64/4/16/2,32/2/32/2 --prep-warps 2,4 \
          --out "$OUT/ut_sweep_s37d.json" 2>&1 | grep -v Warn
      BEST=$(python -c 'import json,sys
r=[x for x in json.load(open(sys.argv[1])) if x["N"]==16 and x["what"].startswith("cfg")]
r.sort(key=lambda x: x["vtile_us"]+x["other_us"])
print(" ".join(x["what"].split()[1] for x in r[:2]))' "$OUT/ut_sweep_s37d.json" 2>/dev/null)
      echo "best configs at 16 nodes: $BEST"
      for CFG in default $BEST; do
        timeout 100 python benchmarks/bench_tree.py --batches 8 --nodes 16,32 --trees binary,beam4 --shapes 8x256x256 \
            --pending 0 --budget-s 80 $([ "$CFG" = default ] || echo --ut-config "$CFG") \
            --out "$OUT/tree_s37d_${CFG//\//-}.json" 2>&1 | grep -E "^B=|worst" | sed "s|^|$CFG |"
      done
      ;;
  s37c)  # on an H200, s36b (the verdicts); on another card: map's batch-256 snapshot row (s37b ran out of memory before
        # the snapshot prefill ran in chunks of rows), then the CUDA step / commit table with the UT build variants 2 / 3
        # forced beside the automatic choice (its cost model was fitted on the H200, session 6) (timeouts 150 + 200 + 150
        # = 500 s)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      nvidia-smi --query-gpu=name --format=csv,noheader
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 200 python benchmarks/bench_e2e.py --shapes map --batches 256 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --cuda-csrc --tag s37c --out "$OUT/e2e_s37c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      timeout 150 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_utv2,cuda_utv3 --batches 32,128 --replays 20 \
          --out "$OUT/commit_s37c.json" 2>&1 | tail -14
      ;;
  s37b)  # issue 6's snapshot ratios on this card (last: s26b, H200): batch 64 / 256, K = 4, alpha 0.8, both shapes, the
        # CUDA csrc (its JIT build is cached on a warm machine after s37a); on an 80 GB card flame's batch-256 snapshot
        # row (~337 MB a request) does not fit and is skipped (timeouts 150 + 420 = 570 s)
      nvidia-smi --query-gpu=name --format=csv,noheader
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 420 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --cuda-csrc --tag s37b --out "$OUT/e2e_s37b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s37a)  # session 37's first call: on an H200, s36b (the verdicts); on another card (an H100, as in sessions 35-36),
        # issue 5's kernel verdicts at today's code on that card: the CUDA step / fused commit vs replay (last: s25d,
        # H200), recover vs per-token replay (last: the session-2 kernel table), trees vs per-node replay at batch 1 /
        # 8 / 32 (last: s10b) (timeouts 150 + 100 + 120 + 150 = 520 s)
      if [ -z "${S37A_BODY:-}" ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" s36b; fi
      nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 100 python benchmarks/bench_commit_cuda.py --impls cuda,triton --batches 32,128 --replays 20 \
          --out "$OUT/commit_s37a.json" 2>&1 | tail -14
      timeout 120 python benchmarks/bench_kernels.py --batches 32,128 --Ts 1,5 --budget-s 100 \
          --json "$OUT/kernels_s37a.json" 2>&1 | grep -E "target|copy|fail" | head -30
      timeout 150 python benchmarks/bench_tree.py --batches 1,8,32 --nodes 16,32 --trees binary,beam4 \
          --shapes 6x256x512,8x256x256 --pending 0 --budget-s 120 --out "$OUT/tree_s37a.json" 2>&1 | grep -E "^B=|worst|^--"
      ;;
  s36b)  # the H200 verdicts at today's code, on an H200 only (the run exits at once on another card): batch 1, K = 6 / 7,
        # float8 draft passes, twice (issue 6's 2.2x; last on the H200: s31d's 2.14x), then s36a's `auto` grid
        # (timeouts 120 + 2 x 60 + 2 x 170 = 580 s)
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
      bash "$0" s37g  # the batch-1 half (its records: e2e_s37g.jsonl, tags s37g_r1 / s37g_r2)
      for SH in flame map; do
        timeout 170 python benchmarks/bench_e2e.py --shapes $SH --batches 1,16,64,256 --ks 2,4,6 --alphas 0.8 --auto \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag s36b_grid \
            --out "$OUT/e2e_s36b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s36a)  # the float8 drafter's batch limit (fused_model.FP8_MAX_BATCH = 2, from s35b) on the `auto` grid, as users run
        # it (--draft-weights fp8): batch 1 / 16 / 64 / 256, K = 2 / 4 / 6, alpha 0.8, both shapes, the skinny GEMM built,
        # one process per shape (timeouts 120 + 2 x 235 = 590 s)
      skinny_build 120
      for SH in flame map; do
        timeout 235 python benchmarks/bench_e2e.py --shapes $SH --batches 1,16,64,256 --ks 2,4,6 --alphas 0.8 --auto \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag s36a \
            --out "$OUT/e2e_s36a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s35a)  # session 35's final code on an H200 (session 35 had only an H100): the coherent first batch is the skinny
        # GEMM's only form now. The skinny GEMM's and the runtime's GPU tests with the CUDA csrc JIT-built, then batch 1,
        # K = 6 / 7, float8 draft passes, twice, the second time with `auto` at batch 1 (timeouts 150 + 150 + 150 + 50
        # + 70 = 570 s; on the H100 the tests took 27 s with everything built)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      skinny_build 150
      pytest_log s35a 150 -rs tests/test_skinny_gemm_gpu.py tests/test_decode_runtime_gpu.py
      for R in 1 2; do
        timeout $([ $R = 2 ] && echo 70 || echo 50) python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 --alphas 0.8 $( [ $R = 2 ] && echo --auto ) \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s35a_r$R" \
            --out "$OUT/e2e_s35a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s35b)  # where float8 draft passes stop paying (FusedEagle runs them through the row GEMV at every batch: session 35's
        # H100 run at batch 16 / 64 had K = 2 steps of 4.51 / 12.77 ms against AR 2.28 / 4.60, where session 28's bf16
        # drafter on the H200 took 2.50 / 5.20 against 1.93 / 3.58): model vs float8 draft weights at batch 1 / 2 / 4 / 8
        # / 16, K = 2 / 4, one AR baseline per shape and batch, one process per shape; a batch limit for
        # draft_weights="fp8" follows from it (timeouts 150 + 2 x 200 = 550 s)
      skinny_build 150
      for SH in flame map; do
        timeout 200 python benchmarks/bench_e2e.py --shapes $SH --batches 1,2,4,8,16 --ks 2,4 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights model,fp8 --tag s35b \
            --out "$OUT/e2e_s35b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  # Session 32 prepared these without a device (none was lent). Priority: s32c, s32e, s32f, s32a, s32b (more than
  # the 30 minutes with the start-up overheads: drop from the end), s32d if time is left. Each case's timeouts sum
  # to under 600 s.
  s32c)  # session 32, call 1: the skinny GEMM's first weight batch before the PDL wait. ptxas 12.9 (nvrtc_check.py
        # --sass) issues the .nc first batch after griddepcontrol.wait; VLLM_SPECLA_SKINNY_PRE=coherent builds it with
        # coherent loads, which stay before it, and --skinny-deep 16 deepens it for o_proj / down (coherent build
        # only). x is now read with coherent loads in both builds (the read-only path is not valid for data the
        # previous kernel writes), so the nc arm is the changed default. Both builds, then batch 1 K = 7, float8
        # draft passes: nc, coherent, coherent + deep 16, nc again (timeouts 150 + 150 + 4 x 60 = 540 s)
      skinny_build 150
      VLLM_SPECLA_SKINNY_PRE=coherent skinny_build 150
      for C in "nc 0" "coherent 0" "coherent 16" "nc 0"; do
        set -- $C
        VLLM_SPECLA_SKINNY_PRE=$1 timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 \
            --alphas 0.8 --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --skinny-deep "$2" --tag "s32c_$1_$2" \
            --out "$OUT/e2e_s32c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s32e)  # session 32, call 2: the skinny GEMM's GPU tests on both builds (the deep configs' output bits against the
        # automatic config's), the GEMM chain at 5 / 8 rows on the coherent build (automatic, (8, 16), (8, 20)), and
        # coherent + deep 20 end to end (timeouts 120 + 70 + 120 + 70 + 70 + 60 = 510 s; a cold build takes ~60 s)
      skinny_build 120
      pytest_log s32e_nc 70 -rs tests/test_skinny_gemm_gpu.py
      export VLLM_SPECLA_SKINNY_PRE=coherent
      skinny_build 120
      pytest_log s32e_coherent 70 -rs tests/test_skinny_gemm_gpu.py
      timeout 70 python benchmarks/bench_blas.py --shapes flame,map --ms 5,8 --settings skinny:0:0,skinny:8:16,skinny:8:20 \
          --out "$OUT/blas_s32e_coherent.json" 2>&1 | grep -v Warn | tail -8
      timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights fp8 --skinny-deep 20 --tag s32e_coherent_20 --out "$OUT/e2e_s32e.jsonl" \
          2>&1 | grep "^{" | python -c "$S"
      unset VLLM_SPECLA_SKINNY_PRE
      ;;
  s32f)  # session 32, call 3: the skinny GEMM letting its dependent launch right after its PDL wait
        # (VLLM_SPECLA_SKINNY_EARLY=1, its own build) on the coherent build: tests, then batch 1 K = 7: coherent,
        # coherent + early, coherent + early + deep 16 (timeouts 150 + 70 + 3 x 60 = 400 s), then `auto`
      export VLLM_SPECLA_SKINNY_PRE=coherent VLLM_SPECLA_SKINNY_EARLY=1
      skinny_build 150
      pytest_log s32f 70 -rs tests/test_skinny_gemm_gpu.py
      for C in "0 0" "1 0" "1 16"; do
        set -- $C
        VLLM_SPECLA_SKINNY_EARLY=$1 timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 \
            --alphas 0.8 --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --skinny-deep "$2" \
            --tag "s32f_coherent_early$1_$2" --out "$OUT/e2e_s32f.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      unset VLLM_SPECLA_SKINNY_PRE VLLM_SPECLA_SKINNY_EARLY
      # then `auto` at batch 1 on the default build: session 34's policy (per-candidate exploration gaps,
      # explore_regret = 0.1) against s31d's fixed schedule, which met >= 0.98 (timeouts + 60 + 70 = 530 s)
      skinny_build 60
      timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 --alphas 0.8 --auto \
          --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s32f_auto" \
          --out "$OUT/e2e_s32f.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s32a)  # session 32, call 4: where a batch-1 step's device time goes: eager kernel durations (calls per step) and the
        # CUDA graph's per-kernel increments of the step's span (--graph: 20 profiled replays, as bench_e2e runs
        # it), AR and SpecLA K = 7 (float8 draft passes), flame and map; then flame with --conv-step on
        # (timeouts 150 + 240 + 150 = 540 s)
      skinny_build 150
      timeout 240 python benchmarks/step_breakdown.py --shapes flame,map --batches 1 --k 7 --modes ar,specla \
          --skinny-gemm on --draft-weights fp8 --steps 10 --graph 20 --top 30 --out "$OUT/breakdown_s32a.json" 2>&1 | \
          grep -v "^USDT\|^STAGE\|Warning"
      timeout 150 python benchmarks/step_breakdown.py --shapes flame --batches 1 --k 7 --modes ar,specla \
          --skinny-gemm on --draft-weights fp8 --steps 10 --graph 20 --top 12 --conv-step on \
          --out "$OUT/breakdown_s32a_convstep.json" 2>&1 | grep -v "^USDT\|^STAGE\|Warning"
      ;;
  s32b)  # session 32, call 5: the one-launch conv + recurrence of one-token steps (triton_chain.conv_chain_step,
        # chain_verify.CONV_STEP, off by default): its GPU tests (the kernel on the flame 1B and m-a-p 1.3B head
        # shapes and odd ones, in a CUDA graph; the runtime against the CPU path), then batch 1, K = 7, float8 draft
        # passes: off, on (4, 1, 256), (4, 1, 32) (the AR chain kernel's tile), (8, 2, 256), (16, 4, 256), off
        # (timeouts 150 + 120 + 6 x 50 = 570 s)
      skinny_build 150
      pytest_log s32b 120 -rs tests/test_conv_step_gpu.py tests/test_decode_runtime_gpu.py -k "conv_step"
      for C in off on 4,1,32 8,2,256 16,4,256 off; do
        timeout 50 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --conv-step "$C" --tag "s32b_$C" \
            --out "$OUT/e2e_s32b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s32d)  # session 32, call 6 (optional): the PDL contract in the SASS of the JIT-built extensions
        # (benchmarks/sass_pdl_check.py: global loads issued before griddepcontrol.wait per kernel). The chain-verify
        # kernels read q / k / v / g / beta with __ldg after pdl_enter(); ptxas may move such loads above the wait.
        # Builds the chain kernels (~2-4 min) and the coherent skinny build (timeouts 420 + 150 = 570 s)
      export MAX_JOBS=16
      timeout 420 python benchmarks/sass_pdl_check.py --build 2>&1 | tail -40
      VLLM_SPECLA_SKINNY_PRE=coherent timeout 150 python benchmarks/sass_pdl_check.py --build 2>&1 | tail -6
      ;;
  s31d)  # (as run: the pytest line timed out at 200 s after 210 of its 218 tests, none failed) session 31, call 4:
        # the shipped defaults after s31c (the row GEMV's narrow configs: bf16 (8, 2048, 8),
        # float8 (8, 4096, 8) for <= 4096 outputs): the runtime's and the row GEMV's GPU tests, batch 1 K = 6 / 7
        # twice, `auto` at batch 1
      skinny_build
      pytest_log s31d 200 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py \
          -k "gemv_rows or runtime_drafter or prologues or batch1 or fp8 or real_drafts or acceptance_control"
      for R in 1 2; do
        timeout 50 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s31d_r$R" \
            --out "$OUT/e2e_s31d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7 --alphas 0.8 --auto \
          --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s31d_auto" \
          --out "$OUT/e2e_s31d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s31c)  # session 31, call 3: after s31b's (8, 2048, 8) for the N = 2048 GEMMs: longer K tiles there (BK 4096, BN
        # 16), the same tile for every bf16 one-row GEMM (--gemv-rows), and float8 narrow configs for the drafter's
        # passes; the long-tile GPU tests first; batch 1, K = 7, float8 draft passes; the default first and last
      skinny_build
      pytest_log s31c 150 -rs tests/test_fused_gpu.py -k "long_k or narrow"
      for C in "" "--gemv-rows-narrow 8,2048,8" "--gemv-rows-narrow 8,4096,8" "--gemv-rows-narrow 16,2048,8" \
               "--gemv-rows-narrow 8,2048,8 --gemv-rows 8,2048,8,pro" "--gemv-rows-narrow 8,2048,8 --fp8-narrow 8,4096,8" \
               "--gemv-rows-narrow 8,2048,8 --fp8-narrow 16,2048,8" ""; do
        T=$(echo "${C:-default}" | tr -d ' -' | tr , _)
        timeout 55 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 $C --tag "s31c_$T" \
            --out "$OUT/e2e_s31c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s31b)  # session 31, call 2: the row GEMV's config for the N = 2048 GEMMs (o_proj, down_proj: one wave of 256
        # programs at (8, 1024, 8)), triton_fused.GEMV_ROWS_CONFIG_NARROW: its GPU test, then batch 1, K = 7, float8
        # draft passes, at six narrow configs and the default (first and last)
      skinny_build
      pytest_log s31b 120 -rs tests/test_fused_gpu.py -k "narrow or gated or prologues"
      for C in default 4,1024,8 4,1024,4 2,1024,4 16,1024,8 8,512,4 8,2048,8 default; do
        NA=""; [ "$C" != default ] && NA="--gemv-rows-narrow $C"
        timeout 55 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 $NA --tag "s31b_n$C" \
            --out "$OUT/e2e_s31b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s31a)  # (as run; the prefetches were removed after it, commit c2f772d keeps them: every form was slower) session 31,
        # call 1: L2 prefetches from each layer's conv launch (fused_model.CONV_PREFETCH_STATE / _BYTES):
        # their GPU tests (same bits, same tokens), then batch 1, K = 7, float8 draft passes: state prefetch off / on x
        # 0 / 12 / 24 MiB of [o_proj; gate|up] (flame's o_proj is 12 MiB, map's 8)
      skinny_build
      pytest_log s31a 150 -rs tests/test_kernels_gpu.py tests/test_decode_runtime_gpu.py -k "prefetch"
      for P in 0 12 24; do
        for ST in off on; do
          timeout 55 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7 --alphas 0.8 \
              --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --conv-prefetch-state $ST --conv-prefetch $P \
              --tag "s31a_st${ST}_w$P" --out "$OUT/e2e_s31a.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s30g)  # session 30, call 6 (the last minutes): the skinny GEMM's GPU tests at the final code (test_configs_dtypes now
        # has the automatic config: two chains in fp16 over several load batches), and one chain against two in one
        # process (skinny:8:8 is the single chain, skinny:0:0 the automatic two)
      skinny_build
      pytest_log s30g 120 -rs tests/test_skinny_gemm_gpu.py
      timeout 90 python benchmarks/bench_blas.py --shapes flame,map --ms 5,8 --settings skinny:8:8,skinny:0:0 \
          --out "$OUT/blas_s30g.json" 2>&1 | grep -v Warn | tail -8
      ;;
  s30f)  # session 30, call 5: the shipped defaults after s30e (the skinny GEMM's automatic config in two MMA chains at 1-8
        # rows, the absorb's float8 gather in one launch): the runtime's GPU tests, batch 1 K = 6 / 7 / 8 twice, and
        # `auto` at batch 1
      skinny_build
      pytest_log s30f 240 -rs tests/test_skinny_gemm_gpu.py tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py \
          -k "skinny or gather or runtime_drafter or prologues or batch1 or fp8 or real_drafts or acceptance_control"
      for R in 1 2; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7,8 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s30f_r$R" \
            --out "$OUT/e2e_s30f.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7,8 --alphas 0.8 --auto \
          --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --tag "s30f_auto" \
          --out "$OUT/e2e_s30f.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s30e)  # (as run; its --skinny-split-acc / VLLM_SPECLA_SKINNY_SPLIT_ACC was removed after it: two chains became the
        # automatic config, one chain is --skinny-gemm 8,8) session 30, call 4: the skinny GEMM's two MMA chains (VLLM_SPECLA_SKINNY_SPLIT_ACC, from s30d's fixed-latency
        # waits) and s30a's one-launch float8 gather: the skinny GEMM's GPU tests with the split on, s30a's tests; the
        # step's GEMM chain at 5 / 8 rows, split off / on; batch 1, K = 7 / 8, float8 draft passes, split off / on x
        # gather split / one, twice in alternation
      skinny_build
      export VLLM_SPECLA_SKINNY_SPLIT_ACC=1
      pytest_log s30e 150 -rs tests/test_skinny_gemm_gpu.py
      unset VLLM_SPECLA_SKINNY_SPLIT_ACC
      pytest_log s30e_gather 120 -rs tests/test_fused_gpu.py -k "gathers_gate or bad_gather or runtime_drafter"
      for A in 0 1; do
        VLLM_SPECLA_SKINNY_SPLIT_ACC=$A timeout 80 python benchmarks/bench_blas.py --shapes flame,map --ms 5,8 \
            --settings skinny:0:0 --out "$OUT/blas_s30e_split$A.json" 2>&1 | grep -v Warn | tail -4
      done
      for R in 1 2; do
        for A in off on; do
          for G in split one; do
            timeout 50 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7,8 --alphas 0.8 \
                --snapshot-ks "" --skinny-gemm on --skinny-split-acc $A --draft-weights fp8 --absorb-rows fp8 \
                --fp8-gather $G --tag "s30e_${A}_${G}_r$R" --out "$OUT/e2e_s30e.jsonl" 2>&1 | grep "^{" | python -c "$S"
          done
        done
      done
      ;;
  s30d)  # (as run, on s30c's code; commit 1dcdd58) session 30, call 3: why 9 rows (two 8-token tiles) cost the skinny GEMM 15 % more than 8 (s30b / s30c):
        # Nsight Compute at flame's in- / down-projection shapes, M = 8 / 9 / 16 (s30c's code): duration, DRAM
        # throughput, occupancy, and the warp-stall samples by reason and per SASS instruction; then every config at 9 rows
      skinny_build
      for m in 8 9 16; do
        timeout 150 ncu --kernel-name regex:skinny --launch-skip 2 --launch-count 2 --section SpeedOfLight \
            --section Occupancy --section SourceCounters --section WarpStateStats --import-source yes \
            -o "$OUT/ncu_s30d_m$m" -f python benchmarks/ncu_gemm.py --m $m 2>&1 | tail -1
        ncu -i "$OUT/ncu_s30d_m$m.ncu-rep" --page details --csv > "$OUT/ncu_s30d_m${m}_details.csv" 2>&1
        python benchmarks/ncu_details.py "$OUT/ncu_s30d_m${m}_details.csv" \
            --metrics "Duration,DRAM Throughput,Achieved Occupancy,Warp Cycles Per Issued Instruction,Executed Ipc Active"
        ncu -i "$OUT/ncu_s30d_m$m.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_s30d_m${m}_sass.csv" 2>&1
        python benchmarks/ncu_sass_stalls.py "$OUT/ncu_s30d_m${m}_sass.csv" --top 8 --out "$OUT/ncu_stalls_s30d_m$m.json" \
            > "$OUT/ncu_stalls_s30d_m$m.txt"
        head -30 "$OUT/ncu_stalls_s30d_m$m.txt"
        rm -f "$OUT/ncu_s30d_m$m.ncu-rep" "$OUT/ncu_s30d_m${m}_sass.csv" "$OUT/ncu_s30d_m${m}_details.csv"
      done
      timeout 120 python benchmarks/bench_blas.py --shapes flame --ms 9 --settings default,skinny:0:0 --skinny-sweep \
          --out "$OUT/blas_s30d.json" 2>&1 | grep -v Warn | tail -9
      ;;
  s30c)  # (as run; its staging was removed after s30d, commit ad1a18b keeps it) session 30, call 2: s30b with the staged rows copied by cp.async while tile 0 computes (s30b: plain loads
        # and a warp barrier before the loop, 1.11x cuBLAS at 9 rows); also the chain at 16 rows
      skinny_build
      pytest_log s30c 200 -rs tests/test_skinny_gemm_gpu.py
      timeout 100 python benchmarks/bench_blas.py --shapes flame,map --ms 8,9,16 --settings default,skinny:0:0 \
          --out "$OUT/blas_s30c.json" 2>&1 | grep -v Warn | tail -12
      for R in 1 2; do
        for M in 8 9; do
          timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7,8 --alphas 0.8 \
              --snapshot-ks "" --skinny-gemm on --skinny-max-m $M --draft-weights fp8 --tag "s30c_m${M}_r$R" \
              --out "$OUT/e2e_s30c.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s30b)  # (as run; its staging with plain loads before the loop was replaced by s30c's cp.async) session 30, call 1:
        # the skinny GEMM's rows past 8 staged in shared memory (9-row windows, K = 8): its GPU
        # tests, the step's GEMM chain at 8 / 9 rows (skinny vs cuBLAS), then batch 1, K = 7 / 8, float8 draft passes,
        # fused.SKINNY_MAX_M 8 (9 rows on cuBLAS) against 9, twice in alternation
      skinny_build
      pytest_log s30b 200 -rs tests/test_skinny_gemm_gpu.py
      timeout 100 python benchmarks/bench_blas.py --shapes flame,map --ms 8,9 --settings default,skinny:0:0 \
          --out "$OUT/blas_s30b.json" 2>&1 | grep -v Warn | tail -8
      for R in 1 2; do
        for M in 8 9; do
          timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 7,8 --alphas 0.8 \
              --snapshot-ks "" --skinny-gemm on --skinny-max-m $M --draft-weights fp8 --tag "s30b_m${M}_r$R" \
              --out "$OUT/e2e_s30b.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s30a)  # (not run as such: s30e ran its A/B; FP8_GATHER_ONE_LAUNCH is on by default since, so --fp8-gather split is the
        # old form) prepared in session 29: the absorb's gathered float8 o_proj as one
        # row-GEMV launch on the float32 recurrence output (fused.FP8_GATHER_ONE_LAUNCH, off; gemv_rows(out_dtype=)):
        # its GPU tests, then batch 1, K = 6 / 7 / 8, float8 draft passes: the accepted rows on float8 with the gather
        # split (today's default) / in one launch, and on the model weights (no acceptance cost), twice in alternation
      skinny_build
      pytest_log s30a 120 -rs tests/test_fused_gpu.py -k "gathers_gate or bad_gather or runtime_drafter"
      for R in 1 2; do
        for G in split one model; do
          F="--absorb-rows fp8 --fp8-gather $G"
          [ "$G" = model ] && F="--absorb-rows model"
          timeout 45 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7,8 --alphas 0.8 \
              --snapshot-ks "" --skinny-gemm on --draft-weights fp8 $F --tag "s30a_${G}_r$R" \
              --out "$OUT/e2e_s30a.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s29e)  # (as run; its float8 row GEMV on float32 activations, out_dtype, was removed after it: flame's step got slower;
        # commit 637b841 keeps it) session 29, call 5 (carry .whl; ~5 minutes left): the float8 row GEMV on float32 activations (out_dtype; the
        # review of session 29 found the float8 o_proj of every draft pass, and the absorb's gathered one, running the
        # gated norm as launches of their own): its GPU tests, then batch 1, K = 6 / 7 / 8, float8 draft passes, the
        # absorb's accepted rows on float8 against the model weights, twice in alternation
      skinny_build
      pytest_log s29e 100 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py \
          -k "gathers_gate or bad_gather or runtime_drafter or fp8_draft"
      for R in 1 2; do
        for A in fp8 model; do
          timeout 45 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7,8 --alphas 0.8 \
              --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --absorb-rows $A --tag "s29e_${A}_r$R" \
              --out "$OUT/e2e_s29e.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s29d)  # (as run; the int4 form was removed after it: commit f136f22 keeps it, so s29c / s29d cannot be rerun as written)
        # session 29, call 4 (carry .whl): the int4 row GEMV with its products and group sums in float16
        # (GEMV_ROWS_W4_F16; s29c's float32 form lost to float8): its GPU tests, the drafter's one-row GEMMs (int4 at
        # four configs in float16, one in float32), batch 1, K = 6 / 8, float8 against int4 (4, 4, float16), twice
      skinny_build
      pytest_log s29d 150 -rs tests/test_fused_gpu.py -k "int4 and (True or gated or rejects)"
      timeout 150 python benchmarks/bench_fp8_gemv.py --modes bf16,fp8,int4 --int4-configs "4,4,1;8,8,1;16,8,1;2,4,1;4,4,0" \
          --out "$OUT/fp8_gemv_s29d.jsonl" 2>&1 | tail -16
      for R in 1 2; do
        timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,8 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8,int4 --int4-config 4,4,1 --tag "s29d_r$R" \
            --out "$OUT/e2e_s29d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s29c)  # (as run; its int4 gated-prologue test passed x in float32, fixed after it) session 29, call 3 (carry .whl): int4 draft-pass weights (draft_weights="int4": quantize_int4, group 32;
        # the row GEMV's int4 form, gemv_rows(w4=)): its GPU tests, the drafter's six one-row GEMMs bf16 / fp8 / int4
        # (int4 at four (BN, warps) configs), then batch 1, K = 6 / 7 / 8, float8 against int4 draft passes, twice
      skinny_build
      pytest_log s29c 240 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py \
          -k "int4 or gather or fp8 or runtime_drafter or batch1"
      timeout 150 python benchmarks/bench_fp8_gemv.py --modes bf16,fp8,int4 --int4-configs "8,8;4,4;16,8;32,8" \
          --out "$OUT/fp8_gemv_s29c.jsonl" 2>&1 | tail -14
      for R in 1 2; do
        timeout 80 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7,8 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8,int4 --tag "s29c_r$R" --out "$OUT/e2e_s29c.jsonl" \
            2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s29b)  # (as run) session 29, call 2 (carry .whl): the drafter's absorb pass past its recurrence on each request's accepted row
        # only (decode.ABSORB_ACCEPTED_ROWS; bench_e2e --absorb-rows fp8 | model | off): its GPU tests, then batch 1,
        # K = 6 / 7 / 8, float8 draft passes, the absorb's fc / in-projection on float8 through the skinny GEMM (s29a's
        # winner; K = 8's 9 rows stay bf16) or bf16 ("bf16window"), twice in alternation; batch 64, K = 4, model weights, on / off once (cuBLAS on B rows)
      skinny_build
      pytest_log s29b 200 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py \
          -k "gather or runtime_drafter or prologues or batch1 or fp8 or real_drafts or acceptance_control"
      e2e_b1() {  # TAG FLAGS...: batch 1, K = 6 / 7 / 8, float8 draft passes
        local tag=$1
        shift
        timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,7,8 --alphas 0.8 \
            --snapshot-ks "" --skinny-gemm on --draft-weights fp8 --out "$OUT/e2e_s29b.jsonl" --tag "$tag" "$@" 2>&1 \
            | grep "^{" | python -c "$S"
      }
      for R in 1 2; do
        e2e_b1 "s29b_off_r$R" --skinny-fp8 on --fp8-max-tokens 8 --absorb-rows off
        e2e_b1 "s29b_fp8_r$R" --skinny-fp8 on --fp8-max-tokens 8 --absorb-rows fp8
        e2e_b1 "s29b_fp8_bf16window_r$R" --absorb-rows fp8
      done
      for A in off model; do
        timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 64 --ks 4 --alphas 0.8 --snapshot-ks '' \
            --skinny-gemm on --absorb-rows $A --tag "s29b_b64_$A" --out "$OUT/e2e_s29b.jsonl" 2>&1 \
            | grep "^{" | python -c "$S"
      done
      ;;
  s29a)  # (as run) session 29, call 1 (prepared in session 28): the skinny GEMM's float8 form for the drafter's
        # absorb pass (_cpp.skinny_gemm_fp8, fused.USE_SKINNY_FP8, off by default; compile-checked for sm_90 only): its
        # GPU tests, then batch 1, K = 4 / 6 / 7 (absorb windows of K + 1 <= 8 rows), float8 draft passes, the absorb on
        # bf16 (default) against float8 through the skinny form, twice in alternation
      skinny_build
      pytest_log s29a 200 -rs tests/test_skinny_gemm_gpu.py tests/test_fused_gpu.py -k "fp8 or gather or runtime_drafter"
      for M in 5 7; do  # the absorb pass's GEMMs alone (K = 4 / 6): bf16 skinny, float8 row GEMV, float8 skinny
        timeout 90 python benchmarks/bench_fp8_gemv.py --rows $M --skinny-gemm --out "$OUT/fp8_gemv_s29a.jsonl" 2>&1 | tail -8
      done
      for R in 1 2; do
        timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,7 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --draft-weights fp8 --tag "s29a_bf16absorb_r$R" --out "$OUT/e2e_s29a.jsonl" 2>&1 \
            | grep "^{" | python -c "$S"
        timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,7 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --draft-weights fp8 --skinny-fp8 on --fp8-max-tokens 8 --tag "s29a_fp8absorb_r$R" \
            --out "$OUT/e2e_s29a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s28e)  # (as run; its row-gather test expectation was fixed after it) session 28, call 5 (carry .whl; ~5 minutes left): the final code's GPU tests (the drafter's glue: its fallback
        # path now returns the norm's own tensor, no copy) and batch 1, K = 6, float8 draft passes once
      skinny_build
      pytest_log s28e 150 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py \
          -k "gather or embedding_prologue or runtime_drafter or real_drafts or fp8_draft or batch1 or acceptance_control"
      timeout 45 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights fp8 --tag s28e --out "$OUT/e2e_s28e.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s28d)  # (as run) session 28, call 4 (carry .whl): `auto` on the grid at today's code (last: s14e), batch 1 / 16 / 64 / 256,
        # K = 2 / 4 / 6, alpha 0.8, both shapes, the skinny GEMM built (s26c without the CUDA csrc build, to fit the call)
      skinny_build
      timeout 480 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16,64,256 --ks 2,4,6 --alphas 0.8 --auto \
          --snapshot-ks "" --skinny-gemm on --tag s28d --out "$OUT/e2e_s28d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s28c)  # (as run; the conv gating and --conv-gating were removed after it: commit f597181 keeps them) session 28, call 3 (carry .whl): the GDN gating of multi-token windows in the conv kernel's launch
        # (fused.CONV_GATING: one launch per layer fewer in every verify window and the drafter's absorb pass): its GPU
        # tests, then batch 1, K = 6 / 8 (model and float8 draft passes) and batch 64, K = 4, on / off, in alternation
      skinny_build
      pytest_log s28c 200 -rs tests/test_kernels_gpu.py tests/test_decode_runtime_gpu.py tests/test_fused_gpu.py \
          -k "conv or batch1 or fp8 or acceptance_control or runtime_drafter or real_drafts or draft_vocab"
      for R in 1 2; do
        for G in on off; do
          timeout 75 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,8 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --draft-weights model,fp8 --conv-gating $G --tag "s28c_${G}_r$R" \
              --out "$OUT/e2e_s28c.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      for G in on off; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 64 --ks 4 --alphas 0.8 --snapshot-ks "" \
            --conv-gating $G --tag "s28c_${G}_b64" --out "$OUT/e2e_s28c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s28b)  # (as run) session 28, call 2 (carry .whl): the drafter's glue as the row GEMV's prologues (fused.DRAFT_GLUE_PROLOGUES:
        # the embedding gather in the fc GEMV, the final norm + the accepted row's gather in the LM head, the normed features
        # stored by it; two to three launches fewer per draft pass): its GPU tests, then batch 1, K = 6 / 8, model and
        # float8 draft passes, fused / separate, twice in alternation
      skinny_build
      pytest_log s28b 240 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py \
          -k "gather or embedding_prologue or runtime_drafter or fp8 or batch1 or acceptance_control"
      for R in 1 2; do
        for G in fused separate; do
          timeout 75 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,8 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --draft-weights model,fp8 --draft-glue $G --tag "s28b_${G}_r$R" \
              --out "$OUT/e2e_s28b.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s28a)  # (as run; the int / asm / mix modes were removed after it: commit 3bafdc5 keeps them) session 28, call 1 (carry .whl): how the float8 row GEMV widens e4m3 (triton_fused.GEMV_FP8_CONVERT: cvt / int /
        # asm / mix): its GPU tests, the drafter's one-row GEMMs alone (bench_fp8_gemv.py), then batch 1, K = 6 / 8, float8
        # draft passes end to end (session 27: the float8 GEMV at ~2.4 TB/s of float8 bytes; SpecLA at batch 1 2.14-2.17x,
        # 24-42 us per step short of 2.2x)
      skinny_build
      pytest_log s28a 150 -rs tests/test_fused_gpu.py -k fp8
      timeout 120 python benchmarks/bench_fp8_gemv.py --out "$OUT/fp8_gemv_s28a.jsonl" 2>&1 | tail -14
      for R in 1 2; do
        for C in cvt asm mix; do
          [ $R = 2 ] && [ $C = mix ] && continue
          timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,8 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --draft-weights fp8 --fp8-convert $C --tag "s28a_${C}_r$R" \
              --out "$OUT/e2e_s28a.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s27c)  # (as run; the epilogue measured slower and removed after it with --argmax-epilogue, so it cannot be rerun as
        # written: commit 8fa19af keeps them) session 27, call 4 (carry .whl): the one-row LM head's greedy token as the row GEMV's epilogue
        # (fused.linear_argmax; the drafter's draft passes and the AR step): its GPU tests, then batch 1, K = 6 / 8, model
        # and fp8 draft weights, epilogue on / off; fp8 with a 4000-token draft vocabulary
      skinny_build
      pytest_log s27c 120 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py -k "argmax or fp8 or batch1"
      for E in on off; do
        timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,8 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --draft-weights model,fp8 --argmax-epilogue $E --tag "s27c_am$E" \
            --out "$OUT/e2e_s27c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,8 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights fp8 --draft-vocabs 4000 --tag s27c_dv4000 \
          --out "$OUT/e2e_s27c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s27b)  # (as run) session 27, call 3 (carry .whl): s27a found the float8 draft passes at ~2.45 TB/s of float8 bytes against the bf16
        # row GEMV's ~3.36: the float8 GEMV config, batch 1, K = 6, flame and map (the first with model weights too)
      skinny_build
      for C in 8,2048,8 8,2048,4 4,2048,4 16,2048,16 8,1024,4 32,512,8; do
        DW=fp8; [ "$C" = 8,2048,8 ] && DW=model,fp8
        timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --draft-weights $DW --fp8-config $C --tag "s27b_$C" \
            --out "$OUT/e2e_s27b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s27a)  # (as run) session 27, call 2 (carry .whl): float8 draft-pass weights (FusedEagle(draft_weights="fp8"), the row GEMV's
        # w_scale form): its GPU tests, then batch 1 (alpha 0.8, K = 4 / 6 / 8) model vs fp8 draft weights at the full and
        # a 4000-token draft vocabulary; at K = 6 a second float8 GEMV config, the absorb pass on float8 too
        # (--fp8-max-tokens 16), and model / fp8 again
      skinny_build
      pytest_log s27a 120 -rs tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py -k "fp8 or batch1_row_gemv"
      timeout 170 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights model,fp8 --draft-vocabs 0,4000 --tag s27a_r1 \
          --out "$OUT/e2e_s27a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights fp8 --fp8-config 16,1024,8 --tag s27a_c16 \
          --out "$OUT/e2e_s27a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights fp8 --fp8-max-tokens 16 --tag s27a_mt16 \
          --out "$OUT/e2e_s27a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --draft-weights fp8,model --tag s27a_r2 \
          --out "$OUT/e2e_s27a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s26a)  # NEXT SESSION (prepared in session 26, which had no device time left): the final code of sessions 25-26 (no
        # kernel changed in 26), its runtime GPU tests, then batch 1 (alpha 0.8, K = 4 / 6 / 8) at the full and a
        # 4000-token draft vocabulary (last measured in s15e, before sessions 16-25 sped up the step), twice in alternation
      skinny_build
      pytest_log s26a 150 -rs tests/test_step_kernels.py tests/test_argmax_gpu.py tests/test_embed_gpu.py \
          tests/test_decode_runtime_gpu.py
      for R in 1 2; do
        for DV in 0 4000; do
          timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --draft-vocabs $DV --tag "s26a_dv${DV}_r$R" --out "$OUT/e2e_s26a.jsonl" 2>&1 | \
              grep "^{" | python -c "$S"
        done
      done
      ;;
  s26b)  # NEXT SESSION (prepared in session 26): issue 6's snapshot ratios at today's code (last: s14b / s13e), batch
        # 64 / 256, K = 4, alpha 0.8, both shapes, the CUDA csrc and the skinny GEMM built
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      skinny_build
      timeout 400 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --cuda-csrc --skinny-gemm on --tag s26b --out "$OUT/e2e_s26b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s26c)  # NEXT SESSION (prepared in session 26): `auto` on the grid at today's code (last: s14e), batch 1 / 16 / 64 /
        # 256, K = 2 / 4 / 6, alpha 0.8, both shapes, the CUDA csrc and the skinny GEMM built
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      skinny_build
      timeout 420 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16,64,256 --ks 2,4,6 --alphas 0.8 --auto \
          --snapshot-ks "" --cuda-csrc --skinny-gemm on --tag s26c --out "$OUT/e2e_s26c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s25d)  # (as run) session 25, call 4: the review fixes' GPU tests (the Triton coins keyed per runtime, the acceptance control
        # under CUDA graphs, argmax's out / ids contract); then, as time allows, issue 5's fused commit and step vs
        # replay with today's kernels (last measured in s7d, before sessions 17-23 changed the one-token replay path)
      pytest_log s25d_rt 100 -rs tests/test_decode_runtime_gpu.py -k "acceptance_control or batch1"
      pytest_log s25d 60 -rs tests/test_step_kernels.py tests/test_argmax_gpu.py tests/test_embed_gpu.py
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 150 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 90 python benchmarks/bench_commit_cuda.py --impls cuda,triton --batches 32,128 \
          --out "$OUT/commit_s25d.json" 2>&1 | grep -v '^{'
      ;;
  s25c)  # (as run; the conv epilogue and --conv-epilogue were removed after it: commit 5b05a9a / its successor keep them) session 25, call 3: s25b found the conv epilogue (its loads before the K loop) 0.11 ms slower in the AR
        # step; now its loads after the K loop (default) against early / off, the GPU tests of the changed code,
        # end to end at batch 1 (K = 6, alpha 0.8), twice in alternation
      skinny_build
      pytest_log s25c 120 -rs tests/test_fused_gpu.py -k "conv or gating or gemv" tests/test_decode_runtime_gpu.py
      for R in 1 2; do
        for C in on off early; do
          timeout 60 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --conv-epilogue $C --tag "s25c_${C}_r$R" \
              --out "$OUT/e2e_s25c.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s25b)  # (as run; its --conv-epilogue on = s25c's "early"; the conv epilogue was removed after s25c, so its A/B cannot be rerun) session 25, call 2: the drafting glue as Triton launches (fused.embed, step_kernels.control_drafts, argmax
        # into the window; --glue-kernels) and the short conv as the row GEMV's epilogue at one token row
        # (fused.GEMV_ROWS_CONV; --conv-epilogue): their GPU tests with the decode runtime's, then end to end at
        # batch 1 (K = 4 / 6, alpha 0.8): new / glue only / neither, twice in alternation
      skinny_build
      pytest_log s25b 150 -rs tests/test_fused_gpu.py tests/test_argmax_gpu.py tests/test_embed_gpu.py \
          tests/test_step_kernels.py tests/test_decode_runtime_gpu.py
      for R in 1 2; do
        for GC in triton,on triton,off torch,off; do
          timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --glue-kernels ${GC%,*} --conv-epilogue ${GC#*,} --tag "s25b_${GC/,/_}_r$R" \
              --out "$OUT/e2e_s25b.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s25a)  # (as run) for session 25: the final code of session 24 (the one-launch step bookkeeping; the skinny GEMM without the
        # removed fused forms) end to end at batch 1 (K = 4 / 6, alpha 0.8), the bookkeeping as Triton / torch, twice in
        # alternation (session 23's kernel table: s24a)
      skinny_build
      pytest_log s25a 120 -rs tests/test_step_kernels.py tests/test_decode_runtime_gpu.py
      for R in 1 2; do
        for A in triton torch; do
          timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --accept-kernel $A --tag "s25a_${A}_r$R" --out "$OUT/e2e_s25a.jsonl" 2>&1 | grep "^{" | \
              python -c "$S"
        done
      done
      ;;
  s24d)  # (as run; --skinny-fused and the fused forms were removed after it) session 24, call 3: s24c's gated form failed to launch at 7 rows x 3072 (43 KB staged + 8.7 KB static > the
        # 48 KiB default; the opt-in now covers every size): the fused tests, the forms (flame, 7 rows), end to end
      skinny_build
      pytest_log s24d 100 -rs tests/test_skinny_gemm_gpu.py -k "fused"
      timeout 60 python benchmarks/bench_skinny_fused.py --shapes flame --rows 7 --out "$OUT/skinny_fused_s24d.json" 2>&1 | \
          grep -v "^{" | tail -8
      for F in on off; do
        timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --skinny-fused $F --tag "s24d_f${F}" --out "$OUT/e2e_s24d.jsonl" 2>&1 | grep "^{" | \
            python -c "$S"
      done
      ;;
  s24c)  # (as run; --skinny-fused and the fused forms were removed after it) session 24, call 2: s24b found SpecLA's batch-1 step 0.87 ms slower with the fused forms (their activation
        # loads serialized per chunk in the MMA loop); now staged in shared memory once per CTA. Each form against its
        # unfused chain (bench_skinny_fused.py), the skinny GEMM's GPU tests, end to end at batch 1 (K = 6, alpha 0.8)
        # fused on / off; then session 23's chain kernels (s24a without its kernel table): the CUDA chain GPU tests
      skinny_build
      timeout 100 python benchmarks/bench_skinny_fused.py --out "$OUT/skinny_fused_s24c.json" 2>&1 | grep -v "^{" | tail -24
      pytest_log s24c 120 -rs tests/test_skinny_gemm_gpu.py tests/test_step_kernels.py
      for F in on off; do
        timeout 70 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --skinny-fused $F --tag "s24c_f${F}" --out "$OUT/e2e_s24c.jsonl" 2>&1 | grep "^{" | \
            python -c "$S"
      done
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 330 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s24a 150 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      ;;
  s24b)  # (as run; --skinny-fused and the fused forms were removed after it) session 24, call 1: the skinny GEMM's fused forms (RMSNorm / SwiGLU / gated RMSNorm prologues, the GDN gating
        # epilogue; fused.SKINNY_FUSED) and the one-launch step bookkeeping (runtime/step_kernels.py): their GPU tests
        # with the rest of the skinny GEMM's and the decode runtime's, then end to end at batch 1 (K = 6, alpha 0.8):
        # both new (default) / neither / the fused forms only, twice in alternation
      skinny_build
      pytest_log s24b 200 -x -rs tests/test_skinny_gemm_gpu.py tests/test_step_kernels.py tests/test_decode_runtime_gpu.py
      for R in 1 2; do
        for FA in on,triton off,torch on,torch; do
          timeout 80 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --skinny-fused ${FA%,*} --accept-kernel ${FA#*,} --tag "s24b_${FA/,/_}_r$R" \
              --out "$OUT/e2e_s24b.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s24a)  # (its GPU tests ran in s24c: 2,067 passed; the kernel table not run) session 23's last two commits (rg_token_stores, rg_token_core: one token body with
        # key accessors) ran no GPU test (offline sm_90 SASS unchanged for the kernels checked, the bf16 8-row ring
        # rescheduled). Every CUDA chain test and the dispatch tests, then the kernel table at the defaults
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s24a 220 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto --out "$OUT/csrc_s24a.json" \
          > /dev/null 2>&1; echo "rc $?"
      csrc_ratios "$OUT/csrc_s24a.json"
      ;;
  s23d)  # (as run) session 23, call 4: the public op's new rule (bf16 one-token AR at <= 16 pairs to the CUDA op where its RAW
        # body's two launches fit on an sm_90+ GPU: ops/chain_verify.py _cuda_small_ar; the binding's default takes the
        # RAW body for bf16 at K = 256 only): its GPU test and the AR / tuning / dispatch tests
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 240 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s23d 100 -x -rs tests/test_csrc.py -k "routes_small or rg_ar or tuning_variable" tests/test_dispatch.py
      ;;
  s23c)  # (as run) session 23, call 3 (the final kernels): the default VLLM_SPECLA_CUDA_RG_AR=4 (the RAW body where two launches'
        # CTAs fit on the GPU at once, else the 12-per-SM body), the RPL-2 forms of s23b removed. Every CUDA chain test and
        # the dispatch tests, the A/B of 4 / 2 / 3 / 0 twice (the second in reverse order), the full table at the
        # defaults, Nsight Compute (cold) of the default at batch 2 / 1
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s23c 220 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      for ars in 4,2,3,0 0,3,2,4; do
        echo "== A/B $ars (cuda us / ratio)"
        timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1 --layout auto --rg-ar $ars \
            --out "$OUT/csrc_s23c_${ars//,/}.json" > /dev/null 2>&1; echo "rc $?"
        csrc_ratios "$OUT/csrc_s23c_${ars//,/}.json"
      done
      echo "== full table (defaults)"
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto --out "$OUT/csrc_s23c_full.json" \
          > /dev/null 2>&1; echo "rc $?"
      csrc_ratios "$OUT/csrc_s23c_full.json"
      for b in 2 1; do ncu_ar_cold s23c $b "Duration,Registers Per Thread"; done
      ;;
  s23b)  # (as run; its RG_AR 5 / 6 were removed after it) session 23, call 2: after s23a (the RAW body at 96 registers fastest where the next launch's CTAs fit
        # beside a launch, 0.94-0.95x Triton; 1.37x at 6x256x512 batch 2 where only part of them do), plain AR at 8 rows
        # per warp (RG_AR 5: the RAW body, 128 registers; 6: the fp32-key AR body, 157): 768 CTAs at 6x256x512
        # batch 2. The AR tests, the A/B twice (the second in reverse order), Nsight Compute (cold) of 3 / 5 / 6.
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s23b 150 -x tests/test_csrc.py -k "rg_ar or tuning_variable"
      for ars in 2,3,5,6,0 0,6,5,3,2; do
        echo "== A/B $ars (cuda us / ratio)"
        timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1 --layout auto --rg-ar $ars \
            --out "$OUT/csrc_s23b_${ars//,/}.json" > /dev/null 2>&1; echo "rc $?"
        csrc_ratios "$OUT/csrc_s23b_${ars//,/}.json"
      done
      for ar in 3 5 6; do for b in 2 1; do ncu_ar_cold s23b $b "Duration,Registers Per Thread" $ar; done; done
      ;;
  s23a)  # (as run; its RG_AR 4 (80 registers) was replaced after it, 4 is now the automatic rule) session 23, call 1: the AR body's key head without integer division when HV == H (all row-group bodies);
        # the RAW AR body (q / k kept as loaded, widened where read: 96 / 80 registers, RG_AR 3 / 4) against the
        # 124-register body (1 uncapped, 2 capped at 12 CTAs per SM: the default) and the one-ahead body (0), with and
        # without PDL on both sides (Triton's 80-register AR kernel leaves room for the next launch's CTAs while one
        # runs; the 124-register body does not). GPU tests, the A/B twice, the full table once, Nsight Compute (cold)
        # durations and registers.
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s23a 220 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      R='import sys,json
for r in json.load(open(sys.argv[1])):
  print(r["shape"], r["batch"], r["T"], r["kind"], "triton %.2f" % r["triton_us"], "triton_nopdl %.2f" % r.get("triton_nopdl_us", 0),
        " ".join("%s %.2f/%.3f" % (k[5:-3] or "dflt", r[k], r.get(k[:-3] + "_over_triton_nopdl", r.get(k[:-3] + "_over_triton", 0))) for k in r if k.startswith("cuda") and k.endswith("_us")))'
      for rep in 1 2; do
        echo "== A/B rep $rep (cuda us / ratio; _nopdl ratios against triton_nopdl)"
        timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1 --layout auto --rg-ar 2,3,4,1,0 --pdl 1,0 \
            --out "$OUT/csrc_s23a_ab_r$rep.json" > /dev/null 2>&1; echo "rc $?"
        python -c "$R" "$OUT/csrc_s23a_ab_r$rep.json"
      done
      echo "== full table (defaults)"
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto --out "$OUT/csrc_s23a_full.json" \
          > /dev/null 2>&1; echo "rc $?"
      python -c "$R" "$OUT/csrc_s23a_full.json"
      for ar in 2 3 4; do for b in 2 1; do
        ncu_ar_cold s23a $b "Duration,Registers Per Thread,Achieved Occupancy,Block Limit Registers" $ar
      done; done
      ;;
  s22b)  # (as run) session 22, call 2 (its RG_AR unset was 1 then, 2 since: the sampling below ran the uncapped form;
        # printed results of what did not come back as files: benchmarks/h200_s22b_printed.txt): the AR body with its first token computed before the row's bounds are known (no
        # branch before its loads; empty rows predicated) and without the zeroing selects of rows past V (s22a's two
        # largest waits); plain AR build 648 SASS lines / 124 registers offline. Every CUDA chain test and the
        # dispatch tests, the kernel table at batch 1 / 2 with the AR body on (RG_AR 1; 2: at most 12 CTAs
        # per SM) / off twice, Nsight Compute (cold L2) durations of AR at batch 1 / 2 in the three forms against Triton, then the AR body's sampling at batch 2
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s22b 200 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      for rep in 1 2; do for ar in 1 2 0; do
        echo "== rg_ar $ar (rep $rep)"
        VLLM_SPECLA_CUDA_RG_AR=$ar timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 \
            --layout auto --out "$OUT/csrc_s22b_ar${ar}_r$rep.json" 2>&1 | grep -v "^{" | grep -v -i warn \
            | grep -E "ar|step|verify" | tr -s ' ' | paste -sd';'
      done; done
      for ar in 1 2 0; do for b in 2 1; do
        echo "== cold, rg_ar $ar, batch $b"
        VLLM_SPECLA_CUDA_RG_AR=$ar timeout 60 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 \
            --section SpeedOfLight -o "$OUT/ncu_s22b" -f python benchmarks/ncu_chain.py --ar --batch $b 2>&1 | tail -1
        ncu -i "$OUT/ncu_s22b.ncu-rep" --page details --csv > "$OUT/ncu_s22b_details.csv" 2>&1
        python benchmarks/ncu_details.py "$OUT/ncu_s22b_details.csv" --metrics "Duration" | tee "$OUT/ncu_s22b_ar${ar}_b$b.txt"
        rm -f "$OUT/ncu_s22b.ncu-rep" "$OUT/ncu_s22b_details.csv"
      done; done
      timeout 60 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 --section SourceCounters \
          --section WarpStateStats --import-source yes -o "$OUT/ncu_s22b_b2" -f python benchmarks/ncu_chain.py --ar \
          --batch 2 2>&1 | tail -1
      ncu -i "$OUT/ncu_s22b_b2.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_s22b_b2_sass.csv" 2>&1
      python benchmarks/ncu_sass_stalls.py "$OUT/ncu_s22b_b2_sass.csv" --top 6 --out "$OUT/ncu_stalls_s22b_b2.json" \
          | tee "$OUT/ncu_stalls_s22b_b2.txt"
      rm -f "$OUT/ncu_s22b_b2.ncu-rep" "$OUT/ncu_s22b_b2_sass.csv"
      ;;
  s22a)  # (as run) session 22, call 1 (prepared in session 21): the AR body without the factor-bank path for
        # plain AR steps (chain_verify_rg_ar<REC = false>: 672 SASS lines and 128 registers against 856 / 154; the
        # recording build is SASS-identical to s21d's AR kernel). Every CUDA chain test and the dispatch tests, the
        # kernel table at batch 1 / 2 with the AR body on / off (RG_AR 1 / 0) twice, then its per-instruction
        # sampling at batch 1 / 2 against Triton (s21e: 732 instructions per warp against 632)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s22a 200 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      for rep in 1 2; do for ar in 1 0; do
        echo "== rg_ar $ar (rep $rep)"
        VLLM_SPECLA_CUDA_RG_AR=$ar timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 \
            --layout auto --out "$OUT/csrc_s22a_ar${ar}_r$rep.json" 2>&1 | grep -v "^{" | grep -v -i warn \
            | grep -E "ar|step|verify" | tr -s ' ' | paste -sd';'
      done; done
      for b in 2 1; do
        timeout 60 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 --section SpeedOfLight \
            --section SourceCounters --section WarpStateStats --import-source yes -o "$OUT/ncu_s22a_b$b" -f \
            python benchmarks/ncu_chain.py --ar --batch $b 2>&1 | tail -1
        ncu -i "$OUT/ncu_s22a_b$b.ncu-rep" --page details --csv > "$OUT/ncu_s22a_b${b}_details.csv" 2>&1
        python benchmarks/ncu_details.py "$OUT/ncu_s22a_b${b}_details.csv" --metrics "Duration,SM Active Cycles"
        ncu -i "$OUT/ncu_s22a_b$b.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_s22a_b${b}_sass.csv" 2>&1
        python benchmarks/ncu_sass_stalls.py "$OUT/ncu_s22a_b${b}_sass.csv" --top 6 --out "$OUT/ncu_stalls_s22a_b$b.json" \
            | tee "$OUT/ncu_stalls_s22a_b$b.txt"
        rm -f "$OUT/ncu_s22a_b$b.ncu-rep" "$OUT/ncu_s22a_b${b}_sass.csv" "$OUT/ncu_s22a_b${b}_details.csv"
      done
      ;;
  s21e)  # (as run) session 21, call 5 (the last device minutes): per-instruction
        # warp sampling of the row-group AR body (s21d's final code) against Triton, one-token AR at batch 1 and 2 of
        # 6x256x512 (batch 1: where it lost 0.1-0.2 us to the 8-key one-ahead body with the state in L2)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      for b in 2 1; do
        timeout 60 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 --section SourceCounters \
            --section WarpStateStats --import-source yes -o "$OUT/ncu_s21e_b$b" -f python benchmarks/ncu_chain.py --ar \
            --batch $b 2>&1 | tail -1
        ncu -i "$OUT/ncu_s21e_b$b.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_s21e_b${b}_sass.csv" 2>&1
        python benchmarks/ncu_sass_stalls.py "$OUT/ncu_s21e_b${b}_sass.csv" --top 10 --out "$OUT/ncu_stalls_s21e_b$b.json" \
            | tee "$OUT/ncu_stalls_s21e_b$b.txt"
        rm -f "$OUT/ncu_s21e_b$b.ncu-rep" "$OUT/ncu_s21e_b${b}_sass.csv"
      done
      ;;
  s21d)  # (as run) session 21, call 4 (the final code): the row-group AR body (chain_verify_rg_ar: the state tile and the token's q / k / v / g /
        # beta loaded straight into registers, no cp.async / shared memory / warp syncs; 154 registers) for one-token
        # rows without pending factors; the lane-pair swapped stores removed; every row-group / sb row access with
        # immediate offsets from one 64-bit base (rg_off). The CUDA chain tests and the dispatch tests, the kernel
        # table at batch 1 / 2 with (RG_AR, RG_PIECE) = (1, 4) (0, 8) (1, 4) (0, 8) (the new default against session
        # 20's row-group form); Nsight Compute (cold L2) of AR at batch 2 with the AR body and without, against Triton
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s21d 200 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      for rep in 1 2; do for cfg in 1,4 0,8; do
        ar=${cfg%,*} pw=${cfg#*,}
        echo "== rg_ar $ar rg_piece $pw (rep $rep)"
        VLLM_SPECLA_CUDA_RG_AR=$ar VLLM_SPECLA_CUDA_RG_PIECE=$pw timeout 60 python benchmarks/bench_csrc_cuda.py \
            --batches 1,2 --Ts 1,5,8 --layout auto --out "$OUT/csrc_s21d_ar${ar}_pw${pw}_r$rep.json" 2>&1 \
            | grep -v "^{" | grep -v -i warn | grep -E "ar|step|verify" | tr -s ' ' | paste -sd';'
      done; done
      for ar in 1 0; do
        VLLM_SPECLA_CUDA_RG_AR=$ar timeout 90 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis -o "$OUT/ncu_s21d_ar$ar" -f \
            python benchmarks/ncu_chain.py --ar --batch 2 2>&1 | tail -1
        ncu -i "$OUT/ncu_s21d_ar$ar.ncu-rep" --page details --csv > "$OUT/ncu_s21d_ar${ar}_details.csv" 2>&1
        python benchmarks/ncu_details.py "$OUT/ncu_s21d_ar${ar}_details.csv" | tee "$OUT/ncu_s21d_ar${ar}.txt"
        rm -f "$OUT/ncu_s21d_ar$ar.ncu-rep" "$OUT/ncu_s21d_ar${ar}_details.csv"
      done
      ;;
  s21c)  # (as run) session 21, call 3: 4-key lane pieces in the row-group kernels' one-ahead body (VLLM_SPECLA_CUDA_RG_PIECE=4,
        # the new default: every 16-byte state / bank access of a warp covers whole 128-byte lines, as Triton's; 8 =
        # the layout before, whose loads and stores touch half sectors; s21b: the lane-pair swap of the stores alone
        # took AR 6x256x512 batch 2 from 5.9 to 5.7 us, Triton 4.9): the CUDA chain tests and the dispatch tests,
        # the kernel table at batch 1 / 2 with (piece, store swap) = (4, 1) (8, 1) (4, 0) (8, 0), twice; then
        # Nsight Compute (cold L2, as in a 24-layer decode step) of AR at batch 2, pieces 4 and 8, against Triton
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s21c 240 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      for rep in 1 2; do for pw in 4 8; do for sw in 1 0; do
        echo "== rg_piece $pw store_swap $sw (rep $rep)"
        VLLM_SPECLA_CUDA_RG_PIECE=$pw VLLM_SPECLA_CUDA_STORE_SWAP=$sw timeout 60 python benchmarks/bench_csrc_cuda.py \
            --batches 1,2 --Ts 1,5,8 --layout auto --out "$OUT/csrc_s21c_pw${pw}_sw${sw}_r$rep.json" 2>&1 \
            | grep -v "^{" | grep -v -i warn | grep -E "ar|step|verify" | tr -s ' ' | paste -sd';'
      done; done; done
      for pw in 4 8; do
        VLLM_SPECLA_CUDA_RG_PIECE=$pw timeout 90 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis -o "$OUT/ncu_s21c_pw$pw" -f \
            python benchmarks/ncu_chain.py --ar --batch 2 2>&1 | tail -1
        ncu -i "$OUT/ncu_s21c_pw$pw.ncu-rep" --page details --csv > "$OUT/ncu_s21c_pw${pw}_details.csv" 2>&1
        python benchmarks/ncu_details.py "$OUT/ncu_s21c_pw${pw}_details.csv"
      done
      ;;
  s21b)  # (as run) session 21, call 2: full-sector state stores (rg_store_tile: lanes s, s ^ 1 swap half pieces; s21a's
        # sampling put 110 of 523 samples of the AR kernel on draining its half-sector stores at exit, Triton 19 of
        # 409): every CUDA chain test and the dispatch tests on the new default, then the kernel table at batch 1 / 2
        # with VLLM_SPECLA_CUDA_STORE_SWAP=1 / 0 / 1 / 0 (A/B in alternation, one build)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s21b 200 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      for rep in 1 2; do for sw in 1 0; do
        echo "== store_swap $sw (rep $rep)"
        VLLM_SPECLA_CUDA_STORE_SWAP=$sw timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 \
            --layout auto --out "$OUT/csrc_s21b_sw${sw}_r$rep.json" 2>&1 | grep -v "^{" | grep -v -i warn
      done; done
      ;;
  s21a)  # (as run) session 21, call 1: first the final code's GPU tests and kernel table
        # (session 20's last edits were checked offline only: the tile-load predicate for the sb kernel only, SASS
        # equal to s20d's sb and s20c's row-group builds; the sb kernel's other forms removed, SASS of the one kept
        # unchanged); then where the one-token AR step at 6x256x512 batch 2 loses to
        # Triton (the row-group BV-4 kernel 5.80 us, Triton 4.89, s20c; same grid of 1,536 single-warp CTAs, ~2.2
        # against ~2.6 TB/s of state traffic): Nsight Compute's speed of light, memory workload, occupancy and
        # per-instruction warp sampling of both kernels (ncu_chain.py --ar --batch 2), the source page summarised
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s21a 200 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto \
          --out "$OUT/csrc_s21a.json" 2>&1 | grep -v "^{" | grep -v -i warn
      timeout 120 ncu --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section Occupancy --section SourceCounters --section WarpStateStats \
          --import-source yes -o "$OUT/ncu_s21a" -f python benchmarks/ncu_chain.py --ar --batch 2 2>&1 | tail -2
      ncu -i "$OUT/ncu_s21a.ncu-rep" --page details --csv > "$OUT/ncu_s21a_details.csv" 2>&1
      ncu -i "$OUT/ncu_s21a.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_s21a_sass.csv" 2>&1
      python benchmarks/ncu_sass_stalls.py "$OUT/ncu_s21a_sass.csv" --top 10 --out "$OUT/ncu_stalls_s21a.json"
      grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Cycles Per Issued" \
          "$OUT/ncu_s21a_details.csv" | cut -d, -f5,13-15
      ;;
  s20d)  # (as run) session 20, call 4: the state tile's loads predicated for rows past V (no select waiting on the tile before
        # the first token's work; s20b's sampling: 151 of 985 samples on those selects): every CUDA chain test and the
        # dispatch tests, the automatic layout against Triton at batch 1 / 2, then AR (one token per row) in every
        # small-batch layout at BV 4 / 8 (AR at 6x256x512 batch 2 took 1.18x Triton's time in s20c)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s20d 200 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto \
          --out "$OUT/csrc_s20d.json" 2>&1 | grep -v "^{" | grep -v -i warn
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1 --bv 0,8 \
          --layout auto,rowgroup,rowgroup8,rowgroup16,rs --out "$OUT/csrc_s20d_ar.json" 2>&1 | grep -v "^{" | grep -v -i warn
      ;;
  s20c)  # (as run) session 20, call 3: the final code (sb kernel: PF 1 everywhere, BV 4 only while its warps are at most one per
        # scheduler; the dispatcher sends bf16 SpecLA steps at <= 16 (row, head) pairs to the CUDA kernel): every CUDA
        # chain test and the dispatch tests, the automatic layout against Triton at batch 1 / 2, then e2e at batch 1
        # (K = 4 / 6, alpha 0.8) with and without the CUDA csrc op, twice in alternation
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s20c 200 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto \
          --out "$OUT/csrc_s20c.json" 2>&1 | grep -v "^{" | grep -v -i warn
      for R in 1 2; do
        for C in "" "--cuda-csrc"; do
          timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
              $C --tag "s20c${C:+_csrc}_r$R" --out "$OUT/e2e_s20c.jsonl" 2>&1 | grep "^{" | python -c "$S"
        done
      done
      ;;
  s20b)  # (as run) session 20, call 2: the prefetched bf16 v kept raw until its token (ldg_bits / widen_bits in the sb and row-group
        # kernels; s20a's warp sampling found the sb kernel's BV-8 window stalled 292 of 1275 samples on one
        # instruction, the widening of the next token's v right after its load): every CUDA chain test and the
        # dispatch tests, the automatic layout and every sb prefetch form at BV 4 / 8 against Triton at batch 1 / 2,
        # then the same warp sampling of the sb BV-8 one-set window again
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s20b 250 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto \
          --out "$OUT/csrc_s20b_auto.json" 2>&1 | grep -v "^{" | grep -v -i warn
      timeout 110 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout sb00,sb01,sb02 --bv 4,8 \
          --out "$OUT/csrc_s20b_sb.json" 2>&1 | grep -v "^{" | grep -v -i warn
      VLLM_SPECLA_CUDA_LAYOUT=sb VLLM_SPECLA_CUDA_BV=8 VLLM_SPECLA_CUDA_SB_LATE=1 timeout 60 ncu --clock-control none \
          --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 --section SourceCounters \
          --section WarpStateStats -o "$OUT/ncu_s20b" -f python benchmarks/ncu_chain.py 2>&1 | tail -1
      ncu -i "$OUT/ncu_s20b.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_s20b_sass.csv" 2>&1
      ncu -i "$OUT/ncu_s20b.ncu-rep" --page details --csv 2>&1 | grep -E "Cycles Per Issued|Elapsed Cycles|Duration" | cut -c1-60,200-400
      ;;
  s20a)  # (as run) session 20, call 1 (prepared in session 19): where a batch-1 window's instructions wait, per SASS
        # instruction: Nsight Compute's warp-state sampling (SourceCounters) of the sb kernel's BV-8 one-set form and of
        # Triton's kernel on the same 8-token window (6x256x512 batch 1), both built with line info; session 19 found
        # equal instruction counts per token (681 / 679) and a ~15 % shorter Triton window. Reports under $OUT, then the
        # per-instruction stall samples as CSV (--page source --print-source sass)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1 TRITON_CACHE_DIR="$(mktemp -d)"
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      # (first: the GPU tests session 19 added after its last call: long windows through every sb prefetch form,
      # bad values of VLLM_SPECLA_PDL / _SB_SCALED; the SB_LATE / UT_VAR error tests folded into the tuning test)
      pytest_log s20a 150 -x tests/test_csrc.py -k "long_windows or tuning_variable"
      VLLM_SPECLA_CUDA_LAYOUT=sb VLLM_SPECLA_CUDA_BV=8 VLLM_SPECLA_CUDA_SB_LATE=1 timeout 200 ncu --clock-control none \
          --kernel-name regex:chain_verify --launch-skip 2 --launch-count 2 --section SourceCounters \
          --section WarpStateStats --import-source yes -o "$OUT/ncu_s20a" -f python benchmarks/ncu_chain.py 2>&1 | tail -3
      ncu -i "$OUT/ncu_s20a.ncu-rep" --page details --csv > "$OUT/ncu_s20a_details.csv" 2>&1
      ncu -i "$OUT/ncu_s20a.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_s20a_sass.csv" 2>&1
      ls -la "$OUT"; head -c 1500 "$OUT/ncu_s20a_sass.csv"
      ;;
  s19e)  # (as run; the split norms were removed after it) session 19, call 5: the sb kernel's norms of q / k split over the warp's four row groups (NS, the default
        # now; VLLM_SPECLA_CUDA_SB_NORMS=0 the replicated form): every CUDA chain test and the dispatch tests, then the
        # automatic layout with and without it against Triton at batch 1 / 2
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s19e 230 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 80 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto,auto_n0 \
          --out "$OUT/csrc_s19e.json" 2>&1 | grep -v "^{" | grep -v -i warn
      ;;
  s19d)  # (as run) session 19, call 4: every tuning variable of the CUDA binding strict (a value outside its list is an error):
        # every CUDA chain test and the dispatch tests; then the SASS of the Triton chain kernel as the JIT built it
        # for the batch-1 verify window (ncu_chain.py's config), for reading its per-token instruction count
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s19d 260 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      export TRITON_CACHE_DIR="$(mktemp -d)"  # (as run: a fixed folder)
      timeout 60 python benchmarks/ncu_chain.py 2>&1 | tail -2
      CUOBJ=$(python -c "import triton,os;print(os.path.join(os.path.dirname(triton.__file__),'backends/nvidia/bin/cuobjdump'))")
      i=0
      for f in $(find "$TRITON_CACHE_DIR" -name "_chain_verify_kernel*.cubin"); do
        i=$((i+1)); "$CUOBJ" -sass "$f" > "$OUT/triton_chain_sass_$i.txt" 2>&1; cp "${f%.cubin}.json" "$OUT/triton_chain_meta_$i.json" 2>/dev/null
      done
      ls -la "$OUT"
      ;;
  s19c)  # (as run) session 19, call 3: the automatic sb form after s19a / s19b (BV 4 windows without pending factors load two
        # tokens ahead, PF 2; the staged form of s19b removed): every CUDA chain test (among them the long windows of
        # 37 / 18 tokens) and the dispatch tests, then the automatic layout against sb00 / sb02 and Triton at batch 1 / 2
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s19c 260 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 100 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto,sb00,sb02 --bv 4 \
          --out "$OUT/csrc_s19c.json" 2>&1 | grep -v "^{" | grep -v -i warn
      ;;
  s19b)  # (as run; the staged form was removed after it) session 19, call 2: the sb kernel's staged-window form (VLLM_SPECLA_CUDA_SB_LATE=3: each 16-token chunk of
        # the window copied to shared memory in one cp.async burst, issued before the state tile and the fold, waited
        # for once; one register set loaded from shared memory), after s19a measured PF 2 at 0.97-1.00x PF 0: its GPU
        # tests (every small-batch layout, windows of 37 / 18 tokens), then sb01 / sb03 / sb13 at BV 4 and 8 against
        # the automatic layout and Triton at batch 1 / 2, and PF 3's stall reasons under ncu (BV 4, BV 8)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s19b 200 -x tests/test_csrc.py -k "small_batch or sb_long or sb_late or pdl_chain"
      timeout 150 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto,sb01,sb03,sb13 --bv 4,8 \
          --out "$OUT/csrc_s19b.json" 2>&1 | grep -v "^{" | grep -v -i warn
      M="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__cycles_active.avg,gpc__cycles_elapsed.max"
      for BV in 4 8; do
        VLLM_SPECLA_CUDA_LAYOUT=sb VLLM_SPECLA_CUDA_SB_LATE=3 VLLM_SPECLA_CUDA_BV=$BV timeout 60 ncu --clock-control none \
            --kernel-name regex:chain_verify_sb --launch-skip 1 --launch-count 1 --metrics "$M" \
            python benchmarks/ncu_chain.py > "$OUT/ncu_s19b_bv$BV.txt" 2>&1
        grep -E "long_scoreboard|short_scoreboard|inst_executed|gpc__cycles" "$OUT/ncu_s19b_bv$BV.txt"
      done
      ;;
  s19a)  # session 19, call 1 (as run; prepared in session 18): the sb kernel's PF 2 form (two register sets,
        # each token loaded two ahead once the token before its set's last one has done its partial sums:
        # VLLM_SPECLA_CUDA_SB_LATE=2), after s18d showed the batch-1 window waiting on its per-token loads (long
        # scoreboard 1.32-1.42 stall cycles per instruction vs Triton's 0.41-0.52): its GPU tests, then sb00 / sb02 /
        # sb12 against the automatic layout and Triton at batch 1 / 2, and the stall reasons of PF 2 under ncu
        # (the GPU tests: every CUDA chain test and the dispatch tests, which also check session 18's review fixes)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s19a 260 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 100 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto,sb00,sb02,sb12 --bv 4 \
          --out "$OUT/csrc_s19a.json" 2>&1 | grep -v "^{" | grep -v -i warn
      M="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__cycles_active.avg,gpc__cycles_elapsed.max"
      VLLM_SPECLA_CUDA_LAYOUT=sb VLLM_SPECLA_CUDA_SB_LATE=2 timeout 100 ncu --clock-control none \
          --kernel-name regex:chain_verify_sb --launch-skip 1 --launch-count 1 --metrics "$M" \
          python benchmarks/ncu_chain.py > "$OUT/ncu_s19a.txt" 2>&1
      grep -E "long_scoreboard|inst_executed|gpc__cycles" "$OUT/ncu_s19a.txt"
      ;;
  s18e)  # session 18, call 5: the final automatic small-batch rule (sb BV 4 where its warps fit on the GPU at once,
        # else sb BV 8 with one register set where those do): every CUDA chain test and the dispatch tests, then the
        # automatic layout against Triton at batch 1 / 2
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s18e 230 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 60 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --out "$OUT/csrc_s18e.json" 2>&1 | \
          grep -v "^{" | grep -v -i warn
      ;;
  s18d)  # (as run twice: the first failed on ncu_chain.py's import, fixed; in the second, VLLM_SPECLA_CUDA_BV=8 ran
        # BV 4 again, since the automatic layout picks the sb kernel's BV itself: benchmarks/ncu_chain_h200_s18d.txt)
        # session 18, call 4: where a batch-1 verify window's time goes, the sb kernel (BV 4 and BV 8 one-set)
        # and Triton side by side under Nsight Compute: issue-stall reasons per issued instruction, cycles, instructions
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      M="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__cycles_active.avg,gpc__cycles_elapsed.max,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active"
      for BV in 4 8; do
        VLLM_SPECLA_CUDA_BV=$BV timeout 120 ncu --clock-control none --kernel-name regex:chain_verify --launch-skip 2 \
            --launch-count 4 --metrics "$M" python benchmarks/ncu_chain.py > "$OUT/ncu_s18d_bv$BV.txt" 2>&1
        echo "ncu bv$BV rc $?"
      done
      grep -E "chain_verify|stalled_(long|short|wait|math|lg|mio|no_inst|not_sel|selected|barrier|branch|dispatch|drain|membar|imc)|inst_executed|cycles|issue_active|warps_active" \
          "$OUT/ncu_s18d_bv8.txt" | sed 's/  */ /g' | head -80
      ;;
  s18c)  # session 18, call 3: the sb kernel's one-register-set form (SB_LATE=1: the next token loaded after the
        # current token's partial sums; BV 8 fits in 220-224 registers without spills): its GPU tests, then every sb
        # form (plain / scaled tile x two sets / one set late, BV 4 / 8) against the automatic layout and Triton at batch 1 / 2
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s18c 200 -x tests/test_csrc.py -k "small_batch or pdl_chain"
      timeout 150 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto,sb00,sb01,sb10,sb11 \
          --bv 4,8 --out "$OUT/csrc_s18c.json" 2>&1 | grep -v "^{" | grep -v -i warn
      ;;
  s18b)  # session 18, call 2: the sb kernel in the automatic small-batch layout (one-wave rule, plain tile, BV 4):
        # every CUDA chain test (incl. the UT kernel under PDL) and the dispatch tests; CUDA (PDL on / off) vs Triton
        # at batch 1 / 2 / 32 / 128; map / flame batch 64 end to end with the CUDA csrc, its PDL off / on
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s18b 230 -x tests/test_csrc.py -k cuda tests/test_dispatch.py
      timeout 120 python benchmarks/bench_csrc_cuda.py --batches 1,2,32,128 --Ts 1,5,8 --pdl 1,0 \
          --out "$OUT/csrc_s18b.json" 2>&1 | grep -v "^{" | grep -v -i warn
      for P in 0 1; do
        timeout 100 python benchmarks/bench_e2e.py --shapes map,flame --batches 64 --ks 4 --alphas 0.8 \
            --snapshot-ks 4 --cuda-csrc --cuda-pdl $P --tag "s18b_cudapdl$P" --out "$OUT/e2e_s18b.jsonl" 2>&1 | \
            grep "^{" | python -c "$S"
      done
      ;;
  s18a)  # session 18, call 1: programmatic dependent launch for the CUDA chain kernels and the small-batch lean
        # kernel (VLLM_SPECLA_CUDA_LAYOUT=sb): the JIT build, the small-batch / PDL GPU tests, then CUDA vs Triton
        # at batch 1 / 2 (issue 9's miss): the automatic layout and sb (plain / scaled tile, BV 4 / 8), PDL on / off
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 400 python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      pytest_log s18a 200 -x tests/test_csrc.py -k "small_batch or pdl_chain"
      timeout 150 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --layout auto,sb0,sb1 --bv 0,4,8 \
          --pdl 1,0 --out "$OUT/csrc_s18a.json" 2>&1 | grep -v "^{" | grep -v -i warn
      ;;
  s16a)  # (as run; see s16c) session 16, call 1 (carry .whl): the skinny GEMM's forms (csrc/cuda/skinny_gemm_kernels.cuh: 1 the L2 prefetch
        # hint, 2 / 3 the persistent ring kernel without / with it) and session 15's review changes (not yet run on a
        # GPU): the GEMM's GPU tests, then the step's GEMM chain for every config at flame M = 1 / 5 / 7 / 8, map M = 5 / 7
      skinny_build
      pytest_log s16a 200 tests/test_skinny_gemm_gpu.py
      timeout 200 python benchmarks/bench_blas.py --shapes flame --ms 1,5,7,8 --settings default --skinny-sweep \
          --out "$OUT/blas_s16a.json" 2>&1 | grep -v -i warn
      timeout 100 python benchmarks/bench_blas.py --shapes map --ms 5,7 --settings default --skinny-sweep \
          --out "$OUT/blas_s16a_map.json" 2>&1 | grep -v -i warn
      ;;
  s16c)  # (as run; forms 1-5 were removed after it, at commit 732bc08, so s16a / s16c cannot be rerun) session 16, call 2
        # (carry .whl): the bulk-copy forms (4 / 5: persistent CTAs streaming shared-memory stages by
        # TMA, 1 / 2 CTAs per SM): the GEMM's GPU tests, the step's GEMM chain against the tile form (flame M = 1 / 5 / 8,
        # map M = 5), then e2e batch 1 (K = 4 / 6, alpha 0.8): cuBLAS / the tile form / the best bulk config at flame M = 5
      skinny_build
      pytest_log s16c 200 tests/test_skinny_gemm_gpu.py
      B="default,skinny:8:8:0,skinny:4:4:4,skinny:4:8:4,skinny:8:4:4,skinny:8:8:4,skinny:4:4:5,skinny:4:8:5,skinny:8:4:5,skinny:8:8:5"
      timeout 100 python benchmarks/bench_blas.py --shapes flame --ms 1,5,8 --settings "$B" --out "$OUT/blas_s16c.json" 2>&1 | \
          grep -v -i warn
      timeout 60 python benchmarks/bench_blas.py --shapes map --ms 5 --settings "$B" --out "$OUT/blas_s16c_map.json" 2>&1 | \
          grep -v -i warn
      BEST=$(python -c 'import json,sys
r=[x for x in json.load(open(sys.argv[1])) if x["setting"].startswith("skinny") and x["M"]==5]
print(",".join(min(r,key=lambda x:x["ms"])["setting"].split(":")[1:]) if r else "on")' "$OUT/blas_s16c.json")
      echo "best skinny config at flame M = 5: $BEST"
      for G in off on "$BEST"; do
        [ "$G" = "8,8,0" ] && continue
        timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm "$G" --tag "s16c_skinny_$G" --out "$OUT/e2e_s16c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s17d)  # (as run; the row GEMV's prefetch was removed after it: its code is in commit 39d6a88, so s17d cannot be rerun)
        # session 17, call 4 (carry .whl): the row GEMV's L2 prefetch of the next weight (gemv_rows(prefetch=), the
        # one-row GEMMs of the AR step and the drafter): its GPU tests, the step's one-row GEMM chain with 0 / 2 / 4 / 8
        # MiB prefetched (twice), then e2e batch 1 (K = 6, alpha 0.8, the skinny GEMM and its prefetch on) with
        # --rows-prefetch 0 / 4
      skinny_build
      pytest_log s17d 200 -rs tests/test_fused_gpu.py -k "prefetch or pdl_chain or gemv_rows"
      for R in 1 2; do
        timeout 80 python benchmarks/bench_blas.py --shapes flame,map --ms 1 \
            --settings rows:8:1024:8,rows-pf:8:1024:8:2,rows-pf:8:1024:8:4,rows-pf:8:1024:8:8 \
            --out "$OUT/blas_s17d_$R.json" 2>&1 | grep -v -i warn
      done
      for P in 0 4; do
        timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --rows-prefetch $P --tag "s17d_rpf$P" --out "$OUT/e2e_s17d.jsonl" 2>&1 | grep "^{" | \
            python -c "$S"
      done
      ;;
  s17c)  # (as run) session 17, call 3 (carry .whl): the L2 prefetch in the decode runtime (every GEMM names the next one's
        # weight, fused.linear(prefetch=); 4 MiB, s17a / s17b's best): the GPU tests of the GEMM and the runtime, then
        # e2e with --skinny-prefetch 0 / 4, twice in alternation (batch 1, K = 4 / 6; batch 4, K = 4; alpha 0.8)
      skinny_build
      pytest_log s17c 240 -rs tests/test_skinny_gemm_gpu.py tests/test_decode_runtime_gpu.py
      for R in 1 2; do
        for P in 0 4; do
          timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
              --skinny-gemm on --skinny-prefetch $P --tag "s17c_pf${P}_r$R" --out "$OUT/e2e_s17c.jsonl" 2>&1 | grep "^{" | \
              python -c "$S"
        done
      done
      for P in 0 4; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame --batches 4 --ks 4 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm on --skinny-prefetch $P --tag "s17c_b4_pf$P" --out "$OUT/e2e_s17c.jsonl" 2>&1 | grep "^{" | \
            python -c "$S"
      done
      ;;
  s17a)  # (as run) session 17, call 1; s17b (as run, a bare command): skinny:8:8 / skinny-pf:8:8:1 / 2 / 4 / 6, twice.
        # next session, call 1 (carry .whl): the skinny GEMM's L2 prefetch of the next GEMM's weight (prefetch=, written in
        # session 16 after its last call, never built on a GPU): build, its GPU tests, then the step's GEMM chain with each
        # GEMM prefetching the first 4 / 8 / 16 / 32 MiB of the next one's weight (s16g: a fixed ~3.6 us per GEMM)
      skinny_build
      pytest_log s17a 200 tests/test_skinny_gemm_gpu.py
      timeout 120 python benchmarks/bench_blas.py --shapes flame,map --ms 5,8 \
          --settings default,skinny:8:8,skinny-pf:8:8:4,skinny-pf:8:8:8,skinny-pf:8:8:16,skinny-pf:8:8:32 \
          --out "$OUT/blas_s17a.json" 2>&1 | grep -v -i warn
      ;;
  s16g)  # session 16, call 7 (carry .whl): the tile kernel's time against N at M = 5, K = 2048 (20 GEMMs per graph, no
        # PDL): steps at multiples of 264 tiles (one wave: 2 CTAs x 132 SMs) would say its waves cost a fixed time each
        # (latency-bound; s16d's profile: a partial third wave for the 577-tile in-projection); cuBLAS beside it
      skinny_build
      timeout 150 python benchmarks/gemm_nsweep.py --out "$OUT/nsweep_s16g.json" 2>&1 | grep -v -i warn
      ;;
  s16f)  # (as run; the 16-warp rule was reverted after it) session 16, call 6 (carry .whl): a rule whose automatic config gives 16 warps to GEMMs whose tiles fit
        # in one CTA per SM with K >= 4096 (flame's down-projection): the GEMM's GPU tests, the step's GEMM chain (flame
        # M = 5 / 8, map M = 5: automatic vs fixed 8 x 8), e2e batch 1, K = 6 with the skinny GEMM
      skinny_build
      pytest_log s16f 120 tests/test_skinny_gemm_gpu.py
      timeout 60 python benchmarks/bench_blas.py --shapes flame,map --ms 5,8 --settings default,skinny:0:0,skinny:8:8 \
          --out "$OUT/blas_s16f.json" 2>&1 | grep -v -i warn
      timeout 90 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --skinny-gemm on --tag "s16f_skinny_on" --out "$OUT/e2e_s16f.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s16e)  # (as run; the K split was removed after it, at commit ed28b5e) session 16, call 5 (carry .whl): the K split (ksplit: a thread-block cluster of 1 / 2 / 4 CTAs per tile, the
        # automatic 2 where N <= 16 x SMs; s16d: the N = 2048 GEMMs ran 128 CTAs at 12% occupancy): the GEMM's GPU tests,
        # the step's GEMM chain (flame M = 1 / 5 / 8, map M = 5: the tile form without / with the automatic split and the
        # KSPLIT_SWEEP), then e2e batch 1 / 4 (K = 4 / 6, alpha 0.8) cuBLAS vs the skinny GEMM (automatic split)
      skinny_build
      pytest_log s16e 200 tests/test_skinny_gemm_gpu.py
      timeout 100 python benchmarks/bench_blas.py --shapes flame --ms 1,5,8 --settings default,skinny:0:0 --ksplit-sweep \
          --out "$OUT/blas_s16e.json" 2>&1 | grep -v -i warn
      timeout 60 python benchmarks/bench_blas.py --shapes map --ms 5 --settings default,skinny:0:0 --ksplit-sweep \
          --out "$OUT/blas_s16e_map.json" 2>&1 | grep -v -i warn
      for G in off on; do
        timeout 120 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,4 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm $G --tag "s16e_skinny_$G" --out "$OUT/e2e_s16e.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s16d)  # session 16, call 4 (carry .whl): Nsight Compute on the skinny GEMM (tile form, 8 x 8) and cuBLAS at flame's
        # in-projection (M = 5, N = 9232, K = 2048) and down-projection (N = 2048, K = 5632): where the ~2.8 TB/s goes
        # (DRAM throughput, occupancy, warp stall reasons); the report text under $OUT
      skinny_build
      timeout 300 ncu --kernel-name regex:"skinny|gemm|Gemm|nvjet|splitK|cutlass|xmma" --launch-skip 2 --launch-count 10 --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
          python benchmarks/ncu_gemm.py > "$OUT/ncu_s16d.txt" 2>&1
      echo "ncu rc $?"
      grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Grid Size|Waves Per SM|L2 Hit|Stall|ERR" \
          "$OUT/ncu_s16d.txt" | head -120
      ;;
  s16b)  # session 16, call 3 (carry .whl): the final code, as shipped (the tile form only, its device code in skinny_gemm_kernels.cuh):
        # the skinny GEMM / fused / runtime GPU tests in one process with it built, then e2e with and without it at
        # batch 4 / 16 (K = 2 / 4, alpha 0.8, --auto): batch 4 is where its unmeasured scope lies (AR and drafter passes
        # of 4 rows take it once built); batch 1 is s16c's
      command -v ncu nsys || echo "no ncu / nsys on PATH"
      skinny_build
      pytest_log s16b 200 tests/test_skinny_gemm_gpu.py tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py
      for G in off on; do
        timeout 150 python benchmarks/bench_e2e.py --shapes flame,map --batches 4,16 --ks 2,4 --alphas 0.8 --auto \
            --snapshot-ks "" --skinny-gemm $G --tag "s16b_skinny_$G" --out "$OUT/e2e_s16b.jsonl" 2>&1 | grep "^{" | \
            python -c "$S"
      done
      ;;
  s15e)  # session 15, call 5 (carry .whl): the final kernel (variant 2 removed, at most 8 rows): its tests and the fused-op
        # GPU tests in one process (later tests run with the skinny GEMM loaded), e2e batch 1 cuBLAS vs skinny (K = 4 / 6,
        # and K = 6 with a 4000-token draft vocabulary), the eager profile of the K = 6 step with it
      skinny_build
      pytest_log s15e 150 tests/test_skinny_gemm_gpu.py tests/test_fused_gpu.py
      for G in off on; do
        timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
            --draft-vocabs 0,4000 --skinny-gemm $G --tag "s15e_skinny_$G" --out "$OUT/e2e_s15e.jsonl" 2>&1 | grep "^{" | \
            python -c "$S"
      done
      timeout 80 python benchmarks/step_breakdown.py --shapes flame --batches 1 --k 6 --modes specla --skinny-gemm on \
          --out "$OUT/breakdown_s15e.json" 2>&1 | grep -v -i "warn\|USDT" | head -30
      ;;
  s15d)  # session 15, call 4 (carry .whl): variant 2 with x copied through the ring (s15c: a plain x load per chunk on the
        # critical path) and the largest shared-memory carveout; tests, the sweep, e2e batch 1 (cuBLAS / automatic = variant 1
        # 8 x 8 / the best at flame M = 7), K = 4 / 6 / 8, then the best with a 4000-token draft vocabulary at K = 6 / 8
      skinny_build
      pytest_log s15d 150 -x tests/test_skinny_gemm_gpu.py
      timeout 80 python benchmarks/bench_blas.py --shapes flame --ms 1,5,7 --settings default --skinny-sweep \
          --out "$OUT/blas_s15d.json" 2>&1 | grep -v -i warn
      timeout 40 python benchmarks/bench_blas.py --shapes map --ms 7 --settings default --skinny-sweep \
          --out "$OUT/blas_s15d_map.json" 2>&1 | grep -v -i warn
      BEST=$(python -c 'import json,sys
r=[x for x in json.load(open(sys.argv[1])) if x["setting"].startswith("skinny") and x["M"]==7]
print(",".join(min(r,key=lambda x:x["ms"])["setting"].split(":")[1:]) if r else "on")' "$OUT/blas_s15d.json")
      echo "best skinny config at M = 7: $BEST"
      for G in off on "$BEST"; do
        [ "$G" = "1,8,8,0" ] && continue
        timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm "$G" --tag "s15d_skinny_$G" --out "$OUT/e2e_s15d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6,8 --alphas 0.8 --snapshot-ks "" \
          --draft-vocabs 4000 --skinny-gemm "$BEST" --tag "s15d_skinny_${BEST}_vocab" --out "$OUT/e2e_s15d.jsonl" 2>&1 | \
          grep "^{" | python -c "$S"
      ;;
  s15c)  # session 15, call 3 (carry .whl): variant 2 without the per-chunk int64 divisions (s15b: 1.5-1.7 TB/s); the tests
        # (errors now raised in Python: s15b's crash was a failed TORCH_CHECK inside the op), the sweep, e2e at the best
      skinny_build
      pytest_log s15c 150 -x tests/test_skinny_gemm_gpu.py
      timeout 90 python benchmarks/bench_blas.py --shapes flame --ms 1,5,7,9 --settings default --skinny-sweep \
          --out "$OUT/blas_s15c.json" 2>&1 | grep -v -i warn
      timeout 40 python benchmarks/bench_blas.py --shapes map --ms 7 --settings default --skinny-sweep \
          --out "$OUT/blas_s15c_map.json" 2>&1 | grep -v -i warn
      BEST=$(python -c 'import json,sys
r=[x for x in json.load(open(sys.argv[1])) if x["setting"].startswith("skinny") and x["M"]==7]
print(",".join(min(r,key=lambda x:x["ms"])["setting"].split(":")[1:]) if r else "on")' "$OUT/blas_s15c.json")
      echo "best skinny config at M = 7: $BEST"
      for G in off "$BEST"; do
        timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm "$G" --tag "s15c_skinny_$G" --out "$OUT/e2e_s15c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s15b)  # (as run; variant 2 and the skinny:V:A:B:C settings were removed after s15d, so s15b-s15d cannot be rerun)
        # session 15, call 2 (carry .whl): variant 2 of the skinny GEMM (persistent stream-K warps, a private cp.async ring
        # per thread): its GPU tests (log kept: s15a's pytest crashed), the GEMM chain sweep (flame M = 1 / 5 / 7 / 9, map
        # M = 7), then e2e batch 1, K = 4 / 6, alpha 0.8: cuBLAS / the automatic config / the sweep's best at flame M = 7
      skinny_build
      pytest_log s15b 150 -x tests/test_skinny_gemm_gpu.py
      timeout 110 python benchmarks/bench_blas.py --shapes flame --ms 1,5,7,9 --settings default --skinny-sweep \
          --out "$OUT/blas_s15b.json" 2>&1 | grep -v -i warn
      timeout 40 python benchmarks/bench_blas.py --shapes map --ms 7 --settings default --skinny-sweep \
          --out "$OUT/blas_s15b_map.json" 2>&1 | grep -v -i warn
      BEST=$(python -c 'import json,sys
r=[x for x in json.load(open(sys.argv[1])) if x["setting"].startswith("skinny") and x["M"]==7]
print(",".join(min(r,key=lambda x:x["ms"])["setting"].split(":")[1:]) if r else "on")' "$OUT/blas_s15b.json")
      echo "best skinny config at M = 7: $BEST"
      for G in off on "$BEST"; do
        timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm "$G" --tag "s15b_skinny_$G" --out "$OUT/e2e_s15b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s15a)  # session 15, call 1 (carry .whl): the CUDA skinny GEMM (csrc/cuda/skinny_gemm.cu, tensor-core MMAs with the weight
        # as the A operand loaded straight into fragment registers): build, its GPU tests, the step's GEMMs at M = 1 / 5 / 7 /
        # 8 / 16 against cuBLAS for its configs, then e2e batch 1, K = 4 / 6 / 8, alpha 0.8, cuBLAS vs the skinny GEMM
      skinny_build
      timeout 120 python -m pytest -q -x tests/test_skinny_gemm_gpu.py 2>&1 | tail -3
      timeout 150 python benchmarks/bench_blas.py --shapes flame,map --ms 1,5,7,8,16 --settings default --skinny-sweep \
          --out "$OUT/blas_s15a.json" 2>&1 | grep -v -i warn
      for G in off on; do
        timeout 130 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
            --skinny-gemm $G --tag "s15a_skinny_$G" --out "$OUT/e2e_s15a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s14a)  # session 14, call 1 (carry .whl, .devdata): the frequency-ranked draft vocabulary (draft_vocab_size,
        # core/draft_vocab.py). Its GPU tests; flame / map at batch 1, K = 4 / 6 / 8, alpha 0.8, the drafter's LM head over
        # 32000 (full) / 16000 / 8000 / 4000 tokens; the trained pair at batch 1 / 16 with its counts (8192 / 4096 / 2048)
      timeout 120 python -m pytest -q tests/test_decode_runtime_gpu.py -k "draft_vocab or (match_cpu and not csrc)" 2>&1 | tail -2
      timeout 200 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
          --draft-vocabs 0,16000,8000,4000 --tag s14a --out "$OUT/e2e_s14a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      timeout 150 python benchmarks/bench_e2e.py --trained --prompts .devdata/mtbench_tiny.json --trained-batches 1,16 \
          --ks 4,6 --draft-vocabs 0,4096,2048 --tag s14a_trained --out "$OUT/e2e_trained_s14a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s14e)  # session 14, call 6 (carry .whl): `auto` on the grid with the final session-13 policy code (s13e ran the first
        # version of its cost split): flame / map, batch 1 / 16 / 64 / 256, K = 2 / 4 (two verify windows known), alpha 0.8
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 420 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16,64,256 --ks 2,4 --alphas 0.8 --auto \
          --snapshot-ks "" --cuda-csrc --tag s14e --out "$OUT/e2e_s14e.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s14d)  # session 14, call 5 (carry .whl): draft trees at batch 1 under the sibling-exclusive acceptance model (the new
        # default of runtime/decode.py tree_alpha_model: at most one first-level sibling matches) next to sessions 3-13's i.i.d.
        # model: flame / map, K = 4 / 6, W = 2 / 4, alpha 0.8; then the decode-runtime GPU tests of it
      for M in siblings iid; do
        timeout 200 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
            --tree-widths 2,4 --tree-alpha-model $M --tag "s14d_$M" --out "$OUT/e2e_s14d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s14c)  # session 14, calls 3-4 (as run, from the command line; carry .whl, .devdata): the runtime's GPU tests after the
        # review's changes, then flame batch 1, K = 6, full / 4000-token draft vocabulary and a W = 2 tree (printed only)
      timeout 400 python -m pytest -q tests/test_decode_runtime_gpu.py tests/test_fused_gpu.py tests/test_argmax_gpu.py \
          tests/test_decode_runtime.py 2>&1 | tail -3
      timeout 60 python benchmarks/bench_e2e.py --shapes flame --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --draft-vocabs 0,4000 --tree-widths 2 --tag s14c 2>&1 | grep "^{" | python -c "$S"
      ;;
  s14b)  # session 14, call 2 (carry .whl): batch 64 / 256, K = 4, alpha 0.8, SpecLA and snapshots with the full and an
        # 8000-token draft vocabulary (both modes run the same drafter), the CUDA csrc built as in s13e
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 500 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --draft-vocabs 0,8000 --cuda-csrc --tag s14b --out "$OUT/e2e_s14b.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
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
  s13d)  # session 13, call 3 (carry .whl, .devdata; s13c: auto picked K = 4 at 0.92x AR on the trained pair at batch 1;
        # its K = 6 verify GEMMs (7 fp32 rows) took cuBLAS's sm80_xmma 32x128 tiles, 327 us a step). The trained pair at
        # batch 1 / 16 with --auto after the per-trial acceptance EMA, at the default and with every GEMM of <= 16 rows on
        # the row GEMV (--rows-max-m 16); then flame / map at batch 1, K = 6, alpha 0.8 with the Triton argmax
      S='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r.get("alpha"),round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows"),r.get("tag"),r.get("policy")) for r in map(json.loads,sys.stdin)]'
      for G in "" "--rows-max-m 16"; do
        timeout 100 python benchmarks/bench_e2e.py --trained --prompts .devdata/mtbench_tiny.json --trained-batches 1,16 \
            --ks 2,4,6 --auto $G --tag "s13d_trained_${G:-default}" --out "$OUT/e2e_trained_s13d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      timeout 120 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --tag s13d --out "$OUT/e2e_s13d.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s13g)  # session 13, call 6 (as run, from the command line, on s13f's warm machine): e2e flame batch 1 (AR, SpecLA K = 6)
        # at the default and with the row GEMV at (2, 1024, 4) / (4, 1024, 8) without the fused prologues
      P='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r["tag"],round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows")) for r in map(json.loads,sys.stdin)]'
      for G in "" "--gemv-rows 2,1024,4" "--gemv-rows 4,1024,8"; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            $G --tag "s13g_${G:-default}" --out "$OUT/e2e_s13g.jsonl" 2>&1 | grep "^{" | python -c "$P"
      done
      ;;
  s13f)  # session 13, call 5: s13b cut to fit (the row-GEMV configs next to the default, PDL on, flame M = 1), then e2e
        # flame batch 1 (AR, SpecLA K = 6) at the default and at the sweep's best config, side by side
      timeout 200 python benchmarks/bench_blas.py --shapes flame --ms 1 --out "$OUT/blas_s13f.json" \
          --settings default,rows:8:1024:8,rows:4:1024:8,rows:8:1024:4,rows:16:1024:8,rows:8:512:8,rows:16:512:8,rows:4:512:4,rows:2:1024:4 \
          2>&1 | grep -v -i warn
      BEST=$(python -c 'import json,sys
r=[x for x in json.load(open(sys.argv[1])) if x["setting"].startswith("rows")]
print(",".join(min(r,key=lambda x:x["ms"])["setting"].split(":")[1:]) + ",pro" if r else "8,1024,8,pro")' "$OUT/blas_s13f.json")
      echo "best rows config: $BEST"
      P='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r["tag"],round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows")) for r in map(json.loads,sys.stdin)]'
      for G in "" "--gemv-rows $BEST"; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            $G --tag "s13f_${G:-default}" --out "$OUT/e2e_s13f.jsonl" 2>&1 | grep "^{" | python -c "$P"
      done
      ;;
  s13e)  # session 13, call 4 (carry .whl, .devdata): the grid at the defaults (PDL, the Triton argmax, the per-trial
        # acceptance EMA) to refresh README's table: flame / map, batch 1 / 16 / 64 / 256, K = 4, alpha 0.8, --auto, snapshots.
        # First: the trained pair at batch 1 / 16 with --auto at the new small-weight rule (fused.GEMV_ROWS_SMALL_*: the row
        # GEMV for <= 8 rows of <= 4 MiB weights) and the cost model's T = 1 split; the GEMV / runtime GPU tests of it
      S='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r.get("alpha"),round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows"),r.get("tag"),r.get("policy")) for r in map(json.loads,sys.stdin)]'
      timeout 60 python benchmarks/bench_e2e.py --trained --prompts .devdata/mtbench_tiny.json --trained-batches 1,16 \
          --ks 2,4,6 --auto --tag s13e_trained --out "$OUT/e2e_trained_s13e.jsonl" 2>&1 | grep "^{" | python -c "$S"
      timeout 70 python -m pytest -q tests/test_decode_runtime_gpu.py tests/test_fused_gpu.py -k "small or dispatch or match_cpu or lossless" 2>&1 | tail -2
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 360 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16,64,256 --ks 4 --alphas 0.8 --auto \
          --snapshot-ks 4 --cuda-csrc --tag s13e --out "$OUT/e2e_s13e.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s13a)  # (as run; bench_blas --win-sweep and bench_e2e --gemm-window were removed after it, so it cannot be rerun) session 13, call 1: the verify-window GEMM (triton_fused.gemm_window: K slices summed once at the end, CUDA-core
        # FORM 0 / tensor-core FORM 1) and the Triton argmax. Their GPU tests; the step's GEMMs at M = 5 / 7 for WIN_SWEEP
        # against cuBLAS; e2e batch 1 (AR, SpecLA K = 6): torch argmax / Triton argmax / + the best window config
      timeout 150 python -m pytest -q -x tests/test_window_gemm_gpu.py 2>&1 | tail -2
      timeout 200 python benchmarks/bench_blas.py --shapes flame,map --ms 5,7 --win-sweep --settings default \
          --out "$OUT/blas_s13a.json" 2>&1 | grep -v -i warn
      BEST=$(python -c 'import json,sys
r=[x for x in json.load(open(sys.argv[1])) if x["setting"].startswith("win") and x["shape"]=="flame" and x["M"]==7]
print(",".join(min(r,key=lambda x:x["ms"])["setting"].split(":")[1:]) if r else "0,8,256,32,8")' "$OUT/blas_s13a.json")
      echo "best window config: $BEST"
      P='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r["tag"],round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows")) for r in map(json.loads,sys.stdin)]'
      for G in "--argmax torch" "" "--gemm-window $BEST"; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            $G --tag "s13a_${G:-default}" --out "$OUT/e2e_s13a.jsonl" 2>&1 | grep "^{" | python -c "$P"
      done
      ;;
  s13c)  # session 13, call 2 (carry .whl, .devdata): the Triton argmax's GPU tests and the runtime's; where a step goes
        # now (flame batch 1, AR and SpecLA K = 6; the trained pair at batch 1, K = 4 and 6: its K = 6 step took 0.872 ms
        # against 0.491 at K = 4 in s12f); the trained pair at batch 1 / 16 with the auto policy
      timeout 130 python -m pytest -q -x tests/test_argmax_gpu.py tests/test_decode_runtime_gpu.py 2>&1 | tail -2
      timeout 80 python benchmarks/step_breakdown.py --shapes flame --batches 1 --k 6 --modes ar,specla \
          --out "$OUT/breakdown_s13c.json" 2>&1 | grep -v -i "warn\|USDT"
      for K in 4 6; do
        timeout 50 python benchmarks/step_breakdown.py --shapes trained --prompts .devdata/mtbench_tiny.json --batches 1 \
            --k $K --modes specla --out "$OUT/breakdown_trained_k${K}_s13c.json" 2>&1 | grep -v -i "warn\|USDT" | head -14
      done
      S='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows"),r.get("policy")) for r in map(json.loads,sys.stdin)]'
      timeout 130 python benchmarks/bench_e2e.py --trained --prompts .devdata/mtbench_tiny.json --trained-batches 1,16 \
          --ks 2,4,6 --auto --tag s13c_trained --out "$OUT/e2e_trained_s13c.jsonl" 2>&1 | grep "^{" | python -c "$S"
      ;;
  s13b)  # NEXT SESSION (prepared in session 12, not run): the row-GEMV configs again now that PDL is on (the sweep of
        # s11a / s11b ran without it, and one chunk before the wait changed the kernel). The step's GEMMs at M = 1 for
        # every ROWS_SWEEP config (PDL on) against cuBLAS and the no-PDL default, then e2e batch 1 (AR, SpecLA K = 6)
        # at the default and at the two configs closest to it in s12b, (2, 1024, 4) and (4, 1024, 8)
      timeout 240 python benchmarks/bench_blas.py --shapes flame,map --ms 1 --rows-sweep \
          --settings default,rows-nopdl:8:1024:8,rows:8:1024:8 --out "$OUT/blas_s13b.json" 2>&1 | grep -v -i warn
      P='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r["tag"],round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows")) for r in map(json.loads,sys.stdin)]'
      for G in "" "2,1024,4,pro" "4,1024,8,pro"; do
        timeout 75 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            ${G:+--gemv-rows $G} --tag "s13b_rows_${G:-default}" --out "$OUT/e2e_s13b.jsonl" 2>&1 | grep "^{" | python -c "$P"
      done
      ;;
  s12g)  # session 12, call 6: the GDN gating as the row GEMV's epilogue (fused.GEMV_ROWS_GATING, one launch fewer per
        # layer at batch 1): its GPU tests, then e2e flame batch 1 (AR, SpecLA K = 6) with it off / on
      timeout 70 python -m pytest -q -x tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py -k "gating or pdl or match_cpu" 2>&1 | tail -1
      P='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r["tag"],round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows")) for r in map(json.loads,sys.stdin)]'
      for V in off on; do
        timeout 60 python benchmarks/bench_e2e.py --shapes flame --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            --gating-epilogue $V --tag "s12g_gating_$V" --out "$OUT/e2e_s12g.jsonl" 2>&1 | grep "^{" | python -c "$P"
      done
      ;;
  s12f)  # session 12, call 5 (as run, from the command line; carry [".whl", ".devdata"]): the trained pair at batch 1 / 16
        # with PDL off / on
      S='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows"),r.get("tag")) for r in map(json.loads,sys.stdin)]'
      for V in "--pdl off" ""; do
        timeout 90 python benchmarks/bench_e2e.py --trained --prompts .devdata/mtbench_tiny.json --trained-batches 1,16 \
            --ks 2,4,6 $V --tag "s12f_trained_${V:-default}" --out "$OUT/e2e_trained_s12f.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s12e)  # session 12, call 4 (s12d: every GPU test file passed at the PDL default, but test_fused_gpu.py's run was cut
        # at ~80 % by its timeout, before the PDL graph test). The rest of test_fused_gpu.py; e2e at batch 16 / 64,
        # flame, K = 4, PDL off / on (the kernels with PDL at larger grids)
      timeout 60 python -m pytest -q -x tests/test_fused_gpu.py -k "pdl or reject or dispatch or falls_back or rms or gating or silu or state" 2>&1 | tail -2
      P='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r["tag"],round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows")) for r in map(json.loads,sys.stdin)]'
      for V in "--pdl off" ""; do
        timeout 100 python benchmarks/bench_e2e.py --shapes flame --batches 16,64 --ks 4 --alphas 0.8 --snapshot-ks "" \
            $V --tag "s12e_${V:-default}" --out "$OUT/e2e_s12e.jsonl" 2>&1 | grep "^{" | python -c "$P"
      done
      ;;
  s12d)  # session 12, call 3 (s12c: PDL took the AR step at batch 1 1.136 -> 1.046 ms flame, 1.199 -> 1.091 map, the
        # SpecLA K = 6 step 2.355 -> 2.246 / 2.422 -> 2.342, all lossless; the tensor-core gemm_skinny lost, 1.42-2.78x
        # cuBLAS at M = 5, e2e slower: removed). The GPU tests at the PDL default (every Triton kernel with PDL),
        # file by file (s12b / s12c's test runs were cut by their timeouts with no failure)
      for F in "tests/test_fused_gpu.py" "tests/test_decode_runtime_gpu.py" "tests/test_kernels_gpu.py -k chain or ar_ or snapshot or prefix" \
               "tests/test_kernels_gpu.py -k conv or tree" "tests/test_tree_hld_gpu.py tests/test_dispatch.py tests/test_kernel_ut_gpu.py"; do
        echo "== $F"
        case "$F" in *" -k "*) timeout 110 python -m pytest -q -x ${F%% -k *} -k "${F#* -k }" 2>&1 | tail -2;;
                     *) timeout 110 python -m pytest -q -x $F 2>&1 | tail -2;; esac
      done
      ;;
  s12c)  # (as run; its --mma-sweep / --skinny were removed after it, so it cannot be rerun) session 12, call 2 (s12b: PDL took the step's GEMMs 0.929 -> 0.857 ms at (8, 1024, 8), 0.792 with one
        # weight chunk loaded first, flame M = 1; the CUDA-core multi-row form 2.2-5x cuBLAS at M = 5 / 7: dropped;
        # s12b's test run hit its timeout at ~90 % with no failure). New tests; the tensor-core gemm_skinny against
        # cuBLAS at M = 5 / 7 / 9; e2e at batch 1 with PDL off / on (default) / on + gemm_skinny at a guessed config
      timeout 100 python -m pytest -q -x tests/test_fused_gpu.py -k "skinny or pdl or gemv" 2>&1 | tail -2
      timeout 100 python benchmarks/bench_blas.py --shapes flame --ms 1,5,7,9 --mma-sweep \
          --settings default,rows-nopdl:8:1024:8,rows:8:1024:8 --out "$OUT/blas_s12c.json" 2>&1 | grep -v -i warn
      P='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r["tag"],round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows")) for r in map(json.loads,sys.stdin)]'
      for V in "--pdl off" "" "--skinny 32,512,4"; do
        timeout 105 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6 --alphas 0.8 --snapshot-ks "" \
            $V --tag "s12c_${V:-default}" --out "$OUT/e2e_s12c.jsonl" 2>&1 | grep "^{" | python -c "$P"
      done
      ;;
  s12b)  # (as run; its rows-s11 setting and the PRE config field were removed after it) session 12, call 1: programmatic dependent launch (ops/pdl.py) for the step's Triton kernels and the row
        # GEMV loading each weight chunk once for all (up to 16) token rows. GPU tests (incl. a PDL chain in a graph
        # bit-identical to plain launches), then the step's GEMMs: session 11's kernel vs the new one with and
        # without PDL at M = 1, and the multi-row configs against cuBLAS at M = 5 / 7 (verify windows K = 4 / 6)
      python -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
      timeout 200 python -m pytest -q -x tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py 2>&1 | tail -3
      timeout 320 python benchmarks/bench_blas.py --shapes flame,map --ms 1,5,7 --multi-sweep \
          --settings default,rows-s11:8:1024:8,rows-nopdl:8:1024:8,rows:8:1024:8,rows:8:1024:8:1 \
          --out "$OUT/blas_s12b.json" 2>&1 | grep -v -i warn
      ;;
  s12a)  # NEXT SESSION's first call (prepared in session 11, not run in session 12 either: the grid needs ~9 of a call's
        # 10 minutes; it now also measures programmatic dependent launch, on by default since session 12; carry [".whl", ".devdata"], where .devdata/mtbench_tiny.json
        # comes from `.venv/bin/python benchmarks/make_prompts.py --out .devdata/mtbench_tiny.json` on the CPU machine):
        # the grid at the session-11 defaults (the row GEMV at batch 1) to refresh README's table, then the trained
        # pair at batch 1 / 16 with the row GEMV on and off (its AR step is launch-bound: 0.27 ms in session 3)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      S='import sys,json;[print(r["shape"],r["batch"],r["mode"],r.get("K"),r.get("alpha"),round(r.get("step_ms",0),3),round(r.get("speedup",0),3),r.get("tau"),r.get("lossless_rows"),r.get("tag")) for r in map(json.loads,sys.stdin)]'
      timeout 330 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16,64,256 --ks 4 --alphas 0.8 --auto \
          --snapshot-ks 4 --cuda-csrc --tag s12a --out "$OUT/e2e_s12a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      for G in off ""; do
        timeout 80 python benchmarks/bench_e2e.py --trained --prompts .devdata/mtbench_tiny.json --trained-batches 1,16 \
            --ks 2,4,6 --cuda-csrc ${G:+--gemv-rows $G} --tag "s12a_trained_rows_${G:-default}" \
            --out "$OUT/e2e_trained_s12a.jsonl" 2>&1 | grep "^{" | python -c "$S"
      done
      ;;
  s11f)  # session 11, call 6 (s11e: AR at batch 1 1.383 -> 1.155 ms flame, 1.485 -> 1.225 map with the row GEMV default;
        # 3 of test_decode_runtime_gpu.py failed, a file not GPU-run since s10c): the failures in full, with the row
        # GEMV on (default) and off (VLLM_SPECLA_GEMV_ROWS=0)
      for R in 1 0; do
        echo "== VLLM_SPECLA_GEMV_ROWS=$R"
        VLLM_SPECLA_GEMV_ROWS=$R timeout 100 python -m pytest -q tests/test_decode_runtime_gpu.py --tb=short -rf 2>&1 | \
            grep -E "^(FAILED|E |tests/)|passed|failed|assert" | head -30
      done
      ;;
  s11e)  # session 11, call 5 (s11d: the multi-row CUDA-core form took 2.7-9x cuBLAS's time at M = 5-9 and was removed;
        # s11d's e2e ran before the row-GEMV default was really on, a flag edit had missed). The row GEMV at
        # (8, 1024, 8) with the prologues as the default: GPU tests at the defaults, e2e A/B at batch 1 (defaults vs
        # --gemv-rows off), the breakdown of AR and SpecLA K = 6 at the defaults
      python -c "from vllm_specla.ops import fused, triton_fused as t; print('defaults', fused.USE_GEMV_ROWS, fused.GEMV_ROWS_PROLOGUE, t.GEMV_ROWS_CONFIG)"
      timeout 150 python -m pytest -q tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py 2>&1 | tail -2
      for G in off ""; do
        timeout 110 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
            ${G:+--gemv-rows $G} --tag "s11e_rows_${G:-default}" --out "$OUT/e2e_s11e.jsonl" 2>&1 | grep "^{" | \
            python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r['tag'],round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      done
      timeout 90 python benchmarks/step_breakdown.py --shapes flame --batches 1 --modes ar,specla --k 6 \
          --out "$OUT/breakdown_s11e.json" 2>&1 | grep -v -i "warn\|profiler" | head -30
      ;;
  s11d)  # (as run; cannot be rerun: its --multi-sweep / --gemv-multi flags and gemv_multi were removed after it)
        # session 11, call 4 (s11c: the row GEMV at batch 1, AR 1.421 -> 1.199 ms flame, 1.490 -> 1.244 map, at
        # (8, 1024, 8) with the prologues fused: now the default; the SpecLA step barely moved, 2.442 -> 2.371 ms at K = 6,
        # its verify GEMMs (M = K + 1 rows) are cuBLAS at ~2.6 TB/s, ~1.0 ms of the step). The new multi-row CUDA-core
        # skinny GEMM (triton_fused.gemv_multi) against cuBLAS at M = 5 / 7 / 9 on the step's weights, then the best
        # config end to end at batch 1 (the row GEMV default on both sides), GPU tests first
      timeout 120 python -m pytest -q -x tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py -k "gemv or prologue or row_gemv" 2>&1 | tail -2
      timeout 220 python benchmarks/bench_blas.py --shapes flame,map --ms 5,7,9 --settings default --multi-sweep \
          --out "$OUT/blas_s11d.json" 2>&1 | grep -v Warn
      BEST=$(python - "$OUT/blas_s11d.json" <<'PY'
import json, sys, collections
t = collections.defaultdict(float); n = collections.Counter()
for r in json.load(open(sys.argv[1])):
    if r["setting"].startswith("multi:"):
        t[r["setting"]] += r["vs_default"]; n[r["setting"]] += 1
full = [s for s in t if n[s] == max(n.values())]
b = min(full, key=t.get)
print(",".join(b.split(":")[1:]), file=sys.stdout); print("best", b, t[b] / n[b], file=sys.stderr)
PY
)
      echo "best multi config: $BEST"
      for G in off "$BEST"; do
        timeout 110 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
            --gemv-multi "$G" --tag "s11d_multi_$G" --out "$OUT/e2e_s11d.jsonl" 2>&1 | grep "^{" | \
            python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r['gemv_rows'],r['gemv_multi'],round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      done
      ;;
  s11c)  # session 11, call 3 (s11b: with the prologues fused the AR step at batch 1 got slower, 1.412 -> 1.552 ms flame,
        # the row GEMV kernel 1377 us per step against 805 us for the bare GEMMs: at BN = 1 each program redoes the
        # prologue's reductions before its short weight stream). Now the prologues are off by default
        # (fused.GEMV_ROWS_PROLOGUE) and the norms run as their own kernels again: e2e A/B at batch 1, cuBLAS vs the
        # bare row GEMV at two configs vs the fused prologues at bigger programs; breakdowns of AR and SpecLA K = 6
      timeout 120 python -m pytest -q -x tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py -k "prologue or row_gemv" 2>&1 | tail -2
      for G in off 1,0,4 2,0,8 4,1024,8,pro 8,1024,8,pro; do
        timeout 100 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
            --gemv-rows "$G" --tag "s11c_rows_$G" --out "$OUT/e2e_s11c.jsonl" 2>&1 | grep "^{" | \
            python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r['gemv_rows'],round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      done
      timeout 90 python benchmarks/step_breakdown.py --shapes flame --batches 1 --modes ar,specla --k 6 --gemv-rows 1,0,4 \
          --out "$OUT/breakdown_s11c.json" 2>&1 | grep -v -i "warn\|profiler" | head -30
      ;;
  s11b)  # session 11, call 2 (s11a: cuBLAS settings all within 1.5 % of the default; the row GEMV at M = 1 took the
        # step's GEMMs 1.026 -> 0.833 ms flame (3.17 TB/s), 1.054 -> 0.895 map, but end to end only 1.414 -> 1.356 ms:
        # its RMSNorm prologue's reduction held the weight loads back, and M = 2 measured 1.15-1.98x cuBLAS). Now: the
        # first weight chunk and the residual are loaded before the prologue, the gated RMSNorm and the SwiGLU are
        # prologues too (2 launches per layer fewer), M = 1 only. GPU tests, the GEMMs again, e2e A/B at batch 1, the
        # AR step's breakdown with the row GEMV
      timeout 150 python -m pytest -q -x tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py -k "gemv_rows or prologue or row_gemv" 2>&1 | tail -2
      timeout 80 python benchmarks/bench_blas.py --shapes flame,map --ms 1 \
          --settings default,rows:1:0:4,rows:1:0:2,rows:2:0:8,rows:2:1024:4 --out "$OUT/blas_s11b.json" 2>&1 | grep -v Warn
      for G in off 1,0,4; do
        timeout 130 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,6,8 --alphas 0.8 --snapshot-ks "" \
            --gemv-rows "$G" --tag "s11b_rows_$G" --out "$OUT/e2e_s11b.jsonl" 2>&1 | grep "^{" | \
            python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r['gemv_rows'],round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      done
      timeout 60 python benchmarks/step_breakdown.py --shapes flame --batches 1 --modes ar --gemv-rows 1,0,4 \
          --out "$OUT/breakdown_ar_s11b.json" 2>&1 | grep -v -i "warn\|profiler" | head -16
      ;;
  s11a)  # session 11, call 1: the decode GEMMs at batch 1. The AR step at batch 1 (target <= 0.9 ms, 1.40 / 1.48 ms
        # now) is GEMV-bound (cuBLAS ~2.5 TB/s at M = 1; the session-10 profile shows nvjet split-K tiles plus
        # splitKreduce launches). bench_blas times the step's GEMMs as the runtime issues them, on the model's own
        # weights, under cuBLAS settings (default, cublas / cublaslt, no reduced-precision reduction, the GEMV
        # orientation) and the new row GEMV (triton_fused.gemv_rows, a config grid); then the best row-GEMV config at
        # M = 1 end to end at batch 1 against cuBLAS (two processes, same machine); then the GPU tests of the row GEMV
        # and of session 10's interpreter-only review fixes
      timeout 240 python benchmarks/bench_blas.py --shapes flame,map --ms 1,2,5 --rows-sweep --out "$OUT/blas_s11a.json" 2>&1 | grep -v Warn
      BEST=$(python - "$OUT/blas_s11a.json" <<'PY'
import json, sys, collections
t = collections.defaultdict(float); n = collections.Counter()
for r in json.load(open(sys.argv[1])):
    if r["M"] == 1 and r["setting"].startswith("rows:"):
        t[r["setting"]] += r["ms"]; n[r["setting"]] += 1
full = [s for s in t if n[s] == max(n.values())]
print(",".join(min(full, key=t.get).split(":")[1:]))
PY
)
      echo "best row GEMV config at M = 1: $BEST"
      for G in off "$BEST"; do
        timeout 130 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
            --gemv-rows "$G" --tag "s11a_rows_$G" --out "$OUT/e2e_s11a.jsonl" 2>&1 | grep "^{" | \
            python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r['gemv_rows'],round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      done
      timeout 150 python -m pytest -q -x tests/test_fused_gpu.py tests/test_kernels_gpu.py -k "gemv or tree or conv" \
          tests/test_tree_hld_gpu.py 2>&1 | tail -2
      ;;
  s10f)  # session 10, call 6 (s10e ran the 25-node W = 4 trees on UT; s10d's 4-branch rows with a host plan favour
        # the heavy-light kernel at batch 1, so planned trees keep it now): the same K = 6 batch-1 runs on the final rule
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 200 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --tree-widths 4 --cuda-csrc --tag s10f --out "$OUT/e2e_s10f.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r.get('tree_width'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s10e)  # session 10, call 5 (s10d: at 1-4 rows the UT kernel is flat in the node count, 33-51 us at 17-32 nodes, and
        # 0.31-0.76x the picked kernel's time at 32 nodes): the dispatcher now takes UT for 25-32-node trees at any
        # batch; GPU tests of the rule and the tree kernels, then trees end to end at batch 1 with K = 6 (W = 4: 25
        # nodes, now UT; W = 2: 13 nodes, heavy-light) against the chain
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_tree_hld_gpu.py tests/test_decode_runtime_gpu.py 2>&1 | tail -1
      timeout 200 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 6 --alphas 0.8 --snapshot-ks "" \
          --tree-widths 2,4 --cuda-csrc --tag s10e --out "$OUT/e2e_s10e.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r.get('tree_width'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s10d)  # session 10, call 4 (s10c: batch-1 tree steps 4.36 -> 2.51 ms, 1.17x the chain step; s10b's table had the UT
        # kernel with its split launch at 22.5 / 32.0 us for 16 / 32-node trees at B = 1, against 28.6 / 52.0 for the
        # heavy-light kernel that the dispatcher takes below 8 rows): the tree kernels at batch 1-8 on the runtime's
        # own trees (fork2 / fork4: the root and W branches) and binary trees, with the 3 pending factors a step folds
      timeout 300 python benchmarks/bench_tree.py --batches 1,2,4,8 --nodes 9,17,32 --trees binary,fork2,fork4 \
          --shapes 6x256x512,8x256x256 --pending 3 --budget-s 240 --out "$OUT/tree_s10d.json" 2>&1 | grep -E "^B=|^--|worst"
      ;;
  s10c)  # session 10, call 3 (s10b: a batch-1 tree step (W = 2, K = 4) took 4.36 ms against the chain's 2.14; its
        # eager profile: the tree conv kernel 653 us per step (27 us per launch: one program per 1024 channels walking
        # each node's ancestors with a dependent load per step), 649 us of index kernels (the path compaction: a gather
        # and a scatter per bank and layer) and ~470 us of copies (the tree kernels made q / k / v / g / beta contiguous)):
        # the tree conv over [nodes, channels] tiles, token-strided inputs in the HLD / walk kernels, banks stacked over
        # layers (8 compaction launches per step); GPU tests, trees end to end at both shapes, the breakdown again
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 200 python -m pytest -q -x tests/test_kernels_gpu.py -k "tree or conv" tests/test_tree_hld_gpu.py \
          tests/test_decode_runtime_gpu.py tests/test_decode_runtime.py 2>&1 | tail -1
      timeout 240 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16 --ks 4 --alphas 0.8 --snapshot-ks "" \
          --tree-widths 2,4 --cuda-csrc --tag s10c --out "$OUT/e2e_s10c.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r.get('tree_width'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 90 python benchmarks/step_breakdown.py --shapes flame --batches 1 --modes specla --tree-width 2 \
          --cuda-csrc --out "$OUT/breakdown_tree_s10c.json" 2>&1 | grep -v Warn | head -20
      ;;
  s10b)  # session 10, call 2 (s10a: the blocked log-depth inverse kept the withdrawn form's speed and the split
        # launch took B = 8 16-node trees 35.0 -> 26.1 us, 9.5-9.7x replay): both now the defaults for trees ("auto");
        # GPU tests at the defaults, the tree table at every batch, then trees end to end (W = 2, K = 4) against the
        # chain at B = 1 / 16 and where a batch-1 tree step goes
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 200 python -m pytest -q -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py \
          tests/test_decode_runtime_gpu.py 2>&1 | tail -1
      timeout 150 python benchmarks/bench_tree.py --batches 1,8,32,128 --nodes 16,32 --trees binary,beam4 \
          --shapes 6x256x512 --pending 0 --budget-s 120 --out "$OUT/tree_s10b.json" 2>&1 | grep -E "^B=|worst"
      timeout 150 python benchmarks/bench_e2e.py --shapes flame --batches 1,16 --ks 4 --alphas 0.8 --snapshot-ks "" \
          --tree-widths 2 --cuda-csrc --tag s10b --out "$OUT/e2e_s10b.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r.get('tree_width'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('tau'),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 90 python benchmarks/step_breakdown.py --shapes flame --batches 1 --modes specla --tree-width 2 \
          --cuda-csrc --out "$OUT/breakdown_tree_s10b.json" 2>&1 | grep -v Warn | head -16
      ;;
  s10a)  # session 10, call 1 (prepared in session 9, not run): the blocked log-depth (I + A)^-1 of the UT prep
        # (VLLM_SPECLA_UT_SOLVE=dot; s9f's Neumann form, same dot count, was withdrawn as unstable) and the UT split
        # launch (VLLM_SPECLA_UT_SPLIT=1: the state
        # products of the raw q / k beside the prep on a second stream, then a combine kernel), for B = 8 trees
        # (16 nodes: 7.4-7.5x replay in s9f, 8x needs <= 31.3 us of 33.5-33.9): GPU tests (split vs the references,
        # fork / join inside a CUDA graph), then trees vs replay with and without the split, B = 8 / 32 (B = 32 is a
        # control: 192 (row, head) pairs > UT_SPLIT_MAX_PAIRS, so the split does not apply there)
      timeout 150 python -m pytest -q -x tests/test_kernel_ut_gpu.py 2>&1 | tail -1  # both solve forms, split, graphs
      timeout 90 python benchmarks/prof/ut_prep_split.py --solve-ab --batches 8,32,128 --nodes 16,32 \
          --out "$OUT/solve_ab_s10a.json" 2>&1 | grep -v Warn
      for sp in 0 1; do
        VLLM_SPECLA_UT_SOLVE=dot VLLM_SPECLA_UT_SPLIT=$sp timeout 150 python benchmarks/bench_tree.py --batches 8,32 \
            --nodes 16,32 --trees binary,beam4 --shapes 6x256x512 --pending 0 --budget-s 100 \
            --out "$OUT/tree_s10a_split$sp.json" 2>&1 | grep -E "^B=|worst"
      done
      ;;
  s9a)  # session 9, call 1 (prepared in session 8, not run): out_slots (the runtime's first draft step writes the
        # drafter's scratch slots from the committed ones in its one state pass; session 8 copied the drafter state
        # first): GPU tests incl. the Triton out_slots kernels, the breakdown's copy rows (s8c: 147 us per step at map
        # B = 64), e2e at both shapes, B = 64 / 256, K = 4 with snapshots (map B = 64: 1.483x / 1.487x in s8c / s8g)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_kernels_gpu.py tests/test_decode_runtime.py tests/test_fused_gpu.py \
          tests/test_dispatch.py 2>&1 | tail -1
      timeout 150 python -m pytest -q -x tests/test_csrc.py -k cuda 2>&1 | tail -1  # incl. the UT_VAR check (host code)
      timeout 100 python -m pytest -q -x tests/test_kernel_ut_gpu.py 2>&1 | tail -1  # incl. 32-node trees in a CUDA graph
      timeout 60 python benchmarks/step_breakdown.py --shapes map --batches 64 --modes specla --cuda-csrc \
          --out "$OUT/breakdown_s9a.json" 2>&1 | grep -E "device|Memcpy"
      timeout 200 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s9a --out "$OUT/e2e_s9a.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s9b)  # session 9, call 2: the W = 4 conv kernel in token chunks of TB (a chunk's input loads issued before its
        # stores: s9a's breakdown had conv at 379 us per map B = 64 step, ~2 TB/s, latency-bound) and the last draft step
        # "ar_read" (reads the drafter state, writes nothing: one state pass instead of two): GPU tests (conv chunks
        # vs the reference, real drafts on CUDA vs CPU), the conv configs side by side, e2e at both shapes, breakdown
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 100 python -m pytest -q -x tests/test_kernels_gpu.py -k "conv or out_slots" 2>&1 | tail -1
      timeout 100 python -m pytest -q -x tests/test_decode_runtime_gpu.py tests/test_dispatch.py 2>&1 | tail -1
      timeout 150 python benchmarks/bench_conv.py --batches 1,8,64,256 --out "$OUT/conv_s9b.json" 2>&1 | grep -v Warn
      timeout 200 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s9b --out "$OUT/e2e_s9b.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 60 python benchmarks/step_breakdown.py --shapes map --batches 64 --modes specla --cuda-csrc \
          --out "$OUT/breakdown_s9b.json" 2>&1 | grep -E "device|conv|chain_verify"
      ;;
  s9c)  # session 9, call 3 (s9b: 256-channel conv tiles of 4 warps fastest at every batch, chunks only at B <= 8;
        # "ar_read": drafter chain kernels 197 -> 171 us per step: 133 Triton + 38 csrc read-only): the conv config from s9b, the gated norm with BH value
        # heads per program; GPU tests, the norm configs side by side, e2e at both shapes, breakdown
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 100 python -m pytest -q -x tests/test_kernels_gpu.py -k "conv or out_slots" tests/test_fused_gpu.py 2>&1 | tail -1
      timeout 100 python -m pytest -q -x tests/test_decode_runtime_gpu.py 2>&1 | tail -1
      timeout 100 python benchmarks/bench_norms.py --out "$OUT/norms_s9c.json" 2>&1 | grep -v Warn
      timeout 200 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s9c --out "$OUT/e2e_s9c.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 60 python benchmarks/step_breakdown.py --shapes map --batches 64 --modes specla --cuda-csrc \
          --out "$OUT/breakdown_s9c.json" 2>&1 | grep -E "device|conv|chain_verify|norm"
      ;;
  s9d)  # session 9, call 4 (s9c: all four rows >= 1.5x vs snapshots, map B = 64 at 1.504x): gated norm tiles of ~1024
        # elements (flame 6x512: 2 heads per program, s9c's 4 were slower there); GPU tests, e2e at both shapes and a
        # second map B = 64 run
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 60 python -m pytest -q -x tests/test_fused_gpu.py tests/test_decode_runtime_gpu.py 2>&1 | tail -1
      for tag in s9d s9d-rep; do
        shapes=map,flame; batches=64,256
        [ $tag = s9d-rep ] && shapes=map && batches=64
        timeout 200 python benchmarks/bench_e2e.py --shapes $shapes --batches $batches --ks 4 \
            --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag $tag --out "$OUT/e2e_$tag.jsonl" 2>&1 | grep "^{" | \
            python -c "import sys,json;[print(r['tag'],r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      done
      ;;
  s9e)  # session 9, run on the machine s9d left warm (the pip line and csrc build of s9d before it): batches 1-256,
        # K = 2 / 4 and the auto policy after the conv / norm changes
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      timeout 330 python benchmarks/bench_e2e.py --shapes map,flame --batches 1,16,64,256 --ks 2,4 --alphas 0.8 \
          --snapshot-ks "" --auto --cuda-csrc --tag s9e --out "$OUT/e2e_s9e.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['tag'],r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s9f)  # session 9, call 5: the UT prep's (I + A)^-1 as the product form of the Neumann series (VLLM_SPECLA_UT_SOLVE=dot:
        # ceil(log2 T) - 1 squarings and products as dots, instead of T - 2 dependent row passes): GPU tests in both forms,
        # prep time per form for trees and chains (one process), tree verify vs replay at B = 8 / 32 with "dot"
      timeout 150 python -m pytest -q -x tests/test_kernel_ut_gpu.py 2>&1 | tail -1  # both forms (autouse fixture)
      timeout 90 python benchmarks/prof/ut_prep_split.py --solve-ab --batches 8,32,128 --nodes 16,32 \
          --out "$OUT/solve_ab_s9f.json" 2>&1 | grep -v Warn
      VLLM_SPECLA_UT_SOLVE=dot timeout 150 python benchmarks/bench_tree.py --batches 8,32 --nodes 16,32 --trees binary,beam4 \
          --shapes 6x256x512 --pending 0 --budget-s 100 --out "$OUT/tree_s9f.json" 2>&1 | tail -12
      ;;
  s9g)  # session 9, call 6 (s9f: "dot" faster for trees, 32-node trees at B = 8 8.5-8.7x replay; chains T = 5 slower:
        # UT_SOLVE "auto" = dot for trees, loop for chains): the review's test fixes (draft windows CPU vs CUDA at
        # B = 5, trees, the csrc read-only step; conv out_slots with multi-chunk rows), flame's gated norm at one 512-wide
        # head per program (s9d ran 2) end to end
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 90 python -m pytest -q -x tests/test_decode_runtime_gpu.py tests/test_fused_gpu.py 2>&1 | tail -1
      timeout 60 python -m pytest -q -x tests/test_kernels_gpu.py -k "conv4" 2>&1 | tail -1
      timeout 100 python benchmarks/bench_e2e.py --shapes flame --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s9g --out "$OUT/e2e_s9g.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['tag'],r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s8a)  # session 8, call 1 (prepared in session 7, not run): variants 4 / 5, the tensor-core (3xTF32) products /
        # and fold, opt-in (VLLM_SPECLA_CUDA_UT_VAR=4|5): GPU tests (parametrized into the UT tests), kernel and commit A/B
        # against the automatic choice with banks sized to the window, then map B = 64 / 256 end to end with 4 forced
        # (rerun with 5 if it is the faster)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 180 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -3
      timeout 130 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5,8 --bank-t 0 --layout ut,utv4,utv5 \
          --out "$OUT/csrc_s8a.json" 2>&1 | tail -25
      timeout 100 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_utv4,cuda_utv5 --batches 32,128 --replays 20 \
          --out "$OUT/commit_s8a.json" 2>&1 | tail -13
      VLLM_SPECLA_CUDA_UT_VAR=4 timeout 120 python benchmarks/bench_e2e.py --shapes map --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s8a-var4 --out "$OUT/e2e_s8a.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s8b)  # session 8, call 2 (s8a: variants 4 / 5 passed their tests and were slower everywhere, so their profile is
        # moot): the UT tree verify for 17-32 nodes (BT = 32): GPU tests, tree verify alone (as replay is timed) at
        # 16 / 32 nodes, trees of 17 nodes end to end (W = 4, K = 4; they used to go to the walk kernel), and the
        # map B = 64 step breakdown (where the step time outside the recurrent kernel goes now)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py tests/test_decode_runtime.py \
          -k "tree or dispatch" 2>&1 | tail -2
      timeout 170 python benchmarks/bench_tree.py --batches 8,32,128 --nodes 16,32 --trees binary,beam4 --shapes 6x256x512 \
          --pending 0 --budget-s 130 --out "$OUT/tree_s8b.json" 2>&1 | tail -16
      timeout 100 python benchmarks/bench_e2e.py --shapes map --batches 64 --ks 4 --alphas 0.8 --snapshot-ks "" \
          --tree-widths 4 --cuda-csrc --tag s8b --out "$OUT/e2e_s8b.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r.get('tree_width'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 90 python benchmarks/step_breakdown.py --shapes map --batches 64 --modes specla,snapshot --cuda-csrc \
          --out "$OUT/breakdown_s8b.json" 2>&1 | tail -40
      ;;
  s8c)  # session 8, call 3: the residual adds in place (fused.linear residual_inplace: no copy of the residual
        # stream per add) end to end, both shapes, B = 64 / 256, K = 4 with snapshots; the breakdown's copy rows;
        # the tree table again with the chunk picked per tree (bench_tree passes max_nodes = n: 16-node trees BT = 16)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 60 python -m pytest -q -x tests/test_fused_gpu.py tests/test_decode_runtime.py 2>&1 | tail -1
      timeout 200 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s8c --out "$OUT/e2e_s8c.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 60 python benchmarks/step_breakdown.py --shapes map --batches 64 --modes specla --cuda-csrc \
          --out "$OUT/breakdown_s8c.json" 2>&1 | grep -E "device|Memcpy"
      timeout 150 python benchmarks/bench_tree.py --batches 8,32,128 --nodes 16,32 --trees binary,beam4 --shapes 6x256x512 \
          --pending 0 --budget-s 110 --out "$OUT/tree_s8c.json" 2>&1 | tail -16
      ;;
  s8d)  # session 8, call 4 (the change was then reverted: neutral): the UT prep kernel took parents / g out of registers
        # in its per-node loops instead of one global load per iteration: GPU tests, tree verify alone
      timeout 200 python -m pytest -q -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py 2>&1 | tail -1
      timeout 150 python benchmarks/bench_tree.py --batches 8,32,128 --nodes 16,32 --trees binary,beam4 --shapes 6x256x512 \
          --pending 0 --budget-s 110 --out "$OUT/tree_s8d.json" 2>&1 | tail -16
      ;;
  s8e)  # session 8, call 5: the prep's ancestor matrix by squarings of I + P and its decay sums as one dot
        # (PREP_FORM "dot", the default now; "loop" = the per-node loops): GPU tests in both forms, prep vs V-tile
        # kernel time per form (same process), tree verify alone vs replay with "dot"
      timeout 130 python -m pytest -q -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py 2>&1 | tail -1
      VLLM_SPECLA_UT_PREP=loop timeout 100 python -m pytest -q -x tests/test_kernel_ut_gpu.py -k "tree or strong" 2>&1 | tail -1
      timeout 90 python benchmarks/prof/ut_prep_split.py --batches 8,32,128 --nodes 16,32 --out "$OUT/prep_split_s8e.json"
      timeout 150 python benchmarks/bench_tree.py --batches 8,32,128 --nodes 16,32 --trees binary,beam4 --shapes 6x256x512 \
          --pending 0 --budget-s 110 --out "$OUT/tree_s8e.json" 2>&1 | tail -16
      ;;
  s8f)  # session 8, call 6: the UT tree verify's launch configs at B = 8 / 32 (V-tile BV / warps / KC / stages, prep warps),
        # kernel by kernel (B = 8 was 7.1-7.3x replay in s8e: 8x needs ~4 us less of 35 at 16 nodes)
      timeout 200 python benchmarks/prof/ut_prep_split.py --sweep --batches 8,32 --nodes 16,32 --out "$OUT/prep_sweep_s8f.json"
      ;;
  s8g)  # session 8, call 7: after removing variants 4 / 5 (the other 112 kernels SASS-identical, cuobjdump) and the
        # prep's loop form: the build, GPU tests (csrc, dispatch, UT / trees), map B = 64 end to end (third run)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -1
      timeout 100 python -m pytest -q -x tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py 2>&1 | tail -1
      timeout 80 python benchmarks/bench_e2e.py --shapes map --batches 64 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --cuda-csrc --tag s8g --out "$OUT/e2e_s8g.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s7f)  # session 7, call 6 (the P5 = 4 / 5 forms were removed afterwards: neutral; commit 'opt-in matrix phase 5'):
        # the opt-in matrix phase 5 (P5 = 4 / 5): its GPU test, kernel A/B against 1 / 2 with
        # banks sized to the window, map B = 64 end to end with it forced (VLLM_SPECLA_CUDA_UT_P5=4: variant 3, tb = 5)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 60 python -m pytest -q -x tests/test_csrc.py -k "matrix_phase5 or p5_is_bit" 2>&1 | tail -2
      timeout 80 python benchmarks/bench_csrc_cuda.py --batches 32,64 --Ts 5,8 --bank-t 0 --layout utp1,utp4,utp2,utp5 \
          --out "$OUT/csrc_s7f.json" 2>&1 | tail -17
      VLLM_SPECLA_CUDA_UT_P5=4 timeout 70 python benchmarks/bench_e2e.py --shapes map --batches 64 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s7f-p5m --out "$OUT/e2e_s7f.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s7e)  # session 7, call 5: verify windows without pending factors and with 8-token banks now go to the CUDA UT
        # form (ops/chain_verify.py, CUDA_UT_VERIFY_MAX_BANK): end to end at K = 7 (the first window after the
        # prefill is such a window, T = 8), lossless rows and step times
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 60 python -m pytest -q -x tests/test_dispatch.py 2>&1 | tail -1
      timeout 200 python benchmarks/bench_e2e.py --shapes map,flame --batches 64 --ks 7 \
          --alphas 0.8 --cuda-csrc --tag s7e --out "$OUT/e2e_s7e.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s7d)  # session 7, call 4: the phase-5 form picked by the shuffle count (P5 unset: 1 or 2 per variant and window
        # bound); GPU tests; kernel A/B with banks sized to the window (as the runtime); commit ratios; e2e
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -2
      timeout 110 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5,8 --bank-t 0 --layout ut,utp1,utp2 \
          --out "$OUT/csrc_s7d.json" 2>&1 | tail -25
      timeout 60 python benchmarks/bench_commit_cuda.py --impls cuda --batches 32,128 --replays 20 \
          --out "$OUT/commit_s7d.json" 2>&1 | tail -5
      timeout 170 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s7d --out "$OUT/e2e_s7d.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s7c)  # session 7, call 3: one TMA copy per warp tile, the batched products reduce-scatter (P5 = 2, now the
        # default) and the stack-free reduce_scatter: GPU tests, kernel and commit A/B (utp1: P5 = 1; utrow: copies
        # per row), e2e at both shapes, B = 64 / 256
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -2
      timeout 110 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5,8 --layout ut,utp1,utrow \
          --out "$OUT/csrc_s7c.json" 2>&1 | tail -25
      timeout 100 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_utp1,cuda_utrow --batches 32,128 --replays 20 \
          --out "$OUT/commit_s7c.json" 2>&1 | tail -13
      timeout 170 python benchmarks/bench_e2e.py --shapes map,flame --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s7c --out "$OUT/e2e_s7c.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s7b)  # session 7, call 2: P5 the default; GPU tests; UT (P5) vs the serial kernels at batch 1-2 (issue 9);
        # variants 2 / 3 at batches the cost model extrapolates to; where the P5 map step (8x256x256, B = 64) stalls
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -2
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 2,5,8 --layout auto,ut \
          --out "$OUT/csrc_b12_s7b.json" 2>&1 | tail -26
      timeout 120 python benchmarks/bench_csrc_cuda.py --batches 40,48,96,192 --Ts 5 --layout ut,utv2,utv3 \
          --out "$OUT/csrc_var_s7b.json" 2>&1 | tail -18
      VLLM_SPECLA_CUDA_LAYOUT=ut timeout 100 ncu --set full --import-source yes --clock-control none \
          -k regex:chain_verify_ut --launch-skip 1 --launch-count 1 -o "$OUT/ut_p5_step_b64" \
          python benchmarks/prof/cuda_once.py 64 5 5 8x256x256 > /dev/null 2>&1; echo "rep rc $?"
      timeout 40 ncu -i "$OUT/ut_p5_step_b64.ncu-rep" --page details > "$OUT/ncu_p5_details.txt" 2>&1
      grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Compute \(SM\)" \
          "$OUT/ncu_p5_details.txt" | head -12
      timeout 40 ncu -i "$OUT/ut_p5_step_b64.ncu-rep" --page source --csv --print-source cuda > "$OUT/src_cuda.csv" 2>&1
      timeout 40 ncu -i "$OUT/ut_p5_step_b64.ncu-rep" --page source --csv --print-source sass > "$OUT/src_sass.csv" 2>&1
      gzip -f "$OUT/src_cuda.csv" "$OUT/src_sass.csv"; rm -f "$OUT/ut_p5_step_b64.ncu-rep"; ls -la "$OUT"
      ;;
  s7a)  # session 7, call 1 (prepared in session 6, not run): GPU tests incl. the new build-variant and P5
        # parametrizations, the opt-in register phase 5 (P5) A/B, commit ratios, map B = 64 / 256 with P5
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 150 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -2
      timeout 100 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5,8 --layout ut,utp5 \
          --out "$OUT/csrc_s7a.json" 2>&1 | tail -13
      timeout 90 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_utp5 --batches 32,128 --replays 20 \
          --out "$OUT/commit_s7a.json" 2>&1 | tail -5
      VLLM_SPECLA_CUDA_UT_P5=1 timeout 170 python benchmarks/bench_e2e.py --shapes map --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s7a-p5 --out "$OUT/e2e_s7a.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s6a)  # session 6, call 1: the UT kernel's uniform-pair lane order vs session 5's (same run), full ncu of both
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 170 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5,8 --layout ut,utv5 \
          --out "$OUT/csrc_s6a.json" 2>&1 | tail -26
      timeout 110 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_utv5 --batches 32,128 --replays 20 \
          --out "$OUT/commit_s6a.json" 2>&1 | tail -9
      for lanes in pair v5; do
        VLLM_SPECLA_CUDA_LAYOUT=ut VLLM_SPECLA_CUDA_UT_LANES=$lanes timeout 80 ncu --set full --clock-control none \
            -k regex:chain_verify_ut --launch-skip 1 --launch-count 1 python benchmarks/prof/cuda_once.py 64 5 5 \
            > "$OUT/ncu_full_$lanes.txt" 2>&1
        grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Stall|Shared" \
            "$OUT/ncu_full_$lanes.txt" | head -30
      done
      timeout 150 python -m pytest -q -x tests/test_csrc.py -k "cuda_ut" 2>&1 | tail -3
      ;;
  s6b)  # session 6, call 2: where the UT step's warps stall (per-reason stall cycles, source-level tables)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16 VLLM_SPECLA_CUDA_LINEINFO=1
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      ncu --version | tail -1
      ncu --help | grep -iE -A1 "print-source|--page " | head -20
      for sh in 6x256x512 8x256x256; do
        VLLM_SPECLA_CUDA_LAYOUT=ut timeout 60 ncu --clock-control none -k regex:chain_verify_ut --launch-skip 1 \
            --launch-count 1 --page raw --metrics \
            "regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:^smsp__inst_executed_op_.*\.sum$,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,smsp__inst_executed_op_ldgsts.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum" \
            python benchmarks/prof/cuda_once.py 64 5 5 $sh > "$OUT/ncu_stalls_$sh.txt" 2>&1
        grep -vE "^==|^\[|^done" "$OUT/ncu_stalls_$sh.txt" | awk '$NF != "0" && $NF != "0.00"' | head -70
      done
      VLLM_SPECLA_CUDA_LAYOUT=ut timeout 100 ncu --set full --import-source yes --print-details all --clock-control none \
          -k regex:chain_verify_ut --launch-skip 1 --launch-count 1 -o "$OUT/ut_step_b64" \
          python benchmarks/prof/cuda_once.py 64 5 5 > /dev/null 2>&1; echo "rep rc $?"
      timeout 60 ncu -i "$OUT/ut_step_b64.ncu-rep" --print-details all --page details > "$OUT/ncu_details.txt" 2>&1
      grep -iE -B2 -A12 "Excessive|stall" "$OUT/ncu_details.txt" | head -120
      timeout 60 ncu -i "$OUT/ut_step_b64.ncu-rep" --page source --csv --print-source cuda > "$OUT/ncu_source_cuda.csv" 2>&1
      timeout 60 ncu -i "$OUT/ut_step_b64.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source_sass.csv" 2>&1
      ls -la "$OUT"; head -c 600 "$OUT/ncu_source_cuda.csv"
      ;;
  s6c)  # session 6, call 3: UT kernel build variants (0 = v5, 1 = + vector cg stores, 2 = + TMA stage refills), A/B
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 200 python -m pytest -q -x tests/test_csrc.py -k "cuda_ut" 2>&1 | tail -3
      timeout 200 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5,8 --layout utv0,utv1,utv2 \
          --out "$OUT/csrc_s6c.json" 2>&1 | tail -26
      timeout 120 python benchmarks/bench_commit_cuda.py --impls cuda_utv0,cuda_utv2 --batches 32,128 --replays 20 \
          --out "$OUT/commit_s6c.json" 2>&1 | tail -9
      VLLM_SPECLA_CUDA_LAYOUT=ut timeout 60 ncu --clock-control none -k regex:chain_verify_ut --launch-skip 1 \
          --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
          --section SchedulerStats python benchmarks/prof/cuda_once.py 64 5 5 > "$OUT/ncu_v2.txt" 2>&1
      grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|L2 Hit|Issued Warp" "$OUT/ncu_v2.txt"
      ;;
  s6d)  # session 6, call 4: UT variant 3 (16 lanes per row, 16 warps per SM) vs 2 / 0, tests of 3, ncu of 3
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      VLLM_SPECLA_CUDA_UT_VAR=3 timeout 200 python -m pytest -q -x tests/test_csrc.py -k "cuda_ut" 2>&1 | tail -3
      timeout 200 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5,8 --layout utv0,utv2,utv3 \
          --out "$OUT/csrc_s6d.json" 2>&1 | tail -26
      timeout 120 python benchmarks/bench_commit_cuda.py --impls cuda_utv2,cuda_utv3 --batches 32,128 --replays 20 \
          --out "$OUT/commit_s6d.json" 2>&1 | tail -9
      VLLM_SPECLA_CUDA_UT_VAR=3 VLLM_SPECLA_CUDA_LAYOUT=ut timeout 60 ncu --clock-control none -k regex:chain_verify_ut \
          --launch-skip 1 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section SchedulerStats --section WarpStateStats python benchmarks/prof/cuda_once.py 64 5 5 > "$OUT/ncu_v3.txt" 2>&1
      grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|Registers Per|Achieved Occ|Issued Warp|Grid Size" "$OUT/ncu_v3.txt"
      ;;
  s6e)  # session 6, call 5: the final UT dispatch (variant 2 / 3 by the cost model): GPU tests, commit ratios,
        # map end to end at B = 64 / 256, kernel table, flame B = 64
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      timeout 90 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -2
      timeout 80 python benchmarks/bench_commit_cuda.py --impls cuda --batches 32,128 --replays 20 \
          --out "$OUT/commit_s6e.json" 2>&1 | tail -5
      timeout 170 python benchmarks/bench_e2e.py --shapes map --batches 64,256 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --cuda-csrc --tag s6e --out "$OUT/e2e_s6e.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 70 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5 --layout ut,utv2,utv3 \
          --out "$OUT/csrc_s6e.json" 2>&1 | tail -7
      timeout 80 python benchmarks/bench_e2e.py --shapes flame --batches 64 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --cuda-csrc --tag s6e --out "$OUT/e2e_s6e.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s6f)  # session 6, call 6: UT variants 4 (16 lanes x 4 rows per lane) and 5 (32 lanes x 4 rows): tests, table,
        # and map B = 64 end to end with the fastest variant of its kernel row forced, if not the default
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; assert _cpp.load_cuda()" 2>&1 | tail -2
      for var in 4 5; do
        VLLM_SPECLA_CUDA_UT_VAR=$var timeout 45 python -m pytest -q -x tests/test_csrc.py -k "cuda_ut" 2>&1 | tail -1
      done
      timeout 70 python benchmarks/bench_csrc_cuda.py --batches 32,64,128 --Ts 5 --layout utv2,utv3,utv4,utv5 \
          --out "$OUT/csrc_s6f.json" 2>&1 | tail -13
      best=$(python -c "
import json; r=[x for x in json.load(open('$OUT/csrc_s6f.json')) if x['shape']=='8x256x256' and x['batch']==64 and x['kind']=='step'][0]
print(min((r['cuda_utv%d_us' % v], v) for v in (3, 4, 5))[1])")
      echo "fastest variant for 8x256x256 B=64 step: $best"
      if [ "$best" != "3" ]; then
        VLLM_SPECLA_CUDA_UT_VAR=$best timeout 80 python benchmarks/bench_e2e.py --shapes map --batches 64 --ks 4 --alphas 0.8 \
            --snapshot-ks 4 --cuda-csrc --tag "s6f-var$best" --out "$OUT/e2e_s6f.jsonl" 2>&1 | grep "^{" | \
            python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      fi
      ;;
  s4a)  # session 4, call 1: UT sanity after the v5 cleanup, where a SpecLA step's time goes, ncu of the
        # CUDA step (B = 64) and batch-1 verify, tree verify alone (no pending) vs per-node replay
      export VLLM_SPECLA_CPP_JIT=1
      timeout 150 python -m pytest -q -x tests/test_kernel_ut_gpu.py 2>&1 | tail -3
      timeout 150 python benchmarks/step_breakdown.py --shapes flame,map --batches 64,256 --k 4 --cuda-csrc \
          --out "$OUT/breakdown_s4.json" 2>&1 | grep -v "^USDT\|profiler_st"
      for a in "64 5 5" "64 5 0" "1 8 0"; do
        timeout 60 ncu --clock-control none -k regex:chain_verify --launch-skip 1 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
            --section SchedulerStats python benchmarks/prof/cuda_once.py $a > "$OUT/ncu_cuda_${a// /_}.txt" 2>&1
        grep -E "Duration|Achieved Occupancy|Registers Per|Stall|Issued Warp|DRAM Throughput" "$OUT/ncu_cuda_${a// /_}.txt" | head -12
      done
      timeout 120 python benchmarks/bench_tree.py --pending 0 --batches 8,32,128 --nodes 16 --trees binary,beam4 \
          --shapes 6x256x512 --budget-s 90 --out "$OUT/tree_s4_p0.json" 2>&1 | tail -12
      ;;
  s4b)  # session 4, call 2: the conv kernel and aligned in-projection end to end (GPU tests first)
      export VLLM_SPECLA_CPP_JIT=1
      timeout 120 python -m pytest -q tests/test_kernels_gpu.py -k conv tests/test_fused_gpu.py 2>&1 | tail -2
      timeout 330 python benchmarks/bench_e2e.py --shapes flame,map --batches 64,256 --ks 4 --alphas 0.8 \
          --snapshot-ks 4 --cuda-csrc --tag s4-conv --out "$OUT/e2e_s4_conv.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      timeout 100 python benchmarks/ar_breakdown.py --shape flame --batches 1 --out "$OUT/ar_breakdown_s4.jsonl" 2>&1 | tail -3
      timeout 150 python benchmarks/bench_e2e.py --shapes flame,map --batches 1 --ks 4,8 --alphas 0.8 \
          --snapshot-ks 99 --tag s4-conv --out "$OUT/e2e_s4_b1.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s4c)  # session 4, call 3: CUDA csrc with the scaled v3 tile and the batch-1 prefetch ring (A/B)
      export VLLM_SPECLA_CPP_JIT=1
      timeout 240 python -m pytest -q tests/test_csrc.py -k cuda 2>&1 | tail -2
      for pf in 0 1; do
        VLLM_SPECLA_CUDA_RG_PREFETCH=$pf timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 \
            --layout auto,rowgroup8,rs --out "$OUT/csrc_b1_pf$pf.json" > /dev/null 2>&1; echo "pf$pf rc $?"
      done
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 32,128 --Ts 1,5,8 --out "$OUT/csrc_big_s4.json" \
          > /dev/null 2>&1; echo "big rc $?"
      timeout 90 python benchmarks/bench_commit_cuda.py --impls cuda,triton --out "$OUT/commit_s4.json" 2>&1 | tail -9
      timeout 200 python benchmarks/bench_e2e.py --shapes flame,map --batches 64,256 --ks 4 --alphas 0.8 \
          --snapshot-ks 4 --cuda-csrc --tag s4-scaled --out "$OUT/e2e_s4_scaled.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s4d)  # session 4, call 4: final CUDA defaults (tests, batch 1-2, BV / register-cap sweep at B = 64,
        # commit ratios), AR step breakdown at batch 1 and 16
      export VLLM_SPECLA_CPP_JIT=1
      timeout 200 python -m pytest -q tests/test_csrc.py -k cuda 2>&1 | tail -2
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --out "$OUT/csrc_b1_final.json" \
          > /dev/null 2>&1; echo "b1 rc $?"
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 64 --Ts 5 --bv 0,4 --regcap 1,0 \
          --out "$OUT/csrc_b64_bv.json" > /dev/null 2>&1; echo "b64 rc $?"
      timeout 90 python benchmarks/bench_commit_cuda.py --impls cuda,triton --batches 32,128 \
          --out "$OUT/commit_final.json" 2>&1 | tail -7
      for sh in flame map; do
        timeout 80 python benchmarks/ar_breakdown.py --shape $sh --batches 1,16 --out "$OUT/ar_breakdown_s4.jsonl" | tail -2
      done
      ;;
  s4e)  # session 4, call 5: the end-to-end grid with the auto policy at the final state
      timeout 570 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16,64,256 --ks 2,4,8 \
          --alphas 0.7,0.8 --snapshot-ks 4 --auto --cuda-csrc --tag s4-final --out "$OUT/e2e_s4_final.jsonl" \
          2>&1 | grep "^{" | python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),r.get('alpha'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s4f)  # session 4, call 6: row-group layouts with 16 / 32 lanes per row (forced) at batch 1-2, GPU tests
        # of every forced row-group layout, and the step breakdown at the final state
      export VLLM_SPECLA_CPP_JIT=1
      timeout 150 python -m pytest -q tests/test_csrc.py -k cuda 2>&1 | tail -1
      for lay in rowgroup16 rowgroup32 rowgroup8; do
        VLLM_SPECLA_CUDA_LAYOUT=$lay timeout 60 python -m pytest -q tests/test_csrc.py -k cuda 2>&1 | tail -1
      done
      for pf in "" 1; do
        VLLM_SPECLA_CUDA_RG_PREFETCH=$pf timeout 100 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 \
            --layout auto,rowgroup8,rowgroup16,rowgroup32 --out "$OUT/csrc_b1_lpr_pf${pf:-auto}.json" > /dev/null 2>&1
        echo "pf${pf:-auto} rc $?"
      done
      timeout 150 python benchmarks/step_breakdown.py --shapes flame,map --batches 64 --k 4 --cuda-csrc \
          --out "$OUT/breakdown_s4_final.json" 2>&1 | grep -v "^USDT\|profiler_st" | grep -v "^    "
      ;;
  s4g)  # session 4, call 7: GPU tests at the final commit, batch-1 CUDA defaults
      export VLLM_SPECLA_CPP_JIT=1
      timeout 200 python -m pytest -q tests/test_csrc.py -k cuda tests/test_kernels_gpu.py tests/test_fused_gpu.py \
          tests/test_dispatch.py 2>&1 | tail -2
      timeout 150 python -m pytest -q tests/test_kernel_ut_gpu.py tests/test_tree_hld_gpu.py 2>&1 | tail -2
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,2 --Ts 1,5,8 --out "$OUT/csrc_b1_final2.json" \
          > /dev/null 2>&1; echo "b1 rc $?"
      ;;
  s5a)  # session 5, call 1: the UT-form CUDA kernel (chain_verify_ut.cu): GPU tests, then its speed
        # forced with 1 / 2 / 4 warps per CTA against the automatic CUDA layout, Triton and Triton UT,
        # and fused commit / step vs replay
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; print('cuda built', _cpp.load_cuda())" 2>&1 | tail -1
      timeout 240 python -m pytest -q -x tests/test_csrc.py -k cuda 2>&1 | tail -4
      timeout 150 python benchmarks/bench_csrc_cuda.py --batches 1,2,64,128 --Ts 1,5,8 --layout auto,ut1,ut2,ut4 \
          --out "$OUT/csrc_ut_s5a.json" 2>&1 | grep -v '^{'
      timeout 120 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_ut,triton --batches 32,64,128 \
          --out "$OUT/commit_ut_s5a.json" 2>&1 | grep -v '^{'
      ;;
  s5b)  # session 5, call 2: the UT kernel with its staging loads issued before their stores: tests, speed
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; print('cuda built', _cpp.load_cuda())" 2>&1 | tail -1
      timeout 240 python -m pytest -q -x tests/test_csrc.py -k cuda 2>&1 | tail -2
      timeout 200 python benchmarks/bench_csrc_cuda.py --batches 1,2,32,64,128,256 --Ts 1,5,8 --layout auto,ut1,ut2,ut4 \
          --out "$OUT/csrc_ut_s5b.json" 2>&1 | grep -v '^{'
      timeout 150 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_ut,triton --batches 32,64,128 \
          --out "$OUT/commit_ut_s5b.json" 2>&1 | grep -v '^{'
      ;;
  s5c)  # session 5, call 3: the UT kernel v3 (per-(row, head) prep once, a loop over value tiles)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; print('cuda built', _cpp.load_cuda())" 2>&1 | tail -1
      timeout 240 python -m pytest -q -x tests/test_csrc.py -k cuda 2>&1 | tail -2
      timeout 200 python benchmarks/bench_csrc_cuda.py --batches 1,2,64,256 --Ts 1,5,8 --layout auto,ut --regcap 1,0 \
          --out "$OUT/csrc_ut_s5c.json" 2>&1 | grep -v '^{'
      timeout 100 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_ut,triton --batches 32,128 \
          --out "$OUT/commit_ut_s5c.json" 2>&1 | grep -v '^{'
      ;;
  s5d)  # session 5, call 4: UT kernel v4 (cp.async next-tile prefetch, compact [T, T] algebra, split by
        # occupancy): tests, kernel tables, commit ratios, then end to end with it on (VLLM_SPECLA_CUDA_UT=1)
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; print('cuda built', _cpp.load_cuda())" 2>&1 | tail -1
      timeout 120 python -m pytest -q -x tests/test_csrc.py -k cuda 2>&1 | tail -2
      timeout 90 python benchmarks/bench_csrc_cuda.py --batches 1,64,256 --Ts 1,5,8 --layout auto,ut \
          --out "$OUT/csrc_ut_s5d.json" 2>&1 | grep -v '^{'
      timeout 70 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_ut,triton --batches 32,128 \
          --out "$OUT/commit_ut_s5d.json" 2>&1 | grep -v '^{'
      VLLM_SPECLA_CUDA_UT=1 timeout 230 python benchmarks/bench_e2e.py --shapes flame,map --batches 64,256 --ks 4 \
          --alphas 0.8 --snapshot-ks 4 --cuda-csrc --tag s5-ut --out "$OUT/e2e_s5_ut.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s5e)  # session 5, call 5: UT kernel v5 (wave-aware split, v / v~ columns one tile ahead): tests, kernel
        # tables (auto = UT at >= 256 (row, head) pairs, rs = v3 forced, ut forced), commit ratios, and
        # the end-to-end grid with the default dispatch and the auto draft-length policy
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; print('cuda built', _cpp.load_cuda())" 2>&1 | tail -1
      timeout 100 python -m pytest -q -x tests/test_csrc.py -k cuda 2>&1 | tail -2
      timeout 100 python benchmarks/bench_csrc_cuda.py --batches 32,64,128,256 --Ts 5,8 --layout auto,rs,ut \
          --out "$OUT/csrc_ut_s5e.json" 2>&1 | grep -v '^{'
      timeout 70 python benchmarks/bench_commit_cuda.py --impls cuda,cuda_ut,triton --batches 32,128 \
          --out "$OUT/commit_ut_s5e.json" 2>&1 | grep -v '^{'
      timeout 300 python benchmarks/bench_e2e.py --shapes flame,map --batches 1,16,64,256 --ks 4 --alphas 0.8 \
          --snapshot-ks 4 --auto --cuda-csrc --tag s5-final --out "$OUT/e2e_s5_final.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s5f)  # session 5, call 6: tests at the final dispatch (UT from 192 pairs; CUDA takes long SpecLA steps from
        # Triton UT), ncu of the UT step at B = 64, end to end at K = 8 where that dispatch change applies
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; print('cuda built', _cpp.load_cuda())" 2>&1 | tail -1
      timeout 90 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -2
      VLLM_SPECLA_CUDA_LAYOUT=ut timeout 60 ncu --clock-control none -k regex:chain_verify_ut --launch-skip 1 \
          --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
          python benchmarks/prof/cuda_once.py 64 5 5 > "$OUT/ncu_ut_step_b64.txt" 2>&1
      grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per" \
          "$OUT/ncu_ut_step_b64.txt" | head -8
      timeout 180 python benchmarks/bench_e2e.py --shapes flame,map --batches 64,256 --ks 8 --alphas 0.8 \
          --snapshot-ks 99 --cuda-csrc --tag s5-k8 --out "$OUT/e2e_s5_k8.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  s5g)  # session 5, call 7: after the review fixes (occupancy query after the shared-memory opt-in, Gram and
        # reduce-scatter in registers at TM 16, NaN rows for over-long windows): tests, the split at
        # 8x256x256 B = 32 / 64, map at B = 64 end to end
      export VLLM_SPECLA_CPP_JIT=1 MAX_JOBS=16
      python -c "from vllm_specla.ops import _cpp; print('cuda built', _cpp.load_cuda())" 2>&1 | tail -1
      timeout 90 python -m pytest -q -x tests/test_csrc.py -k cuda tests/test_dispatch.py 2>&1 | tail -2
      timeout 40 python benchmarks/bench_csrc_cuda.py --batches 32,64 --Ts 5 --layout auto,rs \
          --out "$OUT/csrc_ut_s5g.json" 2>&1 | grep -v '^{' | tail -6
      timeout 90 python benchmarks/bench_e2e.py --shapes map --batches 64 --ks 4 --alphas 0.8 --snapshot-ks 4 \
          --cuda-csrc --tag s5-fix --out "$OUT/e2e_s5_map64.jsonl" 2>&1 | grep "^{" | \
          python -c "import sys,json;[print(r['shape'],r['batch'],r['mode'],r.get('K'),round(r.get('step_ms',0),3),round(r.get('speedup',0),3),r.get('lossless_rows')) for r in map(json.loads,sys.stdin)]"
      ;;
  *) echo "usage: $0 CASE (next on an H200: s49a, s37g, s48d, s43b, s47a, s51a; on any card: s52a;" \
          "the header says why), one of:" \
          $(grep -oE '^  [0-9a-z|-]+\)' "$0" | tr -d ' )' | head -12) "... (one device call each)"
     exit 2 ;;
esac

# History of the cases, newest first (kept from this file's header, sessions 4-49):
# GPU runs for the next session, batched into device calls of < 10 minutes (each call: `run` with
# carry [".whl", ".devdata"] where fla or the trained data is needed, starting with the pip line of
# README/device; the s5* / s6* / s8d-s8f calls need neither). Session 48: no H200 (every ask got an H100); s48a-s48f
# ran there (the recover kernel's K-tiles, grouped factor loads and 3-D tile: slower, removed; its Nsight Compute profiles;
# the commit kernels with PDL, kept; RESULTS.md "Session 48"). NEXT, on an H200: s37g (issue 6's batch-1 rows), s48d
# (recover with PDL: issue 5's 8x256x256 batch-32 recover), s43b (issue 5's tables), s47a; s49a is their short form for ~8 minutes. Session 47: no H200 (13 asks; two got H100s): s46f,
# s46g (its H200 check edited out on the device copy: an H100 A/B), s46a and s47a ran on H100s (benchmarks/RESULTS.md
# "Session 47"); the precheck became the default (auto), recover's scaled fold was removed (s46a's three-entry
# configs, and s45d's, now raise: neither case runs as written). NEXT, on an H200: s37g (issue 6's batch-1 rows at the new default; s36b with ~10 min left), s47a
# (the precheck's A/B there), s43b (issue 5's tables). Session 46: an H200 ran s45d, s45c, s46b (a recover
# config sweep), s36b, s43b and two test runs (benchmarks/RESULTS.md "Session 46"); recover's default became 8/2, its
# split fold (s45d's /1 configs) was removed. NEXT, on an H200: s46f (the chain kernel's renormalisation precheck:
# tests, kernel tables; ~5 min), s46g (its batch-1 e2e A/B, issue 6's rows; ~8 min on a fresh machine), s46a (the
# recover kernel's scaled fold, issue 5's 8x256x256 batch-32 recover; ~2 min, timeouts 320 s). (s46b / s46c / s46e
# in RESULTS.md were inline commands of session 46, not cases here.) Session 45: no H200; an H100 ran s45a and s44g (its
# building arms hung on a lock file a killed build left, now removed by ops/_cpp.py _build_and_load) and one inline
# load_cuda_kernels() (both kernels loaded; benchmarks/RESULTS.md "Session 45"). NEXT: s45c on any card (< 9.5 min: the
# default's first build timed, s44g's arms, a planted stale lock), then on an H200 s43b (issue 5's tables; its
# recover rows at the default config), s45d (the recover kernel's tile configs, ~2 min) and s36b. Session 44: an H200 ran s43b, s43d and s44a-s44f
# (benchmarks/RESULTS.md "Session 44"); the CUDA csrc kernels then became the default (ops/_cpp.py load_cuda_kernels:
# DecodeRuntime builds them on first use, 1-3 min with nvcc, so a fresh machine's first bench_e2e run takes that
# much longer; --no-cuda-csrc / --skinny-gemm off for the old arms). NEXT: s44g on any card (the new default as a
# user gets it: with and without the C++ CPU extension, and VLLM_SPECLA_CUDA_KERNELS=1 / 0; ~4 min). Session 43: an H200 ran s43a (= s36b: issue 6's rows,
# benchmarks/RESULTS.md "Session 43"); an H100 ran s42f; s43b / s43c never ran. NEXT: s43b on an H200 (issue 5's
# kernel tables; s43c where little device time is left), then s43d (CUDA csrc vs Triton at batch 64 / 256). Have
# the next command ready: a machine left idle 30 s is released. Session 42: no H200; s42b, s42c and s42e ran on H100s
# (benchmarks/RESULTS.md "Session 42"; s42c's fla conv was the default only for that call, so s42c now runs today's
# code under its tag; s42f never ran); NEXT: s42f on any card (~2 min), s36b on an H200 (s37g where little device
# time is left). Session 41: no H200; s41a and s41c ran on H100s (benchmarks/RESULTS.md
# "Session 41"; s41b never ran, s41c is its cut); NEXT unchanged: s36b on an H200 (s37g where little device time is left). Session 40: no H200 (fourteen asks got no machine,
# three an H100, where s36b / s37g exited at once); NEXT unchanged. Session 39 (an H100): benchmarks/RESULTS.md "Session 39" (s39a, s39c-s39f as run; s39b never ran). Removed after them: the one-launch UT form (UT_ONE; commit bf76235 keeps it), the token depth 2 and the late glue launch (TOKEN_PREFETCH, GLUE_LATE_LAUNCH; 08293f2), REDUCE_KO_FIRST (a8b5c85). So s39a's bench_ut.py line fails now (no --ut1-configs), and its tree runs, s39b, s39c's token-2 arms, s39d's late arms and s39f's KO arms would run today's code under their old tags: none can be rerun as written. NEXT: s36b on an H200 (s37g, its batch-1 half, where little device time is left). Session 38 (an H100): benchmarks/RESULTS.md "Session 38" (s38a-s38h as run; s38c / s38d ran `auto` where they now say `1`). Session 37 (an H100): s37a-s37d, s37f, s37h as run (s37d's "default" was the UT kernel's small config, removed after it), and s37e (in s37d's warm machine: bench_tree.py --batches 1,2,4 --nodes 16,32 --trees binary,beam4 --shapes 8x256x256,6x256x512 --pending 0, once at the default config and once with --ut-config 32/2/16/3). Session 36 (an H100 again): benchmarks/RESULTS.md "Session 36" (s35a, s35b, s36a as run). Session 35 (an H100): benchmarks/RESULTS.md "Session 35" (s32a-s32f as run, on the H100, s32a / s32b with VLLM_SPECLA_SKINNY_PRE=coherent, s32d as `VLLM_SPECLA_CPP_JIT=1 sass_pdl_check.py --build`; the .nc build, VLLM_SPECLA_SKINNY_PRE / _EARLY and --skinny-deep were removed after them, commit 32bc525 keeps them, so s32c / s32e / s32f cannot be rerun as written). Session 31: benchmarks/RESULTS.md "Session 31" (s31a-s31d as run; s31a's prefetches were removed after it; s31d's 200 s pytest timeout cut its test run, a short run of test_decode_runtime_gpu.py followed). Session 30: benchmarks/RESULTS.md "Session 30" (s30b-s30f as run). Session 29: benchmarks/RESULTS.md "Session 29" (s29a-s29e
# as run; the int4 draft weights of s29c / s29d were removed after them, commit f136f22 keeps them; s29e's out_dtype
# after it, commit 637b841). Session 28: benchmarks/RESULTS.md "Session 28" (s28a-s28e as run; s28a's int / asm / mix and s28c's
# --conv-gating were removed after them; s28d ran s26c's `auto` grid without the CUDA csrc). Session 27: benchmarks/RESULTS.md "Session 27" (s26b, s27a-s27c as
# run; s27c's --argmax-epilogue was removed after it; s26a is superseded by s27a; s26c, `auto` on the grid, is still unrun). Session 24: benchmarks/RESULTS.md "Session 24" (s24b-s24d as
# run; their --skinny-fused A/B and the skinny GEMM's fused forms were removed after s24d, so they cannot be rerun as
# written; s24c also ran s24a's GPU tests). Session 21: benchmarks/RESULTS.md "Session 21" (s21a-s21e as run; s21b's VLLM_SPECLA_CUDA_STORE_SWAP was removed after it, so s21b / s21c cannot be rerun as written; s21d is the final code but the AR body without the factor-bank path). Session 22: benchmarks/RESULTS.md "Session 22" (s22a, s22b as run; the default VLLM_SPECLA_CUDA_RG_AR became 2 after s22b). Session 23: benchmarks/RESULTS.md "Session 23" (s23a-s23d as run; RG_AR 4 (80 registers) of s23a and 5 / 6 of s23b were removed after them, 4 is now the automatic rule and the default). Session 20: s20a (per-instruction stall sampling), s20b (the raw-v prefetch), s20c (tests, kernel table, e2e batch 1), s20d (predicated tile loads; AR layouts). The sb kernel's forced forms (sbXY layouts, VLLM_SPECLA_CUDA_SB_LATE / _SB_SCALED) were removed after session 20: s18*-s20b cannot be rerun as written; session 19: benchmarks/RESULTS.md "Session 19" (s19a-s19e as run). Before: s17c reruns session 17's final code (the runtime with the skinny GEMM's L2 prefetch); session 17: benchmarks/RESULTS.md "Session 17" (s17a-s17d as run). Session 15: benchmarks/RESULTS.md
# "Session 15" (s15a-s15e as run; s15b-s15d ran a kernel variant removed after them). State after session 13: benchmarks/RESULTS.md "Session 13" (s13a, s13c-s13g as
# run; session 14: "Session 14" (s14a-s14e as run); s13a's win: settings and --gemm-window were removed after it, s13e's grid ran the first version of the cost split). Session 12: benchmarks/RESULTS.md "Session 12" (s12b-s12f as run;
# s12b's rows-s11 and s12c's mma: settings were removed after them). Session 11: "Session 11" (s11a-s11f as run;
# s11d's multi:* settings were removed after it). Before it: benchmarks/RESULTS.md
# "Session 10" (s10a-s10f below as run; s10a / s10b ran UT_SOLVE / UT_SPLIT before they became the tree defaults,
# s10e the 25-node trees on UT before planned trees went back to the heavy-light kernel). 1 / 2: the regression set and kernel tables; s4a-s4g / s5a-s5f / s6a-s6f / s7a-s7f / s8a-s8f:
# the session 4-8 calls as run (s6e = session 6's GPU tests, commit ratios and e2e at its final
# UT dispatch, s7d session 7's, s8c session 8's e2e; s6a / s6f forced variants that no longer exist: utv5 lanes,
# UT_VAR 4 / 5 (other layouts); session 7's UT_VAR 4 / 5 were the tensor-core variants, measured in s8a and
# removed, so s8a's utv4 / utv5 columns cannot be rerun (VLLM_SPECLA_CUDA_UT_VAR=4 / 5 is an error now); s7a's utp5 / cuda_utp5 columns were the register
# phase 5 now called P5 = 1; s8e's VLLM_SPECLA_UT_PREP=loop form was removed after s8e; s9b's e2e ran a conv default of
# TB = 8 chunks at 1024-channel tiles, replaced after s9b: bench_conv.py still times that config).
