"""Graph-mutation and stale-cache safety of every registry path and of pq2_matmul through each
kernel set (pq2verify.graphs). The CUDA-graph part needs a GPU (marker gpu: skipped on the CPU
with a reason); the stale-cache part runs everywhere. The last tests show that deliberately
broken kernels (a launch plan keyed by a data pointer, a memoizing kernel, a kernel that reads
scratch it did not write) fail these checks."""
import importlib
import inspect
import types

import pytest
import torch

from kernels.format import PQ2Weight
from pq2verify import graphs, registry, tiles
from pq2verify.bits import same_bits

pytestmark = pytest.mark.graph

# Small shapes on the interpreter; on the GPU shapes large enough for split-K and many tiles.
CPU = {"pq2": (64, 256), "dense": (96, 256)}
# A second weight with the same byte count but another shape: N/2 x 2K.
CPU_B = {"pq2": (32, 512), "dense": (48, 512)}
GPU = {"pq2": (2048, 4096), "dense": (96, 5120)}
GPU_MS = (1, 4, 16, 17, 64)
PATHS = [p.name for p in registry.PATHS]


def _m(p) -> int:
    return 17 if p.m_min > 16 else min(2, p.m_max or 2) if p.m_min <= 2 else p.m_min


def _planted_m(p) -> int:
    return max(p.m_min, 4) if p.serves(max(p.m_min, 4)) else p.m_min


def split_shapes(p, m: int, interpret: bool, shapes) -> list:
    """The (N, K) of `shapes` where the path's chooser splits K (config SPLIT > 1) at M, for the
    interpreter or the GPU, smallest first. Derived from the configs, so a path that starts to
    split is covered by the split-K tests without editing a list."""
    mod = importlib.import_module(p.module)
    if not hasattr(mod, "config"):
        return []
    return sorted(((n, k) for n, k in shapes if mod.config(n, k, m, interpret).get("SPLIT", 1) > 1),
                  key=lambda s: s[0] * s[1])


def split_shape(p, m: int, interpret: bool, prefer=None):
    """`prefer` if the path splits there, else the smallest shape of the config grid where it
    does; None where the path has no split-K."""
    found = split_shapes(p, m, interpret, [prefer] if prefer else []) or split_shapes(p, m, interpret, tiles.grid(p.weight))
    return found[0] if found else None


def _uses_partials(p) -> bool:
    return "splitk.partials(" in inspect.getsource(importlib.import_module(p.module))


# Shapes where the split-K paths split on the interpreter (the scratch-poison test) and the
# split-K paths on the GPU at the planted test's shape.
SCRATCH_SHAPE = {p.name: s for p in registry.PATHS if (s := split_shape(p, _m(p), True))}
SPLIT_PATHS = tuple(p.name for p in registry.PATHS if split_shape(p, _planted_m(p), False, GPU[p.weight]) == GPU[p.weight])


def test_every_path_that_takes_partials_is_in_the_split_tests():
    """A kernel that takes split-K partials (splitk.partials) splits at a shape the interpreter
    runs (the scratch-poison test) and at the planted-race test's GPU shape, so neither test
    passes it by never splitting."""
    users = [p.name for p in registry.PATHS if _uses_partials(p)]
    assert {"single", "small_mma", "small_gemm", "gemv"} <= set(users), users
    assert set(users) <= set(SCRATCH_SHAPE), f"no interpreter shape splits: {set(users) - set(SCRATCH_SHAPE)}"
    assert set(users) <= set(SPLIT_PATHS), f"no split at the GPU shape {GPU['pq2']}: {set(users) - set(SPLIT_PATHS)}"


def _layouts(p):
    return [layout for layout in p.layouts]


def _dev(device):
    return "cuda" if device == "cuda" else "cpu"


# --- stale caches: CPU and GPU -----------------------------------------------------------
@pytest.mark.parametrize("name", PATHS)
def test_reused_address_gives_the_new_answer(name, device):
    """Free a weight, put a different one at the same address (same shape; another shape with
    the same byte count; another layout), call again: the new weight's answer, bit for bit."""
    p = registry.get(name)
    dev, m = _dev(device), _m(p)
    f = graphs.kernel_fn(p)
    n, k = CPU[p.weight]
    for la in _layouts(p):
        xa, wa = graphs.make_inputs(p, m, n, k, layout=la, seed=10, device=dev)
        xb, wb = graphs.make_inputs(p, m, n, k, layout=la, seed=20, device=dev)
        assert not graphs.check_reused_address(f, xa, wa, xb, wb), f"{name} {la}, same shape"
    nb, kb = CPU_B[p.weight]
    lb = p.layouts[-1]
    xb, wb = graphs.make_inputs(p, m, nb, kb, layout=lb, seed=30, device=dev)
    xa, wa = graphs.make_inputs(p, m, n, k, layout=p.layouts[0], seed=10, device=dev)
    fails = graphs.check_reused_address(f, xa, wa, xb, wb)
    assert not fails, f"{name}: {p.layouts[0]} {n}x{k} then {lb} {nb}x{kb} at one address: {fails}"


@pytest.mark.parametrize("name", PATHS)
def test_inplace_update_is_seen(name, device):
    """The same weight object and x changed in place (x, scales, codes): each call sees it."""
    p = registry.get(name)
    dev, m = _dev(device), _m(p)
    n, k = CPU[p.weight]
    x, w = graphs.make_inputs(p, m, n, k, layout=p.layouts[-1], seed=1, device=dev)
    x2, w2 = graphs.make_inputs(p, m, n, k, layout=p.layouts[-1], seed=2, device=dev)
    fails = graphs.check_inplace_update(graphs.kernel_fn(p), x, w, x2, w2)
    assert not fails, f"{name}: {fails}"


@pytest.mark.parametrize("name", PATHS)
def test_scratch_is_written_before_it_is_read(name, device):
    """Split-K partials handed out NaN-filled change nothing."""
    from kernels import splitk
    p = registry.get(name)
    n, k = SCRATCH_SHAPE.get(name, CPU[p.weight])
    x, w = graphs.make_inputs(p, _m(p), n, k, seed=3, device=_dev(device))
    f = graphs.kernel_fn(p)
    if name in SCRATCH_SHAPE and device != "cuda":
        with splitk.poisoned() as handed:
            f(x, w)
        assert handed, f"{name} did not split at {n}x{k}: pick a split-K shape"
    fails = graphs.check_scratch_poison(f, x, w)
    assert not fails, f"{name}: {fails}"


def test_partials_are_never_shared_between_calls(device):
    """Each call takes its own partials from the caching allocator: two live buffers of the
    same size are distinct, and no kernel module keeps a tensor between calls."""
    from kernels import splitk
    dev = _dev(device)
    a, b = splitk.partials(dev, 4096), splitk.partials(dev, 4096)
    assert a.data_ptr() != b.data_ptr()
    # a declared scratch cache is keyed by stream (tests/test_wgmma_plan.py races it for certain)
    assert set(graphs.SCRATCH) == set(graphs.PER_STREAM), "a declared scratch buffer shared by every stream"


@pytest.mark.parametrize("kset", registry.KERNEL_SETS)
def test_matmul_reused_address(kset, device):
    """pq2_matmul through each kernel set (every M range), weight reused at one address."""
    dev = _dev(device)
    f = graphs.matmul_call(kset, None, None).eager
    p = registry.get("native")
    for m in (1, 2, 17):
        xa, wa = graphs.make_inputs(p, m, 64, 256, seed=10 + m, device=dev)
        xb, wb = graphs.make_inputs(p, m, 64, 256, layout="raw", seed=20 + m, device=dev)
        # raw and prepared weights of one shape have the same byte count
        assert not graphs.check_reused_address(f, xa, wa, xb, wb), f"pq2_matmul[{kset}] M={m}"


@pytest.mark.parametrize("name", PATHS)
def test_emulation_caches_follow_the_weight(name):
    """kernels.emulation (pq2_matmul's CPU backend without the interpreter) caches decoded
    weights on the PQ2Weight: an in-place update or a new weight at the same address must
    still give the new answer."""
    from kernels.emulation import emulate
    p = registry.get(name)
    n, k = CPU[p.weight]

    def f(x, w):
        return emulate(name, x, w)

    x, w = graphs.make_inputs(p, _m(p), n, k, layout=p.layouts[-1], seed=1)
    x2, w2 = graphs.make_inputs(p, _m(p), n, k, layout=p.layouts[-1], seed=2)
    assert not graphs.check_inplace_update(f, x, w, x2, w2), name
    assert not graphs.check_reused_address(f, x, w, x2, w2), name


def test_cache_keys_hold_no_addresses(device):
    """Every module-level cache of the launchers and the dispatch (lru_cache'd configs,
    workspaces, trace counters) is keyed by shapes and dtypes, never by a data pointer."""
    dev = _dev(device)

    def run():
        used = []
        for p in registry.PATHS:
            for layout in _layouts(p):
                n, k = CPU[p.weight]
                x, w = graphs.make_inputs(p, _m(p), n, k, layout=layout, seed=4, device=dev)
                y = graphs.kernel_fn(p)(x, w)
                used += [x, w, y]
        return used

    assert not graphs.check_cache_keys(run)


def test_weight_views_follow_the_data():
    """PQ2Weight caches typed views of its allocation: replacing the data drops them (and the
    validation verdict), so a kernel never reads the old allocation through a stale view."""
    _, w = graphs.make_inputs("single", 1, 8, 128, seed=5)
    _, w2 = graphs.make_inputs("single", 1, 8, 128, seed=6)
    old = w.scales_f16.data_ptr(), w.codes_i32.data_ptr()
    assert w.checked
    w.data = w2.data.clone()
    assert (w.scales_f16.data_ptr(), w.codes_i32.data_ptr()) != old
    assert w.scales_f16.data_ptr() == w.data.data_ptr() and not w.checked


def test_every_kernel_module_is_inspected_for_caches(monkeypatch, device):
    """The cache checks look at every registry path's module and every kernels module: a
    module-level tensor cache planted in gemv (missing from the old hand-written list) is seen
    and refused. The call runs on the suite's device (CPU tensors cannot reach a compiled kernel)."""
    names = graphs.cache_modules()
    assert {p.module for p in registry.PATHS} <= set(names), names
    assert {"kernels.common", "kernels.prepare", "kernels.splitk", "kernels.gemv"} <= set(names)
    from kernels import gemv
    dev = _dev(device)
    monkeypatch.setattr(gemv, "_workspace", {(dev, 8): torch.zeros(8, device=dev)}, raising=False)
    found = {(m, n) for m, n, _ in graphs.module_caches()}
    assert ("kernels.gemv", "_workspace") in found
    n, k = CPU["pq2"]
    x, w = graphs.make_inputs("gemv", 1, n, k, seed=7, device=dev)
    fails = graphs.check_cache_keys(lambda: [x, w, gemv.run(x, w)])
    assert any("kernels.gemv._workspace" in f and "not declared" in f for f in fails), fails


def test_cache_inventory_is_classified():
    """A new module-level tensor cache in a launcher must be declared (scratch or not) here."""
    names = {(m, n) for m, n, obj in graphs.module_caches() if not callable(obj)
             and any(True for _ in graphs._tensors(obj))}
    declared = {(m, n) for m, ns in graphs.SCRATCH.items() for n in ns}
    assert names <= declared, f"undeclared tensor caches: {sorted(names - declared)}"


# --- CUDA graphs -------------------------------------------------------------------------
def _gpu_cases():
    for p in registry.PATHS:
        for m in GPU_MS:
            if not p.serves(m):
                continue
            for layout in _layouts(p):
                yield pytest.param(p.name, m, layout, id=f"{p.name}-m{m}-{layout}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,m,layout", list(_gpu_cases()))
def test_graph_replay_sees_mutated_inputs(name, m, layout):
    p = registry.get(name)
    n, k = GPU[p.weight]
    x, w = graphs.make_inputs(p, m, n, k, layout=layout, seed=1, device="cuda")
    x2, w2 = graphs.make_inputs(p, m, n, k, layout=layout, seed=2, device="cuda")
    fails = graphs.check_graph_mutation(graphs.path_call(p, x, w), x2, w2)
    assert not fails, f"{name} M={m} {layout}: {fails}"


@pytest.mark.gpu
@pytest.mark.parametrize("kset", registry.KERNEL_SETS)
@pytest.mark.parametrize("m", (1, 4, 17, 64))
def test_graph_matmul_sees_mutated_inputs(kset, m):
    n, k = GPU["pq2"]
    x, w = graphs.make_inputs("native", m, n, k, seed=1, device="cuda")
    x2, w2 = graphs.make_inputs("native", m, n, k, seed=2, device="cuda")
    fails = graphs.check_graph_mutation(graphs.matmul_call(kset, x, w), x2, w2)
    assert not fails, f"pq2_matmul[{kset}] M={m}: {fails}"


@pytest.mark.gpu
@pytest.mark.parametrize("concurrent", (False, True), ids=("interleaved", "concurrent"))
@pytest.mark.parametrize("name", PATHS)
def test_graph_replays_identical(name, concurrent):
    """Two graphs of the same path and shape (so they share any cached workspace) on separate
    inputs, replayed many times across streams with eager calls between: identical bytes."""
    p = registry.get(name)
    n, k = GPU[p.weight]
    m = max(p.m_min, 4) if p.serves(max(p.m_min, 4)) else p.m_min
    a = graphs.path_call(p, *graphs.make_inputs(p, m, n, k, seed=1, device="cuda"))
    b = graphs.path_call(p, *graphs.make_inputs(p, m, n, k, seed=2, device="cuda"))
    fails = graphs.check_graph_replays(a, b, rounds=32, concurrent=concurrent,
                                       own_capture_streams=bool(p.capture_stream_workspace))
    assert not fails, f"{name} M={m}: {fails[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", [p.name for p in registry.PATHS if p.capture_stream_workspace])
def test_declared_capture_stream_workspace_is_real(name):
    """A path excused from sharing a capture stream must really race when it does: otherwise
    the declaration (registry.Path.capture_stream_workspace) is stale and must go."""
    p = registry.get(name)
    n, k = GPU[p.weight]
    m = max(p.m_min, 4) if p.serves(max(p.m_min, 4)) else p.m_min
    a = graphs.path_call(p, *graphs.make_inputs(p, m, n, k, seed=1, device="cuda"))
    b = graphs.path_call(p, *graphs.make_inputs(p, m, n, k, seed=2, device="cuda"))
    fails = graphs.check_graph_replays(a, b, rounds=8, concurrent=True)
    assert any("differs" in f for f in fails), (
        f"{name}: graphs captured on one stream replayed concurrently without a race; "
        f"drop its capture_stream_workspace declaration ({p.capture_stream_workspace})")


@pytest.mark.gpu
def test_rendezvous_meets_only_with_a_partner():
    """The forced overlap proves itself: two parties on two streams meet; one alone times out
    and is not counted as met."""
    from pq2verify.overlap import Rendezvous
    r = Rendezvous(2, max_spin=1 << 12)
    r.meet()                      # alone on the current stream: times out
    torch.cuda.synchronize()
    assert (r.arrivals(), r.met()) == (1, 0)
    r = Rendezvous(2)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        with torch.cuda.stream(s):
            r.meet()
    torch.cuda.synchronize()
    assert (r.arrivals(), r.met()) == (2, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SPLIT_PATHS)
def test_planted_shared_partials_are_caught_every_time(name, monkeypatch):
    """The race of issue 12, planted: one partials buffer per size shared by every call (the
    old small_mma.workspace). The concurrent replay check must catch it in 10 of 10 tries on
    an idle GPU, because the rendezvous makes the two graphs overlap."""
    from kernels import splitk
    shared, calls = {}, []

    def planted(device, numel):
        calls.append(numel)
        return shared.setdefault((str(device), numel), torch.empty(numel, dtype=torch.float32, device=device))

    monkeypatch.setattr(splitk, "partials", planted)
    p = registry.get(name)
    n, k = GPU[p.weight]
    m = _planted_m(p)
    caught = 0
    for t in range(10):
        a = graphs.path_call(p, *graphs.make_inputs(p, m, n, k, seed=1 + 2 * t, device="cuda"))
        b = graphs.path_call(p, *graphs.make_inputs(p, m, n, k, seed=2 + 2 * t, device="cuda"))
        fails = graphs.check_graph_replays(a, b, rounds=8, concurrent=True)
        assert not any("overlap did not happen" in f for f in fails), fails
        caught += bool(fails)
    assert calls, f"{name} did not split at {n}x{k}: the planted buffer was never used"
    assert caught == 10, f"{name}: the planted shared partials were caught in {caught} of 10 tries"


RERUNS = 100


def _bonsai_split_cases():
    """(path, N, K, M) per split-K path: the two smallest Bonsai-27B shapes where its GPU
    chooser splits K at the planted test's M (from the configs, like SPLIT_PATHS)."""
    from pq2verify import cases
    for name in SPLIT_PATHS:
        p = registry.get(name)
        m = _planted_m(p)
        for n, k in split_shapes(p, m, False, [(n, k) for _, n, k in cases.SHAPES["bonsai27b"][p.weight]])[:2]:
            yield pytest.param(name, n, k, m, id=f"{name}-{n}x{k}-m{m}")


def test_bonsai_split_cases_cover_every_split_path():
    """Each split-K path splits on at least one Bonsai-27B shape, so the 100-rerun test below
    exercises its in-kernel reduction at real sizes."""
    assert {c.values[0] for c in _bonsai_split_cases()} == set(SPLIT_PATHS)


@pytest.mark.gpu
@pytest.mark.parametrize("name,n,k,m", list(_bonsai_split_cases()))
def test_split_k_is_deterministic_over_100_reruns(name, n, k, m):
    """Split-K summed in a fixed order: 100 eager calls and 100 replays of a captured call give
    the first call's bytes (an order that followed the programs' arrival would differ)."""
    p = registry.get(name)
    x, w = graphs.make_inputs(p, m, n, k, seed=11, device="cuda")
    f = graphs.kernel_fn(p)
    first = f(x, w).clone()
    differ = [i for i in range(RERUNS) if not same_bits(f(x, w), first)]
    graph, out = graphs.capture(graphs.path_call(p, x, w).fn)     # partials captured NaN-filled
    replays = []
    for i in range(RERUNS):
        graph.replay()
        if not same_bits(out, first):
            replays.append(i)
    assert not differ and not replays, (
        f"{name} {n}x{k} M={m}: eager reruns {differ[:5]} and graph replays {replays[:5]} of {RERUNS} differ from "
        f"the first call; reproduce: pytest --device cuda tests/test_graphs.py -k \"100_reruns and {name}-{n}x{k}\"")


@pytest.mark.gpu
def test_graph_reused_address_by_the_caching_allocator():
    """The allocator's own reuse: free a weight, allocate one of the same size, get the same
    block, call again; for each path."""
    for p in registry.PATHS:
        n, k = GPU[p.weight]
        m = _m(p)
        f = graphs.kernel_fn(p)
        xa, wa = graphs.make_inputs(p, m, n, k, seed=1, device="cuda")
        xb, wb = graphs.make_inputs(p, m, n, k, seed=2, device="cuda")
        flat_b = graphs._flat(wb).clone()
        buf = torch.empty_like(graphs._flat(wa)).copy_(graphs._flat(wa))
        ptr = buf.data_ptr()
        f(xa, graphs._at(wa, buf))
        del buf
        buf = torch.empty_like(flat_b)     # the caching allocator hands back the freed block
        if buf.data_ptr() != ptr:
            # the allocator chose another block: put B at A's address by hand instead of skipping
            assert not graphs.check_reused_address(f, xa, wa, xb, wb), f"{p.name}: stale result at a reused address"
            continue
        buf.copy_(flat_b)
        got = f(xb, graphs._at(wb, buf))
        assert graphs.same_bits(got, f(xb, wb)), f"{p.name}: stale result at a reused address"


# --- the checks catch deliberately broken kernels ------------------------------------------
def _broken_plan_module():
    """A launcher that caches a 'launch plan' (here: the weight object it saw first) keyed by
    the weight's data pointer alone, as an earlier launch-plan cache did."""
    mod = types.ModuleType("broken_kernel")
    mod._PLANS = {}
    run = registry.get("native").kernel()

    def kernel(x, w, out=None):
        plan = mod._PLANS.setdefault(w.data.data_ptr(), PQ2Weight(w.data.clone(), w.n, w.k, w.layout))
        return run(x, plan, out=out)

    return mod, kernel


def test_pointer_keyed_plan_fails_the_staleness_checks(device):
    dev = _dev(device)
    mod, kernel = _broken_plan_module()
    xa, wa = graphs.make_inputs("native", 2, 64, 256, seed=1, device=dev)
    xb, wb = graphs.make_inputs("native", 2, 64, 256, seed=2, device=dev)
    assert graphs.check_reused_address(kernel, xa, wa, xb, wb), "stale plan at a reused address passed"
    mod._PLANS.clear()
    assert graphs.check_inplace_update(kernel, xa, wa, xb, wb), "stale plan after an in-place change passed"
    mod._PLANS.clear()
    fails = graphs.check_cache_keys(lambda: [xa, wa, kernel(xa, wa)], modules=[mod])
    assert any("holds an address" in f for f in fails), fails


def test_scratch_reader_fails_the_poison_check(device):
    """A kernel that accumulates into a cached buffer it never clears."""
    dev = _dev(device)
    mod = types.ModuleType("kernels.broken_scratch")
    mod._ACC = {}
    run = registry.get("native").kernel()

    def kernel(x, w, out=None):
        y = run(x, w)
        acc = mod._ACC.setdefault(tuple(y.shape), torch.zeros(y.shape, dtype=torch.float32, device=y.device))
        acc.mul_(0.0).add_(y.float())          # 0 * NaN is NaN: reads what it did not write
        return acc.to(y.dtype)

    x, w = graphs.make_inputs("native", 2, 64, 256, seed=1, device=dev)
    graphs.SCRATCH[mod.__name__] = ("_ACC",)
    try:
        assert graphs.check_scratch_poison(kernel, x, w, modules=[mod]), "reading poisoned scratch passed"
    finally:
        del graphs.SCRATCH[mod.__name__]


@pytest.mark.gpu
def test_memoizing_kernel_fails_the_graph_check():
    """A kernel that returns a cached result for inputs it has seen (keyed by pointers) bakes
    the old answer into the graph: the mutation check must fail it."""
    memo = {}
    run = registry.get("native").kernel()

    def kernel(x, w, out=None):
        key = (x.data_ptr(), w.data.data_ptr())
        if key not in memo:
            memo[key] = run(x, w)
        return out.copy_(memo[key]) if out is not None else memo[key].clone()

    x, w = graphs.make_inputs("native", 4, 1024, 1024, seed=1, device="cuda")
    x2, w2 = graphs.make_inputs("native", 4, 1024, 1024, seed=2, device="cuda")
    fails = graphs.check_graph_mutation(graphs.path_call("native", x, w, kernel=kernel), x2, w2)
    assert fails, "a memoizing kernel passed the graph mutation check"
