"""What the tuning sweeps (tools/tune/) share: the bench's graph timer in seconds, the GPU's
clocks as nvidia-smi prints them, the decode step's PQ2 shape names as an argparse type, the
streaming bandwidth and rotated weight copies. The bench itself does not use this module."""
import argparse
import statistics
import subprocess

import torch

from . import plan
from .probe import read_probe
from .timing import GraphTimer


def capture(thunks) -> GraphTimer:
    """One CUDA graph of thunks (the bench's timer); it keeps the thunks' tensors alive."""
    return GraphTimer(thunks, per=1)


def replay_s(timer: GraphTimer, reps: int) -> float:
    """Seconds of one replay, the mean over reps back-to-back replays (CUDA events)."""
    return timer.sample(reps) / 1e6


def graph_time(thunks, reps=10, samples=5) -> float:
    """Median seconds of one pass over thunks, captured in one graph."""
    t = capture(thunks)
    out = [replay_s(t, reps) for _ in range(samples)]
    t.close()
    return statistics.median(out)


def clocks() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "n/a"


def pq2_shape_names(spec: str) -> list:
    """argparse type: comma-separated names of the decode step's PQ2 shapes (gate_up, down, ...),
    refused with the known names otherwise."""
    known = [nm for nm, sh in plan.step_shapes().items() if not sh.dense]
    names = [v.strip() for v in spec.split(",") if v.strip()]
    bad = [v for v in names if v not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown shape {bad or 'none'}; expected names from {', '.join(known)}")
    return names


def stream_bw() -> float:
    """Bytes/s of a streaming read of a 2 GB buffer (far past L2), printed with the clocks."""
    buf = torch.randint(-2 ** 31, 2 ** 31 - 1, (2 * 10 ** 9 // 4,), dtype=torch.int32, device="cuda")
    rd, _ = read_probe(buf)
    bw = buf.numel() * 4 / graph_time([rd], reps=5)
    print(f"streaming read {bw / 1e12:.3f} TB/s; clocks {clocks()}", flush=True)
    return bw


def rotated_weights(n: int, k: int) -> tuple[list, int]:
    """(copies, bytes of one) of prepared N x K weights to time calls on in turn: 2 to 12
    copies, about 400 MB together, so each call reads its weight from DRAM, not L2."""
    from pq2verify import inputs
    nbytes = plan.pq2_nbytes(n, k)
    copies = max(2, min(12, int(400e6 // nbytes) + 1))
    return [inputs.ternary_weight(n, k, seed=i, device="cuda") for i in range(copies)], nbytes
