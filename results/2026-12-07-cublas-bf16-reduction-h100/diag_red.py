# the fuzz case's matmul under both switches: max error to fp64, and whether the bits differ
import torch
from pq2verify import cases
c = cases.parse_case("cublas:t=3x640:m3262:bf16:dense:normal:seed68607") if hasattr(cases, "parse_case") else None
g = torch.Generator(device="cpu").manual_seed(68607)
x = torch.randn(3262, 640, generator=g).to(torch.bfloat16).cuda(); w = torch.randn(3, 640, generator=g).to(torch.bfloat16).cuda()
ref = x.double() @ w.double().t()
mm = torch.backends.cuda.matmul
out = {}
for flag in (True, False):
    mm.allow_bf16_reduced_precision_reduction = flag
    y = torch.matmul(x, w.t()); torch.cuda.synchronize(); out[flag] = y
    err = (y.double() - ref).abs(); print(f"reduced={flag}: max abs err {err.max().item():.5g}, mean {err.mean().item():.3g}")
print("bits differ:", not torch.equal(out[True], out[False]), "outputs differing:", int((out[True] != out[False]).sum()))
