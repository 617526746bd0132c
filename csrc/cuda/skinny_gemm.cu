// torch.ops.vllm_specla.skinny_gemm: out[M, N] = x[M, K] @ w[N, K]^T (+ residual) for M <= 16 token
// rows (the verify windows of a batch-1 SpecLA step: T = K_draft + 1 <= 16 rows), bf16 / fp16
// operands, fp32 accumulation on tensor cores, one rounding to the output dtype.
//
// Why: at batch 1 a verify step's GEMMs are weight streams (flame 1B: 2.64 GB per step), and cuBLAS
// serves 5-9-row GEMMs at ~2.56 TB/s (its split-K tiles plus a reduce kernel; benchmarks/RESULTS.md
// sessions 11-13), against a ~4.3 TB/s copy ceiling. Four Triton forms lost to it (sessions 3-4, 12,
// 13): each staged the weight tile through shared memory or converted layouts per token row.
//
// The layout (the "swap AB" skinny GEMM; cf. TensorRT-LLM's cudaCoreGemm / vLLM's ROCm wvSplitK,
// which do the same job on CUDA cores): the weight is the MMA's A operand (16 output rows x 16 k),
// the token rows are B (16 k x 8 tokens), so one m16n8k16 covers 8 tokens and the weight is read
// exactly once. The k order inside an MMA is free (a dot product), so each thread owns 8
// *contiguous* k of its A rows and loads them with one 16-byte load straight into the fragment
// registers (no shared memory, no ldmatrix, no conversion):
//
//   lane = 4 g + t (g = lane / 4, t = lane % 4); for a 32-wide k chunk at k0 the thread loads
//   W[n0 + g][k0 + 8t .. +8] and W[n0 + g + 8][k0 + 8t .. +8] (uint4 each) and x[tok g][k0 + 8t .. +8]
//   (uint4 per 8-token tile). Words 0..3 of those loads hold k pairs (0,1) (2,3) (4,5) (6,7).
//   MMA j (j = 0, 1) of the chunk takes A = {Wg.w[2j], Wg8.w[2j], Wg.w[2j+1], Wg8.w[2j+1]} and
//   B = {X.w[2j], X.w[2j+1]}: logical k slot 2t+e is physical k0 + 8t + 4j + e and slot 2t+8+e is
//   k0 + 8t + 4j + 2 + e, the same bijection for A and B (PTX ISA, "Matrix Fragments for
//   mma.m16n8k16" with .bf16: a0..a7 rows g / g+8, cols 2t+(0,1) / 2t+8+(0,1); b0..b3 rows
//   2t+(0,1) / 2t+8+(0,1), col g). The two MMAs accumulate into one C fragment, so a chunk adds all
//   32 k.
//
// A CTA owns 16 output rows; its WARPS warps split K into contiguous chunk ranges; each warp loads U
// chunks (2U 16-byte weight loads per thread) into registers before it computes them, the first U
// written before the programmatic dependent launch wait (griddepcontrol.wait: model weights are constant,
// ops/pdl.py's contract), so that with PDL the weight stream starts while the previous kernel finishes. In
// SASS that needs coherent loads (session 32, csrc/cuda/nvrtc_check.py --sass): ptxas may move ld.global.nc across
// the wait, and did; the first batch is loaded with ld.global.L1::no_allocate (skinny_gemm_kernels.cuh ld_first),
// which stays before it (measured: benchmarks/RESULTS.md "Session 35").
// The warps' C fragments are summed through shared memory in warp order (deterministic), then
// written coalesced with the residual added in fp32 (as cuBLAS addmm's beta = 1). Weight loads
// bypass L1 (L1::no_allocate: read once per step; .nc after the first batch); x (<= 16 x K elements) stays in L1.
//
// Measured (benchmarks/RESULTS.md, session 15): 2.76-2.83 TB/s for the flame / map steps' GEMMs at
// 5-8 rows against cuBLAS's 2.55-2.64 (one CTA per 16 rows runs the grid in waves: flame's in-projection is
// 577 CTAs over ~2.2 waves). A persistent stream-K form (contiguous chunk ranges per warp, a private
// cp.async ring per thread, partial tiles summed by the last of their warps) measured 1.2-2.2 TB/s
// over three builds and was removed. At 9-16 rows (two MMA tiles) this kernel took 1.16-1.30x
// cuBLAS's time (1.11-1.14x at 9 with the rows past 8 staged in shared memory, session 30, removed),
// so ops/fused.py gives it 2-8 rows. Session 30 split each warp's MMA chain in two (SPLIT, auto_cfg).
// Session 16 measured and removed five more forms (an L2 prefetch hint, a persistent register ring, TMA
// shared-memory stages, a K split over thread-block clusters, 16 warps for the few-tile GEMMs): none beat
// this one at 2-8 rows (RESULTS.md "Session 16", docs/KERNELS.md; the code is in commits 732bc08 and
// ed28b5e). Session 17 measured the optional bulk L2 prefetch of the next GEMM's first weights by the last
// wave (prefetch=): 4 MiB takes the step's GEMM chain 0.3-3 % faster, 16 MiB and more slower than none; the
// decode runtime uses 4 MiB (ops/fused.py).
//
// The device code is in skinny_gemm_kernels.cuh (csrc/cuda/nvrtc_check.py compiles it without nvcc).
//
// JIT-built on a machine with CUDA torch by vllm_specla.ops._cpp.load_cuda_gemm() (the H200); its
// own TORCH_LIBRARY_FRAGMENT (it does not need the CPU extension). Torch reference: ops/fused.py
// linear_ref; tests: tests/test_skinny_gemm_gpu.py.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "skinny_gemm_kernels.cuh"

namespace {

using namespace vllm_specla_skinny;

// cudaLaunchKernelEx with programmatic dependent launch on or off (both skinny kernels)
template <typename Kernel, typename... Args>
void launch_ex(Kernel kernel, int grid, int block, cudaStream_t stream, bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(block));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <typename T, int NT, int WARPS, int U, bool RES, bool SPLIT = false>
void launch(const at::Tensor& x, const at::Tensor& w, const T* res, int64_t ldr, at::Tensor& out, bool pdl,
            const unsigned char* pf, int64_t pf_bytes, cudaStream_t stream) {
  const int M = static_cast<int>(x.size(0)), K = static_cast<int>(x.size(1)), N = static_cast<int>(w.size(0));
  // griddepcontrol.wait exists only in code built for sm_90+ (the __CUDA_ARCH__ guard in
  // skinny_gemm_kernels.cuh); code JIT-compiled from older PTX (e.g. TORCH_CUDA_ARCH_LIST="8.0+PTX"
  // on an H200) has no wait, and launching it with PDL would let it read x / the residual before
  // their producer finished. So PDL only where the kernel's PTX is sm_90+ (asked once per
  // instantiation).
  static int ptx_version = -1, per_sm = 1;
  if (ptx_version < 0) {
    cudaFuncAttributes fa;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&fa, skinny_gemm_kernel<T, NT, WARPS, U, RES, SPLIT>));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, skinny_gemm_kernel<T, NT, WARPS, U, RES, SPLIT>, WARPS * 32, 0));
    ptx_version = fa.ptxVersion;
  }
  pdl = pdl && ptx_version >= 90;
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  const T* wp = reinterpret_cast<const T*>(w.data_ptr());
  T* op = reinterpret_cast<T*>(out.data_ptr());
  // the L2 prefetch of the next GEMM's weights by the CTAs of the last wave (as many as are resident at
  // once), sm_90+ code
  const int grid = (N + 15) / 16;
  if (ptx_version < 90) pf = nullptr;
  const int pf_first =
      pf ? std::max(0, grid - std::max(1, per_sm) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount) : 0;
  launch_ex(skinny_gemm_kernel<T, NT, WARPS, U, RES, SPLIT>, grid, WARPS * 32, stream, pdl, xp, x.stride(0), wp, res,
            ldr, op, out.stride(0), M, N, K, pf, static_cast<long long>(pf_bytes), pf_first);
}

template <typename T, int NT, int WARPS, int U, bool SPLIT = false>
void dispatch_res(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& residual,
                  at::Tensor& out, bool pdl, const unsigned char* pf, int64_t pf_bytes, cudaStream_t s) {
  if (residual.has_value())
    launch<T, NT, WARPS, U, true, SPLIT>(x, w, reinterpret_cast<const T*>(residual->data_ptr()),
                                         residual->stride(0), out, pdl, pf, pf_bytes, s);
  else
    launch<T, NT, WARPS, U, false, SPLIT>(x, w, nullptr, 0, out, pdl, pf, pf_bytes, s);
}

template <typename T, int NT>
void dispatch_cfg(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& residual,
                  at::Tensor& out, int64_t warps, int64_t unroll, bool pdl, const unsigned char* pf,
                  int64_t pf_bytes, cudaStream_t s) {
#define SG_CASE(W_, U_)                                                     \
  if (warps == W_ && unroll == U_) {                                        \
    dispatch_res<T, NT, W_, U_>(x, w, residual, out, pdl, pf, pf_bytes, s); \
    return;                                                                 \
  }
  SG_CASE(4, 4) SG_CASE(4, 8) SG_CASE(8, 4) SG_CASE(8, 8) SG_CASE(16, 4) SG_CASE(16, 8)
#undef SG_CASE
  TORCH_CHECK(false, "vllm_specla.skinny_gemm: (warps, unroll) must be one of (4|8|16, 4|8) or (0, 0)");
}

// The automatic config: 8 warps x 8 chunks (each warp's K range in one load batch for K <= 2048),
// the fastest of s15a's sweep (one config for a whole step's GEMM chain, flame / map, 1-8 rows), with
// the MMAs of 1-8 rows in two accumulator chains (skinny_gemm_kernels.cuh SPLIT: s30e, the step's GEMM
// chain 2.7-4.5 % faster at 5 / 8 rows than one chain, which the explicit (8, 8) config keeps). 16
// warps for the GEMMs whose tiles fit in one CTA per SM with K >= 4096 (flame's down-projection) lost
// (s16f), as did a K split over clusters of CTAs (s16e).
bool auto_cfg(int64_t& warps, int64_t& unroll, int64_t M) {
  warps = 8;
  unroll = 8;
  return M <= 8;
}

// warps (4 | 8 | 16) and unroll (4 | 8), or 0 / 0 for the automatic config. The Python wrapper
// (ops/_cpp.py skinny_gemm) checks every input before this runs: a failed TORCH_CHECK inside this
// JIT-built op crashed the process on the H200 (s15b) instead of raising.
void skinny_gemm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& residual,
                 at::Tensor& out, int64_t warps, int64_t unroll, bool pdl,
                 const std::optional<at::Tensor>& prefetch, int64_t prefetch_bytes) {
  const char* f = "vllm_specla.skinny_gemm";
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && out.is_cuda(), f, ": x, w and out must be CUDA tensors");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && out.dim() == 2, f, ": x [M, K], w [N, K] and out [M, N] must be 2-D");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() && out.scalar_type() == w.scalar_type() &&
                  (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf),
              f, ": x, w and out must share one dtype, bfloat16 or float16");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= 16, f, ": x must have 1..16 rows");
  TORCH_CHECK(w.size(1) == K && out.size(0) == M && out.size(1) == N, f, ": shapes do not match [M, K] x [N, K] -> [M, N]");
  TORCH_CHECK(N >= 1 && K >= 8 && K % 8 == 0 && w.is_contiguous() && x.stride(1) == 1 && x.stride(0) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0,
              f, ": needs N >= 1, K % 8 == 0, a contiguous w, x rows dense and 16-byte aligned");
  TORCH_CHECK(out.stride(1) == 1, f, ": out must have a dense last dim");
  TORCH_CHECK(N <= (int64_t{1} << 31) - 16 && K < (int64_t{1} << 30), f, ": N or K too large");
  if (residual.has_value()) {
    TORCH_CHECK(residual->is_cuda() && residual->scalar_type() == w.scalar_type() && residual->dim() == 2 &&
                    residual->size(0) == M && residual->size(1) == N && residual->stride(1) == 1,
                f, ": residual must be [M, N] with out's dtype and a dense last dim");
  }
  const bool split = warps == 0 && unroll == 0 && auto_cfg(warps, unroll, M);
  // prefetch: the next GEMM's weight (its first prefetch_bytes, a multiple of 16 within it, go to L2)
  const unsigned char* pf = nullptr;
  if (prefetch.has_value() && prefetch_bytes > 0) {
    TORCH_CHECK(prefetch->is_cuda() && prefetch->device() == x.device() && prefetch->is_contiguous() &&
                    reinterpret_cast<uintptr_t>(prefetch->data_ptr()) % 16 == 0 && prefetch_bytes % 16 == 0 &&
                    prefetch_bytes <= prefetch->numel() * prefetch->element_size(),
                f, ": prefetch must be a contiguous, 16-byte aligned tensor on x's device, prefetch_bytes a multiple of 16 "
                   "within it");
    pf = reinterpret_cast<const unsigned char*>(prefetch->data_ptr());
  }
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t s = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  if (split) {
    if (w.scalar_type() == at::kBFloat16)
      dispatch_res<__nv_bfloat16, 1, 8, 8, true>(x, w, residual, out, pdl, pf, prefetch_bytes, s);
    else
      dispatch_res<__half, 1, 8, 8, true>(x, w, residual, out, pdl, pf, prefetch_bytes, s);
    return;
  }
  if (w.scalar_type() == at::kBFloat16) {
    if (M <= 8)
      dispatch_cfg<__nv_bfloat16, 1>(x, w, residual, out, warps, unroll, pdl, pf, prefetch_bytes, s);
    else
      dispatch_cfg<__nv_bfloat16, 2>(x, w, residual, out, warps, unroll, pdl, pf, prefetch_bytes, s);
  } else {
    if (M <= 8)
      dispatch_cfg<__half, 1>(x, w, residual, out, warps, unroll, pdl, pf, prefetch_bytes, s);
    else
      dispatch_cfg<__half, 2>(x, w, residual, out, warps, unroll, pdl, pf, prefetch_bytes, s);
  }
}

// ---- float8 weights (skinny_gemm_fp8_kernel in skinny_gemm_kernels.cuh): bf16 x [M <= 8, K], e4m3 w [N, K]
// with float32 row scales w_scale [N]; prepared in session 28 for the drafter's absorb pass, measured in session 29
template <int WARPS, int U, bool RES>
void launch_fp8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ws, const __nv_bfloat16* res, int64_t ldr,
                at::Tensor& out, bool pdl, cudaStream_t stream) {
  const int M = static_cast<int>(x.size(0)), K = static_cast<int>(x.size(1)), N = static_cast<int>(w.size(0));
  static int ptx_version = -1;  // PDL only where the kernel's PTX is sm_90+ (see launch above)
  if (ptx_version < 0) {
    cudaFuncAttributes fa;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&fa, skinny_gemm_fp8_kernel<1, WARPS, U, RES>));
    ptx_version = fa.ptxVersion;
  }
  pdl = pdl && ptx_version >= 90;
  launch_ex(skinny_gemm_fp8_kernel<1, WARPS, U, RES>, (N + 15) / 16, WARPS * 32, stream, pdl,
            reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), x.stride(0),
            reinterpret_cast<const unsigned char*>(w.data_ptr()), reinterpret_cast<const float*>(ws.data_ptr()), res,
            ldr, reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), out.stride(0), M, N, K);
}

template <int WARPS, int U>
void dispatch_fp8_res(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ws,
                      const std::optional<at::Tensor>& residual, at::Tensor& out, bool pdl, cudaStream_t s) {
  if (residual.has_value())
    launch_fp8<WARPS, U, true>(x, w, ws, reinterpret_cast<const __nv_bfloat16*>(residual->data_ptr()),
                               residual->stride(0), out, pdl, s);
  else
    launch_fp8<WARPS, U, false>(x, w, ws, nullptr, 0, out, pdl, s);
}

// warps / unroll: (4 | 8 | 16, 4) or (8, 8); 0 / 0 = (8, 4): 8 warps of one 4-chunk batch each cover K = 2048,
// the bf16 kernel's automatic config in bytes per load batch. The Python wrapper (ops/_cpp.py
// skinny_gemm_fp8) checks every input first.
void skinny_gemm_fp8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale,
                     const std::optional<at::Tensor>& residual, at::Tensor& out, int64_t warps, int64_t unroll,
                     bool pdl) {
  const char* f = "vllm_specla.skinny_gemm_fp8";
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && w_scale.is_cuda() && out.is_cuda(), f, ": tensors must be on CUDA");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && out.dim() == 2 && w_scale.dim() == 1, f,
              ": x [M, K], w [N, K], w_scale [N] and out [M, N]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16 &&
                  w.scalar_type() == at::kFloat8_e4m3fn && w_scale.scalar_type() == at::kFloat,
              f, ": x / out bfloat16, w float8_e4m3fn, w_scale float32");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= 8 && w.size(1) == K && w_scale.size(0) == N && out.size(0) == M && out.size(1) == N, f,
              ": shapes must be x [M <= 8, K], w [N, K], w_scale [N], out [M, N]");
  TORCH_CHECK(N >= 1 && K >= 16 && K % 16 == 0 && w.is_contiguous() && w_scale.is_contiguous() && x.stride(1) == 1 &&
                  x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0 && out.stride(1) == 1,
              f, ": needs K % 16 == 0, contiguous w / w_scale, x rows dense and 16-byte aligned, out's last dim dense");
  TORCH_CHECK(N <= (int64_t{1} << 31) - 16 && K < (int64_t{1} << 30), f, ": N or K too large");
  if (residual.has_value()) {
    TORCH_CHECK(residual->is_cuda() && residual->scalar_type() == at::kBFloat16 && residual->dim() == 2 &&
                    residual->size(0) == M && residual->size(1) == N && residual->stride(1) == 1,
                f, ": residual must be [M, N] bfloat16 with a dense last dim");
  }
  if (warps == 0 && unroll == 0) {
    warps = 8;
    unroll = 4;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t s = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
#define SG8_CASE(W_, U_)                                              \
  if (warps == W_ && unroll == U_) {                                  \
    dispatch_fp8_res<W_, U_>(x, w, w_scale, residual, out, pdl, s);   \
    return;                                                           \
  }
  SG8_CASE(4, 4) SG8_CASE(8, 4) SG8_CASE(16, 4) SG8_CASE(8, 8)
#undef SG8_CASE
  TORCH_CHECK(false, f, ": (warps, unroll) must be (4 | 8 | 16, 4), (8, 8) or (0, 0)");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(vllm_specla, m) {
  m.def(
      "skinny_gemm(Tensor x, Tensor w, Tensor? residual, Tensor(a!) out, int warps, int unroll, bool pdl, "
      "Tensor? prefetch, int prefetch_bytes) -> ()");
  m.def(
      "skinny_gemm_fp8(Tensor x, Tensor w, Tensor w_scale, Tensor? residual, Tensor(a!) out, int warps, int unroll, "
      "bool pdl) -> ()");
}

TORCH_LIBRARY_IMPL(vllm_specla, CUDA, m) {
  m.impl("skinny_gemm", &skinny_gemm);
  m.impl("skinny_gemm_fp8", &skinny_gemm_fp8);
}
