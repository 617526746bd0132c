// CUDA chain verify: state tile in registers, value dim tiled, deferred commit fused
// (ALGORITHMS.md §3, §6); v3 design notes in chain_verify.cu. Plain CUDA (no torch headers): the
// torch binding is csrc/cuda/torch_binding_cuda.cpp, compiled only where CUDA torch is present.
//
// v2 ran the GPU tests on the H200 (benchmarks/RESULTS.md); v3 (batched warp reduction, prefetch,
// BV 4/8, register caps, token strides) was written on a machine without a GPU: compile-checked
// with `nvcc -arch=sm_90` and run against chain_verify_ref in a host emulation of the warp.
#pragma once

// NVRTC (csrc/cuda/nvrtc_check.py --chain) compiles the device code only: __CUDACC_RTC__ hides the host code
// (it has no C++ standard library: the few names the device code uses are defined here)
#ifdef __CUDACC_RTC__
using int64_t = long long;
using uint32_t = unsigned int;
using uint64_t = unsigned long long;
using uintptr_t = unsigned long long;
namespace std {
template <class A, class B>
struct is_same {
  static constexpr bool value = false;
};
template <class A>
struct is_same<A, A> {
  static constexpr bool value = true;
};
}  // namespace std
#else
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <cuda_runtime.h>
#endif

namespace vllm_specla {
namespace cuda {

// Semantics: vllm_specla/ops/reference.py::chain_verify_ref. All pointers are device pointers.
// Token tensors: dense head and feature dims, any token stride (tok_stride, elements); o is
// contiguous [N, HV, V]; state/banks fp32 with arbitrary strides (elements); index tensors
// contiguous int64. Optional pointers may be null (no banks / no pending / no record);
// read_bank is required with pending_len.
struct ChainVerifyParams {
  const void* q;      // [N, H, K]  float32, or bfloat16 when in_bf16
  const void* k;      // [N, H, K]
  const void* v;      // [N, HV, V]
  const float* g;     // [N, HV]
  const float* beta;  // [N, HV]
  float* o;           // [N, HV, V]
  float* state;       // [S, HV, V, K]
  int64_t st_stride[4];
  float* bank_k;  // [S, 2, Tmax, H, K] or null
  float* bank_v;  // [S, 2, Tmax, HV, V] or null
  float* bank_g;  // [S, 2, Tmax, HV] or null
  int64_t bk_stride[5];
  int64_t bv_stride[5];
  int64_t bg_stride[4];
  int64_t tok_stride[5];       // token (dim-0) strides of q, k, v, g, beta
  const int64_t* slots;        // [R]
  const int64_t* cu_seqlens;   // [R + 1]
  const int64_t* write_bank;   // [R] or null: no factor output
  const int64_t* pending_len;  // [R] or null: no pending factors
  const int64_t* read_bank;    // [R] or null
  int R, N, H, HV, K, V, Tmax;  // N: tokens (q.size(0))
  int bv;       // value rows per warp: 4 or 8; anything else = automatic (chain_verify.cu, dispatch_bv); the
                // automatic layout's choice of the sb kernel picks its own (sb_auto), kLayoutSB takes this one
  int ut_nw;    // UT kernel (chain_verify_ut.cu): 1 warp per CTA when 1, else 4
  int ut_tpc;   // UT kernel: value tiles per CTA when > 0 (tests, sweeps), else automatic
  int ut_p5;    // UT kernel (chain_verify_ut.cu, P5) where built: 0 the previous phase 5, 1 phase 5 with
                // v~ in registers, 2 that plus one batched reduce-scatter of the window products, 3 (or
                // anything else) 1 or 2 by the shuffle count (launch_form)
  bool ut_row_copies;  // UT kernel, TMA refills: one bulk copy per state row (A/B; else one per warp
                       // tile where its rows are contiguous)
  int ut_var;   // UT kernel build variant (chain_verify_ut.cu, VAR): 1, 2, 3; anything else = automatic
  int ut_auto;  // UT kernel in the automatic layout: 0 never, 1 wherever it applies (not AR / commit
                // windows), else the shape rule of chain_verify_ut_auto
  int layout;    // kLayout*: warp layout (chain_verify.cu: v3 reduce-scatter or the small-batch row group)
  bool reg_cap;  // launch the register-capped variants where defined (chain_verify.cu, min_blocks)
  bool rg_prefetch;  // row-group kernels: prefetch ring of NB - 1 items (else the one-ahead double
                    // buffer); also lets the automatic layout pick the row group for steps with
                    // pending factors (chain_verify.cu, dispatch_k). The binding sets it from
                    // VLLM_SPECLA_CUDA_RG_PREFETCH (default: only with pending factors).
  int rg_piece;  // row-group kernels' one-ahead body: 4 or 8 keys per lane piece (rg_key); 8 also turns off the AR
                 // body (session-21 A/B, VLLM_SPECLA_CUDA_RG_PIECE, default 4)
  int rg_ar;  // one-token rows without pending factors at LPR 8, BV 4: the row-group AR body (chain_verify_rg_ar)
              // when non-zero; 2: at most 12 of its CTAs per SM; 3: the RAW body (plain AR); 4: 3 where two launches
              // fit on the GPU at once, else 2 (A/B of sessions 21-23, VLLM_SPECLA_CUDA_RG_AR, default 4)
  float scale;
  bool write_final_state;
  bool use_qk_l2norm;
  bool pdl;      // launch with programmatic dependent launch where the kernel's PTX is sm_90+ (launch_pdl
                 // below); the binding reads VLLM_SPECLA_PDL (as ops/pdl.py: '0' off, '1' / unset / empty on)
  bool in_bf16;  // q, k, v are bfloat16 (read and widened in the kernel, no conversion kernels)
  bool vec_ok;   // K % 128 == 0, unit key strides, 16-byte aligned rows: 16-byte loads/stores
};

// ChainVerifyParams::layout (the binding reads
// VLLM_SPECLA_CUDA_LAYOUT=rowgroup|rowgroup8|rs|rowgroup16|rowgroup32): automatic (row group at
// R * HV <= 16, else reduce-scatter), row group (LPR = 32 / BV lanes per row), row group with 8
// lanes per row (BV / 4 rows per lane), v3's reduce-scatter, row group with 16 lanes per row (BV
// = 2), row group with 32 lanes per row (BV = 1; K = 256 only, K = 128 runs rowgroup16). The
// row-group kernels exist for the 16-byte path with K = 128 / 256; other shapes always run v3.
// rowgroup16 is picked automatically for steps at <= 8 (row, head) pairs (chain_verify.cu,
// dispatch_k); rowgroup32 is forced only.
// kLayoutSB (VLLM_SPECLA_CUDA_LAYOUT=sb): the small-batch lean kernel (chain_verify.cu, chain_verify_sb_body):
// Triton's small-config lane split (8 lanes per value row, BV / 4 rows per lane), the next token's raw
// bf16 q / k / v loaded straight into registers one token ahead, per-warp pointers; bf16 inputs on the 16-byte path with K = 128 / 256, else the automatic layout. The automatic layout
// takes it for small-batch verify / step windows whose warps fit on the GPU at once (chain_verify.cu, sb_auto).
constexpr int kLayoutAuto = 0, kLayoutRowGroup = 1, kLayoutRowGroup8 = 2, kLayoutRS = 3, kLayoutRowGroup16 = 4,
              kLayoutRowGroup32 = 5, kLayoutUT = 6, kLayoutSB = 7;

// ---- programmatic dependent launch (PDL; ops/pdl.py states the contract) ----------------------------
// Every kernel of csrc/cuda/chain_verify*.cu starts with pdl_enter(): griddepcontrol.wait before any
// memory access (the previous kernel in the stream has completed and its writes are visible), then
// griddepcontrol.launch_dependents (the next PDL-launched kernel may start its own launch while this one
// runs). Code for older architectures has neither; launch_pdl then launches plainly.
// The kernels read their inputs through __ldg (ld.global.nc), which ptxas may move across the wait in either
// direction (session 32, the skinny GEMM; a coherent load stays where the source puts it). With the ptxas of CUDA
// 12.9 no instantiation issues a global read before the wait (csrc/cuda/nvrtc_check.py --chain --sass, run by
// tests/test_nvrtc_check.py); benchmarks/sass_pdl_check.py checks the nvcc builds on the GPU machine.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

#ifndef __CUDACC_RTC__
// Whether kernel `kern`, as loaded for the current device, was compiled from sm_90+ PTX (so its pdl_enter()
// waits): asked once per (device, kernel), in a mutex-guarded cache (host threads may launch concurrently).
inline bool pdl_capable(const void* kern) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, bool> known;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, kern);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  cudaFuncAttributes fa;
  bool ok = false;
  if (cudaFuncGetAttributes(&fa, kern) == cudaSuccess)
    ok = fa.ptxVersion >= 90;
  else
    (void)cudaGetLastError();  // (only this query's error: the kernel then launches without PDL)
  known.emplace(key, ok);
  return ok;
}

// kern<<<grid, block, smem, stream>>>(args...), with PDL when `pdl` and the kernel waits (pdl_capable).
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                       Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl && pdl_capable(reinterpret_cast<const void*>(kern)) ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
}

// UT-form kernel (chain_verify_ut.cu; kLayoutUT, VLLM_SPECLA_CUDA_LAYOUT=ut): the window as one
// chunk, 2T independent products per state tile, exact fp32. chain_verify_ut_bounds: whether it
// takes p (16-byte path, K = 128 / 256, windows and pending factors bounded by <= 16) and the
// bounds; chain_verify_ut returns cudaErrorNotSupported where it does not.
bool chain_verify_ut_bounds(const ChainVerifyParams& p, int* tb, int* pb);
bool chain_verify_ut_auto(const ChainVerifyParams& p);  // the automatic layout picks the UT kernel
cudaError_t chain_verify_ut(const ChainVerifyParams& p, cudaStream_t stream);

// Launches one single-warp CTA per (value tile of 4 or 8 rows, value head, row); returns the
// launch error.
cudaError_t chain_verify(const ChainVerifyParams& p, cudaStream_t stream);

#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace vllm_specla
