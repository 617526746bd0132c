"""Run fla 0.6.0's ``GatedDeltaNet`` modules on CPU by swapping their Triton ops for plain torch.

Only for exercising the GPU code path of the training scripts (``--backend fla``) on a machine
without a GPU: the math comes from :mod:`vllm_specla.ops.reference`, so this checks plumbing
(shapes, parameter names, dtypes, saving), not fla's kernels. Covers the calls the scripts make:
no cache, no varlen, no attention mask. Activate with :func:`install` (or
``SPECLA_FLA_CPU_SHIM=1`` in the training scripts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_installed = False


def _gdr(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=True,
         use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False, state_v_first=True, cu_seqlens=None,
         use_gate_in_kernel=True, A_log=None, dt_bias=None, scale=None, **_):
    from vllm_specla.ops.reference import chunk_gated_delta_rule_ref, gdn_gating_ref  # noqa: PLC0415

    assert cu_seqlens is None and use_gate_in_kernel and use_beta_sigmoid_in_kernel and state_v_first
    B, T, H, K = q.shape
    HV, V = v.shape[-2:]
    gg, bb = gdn_gating_ref(A_log, g.reshape(-1, HV), dt_bias, beta.reshape(-1, HV), allow_neg_eigval)
    cu = torch.arange(0, (B + 1) * T, T, device=q.device)
    o, final = chunk_gated_delta_rule_ref(
        q.reshape(B * T, H, K), k.reshape(B * T, H, K), v.reshape(B * T, HV, V), gg, bb,
        scale if scale is not None else K**-0.5, cu, initial_state=initial_state,
        use_qk_l2norm=use_qk_l2norm_in_kernel)
    return o.reshape(B, T, HV, V).to(v.dtype), (final if output_final_state else None)


def _conv(x, weight, bias=None, activation="silu", backend=None, **_):
    W = weight.shape[-1]
    y = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), weight[:, None, :].to(x.dtype), bias, groups=x.shape[-1])
    y = y.transpose(1, 2)
    return (F.silu(y) if activation in ("silu", "swish") else y), None


def _rms(x, weight, eps):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def install() -> None:
    """Patch fla (idempotent)."""
    global _installed
    if _installed:
        return
    import fla.layers.gated_deltanet as L  # noqa: PLC0415
    from fla.modules import FusedRMSNormGated, GatedMLP, RMSNorm  # noqa: PLC0415

    L.chunk_gated_delta_rule = _gdr
    L.fused_recurrent_gated_delta_rule = _gdr
    L.causal_conv1d = _conv

    def rms_forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        if residual is not None:
            x = x + residual
        y = _rms(x, self.weight, self.eps).to(x.dtype)
        return (y, x) if prenorm else y

    def gated_forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        y = _rms(x, self.weight, self.eps)
        y = y * (torch.sigmoid(g.float()) if self.activation == "sigmoid" else F.silu(g.float()))
        return y.to(x.dtype)

    def mlp_forward(self, x, **kw):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    RMSNorm.forward = rms_forward
    FusedRMSNormGated.forward = gated_forward
    GatedMLP.forward = mlp_forward
    _installed = True
