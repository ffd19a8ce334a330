"""The bench's self-test (`bench --selftest`): planted timing faults, each of which must be
caught, and by which check; a clean control that no check may flag.

The faults, against a good kernel (y = W x through cuBLAS over weight copies larger than L2):
- cached_output: the graph replays a result computed once at build time;
- half_weights: the kernel reads (and writes) only the first half of its rows;
- side_stream: the work runs on a stream the timer's events do not wait on;
- control_disguise: a "candidate" that is the control (A == B);
- throttle_midway: the clocks drop halfway through the rounds (simulated: the GPU's clocks are
  never changed here; the timer slows its samples by THROTTLE and the sampler reports a power
  cap from then on, as NVML would).

The checks that may catch them: the checks after timing (output, inputs, fresh input, wall
clock; checkafter), faster than the speed of light (a streaming read of the same bytes, beyond
the A/A noise), the A/B resolution (resolve.preflight), the A/A-indistinguishable verdict, the
drift bracket and the throttle flags. A kit makes the timers: GpuKit on CUDA; the CPU test
drives the same logic with a kit of fakes.
"""
import contextlib
import functools
import os
from dataclasses import dataclass

from . import checkafter, stats
from .timing import Sampler, time_rounds

THROTTLE = 1.25          # the simulated clock drop: samples this much slower
SM_MHZ, SM_MHZ_LOW, POWER_CAP = 1980, 1584, 0x04

# fault: the checks that are meant to catch it (any one suffices)
FAULTS = {
    "cached_output": ("check after timing: fresh input", "check after timing: output", "faster than SOL"),
    "half_weights": ("check after timing: output", "check after timing: fresh input", "faster than SOL"),
    "side_stream": ("check after timing: wall clock", "check after timing: output"),
    "control_disguise": ("A/B resolution", "A/A indistinguishable"),
    "throttle_midway": ("drift bracket", "throttle flags"),
}
CLEAN = "none (clean control)"


@dataclass
class Settings:
    pairs: int = 9
    warmup: int = 2
    min_sample_ms: float = 1.0


class Throttled:
    """A timer whose samples are THROTTLE slower once state['hot'] is set (the clock drop)."""

    def __init__(self, timer, state: dict):
        self.t, self.state, self.per = timer, state, timer.per

    def sample(self, reps, during=None):
        self.state["n"] += 1
        if self.state["n"] > self.state["at"]:
            self.state["hot"] = True
        v = self.t.sample(reps, during=during)
        return v * THROTTLE if self.state["hot"] else v

    def __getattr__(self, name):
        return getattr(self.t, name)


def _sampler(state: dict | None) -> Sampler:
    """One reading per sample; a power cap and lowered clocks once state['hot']."""
    def read():
        hot = state is not None and state.get("hot")
        return {"sm_mhz": SM_MHZ_LOW if hot else SM_MHZ, "throttle": POWER_CAP if hot else 0}
    return Sampler(read, 0)


def _time(timers: dict, st: Settings, sampler: Sampler, compare) -> tuple:
    info = {}
    before = {lab: checkafter.prints(t.probe) for lab, t in timers.items() if getattr(t, "probe", None)}
    with sampler:
        times, reps, _ = time_rounds(timers, st.pairs, st.warmup, st.min_sample_ms, sampler, info=info,
                                     compare=compare)
    info["after"] = {lab: checkafter.run(timers[lab], before[lab], times.get(lab), reps[lab]) for lab in before}
    return times, info


def _caught(label: str, times: dict, info: dict, aa: dict | None) -> list:
    """The checks that fired on contestant `label`."""
    out = [f"check after timing: {name}" for name, v in (info["after"].get(label) or {}).items() if not v.get("ok")]
    sols = [times[s] for s in times if s.startswith("sol") and times[s]]
    if sols and times.get(label):
        best = [min(v) for v in zip(*sols)]                        # per round, the fastest read of the same bytes
        ci = stats.ratio_interval(best, times[label])              # > 1: label faster than the SOL
        if ci and ci["lo"] > stats.noise_band(aa)[1]:
            out.append("faster than SOL")
    b = info.get("bracket") or {}
    d = stats.drift(b.get("first") or (), b.get("last") or ())
    if d and d["flagged"]:
        out.append("drift bracket")
    if info.get("throttled"):
        out.append("throttle flags")
    return out


def scenario(kit, fault: str, st: Settings) -> dict:
    """Time one planted fault (or the clean control) against the control and its A/A twin, and
    say which checks caught it."""
    state = {"n": 0, "hot": False, "at": 0} if fault == "throttle_midway" else None
    kind = {"cached_output": "cached", "half_weights": "half", "side_stream": "side"}.get(fault, "good")
    timers = {"a": kit.timer("good"), "a2": kit.timer("good"), "f": kit.timer(kind)}
    if fault != "throttle_midway":
        for s in getattr(kit, "sol_kinds", ("sol",)):
            timers[s] = kit.timer(s)
    caught, note = [], ""
    try:
        if state is not None:
            # midway through the timed rounds: after the warm-up, the opening bracket and half the rounds
            from .timing import BRACKET
            state["at"] = st.warmup * len(timers) + BRACKET + (st.pairs // 2) * len(timers)
            timers = {lab: Throttled(t, state) for lab, t in timers.items()}
        times, info = _time(timers, st, _sampler(state), compare=())
        aa = stats.ratio_interval(times["a"], times["a2"])
        caught = _caught("f", times, info, aa)
        if fault == "control_disguise":
            v = stats.verdict(stats.ratio_interval(times["a"], times["f"]), aa)
            note = f"B over A {v}"
            if v == "within noise":
                caught.append("A/A indistinguishable")
            if kit.resolution_refuses():
                caught.append("A/B resolution")
    finally:
        for t in timers.values():
            t.close()
    want = FAULTS.get(fault, ())
    ok = (not caught) if fault == CLEAN else bool(set(caught) & set(want))
    return {"fault": fault, "expected": list(want), "caught_by": caught, "ok": ok, "note": note}


def run(kit, st: Settings | None = None, faults=None) -> dict:
    st = st or Settings()
    rows = [scenario(kit, f, st) for f in [CLEAN, *(faults or FAULTS)]]
    return {"rows": rows, "ok": all(r["ok"] for r in rows)}


def lines(res: dict) -> list:
    """The table: fault, expected checks, the checks that caught it, verdict."""
    out = [f"{'fault':<22} {'caught by':<70} verdict"]
    for r in res["rows"]:
        got = ", ".join(r["caught_by"]) or "-"
        if r["fault"] == CLEAN:
            verdict = "ok (no check fired)" if r["ok"] else "FALSE ALARM"
        else:
            verdict = "caught" if r["ok"] else f"MISSED (expected: {' or '.join(r['expected'])})"
        out.append(f"{r['fault']:<22} {got:<70} {verdict}" + (f"  [{r['note']}]" if r["note"] else ""))
    return out


@contextlib.contextmanager
def env_vars(**kv):
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update(kv)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def disguise_refused(device: str) -> bool:
    """The A/B resolution on a disguised candidate: with PQ2_PATH_INT_GEMV=on, the tuned set
    serves M=1 through legacy's int_gemv; a legacy vs tuned run of M=1 must be refused."""
    from .plan import Config, make_plan, select_shapes
    from .resolve import SameSides, preflight
    cfg = Config(a="legacy", b="tuned", shapes="out", ms=(1,), step_ms=())
    plan = make_plan(cfg, select_shapes(cfg.shapes, "bonsai27b"), with_step=False)
    with env_vars(PQ2_PATH_INT_GEMV="on"):
        try:
            preflight(cfg, plan, device)
        except SameSides:
            return True
    return False


class GpuKit:
    """Timers on CUDA: y^T = W x^T through cuBLAS (torch.mm) over rotating copies of an N x K bf16
    weight (>= rotate_gb in all), as CUDA graphs; the faults as described in the module. The
    SOL is the faster, per round, of two streaming reads of the same copies (sol.read_call and
    probe.read_probe, different grids), so a good kernel is not faster than a poor read."""
    sol_kinds = ("sol", "sol2")

    def __init__(self, n: int = 8192, k: int = 5120, m: int = 1, rotate_gb: float = 1.0):
        import torch

        from .plan import GB, copies_needed
        self.torch = torch
        g = torch.Generator(device="cuda").manual_seed(0)
        self.x = torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, generator=g, device="cuda", dtype=torch.float32) * k ** -0.5).to(torch.bfloat16)
        count = copies_needed(n * k * 2, rotate_gb * GB)
        self.ws = [w] + [w.clone() for _ in range(count - 1)]
        self.n, self.m = n, m

    def resolution_refuses(self) -> bool:
        return disguise_refused("cuda")

    def timer(self, kind: str):
        from .sol import read_call
        from .timing import GraphTimer
        torch, ws, x, n = self.torch, self.ws, self.x, self.n
        xt = x.t()
        if kind == "sol":
            return GraphTimer([read_call(w.view(-1).view(torch.int32), False)[0] for w in ws], len(ws))
        if kind == "sol2":
            from .probe import read_probe
            return GraphTimer([read_probe(w.view(-1).view(torch.int32))[0] for w in ws], len(ws))
        yt = torch.zeros(n, self.m, dtype=x.dtype, device=x.device)
        if kind == "cached":
            pre = torch.mm(ws[0], xt)
            th = checkafter.Thunks(functools.partial(yt.copy_, pre) for _ in ws)
        elif kind == "half":
            h = n // 2
            th = checkafter.Thunks(functools.partial(torch.mm, w[:h], xt, out=yt[:h]) for w in ws)
        else:
            th = checkafter.Thunks(functools.partial(torch.mm, w, xt, out=yt) for w in ws)
        th.probe = checkafter.Probe(yt, lambda: torch.mm(ws[0], xt), x, [x] + ws, tol=1e-3)
        return SideStreamTimer(th, len(ws)) if kind == "side" else GraphTimer(th, len(ws))


def _side_stream_timer():
    from .timing import GraphTimer
    import torch

    class _SideStreamTimer(GraphTimer):
        """Replays its graph on another stream; its events, on the current stream, do not wait."""

        def sample(self, reps, during=None):
            side = getattr(self, "_side", None) or torch.cuda.Stream()
            self._side = side
            self.start.record()
            with torch.cuda.stream(side):
                for _ in range(reps):
                    self.graph.replay()
            self.end.record()
            if during is not None:
                during()
            self.end.synchronize()
            v = self.start.elapsed_time(self.end) * 1e3 / (reps * self.per)
            side.synchronize()
            return v
    return _SideStreamTimer


def SideStreamTimer(thunks, per):  # noqa: N802 - a class made on first use (torch.cuda at import is not wanted)
    return _side_stream_timer()(thunks, per)
