"""CUDA-graph and stale-cache safety of kernel calls (marker `graph`; reusable by the bench).

Serving replays kernels inside CUDA graphs, so a call that bakes in a host-side value, or a
launcher cache that outlives the memory it describes, computes yesterday's answer without any
error. Each check here returns a list of failure messages (empty: it held), so the tests, the
bench and the suite's own tests of deliberately broken kernels share one implementation.

A `Call` is a kernel call on fixed buffers: `fn()` is what gets captured (it writes a static
output), `eager(x, w)` recomputes on a fresh output. Build one with `path_call` (a registry
path's wrapper, out= preallocated) or `matmul_call` (pq2_matmul through a kernel set; its
output is the tensor returned during capture, which replays rewrite in place).
"""
import functools
import types
from dataclasses import dataclass
from typing import Callable

import torch

from kernels.format import PQ2Weight
from . import inputs, registry
from .bits import ndiff, same_bits

# Module-level caches of the launchers and the dispatch, classified: "scratch" buffers may hold
# anything between calls (the checks fill them with NaN before calls), everything else found
# by `module_caches` must hold no data pointer. A new tensor cache must be added here. A buffer
# shared by every stream and graph raced under concurrent replays, so a scratch cache must be
# keyed by stream and bypassed inside a graph capture (PER_STREAM; tests/test_wgmma_plan.py holds
# both, with a planted shared workspace raced for certain); split-K partials come from the
# caching allocator per call (kernels.splitk).
SCRATCH: dict[str, tuple] = {"kernels.mmq_wgmma": ("_workspace",)}
PER_STREAM = {"kernels.mmq_wgmma": "_slot"}   # module -> its function giving the (device, stream) key


def cache_modules() -> tuple[str, ...]:
    """The modules whose module-level caches the checks inspect: every module of the kernels
    package and every registry path's module (a path added later is covered without editing a
    list; a hand-written one had missed gemv): the runtime's dispatch and weight type included."""
    import pkgutil

    import kernels
    names = {f"kernels.{m.name}" for m in pkgutil.iter_modules(kernels.__path__)}
    names |= {p.module for p in registry.PATHS}
    return tuple(sorted(names))
ADDRESS_LIKE = 1 << 44   # user-space addresses on x86-64 (heap, mmap, CUDA VA) lie above this


@dataclass
class Call:
    label: str
    x: torch.Tensor
    w: object
    fn: Callable[[], torch.Tensor]          # captured: writes and returns the static output
    eager: Callable[..., torch.Tensor]      # eager(x, w) -> a fresh output




def _n(w) -> int:
    return w.shape[0] if isinstance(w, torch.Tensor) else w.n


def kernel_fn(path: registry.Path, kernel=None):
    """f(x, w, out=None) for a path (dots are never asked for: floating wrappers lack them)."""
    run = kernel or path.kernel()
    return lambda x, w, out=None: run(x, w, out=out)


def path_call(path, x, w, *, kernel=None) -> Call:
    p = registry.get(path) if isinstance(path, str) else path
    f = kernel_fn(p, kernel)
    out = torch.empty((x.shape[0], _n(w)), dtype=x.dtype, device=x.device)
    return Call(p.name, x, w, lambda: f(x, w, out=out), lambda xx, ww: f(xx, ww))


def matmul_call(kset: str, x, w) -> Call:
    from kernels.dispatch import pq2_matmul
    f = functools.partial(pq2_matmul, kernels=kset)
    return Call(f"pq2_matmul[{kset}]", x, w, lambda: f(x, w), f)


def make_inputs(path, m: int, n: int, k: int, *, dtype=torch.bfloat16, layout="prepared", seed=0,
                device="cpu", kind="normal"):
    """(x, w) for a path: a realistic ternary weight (or a dense one) and activations."""
    p = registry.get(path) if isinstance(path, str) else path
    if p.weight == "dense":
        w = inputs.dense_weight(n, k, seed, device, dtype)
    else:
        w = inputs.ternary_weight(n, k, seed, device, layout)
        w.checked = True      # codes drawn from {0,1,2}: valid by construction
    return inputs.activations(m, k, seed + 1, kind, dtype, device), w


# --- in-place mutation -------------------------------------------------------------------
def weight_parts(w) -> dict[str, torch.Tensor]:
    """Writable views of the weight's ONE allocation: codes and scales (or the dense matrix)."""
    if isinstance(w, torch.Tensor):
        return {"weight": w}
    if w.layout == "prepared":
        cut = w.n * w.k // 4
        return {"scales": w.data[cut:], "codes": w.data[:cut]}
    blocks = w.data.view(w.n, w.groups, 34)
    return {"scales": blocks[:, :, :2], "codes": blocks[:, :, 2:]}


def mutations(call: Call, x_new, w_new) -> list[tuple[str, Callable[[], None]]]:
    """The in-place changes a replay must see: activations, then each part of the weight."""
    steps = [("x", lambda: call.x.copy_(x_new))]
    new = weight_parts(w_new)
    for name, view in weight_parts(call.w).items():
        steps.append((name, lambda v=view, s=new[name]: v.copy_(s)))
    return steps


# --- caches ------------------------------------------------------------------------------
def _modules(names=None):
    import importlib
    out = []
    for name in names if names is not None else cache_modules():
        try:
            out.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    return out


def module_caches(modules=None) -> list[tuple[str, str, object]]:
    """(module, name, object) of every module-level cache: lru_cache'd functions and mutable
    containers (dict, list, set)."""
    found = []
    for mod in modules if modules is not None else _modules():
        for name, v in vars(mod).items():
            if name.startswith("__") or isinstance(v, (types.ModuleType, type)):
                continue
            if callable(v) and hasattr(v, "cache_info") and getattr(v, "__module__", None) == mod.__name__:
                found.append((mod.__name__, name, v))
            elif isinstance(v, (dict, list, set)):
                found.append((mod.__name__, name, v))
    return found


def poison_scratch(modules=None) -> int:
    """Fill every scratch buffer with NaN (floats) or -1 (integers): a kernel that reads a
    buffer it did not write in the same call then shows it. Returns how many were filled."""
    count = 0
    for mod in modules if modules is not None else _modules():
        for name in SCRATCH.get(mod.__name__, ()):
            for t in _tensors(getattr(mod, name, None)):
                t.fill_(float("nan") if t.is_floating_point() else -1)
                count += 1
    return count


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from _tensors(v)


def _addresses(obj, pointers, path="", depth=0):
    """Where obj holds an address: an int equal to a known data pointer, or address-like."""
    if depth > 4:
        return
    if isinstance(obj, bool):
        return
    if isinstance(obj, int):
        if obj in pointers or obj >= ADDRESS_LIKE:
            yield f"{path}={obj:#x}"
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _addresses(k, pointers, f"{path}[key {k!r}]"[:120], depth + 1)
            yield from _addresses(v, pointers, f"{path}[{k!r}]"[:120], depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield from _addresses(v, pointers, f"{path}[{i}]", depth + 1)


class _Recorder:
    """Stands in for an lru_cache'd function and records its arguments and results."""

    def __init__(self, fn):
        self.fn, self.seen = fn, []
        self.cache_info = fn.cache_info

    def __call__(self, *a, **kw):
        r = self.fn(*a, **kw)
        self.seen.append((a, tuple(sorted(kw.items())), r))
        return r


def check_cache_keys(run: Callable[[], list[torch.Tensor]], modules=None) -> list[str]:
    """Run `run()` (it makes calls and returns the tensors it passed in), recording every
    module-level cache; fail where a cache key or value holds a data pointer, or holds a
    tensor or weight object (kept alive and keyed by identity) outside the scratch caches."""
    mods = modules if modules is not None else _modules()
    recorders = []
    for mod in mods:
        for name, v in list(vars(mod).items()):
            if callable(v) and hasattr(v, "cache_info") and getattr(v, "__module__", None) == mod.__name__:
                rec = _Recorder(v)
                setattr(mod, name, rec)
                recorders.append((mod, name, rec))
    try:
        used = run()
    finally:
        for mod, name, rec in recorders:
            setattr(mod, name, rec.fn)
    pointers = set()
    for t in used:
        t = t.data if isinstance(t, PQ2Weight) else t
        pointers.add(t.data_ptr())
    fails = []
    for mod, name, rec in recorders:
        for a, kw, r in rec.seen:
            for hit in _addresses((a, kw, r), pointers):
                fails.append(f"{mod.__name__}.{name}: cache entry holds an address {hit}: it goes stale "
                             "when that memory is freed and reused (key launch plans by shape and dtype)")
            if any(isinstance(v, (torch.Tensor, PQ2Weight)) for v in (*a, *dict(kw).values())):
                fails.append(f"{mod.__name__}.{name}: cached by a tensor or weight argument (identity key)")
    for modname, name, obj in module_caches(mods):
        if callable(obj):
            continue
        for hit in _addresses(obj, pointers, name):
            fails.append(f"{modname}.{hit}: a module-level cache holds an address")
        if name not in SCRATCH.get(modname, ()) and any(True for _ in _tensors(obj)):
            fails.append(f"{modname}.{name}: a module-level cache holds tensors but is not declared in "
                         "graphs.SCRATCH (say whether it is scratch, and test it)")
    return fails


# --- stale-cache checks (CPU and GPU) ----------------------------------------------------
def _at(w, buf: torch.Tensor):
    """A new weight object like w whose data lives in `buf` (the same address each time)."""
    if isinstance(w, torch.Tensor):
        return buf[: w.numel() * w.element_size()].view(w.dtype).view(w.shape)
    data = buf[: w.nbytes]
    data = data.view(w.n, -1) if w.layout == "raw" else data
    return PQ2Weight(data, w.n, w.k, w.layout, checked=True)


def _nbytes(w) -> int:
    return w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes


def _flat(w) -> torch.Tensor:
    return (w if isinstance(w, torch.Tensor) else w.data).reshape(-1).view(torch.uint8)


def check_reused_address(f, xa, wa, xb, wb) -> list[str]:
    """f(x, w) -> y. Weight A then a different weight B (shape or layout may differ, the byte
    count may not) at the SAME address, as when the caching allocator hands a freed block to the
    next allocation; activations likewise. The call on B must give B's answer, bit for bit."""
    if _nbytes(wa) != _nbytes(wb):
        raise ValueError("check_reused_address: A and B must have the same byte count")
    buf = torch.empty(_nbytes(wa), dtype=torch.uint8, device=xa.device)
    xbuf = torch.empty(max(xa.numel(), xb.numel()), dtype=xa.dtype, device=xa.device)
    buf.copy_(_flat(wa))
    xbuf[: xa.numel()].copy_(xa.reshape(-1))
    f(xbuf[: xa.numel()].view(xa.shape), _at(wa, buf))
    # "free" A, "allocate" B at the same address
    buf.copy_(_flat(wb))
    xbuf[: xb.numel()].copy_(xb.reshape(-1))
    got = f(xbuf[: xb.numel()].view(xb.shape), _at(wb, buf))
    want = f(xb.clone(), wb)
    if not same_bits(got, want):
        return [f"weight B at the address weight A had: result differs from B's own answer in "
                f"{ndiff(got, want)} of {want.numel()} elements (a cache keyed by address went stale)"]
    return []


def check_inplace_update(f, x, w, x_new, w_new) -> list[str]:
    """The same weight object and activations, changed in place between calls: the second call
    must see the new bytes (nothing derived from them may be cached on the object)."""
    fails = []
    call = Call("inplace", x, w, lambda: f(x, w), f)
    f(x, w)
    fresh = []   # kept alive: a freed copy's address, reused by the next copy, could hit a stale cache too
    for name, apply in mutations(call, x_new, w_new):
        apply()
        got = f(x, w)
        fresh.append((x.clone(), _copy(w)))
        want = f(*fresh[-1])
        if not same_bits(got, want):
            fails.append(f"after changing {name} in place: result differs from a fresh call in "
                         f"{ndiff(got, want)} of {want.numel()} elements")
    return fails


def check_scratch_poison(f, x, w, modules=None) -> list[str]:
    """Declared scratch buffers and split-K partials filled with NaN must not change the result."""
    from kernels import splitk
    y1 = f(x, w)
    n = poison_scratch(modules)
    with splitk.poisoned() as handed:
        y2 = f(x, w)
    if not same_bits(y1, y2):
        return [f"result changed after filling {n} scratch buffer(s) and {len(handed)} split-K partials "
                "buffer(s) with NaN: a kernel reads scratch it did not write in the same call"]
    return []


def _copy(w):
    if isinstance(w, torch.Tensor):
        return w.clone()
    return PQ2Weight(w.data.clone(), w.n, w.k, w.layout, checked=True)




# --- CUDA graphs -------------------------------------------------------------------------
def capture(fn: Callable[[], torch.Tensor], *, warmup: int = 2, before: Callable[[], None] | None = None,
            stream: torch.cuda.Stream | None = None):
    """(graph, static output). Warm-up runs on a side stream first (compiles the kernels), as
    torch's capture rules ask. `before()` is captured ahead of fn (a rendezvous, say). Split-K
    partials are captured NaN-filled, so every replay proves they are written before read.
    `stream`: capture on it instead of torch's one default capture stream."""
    from kernels import splitk
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with splitk.poisoned(), torch.cuda.graph(g, stream=stream):
        if before is not None:
            before()
        y = fn()
    torch.cuda.synchronize()
    return g, y


def check_graph_mutation(call: Call, x_new, w_new) -> list[str]:
    """Capture, then change the inputs in place (x, then the weight's scales and codes), fill
    the output with NaN, replay, and require the eager answer on the new inputs bit for bit
    and a change from the previous output."""
    fails = []
    g, y = capture(call.fn)
    poison_scratch()
    y.fill_(float("nan"))
    g.replay()
    want = call.eager(call.x, call.w)
    if not same_bits(y, want):
        fails.append(f"replay on the captured inputs differs from eager in {ndiff(y, want)} elements")
    prev = y.clone()
    for name, apply in mutations(call, x_new, w_new):
        apply()
        poison_scratch()
        y.fill_(float("nan"))
        g.replay()
        want = call.eager(call.x, call.w)
        torch.cuda.synchronize()
        if bool(torch.isnan(y).any()) and not bool(torch.isnan(want).any()):
            fails.append(f"{name} changed: replay left NaN in {int(torch.isnan(y).sum())} output elements "
                         "(outputs were filled with NaN: not every output was written)")
        elif not same_bits(y, want):
            fails.append(f"{name} changed: replay differs from eager on the new inputs in "
                         f"{ndiff(y, want)} of {y.numel()} elements (a host-side value or stale buffer "
                         "was baked into the graph)")
        if same_bits(y, prev):
            fails.append(f"{name} changed: replay output did not change (the graph ignores {name})")
        prev = y.clone()
    del g
    return fails


def check_graph_replays(a: Call, b: Call, *, rounds: int = 16, concurrent: bool = False,
                        own_capture_streams: bool = False) -> list[str]:
    """Replay graphs of a and b many times; every replay must give identical bytes.

    Interleaved: a, then b, then an eager call of a on a third stream, in order. Concurrent:
    a and b on two streams with no order between them (serving overlaps graphs of different
    batches), each graph starting with a rendezvous (pq2verify.overlap), so their kernels are
    released together on every replay, busy GPU or idle; then eager calls of a and b on two
    streams, released together the same way. A round where the rendezvous did not meet is a
    failure of the check itself: the overlap it relies on did not happen. Both graphs are
    captured on one stream unless `own_capture_streams` (for a path whose library keeps a
    workspace per capture stream: registry.Path.capture_stream_workspace)."""
    from .overlap import Rendezvous
    meet = Rendezvous(2) if concurrent else None
    streams = (torch.cuda.Stream(), torch.cuda.Stream()) if own_capture_streams else (None, None)
    ga, ya = capture(a.fn, before=meet.meet if meet else None, stream=streams[0])
    gb, yb = capture(b.fn, before=meet.meet if meet else None, stream=streams[1])
    if meet is not None:   # capture does not run the graph: only replays and eager calls meet
        meet.state.zero_()
    ref_a, ref_b = a.eager(a.x, a.w), b.eager(b.x, b.w)
    cur = torch.cuda.current_stream()
    s1, s2, s3 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    fails = []
    for r in range(rounds):
        ya.fill_(float("nan"))
        yb.fill_(float("nan"))
        for s in (s1, s2, s3):
            s.wait_stream(cur)
        with torch.cuda.stream(s1):
            ga.replay()
        if not concurrent:
            s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            gb.replay()
        if concurrent:
            with torch.cuda.stream(s1):
                meet.meet()
                ea = a.eager(a.x, a.w)
            with torch.cuda.stream(s2):
                meet.meet()
                eb = b.eager(b.x, b.w)
        else:
            s3.wait_stream(s2)
            with torch.cuda.stream(s3):
                ea = a.eager(a.x, a.w)     # eager work between replays, on a third stream
        for s in (s1, s2, s3):
            cur.wait_stream(s)
        torch.cuda.synchronize()
        if not same_bits(ya, ref_a):
            fails.append(f"round {r}: replay of {a.label} differs from eager in {ndiff(ya, ref_a)} elements")
        if not same_bits(yb, ref_b):
            fails.append(f"round {r}: replay of {b.label} differs from eager in {ndiff(yb, ref_b)} elements")
        if not same_bits(ea, ref_a):
            fails.append(f"round {r}: eager {a.label} on a side stream differs from its first result "
                         f"in {ndiff(ea, ref_a)} elements")
        if concurrent and not same_bits(eb, ref_b):
            fails.append(f"round {r}: eager {b.label} on a side stream differs from its first result "
                         f"in {ndiff(eb, ref_b)} elements")
        if concurrent and meet.met() != 4 * (r + 1):
            fails.append(f"round {r}: forced overlap did not happen ({meet.met()} of {4 * (r + 1)} arrivals "
                         "met their partner): the concurrency check proved nothing")
        if fails:
            break
    del ga, gb
    return fails
