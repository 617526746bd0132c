// Shared helpers of the SpecLA CPU kernels (ATen + OpenMP).
//
// Layouts follow vllm_specla/ops/__init__.py: state [S, HV, V, K] fp32 ("[V, K]" orientation),
// banks bank_k [S, 2, Tmax, H, K], bank_v [S, 2, Tmax, HV, V], bank_g [S, 2, Tmax, HV],
// bank_x [S, 2, Tmax, C] (fp32), conv_state [S, W-1, C] (fp32 / bf16 / fp16).
//
// Slot-indexed tensors (state, banks, conv_state) are accessed through their strides, so views
// into a larger page (vLLM binds per-state views [num_blocks, *shape] of one state page) work
// without copies. Token tensors (q, k, v, g, beta, x) are converted to contiguous fp32 first.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace vllm_specla {
namespace cpu {

constexpr float kL2NormEps = 1e-6f;  // fla l2norm eps (use_qk_l2norm_in_kernel=True)
constexpr int64_t kBlockV = 32;      // value rows per task: tasks = rows x HV x ceil(V / kBlockV)

// at::parallel_for grain (tasks per chunk) so that a chunk holds at least ~kMinChunkWork
// multiply-adds: tiny calls (batch 1, short windows) run inline instead of paying the OpenMP
// fork/join, which dominates below a few microseconds of work (and costs far more on a loaded box).
constexpr int64_t kMinChunkWork = 1 << 15;
inline int64_t grain_for(int64_t work_per_task) {
  return std::max<int64_t>(1, kMinChunkWork / std::max<int64_t>(1, work_per_task));
}

// Hot per-task functions are compiled for AVX-512 / AVX2+FMA / baseline and picked at load time
// (GCC/Clang function multi-versioning on x86-64; a plain function elsewhere).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(VLLM_SPECLA_NO_CLONES)
#define SPECLA_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPECLA_HOT
#endif

// Helpers called from SPECLA_HOT functions must be inlined into each clone to get its ISA.
#define SPECLA_INLINE inline __attribute__((always_inline))

// e^x for float, branch-free and auto-vectorisable (Cephes expf: range reduction by ln2, degree-6
// polynomial, exponent bits), max relative error ~2 ulp; inputs are clamped to [-87, 88].
// Vectorises only with -fno-trapping-math (the float clamps become min/max); setup.py passes it.
SPECLA_INLINE float exp_vec(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // n = floor(x log2e + 1/2), via truncation of a positive value (x log2e + 128.5 is in [3, 256))
  const int32_t ni = static_cast<int32_t>(x * 1.44269504088896341f + 128.5f) - 128;
  const float n = static_cast<float>(ni);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (ni + 127) << 23;  // 2^ni as an fp32 bit pattern (C++17: memcpy, not bit_cast)
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// A strided fp32 tensor: base pointer plus strides (elements), up to 5 dims.
struct Strided {
  float* p = nullptr;
  int64_t s[5] = {0, 0, 0, 0, 0};
  Strided() = default;
  explicit Strided(const at::Tensor& t) {
    p = t.data_ptr<float>();
    for (int64_t d = 0; d < t.dim(); ++d) s[d] = t.stride(d);
  }
  float* at2(int64_t a, int64_t b) const { return p + a * s[0] + b * s[1]; }
  float* at3(int64_t a, int64_t b, int64_t c) const { return at2(a, b) + c * s[2]; }
  float* at4(int64_t a, int64_t b, int64_t c, int64_t d) const { return at3(a, b, c) + d * s[3]; }
  float* at5(int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) const {
    return at4(a, b, c, d) + e * s[4];
  }
};

inline void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "vllm_specla CPU op: ", name, " must be a CPU tensor");
}

inline void check_f32(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == at::kFloat, "vllm_specla CPU op: ", name, " must be float32, got ",
              t.scalar_type());
}

// Contiguous fp32 copy (no copy when already contiguous fp32).
inline at::Tensor f32c(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  return t.to(at::kFloat).contiguous();
}

inline std::vector<int64_t> to_vec(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  at::Tensor c = t.to(at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

inline std::vector<int64_t> opt_vec(const std::optional<at::Tensor>& t, const char* name) {
  if (!t.has_value()) return {};
  return to_vec(*t, name);
}

// Checks of caller-provided per-row values (slots, bank indices, row bounds, counts) raise ValueError
// (TORCH_CHECK_VALUE) with the references' messages (vllm_specla/ops/reference.py _row_ints / _rows);
// dtype, device and shape checks stay TORCH_CHECK (RuntimeError), as torch's own ops raise.

// A per-row argument holds an entry for each of the R rows (entries past them are not used).
inline void check_rows(const std::vector<int64_t>& vals, int64_t R, const char* name) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(vals.size()) >= R, name, " must have an entry for each of the ", R,
                    " rows, got ", vals.size());
}

// One entry of a per-row argument lies in [lo, hi).
inline void check_in(int64_t x, int64_t lo, int64_t hi, const char* name) {
  TORCH_CHECK_VALUE(lo <= x && x < hi, name, " must be in [", lo, ", ", hi - 1, "], got ", x);
}

// cu_seqlens [R+1]: non-decreasing within [0, N].
inline void check_cu_seqlens(const std::vector<int64_t>& cu, int64_t N) {
  for (size_t i = 0; i < cu.size(); ++i)
    TORCH_CHECK_VALUE(cu[i] >= 0 && cu[i] <= N && (i == 0 || cu[i - 1] <= cu[i]),
                      "cu_seqlens must be non-decreasing within [0, ", N, "], got ", cu[i], " at index ", i,
                      i > 0 ? " after " : "", i > 0 ? std::to_string(cu[i - 1]) : std::string());
}

// dst[0:n] = src[0:n*stride:stride]
SPECLA_INLINE void load_row(float* __restrict dst, const float* __restrict src, int64_t n, int64_t stride) {
  if (stride == 1) {
    std::copy(src, src + n, dst);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = src[j * stride];
  }
}

SPECLA_INLINE void store_row(float* __restrict dst, int64_t stride, const float* __restrict src, int64_t n) {
  if (stride == 1) {
    std::copy(src, src + n, dst);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j * stride] = src[j];
  }
}

SPECLA_INLINE float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// Two dot products of one row in a single pass: (m . x, m . y).
SPECLA_INLINE void dot2(const float* __restrict m, const float* __restrict x, const float* __restrict y, int64_t n,
                 float& dx, float& dy) {
  float sx = 0.f, sy = 0.f;
#pragma omp simd reduction(+ : sx, sy)
  for (int64_t j = 0; j < n; ++j) {
    sx += m[j] * x[j];
    sy += m[j] * y[j];
  }
  dx = sx;
  dy = sy;
}

// dst = a * src + c * k   (dst, src distinct)
SPECLA_INLINE void scale_add(float* __restrict dst, const float* __restrict src, float a, float c,
                      const float* __restrict k, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dst[j] = a * src[j] + c * k[j];
}

// m = a * m + c * k   (in place)
SPECLA_INLINE void scale_add_(float* __restrict m, float a, float c, const float* __restrict k, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) m[j] = a * m[j] + c * k[j];
}

// Normalised / scaled q and k, contiguous [N, H, K] fp32, plus kq [N, H] = k^ . (scale q^).
struct QK {
  at::Tensor qn, kn, kq;
};

inline QK prep_qk(const at::Tensor& q, const at::Tensor& k, double scale, bool l2) {
  at::Tensor qf = f32c(q, "q"), kf = f32c(k, "k");
  TORCH_CHECK(qf.dim() == 3 && kf.sizes() == qf.sizes(), "q, k must be [N, H, K] of the same shape");
  const int64_t N = qf.size(0), H = qf.size(1), K = qf.size(2);
  QK out;
  out.qn = at::empty({N, H, K}, qf.options());
  out.kn = at::empty({N, H, K}, qf.options());
  out.kq = at::empty({N, H}, qf.options());
  const float* qs = qf.data_ptr<float>();
  const float* ks = kf.data_ptr<float>();
  float* qd = out.qn.data_ptr<float>();
  float* kd = out.kn.data_ptr<float>();
  float* kq = out.kq.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, N * H, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* qi = qs + i * K;
      const float* ki = ks + i * K;
      float rq = 1.f, rk = 1.f;
      if (l2) {
        rq = 1.f / std::sqrt(dot(qi, qi, K) + kL2NormEps);
        rk = 1.f / std::sqrt(dot(ki, ki, K) + kL2NormEps);
      }
      float* qo = qd + i * K;
      float* ko = kd + i * K;
      for (int64_t j = 0; j < K; ++j) {
        qo[j] = (qi[j] * rq) * sc;
        ko[j] = ki[j] * rk;
      }
      kq[i] = dot(ko, qo, K);
    }
  });
  return out;
}

}  // namespace cpu
}  // namespace vllm_specla
