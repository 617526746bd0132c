"""One launch each of the UT kernels (prep + V-tile kernel, verify and step) and the serial kernel at
B = 128, T = 8 (6x256x512), for Nsight Compute: ``ncu --clock-control none -k regex:chain python
benchmarks/prof/ut_once.py``. Random inputs; no timing here (ncu measures)."""
import sys

import torch

sys.path.insert(0, ".")
from vllm_specla.ops import triton_chain as tc  # noqa: E402
from vllm_specla.ops import triton_chain_ut as ut  # noqa: E402

H, HV, K, V = 6, 6, 256, 512
B, T, Tmax = int(sys.argv[1]) if len(sys.argv) > 1 else 128, 8, 16
cfg = tuple(int(x) for x in sys.argv[2].split("/")) if len(sys.argv) > 2 else None
dev = "cuda"
N = B * T
q, k = torch.randn(N, H, K, device=dev, dtype=torch.bfloat16), torch.randn(N, H, K, device=dev, dtype=torch.bfloat16)
v = torch.randn(N, HV, V, device=dev, dtype=torch.bfloat16)
g, beta = -torch.rand(N, HV, device=dev) * 0.5, torch.rand(N, HV, device=dev)
state = torch.randn(B, HV, V, K, device=dev) * 0.1
bank_k = torch.nn.functional.normalize(torch.randn(B, 2, Tmax, H, K, device=dev), dim=-1)
bank_v = torch.randn(B, 2, Tmax, HV, V, device=dev) * 0.1
bank_g = -torch.rand(B, 2, Tmax, HV, device=dev) * 0.3
slots = torch.arange(B, device=dev)
cu = torch.arange(0, N + 1, T, dtype=torch.int32, device=dev)
wb = torch.ones(B, dtype=torch.long, device=dev)
rb = torch.zeros(B, dtype=torch.long, device=dev)
pend = torch.full((B,), 5, dtype=torch.long, device=dev)
banks = dict(bank_k=bank_k, bank_v=bank_v, bank_g=bank_g, write_bank=wb)
for rep in range(2):  # the first compiles
    ut._launch_ut(q, k, v, g, beta, K ** -0.5, state, slots, cu, bank_k, bank_v, bank_g, wb, None, None, False, True,
                  config=cfg)
    ut._launch_ut(q, k, v, g, beta, K ** -0.5, state, slots, cu, bank_k, bank_v, bank_g, wb, pend, rb, False, True,
                  config=cfg)
    tc.chain_verify(q, k, v, g, beta, scale=K ** -0.5, state=state, slots=slots, cu_seqlens=cu, **banks)
    tc.chain_verify(q, k, v, g, beta, scale=K ** -0.5, state=state, slots=slots, cu_seqlens=cu, pending_len=pend,
                    read_bank=rb, **banks)
torch.cuda.synchronize()
print("done")
