// DeltaConstruct recovery, conv verify (deferred conv commit) and conv commit, CPU.
//
// Semantics: vllm_specla/ops/reference.py::recover_ref, conv_verify_ref, conv_commit_ref
// (ALGORITHMS.md §2, §6).

#include "common.h"
#include "ops.h"

#include <ATen/Dispatch.h>

#include <unordered_set>

namespace vllm_specla {
namespace cpu {
namespace {

constexpr int64_t kBlockC = 256;  // conv channels per task

// y[t, c] = SiLU(sum_j w[c, j] z[t + j, c]) for T rows of nc channels; z rows are nc apart, wT is the
// transposed weight [W, C] at this block's first channel (rows C apart), y rows ystride apart.
// Same summation order as the reference (0 + w_0 z_0 + w_1 z_1 + ...).
SPECLA_HOT void conv_silu_rows(const float* z, const float* wT, int64_t C, int64_t W, int64_t T, int64_t nc,
                               float* y, int64_t ystride) {
  for (int64_t t = 0; t < T; ++t) {
    float* __restrict yo = y + t * ystride;
    for (int64_t c = 0; c < nc; ++c) yo[c] = 0.f;
    for (int64_t j = 0; j < W; ++j) {
      const float* __restrict wj = wT + j * C;
      const float* __restrict zj = z + (t + j) * nc;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) yo[c] = yo[c] + wj[c] * zj[c];
    }
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) yo[c] = yo[c] / (1.f + exp_vec(-yo[c]));
  }
}

// dst[c * ds] = src[c * ss] for c < n, converting; unit strides take a vectorisable loop.
template <typename D, typename S>
inline void copy_cvt(D* __restrict dst, int64_t ds, const S* __restrict src, int64_t ss, int64_t n) {
  if (ds == 1 && ss == 1) {
    for (int64_t c = 0; c < n; ++c) dst[c] = static_cast<D>(src[c]);
  } else {
    for (int64_t c = 0; c < n; ++c) dst[c * ds] = static_cast<D>(src[c * ss]);
  }
}

struct RecoverArgs {
  Strided st, bk, bv, bg;
  int64_t HV, V, K, G;
};

template <int64_t KC>
SPECLA_INLINE void recover_rows(const RecoverArgs& a, int64_t slot, int64_t bank, int64_t n, int64_t hv, int64_t v0,
                         int64_t v1, const float* kp, const float* w, float e0, float* mbuf) {
  const int64_t K = KC > 0 ? KC : a.K;
  alignas(64) float mloc[KC > 0 ? KC : 1];
  float* m = KC > 0 ? mloc : mbuf;
  for (int64_t vi = v0; vi < v1; ++vi) {
    float* srow = a.st.at4(slot, hv, vi, 0);
    load_row(m, srow, K, a.st.s[3]);
    for (int64_t j = 0; j < K; ++j) m[j] *= e0;
    for (int64_t u = 0; u < n; ++u) {
      const float c = w[u] * *a.bv.at5(slot, bank, u, hv, vi);
      scale_add_(m, 1.f, c, kp + u * K, K);
    }
    store_row(srow, a.st.s[3], m, K);
  }
}

// One (row, value head, value block) of DeltaConstruct, closed form.
SPECLA_HOT void recover_task(const RecoverArgs& a, int64_t slot, int64_t bank, int64_t n, int64_t hv, int64_t vb,
                             std::vector<float>& buf) {
  const int64_t K = a.K, V = a.V, h = hv / a.G;
  buf.resize(K + n * K + n);
  float* m = buf.data();
  float* kp = m + K;
  float* w = kp + n * K;
  float Gc = 0.f;  // cumulative log decay, then w_u = e^{G_A - G_u}
  for (int64_t u = 0; u < n; ++u) {
    Gc += *a.bg.at4(slot, bank, u, hv);
    w[u] = Gc;
    load_row(kp + u * K, a.bk.at5(slot, bank, u, h, 0), K, a.bk.s[4]);
  }
  for (int64_t u = 0; u < n; ++u) w[u] = std::exp(Gc - w[u]);
  const float e0 = std::exp(Gc);
  const int64_t v0 = vb * kBlockV, v1 = std::min(V, v0 + kBlockV);
  switch (K) {
    case 64: recover_rows<64>(a, slot, bank, n, hv, v0, v1, kp, w, e0, m); break;
    case 128: recover_rows<128>(a, slot, bank, n, hv, v0, v1, kp, w, e0, m); break;
    case 256: recover_rows<256>(a, slot, bank, n, hv, v0, v1, kp, w, e0, m); break;
    default: recover_rows<0>(a, slot, bank, n, hv, v0, v1, kp, w, e0, m);
  }
}

void check_unique_slots(const std::vector<int64_t>& slots, const std::vector<int64_t>& active) {
  std::unordered_set<int64_t> seen;
  for (size_t r = 0; r < slots.size(); ++r)
    if (active[r] > 0)
      TORCH_CHECK_VALUE(seen.insert(slots[r]).second, "slots: a state slot is written by two rows (slot ", slots[r],
                        ")");
}

// The rows of a commit (recover / conv_commit) with num_accepted > 0, checked as
// vllm_specla/ops/reference.py _commit_rows does (ValueError naming the argument); rows with 0 or less
// are skipped unread, as in the Triton kernels.
std::vector<int64_t> commit_rows(const std::vector<int64_t>& sl, const std::vector<int64_t>& bi,
                                 const std::vector<int64_t>& na, int64_t S, int64_t Tmax) {
  const int64_t R = static_cast<int64_t>(sl.size());
  check_rows(bi, R, "bank_idx");
  check_rows(na, R, "num_accepted");
  std::vector<int64_t> act;
  for (int64_t r = 0; r < R; ++r) {
    if (na[r] <= 0) continue;
    check_in(sl[r], 0, S, "slots");
    check_in(bi[r], 0, 2, "bank_idx");
    TORCH_CHECK_VALUE(na[r] <= Tmax, "num_accepted ", na[r], " exceeds the factor bank (Tmax=", Tmax, ")");
    act.push_back(r);
  }
  check_unique_slots(sl, na);
  return act;
}

}  // namespace

// state[s] = e^{G_A} state[s] + sum_{u<A} e^{G_A - G_u} v~_u k_u^T, A = num_accepted[r] (closed form).
void recover(const at::Tensor& state, const at::Tensor& slots, const at::Tensor& bank_k, const at::Tensor& bank_v,
             const at::Tensor& bank_g, const at::Tensor& bank_idx, const at::Tensor& num_accepted) {
  check_f32(state, "state");
  check_f32(bank_k, "bank_k");
  check_f32(bank_v, "bank_v");
  check_f32(bank_g, "bank_g");
  TORCH_CHECK(state.dim() == 4 && bank_k.dim() == 5 && bank_v.dim() == 5 && bank_g.dim() == 4,
              "recover: state [S, HV, V, K], bank_k [S, 2, Tmax, H, K], bank_v [S, 2, Tmax, HV, V], "
              "bank_g [S, 2, Tmax, HV]");
  const int64_t S = state.size(0), HV = state.size(1), V = state.size(2), K = state.size(3);
  const int64_t Tmax = bank_k.size(2), H = bank_k.size(3);
  TORCH_CHECK(bank_k.size(0) == S && bank_k.size(4) == K && H > 0 && HV % H == 0, "bank_k shape mismatch");
  TORCH_CHECK(bank_v.size(0) == S && bank_v.size(2) == Tmax && bank_v.size(3) == HV && bank_v.size(4) == V,
              "bank_v shape mismatch");
  TORCH_CHECK(bank_g.size(0) == S && bank_g.size(2) == Tmax && bank_g.size(3) == HV, "bank_g shape mismatch");
  const std::vector<int64_t> sl = to_vec(slots, "slots");
  const std::vector<int64_t> bi = to_vec(bank_idx, "bank_idx");
  const std::vector<int64_t> na = to_vec(num_accepted, "num_accepted");
  const std::vector<int64_t> act = commit_rows(sl, bi, na, S, Tmax);  // active rows
  if (act.empty()) return;
  RecoverArgs a{Strided(state), Strided(bank_k), Strided(bank_v), Strided(bank_g), HV, V, K, HV / H};
  const int64_t NVB = (V + kBlockV - 1) / kBlockV;
  const int64_t ntask = static_cast<int64_t>(act.size()) * HV * NVB;
  int64_t max_n = 0;
  for (int64_t r : act) max_n = std::max(max_n, na[r]);
  at::parallel_for(0, ntask, grain_for(std::min(V, kBlockV) * K * (max_n + 1)), [&](int64_t b, int64_t e) {
    std::vector<float> buf;
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = act[i / (HV * NVB)];
      recover_task(a, sl[r], bi[r], na[r], (i / NVB) % HV, i % NVB, buf);
    }
  });
}

at::Tensor conv_verify(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cu_seqlens,
                       const at::Tensor& conv_state, const at::Tensor& slots, const std::optional<at::Tensor>& bank_x,
                       const std::optional<at::Tensor>& write_bank, const std::optional<at::Tensor>& pending_len,
                       const std::optional<at::Tensor>& read_bank, bool write_final_state) {
  check_cpu(conv_state, "conv_state");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && conv_state.dim() == 3,
              "conv_verify: x [N, C], weight [C, W], conv_state [S, W-1, C]");
  const int64_t N = x.size(0), C = x.size(1), W = weight.size(1), W1 = W - 1;
  const int64_t S = conv_state.size(0);
  TORCH_CHECK(weight.size(0) == C && conv_state.size(1) == W1 && conv_state.size(2) == C && W >= 1,
              "conv_verify: shape mismatch (x ", x.sizes(), ", weight ", weight.sizes(), ", conv_state ",
              conv_state.sizes(), ")");
  // caller-provided values: ValueError naming the argument, as vllm_specla/ops/reference.py (_check_row_args)
  const std::vector<int64_t> cu = to_vec(cu_seqlens, "cu_seqlens");
  check_cu_seqlens(cu, N);
  const int64_t R = std::max<int64_t>(static_cast<int64_t>(cu.size()) - 1, 0);
  std::vector<int64_t> sl = to_vec(slots, "slots");
  check_rows(sl, R, "slots");
  sl.resize(R);  // (entries past the rows are not used)
  const std::vector<int64_t> wbv = opt_vec(write_bank, "write_bank");
  std::vector<int64_t> plv = opt_vec(pending_len, "pending_len");
  const std::vector<int64_t> rbv = opt_vec(read_bank, "read_bank");
  const bool record = write_bank.has_value();
  if (pending_len.has_value()) check_rows(plv, R, "pending_len");
  if (plv.empty()) plv.assign(R, 0);
  if (record) check_rows(wbv, R, "write_bank");
  bool need_bank = record;
  std::vector<int64_t> writes(R, 0);
  for (int64_t r = 0; r < R; ++r) {
    check_in(sl[r], 0, S, "slots");
    if (plv[r] > 0) {
      need_bank = true;
      TORCH_CHECK_VALUE(read_bank.has_value() && bank_x.has_value(),
                        "pending_len > 0 needs read_bank and the factor banks");
      check_rows(rbv, R, "read_bank");
      check_in(rbv[r], 0, 2, "read_bank");
    }
    if (record) check_in(wbv[r], 0, 2, "write_bank");
    writes[r] = (plv[r] > 0 || write_final_state) ? 1 : 0;
  }
  TORCH_CHECK_VALUE(!record || bank_x.has_value(), "write_bank needs the factor banks");
  check_unique_slots(sl, writes);
  Strided bx;
  int64_t Tmax = 0;
  if (need_bank) {
    check_f32(*bank_x, "bank_x");
    TORCH_CHECK(bank_x->dim() == 4 && bank_x->size(0) == S && bank_x->size(1) == 2 && bank_x->size(3) == C,
                "bank_x must be [S, 2, Tmax, C]");
    Tmax = bank_x->size(2);
    bx = Strided(*bank_x);
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK_VALUE(plv[r] <= Tmax, "pending_len ", plv[r], " exceeds the factor bank (Tmax=", Tmax, ")");
      if (record)
        TORCH_CHECK_VALUE(cu[r + 1] - cu[r] <= Tmax, "window of ", cu[r + 1] - cu[r],
                          " tokens exceeds the factor bank (Tmax=", Tmax, ")");
    }
  }
  at::Tensor xf = f32c(x, "x"), wf = f32c(weight, "weight");
  std::vector<float> wT(W * C);  // transposed weight [W, C]: channel-contiguous rows
  {
    const float* w0 = wf.data_ptr<float>();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t j = 0; j < W; ++j) wT[j * C + c] = w0[c * W + j];
  }
  at::Tensor y = at::empty({N, C}, xf.options());
  const float* xp = xf.data_ptr<float>();
  const float* wp = wT.data();
  float* yp = y.data_ptr<float>();
  const int64_t NCB = (C + kBlockC - 1) / kBlockC;
  const int64_t cs0 = conv_state.stride(0), cs1 = conv_state.stride(1), cs2 = conv_state.stride(2);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, conv_state.scalar_type(), "conv_verify_cpu", [&] {
    scalar_t* csp = conv_state.data_ptr<scalar_t>();
    at::parallel_for(0, R * NCB, grain_for(kBlockC * W * (N / std::max<int64_t>(R, 1) + 1)), [&](int64_t b, int64_t e) {
      std::vector<float> z;
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = i / NCB, cb = i % NCB;
        const int64_t c0 = cb * kBlockC, nc = std::min(C, c0 + kBlockC) - c0;
        const int64_t s = cu[r], T = cu[r + 1] - cu[r], slot = sl[r], p = plv[r];
        z.resize((W1 + T) * nc);  // rows: history (W-1) ++ window (T), channels c0..c0+nc
        scalar_t* hs = csp + slot * cs0 + c0 * cs2;
        for (int64_t j = 0; j < W1; ++j)
          copy_cvt(&z[j * nc], 1, hs + j * cs1, cs2, nc);
        if (p > 0) {  // deferred conv commit: history = last W-1 of (history ++ pending inputs)
          const int64_t rb = rbv[r];
          for (int64_t j = 0; j < W1; ++j) {
            const int64_t idx = p + j;  // > j: rows not yet overwritten
            if (idx < W1) {
              std::copy(&z[idx * nc], &z[idx * nc] + nc, &z[j * nc]);
            } else {
              copy_cvt(&z[j * nc], 1, static_cast<const float*>(bx.at4(slot, rb, idx - W1, c0)), bx.s[3], nc);
            }
          }
          for (int64_t j = 0; j < W1; ++j)
            copy_cvt(hs + j * cs1, cs2, &z[j * nc], 1, nc);
        }
        for (int64_t t = 0; t < T; ++t) std::copy(xp + (s + t) * C + c0, xp + (s + t) * C + c0 + nc, &z[(W1 + t) * nc]);
        conv_silu_rows(z.data(), wp + c0, C, W, T, nc, yp + s * C + c0, C);
        if (record) {
          const int64_t wb = wbv[r];
          for (int64_t t = 0; t < T; ++t) store_row(bx.at4(slot, wb, t, c0), bx.s[3], &z[(W1 + t) * nc], nc);
        }
        if (write_final_state) {
          for (int64_t j = 0; j < W1; ++j)
            copy_cvt(hs + j * cs1, cs2, &z[(T + j) * nc], 1, nc);
        }
      }
    });
  });
  return y;
}

// conv_state[s] = last W-1 rows of (conv_state[s] ++ bank_x[s, bank, :A]).
void conv_commit(const at::Tensor& conv_state, const at::Tensor& slots, const at::Tensor& bank_x,
                 const at::Tensor& bank_idx, const at::Tensor& num_accepted) {
  check_cpu(conv_state, "conv_state");
  check_f32(bank_x, "bank_x");
  TORCH_CHECK(conv_state.dim() == 3 && bank_x.dim() == 4, "conv_commit: conv_state [S, W-1, C], bank_x [S, 2, Tmax, C]");
  const int64_t S = conv_state.size(0), W1 = conv_state.size(1), C = conv_state.size(2);
  const int64_t Tmax = bank_x.size(2);
  TORCH_CHECK(bank_x.size(0) == S && bank_x.size(1) == 2 && bank_x.size(3) == C, "bank_x shape mismatch");
  const std::vector<int64_t> sl = to_vec(slots, "slots");
  const std::vector<int64_t> bi = to_vec(bank_idx, "bank_idx");
  const std::vector<int64_t> na = to_vec(num_accepted, "num_accepted");
  const std::vector<int64_t> act = commit_rows(sl, bi, na, S, Tmax);
  if (act.empty() || W1 == 0) return;
  const Strided bx(bank_x);
  const int64_t NCB = (C + kBlockC - 1) / kBlockC;
  const int64_t cs0 = conv_state.stride(0), cs1 = conv_state.stride(1), cs2 = conv_state.stride(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, conv_state.scalar_type(), "conv_commit_cpu", [&] {
    scalar_t* csp = conv_state.data_ptr<scalar_t>();
    at::parallel_for(0, static_cast<int64_t>(act.size()) * NCB, grain_for(kBlockC * W1 * 4), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = act[i / NCB], cb = i % NCB;
        const int64_t c0 = cb * kBlockC, c1 = std::min(C, c0 + kBlockC);
        const int64_t slot = sl[r], bank = bi[r], n = na[r];
        scalar_t* hs = csp + slot * cs0;
        for (int64_t j = 0; j < W1; ++j) {
          const int64_t idx = n + j;  // > j: ascending j reads rows before they are overwritten
          if (idx < W1) {
            copy_cvt(hs + j * cs1 + c0 * cs2, cs2, static_cast<const scalar_t*>(hs + idx * cs1 + c0 * cs2), cs2,
                     c1 - c0);
          } else {
            const float* src = bx.at4(slot, bank, idx - W1, 0);
            copy_cvt(hs + j * cs1 + c0 * cs2, cs2, src + c0 * bx.s[3], bx.s[3], c1 - c0);
          }
        }
      }
    });
  });
}

}  // namespace cpu
}  // namespace vllm_specla
