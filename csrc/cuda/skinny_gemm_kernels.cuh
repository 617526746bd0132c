// The device code of csrc/cuda/skinny_gemm.cu (its comment has the design and the measurements): the
// weight loads, the MMA fragments and the kernel. Device-only (no torch headers), so
// csrc/cuda/nvrtc_check.py can compile it with NVRTC and ptxas on a machine without nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifdef __CUDACC_RTC__
using int64_t = long long;
using uint32_t = unsigned int;
#else
#include <cstdint>
#endif

namespace vllm_specla_skinny {

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// An L2 prefetch of [p, p + bytes) (bytes a multiple of 16, p 16-byte aligned; sm_90 bulk prefetch, no
// completion to wait for).
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// mma.sync m16n8k16 with fp32 accumulation for operand type TY ("bf16" / "f16"): c += A x B.
#define SG_MMA_SYNC(TY)                                                                                  \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " \
      "{%0, %1, %2, %3};"                                                                                \
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                   \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

template <typename T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    SG_MMA_SYNC("bf16");
  }
  static __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }
  // a 32-bit word of two elements (low half first) <-> two floats (round to nearest even)
  static __device__ __forceinline__ float2 unpack2(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  }
  static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    SG_MMA_SYNC("f16");
  }
  static __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ float2 unpack2(uint32_t u) { return __half22float2(*reinterpret_cast<__half2*>(&u)); }
  static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
#undef SG_MMA_SYNC

// The fused prologue / epilogue of skinny_gemm_kernel (PRO != 0, GATING): the row GEMV's (ops/triton_fused.py
// _gemv_x / _gemv_rows_kernel) on the skinny GEMM's operands, so that a batch-1 verify window's RMSNorm, SwiGLU,
// gated RMSNorm and GDN gating run inside its GEMMs, as the AR step's do inside the row GEMV, instead of as
// kernels of their own (4-5 launches per layer and step; benchmarks/RESULTS.md, session 24). The same math in
// the same order per element, float32, the activation rounded once to T before the MMA (as the unfused
// kernel -> GEMM path has it); the row statistics are summed in another order than the Triton kernels'.
struct SkinnyFuse {
  const float* nw;      // PRO 1: the RMSNorm weight [K]; PRO 3: the per-head norm weight [1 << hd_log2]
  const void* gate;     // PRO 3: the output gate [M, K] (T, row stride ldg), or nullptr (no gate)
  long long ldg;
  float eps;            // PRO 1 / 3: the norm's eps
  int hd_log2;          // PRO 3: log2 of the head dim, 7..10 (heads of 128..1024 columns; K = heads << hd_log2)
  int heads;            // PRO 3: heads per row
  int gate_sigmoid;     // PRO 3: act(gate) = sigmoid(gate) (1) or gate * sigmoid(gate) (0)
  float* gb;            // GATING: [M, 2 hv] float32: g of the a columns, then beta of the b columns
  int a0;               // GATING: the first of the 2 hv output columns a | b
  int hv;               // GATING: value heads
  const float* A_log;   // GATING: [hv]
  const float* dt_bias; // GATING: [hv]
  int neg;              // GATING: allow_neg_eigval (beta = 2 sigmoid(b))
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& u, float (&v)[8]) {
  const float2 a = Mma<T>::unpack2(u.x), b = Mma<T>::unpack2(u.y), c = Mma<T>::unpack2(u.z), d = Mma<T>::unpack2(u.w);
  v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y, v[4] = c.x, v[5] = c.y, v[6] = d.x, v[7] = d.y;
}

template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  return make_uint4(Mma<T>::pack2(v[0], v[1]), Mma<T>::pack2(v[2], v[3]), Mma<T>::pack2(v[4], v[5]),
                    Mma<T>::pack2(v[6], v[7]));
}

// (PRO 1 / 3) the row statistics into stat: PRO 1 stat[m] = 1 / RMS of row m (over K); PRO 3
// stat[m * heads + h] = 1 / RMS of head h of row m (over its 2^hd_log2 float32 columns, 128..1024). Rounds of
// 8 independent 16-byte loads per lane, all issued before the sums (x is in L2: one round trip per round, not
// one per load): PRO 1 one warp per row, 2048 columns per round; PRO 3 one warp per 1024 columns of a row (1..8
// whole heads), the heads' sums reduced across the warp.
template <typename T, int WARPS, int PRO>
__device__ __forceinline__ void row_stats(const void* x, int64_t ldx, int M, int K, const SkinnyFuse& f, float* stat,
                                          int warp, int lane) {
  if constexpr (PRO == 1) {
    for (int m = warp; m < M; m += WARPS) {
      const T* xr = static_cast<const T*>(x) + static_cast<int64_t>(m) * ldx;
      float ss = 0.f;
      for (int c0 = 0; c0 < K; c0 += 2048) {
        uint4 q[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int c = c0 + (j * 32 + lane) * 8;
          q[j] = c < K ? *reinterpret_cast<const uint4*>(xr + c) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float v[8];
          unpack8<T>(q[j], v);
#pragma unroll
          for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
        }
      }
      ss = warp_sum(ss);
      if (lane == 0) stat[m] = rsqrtf(ss / static_cast<float>(K) + f.eps);
    }
  } else if constexpr (PRO == 3) {
    const int rpr = (K + 1023) >> 10, G = 1024 >> f.hd_log2;  // rounds per row, heads per round
    const float inv_hd = 1.f / static_cast<float>(1 << f.hd_log2);
    for (int r = warp; r < M * rpr; r += WARPS) {
      const int m = r / rpr, c0 = (r - m * rpr) << 10;
      const float* xr = static_cast<const float*>(x) + static_cast<int64_t>(m) * ldx + c0;
      float part[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = (j * 32 + lane) * 4;
        const float4 a = c0 + c < K ? *reinterpret_cast<const float4*>(xr + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        part[j] = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      }
      for (int g = 0; g < G; ++g) {  // slice j (128 columns) lies in head j * G / 8 of the round
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += (j * G) >> 3 == g ? part[j] : 0.f;
        ss = warp_sum(ss);
        const int h = (c0 >> f.hd_log2) + g;
        if (lane == 0 && h < f.heads) stat[m * f.heads + h] = rsqrtf(ss * inv_hd + f.eps);
      }
    }
  }
}

__device__ __forceinline__ uint4 ld_if(bool p, const void* a) {
  return p ? *reinterpret_cast<const uint4*>(a) : make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ float4 ldf_if(bool p, const float* a) {
  return p ? *reinterpret_cast<const float4*>(a) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// Token row tok's activations at columns k .. k + 8 after the prologue, as the MMA's B words (zeros where !v: a
// chunk past K or a row past M): PRO 0 x as is; 1 x * rstd * nw; 2 silu(x[:, :K]) * x[:, K:] (x is [M, 2K]);
// 3 (x float32) per-head RMSNorm * nw * act(gate). Branch-free (every load predicated on v), so the compiler
// issues a load batch's activation loads together with its weight loads, as for PRO 0; zeros stay zeros
// through every prologue (silu(0) * 0 = 0; the statistics read as 0 where !v).
template <typename T, int PRO>
__device__ __forceinline__ uint4 load_x(bool v, const void* x, int64_t ldx, int tok, int k, int K,
                                        const SkinnyFuse& f, const float* stat) {
  const int64_t row = static_cast<int64_t>(tok) * ldx;
  if constexpr (PRO == 0) {
    return ld_if(v, static_cast<const T*>(x) + row + k);
  } else {
    float e[8];
    if constexpr (PRO == 1) {
      unpack8<T>(ld_if(v, static_cast<const T*>(x) + row + k), e);
      const float r = v ? stat[tok] : 0.f;
      const float4 n0 = ldf_if(v, f.nw + k), n1 = ldf_if(v, f.nw + k + 4);
      const float n[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = e[i] * r * n[i];
    } else if constexpr (PRO == 2) {
      float b[8];
      unpack8<T>(ld_if(v, static_cast<const T*>(x) + row + k), e);
      unpack8<T>(ld_if(v, static_cast<const T*>(x) + row + K + k), b);
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = e[i] * (1.f / (1.f + __expf(-e[i]))) * b[i];
    } else {
      const float* xr = static_cast<const float*>(x) + row + k;
      const float4 x0 = ldf_if(v, xr), x1 = ldf_if(v, xr + 4);
      const int kk = k & ((1 << f.hd_log2) - 1);
      const float r = v ? stat[tok * f.heads + (k >> f.hd_log2)] : 0.f;
      const float4 n0 = ldf_if(v, f.nw + kk), n1 = ldf_if(v, f.nw + kk + 4);
      const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const float n[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = xs[i] * r * n[i];
      if (f.gate != nullptr) {
        float gv[8];
        unpack8<T>(ld_if(v, static_cast<const T*>(f.gate) + static_cast<int64_t>(tok) * f.ldg + k), gv);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float sg = 1.f / (1.f + __expf(-gv[i]));
          e[i] = e[i] * (f.gate_sigmoid ? sg : gv[i] * sg);
        }
      }
    }
    return pack8<T>(e);
  }
}

#ifndef SG_STAGE_ROWS
#define SG_STAGE_ROWS 4  // rows whose activations one thread stages at once (8: spills beside the first weight batch)
#endif

// NT: 8-token tiles (M <= 8 NT); WARPS: warps per CTA (K split); U: chunks of 32 k per load batch; PRO: the
// prologue (0 none, 1 RMSNorm, 2 SwiGLU, 3 gated RMSNorm of float32 x); GATING: the GDN gating of the a | b
// output columns into fuse.gb. K is w's column count (x has 2K columns for PRO 2).
template <typename T, int NT, int WARPS, int U, bool RES, int PRO = 0, bool GATING = false>
__global__ void __launch_bounds__(WARPS * 32, PRO != 0 ? 2 : 0) skinny_gemm_kernel(const void* __restrict__ x, int64_t ldx,
                                                                 const T* __restrict__ w, const T* res,
                                                                 int64_t ldr, T* out, int64_t ldo, int M, int N,
                                                                 int K, const unsigned char* pf, long long pf_bytes,
                                                                 int pf_first, SkinnyFuse fuse) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const int nchunks = (K + 31) >> 5;
  const int per = (nchunks + WARPS - 1) / WARPS;
  const int cb = min(nchunks, warp * per), ce = min(nchunks, cb + per);
  const bool ok0 = n0 + g < N, ok1 = n0 + g + 8 < N;
  // rows past N are clamped (never dereferenced: their loads are predicated off)
  const T* w0 = w + static_cast<int64_t>(min(n0 + g, N - 1)) * K + t * 8;
  const T* w1 = w + static_cast<int64_t>(min(n0 + g + 8, N - 1)) * K + t * 8;

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  uint4 wa[U], wb[U];
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);

  auto load = [&](int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = c + u, k = ch * 32 + t * 8;
      const bool in = ch < ce && k < K;
      wa[u] = in && ok0 ? ld_stream(w0 + ch * 32) : z4;
      wb[u] = in && ok1 ? ld_stream(w1 + ch * 32) : z4;
    }
  };

  load(cb);  // constant weights: before the wait (ops/pdl.py)
  griddep_wait();
  // The fused prologue, once per CTA: the row statistics (x is L2-resident: a few to tens of KB), then the
  // activations of all M rows transformed and rounded into shared memory (xs: row stride K / 8 + 1 uint4, so
  // the 8 rows of a fragment load fall in distinct banks); the main loop then reads them as PRO 0 reads x.
  // Both passes issue their loads in batches while the first weight batch is in flight. (Transforming in the
  // main loop instead serialized it: the extra loads and registers per chunk kept the compiler from issuing
  // a batch's activation loads ahead; s24b measured the batch-1 SpecLA step 0.87 ms slower.)
  __shared__ float stat[PRO == 3 ? 1024 : (PRO == 1 ? 16 : 1)];
  extern __shared__ uint4 xs[];
  const int ks = (K >> 3) + 1;
  if constexpr (PRO != 0) {
    if constexpr (PRO == 1 || PRO == 3) {
      row_stats<T, WARPS, PRO>(x, ldx, M, K, fuse, stat, warp, lane);
      __syncthreads();
    }
    for (int c = threadIdx.x; c < (K >> 3); c += WARPS * 32) {
#pragma unroll
      for (int m0 = 0; m0 < NT * 8; m0 += SG_STAGE_ROWS) {  // rows in groups: their loads in flight together
        uint4 v[SG_STAGE_ROWS];
#pragma unroll
        for (int m = 0; m < SG_STAGE_ROWS; ++m) v[m] = load_x<T, PRO>(m0 + m < M, x, ldx, m0 + m, c * 8, K, fuse, stat);
#pragma unroll
        for (int m = 0; m < SG_STAGE_ROWS; ++m)
          if (m0 + m < M) xs[(m0 + m) * ks + c] = v[m];
      }
    }
    __syncthreads();
  }
  for (int c = cb; c < ce; c += U) {
    if (c != cb) load(c);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = c + u, k = ch * 32 + t * 8;
      const bool in = ch < ce && k < K;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int tok = nt * 8 + g;
        uint4 xv;
        if constexpr (PRO == 0) xv = load_x<T, 0>(in && tok < M, x, ldx, tok, k, K, fuse, stat);
        else xv = in && tok < M ? xs[tok * ks + ch * 4 + t] : z4;
        Mma<T>::run(acc[nt], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv.x, xv.y);
        Mma<T>::run(acc[nt], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv.z, xv.w);
      }
    }
  }
  griddep_launch_dependents();
  // The next GEMM's first weights into L2 (pf: its weight, pf_bytes a multiple of 16, split over the CTAs
  // from pf_first on, the last to run), so its stream starts from L2 while this kernel drains
  // (RESULTS.md session 16: ~3.6 us per GEMM of ramp and drain). Opt-in: pf = nullptr by default.
  if (pf != nullptr && threadIdx.x == 0 && static_cast<int>(blockIdx.x) >= pf_first) {
    const long long n = static_cast<long long>(gridDim.x) - pf_first, b = static_cast<long long>(blockIdx.x) - pf_first;
    const long long share = ((pf_bytes + n - 1) / n + 15) / 16 * 16, lo = b * share;
    const long long hi = lo + share < pf_bytes ? lo + share : pf_bytes;
    for (long long o = lo; o < hi; o += 1 << 20)  // pieces of at most 1 MiB
      prefetch_l2(pf + o, static_cast<unsigned>(hi - o < (1 << 20) ? hi - o : (1 << 20)));
  }

  // C fragment: acc[nt][0..1] = (row g, tokens 8nt + 2t + 0/1), acc[nt][2..3] = (row g + 8, same)
  __shared__ float red[WARPS][16][NT * 8 + 1];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    red[warp][g][nt * 8 + 2 * t] = acc[nt][0];
    red[warp][g][nt * 8 + 2 * t + 1] = acc[nt][1];
    red[warp][g + 8][nt * 8 + 2 * t] = acc[nt][2];
    red[warp][g + 8][nt * 8 + 2 * t + 1] = acc[nt][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * M; i += WARPS * 32) {
    const int r = i & 15, tok = i >> 4, n = n0 + r;
    if (n >= N) continue;
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < WARPS; ++q) s += red[q][r][tok];
    if constexpr (RES) s += Mma<T>::to_f(res[static_cast<int64_t>(tok) * ldr + n]);
    const T y = Mma<T>::from_f(s);
    out[static_cast<int64_t>(tok) * ldo + n] = y;
    if constexpr (GATING) {  // ops/triton_fused.py _gating_kernel's math on the rounded output
      const int ia = n - fuse.a0;
      if (ia >= 0 && ia < 2 * fuse.hv) {
        const float yv = Mma<T>::to_f(y);
        float o;
        if (ia < fuse.hv) {
          const float av = yv + fuse.dt_bias[ia];
          const float sp = av > 20.f ? av : logf(1.f + expf(fminf(av, 20.f)));
          o = -expf(fuse.A_log[ia]) * sp;
        } else {
          o = 1.f / (1.f + expf(-yv));
          if (fuse.neg) o *= 2.f;
        }
        fuse.gb[static_cast<int64_t>(tok) * 2 * fuse.hv + ia] = o;
      }
    }
  }
}

}  // namespace vllm_specla_skinny
