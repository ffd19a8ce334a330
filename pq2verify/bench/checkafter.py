"""Checks after timing: a timed graph must still compute what the gate passed.

After the last round, for every timer that carries a Probe (the kernel calls of a shape side or
the chained step; the speed-of-light reads and the bandwidth probes carry none):
- 'output': one replay, the whole device synchronized, its output bit-equal to the gate's
  function run eagerly on the gated inputs (the gate's reruns proved that function
  deterministic) and, where the gate recorded one, to the gate's own output's fingerprint;
- 'inputs': x and every weight copy the graph reads have the fingerprints they had before
  the first round;
- 'fresh input': x rewritten in place with other values, one replay, the output within
  ref_tol of an independent computation on the new x (x times the decoded weight through
  torch.mm; the step: its calls run eagerly): a graph that replays a cached result, or
  computes part of it, fails here; x is then restored and replayed again;
- 'wall clock': the host clock around replays with the whole device synchronized, against
  the CUDA events' time (work deferred to a stream the events do not wait on shows here).
"""
import math
from dataclasses import dataclass, field

import torch

WALL_MIN = 0.5       # events' time below this fraction of the synchronized host clock: work escaped
CHUNK = 1 << 25      # elements per FP64 block of the relative-RMS comparison (256 MiB)


class Thunks(list):
    """The thunks of one timed graph, with the probe that checks it after timing."""
    probe = None


@dataclass
class Probe:
    out: torch.Tensor                      # the buffer the graph's result lands in
    expect: object                         # () -> the gate's function on the current inputs, eagerly
    x: torch.Tensor | None = None          # the input the fresh-input replay rewrites (None: skipped)
    reads: list = field(default_factory=list)   # tensors the graph must leave unchanged
    gate_print: tuple | None = None        # fingerprint of the gate's own output, when recorded
    tol: float = 0.0                       # 0: bit-equal; else relative RMS (cuBLAS may pick its kernel per call)
    # () -> an independent computation of the result on the current inputs (the decoded matrix
    # through torch.mm), for the fresh-input replay: a kernel that memoizes by address would
    # fool an eager run of itself, not this. None: the eager run of the same calls (the step).
    reference: object = None
    # relative RMS against it: Q8 activations alone reach 0.03-0.037 on outlier inputs (registry.Q8_BUDGET);
    # a stale or half-computed output for a new x is off by about 1
    ref_tol: float = 0.1


def fingerprint(t: torch.Tensor) -> tuple:
    """(numel, sum of every int32 word, sum of the odd-indexed words) of the bytes (bytes, when
    they do not divide into words), summed in int64 without a temporary copy: one read of the
    tensor, so the step's 51 GB of BF16 copies cost tens of milliseconds. A changed byte
    changes it; so does a word moved to a position of the other parity."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    w = b.view(torch.int32) if b.numel() % 4 == 0 and b.data_ptr() % 4 == 0 else b
    return (w.numel(), int(torch.sum(w, dtype=torch.int64)), int(torch.sum(w[1::2], dtype=torch.int64)))


def prints(probe: Probe | None) -> list:
    return [] if probe is None else [fingerprint(t) for t in probe.reads]


def _same(a: torch.Tensor, b: torch.Tensor, tol: float = 0.0) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if tol:
        if not a.numel():
            return False        # no relative RMS without elements: nothing was compared
        finite, d2, r2 = _square_sums(a, b)
        return finite and math.sqrt(d2) <= tol * math.sqrt(r2)
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _square_sums(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """(a and b all finite, sum (a-b)^2, sum b^2) in float64, CHUNK elements at a time (an inf in
    the reference b makes sum b^2 inf, under which any finite a would pass): a whole FP64
    copy of lm_head's [8192, 248320] output is 15 GiB, more than an 80 GB GPU has left beside
    the timed buffers."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    finite, d2, r2 = True, 0.0, 0.0
    for i in range(0, fa.numel(), CHUNK):
        x, y = fa[i:i + CHUNK].double(), fb[i:i + CHUNK].double()
        finite = finite and bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())
        d2 += float((x - y).pow(2).sum())
        r2 += float(y.pow(2).sum())
    return finite, d2, r2


def _fresh(x: torch.Tensor) -> torch.Tensor:
    """Other values of x's dtype and scale: x reversed and negated (never equal to x unless x
    is antisymmetric under the flip, which a seeded random input is not)."""
    return (-x.reshape(-1).flip(0)).reshape(x.shape)


def run(timer, before: list, times: list | None, reps: int) -> dict:
    """{check: {'ok': bool, 'why': str}} for a timer with a probe (see the module)."""
    probe = timer.probe
    out = {}
    try:
        timer.replay_sync()
        got = probe.out.clone()
        want = probe.expect()
        ok = _same(got, want, probe.tol)
        why = "" if ok else "the timed graph's output differs from the gate's function on the gated inputs"
        if ok and not probe.tol and probe.gate_print is not None and fingerprint(got) != probe.gate_print:
            ok, why = False, "the timed graph's output differs from the gate's own output"
        out["output"] = {"ok": ok, "why": why}
        after = prints(probe)
        if len(before) != len(after):   # zip would compare only the shorter list's reads
            out["inputs"] = {"ok": False, "why": f"{len(before)} input prints taken before timing for "
                                                 f"{len(after)} inputs and weight copies read"}
        else:
            moved = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
            out["inputs"] = {"ok": not moved, "why": f"{len(moved)} of {len(before)} inputs or weight copies "
                                                     "changed during timing" if moved else ""}
        if probe.x is not None:
            keep = probe.x.clone()
            probe.x.copy_(_fresh(keep))
            try:
                timer.replay_sync()
                got = probe.out.clone()
                want = probe.reference() if probe.reference is not None else probe.expect()
            finally:
                probe.x.copy_(keep)
                timer.replay_sync()
            ok = _same(got, want, probe.ref_tol if probe.reference is not None else probe.tol)
            out["fresh input"] = {"ok": ok, "why": "" if ok else "with x rewritten between replays the output "
                                  "is not the gate's function of the new x (cached or partial work)"}
        if times:
            ev = sorted(times)[len(times) // 2]
            wall = timer.wall(reps)
            ok = ev >= WALL_MIN * wall
            out["wall clock"] = {"ok": ok, "events_us": ev, "wall_us": wall,
                                 "why": "" if ok else f"CUDA events {ev:.3g} µs < {WALL_MIN:g} x the synchronized "
                                                      f"host clock {wall:.3g} µs: work ran outside the timed stream"}
    except Exception as e:      # a check that cannot run is a failed check, with its cause
        out["error"] = {"ok": False, "why": f"{type(e).__name__}: {e}"}
    return out


def failures(after: dict | None) -> list:
    """'label check: why' for every failed check of measure's info['after']."""
    return [f"{lab} {name}: {v['why']}" for lab, checks in (after or {}).items()
            for name, v in checks.items() if not v.get("ok")]
