"""Edges of the bench's instruments that fault injection found unpinned: which GPU NVML reads
(matched by PCI address, else by CUDA_VISIBLE_DEVICES), a clock-event query that fails, the
spread of a row's samples, a spin of 0 µs (no power proxy), a step call reading a call before
the step's first, and the level of a call that reads call 0. Expected values are derived by
hand from the fakes given."""
import math
import sys
import types

import pytest
import torch

from pq2verify import bench
from pq2verify.bench import timing
from pq2verify.bench.plan import Config

F = "tests/test_bench_instrument_edges.py"


def _repro(test):
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


def _fake_nvml(buses):
    """NVML with one device per PCI bus number; a handle is its index as 'h<i>'."""
    return types.SimpleNamespace(
        nvmlDeviceGetCount=lambda: len(buses),
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(bus=buses[int(h[1:])], device=0))


def _cuda(monkeypatch, idx, props):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: idx)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)


def test_nvml_reads_the_gpu_on_torchs_pci_bus(monkeypatch):
    """torch's device sits on bus 0x41, NVML's second device (index 1); NVML index 0 is on bus
    0x1b. Whatever index torch gives (0 here, as under CUDA_VISIBLE_DEVICES=1), the handle is
    NVML's device 1: h1."""
    _cuda(monkeypatch, 0, types.SimpleNamespace(pci_bus_id=0x41, pci_device_id=0))
    got = timing._nvml_handle(_fake_nvml([0x1b, 0x41]))
    assert got == "h1", (got, _repro("test_nvml_reads_the_gpu_on_torchs_pci_bus"))


def test_without_a_pci_address_nvml_follows_cuda_visible_devices(monkeypatch):
    """No PCI address from torch: torch's index 1 under CUDA_VISIBLE_DEVICES=3,2 is NVML's
    device 2 (h2). Under CUDA_VISIBLE_DEVICES=2 (one entry), index 1 names no entry: NVML
    index 1 as given (h1), not an error."""
    t = "test_without_a_pci_address_nvml_follows_cuda_visible_devices"
    _cuda(monkeypatch, 1, types.SimpleNamespace())
    nv = _fake_nvml([0, 1, 2, 3])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    assert timing._nvml_handle(nv) == "h2", _repro(t)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert timing._nvml_handle(nv) == "h1", _repro(t)


def test_a_clock_event_query_that_fails_is_reported_and_not_read(monkeypatch):
    """NVML has the clock-event call, but it raises on this GPU: the reader says throttling is
    not detected, and its readings (1980 MHz, 3201 MHz, 500 W) carry no throttle field rather
    than raising at the first sample."""
    t = "test_a_clock_event_query_that_fails_is_reported_and_not_read"

    def boom(h):
        raise RuntimeError("not supported")
    nv = types.SimpleNamespace(nvmlInit=lambda: None, NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1,
                               nvmlDeviceGetClockInfo=lambda h, c: 1980 if c == 0 else 3201,
                               nvmlDeviceGetPowerUsage=lambda h: 500_000,
                               nvmlDeviceGetCurrentClocksEventReasons=boom)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setattr(timing, "_nvml_handle", lambda nv: "h")
    read, note = timing.nvml_reader()
    assert "throttling not detected" in note, (note, _repro(t))
    assert read() == {"sm_mhz": 1980, "mem_mhz": 3201, "power_w": 500.0}, _repro(t)


def test_a_spread_is_median_min_max_and_count_of_what_was_read():
    """Samples 3, None, 1, 2 (None: not read): median 2, min 1, max 3, n 3; nothing read: None."""
    t = "test_a_spread_is_median_min_max_and_count_of_what_was_read"
    assert timing.spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}, _repro(t)
    assert timing.spread([None]) is None, _repro(t)


def test_a_spin_of_zero_is_no_power_proxy_not_an_error():
    """--spin-us 0 means no power proxy: accepted. -1 is refused naming the option."""
    t = "test_a_spin_of_zero_is_no_power_proxy_not_an_error"
    Config(spin_us=0.0).check()
    with pytest.raises(ValueError, match="--spin-us"):
        Config(spin_us=-1.0).check()


def test_a_step_call_reading_before_the_steps_input_is_refused():
    """Source -1 is the step's input; -2 names nothing that runs: refused, naming the call."""
    shapes = bench.step_shapes()
    name = next(iter(shapes))
    bench.check_chain([(name, -1)], shapes)
    with pytest.raises(ValueError, match="step call 0"):
        bench.check_chain([(name, -2)], shapes)


def test_a_call_reading_call_0_starts_from_call_0s_level():
    """Gains log2 3.4 then 0.4: call 0 from the input: pre 3.4, e -3, level 0.4. Call 1 reads
    call 0: pre 0.4 + 0.4 = 0.8, e -1, level -0.2 (not 0.4, as from the input)."""
    exps, level = bench.exponents([("a", -1), ("b", 0)], {"a": 3.4, "b": 0.4})
    assert exps == [-3, -1] and level == pytest.approx([0.4, -0.2]), (
        (exps, level), _repro("test_a_call_reading_call_0_starts_from_call_0s_level"))


def test_a_step_exactly_at_its_bounds_is_bounded():
    """Calls whose outputs are the input (RMS 1) times 2^16, 2^-16, 3 and 0.5: relative RMS
    65536, 1/65536, 3, 0.5. BOUND is 2^16 either way, ends included: bounded; min 2^-16, max
    2^16, last 0.5. One more doubling (2^17) is unbounded."""
    import functools
    t = "test_a_step_exactly_at_its_bounds_is_bounded"
    x = torch.ones(4, dtype=torch.float32)

    def contestant(scales):
        thunks = [functools.partial(lambda v, s: v * s, x, s) for s in scales]
        return types.SimpleNamespace(build=lambda: thunks, calls=[types.SimpleNamespace(path="p")] * len(scales))
    st = bench.chain_stats(contestant([2.0 ** 16, 2.0 ** -16, 3.0, 0.5]))
    assert st["bounded"] and st["finite"], (st, _repro(t))
    assert (st["rms_min"], st["rms_max"], st["rms_last"]) == (2.0 ** -16, 2.0 ** 16, 0.5), (st, _repro(t))
    assert not bench.chain_stats(contestant([2.0 ** 17, 1.0]))["bounded"], _repro(t)


# --- the relative-RMS comparison of the checks after timing ------------------------------------
# b = 23 ones, a = b but a[22] = 1 + delta: relRMS = |delta| / sqrt(23); with tol = 0.01 the
# edge is delta = 0.01 sqrt(23). CHUNK = 5 puts a[22] alone in the last (short) block.
EDGE = 0.01 * 23 ** 0.5


@pytest.mark.parametrize("last, want", [(0.0, True), (0.9 * EDGE, True), (1.1 * EDGE, False),
                                        (float("nan"), False), (float("inf"), False)],
                         ids=["equal", "inside", "outside", "nan", "inf"])
def test_relative_rms_in_blocks_sees_the_last_block(monkeypatch, last, want):
    """The check compares in FP64 blocks of CHUNK elements (a whole FP64 copy of lm_head's
    M = 8192 output is 15 GiB, which ran an 80 GB GPU out of memory): a difference, NaN or inf
    only in the last block decides the verdict, and no block converted is longer than CHUNK."""
    from pq2verify.bench import checkafter
    monkeypatch.setattr(checkafter, "CHUNK", 5)
    seen = []
    double = torch.Tensor.double
    monkeypatch.setattr(torch.Tensor, "double", lambda t: (seen.append(t.numel()), double(t))[1])
    b = torch.ones(23)
    a = b.clone()
    a[22] = 1.0 + last if math.isfinite(last) else last
    got = checkafter._same(a, b, 0.01)
    assert got is want, _repro("test_relative_rms_in_blocks_sees_the_last_block") + f": got {got}"
    assert seen and max(seen) <= 5, f"a block of {max(seen)} elements was converted whole (CHUNK 5)"


def test_relative_rms_of_nothing_or_a_nan_reference_is_not_a_pass():
    """No elements: no relative RMS, so no pass. A NaN in the reference b (the independent
    computation) makes the reference's RMS NaN, and NaN is within no tolerance."""
    from pq2verify.bench import checkafter
    assert checkafter._same(torch.ones(0), torch.ones(0), 0.1) is False
    b = torch.ones(8)
    b[3] = float("nan")
    assert checkafter._same(torch.ones(8), b, 0.1) is False
    assert checkafter._same(torch.zeros(8), torch.zeros(8), 0.1) is True    # 0 <= 0.1 x 0


@pytest.mark.parametrize("at", [0, 7, 22], ids=["first", "in-block", "last-block"])
def test_an_inf_in_the_reference_is_not_a_pass_whatever_the_output(at, monkeypatch):
    """An inf in the reference b makes sum b^2 inf, and tol x inf admits any finite output:
    [5, -7, ...] against a reference holding one inf must fail, in whichever block it sits."""
    from pq2verify.bench import checkafter
    monkeypatch.setattr(checkafter, "CHUNK", 5)
    a = torch.arange(23, dtype=torch.float32) * 5 - 7
    for inf in (float("inf"), float("-inf")):
        b = torch.ones(23)
        b[at] = inf
        got = checkafter._same(a, b, 0.1)
        assert got is False, _repro("test_an_inf_in_the_reference_is_not_a_pass_whatever_the_output") + \
            f": b[{at}] = {inf}, got {got}"
