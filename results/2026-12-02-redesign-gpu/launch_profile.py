"""Where the host time of one eager mmq_wgmma call goes (out shape, M=2048), H200."""
import cProfile, pstats, io, time, statistics
import torch, triton
from pq2verify import backend
backend.select("cuda")
from pq2verify import dispatch, inputs
from kernels import mmq_wgmma, prepare
print("torch", torch.__version__, "triton", triton.__version__, flush=True)
n, k, m = 5120, 6144, 2048
w = inputs.ternary_weight(n, k, 1, device="cuda")
x = inputs.activations(m, k, 2, device="cuda")
spin = lambda us: torch.cuda._sleep(int(us * 1980))

def host(fn, calls=30, rounds=5):
    per = []
    for _ in range(rounds):
        spin(calls * 3000)
        for _ in range(calls):
            t0 = time.perf_counter(); fn(); per.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)

y = torch.empty(m, n, dtype=x.dtype, device="cuda")
q, xs, _ = prepare.quantize_q8(x, order="plane")
xs_t = mmq_wgmma._by_group(xs)
cfg = mmq_wgmma._resolve(n, w.k, m, None, None)
codes2 = w.codes_u8[: n * w.k // 4].view(n, w.k // 4)
descs, consts = mmq_wgmma.kernel_args(q, codes2, xs_t, w.groups, cfg, False)
grid = (triton.cdiv(m, cfg["BM"]), triton.cdiv(n, cfg["BN"]))
st = w.strides
launch = lambda: mmq_wgmma._wgmma_kernel[grid](*descs.values(), w.scales_f16, y, y, m, n, y.stride(0),
                                               st["scale_off"], st["scale_row"], **consts)
for f in (lambda: dispatch.pq2_matmul(x, w, kernels="tuned"), lambda: mmq_wgmma.run(x, w, out=y, check=False), launch):
    f()
torch.cuda.synchronize()
rows = {
    "pq2_matmul(tuned)": lambda: dispatch.pq2_matmul(x, w, kernels="tuned"),
    "mmq_wgmma.run check=True": lambda: mmq_wgmma.run(x, w, out=y),
    "mmq_wgmma.run check=False": lambda: mmq_wgmma.run(x, w, out=y, check=False),
    "quantize_q8 plane": lambda: prepare.quantize_q8(x, order="plane"),
    "_by_group": lambda: mmq_wgmma._by_group(xs),
    "_resolve": lambda: mmq_wgmma._resolve(n, w.k, m, None, None),
    "kernel_args (3 descriptors)": lambda: mmq_wgmma.kernel_args(q, codes2, xs_t, w.groups, cfg, False),
    "_wgmma_kernel[grid] launch": launch,
    "torch.empty [M,N]": lambda: torch.empty(m, n, dtype=x.dtype, device="cuda"),
}
for name, f in rows.items():
    print(f"{name:32s} {host(f):8.1f} us/call", flush=True)
pr = cProfile.Profile()
spin(400 * 3000)
pr.enable()
for _ in range(200):
    dispatch.pq2_matmul(x, w, kernels="tuned")
pr.disable()
torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35); print(s.getvalue()[:9000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40); print(s.getvalue()[:9000])
