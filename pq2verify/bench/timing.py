"""Timing: CUDA graphs, alternating rounds, NVML clock and power sampling, ratios and spreads."""

import math
import os
import statistics
import threading

import torch

from .plan import Config


class GraphTimer:
    """One CUDA graph of `thunks` (kernel calls); sample() times replays with CUDA events. It
    keeps the thunks, and so every tensor they read or write, alive: the graph holds those
    addresses."""

    def __init__(self, thunks: list, per: int):
        self.thunks, self.per = thunks, per
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):      # warm-up (compiles, workspaces) off the capture stream
            for f in thunks:
                f()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for f in thunks:
                f()
        torch.cuda.synchronize()
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def sample(self, reps: int, during=None) -> float:
        """µs per unit over `reps` back-to-back replays; `during` runs while the GPU works."""
        self.start.record()
        for _ in range(reps):
            self.graph.replay()
        self.end.record()
        if during is not None:
            during()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e3 / (reps * self.per)

    def replay_sync(self) -> None:
        """One replay, then the whole device synchronized (work on any stream is done)."""
        self.graph.replay()
        torch.cuda.synchronize()

    def wall(self, reps: int) -> float:
        """µs per unit by the host clock around `reps` replays, the whole device synchronized
        before and after: work that the CUDA events miss (another stream) still counts here."""
        import time
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            self.graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / (reps * self.per)

    @property
    def probe(self):
        return getattr(self.thunks, "probe", None)

    def close(self) -> None:
        self.graph = self.thunks = None


class Sampler:
    """Readings of `read()` (NVML clocks and power) tagged with the contestant being timed: a
    background thread reads every `interval_s`, and poll() adds one reading per sample while the
    GPU is busy. interval_s=0: no thread (dry runs and tests)."""

    def __init__(self, read, interval_s: float = 0.01, note: str = ""):
        self.read, self.interval, self.note = read, interval_s, note
        self.tag = None
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.read is not None and self.interval:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return False

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.poll()

    def mark(self, tag) -> None:
        self.tag = tag

    def throttled_since(self, start: int) -> bool:
        """Whether a reading taken since samples[start] reports a throttle reason."""
        return any(r.get("throttle") for _, r in self.samples[start:])

    def poll(self) -> None:
        tag = self.tag
        if tag is None or self.read is None:
            return
        try:
            r = self.read()
        except Exception:  # a failed NVML read loses one sample, never the timing
            return
        self.samples.append((tag, r))

    def summary(self, tag) -> dict:
        rs = [r for t, r in self.samples if t == tag]
        if not rs:
            return {"n": 0, "note": self.note or "no readings"}
        out = {"n": len(rs)}
        for key in rs[0]:
            vals = [r[key] for r in rs]
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        return out


def _nvml_handle(nv):
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:   # match by PCI address: NVML indices ignore CUDA_VISIBLE_DEVICES
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            pci = nv.nvmlDeviceGetPciInfo(h)
            if pci.bus == bus and pci.device == getattr(props, "pci_device_id", pci.device):
                return h
    vis = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if idx < len(vis) and vis[idx].isdigit():
        idx = int(vis[idx])
    return nv.nvmlDeviceGetHandleByIndex(idx)


def nvml_reader():
    """(read, note): read() gives the SM and memory clocks (MHz) and power (W) of the GPU that
    torch uses; (None, why) without NVML."""
    try:
        import pynvml as nv
        nv.nvmlInit()
        h = _nvml_handle(nv)
    except Exception as e:
        return None, f"NVML unavailable ({type(e).__name__}: {e})"

    # newer pynvml names them clock events; an old one only throttle reasons; neither: not read
    reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
    try:
        if reasons is not None:
            reasons(h)
    except Exception:
        reasons = None

    def read():
        r = {"sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
             "mem_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
             "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0}
        if reasons is not None:
            r["throttle"] = int(reasons(h)) & THROTTLE_MASK
        return r
    return read, "" if reasons is not None else "NVML has no clock event reasons: throttling not detected"


MAX_REPS = 1000      # replays per sample at most
BRACKET = 3          # control samples before the first round and after the last (drift bracket)
# NVML clock-event reasons that mean the clocks were held down (power cap, thermal, hardware
# slowdown, power brake); idle, application clocks, sync boost and display clocks do not.
THROTTLE_MASK = 0x04 | 0x08 | 0x20 | 0x40 | 0x80


def time_rounds(timers: dict, pairs: int, warmup: int, min_sample_ms: float, sampler=None, *,
                info: dict | None = None, compare=(), ci_width: float | None = None,
                max_pairs: int | None = None, deadline=None, min_clean: int = 7):
    """Every contestant once per round, the order reversed every other round (A B C, C B A, ...)
    so drift and order effects hit all alike. Warm-up rounds are not kept; they size `reps`, the
    replays per sample, so that a sample lasts about min_sample_ms. Returns ({label: [µs per unit
    per round]}, {label: reps}, [order of each round]).

    info (filled when given): 'bracket', the first label's BRACKET samples before the first round
    and after the last (stats.drift); 'rounds' timed; 'throttled', the rounds during which the
    sampler read a throttle reason (dropped when at least min_clean clean rounds remain, else
    kept and said so); 'stopped': why the rounds ended. With compare (pairs of labels) and
    ci_width, rounds go on two at a time until every compared ratio's bootstrap interval is at
    most ci_width wide (relative), max_pairs rounds are timed, or deadline() is true."""
    from .stats import rel_width, ratio_interval
    labels = list(timers)
    est = {}
    for _ in range(max(1, warmup)):
        for lab in labels:
            est[lab] = timers[lab].sample(1)
    # capped: a timer whose events see (almost) nothing must not be replayed a million times
    reps = {lab: min(MAX_REPS, max(1, math.ceil(min_sample_ms * 1e3 / max(est[lab] * timers[lab].per, 1e-3))))
            for lab in labels}
    times = {lab: [] for lab in labels}
    orders, flagged = [], []
    ctl = labels[0]

    def sample(lab):
        start = len(sampler.samples) if sampler is not None else 0
        if sampler is not None:
            sampler.mark(lab)
        t = timers[lab].sample(reps[lab], during=sampler.poll if sampler else None)
        hot = sampler is not None and sampler.throttled_since(start)
        return t, hot

    first = [sample(ctl)[0] for _ in range(BRACKET)] if info is not None else []

    def one_round(i):
        order = labels if i % 2 == 0 else labels[::-1]
        orders.append(list(order))
        hot = False
        for lab in order:
            t, h = sample(lab)
            times[lab].append(t)
            hot = hot or h
        if sampler is not None:
            sampler.mark(None)
        flagged.append(hot)

    def clean():
        keep = [i for i, f in enumerate(flagged) if not f]
        return {lab: [v[i] for i in keep] for lab, v in times.items()}

    def wide():
        c = clean()
        return [f"{y}/{x}" for x, y in compare if c.get(x) and c.get(y)
                and rel_width(ratio_interval(c[x], c[y])) > ci_width]

    for i in range(pairs):
        one_round(i)
    stopped = None
    if compare and ci_width:
        stopped = "narrow"
        while wide():
            if max_pairs is not None and len(orders) >= max_pairs:
                stopped = "max rounds"
                break
            if deadline is not None and deadline():
                stopped = "budget"
                break
            for _ in range(2):
                one_round(len(orders))
    if info is not None:
        last = [sample(ctl)[0] for _ in range(BRACKET)]
        if sampler is not None:
            sampler.mark(None)
        hot = [i for i, f in enumerate(flagged) if f]
        info.update(bracket={"label": ctl, "first": first, "last": last}, rounds=len(orders),
                    throttled=hot, stopped=stopped, dropped=False)
        if hot and len(flagged) - len(hot) >= min_clean:
            times = clean()
            info["dropped"] = True
    return times, reps, orders


def spread(vals) -> dict | None:
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def fit_fixed_bw(points) -> dict | None:
    """Least-squares line t = fixed + bytes / bw through (bytes, µs) points (one per row count
    of a shape): fixed µs per call, the marginal GB/s (1 / slope; None when the slope is not
    positive) and the largest residual as a fraction of its point's time. None with fewer
    than two distinct byte counts."""
    pts = [(float(b), float(t)) for b, t in points if t is not None]
    if len({b for b, _ in pts}) < 2:
        return None
    mb = sum(b for b, _ in pts) / len(pts)
    mt = sum(t for _, t in pts) / len(pts)
    slope = sum((b - mb) * (t - mt) for b, t in pts) / sum((b - mb) ** 2 for b, _ in pts)
    fixed = mt - slope * mb
    resid = max(abs(t - fixed - slope * b) / t for b, t in pts)
    return {"fixed_us": fixed, "gbps": 1e-3 / slope if slope > 0 else None, "max_resid": resid,
            "points": [[b, t] for b, t in pts]}


def round_ratios(times: dict, pairs) -> dict:
    """'{y}_over_{x}': speedup of y over x per round, t_x / t_y (> 1: y faster): median, min,
    max, n, and lo, hi, the bootstrap interval of the median (stats.ratio_interval)."""
    from .stats import ratio_interval
    out = {}
    for x, y in pairs:
        if times.get(x) and times.get(y):
            out[f"{y}_over_{x}"] = ratio_interval(times[x], times[y])
    return out


def measure(env, contestants: list, cfg: Config, *, compare=(), info: dict | None = None):
    """Build every contestant's timer, time them in alternating rounds under the sampler, then
    run the checks after timing (checkafter) on every timer that carries a probe. A contestant
    whose graph cannot be built is reported in `failed`, the rest still run. info (when given)
    gets time_rounds' info and 'after': {label: checks after timing}."""
    from . import checkafter
    timers, failed = {}, {}
    try:
        for c in contestants:
            try:
                timers[c.label] = env.timer(c)
            except Exception as e:
                failed[c.label] = f"graph build failed: {type(e).__name__}: {e}"
                env.release()
        times, reps, clocks = {}, {}, {}
        if timers:
            before = {lab: checkafter.prints(t.probe) for lab, t in timers.items() if getattr(t, "probe", None)}
            rinfo = {}
            with env.sampler() as smp:
                times, reps, _ = time_rounds(timers, cfg.pairs, cfg.warmup, cfg.min_sample_ms, smp, info=rinfo,
                                             compare=[p for p in compare if p[0] in timers and p[1] in timers],
                                             ci_width=getattr(cfg, "ci_width", None),
                                             max_pairs=getattr(cfg, "max_pairs", None),
                                             deadline=getattr(env, "deadline", None))
            clocks = {lab: smp.summary(lab) for lab in timers}
            if info is not None:
                info.update(rinfo)
                info["after"] = {lab: checkafter.run(timers[lab], before[lab], times.get(lab), reps[lab])
                                 for lab in before}
    finally:
        for t in timers.values():
            t.close()
        timers.clear()
        env.release()
    return times, reps, clocks, failed
