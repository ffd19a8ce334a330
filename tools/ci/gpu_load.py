"""Background load for the concurrency checks: loops bf16 matmuls on the GPU for N seconds
(several of these make the GPU busy the way other processes on a shared runner do)."""
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + seconds
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
