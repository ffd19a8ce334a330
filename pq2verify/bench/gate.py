"""The gate: a (path, shape, M) is timed only after checks.evaluate passed on the very inputs
that the timing then reads."""

from dataclasses import dataclass, field

import torch

from kernels import dispatch
from kernels.format import BLOCK, PQ2Weight, unpack_codes
from .. import cases, checks
from .plan import Config, Shape


@dataclass
class Gate:
    path: str
    ok: bool
    reason: str = ""
    detail: dict = field(default_factory=dict)
    output_print: tuple | None = None   # checkafter.fingerprint of the gated path's output on the gated inputs

    @property
    def status(self) -> str:
        return "PASS" if self.ok else "BLOCKED"


_DETAIL = ("rel_rms_quantized", "tol_quantized", "rel_rms_dense", "tol_dense", "dots_exact",
           "claim", "claim_held", "deterministic", "written")


def gate(case: checks.Case, inp, device: str, *, reruns: int, repro: bool = True,
         record_output: bool) -> Gate:
    """The numerics checks of one case on `inp`, the very inputs that will be timed. Any
    failure, or a crash of the kernel, blocks the timing. reruns and record_output have no
    default: the bench's profile sets them (bench.envs). record_output: once passed, the
    path runs once more on the same inputs (its reruns were just proven identical) and the
    fingerprint of that output is kept, for the check after timing."""
    detail = {"case": case.id}
    if repro:
        detail["repro"] = case.repro()
    try:
        r = checks.evaluate(case, device, inp=inp, reruns=reruns)
    except Exception as e:  # a crash is a failed gate, with its cause
        return Gate(case.path, False, f"raised {type(e).__name__}: {e}", detail)
    detail.update({k: getattr(r, k) for k in _DETAIL})
    g = Gate(case.path, r.ok, "; ".join(r.failures), detail)
    if r.ok and record_output:
        from .. import registry
        from .checkafter import fingerprint
        try:
            g.output_print = fingerprint(registry.get(case.path).kernel()(inp.x, inp.w))
        except Exception as e:
            return Gate(case.path, False, f"the eager run after the gate raised {type(e).__name__}: {e}", detail)
    return g


def bench_case(path: str, shape: Shape, m: int, cfg: Config) -> checks.Case:
    """The bench profile's case (pq2verify.cases.bench_case) of a planned shape."""
    layout = "dense" if shape.dense else cfg.layout
    return cases.bench_case(path, shape.name, shape.n, shape.k, m, cfg.dtype, layout)


def decode_dense(w: PQ2Weight, dtype, rows_per_chunk: int = 4096) -> torch.Tensor:
    """The PQ2 weight as a dense [N, K] matrix in `dtype` ((code - 1) * fp16 scale, exact in
    fp32, then rounded once to dtype), on the weight's device, in row chunks."""
    codes, scales = w.codes_matrix(), w.scales_matrix()
    out = torch.empty(w.n, w.k, dtype=dtype, device=w.device)
    for r0 in range(0, w.n, rows_per_chunk):
        r1 = min(w.n, r0 + rows_per_chunk)
        c = unpack_codes(codes[r0:r1])
        v = (c.reshape(r1 - r0, w.groups, BLOCK) - 1.0) * scales[r0:r1].float()[..., None]
        out[r0:r1] = v.reshape(r1 - r0, w.k).to(dtype)
    return out


class BaselineInputs:
    """x and the decoded weight as a dense matrix: what cuBLAS is timed on. Stands in for
    checks.Inputs in checks.evaluate; its FP64 reference is x @ W[rows].T of that same matrix."""
    dense = True

    def __init__(self, inp, dtype):
        self.case, self.device, self.x, self.rows = inp.case, inp.device, inp.x, inp.rows
        self.w = decode_dense(inp.w, dtype)
        self._ref = None

    def reference(self, which: str):
        if self._ref is None:
            from reference import projection
            self._ref = projection.dense(self.x.cpu(), self.w[self.rows.to(self.w.device)].cpu())
        return self._ref

    def group_dots(self):
        raise AssertionError("a dense matrix has no integer group dots")


def traced_path(kset: str, inp) -> str:
    """Which path the kernel set serves for these inputs, proven by running it once through
    pq2_matmul under dispatch.trace()."""
    with dispatch.trace() as t:
        dispatch.pq2_matmul(inp.x, inp.w, kernels=kset)
    if sum(t.values()) != 1:
        raise RuntimeError(f"kernels={kset}: expected one traced call, got {dict(t)}")
    return next(iter(t))
