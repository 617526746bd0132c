"""One launch each of the CUDA csrc chain verify for Nsight Compute (issue 5/9 profiling):
``VLLM_SPECLA_CPP_JIT=1 ncu --clock-control none -k regex:chain_verify python benchmarks/prof/cuda_once.py B T P``
(B rows, T-token windows, P pending factors folded first; heads 6x256x512, or the optional 4th
argument HxKxV, e.g. 8x256x256; bf16 q/k/v, fp32 state).
Random inputs; no timing here (ncu measures)."""
import sys

import torch

sys.path.insert(0, ".")
from vllm_specla.ops import _cpp  # noqa: E402

assert _cpp.load_cuda(), "CUDA csrc build failed"
H, K, V = (int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "6x256x512").split("x"))
HV = H
B, T, P = (int(x) for x in sys.argv[1:4])
Tmax, dev = max(8, T), "cuda"  # banks sized to the window, as the runtime and the benchmarks
N = B * T
q, k = torch.randn(N, H, K, device=dev, dtype=torch.bfloat16), torch.randn(N, H, K, device=dev, dtype=torch.bfloat16)
v = torch.randn(N, HV, V, device=dev, dtype=torch.bfloat16)
g, beta = -torch.rand(N, HV, device=dev) * 0.5, torch.rand(N, HV, device=dev)
state = torch.randn(B, HV, V, K, device=dev) * 0.1
bank_k = torch.nn.functional.normalize(torch.randn(B, 2, Tmax, H, K, device=dev), dim=-1)
bank_v = torch.randn(B, 2, Tmax, HV, V, device=dev) * 0.1
bank_g = -torch.rand(B, 2, Tmax, HV, device=dev) * 0.3
cu = torch.arange(0, N + 1, T, dtype=torch.int32, device=dev)
kw = dict(scale=K ** -0.5, state=state, slots=torch.arange(B, device=dev), cu_seqlens=cu, bank_k=bank_k,
          bank_v=bank_v, bank_g=bank_g, write_bank=torch.ones(B, dtype=torch.long, device=dev))
if P:
    kw.update(pending_len=torch.full((B,), P, dtype=torch.long, device=dev),
              read_bank=torch.zeros(B, dtype=torch.long, device=dev))
for _ in range(2):
    _cpp.chain_verify(q, k, v, g, beta, **kw)
torch.cuda.synchronize()
print("done")
