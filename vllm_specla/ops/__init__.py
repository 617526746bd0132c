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
with a Triton implementation for CUDA and dispatches to the plain-torch version in
``reference.py`` elsewhere (the CPU path and the test oracle).
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
