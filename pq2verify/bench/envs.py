"""Environments that run the same engine: RealEnv (CUDA gates and times; the CPU gates on the
interpreter and skips timing with a reason) and FakeEnv (dry run: faked gates and timings, so the
table, report, plot and resume are exercised without CUDA; never a measurement)."""

import random
import time
import zlib
from dataclasses import dataclass, replace

import torch

from kernels import dispatch
from .. import checks
from .plan import GB
from .gate import BaselineInputs, Gate, gate, traced_path
from .contestants import Call, Contestant
from .timing import GraphTimer, Sampler, nvml_reader
from . import launch, power


class RealEnv:
    """Kernels for real: gates on `device` ('cuda', or 'cpu' with Triton's interpreter); times
    only on CUDA."""

    def __init__(self, device: str):
        self.device = device
        self.kind = "cuda" if device == "cuda" else "interpreter"
        self.can_time = device == "cuda"
        self.runs_kernels = True        # the step's chained values are checked by running it once
        self.why_not = "" if self.can_time else "no CUDA GPU: timing skipped (the gate ran on Triton's interpreter)"
        self.default_shapes = "bonsai27b" if self.can_time else "small"
        self.reruns = 2
        self._gates = {}
        self._nvml = None
        self.first_calls = {}           # path -> its first call in the process (launch.first_call)
        self._busy_cal = None

    def provenance(self) -> dict:
        from .. import provenance
        info = provenance.collect()
        if self.can_time:
            read, note = self._reader()
            info["nvml"] = ("yes" + (f" ({note})" if note else "")) if read else note
            info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / GB, 1)
        return info

    def device_name(self) -> str:
        from kernels import backend
        return backend.name()

    def inputs(self, case):
        return checks.Inputs(case, self.device)

    def gate(self, case, inp, *, baseline=False) -> Gate:
        key = ("bf16:" if baseline else "") + case.id
        if key not in self._gates:
            self._gates[key] = gate(case, inp, self.device, reruns=self.reruns, repro=not baseline,
                                    record_output=not baseline and self.can_time)
        return self._gates[key]

    def side(self, kset: str, case0, inp):
        """(path the set ran, its gate) for these inputs."""
        try:
            if self.can_time:       # the first call of a path in the process: compile or cache load
                path, rec = launch.first_call(lambda: traced_path(kset, inp), torch.cuda.synchronize)
                self.first_calls.setdefault(path, {**rec, "case": case0.id, "kset": kset})
            else:
                path = traced_path(kset, inp)
        except Exception as e:
            try:
                path = dispatch.resolve(case0.m, inp.w, inp.x, kset).name
            except Exception:
                path = "?"
            return path, Gate(path, False, f"pq2_matmul(kernels={kset!r}) raised {type(e).__name__}: {e}")
        return path, self.gate(replace(case0, path=path), inp)

    def baseline(self, inp):
        return BaselineInputs(inp, checks.DTYPES[inp.case.dtype])

    def baseline_gate(self, case, binp) -> Gate:
        return self.gate(case, binp, baseline=True)

    def timer(self, c: Contestant):
        return GraphTimer(c.build(), c.per)

    def spin_calibration(self) -> dict:
        """Cycles per µs of the power proxy's spin, measured now (power.measure_calibration)."""
        read, _ = self._reader()
        return power.measure_calibration(read)

    def host_cost(self, path: str, inp) -> dict:
        """Host µs per eager call of `path` on inp (launch.host_us), the GPU kept busy by a spin."""
        import functools

        from .. import registry
        run = registry.get(path).kernel()
        y = torch.empty(inp.x.shape[0], inp.case.n, dtype=inp.x.dtype, device=inp.x.device)
        f = functools.partial(run, inp.x, inp.w, out=y)
        f()                      # compiled and loaded before the clock runs
        torch.cuda.synchronize()
        if self._busy_cal is None:
            self._busy_cal = self.spin_calibration()
        try:
            return launch.host_us(f, busy=launch.cuda_busy(self._busy_cal["cycles_per_us"]),
                                  settle=torch.cuda.synchronize)
        finally:
            del y
            torch.cuda.synchronize()

    def _reader(self):
        if self._nvml is None:
            self._nvml = nvml_reader()
        return self._nvml

    def sampler(self):
        read, note = self._reader()
        return Sampler(read, 0.01, note)

    def free_bytes(self) -> int:
        if not self.can_time:
            return 0
        # blocks the caching allocator holds but no tensor uses are free to torch too
        return torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()

    def release(self) -> None:
        """Hand cached blocks back between items. Never raises: after a CUDA fault the item
        that caused it is already recorded as an error, and the run must still report."""
        if not self.can_time:
            return
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


# fake model for dry runs: fraction of the bandwidth reached, and int8/bf16 rates (ops/s)
FAKE_EFF = {"single": 0.87, "small_mma": 0.78, "int_gemv": 0.60, "native": 0.35, "mmq": 0.50,
            "mmq_planes": 0.55, "cublas": 0.90, "small_gemm": 0.70, "probe:read": 0.97,
            "probe:sum": 0.90, "probe:copy": 0.96, "probe:sol": 0.72, "probe:sol_pdl0": 0.69,
            "probe:sol_pdl1": 0.82, "probe:sol_pdl2": 0.90, "probe:sol_pdl4": 0.95, "probe:sol_pdl_all": 0.97}
FAKE_RATE = {"mmq": 0.75e15, "mmq_planes": 0.98e15, "cublas": 0.72e15, "native": 0.15e15}
FAKE_BW = 4.34e12
# dry-run launch costs: host µs per eager call, and the first call's ms, per path (default 50, 900)
FAKE_HOST_US = {"mmq": 108.0, "mmq_planes": 110.0, "mmq_wgmma": 95.0, "native": 40.0, "cublas": 12.0,
                "small_gemm": 60.0, "int_gemv": 45.0, "single": 30.0, "small_mma": 35.0}
FAKE_FIRST_MS = 900.0
FAKE_SM_MHZ = 1980


def fake_us(call: Call) -> float:
    if call.path == "spin":            # a power-proxy spin: its nominal length plus the launch
        return call.us + 2.0
    t = call.nbytes / (FAKE_BW * FAKE_EFF.get(call.path, 0.5))
    if call.m > 16:
        t = max(t, call.flops / FAKE_RATE.get(call.path, 0.1e15))
    return t * 1e6 + 2.0


class FakeTimer:
    def __init__(self, c: Contestant, seed: int, noise: float = 0.03):
        self.per = c.per
        self.base = sum(fake_us(x) for x in c.calls) / c.per
        self.rng = random.Random(seed)
        self.noise = noise

    def sample(self, reps: int, during=None) -> float:
        if during is not None:
            during()
        return self.base * (1 + self.rng.uniform(-self.noise, self.noise))

    def close(self):
        pass


@dataclass(frozen=True)
class FakeWeight:
    """What dispatch.resolve reads of a PQ2 weight (its layout), with no bytes behind it."""
    n: int
    k: int
    layout: str


class FakeInputs:
    """Shapes only: enough for dispatch.resolve, nothing allocated."""

    def __init__(self, case):
        self.case = case
        dt = checks.DTYPES[case.dtype]
        self.x = torch.empty(1, case.k, dtype=dt).expand(case.m, case.k)
        dense = case.layout == "dense"
        self.w = torch.empty(0, dtype=dt) if dense else FakeWeight(case.n, case.k, case.layout)


class FakeEnv:
    """Dry run: real dispatch decisions, fake gates (PASS unless the path is in `blocked`) and
    fake timings from a bandwidth/throughput model (each call nbytes / (FAKE_BW * FAKE_EFF) + 2
    µs, times 1 +- `noise`). Nothing touches a GPU."""
    kind = "dry-run"
    device = "cpu"
    can_time = True
    runs_kernels = False
    why_not = ""
    default_shapes = "bonsai27b"

    def __init__(self, blocked=(), free_bytes: float = 141e9, seed: int = 0, noise: float = 0.03):
        self.reruns = 0
        self.blocked = set(blocked)
        self.free = free_bytes
        self.seed = seed
        self.noise = noise
        self.built = []            # labels whose timers were built, in order (for tests)
        self.first_calls = {}

    def provenance(self) -> dict:
        from .. import provenance
        return {"backend": "dry run: fake gates and fake timings, no kernel ran",
                "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": provenance.commit(),
                "torch": torch.__version__, "triton": _triton_version()}

    def device_name(self) -> str:
        return "none (dry run)"

    def inputs(self, case):
        return FakeInputs(case)

    def _gate(self, path, case) -> Gate:
        if path in self.blocked:
            return Gate(path, False, "relative RMS vs dense FP64 reference 0.02 > tolerance 0.0039 (fake)",
                        {"case": case.id})
        return Gate(path, True, "", {"case": case.id, "note": "fake gate"})

    def side(self, kset, case0, inp):
        path = dispatch.resolve(case0.m, inp.w, inp.x, kset).name
        self.first_calls.setdefault(path, {"ms": FAKE_FIRST_MS, "new_cache_entries": None,
                                           "cache": "dry run: nothing compiled", "case": case0.id, "kset": kset})
        return path, self._gate(path, replace(case0, path=path))

    def spin_calibration(self) -> dict:
        """The fake sampler's SM clock, as the real calibration reads NVML's."""
        return power.calibration([self.sampler().read()["sm_mhz"]], power.CAL_CYCLES, None)

    def host_cost(self, path: str, inp) -> dict:
        """launch.host_us on a fake clock that each call advances by FAKE_HOST_US[path]."""
        clock = _FakeClock()
        return launch.host_us(lambda: clock.advance(FAKE_HOST_US.get(path, 50.0) * 1e-6), clock=clock)

    def baseline(self, inp):
        return inp

    def baseline_gate(self, case, binp) -> Gate:
        return self._gate("cublas", case)

    def timer(self, c: Contestant):
        self.built.append(c.label)
        return FakeTimer(c, zlib.crc32(f"{self.seed}:{c.label}:{len(self.built)}".encode()), self.noise)

    def sampler(self):
        return Sampler(lambda: {"sm_mhz": FAKE_SM_MHZ, "mem_mhz": 3201, "power_w": 520.0}, 0)

    def free_bytes(self) -> int:
        return int(self.free)

    def release(self) -> None:
        pass


class _FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "not installed"


def make_env(kind: str):
    """'cuda', 'cpu' (interpreter) or 'dry-run'."""
    return FakeEnv() if kind == "dry-run" else RealEnv(kind)
