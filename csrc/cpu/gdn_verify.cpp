// Chain verify and tree verify (sequential per-node form) with factor output, CPU.
//
// Semantics: vllm_specla/ops/reference.py::chain_verify_ref and
// vllm_specla/ops/tree_reference.py::tree_verify_sequential_ref (ALGORITHMS.md §2, §3, §4, §6).
//
// In [V, K] form every value row of the state evolves on its own:
//   m <- e^{g} m;  v~ = beta (v - m . k);  m <- m + v~ k;  o = m . q
// so one task owns (row, value head, block of kBlockV value rows) and keeps each K-float state
// row local (L1) across all tokens of the window: the durable state is read once, written at most
// twice (the folded pending commit S_0, and the final state for AR), never per token.
// Per token the two dot products m.k and m.q share one pass over the row:
//   o = e^{g} (m_old . q) + v~ (k . q)  (same value as (m_new . q) in exact arithmetic).

#include "common.h"
#include "ops.h"

#include <unordered_set>

namespace vllm_specla {
namespace cpu {
namespace {

struct Row {
  int64_t s, e, slot, p, rb, wb;
};

struct VerifyArgs {
  // token side (contiguous fp32)
  const float *qn, *kn, *kq, *v, *g, *beta;
  float* o;
  int64_t N, H, HV, K, V, G;
  // state and banks (strided)
  Strided state, bk, bv, bg;
  bool record, write_final;
  const int64_t* parents;  // tree: local parent per token, or nullptr for a chain
};

// Value rows [vi, vi + RB) of one (row, value head): pending fold, then the window. KC > 0: the
// key dim is a compile-time constant, so the RB state rows live in registers across the window;
// the RB rows are independent recurrences, interleaved so their reduction latencies overlap.
// Tree: node t's rows are stored at nodes[(t * RB + i) * K] (its children step from there).
template <int64_t KC, int RB>
SPECLA_INLINE void verify_group(const VerifyArgs& a, const Row& r, int64_t hv, int64_t vi, int64_t p, const float* kp,
                         const float* ep, const float* ea, float* nodes, float* mbuf, bool window) {
  const int64_t K = KC > 0 ? KC : a.K;
  const int64_t H = a.H, HV = a.HV, V = a.V, h = hv / a.G, T = r.e - r.s;
  const bool tree = a.parents != nullptr;
  alignas(64) float mloc[KC > 0 ? RB * KC : 1];
  float* m = KC > 0 ? mloc : mbuf;
  const int64_t sK = a.state.s[3];
  float* srow[RB];
  for (int i = 0; i < RB; ++i) {
    srow[i] = a.state.at4(r.slot, hv, vi + i, 0);
    load_row(m + i * K, srow[i], K, sK);
  }
  if (p > 0) {
    // serial DeltaConstruct: acc = e^{g_u} acc + v~_u k_u^T, u in path order
    for (int64_t u = 0; u < p; ++u) {
      const float* bvu = a.bv.at5(r.slot, r.rb, u, hv, vi);
      for (int i = 0; i < RB; ++i) scale_add_(m + i * K, ep[u], bvu[i * a.bv.s[4]], kp + u * K, K);
    }
    for (int i = 0; i < RB; ++i) store_row(srow[i], sK, m + i * K, K);  // S_0 written once
  }
  if (!window) return;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = r.s + t;
    const float* kt = a.kn + (n * H + h) * K;
    const float* qt = a.qn + (n * H + h) * K;
    const int64_t par = tree ? a.parents[n] : 0;
    const float* src = tree && par >= 0 ? nodes + par * RB * K : m;
    float dk[RB], dq[RB], vt[RB];
    for (int i = 0; i < RB; ++i) dot2(src + i * K, kt, qt, K, dk[i], dq[i]);
    const float e = ea[t], b = a.beta[n * HV + hv], kq = a.kq[n * H + h];
    const float* vn = a.v + (n * HV + hv) * V + vi;
    float* on = a.o + (n * HV + hv) * V + vi;
    for (int i = 0; i < RB; ++i) {
      vt[i] = b * (vn[i] - e * dk[i]);
      on[i] = e * dq[i] + vt[i] * kq;
    }
    if (tree) {
      float* dst = nodes + t * RB * K;  // node state from its parent's (never in place)
      for (int i = 0; i < RB; ++i) scale_add(dst + i * K, src + i * K, e, vt[i], kt, K);
    } else {
      for (int i = 0; i < RB; ++i) scale_add_(m + i * K, e, vt[i], kt, K);
    }
    if (a.record) {
      float* bvt = a.bv.at5(r.slot, r.wb, t, hv, vi);
      for (int i = 0; i < RB; ++i) bvt[i * a.bv.s[4]] = vt[i];
    }
  }
  if (a.write_final)
    for (int i = 0; i < RB; ++i) store_row(srow[i], sK, m + i * K, K);
}

template <int64_t KC>
SPECLA_INLINE void verify_rows(const VerifyArgs& a, const Row& r, int64_t hv, int64_t v0, int64_t v1, int64_t p,
                        const float* kp, const float* ep, const float* ea, float* nodes, float* mbuf, bool window) {
  constexpr int RB = KC > 0 && KC <= 128 ? 4 : 1;
  int64_t vi = v0;
  for (; vi + RB <= v1; vi += RB) verify_group<KC, RB>(a, r, hv, vi, p, kp, ep, ea, nodes, mbuf, window);
  for (; vi < v1; ++vi) verify_group<KC, 1>(a, r, hv, vi, p, kp, ep, ea, nodes, mbuf, window);
}

// One (row, value head, value block) task. fold: apply the pending factors and write S_0;
// window: run the window from the (folded) state and record the factors.
SPECLA_HOT void verify_task(const VerifyArgs& a, const Row& r, int64_t hv, int64_t vb, bool fold, bool window,
                            std::vector<float>& buf) {
  const int64_t K = a.K, H = a.H, HV = a.HV, V = a.V;
  const int64_t h = hv / a.G;
  const int64_t T = r.e - r.s;
  const int64_t p = fold ? r.p : 0;
  const int64_t v0 = vb * kBlockV, v1 = std::min(V, v0 + kBlockV);
  const bool tree = a.parents != nullptr;
  // scratch: m [4*K] | kp [p*K] | ep [p] | ea [T] | nodes [T*4*K] (tree; 4 = max rows per group)
  const size_t need = 4 * K + p * K + p + T + (tree ? T * 4 * K : 0);
  if (buf.size() < need) buf.resize(need);
  float* m = buf.data();
  float* kp = m + 4 * K;
  float* ep = kp + p * K;
  float* ea = ep + p;
  float* nodes = ea + T;

  for (int64_t u = 0; u < p; ++u) {
    load_row(kp + u * K, a.bk.at5(r.slot, r.rb, u, h, 0), K, a.bk.s[4]);
    ep[u] = std::exp(*a.bg.at4(r.slot, r.rb, u, hv));
  }
  if (window) {
    for (int64_t t = 0; t < T; ++t) ea[t] = std::exp(a.g[(r.s + t) * HV + hv]);
  }
  switch (K) {
    case 64: verify_rows<64>(a, r, hv, v0, v1, p, kp, ep, ea, nodes, m, window); break;
    case 128: verify_rows<128>(a, r, hv, v0, v1, p, kp, ep, ea, nodes, m, window); break;
    case 256: verify_rows<256>(a, r, hv, v0, v1, p, kp, ep, ea, nodes, m, window); break;
    default: verify_rows<0>(a, r, hv, v0, v1, p, kp, ep, ea, nodes, m, window);
  }
  if (window && a.record && vb == 0) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = r.s + t;
      *a.bg.at4(r.slot, r.wb, t, hv) = a.g[n * HV + hv];
      if (hv % a.G == 0) store_row(a.bk.at5(r.slot, r.wb, t, h, 0), a.bk.s[4], a.kn + (n * H + h) * K, K);
    }
  }
}

at::Tensor verify_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       const at::Tensor& beta, double scale, const at::Tensor& state, const at::Tensor& slots,
                       const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& parents,
                       const std::optional<at::Tensor>& bank_k, const std::optional<at::Tensor>& bank_v,
                       const std::optional<at::Tensor>& bank_g, const std::optional<at::Tensor>& write_bank,
                       const std::optional<at::Tensor>& pending_len, const std::optional<at::Tensor>& read_bank,
                       bool write_final_state, bool use_qk_l2norm) {
  check_f32(state, "state");
  TORCH_CHECK(state.dim() == 4, "state must be [num_slots, HV, V, K]");
  TORCH_CHECK(v.dim() == 3 && q.dim() == 3, "q/k must be [N, H, K], v [N, HV, V]");
  const int64_t N = v.size(0), HV = v.size(1), V = v.size(2);
  const int64_t H = q.size(1), K = q.size(2);
  const int64_t S = state.size(0);
  TORCH_CHECK(q.size(0) == N && k.sizes() == q.sizes(), "q, k must be [N, H, K]");
  TORCH_CHECK(H > 0 && HV % H == 0, "HV must be a multiple of H");
  TORCH_CHECK(state.size(1) == HV && state.size(2) == V && state.size(3) == K, "state shape ", state.sizes(),
              " does not match [*, HV=", HV, ", V=", V, ", K=", K, "]");
  TORCH_CHECK(g.numel() == N * HV && beta.numel() == N * HV, "g, beta must be [N, HV]");

  // caller-provided values: ValueError naming the argument, as vllm_specla/ops/reference.py (_check_row_args)
  const std::vector<int64_t> cu = to_vec(cu_seqlens, "cu_seqlens");
  check_cu_seqlens(cu, N);
  const int64_t R = std::max<int64_t>(static_cast<int64_t>(cu.size()) - 1, 0);
  const std::vector<int64_t> sl = to_vec(slots, "slots");
  check_rows(sl, R, "slots");
  const std::vector<int64_t> wbv = opt_vec(write_bank, "write_bank");
  const std::vector<int64_t> plv = opt_vec(pending_len, "pending_len");
  const std::vector<int64_t> rbv = opt_vec(read_bank, "read_bank");
  const bool record = write_bank.has_value();
  const bool have_banks = bank_k.has_value() && bank_v.has_value() && bank_g.has_value();
  if (pending_len.has_value()) check_rows(plv, R, "pending_len");
  if (record) check_rows(wbv, R, "write_bank");

  bool need_banks = record;
  std::vector<Row> rows(R);
  for (int64_t r = 0; r < R; ++r) {
    Row& w = rows[r];
    w.s = cu[r];
    w.e = cu[r + 1];
    w.slot = sl[r];
    check_in(w.slot, 0, S, "slots");
    w.p = plv.empty() ? 0 : std::max<int64_t>(plv[r], 0);
    w.rb = 0;
    if (w.p > 0) {
      TORCH_CHECK_VALUE(read_bank.has_value() && have_banks, "pending_len > 0 needs read_bank and the factor banks");
      check_rows(rbv, R, "read_bank");
      w.rb = rbv[r];
      check_in(w.rb, 0, 2, "read_bank");
      need_banks = true;
    }
    w.wb = record ? wbv[r] : 0;
    if (record) check_in(w.wb, 0, 2, "write_bank");
  }
  TORCH_CHECK_VALUE(!record || have_banks, "write_bank needs the factor banks");
  Strided bk, bv, bg;
  int64_t Tmax = 0;
  if (need_banks) {
    check_f32(*bank_k, "bank_k");
    check_f32(*bank_v, "bank_v");
    check_f32(*bank_g, "bank_g");
    Tmax = bank_k->size(2);
    TORCH_CHECK(bank_k->dim() == 5 && bank_k->size(0) == S && bank_k->size(1) == 2 && bank_k->size(3) == H &&
                    bank_k->size(4) == K,
                "bank_k must be [S, 2, Tmax, H, K]");
    TORCH_CHECK(bank_v->dim() == 5 && bank_v->size(0) == S && bank_v->size(1) == 2 && bank_v->size(2) == Tmax &&
                    bank_v->size(3) == HV && bank_v->size(4) == V,
                "bank_v must be [S, 2, Tmax, HV, V]");
    TORCH_CHECK(bank_g->dim() == 4 && bank_g->size(0) == S && bank_g->size(1) == 2 && bank_g->size(2) == Tmax &&
                    bank_g->size(3) == HV,
                "bank_g must be [S, 2, Tmax, HV]");
    bk = Strided(*bank_k);
    bv = Strided(*bank_v);
    bg = Strided(*bank_g);
  }
  bool conflict = false;  // a row reads and writes the same bank: fold everything before any window
  std::unordered_set<int64_t> written;
  for (const Row& w : rows) {
    TORCH_CHECK_VALUE(w.p <= Tmax || w.p == 0, "pending_len ", w.p, " exceeds the factor bank (Tmax=", Tmax, ")");
    if (record)
      TORCH_CHECK_VALUE(w.e - w.s <= Tmax, "window of ", w.e - w.s, " tokens exceeds the factor bank (Tmax=",
                        Tmax, ")");
    if (w.p > 0 && record && w.rb == w.wb) conflict = true;
    if (w.p > 0 || write_final_state)
      TORCH_CHECK_VALUE(written.insert(w.slot).second, "slots: a state slot is written by two rows (slot ", w.slot,
                        ")");
  }
  std::vector<int64_t> par;
  if (parents.has_value()) {
    par = to_vec(*parents, "parents");
    TORCH_CHECK_VALUE(static_cast<int64_t>(par.size()) == N, "parents must be [N]: one entry per node (N=", N,
                      "), got ", par.size());
    for (const Row& w : rows)
      for (int64_t t = 0; t < w.e - w.s; ++t) {
        const int64_t pp = par[w.s + t];
        TORCH_CHECK_VALUE(-1 <= pp && pp < t,
                          "parents must be topological (parent < node) and local to the row: node ", t, " has ",
                          pp);
      }
  }

  QK qk = prep_qk(q, k, scale, use_qk_l2norm);
  at::Tensor vf = f32c(v, "v"), gf = f32c(g, "g"), bf = f32c(beta, "beta");
  at::Tensor o = at::empty({N, HV, V}, vf.options());

  VerifyArgs a;
  a.qn = qk.qn.data_ptr<float>();
  a.kn = qk.kn.data_ptr<float>();
  a.kq = qk.kq.data_ptr<float>();
  a.v = vf.data_ptr<float>();
  a.g = gf.data_ptr<float>();
  a.beta = bf.data_ptr<float>();
  a.o = o.data_ptr<float>();
  a.N = N;
  a.H = H;
  a.HV = HV;
  a.K = K;
  a.V = V;
  a.G = HV / H;
  a.state = Strided(state);
  a.bk = bk;
  a.bv = bv;
  a.bg = bg;
  a.record = record;
  a.write_final = write_final_state && !parents.has_value();
  a.parents = parents.has_value() ? par.data() : nullptr;

  const int64_t NVB = (V + kBlockV - 1) / kBlockV;
  const int64_t ntask = R * HV * NVB;
  int64_t max_p = 0;
  for (const Row& w : rows) max_p = std::max(max_p, w.p);
  const int64_t per_task = std::min(V, kBlockV) * K * (2 * (N / std::max<int64_t>(R, 1)) + max_p + 1);
  auto run = [&](bool fold, bool window) {
    at::parallel_for(0, ntask, grain_for(per_task), [&](int64_t b, int64_t e) {
      std::vector<float> buf;
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = i / (HV * NVB);
        const int64_t hv = (i / NVB) % HV;
        const int64_t vb = i % NVB;
        verify_task(a, rows[r], hv, vb, fold, window, buf);
      }
    });
  };
  if (conflict) {
    run(true, false);
    run(false, true);
  } else {
    run(true, true);
  }
  return o;
}

}  // namespace

at::Tensor chain_verify(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                        const at::Tensor& beta, double scale, const at::Tensor& state, const at::Tensor& slots,
                        const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& bank_k,
                        const std::optional<at::Tensor>& bank_v, const std::optional<at::Tensor>& bank_g,
                        const std::optional<at::Tensor>& write_bank, const std::optional<at::Tensor>& pending_len,
                        const std::optional<at::Tensor>& read_bank, bool write_final_state, bool use_qk_l2norm) {
  return verify_impl(q, k, v, g, beta, scale, state, slots, cu_seqlens, std::nullopt, bank_k, bank_v, bank_g,
                     write_bank, pending_len, read_bank, write_final_state, use_qk_l2norm);
}

at::Tensor tree_verify(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       const at::Tensor& beta, double scale, const at::Tensor& state, const at::Tensor& slots,
                       const at::Tensor& cu_seqlens, const at::Tensor& parents,
                       const std::optional<at::Tensor>& bank_k, const std::optional<at::Tensor>& bank_v,
                       const std::optional<at::Tensor>& bank_g, const std::optional<at::Tensor>& write_bank,
                       const std::optional<at::Tensor>& pending_len, const std::optional<at::Tensor>& read_bank,
                       bool use_qk_l2norm) {
  return verify_impl(q, k, v, g, beta, scale, state, slots, cu_seqlens, parents, bank_k, bank_v, bank_g,
                     write_bank, pending_len, read_bank, false, use_qk_l2norm);
}

}  // namespace cpu
}  // namespace vllm_specla
