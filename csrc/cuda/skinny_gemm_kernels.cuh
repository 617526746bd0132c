// The device code of csrc/cuda/skinny_gemm.cu (its comment has the design): the weight loads, the MMA
// fragments, the tile epilogue and the two kernel forms. Device-only (no torch headers), so
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


// L2PF: with the L2::256B prefetch hint (the L2 fetches the load's whole 256-byte block from DRAM: a
// warp's load covers 8 rows x 64 contiguous bytes, the next chunk's load the next 64)
template <bool L2PF>
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  if constexpr (L2PF)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  else
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

template <typename T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }
};

// One 32-wide k chunk: the two MMAs of the chunk (A = the weight rows g / g + 8 in a / b, B = token
// rows g, 8 + g of x at k .. k + 7) for every 8-token tile. in: the chunk lies inside the warp's range
// and K (x is not read otherwise; a / b are zeros there).
template <typename T, int NT>
__device__ __forceinline__ void mma_chunk(float (&acc)[NT][4], const uint4& a, const uint4& b, const T* x,
                                          int64_t ldx, int M, int k, bool in, int g) {
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
    const uint4 xv = in && tok < M ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(tok) * ldx + k) : z4;
    Mma<T>::run(acc[nt], a.x, b.x, a.y, b.y, xv.x, xv.y);
    Mma<T>::run(acc[nt], a.z, b.z, a.w, b.w, xv.z, xv.w);
  }
}

// The tile's epilogue: the warps' C fragments (acc[nt][0..1] = row g, tokens 8 nt + 2t + 0 / 1;
// acc[nt][2..3] = row g + 8, the same tokens) through shared memory, summed in warp order
// (deterministic), the residual added in fp32, one rounding, written coalesced. One __syncthreads
// (between the fragment writes and the sums): a caller reusing red must sync again first or alternate
// two buffers.
template <typename T, int NT, int WARPS, bool RES>
__device__ __forceinline__ void store_tile(float (&red)[WARPS][16][NT * 8 + 1], const float (&acc)[NT][4], int warp,
                                           int g, int t, int n0, const T* res, int64_t ldr, T* out, int64_t ldo, int M,
                                           int N) {
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
    out[static_cast<int64_t>(tok) * ldo + n] = Mma<T>::from_f(s);
  }
}

// The tile form (form 0 / 1): one CTA per 16 output rows. NT: 8-token tiles (M <= 8 NT); WARPS: warps
// per CTA, each with a contiguous range of per = ceil(ceil(K / 32) / WARPS) chunks; U: chunks of 32 k
// per load batch; L2PF: the L2 prefetch hint on the weight loads.
template <typename T, int NT, int WARPS, int U, bool RES, bool L2PF>
__global__ void __launch_bounds__(WARPS * 32) skinny_gemm_kernel(const T* __restrict__ x, int64_t ldx,
                                                                 const T* __restrict__ w, const T* res,
                                                                 int64_t ldr, T* out, int64_t ldo, int M, int N,
                                                                 int K, int per) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const int nchunks = (K + 31) >> 5;
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
      wa[u] = in && ok0 ? ld_stream<L2PF>(w0 + ch * 32) : z4;
      wb[u] = in && ok1 ? ld_stream<L2PF>(w1 + ch * 32) : z4;
    }
  };

  load(cb);  // constant weights: before the wait (ops/pdl.py)
  griddep_wait();
  for (int c = cb; c < ce; c += U) {
    if (c != cb) load(c);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = c + u, k = ch * 32 + t * 8;
      mma_chunk<T, NT>(acc, wa[u], wb[u], x, ldx, M, k, ch < ce && k < K, g);
    }
  }
  griddep_launch_dependents();
  __shared__ float red[WARPS][16][NT * 8 + 1];
  store_tile<T, NT, WARPS, RES>(red, acc, warp, g, t, n0, res, ldr, out, ldo, M, N);
}

// The persistent ring form (form 2 / 3; M <= 8): a grid of at most (resident CTAs per SM) x SMs CTAs,
// CTA b taking the 16-row tiles b, b + gridDim.x, ...; a warp's U register slots are a ring over its
// stream of chunks across those tiles: slot u is reloaded with the chunk U ahead (the next tile's, at
// a tile's last batch) as soon as its MMAs have read it. So the next tile's weights stream during this
// tile's last MMAs and its epilogue, where the tile form drains each CTA's loads before its successor
// CTA starts (s15: flame's in-projection is 577 tiles over ~2.2 waves of CTAs). per (host): the warp's
// chunks per tile, ceil(ceil(K / 32) / WARPS) rounded up to a multiple of U, so a batch never
// straddles two tiles. The epilogue alternates two shared buffers (one __syncthreads per tile).
template <typename T, int WARPS, int U, bool RES, bool L2PF>
__global__ void __launch_bounds__(WARPS * 32) skinny_gemm_ring_kernel(const T* __restrict__ x, int64_t ldx,
                                                                      const T* __restrict__ w, const T* res,
                                                                      int64_t ldr, T* out, int64_t ldo, int M,
                                                                      int N, int K, int per) {
  constexpr int NT = 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ntiles = (N + 15) >> 4, nchunks = (K + 31) >> 5;
  const int cb = warp * per, ce = min(nchunks, cb + per);  // cb >= nchunks: an idle warp (loads off)
  float acc[NT][4] = {};
  uint4 wa[U], wb[U];
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
  __shared__ float red[2][WARPS][16][NT * 8 + 1];

  int ct = blockIdx.x, cc = cb;  // the batch in the slots: tile ct, chunks cc .. cc + U - 1
  {
    const int r0 = ct * 16 + g;
    const T* w0 = w + static_cast<int64_t>(min(r0, N - 1)) * K + t * 8;
    const T* w1 = w + static_cast<int64_t>(min(r0 + 8, N - 1)) * K + t * 8;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = cc + u;
      const bool in = ch < ce && ch * 32 + t * 8 < K;
      wa[u] = in && r0 < N ? ld_stream<L2PF>(w0 + ch * 32) : z4;
      wb[u] = in && r0 + 8 < N ? ld_stream<L2PF>(w1 + ch * 32) : z4;
    }
  }
  griddep_wait();  // constant weights were loaded before it (ops/pdl.py)
  for (int it = 0;;) {
    int nc = cc + U, nt = ct;  // the next batch
    const bool wrap = nc >= cb + per;
    if (wrap) {
      nc = cb;
      nt = ct + gridDim.x;
    }
    const bool more = nt < ntiles;
    const int r0 = (more ? nt : ct) * 16 + g;  // (no int overflow past the last tile)
    const bool ok0 = more && r0 < N, ok1 = more && r0 + 8 < N;
    const T* w0 = w + static_cast<int64_t>(min(r0, N - 1)) * K + t * 8;
    const T* w1 = w + static_cast<int64_t>(min(r0 + 8, N - 1)) * K + t * 8;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = cc + u, k = ch * 32 + t * 8;
      mma_chunk<T, NT>(acc, wa[u], wb[u], x, ldx, M, k, ch < ce && k < K, g);
      const int chn = nc + u;
      const bool inn = chn < ce && chn * 32 + t * 8 < K;
      wa[u] = inn && ok0 ? ld_stream<L2PF>(w0 + chn * 32) : z4;
      wb[u] = inn && ok1 ? ld_stream<L2PF>(w1 + chn * 32) : z4;
    }
    if (!more) griddep_launch_dependents();  // (!more implies wrap: the CTA's last tile)
    if (wrap) {
      store_tile<T, NT, WARPS, RES>(red[it & 1], acc, warp, g, t, ct * 16, res, ldr, out, ldo, M, N);
      acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.f;
      ++it;
    }
    if (!more) break;
    ct = nt;
    cc = nc;
  }
}


// Bulk-copy (TMA, sm_90) helpers for the bulk form, as chain_verify_ut.cu's: an mbarrier per stage,
// armed with the stage's byte count, completed by its cp.async.bulk row copies.
__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();  // (the op refuses GPUs below sm_90 for the bulk forms)
#endif
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "SG_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra SG_DONE;\n"
      "bra SG_WAIT;\n"
      "SG_DONE:\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
#endif
}

// The bulk form (forms 4 / 5; M <= 8, sm_90): persistent CTAs (one / two per SM: S stages fill ~200 /
// ~100 KB of shared memory) take the 16-row tiles b, b + gridDim.x, ...; a tile is cut into K slices of ks k
// (host: a multiple of 32), and each (tile, slice) unit is one stage: 16 row copies of ks * 2 bytes
// (cp.async.bulk, issued by thread 0) completing on the stage's mbarrier. S - 1 stages stay in flight
// while one computes, with no registers held for them (the tile form's loads sit in registers: 2 CTAs
// of 64 KB per SM, drained once per wave). Stage rows are padded by 64 bytes (stride 2 ks + 64): a
// quarter-warp's 16-byte reads (rows g, g + 1 at the lanes' 4 offsets) then fall in distinct banks.
// The WARPS warps split a stage's chunks; after a stage all threads sync, then thread 0 refills it
// with the unit S ahead. The epilogue alternates two shared buffers, as the ring form's.
template <typename T, int WARPS, int S, bool RES>
__global__ void __launch_bounds__(WARPS * 32) skinny_gemm_bulk_kernel(const T* __restrict__ x, int64_t ldx,
                                                                         const T* __restrict__ w, const T* res,
                                                                         int64_t ldr, T* out, int64_t ldo, int M,
                                                                         int N, int K, int ks) {
  constexpr int NT = 1;
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ unsigned long long bar[S];
  __shared__ float red[2][WARPS][16][NT * 8 + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ntiles = (N + 15) >> 4, spt = (K + ks - 1) / ks;  // slices per tile
  const int mine = (ntiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / gridDim.x;
  const int total = mine * spt;
  const int rs = 2 * ks + 64;  // stage row stride, bytes
  const int cps = ks >> 5, cpw = (cps + WARPS - 1) / WARPS;  // chunks per stage / per warp

  auto issue = [&](int u, int b) {  // thread 0: unit u into stage b
    const int n0 = (static_cast<int>(blockIdx.x) + (u / spt) * static_cast<int>(gridDim.x)) * 16;
    const int k0 = (u % spt) * ks, len = min(ks, K - k0), rows = min(16, N - n0);
    unsigned char* st = stages + static_cast<size_t>(b) * 16 * rs;
    mbar_expect_tx(&bar[b], static_cast<unsigned>(rows * len * 2));
    for (int r = 0; r < rows; ++r)
      bulk_g2s(st + r * rs, w + static_cast<int64_t>(n0 + r) * K + k0, static_cast<unsigned>(len * 2), &bar[b]);
  };
  if (threadIdx.x == 0) {
    for (int b = 0; b < S; ++b) mbar_init(&bar[b]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int b = 0; b < S && b < total; ++b) issue(b, b);  // constant weights: before the wait (ops/pdl.py)
  }
  griddep_wait();
  float acc[NT][4] = {};
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
  for (int u = 0, it = 0; u < total; ++u) {
    const int b = u % S, slice = u % spt;
    mbar_wait(&bar[b], static_cast<unsigned>((u / S) & 1));
    const unsigned char* st = stages + static_cast<size_t>(b) * 16 * rs;
    for (int c = 0; c < cpw; ++c) {
      const int cw = warp * cpw + c, kk = cw * 32 + t * 8, k = slice * ks + kk;
      const bool in = cw < cps && k < K;  // (rows past N hold stale data: their outputs are not written)
      const uint4 a = in ? *reinterpret_cast<const uint4*>(st + g * rs + kk * 2) : z4;
      const uint4 bb = in ? *reinterpret_cast<const uint4*>(st + (g + 8) * rs + kk * 2) : z4;
      mma_chunk<T, NT>(acc, a, bb, x, ldx, M, k, in, g);
    }
    __syncthreads();  // stage b read by every warp
    if (threadIdx.x == 0 && u + S < total) issue(u + S, b);
    if (slice == spt - 1) {
      if (u == total - 1) griddep_launch_dependents();
      const int n0 = (static_cast<int>(blockIdx.x) + (u / spt) * static_cast<int>(gridDim.x)) * 16;
      store_tile<T, NT, WARPS, RES>(red[it & 1], acc, warp, g, t, n0, res, ldr, out, ldo, M, N);
      acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.f;
      ++it;
    }
  }
}

}  // namespace vllm_specla_skinny
