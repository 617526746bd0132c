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

template <int N>
struct IntC {  // a compile-time count passed to a generic lambda (no <type_traits> under NVRTC)
  static constexpr int value = N;
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// The pre-wait (first) load batch: coherent loads (ld.global.L1::no_allocate, no .nc). ptxas treats ld.global.nc
// (the read-only path: data constant for the kernel's lifetime) as free to move across griddepcontrol.wait (ACQBULK
// in SASS) and schedules the wait first, so with ld_stream the "first batch before the wait" was issued after it
// (the SASS of every build up to session 32: nvdisasm of a CUDA 12.9 build, cuobjdump of the H100's nvcc 13 build,
// benchmarks/sass_pdl_h100_s35.txt). A coherent load stays where the code puts it, so the weights stream while the
// previous kernel finishes: a batch-1 SpecLA step (K = 7) 2.152 -> 2.118 ms (flame) and 2.245 -> 2.192 ms (map) on
// an H100 (benchmarks/RESULTS.md "Session 35"; the .nc form, a deeper first batch for o_proj / down (16 / 20 chunks)
// and launch_dependents right after the wait were measured there and removed: commit 32bc525 keeps them).
__device__ __forceinline__ uint4 ld_first(const void* p) {
  uint4 r;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch_dependents() {  // (after the MMA loop)
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
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    SG_MMA_SYNC("f16");
  }
  static __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }
};
#undef SG_MMA_SYNC

// Both kernels' weight loads: chunks c .. c + U of KC k each (KC / 4 per lane t, one 16-byte load per row), rows
// g and g + 8 (w0 / w1, already offset by the lane's k), predicated off past the warp's range, K, or N.
// FIRST: the batch issued before griddepcontrol.wait (ld_first).
template <int U, int KC, bool FIRST = false, typename W>
__device__ __forceinline__ void load_chunks(uint4 (&wa)[U], uint4 (&wb)[U], const W* w0, const W* w1, int c, int ce,
                                            int K, int t, bool ok0, bool ok1) {
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int ch = c + u, k = ch * KC + t * (KC / 4);
    const bool in = ch < ce && k < K;
    if constexpr (FIRST) {
      wa[u] = in && ok0 ? ld_first(w0 + ch * KC) : z4;
      wb[u] = in && ok1 ? ld_first(w1 + ch * KC) : z4;
    } else {
      wa[u] = in && ok0 ? ld_stream(w0 + ch * KC) : z4;
      wb[u] = in && ok1 ? ld_stream(w1 + ch * KC) : z4;
    }
  }
}

// Both kernels' epilogue: the CTA's 16 weight rows x M tokens. The warps' C fragments (acc[nt][0..1] = (row g,
// tokens 8nt + 2t + 0/1), acc[nt][2..3] = (row g + 8, same)) are summed through shared memory in warp order
// (deterministic), then each output is scaled (SCALED: by ws[n] * 2^8, the float8 form's row scale and its
// activations' 2^-8), the residual added in fp32 (as cuBLAS addmm's beta = 1) and stored rounded, coalesced.
template <typename T, int NT, int WARPS, bool RES, bool SCALED>
__device__ __forceinline__ void reduce_store(const float (&acc)[NT][4], int warp, int g, int t, int n0, int M, int N,
                                             const float* ws, const T* res, int64_t ldr, T* out, int64_t ldo) {
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
    if constexpr (SCALED) s *= ws[n] * 256.f;
    if constexpr (RES) s += Mma<T>::to_f(res[static_cast<int64_t>(tok) * ldr + n]);
    out[static_cast<int64_t>(tok) * ldo + n] = Mma<T>::from_f(s);
  }
}

// x (the activations, written by the previous kernel) is not __restrict__: with it NVVM loaded x through the
// read-only path (ld.global.nc), which the PTX ISA allows only for data constant during the kernel's lifetime, and
// under PDL the previous kernel may still be writing it; ptxas moves such loads across griddepcontrol.wait (a
// build with coherent first-batch loads had 23 of its x loads before the wait in SASS). Without it they are coherent
// loads, which stay after the wait. (Until session 32 the shipped builds were safe by scheduling only: ptxas put
// the wait before every load.)
// NT: 8-token tiles (M <= 8 NT); WARPS: warps per CTA (K split); U: chunks of 32 k per load batch. SPLIT (NT = 1):
// the odd chunks accumulate into a second C fragment, added to the first after the loop, so the MMAs form two
// dependency chains of U instead of one of 2U (session 30's Nsight Compute: 14 % of the warps' stall samples at 8
// rows were fixed-latency waits; s30e: the step's GEMM chain 2.7-4.5 % faster; skinny_gemm.cu's automatic config).
template <typename T, int NT, int WARPS, int U, bool RES, bool SPLIT = false>
__global__ void __launch_bounds__(WARPS * 32) skinny_gemm_kernel(const T* x, int64_t ldx,
                                                                 const T* __restrict__ w, const T* res,
                                                                 int64_t ldr, T* out, int64_t ldo, int M, int N,
                                                                 int K, const unsigned char* pf, long long pf_bytes,
                                                                 int pf_first) {
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

  static_assert(!SPLIT || NT == 1, "SPLIT: one 8-token tile");
  float acc[NT][4], acc_odd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  uint4 wa[U], wb[U];
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);

  auto load = [&](int c) { load_chunks<U, 32>(wa, wb, w0, w1, c, ce, K, t, ok0, ok1); };

  // the MMAs of UU loaded chunks from chunk c on (rows g / g + 8 in wa_ / wb_)
  auto mma = [&](const auto& wa_, const auto& wb_, int c, auto uu) {
    constexpr int UU = decltype(uu)::value;
#pragma unroll
    for (int u = 0; u < UU; ++u) {
      const int ch = c + u, k = ch * 32 + t * 8;
      const bool in = ch < ce && k < K;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int tok = nt * 8 + g;
        const uint4 xv =
            in && tok < M ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(tok) * ldx + k) : z4;
        float(&a)[4] = SPLIT && (u & 1) ? acc_odd : acc[nt];
        Mma<T>::run(a, wa_[u].x, wb_[u].x, wa_[u].y, wb_[u].y, xv.x, xv.y);
        Mma<T>::run(a, wa_[u].z, wb_[u].z, wa_[u].w, wb_[u].w, xv.z, xv.w);
      }
    }
  };

  load_chunks<U, 32, true>(wa, wb, w0, w1, cb, ce, K, t, ok0, ok1);  // constant weights: before the wait (ops/pdl.py)
  griddep_wait();
  for (int c = cb; c < ce; c += U) {
    if (c != cb) load(c);
    mma(wa, wb, c, IntC<U>{});
  }
  if constexpr (SPLIT) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[0][i] += acc_odd[i];
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

  reduce_store<T, NT, WARPS, RES, false>(acc, warp, g, t, n0, M, N, nullptr, res, ldr, out, ldo);
}

// ---- float8 weights (W8A16): e4m3 weight rows with one float32 scale each, bf16 activations ----
// The drafter's absorb pass over a verify window (K + 1 <= 8 rows) with FusedEagle(draft_weights="fp8")
// (runtime/fused_model.py FP8_MAX_TOKENS): the same "swap AB" layout as skinny_gemm_kernel, with a 64-wide
// k chunk per 16-byte weight load (16 e4m3 per thread and row). The weights widen exactly to f16
// (cvt.rn.f16x2.e4m3x2: every e4m3 value is an f16 normal); the activations go bf16 -> f32 -> f16 times
// 2^-8 (exact for |x| in [2^-6, 2^23]; smaller values lose low bits as f16 subnormals, none overflows), so
// the MMAs run f16 x f16 with fp32 accumulation and the epilogue multiplies each row's sum by its scale
// times 2^8 (fused.Fp8Weight.ref_linear's math up to those roundings and the summation order).

// e4m3x2 (low byte first) -> f16x2 (low half first), exact
__device__ __forceinline__ uint32_t e4m3x2_f16x2(unsigned short v) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
}

// bf16x2 -> f16x2 of the values times 2^-8
__device__ __forceinline__ uint32_t bf16x2_f16x2_scaled(uint32_t v) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));  // .x: the low half
  const __half2 h = __floats2half2_rn(f.x * 0.00390625f, f.y * 0.00390625f);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16 e4m3 (one uint4, k order) -> 8 f16x2: r[i] = (k + 2i, k + 2i + 1)
__device__ __forceinline__ void e4m3x16_f16(const uint4& v, uint32_t (&r)[8]) {
  r[0] = e4m3x2_f16x2(static_cast<unsigned short>(v.x & 0xffffu));
  r[1] = e4m3x2_f16x2(static_cast<unsigned short>(v.x >> 16));
  r[2] = e4m3x2_f16x2(static_cast<unsigned short>(v.y & 0xffffu));
  r[3] = e4m3x2_f16x2(static_cast<unsigned short>(v.y >> 16));
  r[4] = e4m3x2_f16x2(static_cast<unsigned short>(v.z & 0xffffu));
  r[5] = e4m3x2_f16x2(static_cast<unsigned short>(v.z >> 16));
  r[6] = e4m3x2_f16x2(static_cast<unsigned short>(v.w & 0xffffu));
  r[7] = e4m3x2_f16x2(static_cast<unsigned short>(v.w >> 16));
}

// NT: 8-token tiles (M <= 8 NT); WARPS: warps per CTA (K split); U: chunks of 64 k per load batch. K % 16 == 0.
// Lane (g, t) loads W[n0 + g][k0 + 16t .. +16] and W[n0 + g + 8][...] per chunk; MMA j (0..3) of a chunk takes
// A = {Wg[2j], Wg8[2j], Wg[2j+1], Wg8[2j+1]} and B = {X[2j], X[2j+1]} (X: the token row's f16x2 at the same 16 k),
// so logical k slots 2t+e / 2t+8+e are physical k0 + 16t + 4j + e / + 2 + e for A and B alike.
template <int NT, int WARPS, int U, bool RES>
__global__ void __launch_bounds__(WARPS * 32)
    skinny_gemm_fp8_kernel(const __nv_bfloat16* x, int64_t ldx, const unsigned char* __restrict__ w,
                           const float* __restrict__ ws, const __nv_bfloat16* res, int64_t ldr, __nv_bfloat16* out,
                           int64_t ldo, int M, int N, int K) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const int nchunks = (K + 63) >> 6;
  const int per = (nchunks + WARPS - 1) / WARPS;
  const int cb = min(nchunks, warp * per), ce = min(nchunks, cb + per);
  const bool ok0 = n0 + g < N, ok1 = n0 + g + 8 < N;
  const unsigned char* w0 = w + static_cast<int64_t>(min(n0 + g, N - 1)) * K + t * 16;
  const unsigned char* w1 = w + static_cast<int64_t>(min(n0 + g + 8, N - 1)) * K + t * 16;

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  uint4 wa[U], wb[U];
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);

  auto load = [&](int c) { load_chunks<U, 64>(wa, wb, w0, w1, c, ce, K, t, ok0, ok1); };

  load_chunks<U, 64, true>(wa, wb, w0, w1, cb, ce, K, t, ok0, ok1);  // constant weights: before the wait (ops/pdl.py)
  griddep_wait();
  for (int c = cb; c < ce; c += U) {
    if (c != cb) load(c);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = c + u, k = ch * 64 + t * 16;
      const bool in = ch < ce && k < K;
      uint32_t A0[8], A1[8];
      e4m3x16_f16(wa[u], A0);
      e4m3x16_f16(wb[u], A1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int tok = nt * 8 + g;
        const bool xin = in && tok < M;
        const __nv_bfloat16* xp = x + static_cast<int64_t>(tok) * ldx + k;
        const uint4 xa = xin ? *reinterpret_cast<const uint4*>(xp) : z4;
        const uint4 xb = xin ? *reinterpret_cast<const uint4*>(xp + 8) : z4;
        const uint32_t X[8] = {bf16x2_f16x2_scaled(xa.x), bf16x2_f16x2_scaled(xa.y), bf16x2_f16x2_scaled(xa.z),
                               bf16x2_f16x2_scaled(xa.w), bf16x2_f16x2_scaled(xb.x), bf16x2_f16x2_scaled(xb.y),
                               bf16x2_f16x2_scaled(xb.z), bf16x2_f16x2_scaled(xb.w)};
#pragma unroll
        for (int j = 0; j < 4; ++j)
          Mma<__half>::run(acc[nt], A0[2 * j], A1[2 * j], A0[2 * j + 1], A1[2 * j + 1], X[2 * j], X[2 * j + 1]);
      }
    }
  }
  griddep_launch_dependents();

  reduce_store<__nv_bfloat16, NT, WARPS, RES, true>(acc, warp, g, t, n0, M, N, ws, res, ldr, out, ldo);
}

}  // namespace vllm_specla_skinny
