// SpecLA CPU ops (declarations). Semantics: the plain-torch references in vllm_specla/ops/.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace vllm_specla {
namespace cpu {

at::Tensor chain_verify(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                        const at::Tensor& beta, double scale, const at::Tensor& state, const at::Tensor& slots,
                        const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& bank_k,
                        const std::optional<at::Tensor>& bank_v, const std::optional<at::Tensor>& bank_g,
                        const std::optional<at::Tensor>& write_bank, const std::optional<at::Tensor>& pending_len,
                        const std::optional<at::Tensor>& read_bank, bool write_final_state, bool use_qk_l2norm);

at::Tensor tree_verify(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                       const at::Tensor& beta, double scale, const at::Tensor& state, const at::Tensor& slots,
                       const at::Tensor& cu_seqlens, const at::Tensor& parents,
                       const std::optional<at::Tensor>& bank_k, const std::optional<at::Tensor>& bank_v,
                       const std::optional<at::Tensor>& bank_g, const std::optional<at::Tensor>& write_bank,
                       const std::optional<at::Tensor>& pending_len, const std::optional<at::Tensor>& read_bank,
                       bool use_qk_l2norm);

void recover(const at::Tensor& state, const at::Tensor& slots, const at::Tensor& bank_k, const at::Tensor& bank_v,
             const at::Tensor& bank_g, const at::Tensor& bank_idx, const at::Tensor& num_accepted);

at::Tensor conv_verify(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cu_seqlens,
                       const at::Tensor& conv_state, const at::Tensor& slots, const std::optional<at::Tensor>& bank_x,
                       const std::optional<at::Tensor>& write_bank, const std::optional<at::Tensor>& pending_len,
                       const std::optional<at::Tensor>& read_bank, bool write_final_state);

void conv_commit(const at::Tensor& conv_state, const at::Tensor& slots, const at::Tensor& bank_x,
                 const at::Tensor& bank_idx, const at::Tensor& num_accepted);

}  // namespace cpu
}  // namespace vllm_specla
