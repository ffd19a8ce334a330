"""CUDA graphs for the model runner's decode calls, so that a decode forward is not bound by the
host: one graph per (stack, M, fold order, kernel switches), captured on the key's second use
and replayed from then on. A replayed call costs the host a copy in, a replay and a copy out,
instead of 2-3 Triton launches and the wrapper's Python (82-210 us a call on the H200's host
against 7-37 us of GPU time: results/2026-11-30-gsm8k-noise-floor/call-cost.txt).

What a replay computes is what the eager call computes: the graph holds the very launches of
an eager call at that key (the path is resolved from the same switches, the configuration
from the same shapes), and every path's replay == eager is what the suite's graph tests prove.
The first use of a key runs eagerly (it compiles the kernels and runs the one-time weight
checks, which synchronize and cannot be captured). A replay counts its calls in the dispatch
trace exactly as the eager call would, so a run's trace is the same with graphs or without.
"""
from collections import Counter
from dataclasses import dataclass

from kernels import dispatch

MAX_M = 16      # decode batches; prefills (M = a batch's tokens) run eagerly


@dataclass
class _Graph:
    graph: object
    x: object           # static input, copied into before each replay
    y: object           # static output, copied out after each replay
    served: Counter     # path -> calls the captured region makes


class CallGraphs:
    """Graphs of one model's decode calls; `capture` makes a graph object (tests substitute a
    stand-in; by default torch.cuda.CUDAGraph, all sharing one memory pool: the replays are
    sequential on one stream and only their static outputs outlive them)."""

    def __init__(self, max_m: int = MAX_M, capture=None, device_type: str = "cuda"):
        self.max_m, self.device_type = max_m, device_type
        self._capture = capture or _cuda_capture()
        self._seen: dict = {}
        self.captured = 0
        self.replayed = 0

    def applies(self, x) -> bool:
        return x.device.type == self.device_type and x.shape[0] <= self.max_m

    @property
    def graphs(self) -> int:
        return sum(1 for g in self._seen.values() if g)

    def call(self, key, fn, x):
        """fn(x) -> (y, served): the call itself, eager. Returns the same (y, served) for x."""
        g = self._seen.get(key)
        if g is None:
            self._seen[key] = False               # first use: eager
            return fn(x)
        if g is False:
            g = self._seen[key] = self._capture(fn, x)   # its dispatch calls count this call
            self.captured += 1
        else:
            g.x.copy_(x)
            for name, n in g.served.items():
                dispatch.count(name, n)
        g.graph.replay()
        self.replayed += 1
        return g.y.clone(), Counter(g.served)


def _cuda_capture():
    """torch.cuda.CUDAGraph captured on one side stream into one shared pool. Not through
    torch.cuda.graph(), which synchronizes and empties the allocator's cache on every capture:
    thousands of captures a run would then re-allocate every freed block."""
    state = {}

    def capture(fn, x):
        import torch
        if not state:
            state.update(pool=torch.cuda.graph_pool_handle(), stream=torch.cuda.Stream())
        side, here = state["stream"], torch.cuda.current_stream()
        sx = x.clone()
        graph = torch.cuda.CUDAGraph()
        side.wait_stream(here)           # sx is written on this stream
        with torch.cuda.stream(side):
            graph.capture_begin(pool=state["pool"])
            try:
                y, served = fn(sx)
            finally:
                graph.capture_end()
        here.wait_stream(side)
        return _Graph(graph, sx, y, Counter(served))
    return capture
