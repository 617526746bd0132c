// Registers the SpecLA ops as torch custom ops: torch.ops.vllm_specla.<name>.
//
// The schemas live here (one place); this file provides the CPU kernels. A CUDA build registers
// its kernels for the same schemas with TORCH_LIBRARY_IMPL(vllm_specla, CUDA, m) (csrc/cuda/).
// Fake (meta) kernels for torch.compile are registered in Python (vllm_specla/ops/_cpp.py).
// Mutated arguments carry alias annotations (Tensor(a!)).

#include <Python.h>
#include <torch/library.h>

#include "cpu/ops.h"

TORCH_LIBRARY_FRAGMENT(vllm_specla, m) {
  m.def(
      "chain_verify(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor(a!) state, "
      "Tensor slots, Tensor cu_seqlens, Tensor(b!)? bank_k, Tensor(c!)? bank_v, Tensor(d!)? bank_g, "
      "Tensor? write_bank, Tensor? pending_len, Tensor? read_bank, bool write_final_state=False, "
      "bool use_qk_l2norm=True) -> Tensor");
  m.def(
      "tree_verify(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor(a!) state, "
      "Tensor slots, Tensor cu_seqlens, Tensor parents, Tensor(b!)? bank_k, Tensor(c!)? bank_v, "
      "Tensor(d!)? bank_g, Tensor? write_bank, Tensor? pending_len, Tensor? read_bank, "
      "bool use_qk_l2norm=True) -> Tensor");
  m.def(
      "recover(Tensor(a!) state, Tensor slots, Tensor bank_k, Tensor bank_v, Tensor bank_g, Tensor bank_idx, "
      "Tensor num_accepted) -> ()");
  m.def(
      "conv_verify(Tensor x, Tensor weight, Tensor cu_seqlens, Tensor(a!) conv_state, Tensor slots, "
      "Tensor(b!)? bank_x, Tensor? write_bank, Tensor? pending_len, Tensor? read_bank, "
      "bool write_final_state=False) -> Tensor");
  m.def(
      "conv_commit(Tensor(a!) conv_state, Tensor slots, Tensor bank_x, Tensor bank_idx, Tensor num_accepted) -> ()");
}

TORCH_LIBRARY_IMPL(vllm_specla, CPU, m) {
  m.impl("chain_verify", &vllm_specla::cpu::chain_verify);
  m.impl("tree_verify", &vllm_specla::cpu::tree_verify);
  m.impl("recover", &vllm_specla::cpu::recover);
  m.impl("conv_verify", &vllm_specla::cpu::conv_verify);
  m.impl("conv_commit", &vllm_specla::cpu::conv_commit);
}

// `import vllm_specla._C` runs the static registrations above; the module itself is empty.
// (The JIT build loads this file with torch.ops.load_library instead; the symbol is then unused.)
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr,
                                      nullptr,               nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
