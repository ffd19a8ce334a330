"""mmq_wgmma's launch plan (kernels/mmq_wgmma.py): what it keeps between eager calls is either
derived from the weight's bytes and dropped with them, or one stream's scratch that a CUDA graph
capture never touches. The graph staleness checks of tests/test_graphs.py run on the path as on
every other; these tests hold the plan's own keys.

GPU: `pytest --device cuda -p no:randomly tests/test_wgmma_plan.py`."""
import pytest
import torch

from pq2verify import graphs, overlap

REPRO = "pytest --device cuda -p no:randomly tests/test_wgmma_plan.py"


def _mods():
    from kernels import mmq_wgmma, prepare
    return mmq_wgmma, prepare


@pytest.mark.parametrize("m", [1, 3, 17, 64])
def test_scales_by_group_are_the_plain_scales_transposed(m, device):
    """quantize_q8(by_group=True) writes the same scales at [g, row] of a buffer whose rows are
    padded to 16 bytes; codes and sums are those of the plain layout (interpreter or GPU)."""
    _, prepare = _mods()
    dev = "cuda" if device == "cuda" else "cpu"
    x, _ = graphs.make_inputs("mmq_wgmma", m, 64, 384, seed=5, device=dev)
    q0, s0, t0 = prepare.quantize_q8(x, order="plane")
    q1, s1, t1 = prepare.quantize_q8(x, order="plane", by_group=True)
    assert s1.shape == (3, m) and s1.stride() == (-(-m // 4) * 4, 1), (s1.shape, s1.stride())
    assert torch.equal(q0, q1) and torch.equal(t0, t1), f"m={m}: codes or sums differ ({REPRO})"
    assert torch.equal(s0.t().view(torch.int32), s1.view(torch.int32)), f"m={m}: scales differ ({REPRO})"
    bufs = (torch.full_like(q0, -1), torch.full((3, -(-m // 4) * 4), float("nan"), device=dev)[:, :m],
            torch.full_like(t0, -1))
    q2, s2, t2 = prepare.quantize_q8(x, order="plane", by_group=True, out=bufs)
    assert q2 is bufs[0] and s2 is bufs[1] and t2 is bufs[2]
    assert torch.equal(q2, q0) and torch.equal(t2, t0) and torch.equal(s2.view(torch.int32), s1.view(torch.int32))


def test_code_descriptor_follows_the_weight_bytes(device):
    """The code-byte descriptor lives in the weight's cache of what derives from its bytes: the
    same object while the bytes stand, a new one after an in-place write or new data."""
    mmq_wgmma, _ = _mods()
    dev = "cuda" if device == "cuda" else "cpu"
    _, w = graphs.make_inputs("mmq_wgmma", 17, 128, 256, seed=1, device=dev)
    d1 = mmq_wgmma._code_desc(w, 128, 64)
    assert mmq_wgmma._code_desc(w, 128, 64) is d1
    assert d1.base.data_ptr() == w.codes_u8.data_ptr() and list(d1.shape) == [128, 256 // 4]
    w.data[0] ^= 1          # an in-place write: torch's version counter moves
    d2 = mmq_wgmma._code_desc(w, 128, 64)
    assert d2 is not d1
    _, w2 = graphs.make_inputs("mmq_wgmma", 17, 128, 256, seed=2, device=dev)
    w.data = w2.data.clone()
    d3 = mmq_wgmma._code_desc(w, 128, 64)
    assert d3 is not d2 and d3.base.data_ptr() == w.codes_u8.data_ptr()


def test_every_scratch_cache_is_keyed_by_stream():
    """A declared module-level scratch cache names the function that keys it by stream."""
    import importlib
    assert set(graphs.SCRATCH) == set(graphs.PER_STREAM), (graphs.SCRATCH, graphs.PER_STREAM)
    for mod, fn in graphs.PER_STREAM.items():
        assert callable(getattr(importlib.import_module(mod), fn)), f"{mod}.{fn}"


# --- GPU -----------------------------------------------------------------------------------
def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the Gluon kernel runs on sm_90 only")


@pytest.mark.gpu
@needs_hopper
def test_one_workspace_per_stream_and_none_in_a_capture():
    mmq_wgmma, _ = _mods()
    mmq_wgmma._workspace.clear()
    x, w = graphs.make_inputs("mmq_wgmma", 64, 512, 1024, seed=3, device="cuda")
    ref = mmq_wgmma.twin(x, w)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    outs = []
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            outs.append(mmq_wgmma.run(x, w))
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert len(mmq_wgmma._workspace) == 2, list(mmq_wgmma._workspace)
    a, b = (v["q"].data_ptr() for v in mmq_wgmma._workspace.values())
    assert a != b, "two streams share one workspace"
    for y in outs:
        assert torch.equal(y, ref), f"the planned call differs from the twin ({REPRO})"
    before = {k: (v["q"].data_ptr(), len(v["descs"])) for k, v in mmq_wgmma._workspace.items()}
    y = torch.empty_like(ref)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                 # torch's own capture stream: a new stream
        static = mmq_wgmma.run(x, w, out=y)
    after = {k: (v["q"].data_ptr(), len(v["descs"])) for k, v in mmq_wgmma._workspace.items()}
    assert after == before, "the capture used or grew a stream's workspace"
    graphs.poison_scratch()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, ref), f"the captured call read the workspace ({REPRO})"


def _raced(mmq_wgmma, prepare, monkeypatch, shared: bool):
    """Two eager calls on two streams, forced to interleave: stream 1 quantizes x1, then waits at
    a rendezvous, then sleeps ~2 ms before its MMA kernel; stream 2 waits at the same rendezvous,
    then quantizes x2 and runs its MMA in that window. The third party is launched from a third
    stream only once both calls are queued, so host launch latency cannot eat into the window
    (a two-party version missed it once while another process loaded the host). With one
    workspace per stream each output is its own input's; with one shared workspace stream 1's
    MMA reads x2's codes, every time."""
    mmq_wgmma._workspace.clear()
    if shared:
        monkeypatch.setattr(mmq_wgmma, "_slot", lambda device: (0, "one workspace for every stream"))
    x1, w = graphs.make_inputs("mmq_wgmma", 64, 512, 1024, seed=4, device="cuda")
    x2, _ = graphs.make_inputs("mmq_wgmma", 64, 512, 1024, seed=9, device="cuda")
    r1, r2 = mmq_wgmma.twin(x1, w), mmq_wgmma.twin(x2, w)
    mmq_wgmma.run(x1, w)   # compiled and loaded before the race
    torch.cuda._sleep(1)   # and the sleep kernel: CUDA loads a module lazily, which can wait for the
    torch.cuda.synchronize()   # device to drain, i.e. behind a spinning rendezvous
    rv = overlap.Rendezvous(3)
    s1, s2, s3 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    real = prepare.quantize_q8

    def held(x, *a, **kw):
        out = real(x, *a, **kw)
        if torch.cuda.current_stream() == s1:
            rv.meet()
            torch.cuda._sleep(4_000_000)    # ~2 ms at 2 GHz: stream 2's two kernels finish within it
        return out
    monkeypatch.setattr(prepare, "quantize_q8", held)
    with torch.cuda.stream(s1):
        y1 = mmq_wgmma.run(x1, w)
    with torch.cuda.stream(s2):
        rv.meet()
        y2 = mmq_wgmma.run(x2, w)
    with torch.cuda.stream(s3):
        rv.meet()                           # everything is queued: release both
    torch.cuda.synchronize()
    monkeypatch.setattr(prepare, "quantize_q8", real)
    assert rv.met() == 3, "the three parties never met: the overlap was not forced"
    return torch.equal(y1, r1) and torch.equal(y2, r2)


@pytest.mark.gpu
@needs_hopper
def test_streams_race_for_certain_and_the_plan_holds(monkeypatch):
    mmq_wgmma, prepare = _mods()
    for i in range(3):
        assert _raced(mmq_wgmma, prepare, monkeypatch, shared=False), f"repeat {i}: a planned call lost its input ({REPRO})"


@pytest.mark.gpu
@needs_hopper
def test_a_planted_shared_workspace_fails_every_time(monkeypatch):
    mmq_wgmma, prepare = _mods()
    for i in range(3):
        assert not _raced(mmq_wgmma, prepare, monkeypatch, shared=True), (
            f"repeat {i}: one workspace shared by two racing streams gave both right answers ({REPRO})")
    monkeypatch.undo()
    mmq_wgmma._workspace.clear()
