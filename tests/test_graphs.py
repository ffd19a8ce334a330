"""Graph-mutation and stale-cache safety of every registry path and of pq2_matmul through each
kernel set (pq2verify.graphs). The CUDA-graph part needs a GPU (marker gpu: skipped on the CPU
with a reason); the stale-cache part runs everywhere. The last tests show that deliberately
broken kernels (a launch plan keyed by a data pointer, a memoizing kernel, a kernel that reads
scratch it did not write) fail these checks."""
import types

import pytest
import torch

from pq2verify import graphs, registry
from pq2verify.weights import PQ2Weight

pytestmark = pytest.mark.graph

# Small shapes on the interpreter; on the GPU shapes large enough for split-K and many tiles.
CPU = {"pq2": (64, 256), "dense": (96, 256)}
# A second weight with the same byte count but another shape: N/2 x 2K.
CPU_B = {"pq2": (32, 512), "dense": (48, 512)}
# Shapes where the split-K paths use their workspace on the interpreter.
SCRATCH_SHAPE = {"single": (16, 4096), "small_mma": (32, 1024), "small_gemm": (96, 256)}
GPU = {"pq2": (2048, 4096), "dense": (96, 5120)}
GPU_MS = (1, 4, 16, 17, 64)
PATHS = [p.name for p in registry.PATHS]


def _m(p) -> int:
    return 17 if p.m_min > 16 else min(2, p.m_max or 2) if p.m_min <= 2 else p.m_min


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
    """Split-K workspaces filled with NaN between calls change nothing."""
    p = registry.get(name)
    n, k = SCRATCH_SHAPE.get(name, CPU[p.weight])
    x, w = graphs.make_inputs(p, _m(p), n, k, seed=3, device=_dev(device))
    f = graphs.kernel_fn(p)
    f(x, w)
    if name in SCRATCH_SHAPE and device != "cuda":
        assert graphs.poison_scratch() > 0, f"{name} used no workspace at {n}x{k}: pick a split-K shape"
    fails = graphs.check_scratch_poison(f, x, w)
    assert not fails, f"{name}: {fails}"


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
    """pq2verify.emulation (pq2_matmul's CPU backend without the interpreter) caches decoded
    weights on the PQ2Weight: an in-place update or a new weight at the same address must
    still give the new answer."""
    from pq2verify.emulation import emulate
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
    fails = graphs.check_graph_replays(a, b, rounds=32, concurrent=concurrent)
    assert not fails, f"{name} M={m}: {fails[:3]}"


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
