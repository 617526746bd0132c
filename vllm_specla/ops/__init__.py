"""SpecLA kernels: state-resident chain verify, factor recovery (DeltaConstruct), tree verify.

One notation for every op in this package (ARCHITECTURE.md "State slots"):

* ``N``  – number of tokens in the flattened batch (varlen, ``cu_seqlens`` gives row bounds)
* ``H``  – query/key heads, ``HV`` – value heads (``HV % H == 0``; GVA maps value head ``hv`` to
  key head ``hv // (HV // H)``), ``K`` – head key dim, ``V`` – head value dim
* ``C``  – conv channels ``2*H*K + HV*V`` (q | k | v), ``W`` – conv kernel width (4)
* recurrent state slots: ``state [num_slots, HV, V, K]`` **float32** ("[V, K]" orientation, the
  layout fla's layer passes with ``state_v_first=True`` and vLLM stores). ALGORITHMS.md writes the
  math in [K, V] form; here ``M = S^T`` so ``M_t = e^{g_t} M_{t-1} + v~_t k_t^T``.
* conv state slots: ``conv_state [num_slots, W-1, C]`` (time-major: the last ``W-1`` raw conv
  inputs, oldest first).
* factor banks (two per slot, double-buffered so a verify can read the pending bank while writing
  the other one): ``bank_k [num_slots, 2, Tmax, H, K]`` (l2-normalised k),
  ``bank_v [num_slots, 2, Tmax, HV, V]`` (corrected update v~), ``bank_g [num_slots, 2, Tmax, HV]``
  (log decay g <= 0), ``bank_x [num_slots, 2, Tmax, C]`` (raw conv input), all float32.

Each public op lives in its own module (``chain_verify.py``, ``recover.py``, ``tree_verify.py``)
and dispatches by device:

* CUDA tensors: the Triton kernels; the chain verify also takes the CUDA csrc kernels
  (``csrc/cuda``, JIT-built by :func:`vllm_specla.ops._cpp.load_cuda_kernels`) where its shape
  rules say so (docs/GPU_RUNTIME.md "Kernel dispatch on CUDA");
* CPU tensors: the C++ CPU ops ``torch.ops.vllm_specla.<name>`` (``csrc/cpu``: the extension
  ``vllm_specla._C`` built at install, loaded by :mod:`vllm_specla.ops._cpp`) when they are built
  and not turned off (``VLLM_SPECLA_DISABLE_CPP=1``), else the plain-torch versions in
  ``reference.py`` / ``tree_reference.py`` (a non-chain tree's conv has no C++ op: always the
  torch reference).

The plain-torch references are also the test oracle.
"""

from vllm_specla.ops.reference import (  # noqa: F401
    chain_verify_ref,
    chunk_gated_delta_rule_ref,
    conv_commit_ref,
    conv_verify_ref,
    causal_conv1d_prefill_ref,
    gdn_gating_ref,
    l2norm,
    recover_ref,
    recurrent_gated_delta_rule_ref,
)
