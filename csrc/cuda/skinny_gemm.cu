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
// before the programmatic dependent launch wait (griddepcontrol.wait: model weights are constant,
// ops/pdl.py's contract), so with PDL the weight stream starts while the previous kernel finishes.
// The warps' C fragments are summed through shared memory in warp order (deterministic), then
// written coalesced with the residual added in fp32 (as cuBLAS addmm's beta = 1). Weight loads
// bypass L1 (ld.global.nc.L1::no_allocate: read once per step); x (<= 16 x K elements) stays in L1.
//
// Measured (benchmarks/RESULTS.md, session 15): 2.76-2.83 TB/s for the flame / map steps' GEMMs at
// 5-8 rows against cuBLAS's 2.55-2.64 (one CTA per 16 rows runs the grid in waves: flame's in-projection is
// 577 CTAs over ~2.2 waves). A persistent stream-K form (contiguous chunk ranges per warp, a private
// cp.async ring per thread, partial tiles summed by the last of their warps) measured 1.2-2.2 TB/s
// over three builds and was removed. At 9-16 rows (two MMA tiles) this kernel took 1.16-1.30x
// cuBLAS's time, so ops/fused.py gives it 2-8 rows.
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

// The bulk forms' stage memory per CTA (dynamic shared memory, bytes; the H200 allows 227 KB per CTA
// and 228 KB per SM): form 4 one CTA per SM, form 5 two (so a dependent kernel's CTA can start its
// copies beside the last one of the previous kernel, with PDL)
constexpr int kBulkSmem[2] = {200 * 1024, 100 * 1024};

// FORM: 0 tile, 1 tile + L2 prefetch hint, 2 ring, 3 ring + L2 prefetch hint, 4 / 5 bulk (TMA stages;
// U = its stage count; 1 / 2 CTAs per SM) (2-5: NT = 1 only).
template <typename T, int NT, int WARPS, int U, bool RES, int FORM>
void launch(const at::Tensor& x, const at::Tensor& w, const T* res, int64_t ldr, at::Tensor& out, bool pdl,
            cudaStream_t stream) {
  static_assert(FORM < 2 || NT == 1, "the ring form takes at most 8 token rows");
  const int M = static_cast<int>(x.size(0)), K = static_cast<int>(x.size(1)), N = static_cast<int>(w.size(0));
  const auto kernel = [] {
    if constexpr (FORM < 2)
      return skinny_gemm_kernel<T, NT, WARPS, U, RES, FORM == 1>;
    else if constexpr (FORM < 4)
      return skinny_gemm_ring_kernel<T, WARPS, U, RES, FORM == 3>;
    else
      return skinny_gemm_bulk_kernel<T, WARPS, U, RES>;  // forms 4 / 5; U: its stage count
  }();
  // griddepcontrol.wait exists only in code built for sm_90+ (the __CUDA_ARCH__ guard above); code
  // JIT-compiled from older PTX (e.g. TORCH_CUDA_ARCH_LIST="8.0+PTX" on an H200) has no wait, and
  // launching it with PDL would let it read x / the residual before their producer finished. So
  // PDL only where the kernel's PTX is sm_90+ (asked once per instantiation).
  static int ptx_version = -1, per_sm = 0;
  if (ptx_version < 0) {
    cudaFuncAttributes fa;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
    if constexpr (FORM == 2 || FORM == 3)
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, WARPS * 32, 0));
    if constexpr (FORM >= 4) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkSmem[0]));
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, WARPS * 32, kBulkSmem[FORM - 4]));
    }
    ptx_version = fa.ptxVersion;
  }
  TORCH_CHECK(FORM < 4 || ptx_version >= 90, "vllm_specla.skinny_gemm: forms 4 / 5 need code built for sm_90+");
  pdl = pdl && ptx_version >= 90;
  const int ntiles = (N + 15) / 16, nchunks = (K + 31) / 32;
  int per = (nchunks + WARPS - 1) / WARPS, grid = ntiles;
  size_t smem = 0;
  if constexpr (FORM >= 4) {
    // K slices as large as U stages of the form's budget allow (rows of 2 ks + 64 bytes), as even as
    // multiples of 32 make them; as many CTAs as fit at once (1 / 2 per SM)
    const int ksmax = ((kBulkSmem[FORM - 4] / U / 16 - 64) / 2) / 32 * 32;
    const int nslices = (K + ksmax - 1) / ksmax;
    per = ((K + nslices - 1) / nslices + 31) / 32 * 32;  // ks
    smem = static_cast<size_t>(U) * 16 * (2 * per + 64);
    grid = std::min(ntiles, std::max(1, per_sm) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  } else if constexpr (FORM >= 2) {
    per = (per + U - 1) / U * U;
    // as many CTAs as fit at once, then as few as give every CTA the same number of tiles (+-1)
    const int fit = std::max(1, per_sm) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int rounds = (ntiles + fit - 1) / fit;
    grid = (ntiles + rounds - 1) / rounds;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(WARPS * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  const T* wp = reinterpret_cast<const T*>(w.data_ptr());
  T* op = reinterpret_cast<T*>(out.data_ptr());
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, xp, x.stride(0), wp, res, ldr, op, out.stride(0), M, N, K, per));
}

template <typename T, int NT, int WARPS, int U, int FORM>
void dispatch_res(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& residual,
                  at::Tensor& out, bool pdl, cudaStream_t s) {
  if (residual.has_value())
    launch<T, NT, WARPS, U, true, FORM>(x, w, reinterpret_cast<const T*>(residual->data_ptr()), residual->stride(0),
                                        out, pdl, s);
  else
    launch<T, NT, WARPS, U, false, FORM>(x, w, nullptr, 0, out, pdl, s);
}

template <typename T, int NT, int WARPS, int U>
void dispatch_form(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& residual,
                   at::Tensor& out, int64_t form, bool pdl, cudaStream_t s) {
  if (form == 0) return dispatch_res<T, NT, WARPS, U, 0>(x, w, residual, out, pdl, s);
  if constexpr (NT == 1 && WARPS <= 8) {  // the forms compiled for the dispatcher's scope only
    if (form == 1) return dispatch_res<T, NT, WARPS, U, 1>(x, w, residual, out, pdl, s);
    if (form == 2) return dispatch_res<T, NT, WARPS, U, 2>(x, w, residual, out, pdl, s);
    if (form == 3) return dispatch_res<T, NT, WARPS, U, 3>(x, w, residual, out, pdl, s);
    if (form == 4) return dispatch_res<T, NT, WARPS, U, 4>(x, w, residual, out, pdl, s);
    if (form == 5) return dispatch_res<T, NT, WARPS, U, 5>(x, w, residual, out, pdl, s);
  }
  TORCH_CHECK(false, "vllm_specla.skinny_gemm: form 1-5 need M <= 8 and warps 4 | 8");
}

template <typename T, int NT>
void dispatch_cfg(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& residual,
                  at::Tensor& out, int64_t warps, int64_t unroll, int64_t form, bool pdl, cudaStream_t s) {
#define SG_CASE(W_, U_)                                                \
  if (warps == W_ && unroll == U_) {                                   \
    dispatch_form<T, NT, W_, U_>(x, w, residual, out, form, pdl, s);   \
    return;                                                            \
  }
  SG_CASE(4, 4) SG_CASE(4, 8) SG_CASE(8, 4) SG_CASE(8, 8) SG_CASE(16, 4) SG_CASE(16, 8)
#undef SG_CASE
  TORCH_CHECK(false, "vllm_specla.skinny_gemm: (warps, unroll) must be one of (4|8|16, 4|8) or (0, 0)");
}

// The automatic config: the tile form, 8 warps x 8 chunks (each warp's K range in one load batch for
// K <= 2048), the fastest of s15a's sweep (one config for a whole step's GEMM chain, flame / map, 1-8 rows).
void auto_cfg(int64_t& warps, int64_t& unroll, int64_t& form) {
  warps = 8;
  unroll = 8;
  form = 0;
}

// warps (4 | 8 | 16), unroll (4 | 8), form (0-5; 1-5 with warps 4 | 8 and M <= 8), or 0 / 0 / 0 for
// the automatic config. The Python wrapper (ops/_cpp.py skinny_gemm) checks every input before this
// runs: a failed TORCH_CHECK inside this JIT-built op crashed the process on the H200 (s15b) instead of
// raising.
void skinny_gemm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& residual,
                 at::Tensor& out, int64_t warps, int64_t unroll, int64_t form, bool pdl) {
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
  if (warps == 0 && unroll == 0 && form == 0) auto_cfg(warps, unroll, form);
  TORCH_CHECK(form == 0 || M <= 8, f, ": form 1-5 take at most 8 rows");
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t s = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  if (w.scalar_type() == at::kBFloat16) {
    if (M <= 8)
      dispatch_cfg<__nv_bfloat16, 1>(x, w, residual, out, warps, unroll, form, pdl, s);
    else
      dispatch_cfg<__nv_bfloat16, 2>(x, w, residual, out, warps, unroll, form, pdl, s);
  } else {
    if (M <= 8)
      dispatch_cfg<__half, 1>(x, w, residual, out, warps, unroll, form, pdl, s);
    else
      dispatch_cfg<__half, 2>(x, w, residual, out, warps, unroll, form, pdl, s);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(vllm_specla, m) {
  m.def(
      "skinny_gemm(Tensor x, Tensor w, Tensor? residual, Tensor(a!) out, int warps, int unroll, int form, bool pdl) -> "
      "()");
}

TORCH_LIBRARY_IMPL(vllm_specla, CUDA, m) { m.impl("skinny_gemm", &skinny_gemm); }
