"""Serving clocks: the decode step with a power proxy after each of its calls.

A graph of 305 back-to-back memory-bound projections draws more power than a model does (a model
runs attention, norms and the rest between them), so the GPU may hold other clocks than in
serving. The proxy: after each call of the chained step (step.py), one low-power spin,
torch.cuda._sleep(cycles): a one-thread kernel that busy-waits on clock64() until `cycles` SM
clock cycles have passed. It reads and writes no memory; it stands in for the rest of the model.

Calibration. clock64() counts SM clock cycles, so cycles per µs is the SM clock in MHz:
cycles = round(spin_us * f), f measured in the same run just before the step's graphs are built
(calibration()): the median NVML SM clock read while one calibration spin of CAL_CYCLES runs
(the clock a spin runs at), or, without NVML, CAL_CYCLES over that spin's CUDA-event time. The
length a spin has in the timed graphs is measured, not assumed: the graph of the spins alone
('spin', POWER_LABELS), timed in the same alternating rounds, gives µs per spin (where the clock
under the step differs from the calibration's, a spin lasts cycles / that clock).

The matrix kernels' own time under the proxy: per round, t(step+spin) - t(spin) (the same
spins, the same rounds); the median of the per-round differences with its bootstrap interval.

PDL. Decode paths whose config sets PDL (gemv, small_mma) launch their kernels with
programmatic dependent launch: a call's quantize and GEMV kernels, and one call's last kernel
and the next call's first. A spin sits between calls, so it cuts the edge between calls (the
edges inside a call remain): the spin is launched without the PDL attribute, so it starts only
after the call before it has completed, and it never calls griddepcontrol.launch_dependents, so
the next call's first kernel may launch early only when the spin exits: no part of a call
overlaps the call before it. The step+spin minus spin difference therefore also holds the launch
latency that PDL hides between calls in the step without spins; it is the step as a model with
other kernels between its projections would see it, not the same quantity as the plain step."""

import functools
import statistics

from .checkafter import Thunks
from .contestants import Call, Contestant

SPIN = "spin"                  # a spin's Call path (the dry run fakes its time as its nominal µs)
CAL_CYCLES = 20_000_000        # the calibration spin: about 10 ms at H200 clocks, several NVML reads
POWER_LABELS = ("a+spin", "b+spin", "spin")


def cycles_for(spin_us: float, cycles_per_us: float) -> int:
    """Cycles of a spin of spin_us at cycles_per_us (the SM clock in MHz), at least 1."""
    return max(1, round(spin_us * cycles_per_us))


def calibration(nvml_mhz, cal_cycles: int, events_us: float | None) -> dict:
    """cycles per µs from one calibration spin of cal_cycles: the median of the NVML SM clock
    readings taken while it ran, else cal_cycles over its CUDA-event µs. RuntimeError when
    neither is there."""
    mhz = [float(v) for v in nvml_mhz if v]
    ev = cal_cycles / events_us if events_us and events_us > 0 else None
    if mhz:
        f, src = statistics.median(mhz), f"NVML SM clock during a {cal_cycles}-cycle spin (median of {len(mhz)})"
    elif ev:
        f, src = ev, f"{cal_cycles} cycles over the spin's CUDA-event time (no NVML reading)"
    else:
        raise RuntimeError("no SM clock: no NVML reading and no event time of the calibration spin")
    return {"cycles_per_us": f, "source": src, "nvml_sm_mhz": statistics.median(mhz) if mhz else None,
            "events_cycles_per_us": ev, "readings": len(mhz)}


def measure_calibration(read, cal_cycles: int = CAL_CYCLES) -> dict:
    """calibration() on the GPU: one warm-up spin, then a spin of cal_cycles between CUDA events
    with NVML (read: timing.nvml_reader's, or None) polled until it ends."""
    import time

    import torch
    torch.cuda._sleep(1000)            # loads the spin kernel outside the timed spin
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cal_cycles)
    end.record()
    mhz = []
    while not end.query():
        if read is not None:
            try:
                mhz.append(read()["sm_mhz"])
            except Exception:     # a failed read loses one reading
                pass
        time.sleep(0.0005)
    end.synchronize()
    return calibration(mhz, cal_cycles, start.elapsed_time(end) * 1e3)


def _spin(cycles: int) -> None:
    import torch
    torch.cuda._sleep(cycles)


def spin_call(spin_us: float) -> Call:
    return Call(SPIN, 0, 0, 0, 0, us=spin_us)


def with_spins(c: Contestant, label: str, cycles: int, spin_us: float, spin=None) -> Contestant:
    """c's calls with one spin of `cycles` after each; the same probe (checks after timing)."""
    spin = spin or _spin
    calls = [x for call in c.calls for x in (call, spin_call(spin_us))]

    def build():
        t = c.build()
        out = Thunks(x for f in t for x in (f, functools.partial(spin, cycles)))
        out.probe = t.probe
        return out
    return Contestant(label, calls, build, c.per)


def spins_only(n: int, cycles: int, spin_us: float, spin=None) -> Contestant:
    """The graph of the n spins alone: what the proxy costs by itself."""
    spin = spin or _spin
    return Contestant("spin", [spin_call(spin_us)] * n,
                      lambda: Thunks(functools.partial(spin, cycles) for _ in range(n)), 1)


def matrix_rounds(with_spin: list, spin: list) -> list:
    """Per round: the step with spins minus the spins alone (rounds paired by index)."""
    return [a - b for a, b in zip(with_spin, spin)]
