"""small_gemm: unquantized y = x @ W.T for a small dense bf16/fp16 layer (in_proj_ba, 96 x 5120)
at M <= 16, replacing cuBLAS. `w` is the dense weight tensor [N, K], not a PQ2Weight.

FP32 order: split-K over programs. A program owns one N tile and a contiguous K range, which it
walks in BK steps with the MMA accumulating in fp32 (acc = tl.dot(x_blk, W_blk^T, acc), k
ascending); its partial goes to per-call partials [SPLIT, M, N], and splitk.reduce_splits sums the
partials in the fixed order ((p0 + p1) + p2) + ... and casts to x's dtype. No atomics, so
reruns give identical bits.
"""
import functools

import triton
import triton.language as tl

from . import common, prepare, splitk
from kernels import config as protocol, validate


@triton.jit
def _small_gemm_kernel(x_ptr, x_sm, x_sk, w_ptr, w_sn, w_sk, out_ptr, out_sm, out_sn, part_ptr,
                       M, N, K,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STEPS: tl.constexpr,
                       SPLIT: tl.constexpr, INTERP: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BM)
    m_ok = rm < M
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    rk = tl.arange(0, BK)
    k_begin = pid_k * (STEPS * BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    # constexpr trip count: runtime loop bounds break Triton 3.6's interpreter under numpy >= 2.4
    for i in range(0, STEPS):
        k = k_begin + i * BK + rk
        k_ok = k < K
        a = tl.load(x_ptr + rm[:, None] * x_sm + k[None, :] * x_sk, mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)                                             # [BM, BK]
        b = tl.load(w_ptr + rn[None, :] * w_sn + k[:, None] * w_sk, mask=n_ok[None, :] & k_ok[:, None],
                    other=0.0)                                             # [BK, BN] = W^T tile
        if INTERP:
            # the interpreter's bf16 dot is wrong; fp32 products of bf16/fp16 values are exact
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        tl.store(out_ptr + rm[:, None] * out_sm + rn[None, :] * out_sn,
                 prepare.to_out(acc, out_ptr.dtype.element_ty, INTERP), mask=mask)
    else:
        tl.store(part_ptr + (pid_k * M + rm[:, None]) * N + rn[None, :], acc, mask=mask)


# A forced config (run/fold config=) is checked field by field (kernels.config); its splits
# must cover K with none empty, and K per split be a multiple of BK.
FIELDS = {"BN": protocol.pow2(16), "BK": protocol.pow2(16), "k_per_split": protocol.integer(1), "SPLIT": protocol.integer(1),
          "num_warps": protocol.WARPS, "num_stages": protocol.STAGES}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BN, BK, k_per_split, SPLIT, num_warps, num_stages} from shapes only. The layer is tiny
    (1 MB at 96 x 5120): a few dozen programs split its K, partials summed in fixed order.
    interpret: the interpreter's config or the GPU's (default: this process's)."""
    return dict(_config(n, k, common.INTERPRET if interpret is None else bool(interpret)))


@functools.lru_cache(maxsize=None)
def _config(n: int, k: int, interpret: bool):
    bk = 128 if k >= 128 else 32
    steps = triton.cdiv(k, bk)
    if interpret:
        # the interpreter pays per program: wide tiles, two splits to exercise the reduction
        bn, want = max(16, min(triton.next_power_of_2(n), 128)), 2
    else:
        # measured on the H200 at 96 x 5120: ~30 programs of 32 x 256 tiles; more splits
        # cost more in partials (M*N*4 bytes each) than they gain in parallel loads
        bn = 32 if n >= 32 else 16
        bk = 256 if k >= 256 else bk
        steps = triton.cdiv(k, bk)
        want = triton.cdiv(32, triton.cdiv(n, bn))
    want = max(1, min(steps, want))
    per_steps = triton.cdiv(steps, want)
    split = triton.cdiv(steps, per_steps)
    return dict(BN=bn, BK=bk, k_per_split=per_steps * bk, SPLIT=split, num_warps=4, num_stages=3)


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("small_gemm", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, interpret, cfg) -> dict:
    c = protocol.force("small_gemm", _config(n, k, common.INTERPRET if interpret is None else bool(interpret)), cfg, FIELDS)
    if cfg is not None:
        protocol.multiple("small_gemm", "k_per_split", c["k_per_split"], "BK", c["BK"])
        protocol.splits("small_gemm", k, c["k_per_split"], c["SPLIT"], "k_per_split", "columns of K")
    return c


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None) -> dict:
    """Split s covers K columns [s*kps, (s+1)*kps) (inside it the MMA's own fp32 order);
    splits are summed ((p0+p1)+p2)+... in fp32, then rounded once to x's dtype."""
    c = _resolve(n, k, interpret, config)
    return dict(k_per_split=c["k_per_split"], splits=c["SPLIT"])


def run(x, w, *, out=None, dots=None, check=True, config=None):
    out = validate.kernel_out(__name__, x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0:
        return out
    cfg = _resolve(n, k, None, config)
    bn, bk, split = cfg["BN"], cfg["BK"], cfg["SPLIT"]
    part = splitk.partials(x.device, split * m * n) if split > 1 else out
    _small_gemm_kernel[(triton.cdiv(n, bn), split)](
        x, x.stride(0), x.stride(1), w, w.stride(0), w.stride(1),
        out, out.stride(0), out.stride(1), part,
        m, n, k, BM=16, BN=bn, BK=bk, STEPS=cfg["k_per_split"] // bk, SPLIT=split,
        INTERP=common.INTERPRET, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if split > 1:
        splitk.reduce_splits(part, out, split, m, n)
    return out
