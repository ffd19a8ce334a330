"""Launch cost outside graphs: prefill runs eagerly in serving, so each call pays its Python
launcher (argument handling, specialization lookup, the launch itself) on the host.

Host µs per call (host_us): time.perf_counter around each of CALLS eager calls, ROUNDS rounds,
the median over every call. Before each round the GPU is given a spin long enough to outlast the
round (BUSY_US_PER_CALL per call), so every launch only queues behind it: the host's cost is
measured, never the GPU's (CALLS calls of a few kernels each stay far below the launch queue's
depth, which would block the host). A round that finds the spin over when it ends is counted in
idle_rounds (a call waited for the GPU, or the host was slower than the spin): such numbers are
said to be suspect in the row.

First call (first_call): the first call of each path in the process (the trace that proves which
path a kernel set serves, RealEnv.side), wall clock with the device synchronized around it,
and the count of new entries in Triton's on-disk cache across it: new entries, the kernel was
compiled (cache cold for it); none, it was loaded from the cache (warm). Only the first
specialization of a path is counted; other shapes or M may compile their own variants later.

A path whose host µs per call exceed its GPU time per call (the shape row's graph-timed median at
the same M) is launcher-bound in eager prefill: the row says so. No cached launch plan is built
here; the table measures whether one is needed."""

import os
import statistics
import time

CALLS = 20                  # eager calls per round
ROUNDS = 5
BUSY_US_PER_CALL = 1000.0   # spin length per call of a round: far above any launcher's cost


def host_us(call, calls: int = CALLS, rounds: int = ROUNDS, clock=time.perf_counter, busy=None,
            settle=None) -> dict:
    """{median_us, min_us, max_us, n, idle_rounds}: host µs of each of calls x rounds eager
    calls. busy(n) starts GPU work outlasting n calls and returns () -> whether it has ended;
    settle() waits for the GPU after a round."""
    per, idle = [], 0
    for _ in range(rounds):
        ended = busy(calls) if busy is not None else None
        for _ in range(calls):
            t0 = clock()
            call()
            per.append((clock() - t0) * 1e6)
        if ended is not None and ended():
            idle += 1
        if settle is not None:
            settle()
    return {"median_us": statistics.median(per), "min_us": min(per), "max_us": max(per), "n": len(per),
            "idle_rounds": idle, "rounds": rounds}


def cache_dir() -> str | None:
    """Triton's on-disk kernel cache (its knobs, else TRITON_CACHE_DIR, else ~/.triton/cache)."""
    try:
        from triton import knobs
        d = knobs.cache.dir
        if d:
            return d
    except Exception:
        pass
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def cache_entries(d: str | None) -> int | None:
    if not d:
        return None
    try:
        return len(os.listdir(d))
    except OSError:
        return 0


def first_call(fn, sync=None, clock=time.perf_counter, entries=None) -> tuple:
    """(fn's result, {ms, new_cache_entries, cache}): one call timed with sync() before and after
    it, entries() (the cache's entry count) read around it."""
    entries = entries or (lambda: cache_entries(cache_dir()))
    if sync is not None:
        sync()
    before = entries()
    t0 = clock()
    out = fn()
    if sync is not None:
        sync()
    ms = (clock() - t0) * 1e3
    after = entries()
    new = None if before is None or after is None else after - before
    cache = ("unknown (no cache directory)" if new is None else
             f"cold: compiled ({new} new cache entries)" if new > 0 else "warm: loaded from the on-disk cache")
    return out, {"ms": ms, "new_cache_entries": new, "cache": cache}


def cuda_busy(cycles_per_us: float):
    """busy() of host_us on the GPU: a spin of BUSY_US_PER_CALL per call, an event after it."""
    import torch

    from .power import cycles_for

    def busy(n):
        torch.cuda._sleep(cycles_for(n * BUSY_US_PER_CALL, cycles_per_us))
        ev = torch.cuda.Event()
        ev.record()
        return ev.query
    return busy


def entry(path: str, sides: str, host: dict | None, gpu_us: float | None, first: dict | None,
          error: str = "") -> dict:
    """One row of the launch-cost table; 'dominates': host µs per call > GPU µs per call."""
    e = {"path": path, "sides": sides, "host": host, "gpu_us": gpu_us, "first_call": first}
    if error:
        e["error"] = error
        return e
    h = host["median_us"] if host else None
    e["host_over_gpu"] = h / gpu_us if h is not None and gpu_us else None
    e["dominates"] = None if e["host_over_gpu"] is None else h > gpu_us
    notes = []
    if e["dominates"]:
        notes.append(f"launcher-bound: {h:.1f} µs on the host per call > {gpu_us:.1f} µs on the GPU")
    if host and host.get("idle_rounds"):
        notes.append(f"{host['idle_rounds']} of {host['rounds']} rounds outlasted the GPU spin (host numbers "
                     "may hold GPU waits)")
    if gpu_us is None:
        notes.append("no GPU time at this M in this run")
    e["note"] = "; ".join(notes)
    return e
