// CUDA chain verify (v2): state tile in registers, value dim tiled, deferred commit fused.
//
// v1 (one 4-warp CTA per 32 value rows, tile in shared memory, k/q normalised through shared
// memory) ran 3-10x slower than the Triton kernel on the H200 (benchmarks/RESULTS.md). v2 mirrors
// the Triton kernel's layout (ops/triton_chain.py, the [BV, K] variant):
//
// One warp per (value tile of kBV = 8 rows, value head hv, request row r):
//   1. load the [kBV, K] tile of state[slot, hv] into registers, lane-strided along K (read once);
//   2. fold the pending factors of bank read_bank (serial DeltaConstruct
//      M = e^{g_u} M + v~_u k_u^T) and write the committed tile S_0 once;
//   3. run the window from the register tile: per token, q/k loaded (fp32 or bf16, widened in
//      the kernel), l2-normalised with warp reductions; per value row two warp reductions
//      (M k, M q), v~ = beta (v - e^g M k), o = e^g M q + v~ (k.q), M = e^g M + v~ k^T;
//   4. record (k^_t, v~_t, g_t) into bank write_bank (one writer per element); write the final
//      tile only for AR (write_final_state).
// Value rows are independent recurrences in the [V, K] layout, so V tiling needs no
// communication between programs.

#include "chain_verify.cuh"

#include <cuda_bf16.h>

namespace vllm_specla {
namespace cuda {
namespace {

constexpr int kBV = 8;         // value rows per warp program (registers: kBV * K / 32 floats)
constexpr float kEps = 1e-6f;  // fla l2norm eps

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <typename T>
__device__ __forceinline__ float ld(const T* p, int64_t i);
template <>
__device__ __forceinline__ float ld<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// Key index of a lane's c-th element. VEC: 4 consecutive keys per lane per 128-key chunk (16-byte
// loads and stores of the state, banks and q/k); else lane-strided (any K).
template <bool VEC>
__device__ __forceinline__ int kidx(int lane, int c) {
  return VEC ? (c >> 2) * 128 + lane * 4 + (c & 3) : lane + 32 * c;
}

template <typename T>
__device__ __forceinline__ void ld4(const T* p, float* out);
template <>
__device__ __forceinline__ void ld4<float>(const float* p, float* out) {
  const float4 x = *reinterpret_cast<const float4*>(p);
  out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
}
template <>
__device__ __forceinline__ void ld4<__nv_bfloat16>(const __nv_bfloat16* p, float* out) {
  const uint2 x = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.y));
  out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
}

// Load KPL key elements of a dense row (element stride 1 when VEC, else ``stride``).
template <bool VEC, int KPL, typename T>
__device__ __forceinline__ void load_row(const T* row, int64_t stride, int lane, int K, float* out) {
  if constexpr (VEC) {
#pragma unroll
    for (int c = 0; c < KPL; c += 4) ld4<T>(row + kidx<true>(lane, c), out + c);
  } else {
#pragma unroll
    for (int c = 0; c < KPL; ++c) {
      const int j = kidx<false>(lane, c);
      out[c] = j < K ? ld<T>(row, j * stride) : 0.f;
    }
  }
}

template <bool VEC, int KPL>
__device__ __forceinline__ void store_row(float* row, int64_t stride, int lane, int K, const float* in) {
  if constexpr (VEC) {
#pragma unroll
    for (int c = 0; c < KPL; c += 4)
      *reinterpret_cast<float4*>(row + kidx<true>(lane, c)) = make_float4(in[c], in[c + 1], in[c + 2], in[c + 3]);
  } else {
#pragma unroll
    for (int c = 0; c < KPL; ++c) {
      const int j = kidx<false>(lane, c);
      if (j < K) row[j * stride] = in[c];
    }
  }
}

// One warp per (value tile of kBV rows, value head hv, request row r); KPL key elements per lane
// (K <= 32 * KPL). The [kBV, K] state tile lives in registers (lane-strided key columns), read
// once; pending factors are folded in registers and the committed tile written once; each window
// token costs two warp reductions per value row and no global state traffic.
template <typename TIn, int KPL, bool VEC>
__global__ void __launch_bounds__(32) chain_verify_kernel(const ChainVerifyParams p) {
  const int K = p.K, V = p.V, H = p.H, HV = p.HV;
  const int lane = threadIdx.x;
  const int vt0 = blockIdx.x * kBV;
  const int hv = blockIdx.y;
  const int r = blockIdx.z;
  const int h = hv / (HV / H);
  const int64_t slot = p.slots[r];
  const int64_t bos = p.cu_seqlens[r], eos = p.cu_seqlens[r + 1];
  const int rows = min(kBV, V - vt0);
  const TIn* q = static_cast<const TIn*>(p.q);
  const TIn* k = static_cast<const TIn*>(p.k);
  const TIn* v = static_cast<const TIn*>(p.v);

  float* st = p.state + slot * p.st_stride[0] + hv * p.st_stride[1];
  float m[kBV][KPL];
#pragma unroll
  for (int vi = 0; vi < kBV; ++vi) {
    if (vi < rows) {
      load_row<VEC, KPL>(st + (vt0 + vi) * p.st_stride[2], p.st_stride[3], lane, K, m[vi]);
    } else {
#pragma unroll
      for (int c = 0; c < KPL; ++c) m[vi][c] = 0.f;
    }
  }

  // fused deferred commit: fold the pending factors of bank read_bank, write S_0 once
  int64_t np = p.pending_len != nullptr ? p.pending_len[r] : 0;
  if (np > p.Tmax) np = p.Tmax;
  if (np > 0) {
    const int64_t rb = p.read_bank[r];
    for (int64_t u = 0; u < np; ++u) {
      const float* bk = p.bank_k + slot * p.bk_stride[0] + rb * p.bk_stride[1] + u * p.bk_stride[2] +
                        h * p.bk_stride[3];
      const float* bv = p.bank_v + slot * p.bv_stride[0] + rb * p.bv_stride[1] + u * p.bv_stride[2] +
                        hv * p.bv_stride[3];
      const float eg =
          __expf(p.bank_g[slot * p.bg_stride[0] + rb * p.bg_stride[1] + u * p.bg_stride[2] + hv * p.bg_stride[3]]);
      float kk[KPL];
      load_row<VEC, KPL>(bk, p.bk_stride[4], lane, K, kk);
#pragma unroll
      for (int vi = 0; vi < kBV; ++vi) {
        const float vv = vi < rows ? bv[(vt0 + vi) * p.bv_stride[4]] : 0.f;
#pragma unroll
        for (int c = 0; c < KPL; ++c) m[vi][c] = fmaf(kk[c], vv, eg * m[vi][c]);
      }
    }
    if (!p.write_final_state) {
#pragma unroll
      for (int vi = 0; vi < kBV; ++vi)
        if (vi < rows) store_row<VEC, KPL>(st + (vt0 + vi) * p.st_stride[2], p.st_stride[3], lane, K, m[vi]);
    }
  }

  // the window, state tile in registers
  const bool record = p.write_bank != nullptr;
  const int64_t wb = record ? p.write_bank[r] : 0;
  for (int64_t n = bos; n < eos; ++n) {
    const int64_t t = n - bos;
    float kl[KPL], ql[KPL];
    float sk = 0.f, sq = 0.f;
    load_row<VEC, KPL>(k + (n * H + h) * K, 1, lane, K, kl);
    load_row<VEC, KPL>(q + (n * H + h) * K, 1, lane, K, ql);
#pragma unroll
    for (int c = 0; c < KPL; ++c) {
      sk = fmaf(kl[c], kl[c], sk);
      sq = fmaf(ql[c], ql[c], sq);
    }
    float rk = 1.f, rq = 1.f;
    if (p.use_qk_l2norm) {
      rk = rsqrtf(warp_sum(sk) + kEps);
      rq = rsqrtf(warp_sum(sq) + kEps);
    }
    rq *= p.scale;
    float kq = 0.f;
#pragma unroll
    for (int c = 0; c < KPL; ++c) {
      kl[c] *= rk;
      ql[c] *= rq;
      kq = fmaf(kl[c], ql[c], kq);
    }
    kq = warp_sum(kq);
    const float gn = p.g[n * HV + hv];
    const float e = __expf(gn);
    const float b = p.beta[n * HV + hv];
    const int64_t vbase = (n * HV + hv) * V + vt0;
#pragma unroll
    for (int vi = 0; vi < kBV; ++vi) {
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int c = 0; c < KPL; ++c) {
        dk = fmaf(m[vi][c], kl[c], dk);
        dq = fmaf(m[vi][c], ql[c], dq);
      }
      dk = warp_sum(dk);
      dq = warp_sum(dq);
      const float vv = vi < rows ? ld<TIn>(v, vbase + vi) : 0.f;
      const float vt = b * (vv - e * dk);
#pragma unroll
      for (int c = 0; c < KPL; ++c) m[vi][c] = fmaf(vt, kl[c], e * m[vi][c]);
      if (lane == vi && vi < rows) {
        p.o[vbase + vi] = fmaf(vt, kq, e * dq);
        if (record && t < p.Tmax)
          p.bank_v[slot * p.bv_stride[0] + wb * p.bv_stride[1] + t * p.bv_stride[2] + hv * p.bv_stride[3] +
                   (vt0 + vi) * p.bv_stride[4]] = vt;
      }
    }
    // k^ and g factors: one writer per element (V-tile 0; k^ by the first value head of its group)
    if (record && t < p.Tmax && blockIdx.x == 0) {
      if (lane == 0)
        p.bank_g[slot * p.bg_stride[0] + wb * p.bg_stride[1] + t * p.bg_stride[2] + hv * p.bg_stride[3]] = gn;
      if (hv % (HV / H) == 0) {
        float* bk = p.bank_k + slot * p.bk_stride[0] + wb * p.bk_stride[1] + t * p.bk_stride[2] + h * p.bk_stride[3];
        store_row<VEC, KPL>(bk, p.bk_stride[4], lane, K, kl);
      }
    }
  }
  if (p.write_final_state) {
#pragma unroll
    for (int vi = 0; vi < kBV; ++vi)
      if (vi < rows) store_row<VEC, KPL>(st + (vt0 + vi) * p.st_stride[2], p.st_stride[3], lane, K, m[vi]);
  }
}

template <typename TIn, int KPL, bool VEC>
cudaError_t launch(const ChainVerifyParams& p, cudaStream_t stream) {
  const dim3 grid((p.V + kBV - 1) / kBV, p.HV, p.R);
  chain_verify_kernel<TIn, KPL, VEC><<<grid, 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename TIn>
cudaError_t dispatch_k(const ChainVerifyParams& p, cudaStream_t stream) {
  // 16-byte path: K a multiple of 128 with unit key strides and 16-byte aligned rows (p.vec_ok)
  if (p.vec_ok && p.K == 128) return launch<TIn, 4, true>(p, stream);
  if (p.vec_ok && p.K == 256) return launch<TIn, 8, true>(p, stream);
  if (p.vec_ok && p.K == 512) return launch<TIn, 16, true>(p, stream);
  if (p.K <= 32) return launch<TIn, 1, false>(p, stream);
  if (p.K <= 64) return launch<TIn, 2, false>(p, stream);
  if (p.K <= 128) return launch<TIn, 4, false>(p, stream);
  if (p.K <= 256) return launch<TIn, 8, false>(p, stream);
  if (p.K <= 512) return launch<TIn, 16, false>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t chain_verify(const ChainVerifyParams& p, cudaStream_t stream) {
  if (p.R == 0) return cudaSuccess;
  return p.in_bf16 ? dispatch_k<__nv_bfloat16>(p, stream) : dispatch_k<float>(p, stream);
}

}  // namespace cuda
}  // namespace vllm_specla
