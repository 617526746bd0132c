"""Where an AR decode step of the runtime goes (issue 6 "what bounds the rest").

Times, each as one CUDA graph replayed 50 times (median of 5 blocks), at the given shape and batch:
``step`` = the runtime's full AR step (``runtime/decode.py``); ``gemms`` = only the step's GEMMs
(4 per layer + LM head, same shapes, cuBLAS); ``recurrent`` = only the chain kernel (T = 1, state
written) and conv kernel per layer; ``small`` = only the fused elementwise kernels per layer
(2 RMSNorm, gating, gated RMSNorm, SwiGLU). Weight bytes / ``gemms`` time gives the GEMM
bandwidth against the ~4.3 TB/s copy ceiling. Prints a table, writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (_flags; runpy.run_path does not add it)

from _flags import check_out, parse_list  # noqa: E402
from bench_e2e import SHAPES, build  # noqa: E402
from graph_timing import graph_ms as _graph_ms  # noqa: E402

from vllm_specla.core.state import allocate_layer_states  # noqa: E402
from vllm_specla.ops import _cpp, fused  # noqa: E402
from vllm_specla.ops.chain_verify import chain_verify, conv_verify  # noqa: E402
from vllm_specla.runtime.decode import DecodeRuntime  # noqa: E402
from vllm_specla.runtime.fused_model import StepCtrl  # noqa: E402


def graph_ms(fn) -> float:
    """Median ms per replay of ``fn`` captured as one CUDA graph (50 replays per timing block)."""
    return _graph_ms(fn, replays=50)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="flame", choices=list(SHAPES))
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    batches = parse_list(ap, "--batches", args.batches)
    check_out(ap, "--out", args.out)
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this benchmark times a CUDA-graph AR step")
    cfg, tgt, _ = build(args.shape, "cuda", torch.bfloat16)
    layers = tgt.stack.layers
    D = cfg.hidden_size
    recs = []
    for B in batches:
        rt = DecodeRuntime(tgt, B, "ar", output_capacity=400)
        rt.prefill(torch.randint(3, cfg.vocab_size, (B, 8)))
        step = graph_ms(rt._step)
        x = torch.randn(B, D, device="cuda", dtype=torch.bfloat16)
        C = layers[0].dims.conv_dim

        def gemms():
            for L in layers:
                p = x @ L.w_in.t()
                o = torch.addmm(x, p[:, : L.w_o.shape[1]], L.w_o.t())
                gu = o @ L.w_gu.t()
                torch.addmm(x, gu[:, : L.w_down.shape[1]], L.w_down.t())
            x @ tgt.lm_head.t()

        st = allocate_layer_states(cfg, B, 0, "cuda")
        ctrl = StepCtrl.uniform(B, 1, "cuda")
        xc = torch.randn(B, C, device="cuda", dtype=torch.bfloat16)
        gb = torch.rand(B, 2 * layers[0].dims.HV, device="cuda")
        d = layers[0].dims

        def recurrent(st=st):  # (bound: `st` is deleted after the timing)
            for L, s in zip(layers, st):
                y = conv_verify(xc, L.conv_w, ctrl.cu_seqlens, s.conv, ctrl.slots, write_final_state=True)
                chain_verify(y[:, : d.key_dim].view(B, d.H, d.K), y[:, d.key_dim : 2 * d.key_dim].view(B, d.H, d.K),
                             y[:, 2 * d.key_dim :].view(B, d.HV, d.V), -gb[:, : d.HV], gb[:, d.HV :], scale=d.scale,
                             state=s.ssm, slots=ctrl.slots, cu_seqlens=ctrl.cu_seqlens, write_final_state=True)

        o = torch.randn(B, d.HV, d.V, device="cuda")
        gate = torch.randn(B, d.HV * d.V, device="cuda", dtype=torch.bfloat16)
        gu = torch.randn(B, 2 * cfg.intermediate_size, device="cuda", dtype=torch.bfloat16)
        ab = torch.randn(B, 2 * d.HV, device="cuda", dtype=torch.bfloat16)

        def small():
            for L in layers:
                fused.rms_norm(x, L.attn_norm_w, L.eps, torch.bfloat16)
                fused.gdn_gating(ab[:, : d.HV], ab[:, d.HV :], L.A_log, L.dt_bias)
                fused.gated_rms_norm(o, gate, L.o_norm_w, L.eps, "swish", torch.bfloat16)
                fused.rms_norm(x, L.mlp_norm_w, L.eps, torch.bfloat16)
                fused.silu_mul(gu)

        wbytes = sum((L.w_in.numel() + L.w_o.numel() + L.w_gu.numel() + L.w_down.numel()) * 2 for L in layers)
        wbytes += tgt.lm_head.numel() * 2
        r = dict(shape=args.shape, batch=B, step_ms=step, gemms_ms=graph_ms(gemms), recurrent_ms=graph_ms(recurrent),
                 small_ms=graph_ms(small), weight_bytes=wbytes, gpu=torch.cuda.get_device_name(),
                 cuda_kernels=_cpp.load_cuda_kernels())  # (what DecodeRuntime loaded: ops/_cpp.py, session 44)
        r["gemm_TBps"] = wbytes / (r["gemms_ms"] * 1e-3) / 1e12
        r["weight_floor_ms"] = wbytes / 4.3e12 * 1e3
        recs.append(r)
        print(json.dumps(r), flush=True)
        del rt, st
    if args.out:
        with open(args.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
