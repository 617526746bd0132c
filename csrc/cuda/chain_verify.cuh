// CUDA chain verify with the state tile in shared memory and the deferred commit fused
// (ALGORITHMS.md §3, §6). Plain CUDA (no torch headers): the torch binding is
// csrc/cuda/torch_binding_cuda.cpp, compiled only where CUDA torch is present.
//
// NOT RUN: written and compile-checked with `nvcc -arch=sm_90 -c` on a machine without a GPU; it
// has never executed. Treat it as a starting point for the GPU engineer, not as a tested kernel.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vllm_specla {
namespace cuda {

// Semantics: vllm_specla/ops/reference.py::chain_verify_ref. All pointers are device pointers.
// Token tensors contiguous fp32; state/banks fp32 with arbitrary strides (elements); index
// tensors contiguous int64. Optional pointers may be null (no banks / no pending / no record).
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
  const int64_t* slots;        // [R]
  const int64_t* cu_seqlens;   // [R + 1]
  const int64_t* write_bank;   // [R] or null: no factor output
  const int64_t* pending_len;  // [R] or null: no pending factors
  const int64_t* read_bank;    // [R] or null
  int R, H, HV, K, V, Tmax;
  float scale;
  bool write_final_state;
  bool use_qk_l2norm;
  bool in_bf16;  // q, k, v are bfloat16 (read and widened in the kernel, no conversion kernels)
  bool vec_ok;   // K % 128 == 0, unit key strides, 16-byte aligned bases: 16-byte loads/stores
};

// Launches one CTA per (32-row value tile, value head, row); returns the launch error.
cudaError_t chain_verify(const ChainVerifyParams& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace vllm_specla
