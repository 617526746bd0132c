// CUDA chain verify in the UT (window) form, exact fp32 FMA: the whole verify window is one chunk
// (ALGORITHMS.md §4 with a chain mask, §6 deferred commit), so the state tile takes 2T independent
// products instead of T dependent mat-vec / update rounds. Semantics: chain_verify_ref
// (vllm_specla/ops/reference.py); launched by chain_verify() (chain_verify.cu) for
// ChainVerifyParams::layout == kLayoutUT, or automatically where chain_verify_ut_auto() says so.
//
// Why. The serial kernels (v3, row group, Triton's triton_chain) walk the window token by token:
// per token M = e^g M, u = M k^, v~ = beta (v - u), M += v~ k^^T, o = M q^; the two reductions of
// every token sit on one dependent chain (load -> partial sums -> shuffles -> v~ -> update), which
// bounds them by latency, not by the two state passes a SpecLA step must make (RESULTS.md, "What
// bounds the misses": ~40 us per window token at B = 128). In the UT form, with S' the state after
// the pending fold (the committed state, M in [V, K] form, one value row per recurrence):
//
//   U_t = S' k^_t,  Q_t = S' q^_t                                   (2T products, independent)
//   v~_t = beta_t (v_t - e^{Γ_t} U_t - sum_{u<t} D_tu (k^_t . k^_u) v~_u)   (forward substitution)
//   o_t  = e^{Γ_t} Q_t + sum_{u<=t} D_tu (q^_t . k^_u) v~_u
//   Γ_t = sum_{s<=t} g_s,  D_tu = exp(sum_{u<s<=t} g_s)  (summed directly, never as differences)
//
// (the algebra of reference.chunk_gated_delta_rule_ref and of triton_chain_ut, whose products
// are tf32x3 tensor-core dots; here they are plain fp32 FMA on register tiles, as exact as the
// serial kernels). The pending fold is the closed form of DeltaConstruct (recover_ref):
// S' = e^{sum g~} M + sum_j exp(sum_{i>j} g~_i) v~_j k^_j^T, one FMA per element and factor.
// Per element and step: 1 + P + 2T FMA with no dependence between tokens, against ~4T + 2P on
// the serial chain; the Gram and coefficient work is per (row, head), on [T, T] matrices.
//
// Layout. Grid (S, HV, R): CTA (c, hv, r) of NW warps (4 unless forced) does the per-(row, head)
// work (staging, Gram, coefficients, phases 1-2) once and then loops over its chunk of the value
// tiles (BV = RPW NW rows each; S chunks per (row, head) from a wave cost model, plan_ut; one tile
// per CTA at small batch, where the tile's loads are issued before the staging). Per tile: the
// warp's state rows come from its stage (refilled for the next tile while this one computes: TMA
// bulk row copies on sm_90, per-thread cp.async otherwise) and its v / pending v~ columns from
// registers loaded one tile ahead, then phases 3-6 run warp-locally (the warp's RPW rows;
// __syncwarp only). In a warp, lane = (row group rg = lane / LPR, sub-lane s = lane % LPR): row
// group rg owns RPL = 2 value rows, its LPR lanes split the K keys into 4-key pieces (piece i of
// sub-lane s at keys (LPR i + s) * 4 .. + 3: a row's lanes read 16 LPR contiguous bytes per piece),
// so per lane the tile is 2 x K / LPR floats and each reduction is in-thread plus log2 LPR
// xor-shuffle levels. Build variant 2 (VAR): LPR = 8, RPW = 8 rows per warp, 64 tile registers at
// K = 256, 12 warps per SM; variant 3: LPR = 16, RPW = 4, 32 tile registers, 16 warps per SM (the
// automatic choice takes 3 where the cost model gives it >= 3 % less time: at the measured batches
// 32 / 64 / 128 (and 256 end to end) for the 8x256x256 heads of GDN-1.3B, not for 6x256x512; other
// batches follow the model; RESULTS.md session 6). Phases:
//   1. every thread stages the window's raw q / k rows (widened to fp32), the pending k^ rows, and
//      the tile's v / pending v~ columns into shared memory (16-byte loads), with g, beta and the
//      pending g, every load of a round issued before its stores (a load -> store loop waits one
//      memory round trip per iteration: the first version of this kernel, 2-6x slower than the
//      serial kernels, RESULTS.md session 5); then the state tile loads are issued (registers),
//      in flight during phase 2;
//   2. Gram: warp w takes window tokens t = w, w + NW, ...: k_t . k_u, q_t . k_u (u <= t) over
//      32 lanes, one reduce-scatter of the 2 TM sums (2 TM - 1 shuffles, none behind a runtime
//      branch), |q_t|^2 (5 xor levels); then thread t forms rk_t, rq_t (fla's l2norm,
//      x * rsqrt(sum x^2 + 1e-6), q scaled), the coefficient rows A_t, W_t, e^{Γ_t}, and
//      thread j < P the pending coefficients;
//   3. fold the pending factors into the tile; write it (the committed state) unless
//      write_final_state (then it is written once, after the window);
//   4. per window token: U_t, Q_t (in-thread sums, then log2 LPR xor levels: an all-reduce for
//      LPR = 8, a reduce-scatter for LPR = 16) to shared memory; in the P5 = 2 form every token's
//      sums first, then one reduce-scatter of all of them (same pairs, same order);
//   5. lane l < RPW runs the [T, T] forward substitution for row l of the warp (v~ to shared
//      memory; the default P5 form: every lane of a row, v~ in registers, see P5 below), then lane
//      l forms o_t for row l % RPW and tokens t = l / RPW + (32 / RPW) i and
//      stores o_t and v~_t;
//   6. write_final_state (AR / commit windows): M_T = e^{Γ_{T-1}} S' + sum_u D_{T-1,u} v~_u k^_u^T;
//   7. factors: bank_v for the tile's rows, bank_g by chunk 0, bank_k (k^ = rk k) by chunk 0 of the
//      first value head of each GVA group (after phase 2): one writer per element.
// Requirements checked by the launcher (else cudaErrorNotSupported, and chain_verify() runs the
// serial kernels): the 16-byte path (p.vec_ok), K = 128 or 256, windows bounded by <= 16 tokens
// (the factor bank's Tmax when factors are recorded, else the N tokens of the launch: AR at
// batch <= 16), pending factors <= 16 (Tmax). Caller contracts, not checked here (that would need
// a host sync): a recorded window fits the bank (chain_verify_ref raises ValueError; so does the
// Python wrapper vllm_specla.ops._cpp.chain_verify outside CUDA-graph capture; a longer window
// here is cut at Tmax tokens and its later outputs are undefined), and read_bank[r] !=
// write_bank[r] for rows with pending factors (the runtime's double-buffered banks: chunk 0 writes
// k^ / g while other CTAs of the row still read the pending bank; the serial CUDA and Triton
// kernels have the same requirement).
// Results differ from chain_verify_ref by summation order and the fast exp / rsqrt intrinsics.

#include "chain_verify.cuh"

#include <cuda_bf16.h>

#ifndef __CUDACC_RTC__
#include <algorithm>
#include <type_traits>
#include <cstdlib>
#endif

namespace vllm_specla {
namespace cuda {
namespace {

constexpr float kEpsUT = 1e-6f;  // fla l2norm eps
constexpr unsigned kFullUT = 0xffffffffu;
// value rows per warp for LPR lanes per value row and RPL value rows per lane (the kernel's build
// variant fixes both: ut_lpr, ut_rpl)
template <int LPR, int RPL>
__host__ __device__ constexpr int rows_per_warp() { return (32 / LPR) * RPL; }

__device__ __forceinline__ int64_t min64(const int64_t a, const int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float dot4(const float4 a, const float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

__device__ __forceinline__ void axpy4(float4& y, const float a, const float4 x) {
  y.x = fmaf(a, x.x, y.x);
  y.y = fmaf(a, x.y, y.y);
  y.z = fmaf(a, x.z, y.z);
  y.w = fmaf(a, x.w, y.w);
}

__device__ __forceinline__ void scale4(float4& y, const float a) {
  y.x *= a;
  y.y *= a;
  y.z *= a;
  y.w *= a;
}

// cp.async (16 bytes, global -> shared, L2 only): the next value tile's state rows are copied into
// a per-warp stage while the current tile computes; each lane copies, and later reads, only its
// own pieces, so cp.async.wait_group alone orders them (no barrier).
__device__ __forceinline__ void ut_cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void ut_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void ut_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Tensor-memory-accelerator bulk copies (sm_90): a warp's RPW state rows of the next value tile are
// copied into its stage by RPW cp.async.bulk row copies, completing on the warp's mbarrier. The
// per-thread cp.async form (LDGSTS) requested 2 L2 sectors per 16-byte chunk in Nsight Compute (32
// per warp instruction against 16 ideal; RESULTS.md session 6).
__device__ __forceinline__ unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void ut_mbar_init(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void ut_mbar_expect_tx(unsigned long long* bar, const unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void ut_bulk_g2s(void* dst, const void* src, const unsigned bytes, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#endif
}
__device__ __forceinline__ void ut_mbar_wait(unsigned long long* bar, const unsigned phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "UT_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra UT_DONE;\n"
      "bra UT_WAIT;\n"
      "UT_DONE:\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(phase)
      : "memory");
#endif
}

// Staging rounds: 16-byte chunks per thread and round of the window's q / k rows and of the
// pending k^ rows (kStageQK / kStageKP must divide evenly; the usual windows take one round).
constexpr int kStageQK = 8, kStageKP = 4;

// 16 bytes of TIn (kElems elements, loaded as a uint4) widened to fp32 at dst (shared memory).
template <typename TIn>
struct Stage16;
template <>
struct Stage16<float> {
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void put(float* dst, const uint4 u) { *reinterpret_cast<uint4*>(dst) = u; }
};
template <>
struct Stage16<__nv_bfloat16> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void put(float* dst, const uint4 u) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
    *reinterpret_cast<float4*>(dst) = make_float4(f[0], f[1], f[2], f[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(f[4], f[5], f[6], f[7]);
  }
};

// One level of reduce_scatter per instantiation (offset OFF, N live values), so that every loop
// bound is a constant where it is unrolled: session 6's single loop with a loop-carried live count
// left 16- and 32-value forms in local memory (128-byte stack frames: the TM = 16 builds' Gram and
// the batched products below; ptxas -v). Same operations in the same order.
template <int OFF, int LO, int N, int NV>
__device__ __forceinline__ void reduce_scatter_level(float (&d)[NV], const int lane, int& idx) {
  if constexpr (OFF >= LO) {
    if constexpr (N > 1) {
      constexpr int half = N / 2;
      const bool upper = (lane & OFF) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float send = upper ? d[i] : d[i + half];
        const float keep = upper ? d[i + half] : d[i];
        d[i] = keep + __shfl_xor_sync(kFullUT, send, OFF);
      }
      if (upper) idx += half;
      reduce_scatter_level<OFF / 2, LO, half>(d, lane, idx);
    } else {
      d[0] += __shfl_xor_sync(kFullUT, d[0], OFF);
      reduce_scatter_level<OFF / 2, LO, 1>(d, lane, idx);
    }
  }
}

// Reduce-scatter of NV partial sums (NV a power of two) over the lanes that differ in the xor
// offsets HI, HI / 2, .., LO (powers of two; 16 .. 1 = the whole warp): at each level while more
// than one value is live, a lane keeps one half and adds its partner's copy of it; the remaining
// levels are all-reduce steps. Afterwards d[0 .. n) hold the group sums of d[idx .. idx + n), n =
// max(1, NV / 2^levels) (idx returned; from the lane's bits HI, HI / 2, ..: the upper half at each
// halving level); NV - n shuffles for the halving levels plus one per all-reduce level, none
// behind a branch. Each sum is the same xor-butterfly tree as an all-reduce over the same offsets,
// so the results equal it bit for bit.
template <int NV, int HI = 16, int LO = 1>
__device__ __forceinline__ int reduce_scatter(float (&d)[NV], const int lane) {
  static_assert(NV >= 1 && NV <= 32 && (NV & (NV - 1)) == 0, "NV must be a power of two <= 32");
  static_assert(HI >= LO && LO >= 1 && HI <= 16, "xor offsets HI .. LO within the warp");
  int idx = 0;
  reduce_scatter_level<HI, LO, NV>(d, lane, idx);
  return idx;
}

// A v element kept raw in a register until it is stored to shared memory (bf16: its 16 bits).
template <typename TIn>
struct RawV;
template <>
struct RawV<float> {
  using type = float;
  __device__ __forceinline__ static float load(const float* x) { return *x; }
  __device__ __forceinline__ static float widen(const float x) { return x; }
};
template <>
struct RawV<__nv_bfloat16> {
  using type = unsigned short;
  __device__ __forceinline__ static unsigned short load(const __nv_bfloat16* x) {
    return *reinterpret_cast<const unsigned short*>(x);
  }
  __device__ __forceinline__ static float widen(const unsigned short x) { return __uint_as_float(unsigned(x) << 16); }
};


// Shared memory of one CTA: [TM]-sized scalars and [TM, TM] coefficient matrices, per-warp areas
// for the tile's v / pending v~ columns and the products (static), the staged q / k / pending k^
// rows (dynamic, sized by the host's bounds tb / pb on window and pending lengths).
template <int TM, int RPW>
struct UTWarp {  // one warp's RPW rows of the current value tile
  float v[TM][RPW], vp[TM][RPW];  // v_t, pending v~_j
  float U[TM][RPW], Q[TM][RPW];   // S' k_t, S' q_t (raw k / q)
  float vt[TM][RPW];              // v~_t
};
template <int TM, int NW, int RPW>
struct UTShared {
  float g[TM], beta[TM], gp[TM], cp[TM], eG[TM], rk[TM], rq[TM], dl[TM], qq[TM];
  float kk[TM][TM + 1], qk[TM][TM + 1];  // Gram rows t: k_t.k_u, q_t.k_u (u <= t), raw q / k
  float A[TM][TM + 1], W[TM][TM + 1];    // D_tu rk_t rk_u kk_tu (u < t), D_tu rq_t rk_u qk_tu (u <= t)
  float gam;                             // exp(sum of pending g)
  UTWarp<TM, RPW> w[NW];
};

// Loads of one lane's state rows (kRPL rows, NPC 4-key pieces each; rows past V re-read row V-1).
template <int LPR, int RPL, int NPC>
__device__ __forceinline__ void load_tile(float4 (&tile)[RPL][NPC], const float* st_head, const int64_t st_row,
                                          const int row0, const int V, const int sub) {
#pragma unroll
  for (int rr = 0; rr < RPL; ++rr) {
    const float* sp = st_head + min(row0 + rr, V - 1) * st_row;
#pragma unroll
    for (int i = 0; i < NPC; ++i) tile[rr][i] = *reinterpret_cast<const float4*>(sp + (i * LPR + sub) * 4);
  }
}

// st.global.cg.v4 for every piece: a plain float4 store of piece 0 was split into 4 scalar stores by
// the compiler (session 5's build: 4x the L2 sectors of that piece, Nsight Compute, session 6).
template <int LPR, int RPL, int NPC>
__device__ __forceinline__ void store_tile(const float4 (&tile)[RPL][NPC], float* st_head, const int64_t st_row,
                                           const int row0, const int V, const int sub) {
#pragma unroll
  for (int rr = 0; rr < RPL; ++rr) {
    if (row0 + rr < V) {
      float* sp = st_head + (row0 + rr) * st_row;
#pragma unroll
      for (int i = 0; i < NPC; ++i) {
        __stcg(reinterpret_cast<float4*>(sp + (i * LPR + sub) * 4), tile[rr][i]);
      }
    }
  }
}

// TMA stage refill (lane 0 of the warp): the warp's RPW rows row_w .. row_w + RPW - 1 (rows past V
// re-read row V - 1), K floats each, into stage rows 0 .. RPW - 1.
// One bulk copy of the whole RPW x K block where the rows are contiguous in memory and all inside V
// (whole: the state's row stride is K, p.ut_row_copies unset), else one copy per row. Per-row copies
// each wait for the previous one's uniform-register operands in the compiler's elect loop: 10-15 % of
// the stall samples of the P5 step kernel were on those loops (Nsight Compute, RESULTS.md session 7).
template <int K, int RPW>
__device__ __forceinline__ void prefetch_tile_tma(float* stage, const float* st_head, const int64_t st_row,
                                                  const int row_w, const int V, unsigned long long* bar,
                                                  const bool whole) {
  ut_mbar_expect_tx(bar, RPW * K * sizeof(float));
  if (whole && row_w + RPW <= V) {
    ut_bulk_g2s(stage, st_head + row_w * st_row, RPW * K * sizeof(float), bar);
    return;
  }
#pragma unroll
  for (int j = 0; j < RPW; ++j)
    ut_bulk_g2s(stage + j * K, st_head + min(row_w + j, V - 1) * st_row, K * sizeof(float), bar);
}

// cp.async of one lane's state rows into its slots of the warp's stage ([RPL][NPC][32] float4).
template <int LPR, int RPL, int NPC>
__device__ __forceinline__ void prefetch_tile(float4* stage, const float* st_head, const int64_t st_row,
                                              const int row0, const int V, const int lane, const int sub) {
#pragma unroll
  for (int rr = 0; rr < RPL; ++rr) {
    const float* sp = st_head + min(row0 + rr, V - 1) * st_row;
#pragma unroll
    for (int i = 0; i < NPC; ++i) ut_cp_async16(stage + (rr * NPC + i) * 32 + lane, sp + (i * LPR + sub) * 4);
  }
  ut_cp_async_commit();
}

// grid (S, HV, R): CTA (c, hv, r) runs the per-(row, head) prep once, then value tiles
// c * tpc .. min((c + 1) * tpc, cdiv(V, BV)) - 1 of BV = RPW NW rows. ONE: one tile per CTA (small
// batches), its state loads issued before the prep so that they overlap it; else a loop over tiles
// with the next tile's rows copied into the warp's stage (TMA, or cp.async for variant 1) while
// the current one computes, registers capped for 12 warps per SM (variants 1 / 2: <= 170, what
// they take unbounded, no spills; shared memory holds them to 3 CTAs per SM anyway at Tmax <= 8
// (54-63 KiB), 2 at Tmax 16 (~97 KiB); session 5's 128-register cap at 8 lanes per row spilled) or
// 16 (variant 3: 128 registers, no spills). Session 7's per-level reduce_scatter took the TM = 16
// builds' Gram partial sums out of local memory (no stack frame left in variants 1-3; ptxas -v).
// Build variant VAR (ChainVerifyParams::ut_var; RESULTS.md session 6):
//   1: the stage refill by per-thread cp.async (any GPU);
//   2: the refill by TMA bulk copies (loop mode, sm_90), 8 lanes per value row, 2 rows per lane
//      (8 rows per warp, 64 tile registers), registers for 12 warps per SM;
//   3: 2 with 16 lanes per value row (4 rows per warp, 32 tile registers, the row's products
//      reduce-scattered), registers capped for 16 warps per SM.
// Measured and removed: session 5's v5 (0; the raw v columns and vector cg stores below made
// 8x256x256 steps 4-8 % faster), 4 (16 lanes x 4 rows per lane: within 2 % of 2, slower than 3 for
// 8x256x256) and 5 (32 lanes x 4 rows: as 3, slower for 6x256x512).
template <int VAR>
__host__ __device__ constexpr int ut_lpr() { return VAR == 3 ? 16 : 8; }
template <int VAR>
__host__ __device__ constexpr int ut_rpl() { return 2; }
template <int VAR, int NW>
__host__ __device__ constexpr int ut_min_blocks() { return (VAR == 3 ? 16 : 12) / NW; }

// P5 (the default where built; VLLM_SPECLA_CUDA_UT_P5=0 runs the previous form for A/B): phase 5
// with v~ in registers. Every lane of a row runs the row's [T, T] forward substitution, fully
// unrolled over TM (the previous form runs it on one lane per row with a shared-memory round trip
// per term: 22 % of the stall samples of session 5's step kernel, RESULTS.md session 6), then forms
// its o tokens from its own registers: no shared v~, no __syncwarp; the same operations in the
// same order, so the results are bit-identical. Only for windows without write_final_state (the
// tile is dead after phase 4, which frees its registers for the substitution). Measured on the
// H200 (RESULTS.md session 7, same run, bit-identical outputs, state and banks): verify windows
// 0.76-0.92x the previous form's time, SpecLA steps 0.81-0.99x. P5 = 2 also batches phase 4's row
// reductions: every window token's partial sums first (unrolled over TM), then one reduce-scatter
// of the 32 sums over the row's lanes, the same xor pairs in the same order (bit-identical): 28 /
// 30 shuffles per tile (variant 2 / 3) instead of 12 / 5 per token, and no per-token chain of
// dependent shuffles; launch_form picks 1 or 2 by the shuffle count.
//
// Session 7's variants 4 / 5 (not the session-6 ones listed above): 3xTF32 tensor-core products,
// and also the pending fold as MMAs. Both were measured slower than 2 / 3 in every configuration
// (RESULTS.md session 8) and removed; they are in the history at commit 47799d5.
template <typename TIn, int K, int TM, int NW, bool ONE, int VAR, int P5 = 0>
__global__ void __launch_bounds__(NW * 32, ONE ? 1 : ut_min_blocks<VAR, NW>())
    chain_verify_ut_kernel(const ChainVerifyParams p, const int tb, const int pb, const int tpc) {
  static_assert(VAR >= 1 && VAR <= 3, "build variants 1 .. 3");
  pdl_enter();
  constexpr bool kTMA = VAR >= 2 && !ONE;
  constexpr int kLPR = ut_lpr<VAR>(), kRPL = ut_rpl<VAR>();
  constexpr int kRowsPerWarp = rows_per_warp<kLPR, kRPL>();
  constexpr int BV = kRowsPerWarp * NW;
  constexpr int NT = NW * 32;
  constexpr int KPL = K / kLPR;  // keys per lane and row
  constexpr int NPC = KPL / 4;   // 4-key pieces per lane and row
  constexpr int KW = K / 32;     // keys per lane in the Gram phase (contiguous)
  static_assert(K % 128 == 0 && KW % 4 == 0, "K must be 128 or 256");
  __shared__ UTShared<TM, NW, kRowsPerWarp> sh;
  __shared__ unsigned long long ut_mbar[NW];  // kTMA: the warp's stage barrier
  extern __shared__ float4 dyn4[];
  float* const xk = reinterpret_cast<float*>(dyn4);  // [tb][K] raw k (fp32)
  float* const xq = xk + tb * K;                     // [tb][K] raw q
  float* const kp = xq + tb * K;                     // [pb][K] pending k^ (bank)
  // loop modes: per warp a stage of the next tile's RPW state rows (RPW x K floats: 8 / 4 KiB at
  // K = 256 for variants 2 / 3); row-major [RPW][K] for the TMA refill, [kRPL][NPC][32] float4 (each
  // lane's own pieces) for cp.async
  float4* const stage = reinterpret_cast<float4*>(kp + pb * K) + (threadIdx.x >> 5) * (kRPL * NPC * 32);

  const int hv = blockIdx.y, r = blockIdx.z;
  const int G = p.HV / p.H;
  const int h = hv / G;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = lane / kLPR, sub = lane % kLPR;
  const int ntile = (p.V + BV - 1) / BV;
  const int tile0 = blockIdx.x * tpc, tile1 = min(tile0 + tpc, ntile);
  const int64_t bos = p.cu_seqlens[r];
  const int T = static_cast<int>(min64(p.cu_seqlens[r + 1] - bos, tb));
  const int64_t slot = p.slots[r];
  const int P = p.pending_len != nullptr ? static_cast<int>(min64(p.pending_len[r], pb)) : 0;
  const int64_t rb = P > 0 ? p.read_bank[r] : 0;
  const bool record = p.write_bank != nullptr;
  const int64_t wb = record ? p.write_bank[r] : 0;
  const int Trec = record ? min(T, p.Tmax) : 0;
  const int V = p.V;
  const int wrow = warp * kRowsPerWarp;  // the warp's first row inside a tile
  float* const st_head = p.state + slot * p.st_stride[0] + hv * p.st_stride[1];
  const int64_t st_row = p.st_stride[2];

  float4 tile[kRPL][NPC];
  if (ONE && tile0 < tile1) load_tile<kLPR>(tile, st_head, st_row, tile0 * BV + wrow + rg * kRPL, V, sub);
  unsigned tma_phase = 0;
  const bool tma_whole = st_row == K && !p.ut_row_copies;
  if (kTMA) {
    if (lane == 0) ut_mbar_init(&ut_mbar[warp]);
    __syncwarp();
    if (lane == 0 && tile0 < tile1)
      prefetch_tile_tma<K, kRowsPerWarp>(reinterpret_cast<float*>(stage), st_head, st_row, tile0 * BV + wrow, V,
                                         &ut_mbar[warp], tma_whole);
  } else if (!ONE && tile0 < tile1) {
    prefetch_tile<kLPR, kRPL, NPC>(stage, st_head, st_row, tile0 * BV + wrow + rg * kRPL, V, lane, sub);
  }
  const TIn* v = static_cast<const TIn*>(p.v);
  const float* bvp = p.bank_v + slot * p.bv_stride[0] + rb * p.bv_stride[1] + hv * p.bv_stride[3];
  const int64_t HVV = static_cast<int64_t>(p.HV) * V;
  // the warp's v / pending v~ columns of a tile: T x 8 and P x 8 values, TM / 4 per lane, loaded
  // into registers one tile ahead (their round trip overlaps the previous tile's compute)
  // v is kept raw (bf16 bits) until the next tile's shared store: widened right after its load
  // (session 5's v5), it made every tile wait for the load's round trip at the end of the refill
  // block (Nsight Compute: 16 % of all stall samples on that one conversion, RESULTS.md session 6)
  using VReg = typename RawV<TIn>::type;
  constexpr int NC = TM * kRowsPerWarp / 32;  // columns per lane (TM x RPW values per warp)
  static_assert(NC * 32 == TM * kRowsPerWarp, "TM x rows per warp must fill whole warp rounds");
  VReg bv_[NC];
  float bp_[NC];
  auto load_cols = [&](const int row_w) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int c = i * 32 + lane, t = c / kRowsPerWarp, row = row_w + c % kRowsPerWarp;
      const TIn* vp = v + (bos + t) * p.tok_stride[2] + hv * V + row;
      bv_[i] = (t < T && row < V) ? RawV<TIn>::load(vp) : VReg(0);
    }
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int c = i * 32 + lane, t = c / kRowsPerWarp, row = row_w + c % kRowsPerWarp;
      bp_[i] = (t < P && row < V) ? bvp[t * p.bv_stride[2] + row * p.bv_stride[4]] : 0.f;
    }
  };
  if (tile0 < tile1) load_cols(tile0 * BV + wrow);

  // ---- 1. staging of the window's q / k rows (fp32) and the pending k^ rows: every load of a
  // round is issued before its stores (a load -> store loop waits one round trip per iteration) ----
  {
    const TIn* q = static_cast<const TIn*>(p.q);
    const TIn* k = static_cast<const TIn*>(p.k);
    constexpr int E = Stage16<TIn>::kElems;
    constexpr int CPR = K / E;  // 16-byte chunks per q / k row
    const float* bk = p.bank_k + slot * p.bk_stride[0] + rb * p.bk_stride[1] + h * p.bk_stride[3];
    const int nqk = 2 * T * CPR, nkp = P * (K / 4);
    for (int base = 0; base < nqk || base < nkp * (kStageQK / kStageKP); base += kStageQK * NT) {
      const int base_p = base / (kStageQK / kStageKP);
      uint4 bq[kStageQK], bp[kStageKP];
#pragma unroll
      for (int i = 0; i < kStageQK; ++i) {
        const int c = base + i * NT + tid;
        if (c < nqk) {
          const int vec = c / CPR, ch = c % CPR;
          const TIn* src = vec < T ? k + (bos + vec) * p.tok_stride[1] : q + (bos + vec - T) * p.tok_stride[0];
          bq[i] = __ldg(reinterpret_cast<const uint4*>(src + h * K + ch * E));
        }
      }
#pragma unroll
      for (int i = 0; i < kStageKP; ++i) {
        const int c = base_p + i * NT + tid;
        if (c < nkp) bp[i] = __ldg(reinterpret_cast<const uint4*>(bk + (c / (K / 4)) * p.bk_stride[2] + (c % (K / 4)) * 4));
      }
      float sg = 0.f, sb = 0.f, sgp = 0.f;
      if (base == 0) {
        if (tid < T) {
          sg = p.g[(bos + tid) * p.tok_stride[3] + hv];
          sb = p.beta[(bos + tid) * p.tok_stride[4] + hv];
        }
        if (tid < P) sgp = p.bank_g[slot * p.bg_stride[0] + rb * p.bg_stride[1] + tid * p.bg_stride[2] + hv * p.bg_stride[3]];
      }
#pragma unroll
      for (int i = 0; i < kStageQK; ++i) {
        const int c = base + i * NT + tid;
        if (c < nqk) {
          const int vec = c / CPR, ch = c % CPR;
          Stage16<TIn>::put((vec < T ? xk + vec * K : xq + (vec - T) * K) + ch * E, bq[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kStageKP; ++i) {
        const int c = base_p + i * NT + tid;
        if (c < nkp) *reinterpret_cast<uint4*>(kp + (c / (K / 4)) * K + (c % (K / 4)) * 4) = bp[i];
      }
      if (base == 0) {
        if (tid < T) {
          sh.g[tid] = sg;
          sh.beta[tid] = sb;
        }
        if (tid < P) sh.gp[tid] = sgp;
      }
    }
  }
  __syncthreads();

  // ---- 2. Gram rows (warp w: tokens w, w + NW, ...): lane-split keys, two reduce-scatters of the
  // row's TM + TM partial sums (no shuffle behind a runtime branch), then the coefficients ----
  for (int t = warp; t < T; t += NW) {
    float kt[KW], qt[KW];
#pragma unroll
    for (int e = 0; e < KW; e += 4) {
      *reinterpret_cast<float4*>(kt + e) = *reinterpret_cast<const float4*>(xk + t * K + lane * KW + e);
      *reinterpret_cast<float4*>(qt + e) = *reinterpret_cast<const float4*>(xq + t * K + lane * KW + e);
    }
    float dk[TM], dq[TM];  // k_t . k_u, q_t . k_u (u <= t; 0 elsewhere)
    float nq = 0.f;
#pragma unroll
    for (int e = 0; e < KW; ++e) nq = fmaf(qt[e], qt[e], nq);
#pragma unroll
    for (int u = 0; u < TM; ++u) {
      dk[u] = 0.f;
      dq[u] = 0.f;
      if (u <= t) {
        const float* ku = xk + u * K + lane * KW;
#pragma unroll
        for (int e = 0; e < KW; e += 4) {
          const float4 x = *reinterpret_cast<const float4*>(ku + e);
          dk[u] = dot4(make_float4(kt[e], kt[e + 1], kt[e + 2], kt[e + 3]), x, dk[u]);
          dq[u] = dot4(make_float4(qt[e], qt[e + 1], qt[e + 2], qt[e + 3]), x, dq[u]);
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) nq += __shfl_xor_sync(kFullUT, nq, off);
    const int u = reduce_scatter<TM>(dk, lane);  // this lane now holds the sums for index u
    reduce_scatter<TM>(dq, lane);
    if (lane % (32 / TM) == 0 && u <= t) {
      sh.kk[t][u] = dk[0];
      sh.qk[t][u] = dq[0];
    }
    if (lane == 0) sh.qq[t] = nq;
  }
  __syncthreads();
  if (tid < T) {  // thread t: window row t
    const int t = tid;
    const float rk_t = p.use_qk_l2norm ? rsqrtf(sh.kk[t][t] + kEpsUT) : 1.f;
    const float rq_t = (p.use_qk_l2norm ? rsqrtf(sh.qq[t] + kEpsUT) : 1.f) * p.scale;
    sh.rk[t] = rk_t;
    sh.rq[t] = rq_t;
    float acc = 0.f;  // sum_{u < s <= t} g_s
    for (int u = t; u >= 0; --u) {
      const float d = __expf(acc);
      const float rk_u = p.use_qk_l2norm ? rsqrtf(sh.kk[u][u] + kEpsUT) : 1.f;
      if (u < t) sh.A[t][u] = d * rk_t * rk_u * sh.kk[t][u];
      sh.W[t][u] = d * rq_t * rk_u * sh.qk[t][u];
      if (t == T - 1) sh.dl[u] = d;
      acc += sh.g[u];
    }
    sh.eG[t] = __expf(acc);
  }
  if (tid < P) {  // thread j: pending factor j
    float acc = 0.f;
    for (int i = tid + 1; i < P; ++i) acc += sh.gp[i];
    sh.cp[tid] = __expf(acc);
    if (tid == 0) sh.gam = __expf(acc + sh.gp[0]);
  }
  __syncthreads();

  // ---- factors k^ and g: CTA 0 of the (row, head); k^ by the first value head of the GVA group ----
  const float4* xk4 = reinterpret_cast<const float4*>(xk);
  const float4* xq4 = reinterpret_cast<const float4*>(xq);
  const float4* kp4 = reinterpret_cast<const float4*>(kp);
  if (record && blockIdx.x == 0) {
    if (tid < Trec)
      p.bank_g[slot * p.bg_stride[0] + wb * p.bg_stride[1] + tid * p.bg_stride[2] + hv * p.bg_stride[3]] = sh.g[tid];
    if (hv % G == 0) {
      float* bk = p.bank_k + slot * p.bk_stride[0] + wb * p.bk_stride[1] + h * p.bk_stride[3];
      for (int c = tid; c < Trec * (K / 4); c += NT) {
        const int t = c / (K / 4), ch = c % (K / 4);
        float4 x = xk4[t * (K / 4) + ch];
        scale4(x, sh.rk[t]);
        *reinterpret_cast<float4*>(bk + t * p.bk_stride[2] + ch * 4) = x;
      }
    }
  }

  // ---- the value tiles: one memory round trip each (state rows + this warp's v / v~ columns),
  // warp-local from there on (no CTA barrier) ----
  auto& ws = sh.w[warp];
  for (int it = tile0; it < tile1; ++it) {
    const int row_w = it * BV + wrow;         // the warp's first value row
    const int row0 = row_w + rg * kRPL;       // this lane's first value row
    __syncwarp();  // the previous tile's reads of ws are done
#pragma unroll
    for (int i = 0; i < NC; ++i) (&ws.v[0][0])[i * 32 + lane] = RawV<TIn>::widen(bv_[i]);
#pragma unroll
    for (int i = 0; i < NC; ++i) (&ws.vp[0][0])[i * 32 + lane] = bp_[i];
    if (kTMA) {  // this tile from the stage (row-major rows of the warp), then the next tile's copy into it
      ut_mbar_wait(&ut_mbar[warp], tma_phase);
      tma_phase ^= 1u;
      const float4* st4 = stage;
#pragma unroll
      for (int rr = 0; rr < kRPL; ++rr)
#pragma unroll
        for (int i = 0; i < NPC; ++i) tile[rr][i] = st4[(rg * kRPL + rr) * (K / 4) + i * kLPR + sub];
      if (it + 1 < tile1) {
        __syncwarp();  // every lane's stage reads above are ordered before the refill
        if (lane == 0)
          prefetch_tile_tma<K, kRowsPerWarp>(reinterpret_cast<float*>(stage), st_head, st_row, row_w + BV, V,
                                             &ut_mbar[warp], tma_whole);
        load_cols(row_w + BV);
      }
    } else if (!ONE) {  // this tile from the stage, then the next tile's copy into it
      ut_cp_async_wait_all();
#pragma unroll
      for (int rr = 0; rr < kRPL; ++rr)
#pragma unroll
        for (int i = 0; i < NPC; ++i) tile[rr][i] = stage[(rr * NPC + i) * 32 + lane];
      if (it + 1 < tile1) {
        asm volatile("" ::: "memory");  // keep this lane's stage reads above before its refill below
        prefetch_tile<kLPR, kRPL, NPC>(stage, st_head, st_row, row0 + BV, V, lane, sub);
        load_cols(row_w + BV);
      }
    }
    __syncwarp();
    const int rl = rg * kRPL;  // this lane's first row inside the warp's RPW

    // ---- 3. pending fold (closed-form DeltaConstruct), committed tile written once ----
    if (P > 0) {
      const float gam = sh.gam;
#pragma unroll
      for (int rr = 0; rr < kRPL; ++rr)
#pragma unroll
        for (int i = 0; i < NPC; ++i) scale4(tile[rr][i], gam);
#pragma unroll 2
      for (int j = 0; j < P; ++j) {
        const float c = sh.cp[j];
        float a[kRPL];
#pragma unroll
        for (int rr = 0; rr < kRPL; ++rr) a[rr] = c * ws.vp[j][rl + rr];
#pragma unroll
        for (int i = 0; i < NPC; ++i) {
          const float4 x = kp4[j * (K / 4) + i * kLPR + sub];
#pragma unroll
          for (int rr = 0; rr < kRPL; ++rr) axpy4(tile[rr][i], a[rr], x);
        }
      }
      if (P5 || !p.write_final_state) store_tile<kLPR>(tile, st_head, st_row, row0, V, sub);
    }

    // ---- 4. window products U_t = S' k_t, Q_t = S' q_t (raw k / q; scaled by rk / rq later) ----
    if constexpr (P5 == 2) {  // every token's partial sums first, then one reduce-scatter (see P5 above)
      static_assert(2 * kRPL * TM == 32, "the batched reduce takes 32 partial sums per lane");
      // s4[4 t + 2 rr + (0: U, 1: Q)]; the partial sums as in the per-token loop below (a shared helper
      // for both changed these kernels' SASS against the measured build, so the loop is written twice)
      float s4[2 * kRPL * TM];
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        float ak[kRPL][2], aq[kRPL][2];
#pragma unroll
        for (int rr = 0; rr < kRPL; ++rr) ak[rr][0] = ak[rr][1] = aq[rr][0] = aq[rr][1] = 0.f;
        if (t < T) {  // uniform over the CTA
#pragma unroll
          for (int i = 0; i < NPC; ++i) {
            const float4 xkv = xk4[t * (K / 4) + i * kLPR + sub];
            const float4 xqv = xq4[t * (K / 4) + i * kLPR + sub];
#pragma unroll
            for (int rr = 0; rr < kRPL; ++rr) {
              ak[rr][i & 1] = dot4(tile[rr][i], xkv, ak[rr][i & 1]);
              aq[rr][i & 1] = dot4(tile[rr][i], xqv, aq[rr][i & 1]);
            }
          }
        }
#pragma unroll
        for (int rr = 0; rr < kRPL; ++rr) {
          s4[4 * t + 2 * rr] = ak[rr][0] + ak[rr][1];
          s4[4 * t + 2 * rr + 1] = aq[rr][0] + aq[rr][1];
        }
      }
      // over the row's LPR lanes (xor LPR / 2 .. 1): the same pairs in the same order as the per-token
      // reductions below, so bit-identical; afterwards s4[0 .. 32 / LPR) hold indices e ..
      const int e = reduce_scatter<2 * kRPL * TM, kLPR / 2, 1>(s4, lane);
      const int t = e / 4;
      if (t < T) {
        if constexpr (kLPR == 8) {  // 4 values: U, Q of both rows of token t
#pragma unroll
          for (int rr = 0; rr < kRPL; ++rr) {
            ws.U[t][rl + rr] = s4[2 * rr];
            ws.Q[t][rl + rr] = s4[2 * rr + 1];
          }
        } else {  // LPR = 16, 2 values: U, Q of row (e % 4) / 2
          static_assert(kLPR == 16, "LPR 8 or 16");
          ws.U[t][rl + (e % 4) / 2] = s4[0];
          ws.Q[t][rl + (e % 4) / 2] = s4[1];
        }
      }
    } else {
#pragma unroll 2
    for (int t = 0; t < T; ++t) {
      float ak[kRPL][2], aq[kRPL][2];  // two partial sums each (even / odd pieces): shorter FMA chains
#pragma unroll
      for (int rr = 0; rr < kRPL; ++rr) ak[rr][0] = ak[rr][1] = aq[rr][0] = aq[rr][1] = 0.f;
#pragma unroll
      for (int i = 0; i < NPC; ++i) {
        const float4 xkv = xk4[t * (K / 4) + i * kLPR + sub];
        const float4 xqv = xq4[t * (K / 4) + i * kLPR + sub];
#pragma unroll
        for (int rr = 0; rr < kRPL; ++rr) {
          ak[rr][i & 1] = dot4(tile[rr][i], xkv, ak[rr][i & 1]);
          aq[rr][i & 1] = dot4(tile[rr][i], xqv, aq[rr][i & 1]);
        }
      }
      float s4[2 * kRPL];
#pragma unroll
      for (int rr = 0; rr < kRPL; ++rr) {
        s4[2 * rr] = ak[rr][0] + ak[rr][1];
        s4[2 * rr + 1] = aq[rr][0] + aq[rr][1];
      }
      if constexpr (kLPR >= 16) {  // reduce-scatter over the row's lanes (2 RPL - 1 shuffles plus one
                                   // per remaining level); the first of each LPR / (2 RPL) lanes holding
                                   // value e = 2 rr + (0: U, 1: Q) stores it
        const int e = reduce_scatter<2 * kRPL, kLPR / 2, 1>(s4, lane);
        if ((lane & (kLPR / (2 * kRPL) - 1)) == 0) (e & 1 ? &ws.Q[t][0] : &ws.U[t][0])[rl + e / 2] = s4[0];
      } else {
#pragma unroll
        for (int off = kLPR / 2; off > 0; off >>= 1)
#pragma unroll
          for (int e = 0; e < 2 * kRPL; ++e) s4[e] += __shfl_xor_sync(kFullUT, s4[e], off);
        if (sub == 0) {
#pragma unroll
          for (int rr = 0; rr < kRPL; ++rr) {
            ws.U[t][rl + rr] = s4[2 * rr];
            ws.Q[t][rl + rr] = s4[2 * rr + 1];
          }
        }
      }
    }
    }  // P5 == 2
    __syncwarp();

    // ---- 5. forward substitution for v~ (lane l < RPW: row l of the warp), then the o rows (lane l:
    // row l % RPW, tokens l / RPW + (32 / RPW) i) and the o / v~ stores; runtime loops (compact code) ----
    if constexpr (P5) {  // v~ of row ri in registers of all its 32 / RPW lanes (see P5 above)
      const int ri = lane % kRowsPerWarp, row = row_w + ri;
      float vt[TM];
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        vt[t] = 0.f;
        if (t < T) {  // uniform over the CTA
          float x = fmaf(-sh.eG[t] * sh.rk[t], ws.U[t][ri], ws.v[t][ri]);
#pragma unroll
          for (int u = 0; u < t; ++u) x = fmaf(-sh.A[t][u], vt[u], x);
          vt[t] = sh.beta[t] * x;
        }
      }
      constexpr int kTS = 32 / kRowsPerWarp;  // token stride of a lane
#pragma unroll
      for (int i = 0; i < (TM + kTS - 1) / kTS; ++i) {
        const int t = lane / kRowsPerWarp + i * kTS;
        if (t < T && row < V) {
          float y = sh.eG[t] * sh.rq[t] * ws.Q[t][ri];
          float vtt = 0.f;
#pragma unroll
          for (int u = 0; u < TM; ++u) {
            const float wy = fmaf(sh.W[t][u], vt[u], y);  // selected below: u > t never reaches y
            y = u <= t ? wy : y;
            vtt = u == t ? vt[u] : vtt;
          }
          p.o[(bos + t) * HVV + hv * V + row] = y;
          if (t < Trec)
            p.bank_v[slot * p.bv_stride[0] + wb * p.bv_stride[1] + t * p.bv_stride[2] + hv * p.bv_stride[3] +
                     row * p.bv_stride[4]] = vtt;
        }
      }
    } else {
    if (lane < kRowsPerWarp) {
      for (int t = 0; t < T; ++t) {
        float x = fmaf(-sh.eG[t] * sh.rk[t], ws.U[t][lane], ws.v[t][lane]);
        for (int u = 0; u < t; ++u) x = fmaf(-sh.A[t][u], ws.vt[u][lane], x);
        ws.vt[t][lane] = sh.beta[t] * x;
      }
    }
    __syncwarp();
    {
      const int ri = lane % kRowsPerWarp, row = row_w + ri;
      for (int t = lane / kRowsPerWarp; t < T; t += 32 / kRowsPerWarp) {
        float y = sh.eG[t] * sh.rq[t] * ws.Q[t][ri];
        for (int u = 0; u <= t; ++u) y = fmaf(sh.W[t][u], ws.vt[u][ri], y);
        if (row < V) {
          p.o[(bos + t) * HVV + hv * V + row] = y;
          if (t < Trec)
            p.bank_v[slot * p.bv_stride[0] + wb * p.bv_stride[1] + t * p.bv_stride[2] + hv * p.bv_stride[3] +
                     row * p.bv_stride[4]] = ws.vt[t][ri];
        }
      }
    }
    }  // P5

    // ---- 6. state after the window (AR / commit windows) ----
    if (!P5 && p.write_final_state) {
      if (T > 0) {
        const float egl = sh.eG[T - 1];
#pragma unroll
        for (int rr = 0; rr < kRPL; ++rr)
#pragma unroll
          for (int i = 0; i < NPC; ++i) scale4(tile[rr][i], egl);
        for (int u = 0; u < T; ++u) {  // a runtime loop (code size): v~_u from ws.vt
          const float c = sh.dl[u] * sh.rk[u];
          float a[kRPL];
#pragma unroll
          for (int rr = 0; rr < kRPL; ++rr) a[rr] = c * ws.vt[u][rl + rr];
#pragma unroll
          for (int i = 0; i < NPC; ++i) {
            const float4 x = xk4[u * (K / 4) + i * kLPR + sub];
#pragma unroll
            for (int rr = 0; rr < kRPL; ++rr) axpy4(tile[rr][i], a[rr], x);
          }
        }
      }
      store_tile<kLPR>(tile, st_head, st_row, row0, V, sub);
    }
  }
}

#ifndef __CUDACC_RTC__  // host code (NVRTC compiles the kernels only: csrc/cuda/nvrtc_check.py --chain)
// Whether the current device runs this module's sm_90 code (the TMA refills of variants 2 / 3): its
// loaded binary comes from sm_90+ PTX (a module built for, e.g., compute_80 PTX and JIT-compiled on
// an H100 has the TMA code compiled out: ut_mbar_init traps there). Cached per device.
bool ut_tma_ok() {
  static int cache[64] = {};  // 0: unknown, 1: yes, 2: no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cache[dev] == 0) {
    cudaFuncAttributes a{};
    const bool ok = cudaFuncGetAttributes(&a, chain_verify_ut_kernel<float, 256, 8, 4, false, 2>) == cudaSuccess &&
                    a.ptxVersion >= 90 && a.binaryVersion >= 90;
    cache[dev] = ok ? 1 : 2;
  }
  return cache[dev] == 1;
}

// Kernel variant: p.ut_var 1 .. 3 if set (2 / 3 need the sm_90 code, ut_tma_ok, and run 1 without
// it; other values: automatic), else 2 where the sm_90 code runs (dispatch_nw may then take 3 by
// the cost model) and 1 elsewhere.
int ut_var(const ChainVerifyParams& p) {
  const bool tma = ut_tma_ok();
  if (p.ut_var >= 1 && p.ut_var <= 3) return p.ut_var >= 2 && !tma ? 1 : p.ut_var;
  return tma ? 2 : 1;
}

// SMs of the current device (cached).
int ut_sm_count() {
  static const int n = [] {
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms;
  }();
  return n;
}

// One planned UT launch: value tiles per CTA (tpc) and its modelled time (cost; unit: one wave of
// variant-2 tiles).
struct UTPlan {
  int tpc = 0;
  double cost = 0.0;
};

// Resident CTAs per SM of the loop kernel (one = false) or the one-tile kernel (one = true), from the
// occupancy query, cached by (one, tb, pb).
// Dynamic shared memory of a launch: the staged q / k rows, the pending k^ rows and, in loop mode, the
// stages.
template <int K, int TM, int NW, int VAR>
size_t ut_dyn_bytes(const int tb, const int pb, const bool one) {
  constexpr size_t kStage = static_cast<size_t>(NW) * ut_rpl<VAR>() * (K / ut_lpr<VAR>() / 4) * 32 * sizeof(float4);
  return static_cast<size_t>(2 * tb + pb) * K * sizeof(float) + (one ? 0 : kStage);
}

template <typename TIn, int K, int TM, int NW, int VAR, int P5 = 0>
int ut_per_sm(const int tb, const int pb, const bool one) {
  static int cache[2][TM + 1][TM + 1] = {};  // by (one, tb, pb); the first device's answer (one GPU model)
  int& per_sm = cache[one][std::min(tb, TM)][std::min(pb, TM)];
  if (per_sm == 0) {
    const size_t dyn = ut_dyn_bytes<K, TM, NW, VAR>(tb, pb, one);
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, one ? chain_verify_ut_kernel<TIn, K, TM, NW, true, VAR, P5> : chain_verify_ut_kernel<TIn, K, TM, NW, false, VAR, P5>,
            NW * 32, dyn) != cudaSuccess ||
        n < 1)
      n = 1;
    per_sm = n;
  }
  return per_sm;
}

// The shared-memory opt-in of both instantiations (the largest dynamic size the variant can take,
// tb, pb <= TM), once per kernel and before any occupancy query (which reports 0 CTAs above 48 KiB
// without it).
template <typename TIn, int K, int TM, int NW, int VAR, int P5 = 0>
cudaError_t ut_opt_in() {
  static const cudaError_t attr = [] {
    const int mx = static_cast<int>(ut_dyn_bytes<K, TM, NW, VAR>(TM, TM, false));
    const cudaError_t a = cudaFuncSetAttribute(chain_verify_ut_kernel<TIn, K, TM, NW, true, VAR, P5>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, mx);
    return a != cudaSuccess ? a : cudaFuncSetAttribute(chain_verify_ut_kernel<TIn, K, TM, NW, false, VAR, P5>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, mx);
  }();
  return attr;
}

// Value tiles per CTA (tpc): the fewest waves of resident CTAs times a wave's length, over tpc =
// 1..ntile (ties: fewer CTAs; tpc = 1 runs the one-tile kernel, with its own occupancy). A wave's
// length is tpc tiles of tau each plus the per-CTA prep (staging, Gram, coefficients: ~0.7 of a
// variant-2 tile). tau is relative to a variant-2 tile with the same warps per CTA: (CTAs per SM x
// BV) / (variant 2's CTAs per SM x its BV), times 1.1 for variant 3, whose rows per SM per unit time
// measured ~10 % below variant 2's (8x256x256, B = 128, where the waves quantise least: 0.965x
// variant 2's time against 0.871x modelled without the factor; with it the model is within 4 % of
// the 6 measured 8x256x256 ratios, T = 5 verify and step, B = 32-128, and conservative for
// 6x256x512; RESULTS.md session 6). So tau = 1 for variants 1 / 2 (session 5's model) and 0.73 for
// variant 3 at 4 warps (4 CTAs of 16 rows vs 3 of 32). E.g. variant 2, 6x256x512 (16 tiles of 32
// rows): B = 64 -> 16, one wave of 384 CTAs; 8x256x256 (8 tiles) at B = 64 -> 4: 1024 CTAs in 3
// waves of 396 slots beat 512 CTAs in 2. A forced p.ut_tpc skips the model (cost 0).
template <typename TIn, int K, int TM, int NW, int VAR, int P5 = 0>
cudaError_t plan_ut(const ChainVerifyParams& p, const int tb, const int pb, UTPlan* plan) {
  constexpr int BV = rows_per_warp<ut_lpr<VAR>(), ut_rpl<VAR>()>() * NW;
  constexpr int BV_ref = rows_per_warp<ut_lpr<2>(), ut_rpl<2>()>() * NW;
  const int ntile = (p.V + BV - 1) / BV;
  cudaError_t e = ut_opt_in<TIn, K, TM, NW, VAR, P5>();
  if (e == cudaSuccess && VAR >= 3) e = ut_opt_in<TIn, K, TM, NW, 2>();
  if (e != cudaSuccess) return e;
  plan->tpc = p.ut_tpc > 0 ? std::min(p.ut_tpc, ntile) : 0;
  plan->cost = 0.0;
  if (plan->tpc > 0) return cudaSuccess;
  const int per_sm = ut_per_sm<TIn, K, TM, NW, VAR, P5>(tb, pb, false);
  const int per_sm_one = ut_per_sm<TIn, K, TM, NW, VAR, P5>(tb, pb, true);
  const int per_sm_ref = VAR >= 3 ? ut_per_sm<TIn, K, TM, NW, 2>(tb, pb, false) : per_sm;
  const double tau = static_cast<double>(per_sm) * BV / (static_cast<double>(per_sm_ref) * BV_ref) *
                     (VAR == 3 ? 1.1 : 1.0);
  const int64_t pairs = static_cast<int64_t>(p.R) * p.HV;
  for (int c = ntile; c >= 1; --c) {
    const int64_t slots = static_cast<int64_t>(c == 1 ? per_sm_one : per_sm) * ut_sm_count();
    const int64_t ctas = pairs * ((ntile + c - 1) / c);
    const double cost = static_cast<double>((ctas + slots - 1) / slots) * (c * tau + 0.7);
    if (plan->tpc == 0 || cost < plan->cost - 1e-9) {
      plan->cost = cost;
      plan->tpc = c;
    }
  }
  return cudaSuccess;
}

template <typename TIn, int K, int TM, int NW, int VAR, int P5 = 0>
cudaError_t launch_ut(const ChainVerifyParams& p, const int tb, const int pb, const UTPlan& plan,
                      cudaStream_t stream) {
  constexpr int BV = rows_per_warp<ut_lpr<VAR>(), ut_rpl<VAR>()>() * NW;
  const int ntile = (p.V + BV - 1) / BV;
  const dim3 grid((ntile + plan.tpc - 1) / plan.tpc, p.HV, p.R);
  auto* kern = plan.tpc == 1 ? chain_verify_ut_kernel<TIn, K, TM, NW, true, VAR, P5>
                             : chain_verify_ut_kernel<TIn, K, TM, NW, false, VAR, P5>;
  const size_t dyn = ut_dyn_bytes<K, TM, NW, VAR>(tb, pb, plan.tpc == 1);
  return launch_pdl(kern, grid, dim3(NW * 32), dyn, stream, p.pdl, p, tb, pb, plan.tpc);
}

template <typename TIn, int K, int TM, int NW, int VAR, int P5 = 0>
cudaError_t plan_and_launch(const ChainVerifyParams& p, const int tb, const int pb, cudaStream_t stream) {
  UTPlan plan;
  const cudaError_t e = plan_ut<TIn, K, TM, NW, VAR, P5>(p, tb, pb, &plan);
  return e != cudaSuccess ? e : launch_ut<TIn, K, TM, NW, VAR, P5>(p, tb, pb, plan, stream);
}

// Shuffles per value tile of the products' row reductions (phase 4): one batched reduce-scatter of
// 32 partial sums over the row's LPR lanes (P5 = 2), or per window token an all-reduce of 4 values
// over 8 lanes (variant 2: 12) or a reduce-scatter over 16 (variant 3: 5).
template <int VAR>
constexpr int ut_shuffles_batched() { return 32 - 32 / ut_lpr<VAR>(); }
template <int VAR>
constexpr int ut_shuffles_per_token() { return ut_lpr<VAR>() >= 16 ? 5 : 12; }

// Launch of a planned variant in phase-5 form P5, where P5 = 3 (automatic) takes the batched
// products reduce (2) when it needs fewer shuffles than the per-token ones (1) for the longest
// window tb: variant 2 from 3 tokens, variant 3 from 7. Measured (RESULTS.md session 7, same run):
// 2 took 0.89-0.98x the time of 1 at T = 8 in both variants, 0.98-1.00x at T = 5 for variant 2 and
// 0.99-1.05x for variant 3. (P5 = 1 and 2 have the same registers and shared memory, so one plan
// serves both.)
template <typename TIn, int K, int TM, int VAR, int P5>
cudaError_t launch_form(const ChainVerifyParams& p, const int tb, const int pb, const UTPlan& plan,
                        cudaStream_t stream) {
  if constexpr (P5 == 3) {
    if (ut_shuffles_batched<VAR>() < ut_shuffles_per_token<VAR>() * tb)
      return launch_ut<TIn, K, TM, 4, VAR, 2>(p, tb, pb, plan, stream);
    // the plan queried (and opted in) form 2 only: form 1's shared-memory opt-in here (its dynamic
    // size passes 48 KiB with a long pending bank, e.g. tb = 2, pb = 8; found in review)
    const cudaError_t e = ut_opt_in<TIn, K, TM, 4, VAR, 1>();
    return e != cudaSuccess ? e : launch_ut<TIn, K, TM, 4, VAR, 1>(p, tb, pb, plan, stream);
  } else {
    return launch_ut<TIn, K, TM, 4, VAR, P5>(p, tb, pb, plan, stream);
  }
}

// Variant 2 or 3 (automatic: by the cost model with a 3 % margin for 3; forced: var) in phase-5 form
// P5 (0, 1, 2; 3: automatic, launch_form).
template <typename TIn, int K, int TM, int P5>
cudaError_t launch_23(const ChainVerifyParams& p, const int tb, const int pb, const int var, cudaStream_t stream) {
  constexpr int PP = P5 == 3 ? 2 : P5;  // the instantiation the plans query
  UTPlan p2, p3;
  if (var == 3) {
    const cudaError_t e = plan_ut<TIn, K, TM, 4, 3, PP>(p, tb, pb, &p3);
    return e != cudaSuccess ? e : launch_form<TIn, K, TM, 3, P5>(p, tb, pb, p3, stream);
  }
  cudaError_t e = plan_ut<TIn, K, TM, 4, 2, PP>(p, tb, pb, &p2);
  if (e != cudaSuccess) return e;
  if ((p.ut_var < 1 || p.ut_var > 3) && TM == 8 && p.ut_tpc <= 0) {  // automatic: variant 2 or 3
    e = plan_ut<TIn, K, TM, 4, 3, PP>(p, tb, pb, &p3);
    if (e != cudaSuccess) return e;
    // variant 3 only when the model gives it >= 3 % less time (near ties go to variant 2); measured:
    // 3 at 8x256x256 B = 32 / 64 / 128 (and B = 256 end to end), 2 at 6x256x512 B = 32 / 64 / 128
    if (p3.cost < 0.97 * p2.cost) return launch_form<TIn, K, TM, 3, P5>(p, tb, pb, p3, stream);
  }
  return launch_form<TIn, K, TM, 2, P5>(p, tb, pb, p2, stream);
}

template <typename TIn, int K, int TM>
cudaError_t dispatch_nw(const ChainVerifyParams& p, const int tb, const int pb, cudaStream_t stream) {
  // build variant p.ut_var (kernel VAR) when forced, else (sm_90 code) variant 2 or 3 by the cost
  // model (TM = 8 builds: windows and pending factors <= 8; the TM = 16 builds keep variant 2,
  // variant 3 is unmeasured there; a forced p.ut_tpc also keeps variant 2); 4 warps per CTA unless
  // p.ut_nw forces 1 (variant 3 then also has 1 warp; variant 1 keeps its refill)
  const int var = ut_var(p);
  if (p.ut_nw == 1) {
    switch (var) {
      case 1: return plan_and_launch<TIn, K, TM, 1, 1>(p, tb, pb, stream);
      case 3: return plan_and_launch<TIn, K, TM, 1, 3>(p, tb, pb, stream);
      default: return plan_and_launch<TIn, K, TM, 1, 2>(p, tb, pb, stream);
    }
  }
  if (var == 1) return plan_and_launch<TIn, K, TM, 4, 1>(p, tb, pb, stream);
  // P5 builds exist for K = 256 and TM = 8 (both GDN-1.3B head shapes at K <= 7), 4 warps, windows
  // without write_final_state; elsewhere p.ut_p5 is ignored
  if constexpr (K == 256 && TM == 8) {
    if (!p.write_final_state) {
      switch (p.ut_p5) {
        case 0: break;
        case 1: return launch_23<TIn, K, TM, 1>(p, tb, pb, var, stream);
        case 2: return launch_23<TIn, K, TM, 2>(p, tb, pb, var, stream);
        default: return launch_23<TIn, K, TM, 3>(p, tb, pb, var, stream);
      }
    }
  }
  return launch_23<TIn, K, TM, 0>(p, tb, pb, var, stream);
}

template <typename TIn>
cudaError_t dispatch_ut(const ChainVerifyParams& p, const int tb, const int pb, cudaStream_t stream) {
  const bool small = std::max(tb, pb) <= 8;
  if (p.K == 256) return small ? dispatch_nw<TIn, 256, 8>(p, tb, pb, stream) : dispatch_nw<TIn, 256, 16>(p, tb, pb, stream);
  return small ? dispatch_nw<TIn, 128, 8>(p, tb, pb, stream) : dispatch_nw<TIn, 128, 16>(p, tb, pb, stream);
}

#endif  // !__CUDACC_RTC__
}  // namespace

#ifndef __CUDACC_RTC__  // host code (NVRTC compiles the kernels only: csrc/cuda/nvrtc_check.py --chain)
bool chain_verify_ut_bounds(const ChainVerifyParams& p, int* tb, int* pb) {
  if (!p.vec_ok || (p.K != 128 && p.K != 256) || p.R <= 0 || p.V <= 0) return false;
  // longest possible window: N tokens (rows may be empty), and a recorded window fits the bank
  // (chain_verify_ref raises for a longer one; the dispatcher sizes banks to the window)
  int64_t t_bound = p.N;
  if (p.write_bank != nullptr) t_bound = std::min<int64_t>(t_bound, p.Tmax);
  const int64_t p_bound = p.pending_len != nullptr ? p.Tmax : 0;
  if (t_bound < 1 || t_bound > 16 || p_bound > 16) return false;
  *tb = static_cast<int>(t_bound);
  *pb = static_cast<int>(p_bound);
  return true;
}

bool chain_verify_ut_auto(const ChainVerifyParams& p) {
  // verify / SpecLA-step windows (the serial kernels keep AR and commit windows) at >= 192 (row,
  // value head) pairs: from there the UT form took 0.73-0.98x v3's time for steps (T = 5 / 8) at
  // both GDN-1.3B head shapes, B = 32-256 (H200, RESULTS.md session 5, csrc_ut_h200_s5e.json; v3
  // stays ahead by <= 7 % for 8x256x256 verify windows without pending factors at B = 32-64, which
  // the runtime only runs after a prefill); at batch 1-2 the serial kernels are 1.2-1.7x faster (csrc_ut_h200_s5d.json).
  // ChainVerifyParams::ut_auto (VLLM_SPECLA_CUDA_UT) 0 / 1 overrides.
  if (p.ut_auto == 0 || p.write_final_state) return false;
  int tb = 0, pb = 0;
  if (!chain_verify_ut_bounds(p, &tb, &pb)) return false;
  return p.ut_auto == 1 || static_cast<int64_t>(p.R) * p.HV >= 192;
}

cudaError_t chain_verify_ut(const ChainVerifyParams& p, cudaStream_t stream) {
  if (p.R == 0) return cudaSuccess;
  int tb = 0, pb = 0;
  if (!chain_verify_ut_bounds(p, &tb, &pb)) return cudaErrorNotSupported;
  return p.in_bf16 ? dispatch_ut<__nv_bfloat16>(p, tb, pb, stream) : dispatch_ut<float>(p, tb, pb, stream);
}

#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace vllm_specla
