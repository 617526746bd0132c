// CUDA chain verify: state tile in shared memory, value dim tiled, deferred commit fused.
//
// NOT RUN (no GPU was available to its author): compile-checked with `nvcc -arch=sm_90 -c` only.
//
// One CTA per (value tile of BV = 32 rows, value head hv, request row r), 4 warps:
//   1. load the [BV, K] tile of state[slot, hv] into shared memory (read once);
//   2. fold the pending factors of bank read_bank (serial DeltaConstruct
//      acc = e^{g_u} acc + v~_u k_u^T) and write the committed tile S_0 back once;
//   3. run the window from the shared tile: per token, k/q are l2-normalised into shared memory,
//      each warp owns value rows (the key dim stays inside the warp: lane-strided K elements,
//      shuffle reductions, no cross-warp reduction), emitting o_t and v~_t; the tile is never
//      written to global memory between tokens;
//   4. record (k^_t, v~_t, g_t) into bank write_bank; write the final tile only for AR
//      (write_final_state).
// Value rows are independent recurrences in the [V, K] layout, so V tiling needs no
// communication between CTAs; only the k^/g factor writes are done by the hv-tile 0 CTA.

#include "chain_verify.cuh"

namespace vllm_specla {
namespace cuda {
namespace {

constexpr int kBV = 32;       // value rows per CTA
constexpr int kWarps = 4;     // warps per CTA
constexpr float kEps = 1e-6f;  // fla l2norm eps

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// KPL: key elements per lane (K <= 32 * KPL).
template <int KPL>
__global__ void __launch_bounds__(kWarps * 32) chain_verify_kernel(const ChainVerifyParams p) {
  extern __shared__ float smem[];
  const int K = p.K, V = p.V, H = p.H, HV = p.HV;
  float* tile = smem;              // [kBV, K]
  float* ks = tile + kBV * K;      // [K] current k^ (or pending k_u)
  float* qs = ks + K;              // [K] current scaled q^
  float* red = qs + K;             // [4]: 1/|k|, 1/|q|, k.q

  const int vt0 = blockIdx.x * kBV;
  const int hv = blockIdx.y;
  const int r = blockIdx.z;
  const int h = hv / (HV / H);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t slot = p.slots[r];
  const int64_t bos = p.cu_seqlens[r], eos = p.cu_seqlens[r + 1];
  const int rows = min(kBV, V - vt0);

  float* st = p.state + slot * p.st_stride[0] + hv * p.st_stride[1];
  // 1. state tile -> shared memory
  for (int i = tid; i < kBV * K; i += blockDim.x) {
    const int vi = i / K, j = i % K;
    tile[i] = vi < rows ? st[(vt0 + vi) * p.st_stride[2] + j * p.st_stride[3]] : 0.f;
  }
  __syncthreads();

  // 2. fused deferred commit
  int64_t np = p.pending_len != nullptr ? p.pending_len[r] : 0;
  if (np > p.Tmax) np = p.Tmax;
  if (np > 0) {
    const int64_t rb = p.read_bank[r];
    for (int64_t u = 0; u < np; ++u) {
      const float* bk = p.bank_k + slot * p.bk_stride[0] + rb * p.bk_stride[1] + u * p.bk_stride[2] +
                        h * p.bk_stride[3];
      for (int j = tid; j < K; j += blockDim.x) ks[j] = bk[j * p.bk_stride[4]];
      const float eg = __expf(p.bank_g[slot * p.bg_stride[0] + rb * p.bg_stride[1] + u * p.bg_stride[2] +
                                       hv * p.bg_stride[3]]);
      __syncthreads();
      const float* bv = p.bank_v + slot * p.bv_stride[0] + rb * p.bv_stride[1] + u * p.bv_stride[2] +
                        hv * p.bv_stride[3];
      for (int i = tid; i < rows * K; i += blockDim.x) {
        const int vi = i / K, j = i % K;
        tile[i] = fmaf(ks[j], bv[(vt0 + vi) * p.bv_stride[4]], eg * tile[i]);
      }
      __syncthreads();
    }
    for (int i = tid; i < rows * K; i += blockDim.x) {  // S_0 written once
      const int vi = i / K, j = i % K;
      st[(vt0 + vi) * p.st_stride[2] + j * p.st_stride[3]] = tile[i];
    }
  }

  // 3. the window, from the shared tile
  const bool record = p.write_bank != nullptr;
  const int64_t wb = record ? p.write_bank[r] : 0;
  for (int64_t n = bos; n < eos; ++n) {
    const int64_t t = n - bos;
    const float* kr = p.k + (n * H + h) * K;
    const float* qr = p.q + (n * H + h) * K;
    __syncthreads();  // previous token's readers of ks/qs are done
    for (int j = tid; j < K; j += blockDim.x) {
      ks[j] = kr[j];
      qs[j] = qr[j];
    }
    __syncthreads();
    if (warp < 2) {  // warp 0: |k|, warp 1: |q|
      const float* x = warp == 0 ? ks : qs;
      float ss = 0.f;
      for (int j = lane; j < K; j += 32) ss += x[j] * x[j];
      ss = warp_sum(ss);
      if (lane == 0) red[warp] = p.use_qk_l2norm ? rsqrtf(ss + kEps) : 1.f;
    }
    __syncthreads();
    for (int j = tid; j < K; j += blockDim.x) {
      ks[j] *= red[0];
      qs[j] *= red[1] * p.scale;
    }
    __syncthreads();
    if (warp == 0) {
      float s = 0.f;
      for (int j = lane; j < K; j += 32) s += ks[j] * qs[j];
      s = warp_sum(s);
      if (lane == 0) red[2] = s;
    }
    __syncthreads();
    const float e = __expf(p.g[n * HV + hv]);
    const float b = p.beta[n * HV + hv];
    const float kq = red[2];
    float kl[KPL], ql[KPL];
#pragma unroll
    for (int c = 0; c < KPL; ++c) {
      const int j = lane + 32 * c;
      kl[c] = j < K ? ks[j] : 0.f;
      ql[c] = j < K ? qs[j] : 0.f;
    }
    for (int vi = warp; vi < rows; vi += kWarps) {
      float* m = tile + vi * K;
      float ml[KPL];
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int c = 0; c < KPL; ++c) {
        const int j = lane + 32 * c;
        ml[c] = j < K ? m[j] : 0.f;
        dk = fmaf(ml[c], kl[c], dk);
        dq = fmaf(ml[c], ql[c], dq);
      }
      dk = warp_sum(dk);
      dq = warp_sum(dq);
      const int64_t vo = (n * HV + hv) * V + vt0 + vi;
      const float vt = b * (p.v[vo] - e * dk);
#pragma unroll
      for (int c = 0; c < KPL; ++c) {
        const int j = lane + 32 * c;
        if (j < K) m[j] = fmaf(vt, kl[c], e * ml[c]);
      }
      if (lane == 0) {
        p.o[vo] = fmaf(vt, kq, e * dq);
        if (record && t < p.Tmax)
          p.bank_v[slot * p.bv_stride[0] + wb * p.bv_stride[1] + t * p.bv_stride[2] + hv * p.bv_stride[3] +
                   (vt0 + vi) * p.bv_stride[4]] = vt;
      }
    }
    // 4. k^ and g factors, once per (token, head)
    if (record && t < p.Tmax && blockIdx.x == 0) {
      if (tid == 0)
        p.bank_g[slot * p.bg_stride[0] + wb * p.bg_stride[1] + t * p.bg_stride[2] + hv * p.bg_stride[3]] =
            p.g[n * HV + hv];
      if (hv % (HV / H) == 0) {
        float* bk = p.bank_k + slot * p.bk_stride[0] + wb * p.bk_stride[1] + t * p.bk_stride[2] +
                    h * p.bk_stride[3];
        for (int j = tid; j < K; j += blockDim.x) bk[j * p.bk_stride[4]] = ks[j];
      }
    }
  }
  if (p.write_final_state) {
    __syncthreads();
    for (int i = tid; i < rows * K; i += blockDim.x) {
      const int vi = i / K, j = i % K;
      st[(vt0 + vi) * p.st_stride[2] + j * p.st_stride[3]] = tile[i];
    }
  }
}

template <int KPL>
cudaError_t launch(const ChainVerifyParams& p, cudaStream_t stream) {
  const dim3 grid((p.V + kBV - 1) / kBV, p.HV, p.R);
  const size_t smem = sizeof(float) * (kBV * p.K + 2 * p.K + 4);
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(chain_verify_kernel<KPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  chain_verify_kernel<KPL><<<grid, kWarps * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t chain_verify(const ChainVerifyParams& p, cudaStream_t stream) {
  if (p.R == 0) return cudaSuccess;
  if (p.K <= 32) return launch<1>(p, stream);
  if (p.K <= 64) return launch<2>(p, stream);
  if (p.K <= 128) return launch<4>(p, stream);
  if (p.K <= 256) return launch<8>(p, stream);
  if (p.K <= 512) return launch<16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace vllm_specla
