// CUDA chain verify (v3): state tile in registers, value dim tiled, deferred commit fused, one
// batched warp reduction per token, next token prefetched; plus a row-group layout kernel for
// small batches (below). From 192 (row, value head) pairs, verify and SpecLA-step windows go to the
// UT form instead (chain_verify_ut.cu, session 5: 0.73-0.98x v3's time for steps), dispatched by
// chain_verify() at the end of this file.
//
// Tried and not kept (session 4, RESULTS.md): a scaled tile (state = sc * m with a warp-uniform
// sc, so a decay is one scalar multiply and the update one FMA per element) ran 1-3 % slower at
// B >= 32 and 10-14 % slower for batch-1 steps (the 1 / sc and range check sit on the serial chain).
//
// History. v1 (one 4-warp CTA per 32 value rows, tile in shared memory) ran 3-10x slower than the
// Triton kernel on the H200. v2 mirrored the Triton [BV, K] layout (one warp per 8 value rows, the
// tile in registers) but still took 1.18-1.22x Triton's time for AR (T = 1), 1.3-1.36x for the
// fused step and 1.55-1.6x for verify at batch >= 32 (benchmarks/RESULTS.md). Its per-token chain
// was serial: 19 separate 5-level warp_sum's (95 shuffles), and per value row a global load of v
// issued only after the previous row's o / bank_v stores (the compiler cannot hoist a load above
// a store that may alias it), so every row of every token waited for a memory round trip.
//
// v3, one warp per (value tile of BV = 4 or 8 rows, value head hv, request row r):
//   1. the token inputs of the first window token, then the [BV, K] state tile (16-byte loads when
//      K % 128 == 0; rows past V re-read row V-1 and are zeroed, so the loads are unconditional):
//      every load of the tile is in flight before the first use;
//   2. pending factors (deferred commit) are folded with the serial DeltaConstruct
//      M = e^{g_u} M + v~_u k_u^T; the per-factor scalars (g_u and the BV values v~_u) of up to
//      32 / BV factors are loaded at once, one per lane, and broadcast with __shfl_sync; the next
//      k_u row is prefetched; the committed tile is written once (skipped for write_final_state);
//   3. per window token, on raw (un-normalised) q and k: every lane forms its partial sums of
//      (M k, M q) for each row, (|k|^2, |q|^2) and (k.q, 0): NP = BV + 2 float pairs, reduced by
//      ONE batched butterfly reduce-scatter (rs_step: at each xor level a lane keeps half of its
//      pairs and sends the other half to the partner; once one pair is left the remaining levels
//      are plain all-reduce steps). BV = 8: 5 + 3 + 2 + 1 + 1 = 12 pair shuffles (24 shuffles)
//      instead of v2's 95; BV = 4: 3 + 2 + 1 + 1 + 1 = 8 (16 shuffles). Then 3 broadcasts of the
//      norms and k.q, the l2norm scales rk = rsqrt(|k|^2 + 1e-6), rq = rsqrt(|q|^2 + 1e-6) * scale
//      (fla's x * rsqrt(sum x^2 + eps)), and the lane that holds row i's pair computes
//      v~_i = beta (v_i - e^g (M k)_i rk) and o_i = e^g (M q)_i rq + v~_i (k.q) rk rq, with v_i
//      loaded by that lane only; BV broadcasts of v~ feed the update M = e^g M + v~ k^T with
//      k^ = k rk (the same k^ written to bank_k);
//   4. token t+1's q/k/v/g/beta are loaded into registers at the top of token t, before any store
//      of token t (software pipelining), read through the read-only path (__ldg);
//   5. factors (k^_t, v~_t, g_t) go to bank write_bank with one writer per element: bank_v by
//      every V-tile for its own rows (one lane per row), bank_g by V-tile 0 (lane 0), bank_k by
//      V-tile 0 of the first value head of each GVA group; o by one lane per row; the final tile
//      only with write_final_state (AR).
// BV is picked by the launcher like triton_chain.pick_config: 4 for AR (one token per row) and
// for small batches (R * HV <= 16 (row, head) pairs), else 8; for K > 256 always 4 (2 on the
// non-vector path) and no prefetch (register budget); ChainVerifyParams::bv overrides (the binding
// reads VLLM_SPECLA_CUDA_BV). Register caps (min_blocks) raise the warps per SM where they cost
// no spills. q/k/v/g/beta may be token-strided (read in place; the 16-byte path needs 16-byte
// aligned rows, else the lane-strided path).
//
// Small-batch lean kernel (chain_verify_sb_body, session 18): its own section below; the automatic layout
// prefers it to the row-group kernels for bf16 small-batch windows (sb_auto). Every kernel here starts with
// pdl_enter() and is launched by launch_pdl (chain_verify.cuh: programmatic dependent launch on sm_90+).
//
// Small-batch variant (row-group layout, chain_verify_rg_body / _pf). At batch 1-2 the GPU holds a few
// warps per SM and the time is each warp's per-token dependent chain (q/k load -> partial sums ->
// reduction -> v~ -> update); v3's reduce-scatter (5 dependent shuffle levels, then broadcasts of
// the norms and of every row's v~) was 1.07-1.28x Triton's time there (RESULTS.md, session 3),
// while Triton's small configs ([BV, K/32, 32] tile) reduce mostly in-thread. Here lane =
// (row group lane / LPR, sub-lane lane % LPR): the warp's BV rows get 32 / LPR row groups of RPL
// rows (LPR = 32 / BV, RPL = 1: 8 rows x 4 lanes for BV = 8, 4 x 8 for BV = 4; or LPR = 8, RPL =
// BV / 4, Triton's lane split), and the LPR lanes of a row split its K keys into pieces of PW
// consecutive keys (piece i of sub-lane s at key (i LPR + s) PW, rg_key). PW = 8 (the ring body,
// the sb kernel): the row's lanes read LPR * 32 contiguous bytes, two 16-byte loads per piece, each
// warp access touching half sectors; PW = 4 (the one-ahead and AR bodies since session 21): one
// 16-byte load per piece, whole lines per warp access. Every row group holds the same keys, so each
// lane needs q and k on its K / LPR keys only. Per token: in-thread partial sums of (M k, M q)
// per row, |k|^2, |q|^2, k.q with 4 independent accumulators each (short FFMA chains), one xor
// butterfly over the row's lanes (log2 LPR levels, all 2 RPL + 3 values per level; a butterfly
// leaves bit-identical sums in every lane), then v~ and o computed redundantly by the row's lanes
// (no broadcasts), sub-lane 0 stores o and bank_v, row group 0 of the k-writer warps stores k^,
// every lane updates its elements. Pending factors are folded in the same layout. Inputs reach
// the warp through shared memory filled by cp.async (no registers: the K = 256, BV = 8 tile alone
// is 64 per lane), in one of two variants (ChainVerifyParams::rg_prefetch, the binding reads
// VLLM_SPECLA_CUDA_RG_PREFETCH: unset = 1 for SpecLA steps (pending factors) and 0 for verify / AR,
// as measured on the H200 in session 4, RESULTS.md; 0 / 1 force a variant):
//   0 (chain_verify_rg_body): one token ahead. Token t+1's q / k rows go to a double-buffered
//     slot while token t computes (cp.async.wait_group 1 + __syncwarp before reading a slot,
//     __syncwarp before refilling it), its v / g / beta to registers; each pending factor's k row,
//     v~ and g are loaded while the previous one is folded. At batch 1 nothing hides the memory
//     round trip this leaves on every token (H200 batch 1: ~0.75 us per window token, 0.64-0.71 us
//     per pending factor, csrc_cuda_h200_b1_layouts.json step - verify).
//   1 (chain_verify_rg_body_pf): the row's items, pending factors then window tokens, stream
//     through a ring of NB stages, each the item's key rows (token: q and k, TIn; factor: k^, fp32)
//     and BV + 2 scalar words (token: v of the tile's rows, g, beta; factor: v~ of the rows, g),
//     copied with 16-byte (rows) and 4-byte (scalars; bf16 v in pairs, plain loads where a pair is
//     not 4-byte aligned or crosses V) cp.async. Item 0, then the state tile, then items
//     1 .. NB - 2 are issued at kernel start, item i + NB - 1 when item i starts; one commit group
//     per item (empty past the last one), so cp.async.wait_group NB - 2 + one __syncwarp per item
//     make item i visible to every lane and free item i - 1's stage. All of a row's items are in
//     flight from kernel start when np + T <= NB - 1. NB (rg_stages): 16 KiB of stages where
//     the tile is 64 registers per lane (228-248 registers, 8 warps per SM), 8 KiB otherwise
//     (80-138 registers), at most 16: bf16 K = 256 -> 16 stages (BV 8) / 8 (BV 4), fp32 K = 256
//     -> 8 / 4, K = 128 -> 16 (bf16) / 8 (fp32); ~17 KiB / ~8.5 KiB of shared memory per CTA.
// Two more lane splits (ChainVerifyParams::layout kLayoutRowGroup16 / 32, the binding reads
// VLLM_SPECLA_CUDA_LAYOUT=rowgroup16 / rowgroup32; the automatic rule picks 16 lanes for steps at
// <= 8 (row, head) pairs, dispatch_k; 32 lanes is forced only, it was slower everywhere on the
// H200): LPR = 16, RPL = 1 (BV = 2 rows per warp, KPL = K / 16: 8 for K = 128, 16 for
// K = 256) and LPR = 32, RPL = 1 (BV = 1, one row group, KPL = 8: K = 256 only, since KPL must be a
// multiple of 8; K = 128 runs LPR = 16). Per lane a 16- / 8-element tile instead of 64 (K = 256,
// LPR 8, RPL 2), so shorter per-token FMA chains, 1 more butterfly level per doubling of LPR, and
// 4x / 8x the warps of BV = 8 at batch 1 (V = 512: 256 / 512 warps per value head). Both variants,
// same writers (sub-lane 0 of each row: o, v~; row group 0: k^); with BV = 1 the bf16 v of variant
// 1 is one plain load by lane 0. nvcc -Xptxas -v (sm_90a): 63-122 registers, no spills; variant 1
// ring: NB = 8 KiB / row bytes (bf16 K = 256: 8 stages, fp32: 4; K = 128: 16 / 8), 8.0-8.3 KiB smem.
// Used when R * HV <= 16 (triton_chain.pick_config's "small" rule) on the 16-byte path with
// K = 128 or 256 (else v3): AR -> BV 4, verify -> 8 lanes per row, steps with pending factors ->
// 8 lanes per row with variant 1, v3 with variant 0 (variant 1 is the binding's default for rows
// with pending factors only: H200 A/B, RESULTS.md session 4); BV 4 for AR, else 8 (Triton's
// ar_small / verify_small), p.bv overrides;
// ChainVerifyParams::layout forces a layout (the binding reads VLLM_SPECLA_CUDA_LAYOUT; rs forces
// v3 for steps with variant 1 too).
// Value rows are independent recurrences in the [V, K] layout, so V tiling needs no
// communication between warps. Exact fp32 arithmetic (FMA, no tensor cores); results differ from
// chain_verify_ref only by summation order and the fast exp/rsqrt intrinsics (as v2 / Triton).

#include "chain_verify.cuh"

#include <cuda_bf16.h>

#ifndef __CUDACC_RTC__
#include <algorithm>
#include <type_traits>
#endif

namespace vllm_specla {
namespace cuda {
namespace {

constexpr float kEps = 1e-6f;  // fla l2norm eps
constexpr unsigned kFull = 0xffffffffu;

// ---- batched warp reduction: reduce-scatter of NP float pairs ---------------------------------
// Levels at xor offsets 16, 8, 4, 2, 1. At a level with n > 1 live pairs (uniform over lanes,
// trailing entries may be zero padding), h = ceil(n / 2): the lane with the offset bit clear
// keeps pairs [0, h), its partner keeps [h, n) (padded with a zero pair to h entries); each
// sends the half the other keeps and adds what it receives, so h pair shuffles halve n. Once
// n == 1 the remaining levels are all-reduce steps (the pair is then held, bit-identical, by the
// lanes differing only in those offset bits). The layout functions below are constexpr and
// checked at compile time (rs_layout_ok).

__host__ __device__ constexpr int rs_half(int n) { return (n + 1) / 2; }

// Offset bits of the all-reduce levels (lanes differing only in them hold the same pair).
template <int NP>
__host__ __device__ constexpr int rs_rep_mask() {
  int m = 0, n = NP;
  for (int off = 16; off > 0; off >>= 1) {
    if (n > 1)
      n = rs_half(n);
    else
      m |= off;
  }
  return m;
}

// The lane (all-reduce bits clear) that ends holding fully reduced pair i.
template <int NP>
__host__ __device__ constexpr int rs_owner(int i) {
  int lane = 0, n = NP;
  for (int off = 16; off > 0; off >>= 1) {
    if (n > 1) {
      const int h = rs_half(n);
      if (i >= h) {
        lane |= off;
        i -= h;
      }
      n = h;
    }
  }
  return lane;
}

// The pair held by `lane` after the reduce-scatter, or -1 when it holds padding. [base, lim) is
// the range of real pair indices of the lane's sub-array at each level.
template <int NP>
__host__ __device__ constexpr int rs_pair(int lane) {
  int base = 0, lim = NP, n = NP;
  for (int off = 16; off > 0; off >>= 1) {
    if (n > 1) {
      const int h = rs_half(n);
      if (lane & off)
        base += h;
      else
        lim = lim < base + h ? lim : base + h;
      n = h;
    }
  }
  return base < lim ? base : -1;
}

// Every pair has exactly one owner (all-reduce bits clear) and the owner holds it.
template <int NP>
__host__ __device__ constexpr bool rs_layout_ok() {
  if (NP < 1 || NP > 32) return false;
  const int rep = rs_rep_mask<NP>();
  for (int i = 0; i < NP; ++i) {
    const int o = rs_owner<NP>(i);
    if ((o & rep) != 0 || rs_pair<NP>(o) != i) return false;
    int holders = 0;
    for (int lane = 0; lane < 32; ++lane) holders += rs_pair<NP>(lane) == i && (lane & rep) == 0;
    if (holders != 1) return false;
  }
  return true;
}

// One level (offset OFF, N live pairs) and the levels below it.
template <int NP, int N, int OFF>
__device__ __forceinline__ void rs_step(float2 (&a)[NP], int lane) {
  if constexpr (OFF > 0) {
    if constexpr (N > 1) {
      constexpr int h = rs_half(N);
      const bool up = (lane & OFF) != 0;
#pragma unroll
      for (int j = 0; j < h; ++j) {
        const float2 hi = j + h < N ? a[j + h < N ? j + h : 0] : make_float2(0.f, 0.f);
        const float2 send = up ? a[j] : hi;
        const float2 keep = up ? hi : a[j];
        a[j].x = keep.x + __shfl_xor_sync(kFull, send.x, OFF);
        a[j].y = keep.y + __shfl_xor_sync(kFull, send.y, OFF);
      }
      rs_step<NP, h, OFF / 2>(a, lane);
    } else {
      a[0].x += __shfl_xor_sync(kFull, a[0].x, OFF);
      a[0].y += __shfl_xor_sync(kFull, a[0].y, OFF);
      rs_step<NP, 1, OFF / 2>(a, lane);
    }
  }
}

static_assert(rs_layout_ok<4>() && rs_layout_ok<6>() && rs_layout_ok<10>(), "reduce-scatter layout");
static_assert(rs_owner<10>(8) != rs_owner<10>(9) && rs_rep_mask<10>() == 1 && rs_rep_mask<6>() == 3, "layout");

// ---- loads and stores ---------------------------------------------------------------------------

// Key index of a lane's c-th element. VEC: 4 consecutive keys per lane per 128-key chunk (16-byte
// loads and stores of the state, banks and q/k); else lane-strided (any K).
template <bool VEC>
__device__ __forceinline__ int kidx(int lane, int c) {
  return VEC ? (c >> 2) * 128 + lane * 4 + (c & 3) : lane + 32 * c;
}

// token inputs (q, k, v): read-only for the whole kernel, read through the non-coherent path
template <typename T>
__device__ __forceinline__ float ldg1(const T* p);
template <>
__device__ __forceinline__ float ldg1<float>(const float* p) {
  return __ldg(p);
}
template <>
__device__ __forceinline__ float ldg1<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(__ldg(p));
}

// One element's raw bits (fp32 as is, bf16 in the low half) and their widening: a prefetched scalar stays raw
// until the token that reads it, so no widening instruction waits on the load where it is issued (session 20:
// the sb kernel's bf16 v, widened in sb_load, stalled each batch-1 window token on its own prefetch).
template <typename T>
__device__ __forceinline__ unsigned ldg_bits(const T* p);
template <>
__device__ __forceinline__ unsigned ldg_bits<float>(const float* p) {
  return __float_as_uint(__ldg(p));
}
template <>
__device__ __forceinline__ unsigned ldg_bits<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
template <typename T>
__device__ __forceinline__ float widen_bits(unsigned b) {
  return __uint_as_float(std::is_same<T, float>::value ? b : b << 16);
}

template <typename T>
__device__ __forceinline__ void ldg4(const T* p, float* out);
template <>
__device__ __forceinline__ void ldg4<float>(const float* p, float* out) {
  const float4 x = __ldg(reinterpret_cast<const float4*>(p));
  out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
}
template <>
__device__ __forceinline__ void ldg4<__nv_bfloat16>(const __nv_bfloat16* p, float* out) {
  const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.y));
  out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
}

// KPL key elements of a dense token row (q or k).
template <bool VEC, int KPL, typename T>
__device__ __forceinline__ void ldg_row(const T* row, int lane, int K, float* out) {
  if constexpr (VEC) {
#pragma unroll
    for (int c = 0; c < KPL; c += 4) ldg4<T>(row + kidx<true>(lane, c), out + c);
  } else {
#pragma unroll
    for (int c = 0; c < KPL; ++c) {
      const int j = kidx<false>(lane, c);
      out[c] = j < K ? ldg1<T>(row + j) : 0.f;
    }
  }
}

// KPL key elements of an fp32 state / bank row (element stride 1 when VEC, else ``stride``);
// coherent loads (the kernel writes these tensors).
template <bool VEC, int KPL>
__device__ __forceinline__ void load_row(const float* row, int64_t stride, int lane, int K, float* out) {
  if constexpr (VEC) {
#pragma unroll
    for (int c = 0; c < KPL; c += 4) {
      const float4 x = *reinterpret_cast<const float4*>(row + kidx<true>(lane, c));
      out[c] = x.x, out[c + 1] = x.y, out[c + 2] = x.z, out[c + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int c = 0; c < KPL; ++c) {
      const int j = kidx<false>(lane, c);
      out[c] = j < K ? row[j * stride] : 0.f;
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

// One window token's inputs in registers (v: the value of this lane's row, 0 for other lanes).
template <int KPL>
struct Tok {
  float q[KPL], k[KPL];
  float v, g, b;
};

template <typename TIn, int KPL, bool VEC>
__device__ __forceinline__ void load_tok(const ChainVerifyParams& p, int64_t n, int h, int hv, int vcol, int lane,
                                         Tok<KPL>& t) {
  const TIn* q = static_cast<const TIn*>(p.q) + n * p.tok_stride[0] + h * p.K;
  const TIn* k = static_cast<const TIn*>(p.k) + n * p.tok_stride[1] + h * p.K;
  ldg_row<VEC, KPL>(q, lane, p.K, t.q);
  ldg_row<VEC, KPL>(k, lane, p.K, t.k);
  t.v = vcol >= 0 ? ldg1<TIn>(static_cast<const TIn*>(p.v) + n * p.tok_stride[2] + hv * p.V + vcol) : 0.f;
  t.g = __ldg(p.g + n * p.tok_stride[3] + hv);
  t.b = __ldg(p.beta + n * p.tok_stride[4] + hv);
}

// ---- the kernel -----------------------------------------------------------------------------------

// Register cap: minimum resident CTAs (single warps) per SM asked of ptxas for the capped kernel
// variant (__launch_bounds__(32, n): at most 65536 / (32 n) registers per thread; 0: none, only
// the plain __launch_bounds__(32) variant, ptxas' own choice; an explicit n = 1 would make it take
// far more). Chosen where the cap costs no spills (nvcc -Xptxas -v) and raises the warps per SM:
// K = 256 vector path 8 rows 140 -> 128 registers (14 -> 16 warps), 4 rows 96 -> 80 (21 -> 25);
// the non-vector K > 256 path (2 rows) 255 -> 128. ChainVerifyParams::reg_cap = false launches the
// plain variant instead (VLLM_SPECLA_CUDA_REGCAP=0, for A/B timing).
template <int KPL, bool VEC, int BV>
constexpr int min_blocks() {
  if (!VEC && KPL >= 16) return 16;
  if (VEC && KPL == 8) return BV == 8 ? 16 : 24;
  return 0;
}

// One warp per (value tile of BV rows, value head hv, request row r); KPL key elements per lane
// (K <= 32 * KPL). See the header comment for the steps.
template <typename TIn, int KPL, bool VEC, int BV>
__device__ __forceinline__ void chain_verify_body(const ChainVerifyParams& p) {
  constexpr int NP = BV + 2;          // reduced pairs: (M k, M q) per row, then:
  constexpr int kNorm = BV;           //   (|k|^2, |q|^2)
  constexpr int kDot = BV + 1;        //   (k.q, 0)
  constexpr int kRep = rs_rep_mask<NP>();
  constexpr bool kPrefetch = KPL < 16;  // K > 256: the tile and q/k leave no room for the next token
  static_assert(rs_layout_ok<NP>(), "reduce-scatter layout");
  static_assert(32 % BV == 0, "BV must divide 32");
  const int K = p.K, V = p.V, H = p.H, HV = p.HV;
  const int lane = threadIdx.x;
  const int vt0 = blockIdx.x * BV;
  const int hv = blockIdx.y;
  const int r = blockIdx.z;
  const int h = hv / (HV / H);
  const int rows = min(BV, V - vt0);
  // the value row whose v~ / o this lane computes after the reduce-scatter (-1: none); one of the
  // lanes holding a row (all-reduce bits clear) stores its o and v~
  const int mp = rs_pair<NP>(lane);
  const int myrow = mp >= 0 && mp < rows ? mp : -1;
  const bool row_writer = myrow >= 0 && (lane & kRep) == 0;
  const int vcol = myrow >= 0 ? vt0 + myrow : -1;

  // per-row indices: independent loads, all in flight together
  const int64_t slot = p.slots[r];
  const int64_t bos = p.cu_seqlens[r], eos = p.cu_seqlens[r + 1];
  int64_t np = p.pending_len != nullptr ? p.pending_len[r] : 0;
  const int64_t rb = p.read_bank != nullptr ? p.read_bank[r] : 0;  // non-null with pending_len
  const bool record = p.write_bank != nullptr;
  const int64_t wb = record ? p.write_bank[r] : 0;
  if (np > p.Tmax) np = p.Tmax;

  // first window token's inputs, then the state tile: every load issued before the first use
  Tok<KPL> nx;
#pragma unroll
  for (int c = 0; c < KPL; ++c) nx.q[c] = nx.k[c] = 0.f;
  nx.v = nx.g = nx.b = 0.f;
  if (bos < eos) load_tok<TIn, KPL, VEC>(p, bos, h, hv, vcol, lane, nx);

  float* const st = p.state + slot * p.st_stride[0] + hv * p.st_stride[1];
  float m[BV][KPL];
#pragma unroll
  for (int vi = 0; vi < BV; ++vi)  // rows past V re-read row V - 1 (valid memory), zeroed below
    load_row<VEC, KPL>(st + min(vt0 + vi, V - 1) * p.st_stride[2], p.st_stride[3], lane, K, m[vi]);
#pragma unroll
  for (int vi = 0; vi < BV; ++vi) {
    if (vi >= rows) {
#pragma unroll
      for (int c = 0; c < KPL; ++c) m[vi][c] = 0.f;
    }
  }

  // fused deferred commit: fold the pending factors of bank read_bank, write S_0 once
  if (np > 0) {
    const float* bkp = p.bank_k + slot * p.bk_stride[0] + rb * p.bk_stride[1] + h * p.bk_stride[3];
    const float* bvp = p.bank_v + slot * p.bv_stride[0] + rb * p.bv_stride[1] + hv * p.bv_stride[3];
    const float* bgp = p.bank_g + slot * p.bg_stride[0] + rb * p.bg_stride[1] + hv * p.bg_stride[3];
    constexpr int UPC = 32 / BV;  // factors per chunk: lane l holds (factor u0 + l / BV, row l % BV)
    const int lu = lane / BV, lr = lane % BV;
    float kn[KPL];
    load_row<VEC, KPL>(bkp, p.bk_stride[4], lane, K, kn);
    for (int64_t u0 = 0; u0 < np; u0 += UPC) {
      const int64_t ul = u0 + lu;
      const float pv = ul < np && lr < rows ? bvp[ul * p.bv_stride[2] + (vt0 + lr) * p.bv_stride[4]] : 0.f;
      const float pg = ul < np ? bgp[ul * p.bg_stride[2]] : 0.f;
      const int cnt = np - u0 < UPC ? static_cast<int>(np - u0) : UPC;
      for (int j = 0; j < cnt; ++j) {
        float kc[KPL];
#pragma unroll
        for (int c = 0; c < KPL; ++c) kc[c] = kn[c];
        if (u0 + j + 1 < np) load_row<VEC, KPL>(bkp + (u0 + j + 1) * p.bk_stride[2], p.bk_stride[4], lane, K, kn);
        const float eg = __expf(__shfl_sync(kFull, pg, j * BV));
#pragma unroll
        for (int vi = 0; vi < BV; ++vi) {
          const float vv = __shfl_sync(kFull, pv, j * BV + vi);
#pragma unroll
          for (int c = 0; c < KPL; ++c) m[vi][c] = fmaf(kc[c], vv, eg * m[vi][c]);
        }
      }
    }
    if (!p.write_final_state) {
#pragma unroll
      for (int vi = 0; vi < BV; ++vi)
        if (vi < rows) store_row<VEC, KPL>(st + (vt0 + vi) * p.st_stride[2], p.st_stride[3], lane, K, m[vi]);
    }
  }

  // the window, state tile in registers
  const bool g_writer = record && blockIdx.x == 0 && lane == 0;
  const bool k_writer = record && blockIdx.x == 0 && hv % (HV / H) == 0;
  for (int64_t n = bos; n < eos; ++n) {
    const int64_t t = n - bos;
    if constexpr (!kPrefetch) {
      if (n > bos) load_tok<TIn, KPL, VEC>(p, n, h, hv, vcol, lane, nx);
    }
    const Tok<KPL> cur = nx;
    if constexpr (kPrefetch) {
      if (n + 1 < eos) load_tok<TIn, KPL, VEC>(p, n + 1, h, hv, vcol, lane, nx);  // next token
    }

    // partial sums of this lane's keys, then one batched reduction
    float2 a[NP];
#pragma unroll
    for (int vi = 0; vi < BV; ++vi) {
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int c = 0; c < KPL; ++c) {
        dk = fmaf(m[vi][c], cur.k[c], dk);
        dq = fmaf(m[vi][c], cur.q[c], dq);
      }
      a[vi] = make_float2(dk, dq);
    }
    {
      float sk = 0.f, sq = 0.f, kq = 0.f;
#pragma unroll
      for (int c = 0; c < KPL; ++c) {
        sk = fmaf(cur.k[c], cur.k[c], sk);
        sq = fmaf(cur.q[c], cur.q[c], sq);
        kq = fmaf(cur.k[c], cur.q[c], kq);
      }
      a[kNorm] = make_float2(sk, sq);
      a[kDot] = make_float2(kq, 0.f);
    }
    rs_step<NP, NP, 16>(a, lane);  // a[0]: the pair rs_pair(lane), summed over the warp

    const float nk = __shfl_sync(kFull, a[0].x, rs_owner<NP>(kNorm));
    const float nq = __shfl_sync(kFull, a[0].y, rs_owner<NP>(kNorm));
    const float dot = __shfl_sync(kFull, a[0].x, rs_owner<NP>(kDot));
    float rk = 1.f, rq = 1.f;
    if (p.use_qk_l2norm) {
      rk = rsqrtf(nk + kEps);
      rq = rsqrtf(nq + kEps);
    }
    rq *= p.scale;
    const float e = __expf(cur.g);
    // this lane's row (garbage-free zeros on lanes without one): v~ and o
    const float vt = cur.b * (cur.v - e * (a[0].x * rk));
    const float ov = fmaf(vt, dot * rk * rq, e * (a[0].y * rq));

    float kh[KPL];  // k^ = l2norm(k)
#pragma unroll
    for (int c = 0; c < KPL; ++c) kh[c] = cur.k[c] * rk;
#pragma unroll
    for (int vi = 0; vi < BV; ++vi) {
      const float w = __shfl_sync(kFull, vt, rs_owner<NP>(vi));  // v~ of row vi
#pragma unroll
      for (int c = 0; c < KPL; ++c) m[vi][c] = fmaf(w, kh[c], e * m[vi][c]);
    }

    if (row_writer) {
      p.o[(n * HV + hv) * V + vcol] = ov;
      if (record && t < p.Tmax)
        p.bank_v[slot * p.bv_stride[0] + wb * p.bv_stride[1] + t * p.bv_stride[2] + hv * p.bv_stride[3] +
                 vcol * p.bv_stride[4]] = vt;
    }
    // k^ and g factors: one writer per element (V-tile 0; k^ by the first value head of its group)
    if (record && t < p.Tmax) {
      if (g_writer)
        p.bank_g[slot * p.bg_stride[0] + wb * p.bg_stride[1] + t * p.bg_stride[2] + hv * p.bg_stride[3]] = cur.g;
      if (k_writer)
        store_row<VEC, KPL>(p.bank_k + slot * p.bk_stride[0] + wb * p.bk_stride[1] + t * p.bk_stride[2] +
                                h * p.bk_stride[3],
                            p.bk_stride[4], lane, K, kh);
    }
  }
  if (p.write_final_state) {
#pragma unroll
    for (int vi = 0; vi < BV; ++vi)
      if (vi < rows) store_row<VEC, KPL>(st + (vt0 + vi) * p.st_stride[2], p.st_stride[3], lane, K, m[vi]);
  }
}

template <typename TIn, int KPL, bool VEC, int BV>
__global__ void __launch_bounds__(32) chain_verify_kernel(const ChainVerifyParams p) {
  pdl_enter();
  chain_verify_body<TIn, KPL, VEC, BV>(p);
}

template <typename TIn, int KPL, bool VEC, int BV, int MINB>
__global__ void __launch_bounds__(32, MINB) chain_verify_kernel_capped(const ChainVerifyParams p) {
  pdl_enter();
  chain_verify_body<TIn, KPL, VEC, BV>(p);
}

#ifndef __CUDACC_RTC__  // host code (NVRTC compiles the kernels only: csrc/cuda/nvrtc_check.py --chain)
template <typename TIn, int KPL, bool VEC, int BV>
cudaError_t launch(const ChainVerifyParams& p, cudaStream_t stream) {
  const dim3 grid((p.V + BV - 1) / BV, p.HV, p.R);
  constexpr int kMinB = min_blocks<KPL, VEC, BV>();
  if constexpr (kMinB > 0) {
    if (p.reg_cap)
      return launch_pdl(chain_verify_kernel_capped<TIn, KPL, VEC, BV, kMinB>, grid, dim3(32), 0, stream, p.pdl, p);
  }
  return launch_pdl(chain_verify_kernel<TIn, KPL, VEC, BV>, grid, dim3(32), 0, stream, p.pdl, p);
}
#endif  // !__CUDACC_RTC__

// ---- small-batch variant: row-group layout ----------------------------------------------------------
// lane = (row group rg = lane / LPR, sub-lane s = lane % LPR); the warp's BV = (32 / LPR) * RPL value
// rows are rg * RPL + j (j < RPL), and lane s holds the same KPL = K / LPR key elements of each of
// its RPL rows: key pieces of PW consecutive keys, piece i of the lane at key (i * LPR + s) * PW
// (rg_key), so the LPR lanes of a row read LPR * 4 * PW contiguous bytes per piece (state, banks:
// PW / 4 16-byte loads per piece; q / k from shared memory, or global in the AR body). PW = 4 in the
// one-ahead and AR bodies (session 21: whole lines per warp access), 8 in the ring body. Every row group holds the same keys, so q and k are
// needed on KPL elements per lane only.

// Asynchronous global -> shared copies (cp.async: no registers; the copy lands while the warp
// computes): 16 bytes .cg (L2 only), 4 bytes .ca. The host emulation (tmp_cv3/emu) defines
// VLLM_SPECLA_HOST_EMU and models them (destination poisoned at issue, written by the wait that
// covers its group); any other host compile copies at once.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#ifdef __CUDA_ARCH__
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#elif defined(VLLM_SPECLA_HOST_EMU)
  emu_cp_async(smem, gmem, 16);
#else
  *reinterpret_cast<float4*>(smem) = *reinterpret_cast<const float4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
#ifdef __CUDA_ARCH__
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
#elif defined(VLLM_SPECLA_HOST_EMU)
  emu_cp_async(smem, gmem, 4);
#else
  *reinterpret_cast<unsigned*>(smem) = *reinterpret_cast<const unsigned*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(VLLM_SPECLA_HOST_EMU)
  emu_cp_async_commit();
#endif
}
// wait until at most N committed groups (the newest) of this lane are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#elif defined(VLLM_SPECLA_HOST_EMU)
  emu_cp_async_wait(N);
#endif
}

// Key index of a lane's c-th element (sub-lane s of a row with LPR lanes).
// PW: keys per piece, 8 (every kernel before session 21; the sb kernel) or 4 (the row-group kernels' session-21 A/B).
template <int LPR, int PW = 8>
__device__ __forceinline__ int rg_key(int s, int c) {
  static_assert(PW == 4 || PW == 8, "piece width");
  return ((c / PW) * LPR + s) * PW + (c % PW);
}
// rg_key(s, c) - rg_key(s, 0): a compile-time offset in unrolled loops, so a lane's accesses of one row share one
// address (row + s * PW) and differ by immediate offsets
template <int LPR, int PW = 8>
__device__ __forceinline__ constexpr int rg_off(int c) {
  return (c / PW) * LPR * PW + (c % PW);
}

// KPL fp32 keys of a row (unit key stride, 16-byte aligned row start; global or shared memory).
template <int LPR, int KPL, int PW = 8>
__device__ __forceinline__ void rg_load_row(const float* row, int s, float* out) {
  row += static_cast<int64_t>(s) * PW;  // (64-bit: the offsets below stay immediates)
#pragma unroll
  for (int c = 0; c < KPL; c += 4) {
    const float4 x = *reinterpret_cast<const float4*>(row + rg_off<LPR, PW>(c));
    out[c] = x.x, out[c + 1] = x.y, out[c + 2] = x.z, out[c + 3] = x.w;
  }
}

template <int LPR, int KPL, int PW = 8>
__device__ __forceinline__ void rg_store_row(float* row, int s, const float* in) {
  row += static_cast<int64_t>(s) * PW;  // (64-bit: the offsets below stay immediates)
#pragma unroll
  for (int c = 0; c < KPL; c += 4)
    *reinterpret_cast<float4*>(row + rg_off<LPR, PW>(c)) = make_float4(in[c], in[c + 1], in[c + 2], in[c + 3]);
}

// KPL keys of a q / k row staged in shared memory (TIn elements), widened to fp32.
template <typename TIn, int LPR, int KPL, int PW = 8>
__device__ __forceinline__ void rg_smem_row(const TIn* row, int s, float* out) {
  row += static_cast<int64_t>(s) * PW;  // (64-bit: the offsets below stay immediates)
  if constexpr (PW == 4) {  // one 16-byte (fp32) or 8-byte (bf16) load per piece
#pragma unroll
    for (int c = 0; c < KPL; c += 4) {
      const TIn* pc = row + rg_off<LPR, 4>(c);
      if constexpr (sizeof(TIn) == 4) {
        const float4 a = *reinterpret_cast<const float4*>(pc);
        out[c] = a.x, out[c + 1] = a.y, out[c + 2] = a.z, out[c + 3] = a.w;
      } else {
        const uint2 raw = *reinterpret_cast<const uint2*>(pc);
        out[c] = __uint_as_float(raw.x << 16), out[c + 1] = __uint_as_float(raw.x & 0xffff0000u);
        out[c + 2] = __uint_as_float(raw.y << 16), out[c + 3] = __uint_as_float(raw.y & 0xffff0000u);
      }
    }
  } else {
#pragma unroll
    for (int c = 0; c < KPL; c += 8) {
      const TIn* pc = row + rg_off<LPR>(c);
      if constexpr (sizeof(TIn) == 4) {
        const float4 a = *reinterpret_cast<const float4*>(pc);
        const float4 b = *reinterpret_cast<const float4*>(pc + 4);
        out[c] = a.x, out[c + 1] = a.y, out[c + 2] = a.z, out[c + 3] = a.w;
        out[c + 4] = b.x, out[c + 5] = b.y, out[c + 6] = b.z, out[c + 7] = b.w;
      } else {
        // 8 bf16 in one 16-byte load; bf16 -> fp32 is exact: the 16 bits become the high half
        const uint4 raw = *reinterpret_cast<const uint4*>(pc);
        const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          out[c + 2 * e] = __uint_as_float(w[e] << 16);
          out[c + 2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
        }
      }
    }
  }
}

// one TIn element in shared memory, widened
__device__ __forceinline__ float rg_smem1(const float* x) { return *x; }
__device__ __forceinline__ float rg_smem1(const __nv_bfloat16* x) { return __bfloat162float(*x); }

// token n's q and k rows (head h) -> dst[0], dst[1]: the whole warp issues 16-byte async copies
template <typename TIn, int K>
__device__ __forceinline__ void rg_issue_qk(const ChainVerifyParams& p, int64_t n, int h, int lane, TIn (*dst)[K]) {
  constexpr int EPC = 16 / static_cast<int>(sizeof(TIn));  // elements per 16-byte chunk
  constexpr int NCH = K / EPC;
  const TIn* q = static_cast<const TIn*>(p.q) + n * p.tok_stride[0] + h * K;
  const TIn* k = static_cast<const TIn*>(p.k) + n * p.tok_stride[1] + h * K;
#pragma unroll
  for (int i0 = 0; i0 < NCH; i0 += 32) {
    const int i = i0 + lane;
    if (NCH % 32 == 0 || i < NCH) {
      cp_async16(dst[0] + i * EPC, q + i * EPC);
      cp_async16(dst[1] + i * EPC, k + i * EPC);
    }
  }
}

// One token's per-row scalars (v of the lane's RPL rows as raw bits, ldg_bits; g, beta of the head).
template <int RPL>
struct RgScal {
  unsigned v[RPL];
  float g, b;
};

template <typename TIn, int RPL>
__device__ __forceinline__ void rg_load_scal(const ChainVerifyParams& p, int64_t n, int hv, const int (&vcol)[RPL],
                                             RgScal<RPL>& t) {
  const TIn* v = static_cast<const TIn*>(p.v) + n * p.tok_stride[2] + hv * p.V;
#pragma unroll
  for (int j = 0; j < RPL; ++j) t.v[j] = ldg_bits<TIn>(v + (vcol[j] >= 0 ? vcol[j] : 0));  // rows past V: row 0
  t.g = __ldg(p.g + n * p.tok_stride[3] + hv);
  t.b = __ldg(p.beta + n * p.tok_stride[4] + hv);
}

// Per-warp constants of a row-group CTA.
template <int RPL>
struct RgCtx {
  int s, rg, hv, h;  // sub-lane, row group, value head, its key head
  int vcol[RPL];  // the lane's value rows (-1: past V)
  int64_t slot, wb;
  bool record, g_writer, k_writer;
};

// Fold one factor (k row kc, the lane's v~ values vc, eg = e^g) into the tile: M = e^g M + v~ k^T.
template <int RPL, int KPL>
__device__ __forceinline__ void rg_fold(float (&m)[RPL][KPL], const float (&kc)[KPL], const float (&vc)[RPL],
                                        float eg) {
#pragma unroll
  for (int j = 0; j < RPL; ++j) {
#pragma unroll
    for (int c = 0; c < KPL; ++c) m[j][c] = fmaf(kc[c], vc[j], eg * m[j][c]);
  }
}

// A token's partial sums a[n][NA] (per row: M k, M q; then |k|^2, |q|^2, k.q) -> sum[n], all-reduced over the
// row's LPR lanes by an xor butterfly (every lane of the row ends with bit-identical sums); rk = 1 / |k| and
// rq = scale / |q| (fla's l2norm, eps kEps) when the op normalises q / k, else 1 and scale.
template <int LPR, int N, int NA>
__device__ __forceinline__ void rg_reduce(const ChainVerifyParams& p, const float (&a)[N][NA], float (&sum)[N], float& rk,
                                          float& rq) {
  static_assert(NA == 2 || NA == 4, "accumulator tree");
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (NA == 4)
      sum[i] = (a[i][0] + a[i][1]) + (a[i][2] + a[i][3]);
    else
      sum[i] = a[i][0] + a[i][1];
  }
#pragma unroll
  for (int off = LPR / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) sum[i] += __shfl_xor_sync(kFull, sum[i], off);
  }
  rk = 1.f, rq = 1.f;
  if (p.use_qk_l2norm) {
    rk = rsqrtf(sum[N - 3] + kEps);
    rq = rsqrtf(sum[N - 2] + kEps);
  }
  rq *= p.scale;
}

// A token's stores, when live (the row holds the token; chain_verify_rg_ar computes an empty row's first token on a
// clamped index and discards it): o and v~ by one lane per row, g and k^ by the factor banks' writers. kh(c): the
// lane's normalised key c, asked only by the k^ writers (rg_token, rg_token_raw).
template <int LPR, int RPL, int KPL, int PW, typename KH>
__device__ __forceinline__ void rg_token_stores(const ChainVerifyParams& p, const RgCtx<RPL>& cx, int64_t n, int64_t t,
                                                const float (&vt)[RPL], const float (&ov)[RPL], float g, bool live,
                                                KH kh) {
  const int V = p.V, HV = p.HV;
  if (cx.s == 0 && live) {
#pragma unroll
    for (int j = 0; j < RPL; ++j) {
      if (cx.vcol[j] >= 0) {
        p.o[(n * HV + cx.hv) * V + cx.vcol[j]] = ov[j];
        if (cx.record && t < p.Tmax)
          p.bank_v[cx.slot * p.bv_stride[0] + cx.wb * p.bv_stride[1] + t * p.bv_stride[2] + cx.hv * p.bv_stride[3] +
                   cx.vcol[j] * p.bv_stride[4]] = vt[j];
      }
    }
  }
  if (cx.record && live && t < p.Tmax) {
    if (cx.g_writer)
      p.bank_g[cx.slot * p.bg_stride[0] + cx.wb * p.bg_stride[1] + t * p.bg_stride[2] + cx.hv * p.bg_stride[3]] = g;
    if (cx.k_writer) {
      float k[KPL];
#pragma unroll
      for (int c = 0; c < KPL; ++c) k[c] = kh(c);
      rg_store_row<LPR, KPL, PW>(p.bank_k + cx.slot * p.bk_stride[0] + cx.wb * p.bk_stride[1] + t * p.bk_stride[2] +
                                     cx.h * p.bk_stride[3],
                                 cx.s, k);
    }
  }
}

// One window token n (t = n - bos) on the tile m: partial sums, butterfly, v~ and o, the tile update, the stores (o
// and factors only when live: false for the AR body's first token of an empty row, computed on a clamped index and
// discarded). The lane's KPL keys of q / k in fp32 come from qf(c) / kf(c) where the partial sums read them, and from
// ku(c) where the update and k^ read k; v: the lane's RPL rows.
template <int LPR, int RPL, int KPL, int PW, typename QF, typename KF, typename KU>
__device__ __forceinline__ void rg_token_core(const ChainVerifyParams& p, const RgCtx<RPL>& cx, int64_t n, int64_t t,
                                              QF qf, KF kf, KU ku, const float (&v)[RPL], float g, float b,
                                              float (&m)[RPL][KPL], bool live) {
  constexpr int NA = 4;  // independent accumulators per partial sum
  static_assert(KPL % NA == 0, "accumulators");
  // partial sums over the lane's keys, NA accumulators each: (M k, M q) per row, |k|^2, |q|^2, k.q
  float a[2 * RPL + 3][NA];
#pragma unroll
  for (int i = 0; i < 2 * RPL + 3; ++i) {
#pragma unroll
    for (int x = 0; x < NA; ++x) a[i][x] = 0.f;
  }
#pragma unroll
  for (int c = 0; c < KPL; ++c) {
    const int x = c % NA;
    const float qc = qf(c), kc = kf(c);
#pragma unroll
    for (int j = 0; j < RPL; ++j) {
      a[2 * j][x] = fmaf(m[j][c], kc, a[2 * j][x]);
      a[2 * j + 1][x] = fmaf(m[j][c], qc, a[2 * j + 1][x]);
    }
    a[2 * RPL][x] = fmaf(kc, kc, a[2 * RPL][x]);
    a[2 * RPL + 1][x] = fmaf(qc, qc, a[2 * RPL + 1][x]);
    a[2 * RPL + 2][x] = fmaf(kc, qc, a[2 * RPL + 2][x]);
  }
  float sum[2 * RPL + 3], rk, rq;
  rg_reduce<LPR>(p, a, sum, rk, rq);
  const float e = __expf(g);
  const float dot = sum[2 * RPL + 2] * rk * rq;
  float vt[RPL], ov[RPL];
#pragma unroll
  for (int j = 0; j < RPL; ++j) {
    vt[j] = b * (v[j] - e * (sum[2 * j] * rk));
    ov[j] = fmaf(vt[j], dot, e * (sum[2 * j + 1] * rq));
  }
  float kh[KPL];  // k^ = l2norm(k)
#pragma unroll
  for (int c = 0; c < KPL; ++c) kh[c] = ku(c) * rk;
#pragma unroll
  for (int j = 0; j < RPL; ++j) {
#pragma unroll
    for (int c = 0; c < KPL; ++c) m[j][c] = fmaf(vt[j], kh[c], e * m[j][c]);
  }
  rg_token_stores<LPR, RPL, KPL, PW>(p, cx, n, t, vt, ov, g, live, [&](int c) { return kh[c]; });
}

// rg_token_core on q / k held in fp32 registers.
template <int LPR, int RPL, int KPL, int PW = 8>
__device__ __forceinline__ void rg_token(const ChainVerifyParams& p, const RgCtx<RPL>& cx, int64_t n, int64_t t,
                                         const float (&q)[KPL], const float (&k)[KPL], const float (&v)[RPL],
                                         float g, float b, float (&m)[RPL][KPL], bool live = true) {
  const auto kf = [&](int c) { return k[c]; };
  rg_token_core<LPR, RPL, KPL, PW>(p, cx, n, t, [&](int c) { return q[c]; }, kf, kf, v, g, b, m, live);
}

// A lane's 4-key piece of a q / k row as loaded (RAW AR body): 4 bf16 (8 bytes) or 4 fp32, widened where read.
template <typename TIn>
struct RgRaw4 {
  using type = uint2;
};
template <>
struct RgRaw4<float> {
  using type = float4;
};

// (OPQ: widened by an opaque instruction, so the compiler cannot reuse an earlier widening of the same key and keep
// it live in between)
template <typename TIn, bool OPQ = false>
__device__ __forceinline__ float rg_raw4_at(const typename RgRaw4<TIn>::type& r, int i) {
  if constexpr (sizeof(TIn) == 4) {
    return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
  } else {
    const unsigned w = i < 2 ? r.x : r.y;
    if constexpr (OPQ) return __uint_as_float(__byte_perm(w, 0u, i % 2 == 0 ? 0x1044 : 0x3244));
    return __uint_as_float(i % 2 == 0 ? w << 16 : w & 0xffff0000u);
  }
}

// rg_token_core on q / k pieces kept as loaded (session 23, the RAW AR body): the same operations in the same order per
// element (bit-identical results), but q / k are widened where each sum or update reads them, k twice (the second
// time opaquely), instead of being held as 2 * KPL fp32 registers across the token: 96 registers at K = 256 (launch
// bounds 32, 20) against the fp32-key AR body's 124.
template <typename TIn, int LPR, int RPL, int KPL>
__device__ __forceinline__ void rg_token_raw(const ChainVerifyParams& p, const RgCtx<RPL>& cx, int64_t n, int64_t t,
                                             const typename RgRaw4<TIn>::type (&qr)[KPL / 4],
                                             const typename RgRaw4<TIn>::type (&kr)[KPL / 4], const float (&v)[RPL],
                                             float g, float b, float (&m)[RPL][KPL], bool live) {
  rg_token_core<LPR, RPL, KPL, 4>(
      p, cx, n, t, [&](int c) { return rg_raw4_at<TIn>(qr[c / 4], c % 4); },
      [&](int c) { return rg_raw4_at<TIn>(kr[c / 4], c % 4); },
      [&](int c) { return rg_raw4_at<TIn, true>(kr[c / 4], c % 4); }, v, g, b, m, live);
}

// The row's per-warp constants and indices (both row-group bodies).
template <int LPR, int RPL>
__device__ __forceinline__ void rg_setup(const ChainVerifyParams& p, RgCtx<RPL>& cx, int64_t& bos, int64_t& eos,
                                         int64_t& np, int64_t& rb) {
  constexpr int BV = (32 / LPR) * RPL;
  const int lane = threadIdx.x;
  cx.s = lane % LPR;
  cx.rg = lane / LPR;
  cx.hv = blockIdx.y;
  // key head of the value head: no integer division (two, ~40 dependent instructions ahead of the q / k addresses) when
  // HV == H, as in both GDN-1.3B head shapes (session 23)
  const int G = p.HV == p.H ? 1 : p.HV / p.H;
  cx.h = G == 1 ? cx.hv : cx.hv / G;
  const int vt0 = blockIdx.x * BV;
  const int r = blockIdx.z;
#pragma unroll
  for (int j = 0; j < RPL; ++j) cx.vcol[j] = vt0 + cx.rg * RPL + j < p.V ? vt0 + cx.rg * RPL + j : -1;
  // per-row indices: independent loads, all in flight together
  cx.slot = p.slots[r];
  bos = p.cu_seqlens[r];
  eos = p.cu_seqlens[r + 1];
  np = p.pending_len != nullptr ? p.pending_len[r] : 0;
  rb = p.read_bank != nullptr ? p.read_bank[r] : 0;  // non-null with pending_len
  cx.record = p.write_bank != nullptr;
  cx.wb = cx.record ? p.write_bank[r] : 0;
  if (np > p.Tmax) np = p.Tmax;
  cx.g_writer = cx.record && blockIdx.x == 0 && lane == 0;
  // k^: V-tile 0 of the first value head of each group, row group 0 (its LPR lanes hold all keys)
  cx.k_writer = cx.record && blockIdx.x == 0 && (G == 1 || cx.hv % G == 0) && cx.rg == 0;
}

// The lane's RPL rows of the state tile (rows past V: zero). PRED (the sb kernel): each row's loads predicated on
// the row being valid, so no select waits on the tile before the first token's work that does not read it (session
// 20, s20b's sampling: 151 of 985 samples on those selects; steps 0.3-0.5 us faster, s20d); else (the row-group
// kernels' one-ahead and ring bodies) rows past V re-read row V - 1 unconditionally and are zeroed after (s20d measured
// one-token AR on the predicated form 0.3 us slower in 3 of 4 small-batch shapes than s20c on this one; the AR body,
// chain_verify_rg_ar, does not zero them at all).
template <int LPR, int RPL, int KPL, bool PRED = false, int PW = 8>
__device__ __forceinline__ void rg_load_tile(const float* st, const ChainVerifyParams& p, const RgCtx<RPL>& cx,
                                             float (&m)[RPL][KPL]) {
  if constexpr (PRED) {
#pragma unroll
    for (int j = 0; j < RPL; ++j) {
      if (cx.vcol[j] >= 0) {
        rg_load_row<LPR, KPL, PW>(st + cx.vcol[j] * p.st_stride[2], cx.s, m[j]);
      } else {
#pragma unroll
        for (int c = 0; c < KPL; ++c) m[j][c] = 0.f;
      }
    }
  } else {
    constexpr int BV = (32 / LPR) * RPL;
    const int vt0 = blockIdx.x * BV;
#pragma unroll
    for (int j = 0; j < RPL; ++j)
      rg_load_row<LPR, KPL, PW>(st + min(vt0 + cx.rg * RPL + j, p.V - 1) * p.st_stride[2], cx.s, m[j]);
#pragma unroll
    for (int j = 0; j < RPL; ++j) {
      if (cx.vcol[j] < 0) {
#pragma unroll
        for (int c = 0; c < KPL; ++c) m[j][c] = 0.f;
      }
    }
  }
}

// The lane's RPL tile rows stored to the state slot (rows past V skipped). With 8-key pieces a warp's 16-byte store
// touches 32 sectors, half each (s21a's sampling of one-token AR at 6x256x512 batch 2 on that form: 110 of 523 samples
// draining the stores at exit, Triton's kernel 19 of 409); with 4-key pieces (PW 4, the row-group kernels' one-ahead
// and AR bodies since session 21) a row's LPR lanes store LPR * 16 contiguous bytes: whole 128-byte lines at LPR 8.
// (Session 21 also measured 8-key pieces with lanes s, s ^ 1 swapping half pieces so each store wrote whole sectors:
// AR 5.9 -> 5.7 us there, but the sb kernel's steps 0.1-0.6 us slower at batch 1 (its BV-8 form went from 214 to 254
// registers); removed.)
template <int LPR, int RPL, int KPL, int PW = 8>
__device__ __forceinline__ void rg_store_tile(float* st, const ChainVerifyParams& p, const RgCtx<RPL>& cx,
                                              const float (&m)[RPL][KPL]) {
#pragma unroll
  for (int j = 0; j < RPL; ++j)
    if (cx.vcol[j] >= 0) rg_store_row<LPR, KPL, PW>(st + cx.vcol[j] * p.st_stride[2], cx.s, m[j]);
}

// One warp per (value tile of BV = (32 / LPR) * RPL rows, value head hv, request row r); K = LPR * KPL
// (16-byte path only: vec_ok). Same steps and writer rules as chain_verify_body, in the row-group
// layout. RG_PREFETCH = 0 variant: q / k of token t+1 are copied to shared memory (cp.async) while
// token t computes, its v / g / beta loaded into registers; pending factors loaded one ahead.
template <typename TIn, int LPR, int RPL, int KPL, int PW>
__device__ __forceinline__ void chain_verify_rg_body(const ChainVerifyParams& p) {
  constexpr int K = LPR * KPL;
  static_assert(32 % LPR == 0 && KPL % 8 == 0, "row-group layout");
  const int lane = threadIdx.x;
  RgCtx<RPL> cx;
  int64_t bos, eos, np, rb;
  rg_setup<LPR, RPL>(p, cx, bos, eos, np, rb);
  const int s = cx.s, hv = cx.hv, h = cx.h;

  // q / k of the window's tokens, double-buffered: token t in qk[t & 1] ([0]: q, [1]: k)
  __shared__ __align__(16) TIn qk[2][2][K];
  if (bos < eos) rg_issue_qk<TIn, K>(p, bos, h, lane, qk[0]);
  cp_async_commit();
  RgScal<RPL> nx;
  if (bos < eos) rg_load_scal<TIn, RPL>(p, bos, hv, cx.vcol, nx);

  float* const st = p.state + cx.slot * p.st_stride[0] + hv * p.st_stride[1];
  float m[RPL][KPL];
  rg_load_tile<LPR, RPL, KPL, false, PW>(st, p, cx, m);

  // fused deferred commit: M = e^{g_u} M + v~_u k_u^T per pending factor; the next factor's k row,
  // v~ values and g are loaded while one is folded
  if (np > 0) {
    const float* bkp = p.bank_k + cx.slot * p.bk_stride[0] + rb * p.bk_stride[1] + h * p.bk_stride[3];
    const float* bvp = p.bank_v + cx.slot * p.bv_stride[0] + rb * p.bv_stride[1] + hv * p.bv_stride[3];
    const float* bgp = p.bank_g + cx.slot * p.bg_stride[0] + rb * p.bg_stride[1] + hv * p.bg_stride[3];
    float kn[KPL], vn[RPL], gn;
    rg_load_row<LPR, KPL, PW>(bkp, s, kn);
#pragma unroll
    for (int j = 0; j < RPL; ++j) vn[j] = cx.vcol[j] >= 0 ? bvp[cx.vcol[j] * p.bv_stride[4]] : 0.f;
    gn = bgp[0];
    for (int64_t u = 0; u < np; ++u) {
      float kc[KPL], vc[RPL];
#pragma unroll
      for (int c = 0; c < KPL; ++c) kc[c] = kn[c];
#pragma unroll
      for (int j = 0; j < RPL; ++j) vc[j] = vn[j];
      const float eg = __expf(gn);
      if (u + 1 < np) {
        rg_load_row<LPR, KPL, PW>(bkp + (u + 1) * p.bk_stride[2], s, kn);
#pragma unroll
        for (int j = 0; j < RPL; ++j)
          vn[j] = cx.vcol[j] >= 0 ? bvp[(u + 1) * p.bv_stride[2] + cx.vcol[j] * p.bv_stride[4]] : 0.f;
        gn = bgp[(u + 1) * p.bg_stride[2]];
      }
      rg_fold<RPL, KPL>(m, kc, vc, eg);
    }
    if (!p.write_final_state) {
      rg_store_tile<LPR, RPL, KPL, PW>(st, p, cx, m);
    }
  }

  for (int64_t n = bos; n < eos; ++n) {
    const int64_t t = n - bos;
    const int cb = static_cast<int>(t & 1);
    __syncwarp();  // every lane is done reading qk[cb ^ 1] (token t - 1)
    if (n + 1 < eos) rg_issue_qk<TIn, K>(p, n + 1, h, lane, qk[cb ^ 1]);
    cp_async_commit();  // (possibly empty) group of token t + 1
    const RgScal<RPL> cur = nx;
    if (n + 1 < eos) rg_load_scal<TIn, RPL>(p, n + 1, hv, cx.vcol, nx);
    cp_async_wait<1>();  // token t's group has landed (this lane's copies) ...
    __syncwarp();        // ... and every lane's
    float q[KPL], k[KPL];
    rg_smem_row<TIn, LPR, KPL, PW>(qk[cb][0], s, q);
    rg_smem_row<TIn, LPR, KPL, PW>(qk[cb][1], s, k);
    float v[RPL];  // widened here, a token after its load (rows past V: 0)
#pragma unroll
    for (int j = 0; j < RPL; ++j) v[j] = cx.vcol[j] >= 0 ? widen_bits<TIn>(cur.v[j]) : 0.f;
    rg_token<LPR, RPL, KPL, PW>(p, cx, n, t, q, k, v, cur.g, cur.b, m);
  }
  if (p.write_final_state) {
    rg_store_tile<LPR, RPL, KPL, PW>(st, p, cx, m);
  }
}

// Row-group AR body (session 21; the one-ahead body's work without its pipeline): launched for one-token rows
// without pending factors (1 <= p.N <= p.R, no pending_len; p.rg_ar), 4-key lane pieces. The state tile and the token's
// q / k pieces, v, g, beta are loaded straight into registers, all in flight together (no shared-memory staging,
// cp.async groups or warp syncs). Rows holding more tokens (N <= R does not forbid it) run the same loop, a token
// at a time. Same contract and writers as chain_verify_rg_body.
template <typename TIn, int LPR, int KPL>
__device__ __forceinline__ void rg_gmem_row4(const TIn* row, int s, float* out) {
  row += static_cast<int64_t>(s) * 4;
#pragma unroll
  for (int c = 0; c < KPL; c += 4) {
    const TIn* pc = row + rg_off<LPR, 4>(c);
    if constexpr (sizeof(TIn) == 4) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(pc));
      out[c] = a.x, out[c + 1] = a.y, out[c + 2] = a.z, out[c + 3] = a.w;
    } else {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(pc));
      out[c] = __uint_as_float(raw.x << 16), out[c + 1] = __uint_as_float(raw.x & 0xffff0000u);
      out[c + 2] = __uint_as_float(raw.y << 16), out[c + 3] = __uint_as_float(raw.y & 0xffff0000u);
    }
  }
}

// REC: factors recorded (p.write_bank given); the plain AR step (REC false) compiles without the factor-bank path
// (s21e: 856 SASS lines against Triton's 648, 42 instruction-fetch stall samples against 17 at batch 1; offline,
// without it: 672 lines, 128 registers instead of 154).
template <typename TIn, int LPR, int RPL, int KPL, bool REC, bool RAW>
__device__ __forceinline__ void chain_verify_rg_ar(const ChainVerifyParams& p) {
  constexpr int K = LPR * KPL;
  static_assert(32 % LPR == 0 && KPL % 4 == 0, "row-group layout");
  RgCtx<RPL> cx;
  int64_t bos, eos, np, rb;
  rg_setup<LPR, RPL>(p, cx, bos, eos, np, rb);
  if constexpr (!REC) cx.record = cx.g_writer = cx.k_writer = false;  // (the launcher's p.write_bank == nullptr)
  float* const st = p.state + cx.slot * p.st_stride[0] + cx.hv * p.st_stride[1];
  // the lane's tile rows; rows past V hold row V - 1 (not zeroed: a row's values feed only its own sums, butterflied
  // over its own LPR lanes, and its outputs are never stored; s22a's sampling: the zeroing selects were the AR body's
  // largest waits, each blocking the warp on the tile's loads before the token's q / k work)
  constexpr int BV = (32 / LPR) * RPL;
  float m[RPL][KPL];
#pragma unroll
  for (int j = 0; j < RPL; ++j)
    rg_load_row<LPR, KPL, 4>(st + min(static_cast<int>(blockIdx.x) * BV + cx.rg * RPL + j, p.V - 1) * p.st_stride[2],
                             cx.s, m[j]);
  // The row's first token is computed before the row's bounds are known, without a branch: its index clamped to
  // the batch's tokens (the launcher requires p.N >= 1), its o / factor stores and the tile's store predicated on
  // the row holding it (an empty row's state is not written back), so its loads and address arithmetic overlap the
  // cu_seqlens / slot / tile loads instead of waiting behind the loop test (s22a's sampling: that test was the
  // second-largest wait, and the compiler sinks loads used only in the loop below it). Later tokens of a row
  // (N <= R allows two-token rows) run after it, a token at a time.
  const TIn* const qh = static_cast<const TIn*>(p.q) + cx.h * K;
  const TIn* const kh = static_cast<const TIn*>(p.k) + cx.h * K;
  const bool live = bos < eos;
  for (int64_t n = bos < p.N ? bos : p.N - 1;; ++n) {
    float v[RPL];
    RgScal<RPL> sc;
    if constexpr (RAW) {
      using R4 = typename RgRaw4<TIn>::type;
      R4 qr[KPL / 4], kr[KPL / 4];
      const R4* const qp = reinterpret_cast<const R4*>(qh + n * p.tok_stride[0] + cx.s * 4);
      const R4* const kp = reinterpret_cast<const R4*>(kh + n * p.tok_stride[1] + cx.s * 4);
#pragma unroll
      for (int c = 0; c < KPL; c += 4) qr[c / 4] = __ldg(qp + rg_off<LPR, 4>(c) / 4), kr[c / 4] = __ldg(kp + rg_off<LPR, 4>(c) / 4);
      rg_load_scal<TIn, RPL>(p, n, cx.hv, cx.vcol, sc);
#pragma unroll
      for (int j = 0; j < RPL; ++j) v[j] = widen_bits<TIn>(sc.v[j]);
      rg_token_raw<TIn, LPR, RPL, KPL>(p, cx, n, n - bos, qr, kr, v, sc.g, sc.b, m, live);
    } else {
      float q[KPL], k[KPL];
      rg_gmem_row4<TIn, LPR, KPL>(qh + n * p.tok_stride[0], cx.s, q);
      rg_gmem_row4<TIn, LPR, KPL>(kh + n * p.tok_stride[1], cx.s, k);
      rg_load_scal<TIn, RPL>(p, n, cx.hv, cx.vcol, sc);
#pragma unroll
      for (int j = 0; j < RPL; ++j) v[j] = widen_bits<TIn>(sc.v[j]);  // rows past V: row 0's (unused, as above)
      rg_token<LPR, RPL, KPL, 4>(p, cx, n, n - bos, q, k, v, sc.g, sc.b, m, live);
    }
    if (!live || n + 1 >= eos) break;  // (!live: an empty row, also one past the batch's tokens)
  }
  if (p.write_final_state && live) rg_store_tile<LPR, RPL, KPL, 4>(st, p, cx, m);
}

template <typename TIn, int LPR, int RPL, int KPL, bool REC>
__global__ void __launch_bounds__(32, 12) chain_verify_rg_ar_kernel(const ChainVerifyParams p) {
  pdl_enter();
  chain_verify_rg_ar<TIn, LPR, RPL, KPL, REC, false>(p);
}

// (plain AR only; at most 96 registers at K = 256, 20 CTAs per SM on the H200 (Nsight Compute): 127 unbounded)
template <typename TIn, int LPR, int RPL, int KPL>
__global__ void __launch_bounds__(32, 20) chain_verify_rg_ar_raw_kernel(const ChainVerifyParams p) {
  pdl_enter();
  chain_verify_rg_ar<TIn, LPR, RPL, KPL, false, true>(p);
}

template <bool B>
struct RgTok {  // issue(): the item is known to be a window token
  static constexpr bool value = B;
};

// Prefetch ring of the RG_PREFETCH = 1 body: NB stages; stage i % NB holds item i of the row's
// sequence (pending factors u < np, then window tokens): RB bytes of key rows (token: q then k,
// TIn; factor: k^, fp32) and BV + 2 scalar words (token: v of the tile's rows (TIn), g, beta;
// factor: v~ of the tile's rows, g).
template <typename TIn, int K>
__host__ __device__ constexpr int rg_row_bytes() {
  return 2 * K * static_cast<int>(sizeof(TIn)) > 4 * K ? 2 * K * static_cast<int>(sizeof(TIn)) : 4 * K;
}
// NB: 16 KiB of key rows where the state tile is 64 registers per lane (228-248 registers: 8
// warps per SM, 8 x (17 + 1) KiB of shared memory), 8 KiB where it is 8, 16 or 32 (63-166
// registers; 8.0-8.8 KiB per CTA leaves room for 23-25 CTAs in 228 KiB), at most 16
// stages: bf16 K = 256: 16 stages for BV 8, 8 for BV 4, 2, 1; fp32 K = 256: 8 / 4; K = 128: 16
// (bf16), 8 (fp32). The registers and shared memory per CTA are ptxas' (nvcc -Xptxas -v, sm_90a).
template <typename TIn, int K, int TILE>
__host__ __device__ constexpr int rg_stages() {
  const int nb = (TILE >= 64 ? 16384 : 8192) / rg_row_bytes<TIn, K>();
  return nb < 16 ? nb : 16;
}

// RG_PREFETCH = 1 variant: the row's items (pending factors, then window tokens) stream through a
// ring of NB shared-memory stages filled by cp.async, NB - 1 items ahead: item 0, the state tile,
// then items 1 .. NB - 2 are issued at kernel start (the whole window and all pending factors when
// np + T <= NB - 1), item i + NB - 1 when item i starts. One commit group per item (empty past the
// row's last item), so cp.async.wait_group NB - 2 at item i means item i has landed for this lane;
// the __syncwarp after it makes every lane's copies visible and guarantees every lane is done with
// item i - 1, whose stage the next issue refills.
template <typename TIn, int LPR, int RPL, int KPL, int PW>
__device__ __forceinline__ void chain_verify_rg_body_pf(const ChainVerifyParams& p) {
  constexpr int BV = (32 / LPR) * RPL;
  constexpr int K = LPR * KPL;
  constexpr int RB = rg_row_bytes<TIn, K>();
  constexpr int NB = rg_stages<TIn, K, RPL * KPL>();
  constexpr int NW = BV + 2;                                   // scalar words per stage
  constexpr int QKC = 2 * K * static_cast<int>(sizeof(TIn)) / 16;  // 16-byte chunks of a token's q and k
  constexpr int KRC = 4 * K / 16;                              // ... of a factor's k^ row
  static_assert(32 % LPR == 0 && KPL % 8 == 0, "row-group layout");
  static_assert(NB >= 4 && (NB & (NB - 1)) == 0, "prefetch ring");
  static_assert(QKC % 32 == 0 && KRC % 32 == 0 && BV <= 30, "copy split");
  const int V = p.V;
  const int lane = threadIdx.x;
  RgCtx<RPL> cx;
  int64_t bos, eos, np64, rb;
  rg_setup<LPR, RPL>(p, cx, bos, eos, np64, rb);
  const int s = cx.s, hv = cx.hv, h = cx.h;
  const int vt0 = blockIdx.x * BV;
  const int np = static_cast<int>(np64);
  const int T = static_cast<int>(eos - bos);
  const int nit = np + T;

  __shared__ __align__(16) unsigned char rows[NB][RB];
  __shared__ __align__(16) float sc[NB][NW];
  // bf16 v: lane l < ceil(BV / 2) copies rows (2l, 2l + 1) of the tile with one 4-byte copy when
  // the pair is inside the tile and V and 4-byte aligned for every token, else with plain loads
  // (BV = 1: lane 0, row 0 only)
  const bool vpair = sizeof(TIn) == 2 && 2 * lane + 1 < BV && vt0 + 2 * lane + 1 < V && (p.tok_stride[2] & 1) == 0 &&
                     (reinterpret_cast<uintptr_t>(static_cast<const TIn*>(p.v) + hv * V + vt0 + 2 * lane) & 3) == 0;

  // item i -> stage i % NB (nothing past the last item), then the item's commit group; TOK: i >= np
  // is known (window loop)
  auto issue = [&](int i, auto tok) {
    if (i < nit) {
      const int sg = i & (NB - 1);
      if (!decltype(tok)::value && i < np) {  // pending factor i: k^ row, v~ of the tile's rows, g
        const float* kr = p.bank_k + cx.slot * p.bk_stride[0] + rb * p.bk_stride[1] + i * p.bk_stride[2] +
                          h * p.bk_stride[3];
#pragma unroll
        for (int j = 0; j < KRC / 32; ++j) cp_async16(rows[sg] + 16 * (32 * j + lane), kr + 4 * (32 * j + lane));
        if (lane < BV) {
          if (vt0 + lane < V)
            cp_async4(&sc[sg][lane], p.bank_v + cx.slot * p.bv_stride[0] + rb * p.bv_stride[1] +
                                         i * p.bv_stride[2] + hv * p.bv_stride[3] + (vt0 + lane) * p.bv_stride[4]);
        } else if (lane == 30) {
          cp_async4(&sc[sg][BV], p.bank_g + cx.slot * p.bg_stride[0] + rb * p.bg_stride[1] + i * p.bg_stride[2] +
                                     hv * p.bg_stride[3]);
        }
      } else {  // window token n: q, k rows, v of the tile's rows, g, beta
        const int64_t n = bos + (i - np);
        const char* qs = reinterpret_cast<const char*>(static_cast<const TIn*>(p.q) + n * p.tok_stride[0] + h * K);
        const char* ks = reinterpret_cast<const char*>(static_cast<const TIn*>(p.k) + n * p.tok_stride[1] + h * K);
#pragma unroll
        for (int j = 0; j < QKC / 32; ++j) {
          const int x = 32 * j + lane;  // chunks [0, QKC / 2): q, then k
          cp_async16(rows[sg] + 16 * x, x < QKC / 2 ? qs + 16 * x : ks + 16 * (x - QKC / 2));
        }
        const TIn* vr = static_cast<const TIn*>(p.v) + n * p.tok_stride[2] + hv * V + vt0;
        if constexpr (sizeof(TIn) == 4) {
          if (lane < BV && vt0 + lane < V) cp_async4(&sc[sg][lane], vr + lane);
        } else {
          if (lane < (BV + 1) / 2) {
            TIn* d = reinterpret_cast<TIn*>(sc[sg]) + 2 * lane;
            if (vpair) {
              cp_async4(d, vr + 2 * lane);
            } else {
              if (vt0 + 2 * lane < V) d[0] = __ldg(vr + 2 * lane);
              if (2 * lane + 1 < BV && vt0 + 2 * lane + 1 < V) d[1] = __ldg(vr + 2 * lane + 1);
            }
          }
        }
        if (lane == 30) cp_async4(&sc[sg][BV], p.g + n * p.tok_stride[3] + hv);
        if (lane == 31) cp_async4(&sc[sg][BV + 1], p.beta + n * p.tok_stride[4] + hv);
      }
    }
    cp_async_commit();
  };

  // item 0, the state tile, items 1 .. NB - 2: every load in flight before the first use
  issue(0, RgTok<false>{});
  float* const st = p.state + cx.slot * p.st_stride[0] + hv * p.st_stride[1];
  float m[RPL][KPL];
  rg_load_tile<LPR, RPL, KPL, false, PW>(st, p, cx, m);
#pragma unroll 1
  for (int i = 1; i < NB - 1; ++i) issue(i, RgTok<false>{});

  // fused deferred commit: M = e^{g_u} M + v~_u k_u^T per pending factor (items 0 .. np - 1)
  if (np > 0) {
    for (int u = 0; u < np; ++u) {
      cp_async_wait<NB - 2>();  // item u has landed (this lane's copies) ...
      __syncwarp();             // ... every lane's; every lane is done with item u - 1
      issue(u + NB - 1, RgTok<false>{});  // into item u - 1's stage
      const int sg = u & (NB - 1);
      float kc[KPL], vc[RPL];
      rg_load_row<LPR, KPL, PW>(reinterpret_cast<const float*>(rows[sg]), s, kc);
#pragma unroll
      for (int j = 0; j < RPL; ++j) vc[j] = cx.vcol[j] >= 0 ? sc[sg][cx.rg * RPL + j] : 0.f;
      rg_fold<RPL, KPL>(m, kc, vc, __expf(sc[sg][BV]));
    }
    if (!p.write_final_state) {
      rg_store_tile<LPR, RPL, KPL, PW>(st, p, cx, m);
    }
  }

  // the window (items np .. np + T - 1)
  for (int t = 0; t < T; ++t) {
    const int i = np + t;
    cp_async_wait<NB - 2>();
    __syncwarp();
    issue(i + NB - 1, RgTok<true>{});
    const int sg = i & (NB - 1);
    const TIn* qs = reinterpret_cast<const TIn*>(rows[sg]);
    const TIn* vs = reinterpret_cast<const TIn*>(sc[sg]);
    float q[KPL], k[KPL], v[RPL];
    rg_smem_row<TIn, LPR, KPL, PW>(qs, s, q);
    rg_smem_row<TIn, LPR, KPL, PW>(qs + K, s, k);
#pragma unroll
    for (int j = 0; j < RPL; ++j) v[j] = cx.vcol[j] >= 0 ? rg_smem1(vs + cx.rg * RPL + j) : 0.f;
    rg_token<LPR, RPL, KPL, PW>(p, cx, bos + t, t, q, k, v, sc[sg][BV], sc[sg][BV + 1], m);
  }
  if (p.write_final_state) {
    rg_store_tile<LPR, RPL, KPL, PW>(st, p, cx, m);
  }
}

template <typename TIn, int LPR, int RPL, int KPL, bool PF, int PW>
__global__ void __launch_bounds__(32) chain_verify_rg_kernel(const ChainVerifyParams p) {
  pdl_enter();
  if constexpr (PF)
    chain_verify_rg_body_pf<TIn, LPR, RPL, KPL, PW>(p);
  else
    chain_verify_rg_body<TIn, LPR, RPL, KPL, PW>(p);
}

#ifndef __CUDACC_RTC__  // host code (NVRTC compiles the kernels only: csrc/cuda/nvrtc_check.py --chain)
// query(dev) for the current device, asked once per device and call site (each lambda type has its own cache; a
// mutex guards it, since host threads may launch concurrently).
template <typename Query>
int per_device(Query&& query) {
  static std::mutex mu;
  static std::unordered_map<int, int> known;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(dev);
  if (it != known.end()) return it->second;
  const int v = query(dev);
  known.emplace(dev, v);
  return v;
}

// Streaming multiprocessors of the current GPU (0 when the query failed: sb_auto then never picks BV 4).
inline int sb_sms() {
  return per_device([](int dev) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) (void)cudaGetLastError();
    return sms;
  });
}

// cudaFuncSetAttribute(kern, PreferredSharedMemoryCarveout, MaxShared) as an int (cudaSuccess or the error; per_device
// keeps a failure too, so the launches of that kernel on that device return it without asking again).
template <typename Kern>
int max_shared_carveout(Kern kern) {
  const cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(kern),
                                             cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  return static_cast<int>(e);
}

// Whether two launches of the RAW AR body's grid fit on the GPU at once (occupancy x SMs, asked once per device):
// then a launch's CTAs are resident, waiting on its PDL wait, while the one before it runs. Session 23 (H200,
// RESULTS.md "Session 23"): where they fit (512-1,024 CTAs) the RAW body was 0.94-0.96x Triton's time, the 12-per-SM
// body 0.97-1.04x; at 6x256x512 batch 2 (1,536 CTAs, 2,640 slots) 1.35-1.37x against 1.07-1.09x.
template <typename TIn, int LPR, int RPL, int KPL>
bool rg_ar_raw_fits(const dim3& grid) {
  const int slots = per_device([](int) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_verify_rg_ar_raw_kernel<TIn, LPR, RPL, KPL>, 32,
                                                      0) != cudaSuccess)
      (void)cudaGetLastError();  // (only this query's error: the rule then takes the capped body, for the process)
    return sb_sms() * per_sm;
  });
  return 2 * static_cast<int64_t>(grid.x) * grid.y * grid.z <= slots;
}

// PW (session 21 A/B, p.rg_piece): 4-key pieces only on the one-ahead body (PF false); the ring stays at 8.
template <typename TIn, int LPR, int RPL, int K, bool PF>
cudaError_t launch_rg(const ChainVerifyParams& p, cudaStream_t stream) {
  constexpr int BV = (32 / LPR) * RPL;
  const dim3 grid((p.V + BV - 1) / BV, p.HV, p.R);
  if constexpr (!PF && LPR == 8 && RPL == 1) {
    if (p.rg_ar != 0 && p.rg_piece == 4 && p.N >= 1 && p.N <= p.R && p.pending_len == nullptr) {
      // rg_ar 2: 18 KiB of unused dynamic shared memory per CTA caps residency at 12 CTAs per SM
      // (228 KiB, 1 KiB reserved per CTA), the occupancy of the recording build at K = 256 (150 registers, bf16,
      // ptxas sm_90 of CUDA 12-13). The plain build's 124 registers allow 16, and a one-wave grid then sits on fewer
      // SMs: s22b (H200, 6x256x512 batch 2, 1,536 CTAs) 5.93 us uncapped against 5.45 capped (Triton 4.92), 8.00
      // against 7.46 with the state cold; at 512-1,024 CTAs the cap cost 0-0.13 us (RESULTS.md "Session 22"). The
      // carveout attribute is set once per device and kernel, and stays set for the process (rg_ar 1 launches the
      // same kernels: an A/B of 1 against 2 needs one process per setting).
      // rg_ar 3: the RAW body (q / k kept as loaded, rg_token_raw; plain AR only, the recording build keeps rg_ar
      // 2's kernel); 4 (the default): the RAW body for bf16 at K = 256 where the next launch's CTAs fit beside this
      // launch's, else 2
      // (bf16 q / k / v at K = 256 only: measured there; fp32 keys gain nothing from being kept as loaded)
      if (p.write_bank == nullptr &&
          (p.rg_ar == 3 || (p.rg_ar == 4 && sizeof(TIn) == 2 && K == 256 && rg_ar_raw_fits<TIn, LPR, RPL, K / LPR>(grid))))
        return launch_pdl(chain_verify_rg_ar_raw_kernel<TIn, LPR, RPL, K / LPR>, grid, dim3(32), 0, stream, p.pdl, p);
      const size_t smem = p.rg_ar != 1 ? 18 * 1024 : 0;
      constexpr auto plain = chain_verify_rg_ar_kernel<TIn, LPR, RPL, K / LPR, false>;
      constexpr auto rec = chain_verify_rg_ar_kernel<TIn, LPR, RPL, K / LPR, true>;
      if (smem != 0) {
        const int e = p.write_bank == nullptr ? per_device([](int) { return max_shared_carveout(plain); })
                                              : per_device([](int) { return max_shared_carveout(rec); });
        if (e != cudaSuccess) return static_cast<cudaError_t>(e);
      }
      return launch_pdl(p.write_bank == nullptr ? plain : rec, grid, dim3(32), smem, stream, p.pdl, p);
    }
  }
  if constexpr (!PF) {
    if (p.rg_piece == 4)
      return launch_pdl(chain_verify_rg_kernel<TIn, LPR, RPL, K / LPR, PF, 4>, grid, dim3(32), 0, stream, p.pdl, p);
  }
  return launch_pdl(chain_verify_rg_kernel<TIn, LPR, RPL, K / LPR, PF, 8>, grid, dim3(32), 0, stream, p.pdl, p);
}
#endif  // !__CUDACC_RTC__

// ---- small-batch lean kernel (kLayoutSB) --------------------------------------------------------------
// Triton's small configs ([BV, K/32, 32] tile, 1 warp; RESULTS.md) in CUDA: lane = (row group rg =
// lane / 8, sub-lane s = lane % 8), BV = 4 RPL rows per warp, the row's 8 lanes split its K keys in
// pieces of 8 (rg_key<8>), so M k / M q / norms / k.q are in-thread sums plus one 3-level butterfly
// (as the row-group kernels). What differs from chain_verify_rg_body, whose per-token chain was
// 1.16-1.25x Triton's at batch 1 (RESULTS.md session 4):
//   * the next token's raw q / k (16-byte ld.global.nc of bf16 pieces), v, g and beta go straight into
//     registers, into the one register set once the current token's partial sums are done (so BV 8 fits in
//     registers: 220-232 at K = 256, ptxas sm_90): no shared memory, no cp.async wait or __syncwarp per token;
//     the prefetched v stays raw bf16 bits until its token reads it (ldg_bits / widen_bits);
//   * no normalised k^ array: the update is M = e^g M + (v~ rk) k and the bank_k writers form k rk at
//     the store; o / bank pointers are per-warp bases (the per-token advances multiply the token index by
//     kernel-parameter strides: no per-row stride products, no stride registers).
// bf16 q / k / v only (fp32 inputs would need twice the prefetch registers: the automatic layout).
// Measured (H200, RESULTS.md "Session 20"): verify windows 0.89-1.03x Triton's time, steps 0.79-1.00x, at batch
// 1 / 2 of both GDN-1.3B head shapes. Nsight Compute found the window's per-token wait in the widening of the
// prefetched v right after its load (s20a), not in the distance of the prefetch. Forms measured and removed
// (the code is in commit 4cb60a5): two register sets used in turn, the next token loaded as the current one starts
// (PF 0) or two tokens ahead (PF 2): 0.99-1.10x this form's time at BV 4, 1.03-1.39x at BV 8 (session 20, H100,
// csrc_h100_s20b_sb.json); the tile kept scaled (state = sc * m, one FMA per element and token): 0-7 % slower
// (session 18); the window staged in shared memory by one cp.async burst per 16 tokens: 1.04-1.20x (session 19);
// the norms of q / k split over the four row groups: 1.03-1.08x at BV 4 (session 19).

template <int KPL>
struct SbIn {  // one window token's raw inputs for one lane (bf16)
  static constexpr int NC = KPL / 8;  // 16-byte pieces (8 keys) of the lane's q and of its k
  uint4 q[NC], k[NC];
  unsigned v[2];  // the lane's RPL <= 2 value rows, raw bf16 bits (widened where sb_token reads them)
  float g, b;
};

// Element e (0..7) of an 8-key bf16 piece held as 4 words, widened to fp32.
__device__ __forceinline__ float sb_bf16(const unsigned (&w)[4], int e) {
  return __uint_as_float((e & 1) ? (w[e >> 1] & 0xffff0000u) : (w[e >> 1] << 16));
}

template <int KPL>
__device__ __forceinline__ void sb_widen(const uint4 (&c)[KPL / 8], float (&out)[KPL]) {
#pragma unroll
  for (int i = 0; i < KPL / 8; ++i) {
    const unsigned w[4] = {c[i].x, c[i].y, c[i].z, c[i].w};
#pragma unroll
    for (int e = 0; e < 8; ++e) out[8 * i + e] = sb_bf16(w, e);
  }
}

// Per-warp pointers and constants of the sb kernel.
struct SbPtr {
  const __nv_bfloat16 *q, *k, *v;  // token 0 of the window: this head's q / k row, the value head's v row
  const float *g, *b;
  float* o;                   // o row of token 0, value head hv
  float *bv, *bk, *bg;        // bank write_bank of the slot, t = 0, this head (null without record)
};  // per-token advances: p.tok_stride, HV V for o, the banks' dim-2 strides (kernel parameters, no registers)

template <int RPL, int KPL>
__device__ __forceinline__ void sb_load(const ChainVerifyParams& p, const SbPtr& w, int64_t t, int s,
                                        const int (&vcol)[RPL], SbIn<KPL>& x) {
  const __nv_bfloat16* qr = w.q + t * p.tok_stride[0];
  const __nv_bfloat16* kr = w.k + t * p.tok_stride[1];
#pragma unroll
  for (int i = 0; i < KPL / 8; ++i) {
    x.q[i] = __ldg(reinterpret_cast<const uint4*>(qr + (i * 8 + s) * 8));
    x.k[i] = __ldg(reinterpret_cast<const uint4*>(kr + (i * 8 + s) * 8));
  }
  const __nv_bfloat16* vr = w.v + t * p.tok_stride[2];
#pragma unroll
  for (int j = 0; j < RPL; ++j)  // unpredicated (row 0 for rows past V; sb_token zeroes those)
    x.v[j] = ldg_bits<__nv_bfloat16>(vr + (vcol[j] >= 0 ? vcol[j] : 0));
  x.g = __ldg(w.g + t * p.tok_stride[3]);
  x.b = __ldg(w.b + t * p.tok_stride[4]);
}

// The lane's RPL tile rows, stored (state slot rows; rows past V skipped; rg_store_tile).
template <int RPL, int KPL>
__device__ __forceinline__ void sb_store_tile(float* st, const ChainVerifyParams& p, const RgCtx<RPL>& cx,
                                              const float (&m)[RPL][KPL]) {
  rg_store_tile<8, RPL, KPL>(st, p, cx, m);
}

// One pending factor for one lane: k^ (the lane's keys, fp32), v~ of its rows, g.
template <int RPL, int KPL>
struct SbFac {
  float k[KPL];
  float v[RPL];
  float g;
};

// M = e^g M + v~ k^T (DeltaConstruct, ALGORITHMS.md §6) on the tile m.
template <int RPL, int KPL>
__device__ __forceinline__ void sb_fold(float (&m)[RPL][KPL], const SbFac<RPL, KPL>& f) {
  rg_fold<RPL, KPL>(m, f.k, f.v, __expf(f.g));
}

// One window token t (inputs x) on the tile m. mid() runs once x is no longer read (after the partial sums; k is
// kept widened, the scalars copied): the body loads the next token into x there.
template <int RPL, int KPL, typename Mid>
__device__ __forceinline__ void sb_token(const ChainVerifyParams& p, const RgCtx<RPL>& cx, const SbPtr& w, int64_t t,
                                         SbIn<KPL>& x, float (&m)[RPL][KPL], Mid&& mid) {
  constexpr int NA = RPL == 2 && KPL >= 32 ? 2 : 4;  // independent accumulators per partial sum (registers)
  // k widened once (the update reads it after x is released); q one 8-key piece at a time
  float k[KPL];
  sb_widen<KPL>(x.k, k);
  float a[2 * RPL + 3][NA];
#pragma unroll
  for (int i = 0; i < 2 * RPL + 3; ++i) {
#pragma unroll
    for (int y = 0; y < NA; ++y) a[i][y] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < KPL / 8; ++i) {
    const unsigned wq[4] = {x.q[i].x, x.q[i].y, x.q[i].z, x.q[i].w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int c = 8 * i + e, y = c % NA;
      const float qc = sb_bf16(wq, e), kc = k[c];
#pragma unroll
      for (int j = 0; j < RPL; ++j) {
        a[2 * j][y] = fmaf(m[j][c], kc, a[2 * j][y]);
        a[2 * j + 1][y] = fmaf(m[j][c], qc, a[2 * j + 1][y]);
      }
      a[2 * RPL][y] = fmaf(kc, kc, a[2 * RPL][y]);
      a[2 * RPL + 1][y] = fmaf(qc, qc, a[2 * RPL + 1][y]);
      a[2 * RPL + 2][y] = fmaf(kc, qc, a[2 * RPL + 2][y]);
    }
  }
  float xv[RPL];
#pragma unroll
  for (int j = 0; j < RPL; ++j) xv[j] = cx.vcol[j] >= 0 ? widen_bits<__nv_bfloat16>(x.v[j]) : 0.f;
  const float xg = x.g, xb = x.b;
  mid();
  float sum[2 * RPL + 3], rk, rq;
  rg_reduce<8>(p, a, sum, rk, rq);
  const float e = __expf(xg);
  const float dot = sum[2 * RPL + 2] * rk * rq;
  float vt[RPL], ov[RPL];
#pragma unroll
  for (int j = 0; j < RPL; ++j) {
    vt[j] = xb * (xv[j] - e * (sum[2 * j] * rk));
    ov[j] = fmaf(vt[j], dot, e * (sum[2 * j + 1] * rq));
  }
  float u[RPL];
#pragma unroll
  for (int j = 0; j < RPL; ++j) u[j] = vt[j] * rk;
#pragma unroll
  for (int c = 0; c < KPL; ++c) {
    const float kc = k[c];
#pragma unroll
    for (int j = 0; j < RPL; ++j) m[j][c] = fmaf(u[j], kc, e * m[j][c]);
  }
  if (cx.s == 0) {  // one lane per row: o and v~
#pragma unroll
    for (int j = 0; j < RPL; ++j) {
      if (cx.vcol[j] >= 0) {
        w.o[t * p.HV * p.V + cx.vcol[j]] = ov[j];
        if (cx.record && t < p.Tmax) w.bv[t * p.bv_stride[2] + cx.vcol[j] * p.bv_stride[4]] = vt[j];
      }
    }
  }
  if (cx.record && t < p.Tmax) {
    if (cx.g_writer) w.bg[t * p.bg_stride[2]] = xg;
    if (cx.k_writer) {
      float kh[KPL];
#pragma unroll
      for (int c = 0; c < KPL; ++c) kh[c] = k[c] * rk;
      rg_store_row<8, KPL>(w.bk + t * p.bk_stride[2], cx.s, kh);
    }
  }
}

// One warp per (value tile of BV = 4 RPL rows, value head hv, request row r); K = 8 KPL, bf16 q / k / v
// on the 16-byte path. Same contract and writers as chain_verify_rg_body. One register set for the window's
// tokens: token t + 1 is loaded into it once token t's partial sums are done (sb_token's mid()).
template <int RPL, int KPL>
__device__ __forceinline__ void chain_verify_sb_body(const ChainVerifyParams& p) {
  RgCtx<RPL> cx;
  int64_t bos, eos, np, rb;
  rg_setup<8, RPL>(p, cx, bos, eos, np, rb);
  const int s = cx.s, hv = cx.hv, h = cx.h;
  constexpr int K = 8 * KPL;
  const int HV = p.HV, V = p.V;
  SbPtr w;
  w.q = static_cast<const __nv_bfloat16*>(p.q) + bos * p.tok_stride[0] + h * K;
  w.k = static_cast<const __nv_bfloat16*>(p.k) + bos * p.tok_stride[1] + h * K;
  w.v = static_cast<const __nv_bfloat16*>(p.v) + bos * p.tok_stride[2] + hv * V;
  w.g = p.g + bos * p.tok_stride[3] + hv;
  w.b = p.beta + bos * p.tok_stride[4] + hv;
  w.o = p.o + (bos * HV + hv) * V;
  w.bv = w.bk = w.bg = nullptr;
  if (cx.record) {
    w.bv = p.bank_v + cx.slot * p.bv_stride[0] + cx.wb * p.bv_stride[1] + hv * p.bv_stride[3];
    w.bk = p.bank_k + cx.slot * p.bk_stride[0] + cx.wb * p.bk_stride[1] + h * p.bk_stride[3];
    w.bg = p.bank_g + cx.slot * p.bg_stride[0] + cx.wb * p.bg_stride[1] + hv * p.bg_stride[3];
  }
  const int64_t T = eos - bos;

  // issue order: the first pending factor (else the first window token), then the state tile
  const float* bkp = nullptr;
  const float* bvp = nullptr;
  const float* bgp = nullptr;
  if (np > 0) {
    bkp = p.bank_k + cx.slot * p.bk_stride[0] + rb * p.bk_stride[1] + h * p.bk_stride[3];
    bvp = p.bank_v + cx.slot * p.bv_stride[0] + rb * p.bv_stride[1] + hv * p.bv_stride[3];
    bgp = p.bank_g + cx.slot * p.bg_stride[0] + rb * p.bg_stride[1] + hv * p.bg_stride[3];
  }
  auto load_fac = [&](int64_t u, SbFac<RPL, KPL>& f) {  // pending factor u: k^ row, v~ of the rows, g
    rg_load_row<8, KPL>(bkp + u * p.bk_stride[2], s, f.k);
#pragma unroll
    for (int j = 0; j < RPL; ++j)
      f.v[j] = cx.vcol[j] >= 0 ? bvp[u * p.bv_stride[2] + cx.vcol[j] * p.bv_stride[4]] : 0.f;
    f.g = bgp[u * p.bg_stride[2]];
  };
  SbIn<KPL> x;
  SbFac<RPL, KPL> fa, fb;
  if (np > 0)
    load_fac(0, fa);
  else if (T > 0)
    sb_load<RPL, KPL>(p, w, 0, s, cx.vcol, x);
  float* const st = p.state + cx.slot * p.st_stride[0] + hv * p.st_stride[1];
  float m[RPL][KPL];
  rg_load_tile<8, RPL, KPL, true>(st, p, cx, m);

  // fused deferred commit: M = e^{g_u} M + v~_u k_u^T per pending factor, in fa (even u) / fb (odd u),
  // the next factor (after the last one, the first window token) loaded into the other set first
  if (np > 0) {
    for (int64_t u = 0; u < np; u += 2) {
      if (u + 1 < np)
        load_fac(u + 1, fb);
      else if (T > 0)
        sb_load<RPL, KPL>(p, w, 0, s, cx.vcol, x);
      sb_fold<RPL, KPL>(m, fa);
      if (u + 1 < np) {
        if (u + 2 < np)
          load_fac(u + 2, fa);
        else if (T > 0)
          sb_load<RPL, KPL>(p, w, 0, s, cx.vcol, x);
        sb_fold<RPL, KPL>(m, fb);
      }
    }
    if (!p.write_final_state) sb_store_tile<RPL, KPL>(st, p, cx, m);
  }

  for (int64_t t = 0; t < T; ++t)
    sb_token<RPL, KPL>(p, cx, w, t, x, m, [&] {
      if (t + 1 < T) sb_load<RPL, KPL>(p, w, t + 1, s, cx.vcol, x);
    });
  if (p.write_final_state) sb_store_tile<RPL, KPL>(st, p, cx, m);
}

template <int RPL, int KPL>
__global__ void __launch_bounds__(32) chain_verify_sb_kernel(const ChainVerifyParams p) {
  pdl_enter();
  chain_verify_sb_body<RPL, KPL>(p);
}

#ifndef __CUDACC_RTC__  // host code (NVRTC compiles the kernels only: csrc/cuda/nvrtc_check.py --chain)
template <int K, int RPL>
cudaError_t launch_sb(const ChainVerifyParams& p, cudaStream_t stream) {
  const dim3 grid((p.V + 4 * RPL - 1) / (4 * RPL), p.HV, p.R);
  return launch_pdl(chain_verify_sb_kernel<RPL, K / 8>, grid, dim3(32), 0, stream, p.pdl, p);
}

// bv: value rows per warp, 4 or 8 (the caller's choice: p.bv when forced, else sb_auto's).
template <int K>
cudaError_t dispatch_sb(const ChainVerifyParams& p, int bv, cudaStream_t stream) {
  return bv == 4 ? launch_sb<K, 1>(p, stream) : launch_sb<K, 2>(p, stream);
}

// Resident single-warp CTAs of the sb kernel <RPL, KPL> on the current GPU (occupancy x SMs; at least 1: when a
// query failed the wave counts as 1 warp and the sb rule declines).
template <int RPL, int KPL>
int sb_wave() {
  return per_device([](int) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_verify_sb_kernel<RPL, KPL>, 32, 0) != cudaSuccess)
      (void)cudaGetLastError();  // (only this query's error)
    return std::max(1, sb_sms() * per_sm);
  });
}

// The automatic layout's use of the sb kernel: bf16 windows of several tokens (verify / SpecLA step, not AR) on
// the 16-byte path with K = 128 / 256 at small batch (R * HV <= 16 pairs): BV 4 where its warps are at most one per
// warp scheduler (4 per SM), else BV 8 where those warps fit on the GPU at once; returns that BV, or 0 (the
// row-group / v3 layouts). A batch-1 window's time is one warp's
// dependent chain per token, so BV 4 (half the rows per warp) wins while no scheduler holds two of its warps and
// BV 8 once one would. Session 20 (H100, RESULTS.md "Session 20"): 8x256x256 batch 1 (512 BV-4 warps, 528
// schedulers) BV 4 0.86-0.88x BV 8's time; 6x256x512 batch 1 (768), 8x256x256 batch 2 (1024) and 6x256x512
// batch 2 (1536) BV 8 0.94-0.95x, 0.95-0.98x and 0.75-0.79x BV 4's. (AR is told by N <= R, so a padded q sends
// AR rows here too, which is correct, only not measured.)
int sb_auto(const ChainVerifyParams& p) {
  if (p.layout != kLayoutAuto || !p.in_bf16 || !p.vec_ok || (p.K != 128 && p.K != 256) || p.N <= p.R ||
      static_cast<int64_t>(p.R) * p.HV > 16)
    return 0;
  const int64_t pairs = static_cast<int64_t>(p.R) * p.HV;
  if (pairs * ((p.V + 3) / 4) <= 4 * sb_sms()) return 4;
  const int w8 = p.K == 256 ? sb_wave<2, 32>() : sb_wave<2, 16>();
  return pairs * ((p.V + 7) / 8) <= w8 ? 8 : 0;
}

// Row-group layout (vec path, K = 128 or 256), by lpr: 0 (kLayoutRowGroup): BV = p.bv (4 or 8),
// else 4 for AR (one token per row) and 8 otherwise (triton_chain's ar_small / verify_small), LPR
// = 32 / BV lanes per row, one row per lane; 8 (kLayoutRowGroup8): LPR = 8, BV / 4 rows per lane
// (the lane split of Triton's [BV, K/32, 32] tile; BV 4 is the same kernel as lpr 0); 16
// (kLayoutRowGroup16): LPR = 16, BV = 2, one row per lane; 32 (kLayoutRowGroup32): LPR = 32, BV
// = 1, K = 256 only (KPL = K / 32 must be a multiple of 8), K = 128 runs lpr 16. 16 / 32 ignore
// p.bv. PF: the prefetch ring (p.rg_prefetch) or the one-ahead double buffer.
template <typename TIn, int K, bool PF>
cudaError_t dispatch_rg_pf(const ChainVerifyParams& p, int lpr, cudaStream_t stream) {
  if constexpr (K >= 256) {
    if (lpr == 32) return launch_rg<TIn, 32, 1, K, PF>(p, stream);
  }
  if (lpr == 16 || lpr == 32) return launch_rg<TIn, 16, 1, K, PF>(p, stream);
  int bv = p.bv;
  if (bv != 4 && bv != 8) bv = p.N <= p.R ? 4 : 8;
  if (bv == 4) return launch_rg<TIn, 8, 1, K, PF>(p, stream);
  return lpr == 8 ? launch_rg<TIn, 8, 2, K, PF>(p, stream) : launch_rg<TIn, 4, 1, K, PF>(p, stream);
}

template <typename TIn, int K>
cudaError_t dispatch_rg(const ChainVerifyParams& p, int lpr, cudaStream_t stream) {
  return p.rg_prefetch ? dispatch_rg_pf<TIn, K, true>(p, lpr, stream) : dispatch_rg_pf<TIn, K, false>(p, lpr, stream);
}

// BV = 4 for AR (one token per row) and small batches, else 8 (triton_chain.pick_config's rule);
// p.bv (4 or 8) overrides; K > 256 (KPL 16) always uses 4 (the tile is BV * KPL registers).
template <typename TIn, int KPL, bool VEC>
cudaError_t dispatch_bv(const ChainVerifyParams& p, cudaStream_t stream) {
  if constexpr (KPL >= 16) {
    // the [BV, K] tile is BV * KPL registers per lane: 4 rows (2 on the non-vector path, whose
    // per-element addressing costs registers) so that nothing spills
    return launch<TIn, KPL, VEC, VEC ? 4 : 2>(p, stream);
  } else {
    int bv = p.bv;
    if (bv != 4 && bv != 8)
      bv = (p.N <= p.R || static_cast<int64_t>(p.R) * p.HV <= 16) ? 4 : 8;
    return bv == 4 ? launch<TIn, KPL, VEC, 4>(p, stream) : launch<TIn, KPL, VEC, 8>(p, stream);
  }
}

template <typename TIn>
cudaError_t dispatch_k(const ChainVerifyParams& p, cudaStream_t stream) {
  // 16-byte path: K a multiple of 128 with unit key strides and 16-byte aligned rows (p.vec_ok)
  // small batches (R * HV <= 16 (row, head) pairs, triton_chain's "small" rule), from the H200
  // batch-1 sweep (benchmarks/RESULTS.md, csrc_cuda_h200_b1_layouts.json): AR -> row group (BV 4), verify
  // without pending -> row group with 8 lanes per row, step with pending -> v3 reduce-scatter with
  // the one-ahead row-group kernels (p.rg_prefetch = false: its pending fold waited ~0.65 us per
  // factor), else the prefetch ring with 8 lanes per row, or 16 lanes per row at <= 8 (row, head)
  // pairs (batch 1 of both GDN-1.3B shapes: 2-14 % faster than 8 lanes, 8x256x256 steps 6-8 %
  // faster than Triton; slower at batch 2; H200, RESULTS.md session 4, csrc_cuda_h200_s4_b1_lpr_*).
  // Forced by p.layout (rowgroup32 is forced only: slower everywhere measured; with K = 128 it runs
  // rowgroup16). Row group needs the 16-byte path with K = 128 / 256, else v3.
  if constexpr (std::is_same<TIn, __nv_bfloat16>::value) {  // the sb kernel: bf16 inputs only
    const int bv = p.layout == kLayoutSB ? (p.bv == 8 ? 8 : 4) : sb_auto(p);
    if (bv && p.vec_ok && p.K == 128) return dispatch_sb<128>(p, bv, stream);
    if (bv && p.vec_ok && p.K == 256) return dispatch_sb<256>(p, bv, stream);
  }
  if (p.layout == kLayoutSB) {  // fp32 inputs, or off the 16-byte path / K = 128, 256: the automatic layout
    ChainVerifyParams a = p;
    a.layout = kLayoutAuto;
    return chain_verify(a, stream);  // (its UT rule included)
  }
  const bool small = p.layout == kLayoutAuto && static_cast<int64_t>(p.R) * p.HV <= 16;
  const bool step_pf = small && !p.write_final_state && p.pending_len != nullptr && p.rg_prefetch;
  const bool rg16 = p.layout == kLayoutRowGroup16 || (step_pf && static_cast<int64_t>(p.R) * p.HV <= 8);
  const bool rg8 = p.layout == kLayoutRowGroup8 ||
                   (small && !p.write_final_state && (p.pending_len == nullptr || p.rg_prefetch));
  const int lpr = p.layout == kLayoutRowGroup32 ? 32 : rg16 ? 16 : rg8 ? 8 : 0;
  const bool rg = p.layout == kLayoutRowGroup || lpr != 0 || (small && p.write_final_state);
  if (rg && p.vec_ok && p.K == 128) return dispatch_rg<TIn, 128>(p, lpr, stream);
  if (rg && p.vec_ok && p.K == 256) return dispatch_rg<TIn, 256>(p, lpr, stream);
  if (p.vec_ok && p.K == 128) return dispatch_bv<TIn, 4, true>(p, stream);
  if (p.vec_ok && p.K == 256) return dispatch_bv<TIn, 8, true>(p, stream);
  if (p.vec_ok && p.K == 512) return dispatch_bv<TIn, 16, true>(p, stream);
  if (p.K <= 32) return dispatch_bv<TIn, 1, false>(p, stream);
  if (p.K <= 64) return dispatch_bv<TIn, 2, false>(p, stream);
  if (p.K <= 128) return dispatch_bv<TIn, 4, false>(p, stream);
  if (p.K <= 256) return dispatch_bv<TIn, 8, false>(p, stream);
  if (p.K <= 512) return dispatch_bv<TIn, 16, false>(p, stream);
  return cudaErrorInvalidValue;
}

#endif  // !__CUDACC_RTC__
}  // namespace

#ifndef __CUDACC_RTC__  // host code (NVRTC compiles the kernels only: csrc/cuda/nvrtc_check.py --chain)
cudaError_t chain_verify(const ChainVerifyParams& p, cudaStream_t stream) {
  if (p.R == 0) return cudaSuccess;
  // the UT-form kernel (chain_verify_ut.cu): forced (kLayoutUT: strict, cudaErrorNotSupported where it
  // does not apply) or by the automatic rule; the serial kernels below otherwise
  if (p.layout == kLayoutUT) return chain_verify_ut(p, stream);
  if (p.layout == kLayoutAuto && chain_verify_ut_auto(p)) {
    const cudaError_t e = chain_verify_ut(p, stream);
    if (e != cudaErrorNotSupported) return e;
  }
  return p.in_bf16 ? dispatch_k<__nv_bfloat16>(p, stream) : dispatch_k<float>(p, stream);
}
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace vllm_specla
