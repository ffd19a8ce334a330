import torch
for m in (1, 16):
    x = torch.randn(m, 384, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(96, 384, device="cuda", dtype=torch.bfloat16)
    y = torch.matmul(x, w.t())
    z = y.clone()
    torch.cuda.synchronize()
    print("m", m, "ok", flush=True)
