// CUDA kernel of torch.ops.vllm_specla.chain_verify (schema: csrc/torch_bindings.cpp).
//
// JIT-built on a machine with CUDA torch by vllm_specla.ops._cpp.load_cuda() (run on the H200)
// (torch.utils.cpp_extension.load of csrc/cuda/*); never executed by its author (no GPU).
// The C++ CPU extension (vllm_specla._C) must be loaded first: it defines the op schemas.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>

#include "chain_verify.cuh"

namespace {

at::Tensor idx64(const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), "vllm_specla chain_verify (CUDA): index tensors must be on the GPU");
  return t.to(at::kLong).contiguous();
}

const int64_t* opt_idx(const std::optional<at::Tensor>& t, std::optional<at::Tensor>& keep) {
  if (!t.has_value()) return nullptr;
  keep = idx64(*t);
  return keep->data_ptr<int64_t>();
}

// x itself when every dim but the first (token) dim is densely packed, else a contiguous copy:
// token-strided inputs (column slices of one projection output) are read in place.
at::Tensor rows_dense(const at::Tensor& x) {
  int64_t expect = 1;
  for (int64_t d = x.dim() - 1; d >= 1; --d) {
    if (x.size(d) != 1 && x.stride(d) != expect) return x.contiguous();
    expect *= x.size(d);
  }
  return x;
}

// Tuning overrides, read at each call (benchmarks/bench_csrc_cuda.py --bv / --regcap / --layout, the GPU tests). Each
// variable takes the values listed at its reader; unset or empty is the default; anything else is an error naming
// the variable and its values (env_choice / env_word / env_count): a stale or mistyped setting must not run another
// kernel form under its name.

// The value of environment variable `name` among `allowed`; unset or empty: `unset`; anything else is an error.
int env_choice(const char* name, std::initializer_list<int> allowed, int unset) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return unset;
  const std::string v(s);
  std::string list;
  for (const int a : allowed) {
    if (v == std::to_string(a)) return a;
    list += (list.empty() ? "" : ", ") + std::to_string(a);
  }
  TORCH_CHECK(false, name, " must be one of ", list, " (or unset), got '", v, "'");
  return unset;
}

// A tuning variable whose forms were removed: set (non-empty) is an error naming why, so an old A/B setting does
// not run the remaining form under its name.
void env_removed(const char* name, const char* why) {
  const char* s = std::getenv(name);
  TORCH_CHECK(s == nullptr || *s == '\0', name, " must be unset: ", why, "; got '", s == nullptr ? "" : s, "'");
}

// The index in `words` of environment variable `name`'s value; unset or empty: `unset`; anything else is an error.
int env_word(const char* name, std::initializer_list<const char*> words, int unset) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return unset;
  const std::string v(s);
  std::string list;
  int i = 0;
  for (const char* w : words) {
    if (v == w) return i;
    list += (list.empty() ? "" : ", ") + std::string(w);
    ++i;
  }
  TORCH_CHECK(false, name, " must be one of ", list, " (or unset), got '", v, "'");
  return unset;
}

// A count >= 0 in environment variable `name` (decimal digits only, at most 6); unset or empty: `unset`.
int env_count(const char* name, int unset) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return unset;
  const std::string v(s);
  TORCH_CHECK(v.size() <= 6 && v.find_first_not_of("0123456789") == std::string::npos, name,
              " must be a count (0, 1, 2, ...) (or unset), got '", v, "'");
  return std::stoi(v);
}

// Value rows per warp, VLLM_SPECLA_CUDA_BV=4|8; 0 or unset: automatic.
int bv_override() { return env_choice("VLLM_SPECLA_CUDA_BV", {0, 4, 8}, 0); }

// Warp layout override VLLM_SPECLA_CUDA_LAYOUT: rowgroup | rowgroup8 | rs | rowgroup16 | rowgroup32 | sb
// (16 / 32 lanes per value row; rowgroup32 needs K = 256 and runs rowgroup16 for K = 128; any
// row group runs v3 off the 16-byte path or for other K) | ut (the UT-form kernel,
// chain_verify_ut.cu; strict: an error where it does not apply); auto or unset: automatic.
int layout_override() {
  namespace c = vllm_specla::cuda;
  static constexpr int kCodes[] = {c::kLayoutAuto,       c::kLayoutRowGroup,   c::kLayoutRowGroup8, c::kLayoutRS,
                                   c::kLayoutRowGroup16, c::kLayoutRowGroup32, c::kLayoutUT,        c::kLayoutSB};
  return kCodes[env_word("VLLM_SPECLA_CUDA_LAYOUT",
                         {"auto", "rowgroup", "rowgroup8", "rs", "rowgroup16", "rowgroup32", "ut", "sb"}, 0)];
}

// Programmatic dependent launch, VLLM_SPECLA_PDL (the Triton kernels' switch, ops/pdl.py): 0 plain launches,
// 1 (or unset) PDL where the kernel's PTX is sm_90+ (chain_verify.cuh, launch_pdl).
bool pdl_on() { return env_choice("VLLM_SPECLA_PDL", {0, 1}, 1) == 1; }

// Warps per CTA of the UT-form kernel, VLLM_SPECLA_CUDA_UT_NW=1|4 (unset: 4).
int ut_nw_override() { return env_choice("VLLM_SPECLA_CUDA_UT_NW", {1, 4}, 4); }

// Build variant of the UT-form kernel, VLLM_SPECLA_CUDA_UT_VAR=1..3 (A/B runs: 1 = per-thread
// cp.async stage refills, 2 = TMA refills, 3 = 2 with 16 lanes per value row); unset or empty:
// automatic (2 or 3 by the cost model on sm_90+; chain_verify_ut.cu, dispatch_nw). Any other value
// is an error (session 8 removed variants 4 / 5: a stale setting must not run the automatic kernel
// under its name).
int ut_var_override() {
  const char* s = std::getenv("VLLM_SPECLA_CUDA_UT_VAR");
  if (s == nullptr || *s == '\0') return -1;
  const std::string v(s);
  TORCH_CHECK(v == "1" || v == "2" || v == "3", "VLLM_SPECLA_CUDA_UT_VAR must be 1, 2 or 3 (or unset: automatic), got '",
              v, "'");
  return std::atoi(s);
}

// Phase 5 / 4 forms of the UT-form kernel (chain_verify_ut.cu, P5), VLLM_SPECLA_CUDA_UT_P5=0|1|2
// forces one (A/B runs; all bit-identical): 0 the previous phase 5, 1 phase 5 with v~ in registers
// (0.76-0.99x the time of 0 on the H200, RESULTS.md session 7), 2 that plus one batched
// reduce-scatter of the window products; 3 or unset: 1 or 2 by the shuffle count (launch_form).
int ut_p5_override() { return env_choice("VLLM_SPECLA_CUDA_UT_P5", {0, 1, 2, 3}, 3); }

// One TMA bulk copy per state row in the UT kernel's stage refills, VLLM_SPECLA_CUDA_UT_ROWCOPY=1
// (A/B runs; 0 or unset: one copy per warp tile where its rows are contiguous).
bool ut_row_copies_override() { return env_choice("VLLM_SPECLA_CUDA_UT_ROWCOPY", {0, 1}, 0) == 1; }

// Value tiles per CTA of the UT-form kernel, VLLM_SPECLA_CUDA_UT_TPC (a count; 0 or unset: automatic).
int ut_tpc_override() { return env_count("VLLM_SPECLA_CUDA_UT_TPC", 0); }

// The UT kernel in the automatic layout, VLLM_SPECLA_CUDA_UT: 0 never, 1 for every verify / step
// window it takes, unset: the shape rule (chain_verify_ut.cu, chain_verify_ut_auto).
int ut_auto_override() { return env_choice("VLLM_SPECLA_CUDA_UT", {0, 1}, -1); }

// The register-capped kernel variants (chain_verify.cu, min_blocks): VLLM_SPECLA_CUDA_REGCAP=0 off; 1 or unset on.
bool reg_cap() { return env_choice("VLLM_SPECLA_CUDA_REGCAP", {0, 1}, 1) == 1; }

// Row-group prefetch ring (chain_verify.cu, chain_verify_rg_body_pf). Default (unset): the ring for
// SpecLA steps (pending factors), which it makes 1-7 % faster at batch 1-2, and the one-ahead
// double buffer for verify and AR, which the ring made 3-9 % slower (H200, RESULTS.md session 4).
// VLLM_SPECLA_CUDA_RG_PREFETCH=0: never (and the old automatic rule: steps with pending factors
// on v3 at small batch); =1: always.
bool rg_prefetch(bool has_pending) {
  const int v = env_choice("VLLM_SPECLA_CUDA_RG_PREFETCH", {0, 1}, -1);
  return v < 0 ? has_pending : v == 1;
}

// Keys per lane piece of the row-group kernels' one-ahead body (chain_verify.cu, rg_key), VLLM_SPECLA_CUDA_RG_PIECE:
// 8 (every kernel before session 21), 4 or unset: 4 (A/B of session 21).
int rg_piece() { return env_choice("VLLM_SPECLA_CUDA_RG_PIECE", {4, 8}, 4); }

// The row-group AR body (chain_verify.cu, chain_verify_rg_ar), VLLM_SPECLA_CUDA_RG_AR: 0 the one-ahead body, 1 the AR
// body where it applies, 2 the AR body at most 12 CTAs per SM (the form of sessions 22-23), 3 the RAW AR body (q / k
// kept as loaded; plain AR), 4 or unset: 3 for bf16 at K = 256 where two launches' CTAs fit on the GPU at once, else 2
// (session 23 A/B; RESULTS.md "Session 23").
int rg_ar() { return env_choice("VLLM_SPECLA_CUDA_RG_AR", {0, 1, 2, 3, 4}, 4); }

template <int D>
void strides(const at::Tensor& t, int64_t* out) {
  TORCH_CHECK(t.dim() == D, "expected a ", D, "-d tensor");
  for (int d = 0; d < D; ++d) out[d] = t.stride(d);
}

at::Tensor chain_verify_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                             const at::Tensor& beta, double scale, const at::Tensor& state, const at::Tensor& slots,
                             const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& bank_k,
                             const std::optional<at::Tensor>& bank_v, const std::optional<at::Tensor>& bank_g,
                             const std::optional<at::Tensor>& write_bank,
                             const std::optional<at::Tensor>& pending_len,
                             const std::optional<at::Tensor>& read_bank, bool write_final_state,
                             bool use_qk_l2norm) {
  TORCH_CHECK(state.is_cuda() && state.scalar_type() == at::kFloat, "state must be a CUDA float32 tensor");
  const c10::cuda::CUDAGuard guard(state.device());
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && g.is_cuda() && beta.is_cuda(),
              "vllm_specla chain_verify (CUDA): all tensors must be on the GPU");
  // Windows longer than the bank (Tmax) are not checked here (that needs a host sync of
  // cu_seqlens): factors past Tmax are not recorded.
  // q, k, v: bf16 is read (and widened) in the kernel; anything else is converted to fp32 here
  const bool in_bf16 = q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                       v.scalar_type() == at::kBFloat16;
  const auto in_t = in_bf16 ? at::kBFloat16 : at::kFloat;
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && g.dim() == 2 && beta.dim() == 2,
              "chain_verify (CUDA): q, k [N, H, K], v [N, HV, V], g, beta [N, HV]");
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && g.size(0) == q.size(0) && beta.size(0) == q.size(0),
              "chain_verify (CUDA): q, k, v, g, beta must have the same number of tokens N (dim 0)");
  at::Tensor qf = rows_dense(q.to(in_t)), kf = rows_dense(k.to(in_t));
  at::Tensor vf = rows_dense(v.to(in_t)), gf = rows_dense(g.to(at::kFloat));
  at::Tensor bf = rows_dense(beta.to(at::kFloat));
  at::Tensor sl = idx64(slots), cu = idx64(cu_seqlens);
  std::optional<at::Tensor> wb, pl, rb;
  vllm_specla::cuda::ChainVerifyParams p{};
  p.q = qf.data_ptr();
  p.k = kf.data_ptr();
  p.v = vf.data_ptr();
  p.in_bf16 = in_bf16;
  p.g = gf.data_ptr<float>();
  p.beta = bf.data_ptr<float>();
  p.tok_stride[0] = qf.stride(0);
  p.tok_stride[1] = kf.stride(0);
  p.tok_stride[2] = vf.stride(0);
  p.tok_stride[3] = gf.stride(0);
  p.tok_stride[4] = bf.stride(0);
  at::Tensor o = at::empty(vf.sizes(), vf.options().dtype(at::kFloat));
  p.o = o.data_ptr<float>();
  p.state = state.data_ptr<float>();
  strides<4>(state, p.st_stride);
  p.slots = sl.data_ptr<int64_t>();
  p.cu_seqlens = cu.data_ptr<int64_t>();
  p.write_bank = opt_idx(write_bank, wb);
  p.pending_len = opt_idx(pending_len, pl);
  p.read_bank = opt_idx(read_bank, rb);
  const bool banks = bank_k.has_value() && bank_v.has_value() && bank_g.has_value();
  // caller-provided arguments: ValueError naming them, as the CPU op and vllm_specla/ops/reference.py (their
  // values, read on the host there, are not checked here: that needs a host sync)
  TORCH_CHECK_VALUE(banks || p.write_bank == nullptr, "write_bank needs the factor banks");
  TORCH_CHECK_VALUE(banks || p.pending_len == nullptr, "pending_len needs read_bank and the factor banks");
  TORCH_CHECK_VALUE(p.pending_len == nullptr || p.read_bank != nullptr,
                    "pending_len needs read_bank and the factor banks");
  if (banks) {
    p.bank_k = bank_k->data_ptr<float>();
    p.bank_v = bank_v->data_ptr<float>();
    p.bank_g = bank_g->data_ptr<float>();
    strides<5>(*bank_k, p.bk_stride);
    strides<5>(*bank_v, p.bv_stride);
    strides<4>(*bank_g, p.bg_stride);
    p.Tmax = static_cast<int>(bank_k->size(2));
  }
  p.R = static_cast<int>(std::max<int64_t>(cu.numel() - 1, 0));
  TORCH_CHECK_VALUE(sl.numel() >= p.R, "slots must have an entry for each of the ", p.R, " rows, got ", sl.numel());
  p.N = static_cast<int>(q.size(0));
  p.bv = bv_override();
  p.reg_cap = reg_cap();
  p.rg_prefetch = rg_prefetch(p.pending_len != nullptr);
  p.rg_piece = rg_piece();
  p.rg_ar = rg_ar();
  p.layout = layout_override();
  p.ut_nw = ut_nw_override();
  p.ut_tpc = ut_tpc_override();
  p.ut_var = ut_var_override();
  p.ut_p5 = ut_p5_override();
  p.ut_row_copies = ut_row_copies_override();
  p.ut_auto = ut_auto_override();
  p.pdl = pdl_on();
  env_removed("VLLM_SPECLA_CUDA_SB_LATE", "the sb kernel has one prefetch form since session 20 (PF 0 / 2 removed)");
  env_removed("VLLM_SPECLA_CUDA_SB_SCALED", "the sb kernel's scaled tile was removed in session 20");
  env_removed("VLLM_SPECLA_CUDA_STORE_SWAP", "the lane-pair swapped state stores were removed in session 21");
  p.H = static_cast<int>(q.size(1));
  p.K = static_cast<int>(q.size(2));
  p.HV = static_cast<int>(v.size(1));
  p.V = static_cast<int>(v.size(2));
  TORCH_CHECK(p.H > 0 && p.HV % p.H == 0, "chain_verify (CUDA): HV must be a multiple of H");
  p.scale = static_cast<float>(scale);
  p.write_final_state = write_final_state;
  // 16-byte path: every row start 16-byte aligned (base pointer and all outer strides), unit key
  // strides; K % 128 == 0 makes the per-head offsets h * K aligned too
  auto al16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const int64_t in_vec = in_bf16 ? 8 : 4;  // elements per 16 bytes
  p.vec_ok = p.K % 128 == 0 && al16(p.q) && al16(p.k) && p.tok_stride[0] % in_vec == 0 &&
             p.tok_stride[1] % in_vec == 0 && qf.stride(2) == 1 && kf.stride(2) == 1 && al16(p.state) &&
             p.st_stride[3] == 1 && p.st_stride[0] % 4 == 0 && p.st_stride[1] % 4 == 0 && p.st_stride[2] % 4 == 0 &&
             (!banks || (al16(p.bank_k) && p.bk_stride[4] == 1 && p.bk_stride[0] % 4 == 0 &&
                         p.bk_stride[1] % 4 == 0 && p.bk_stride[2] % 4 == 0 && p.bk_stride[3] % 4 == 0));
  p.use_qk_l2norm = use_qk_l2norm;
  const cudaError_t err = vllm_specla::cuda::chain_verify(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "vllm_specla chain_verify CUDA launch failed: ", cudaGetErrorString(err));
  return o;
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_specla, CUDA, m) { m.impl("chain_verify", &chain_verify_cuda); }
