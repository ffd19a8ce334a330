"""The judging code of the graph checks, the forced overlap, the golden capture and the gsm8k run
folder at their edges (pq2verify.graphs, pq2verify.overlap, pq2verify.golden.capturing,
pq2verify.gsm8k.runs), on the CPU. Pinned, because the rest of the CPU suite let a fault planted
there pass:

- graphs: the verdicts of check_graph_mutation and check_graph_replays (a correct graph passes;
  baked-in activations, outputs left unwritten, a replay off from eager and a rendezvous that
  never met fail with the right message), the order of their streams, 16 rounds on torch's one
  capture stream by default; which module objects are caches, how deep the address scan reaches
  (arguments and dict keys), the NaN / -1 scratch poison, the raw weight's scale and code views;
- overlap: the rendezvous' count of met arrivals and the producer's copy length (both on the
  Triton interpreter), the Hold's witness, the producer's four copy slots, the warm-ups launching
  what the real calls launch, the copies word_views accepts;
- golden capture: the reference a golden is judged against (quantized for an integer path, dense
  for a floating one), refusal of a wrong answer unless forced, a capture of nothing into new
  nested folders, what _upgrade fills in and what it must leave alone (a kept path's ISA key);
- gsm8k runs: the run folder's key (SHA-256 of sorted settings, 12 digits: resume), question ids,
  append's answer, the damage message's list, read_json's check against its default, a switch
  value holding '='.

The CUDA graph, the streams and the rendezvous are stand-ins here (a replay reruns the captured
function into its static output). Each expected value is planted by hand (a kernel that bakes in
its activations, one that writes only row 0, a hash computed here), never taken from the function
under test."""
import contextlib
import functools
import hashlib
import json
import types

import pytest
import torch

from pq2verify import graphs, overlap

HERE = ".venv/bin/python -m pytest -q -p no:randomly 'tests/test_judging_capture_resume_edges.py::{}'"


def repro(name: str) -> str:
    return "reproduce: " + HERE.format(name)


# --- graphs: a CUDA graph, streams and a rendezvous as stand-ins ---------------------------
class _Graph:
    """A replay reruns the captured function, which writes the static output in place, after the
    captured `before` (the rendezvous), as a CUDA graph does."""

    def __init__(self, fn, before, log):
        self.fn, self.before, self.log, self.replays = fn, before, log, 0

    def replay(self):
        if self.before is not None:
            self.before()
        self.fn()
        self.replays += 1
        self.log.append(("replay", _Cuda.current.name))


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


class _Cuda:
    """torch.cuda's streams, graphs and synchronize, recorded in `log` instead of run."""
    current = None

    def __init__(self, monkeypatch):
        self.log, self.graphs, self.capture_streams, self.made = [], [], [], 0
        _Cuda.current = _Stream("default", self.log)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        monkeypatch.setattr(torch.cuda, "Stream", self._stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Cuda.current)
        monkeypatch.setattr(torch.cuda, "stream", self._use)
        monkeypatch.setattr(graphs, "capture", self._capture)
        monkeypatch.setattr(graphs, "poison_scratch", lambda modules=None: 0)

    def _stream(self, *a, **k):
        self.made += 1
        return _Stream(f"s{self.made}", self.log)

    @contextlib.contextmanager
    def _use(self, s):
        before, _Cuda.current = _Cuda.current, s
        try:
            yield
        finally:
            _Cuda.current = before

    def _capture(self, fn, *, warmup=2, before=None, stream=None):
        self.capture_streams.append(stream)
        y = fn()                     # the static output a replay rewrites
        g = _Graph(fn, before, self.log)
        self.graphs.append(g)
        return g, y


class _Meeting:
    """overlap.Rendezvous' stand-in: every arrival meets its partner unless `lonely`."""

    def __init__(self, parties=2, lonely=False):
        self.parties, self.lonely, self.arrived = parties, lonely, 0
        self.state = torch.zeros(2, dtype=torch.int32)

    def meet(self):
        self.arrived += 1

    def met(self):
        return 0 if self.lonely else self.arrived


def _mm(x, w, out):
    return out.copy_(x @ w.t())


def _call(label, x, w, kernel=_mm):
    """A graphs.Call on CPU tensors: fn writes a static output, eager a fresh one."""
    out = torch.empty(x.shape[0], w.shape[0])
    return graphs.Call(label, x, w, lambda: kernel(x, w, out), lambda xx, ww: kernel(xx, ww, torch.empty_like(out)))


def _inputs(seed):
    """Small integers: every product and sum is exact in FP32, so any fold gives the same bits."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-3, 4, (4, 8), generator=g).float(), torch.randint(-3, 4, (6, 8), generator=g).float())


def test_a_correct_graph_passes_the_mutation_check(monkeypatch):
    """A kernel that reads x and w at every replay: no failure (a check that reported one here
    would fail every path on the GPU)."""
    _Cuda(monkeypatch)
    x, w = _inputs(1)
    x2, w2 = _inputs(2)
    fails = graphs.check_graph_mutation(_call("ok", x, w), x2, w2)
    assert fails == [], repro("test_a_correct_graph_passes_the_mutation_check") + f": {fails}"


def test_a_graph_that_baked_in_its_activations_fails_on_x_only(monkeypatch):
    """The graph reads the activations once, on the host, at capture (eager reads them live):
    after x changes the replay gives the old answer (it differs from eager and did not change);
    after the weight changes it differs again but did change. Exactly those three failures."""
    _Cuda(monkeypatch)
    x, w = _inputs(1)
    x2, w2 = _inputs(2)
    frozen, w0, static = x.clone(), w.clone(), torch.empty(4, 6)    # x and w are changed in place
    call = graphs.Call("baked", x, w, lambda: _mm(frozen, w, static), lambda xx, ww: _mm(xx, ww, torch.empty(4, 6)))
    fails = graphs.check_graph_mutation(call, x2, w2)
    on_x = int((x2 @ w0.t() != frozen @ w0.t()).sum())
    on_w = int((x2 @ w2.t() != frozen @ w2.t()).sum())
    assert on_x > 0 and on_w > 0
    where = repro("test_a_graph_that_baked_in_its_activations_fails_on_x_only") + f": {fails}"
    assert len(fails) == 3, where
    assert fails[0].startswith(f"x changed: replay differs from eager on the new inputs in {on_x} of 24"), where
    assert fails[1] == "x changed: replay output did not change (the graph ignores x)", where
    assert fails[2].startswith(f"weight changed: replay differs from eager on the new inputs in {on_w} of 24"), where


def test_an_output_left_unwritten_is_named_as_such(monkeypatch):
    """A kernel that writes row 0 only: the 3 x 6 other outputs keep the NaN the check filled
    in; the first replay differs from eager there, and after each change the failure says NaN
    was left (not a plain difference)."""
    _Cuda(monkeypatch)
    x, w = _inputs(1)
    x2, w2 = _inputs(2)
    static = torch.full((4, 6), float("nan"))

    def row0():
        static[0] = x[0] @ w.t()
        return static
    call = graphs.Call("row0", x, w, row0, lambda xx, ww: _mm(xx, ww, torch.empty(4, 6)))
    fails = graphs.check_graph_mutation(call, x2, w2)
    where = repro("test_an_output_left_unwritten_is_named_as_such") + f": {fails}"
    assert fails[0] == "replay on the captured inputs differs from eager in 18 elements", where
    assert [f.split(":")[0] for f in fails[1:]] == ["x changed", "weight changed"], where
    for f in fails[1:]:
        assert "replay left NaN in 18 output elements" in f, where


def test_a_nan_the_eager_answer_has_too_is_not_blamed_on_the_replay(monkeypatch):
    """New activations with a NaN in row 2: eager's row 2 is NaN as well, and a replay that
    computes the same bits passes."""
    _Cuda(monkeypatch)
    x, w = _inputs(1)
    x2, w2 = _inputs(2)
    x2[2, 3] = float("nan")
    fails = graphs.check_graph_mutation(_call("nan", x, w), x2, w2)
    assert fails == [], repro("test_a_nan_the_eager_answer_has_too_is_not_blamed_on_the_replay") + f": {fails}"


def _replays(monkeypatch, *, concurrent, lonely=False, b_kernel=_mm, **kw):
    cuda = _Cuda(monkeypatch)
    meetings = []
    monkeypatch.setattr(overlap, "Rendezvous", lambda parties=2: meetings.append(_Meeting(parties, lonely)) or meetings[-1])
    xa, wa = _inputs(1)
    xb, wb = _inputs(2)
    fails = graphs.check_graph_replays(_call("a", xa, wa), _call("b", xb, wb, b_kernel), concurrent=concurrent, **kw)
    return fails, cuda, meetings


def test_interleaved_replays_run_in_order_on_one_capture_stream(monkeypatch):
    """Interleaved: both graphs captured on torch's one capture stream (stream=None: a library
    that keeps a workspace per capture stream is then shared, as in serving), 16 rounds by
    default, and in each round b's stream waits for a's and the eager call's stream for b's."""
    fails, cuda, meetings = _replays(monkeypatch, concurrent=False)
    where = repro("test_interleaved_replays_run_in_order_on_one_capture_stream")
    assert fails == [] and meetings == [], where + f": {fails}"
    assert cuda.capture_streams == [None, None], where + f": captured on {cuda.capture_streams}"
    assert [g.replays for g in cuda.graphs] == [16, 16], where
    first = cuda.log[:cuda.log.index(("replay", "s2")) + 1]
    assert ("wait", "s2", "s1") in first and first.index(("replay", "s1")) < first.index(("wait", "s2", "s1")), (
        where + f": round 0 did {first}")
    assert ("wait", "s3", "s2") in cuda.log, where


def test_concurrent_replays_are_not_ordered_and_must_meet(monkeypatch):
    """Concurrent: no stream waits for the other's replay, each round's four arrivals meet; a
    rendezvous that never met fails the check itself (the overlap it relies on did not happen)."""
    fails, cuda, meetings = _replays(monkeypatch, concurrent=True)
    where = repro("test_concurrent_replays_are_not_ordered_and_must_meet")
    assert fails == [] and len(meetings) == 1 and meetings[0].arrived == 4 * 16, where + f": {fails}"
    assert ("wait", "s2", "s1") not in cuda.log, where + ": b's replay was ordered after a's"
    fails, _, _ = _replays(monkeypatch, concurrent=True, lonely=True)
    assert len(fails) == 1 and fails[0].startswith("round 0: forced overlap did not happen (0 of 4 arrivals"), (
        where + f": {fails}")


@pytest.mark.parametrize("concurrent", [False, True], ids=["interleaved", "concurrent"])
def test_a_replay_that_differs_from_eager_fails_at_its_first_round(monkeypatch, concurrent):
    """b's graph adds 1 to every output of its replays (eager calls are right): round 0 fails
    for b's replay alone, and the check stops there."""
    calls = []

    def off_by_one(x, w, out):
        calls.append(out)
        _mm(x, w, out)
        return out.add_(1) if len(calls) > 2 else out      # capture and eager reference are right
    fails, _, _ = _replays(monkeypatch, concurrent=concurrent, b_kernel=off_by_one)
    where = repro("test_a_replay_that_differs_from_eager_fails_at_its_first_round") + f": {fails}"
    assert fails[:1] == ["round 0: replay of b differs from eager in 24 elements"], where
    assert all(f.startswith("round 0: ") for f in fails), where


# --- graphs: the cache inventory and the address scan -------------------------------------
def _module(name, source):
    """A module made from source, so its functions' __module__ is its own name."""
    mod = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), vars(mod))
    return mod


def test_only_a_module_s_own_cached_functions_are_its_caches():
    """A module's own lru_cache'd function is its cache; one it imported from elsewhere is the
    other module's (inspected there), and a plain function or a tuple is none."""
    mod = _module("pq2_fake_caches", "import functools\n"
                  "@functools.lru_cache\ndef plan(n):\n    return n\n"
                  "def helper(n):\n    return n\nTABLE = {}\nFIXED = (1, 2)\n")
    mod.borrowed = functools.lru_cache(lambda n: n)      # __module__ is this test module's
    found = sorted(n for _, n, _ in graphs.module_caches([mod]))
    assert found == ["TABLE", "plan"], repro("test_only_a_module_s_own_cached_functions_are_its_caches") + f": {found}"


def test_a_cached_function_keyed_by_a_pointer_nested_in_its_argument_fails():
    """The module's own lru_cache'd `plan` is called with ((tag, x.data_ptr()),): the pointer
    lies four containers deep in what the check scans (entry, args, argument, pair); it is found
    and named. A plan keyed by the shape alone passes."""
    mod = _module("pq2_fake_plan", "import functools\n"
                  "@functools.lru_cache\ndef plan(key):\n    return len(key)\n")
    x = torch.zeros(3, 5)
    fails = graphs.check_cache_keys(lambda: (mod.plan((("plan", x.data_ptr()),)), [x])[1], modules=[mod])
    where = repro("test_a_cached_function_keyed_by_a_pointer_nested_in_its_argument_fails") + f": {fails}"
    assert len(fails) == 1 and fails[0].startswith("pq2_fake_plan.plan: cache entry holds an address"), where
    assert f"={x.data_ptr():#x}" in fails[0], where
    assert mod.plan.__module__ == "pq2_fake_plan" and hasattr(mod.plan, "cache_info")   # restored
    assert graphs.check_cache_keys(lambda: (mod.plan((("plan", 3, 5),)), [x])[1], modules=[mod]) == [], where


def test_the_address_scan_reaches_into_keys_and_stops_at_bools():
    """A dict key holding a pointer three containers deep is found; an int at or above 2^44 is
    address-like, one just below is not; True is never an address even when 1 is a pointer."""
    ptr = 0x1234
    found = list(graphs._addresses({(1, (2, (3, ptr))): 0}, {ptr}, "C"))
    assert found == [f"C[key {(1, (2, (3, ptr)))!r}][1][1][1]={ptr:#x}"], (
        repro("test_the_address_scan_reaches_into_keys_and_stops_at_bools") + f": {found}")
    assert list(graphs._addresses([1 << 44, (1 << 44) - 1], set(), "L")) == [f"L[0]={1 << 44:#x}"]
    assert list(graphs._addresses([True, 1], {1}, "B")) == ["B[1]=0x1"]


def test_scratch_is_poisoned_nan_for_floats_and_minus_one_for_integers(monkeypatch):
    mod = types.ModuleType("pq2_fake_scratch")
    mod._ws = {"f": torch.zeros(3), "i": torch.zeros(3, dtype=torch.int32), "other": 5}
    monkeypatch.setitem(graphs.SCRATCH, "pq2_fake_scratch", ("_ws",))
    assert graphs.poison_scratch([mod]) == 2
    assert torch.isnan(mod._ws["f"]).all() and mod._ws["i"].tolist() == [-1, -1, -1], (
        repro("test_scratch_is_poisoned_nan_for_floats_and_minus_one_for_integers") + f": {mod._ws}")


def test_raw_weight_parts_are_each_block_s_scale_then_its_codes():
    """A raw PQ2 weight is N x G blocks of 34 bytes: 2 bytes of fp16 scale, then 32 of codes.
    Planted: every byte holds its offset within its block."""
    from kernels.format import PQ2Weight
    n, k = 2, 256
    data = torch.arange(34, dtype=torch.uint8).repeat(n * k // 128).view(n, -1).clone()
    parts = graphs.weight_parts(PQ2Weight(data, n, k, "raw", checked=True))
    where = repro("test_raw_weight_parts_are_each_block_s_scale_then_its_codes")
    assert tuple(parts["scales"].shape) == (2, 2, 2) and tuple(parts["codes"].shape) == (2, 2, 32), where
    assert (parts["scales"] == torch.tensor([0, 1], dtype=torch.uint8)).all(), where
    assert (parts["codes"] == torch.arange(2, 34, dtype=torch.uint8)).all(), where
    parts["codes"].fill_(0xAA)                           # views: a write lands in the weight
    assert int((data == 0xAA).sum()) == n * 2 * 32, where


# --- overlap: the rendezvous' witness, the Hold's witness, the producer's copies -----------
def test_a_rendezvous_counts_only_arrivals_that_found_their_partner(cpu_only):
    """On the interpreter the parties arrive one after the other: a party of one meets at once,
    every time; of two, the first times out (after max_spin polls: not met) and the second finds
    it (met). The counter only grows."""
    state = torch.zeros(2, dtype=torch.int32)
    for _ in range(2):
        overlap._rendezvous_kernel[(1,)](state, 1, MAX_SPIN=8, num_warps=1)
    assert state.tolist() == [2, 2], repro("test_a_rendezvous_counts_only_arrivals_that_found_their_partner") + f": {state}"
    state = torch.zeros(2, dtype=torch.int32)
    overlap._rendezvous_kernel[(1,)](state, 2, MAX_SPIN=8, num_warps=1)
    assert state.tolist() == [1, 0], f"a lone party counted as met: {state.tolist()}"
    overlap._rendezvous_kernel[(1,)](state, 2, MAX_SPIN=8, num_warps=1)
    assert state.tolist() == [2, 1], f"the partner's arrival did not meet: {state.tolist()}"


_copy_words = overlap._copy_words


@pytest.fixture
def copy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, N: tl.constexpr, BLOCK: tl.constexpr):
        _copy_words(src, dst, N, BLOCK)
    return copy


def test_the_producer_copies_exactly_n_words(copy_kernel, cpu_only):
    """Five words in blocks of four: the fifth is copied, the sixth is not (the destination's
    tail keeps its sentinel)."""
    src, dst = torch.arange(1, 9, dtype=torch.int32), torch.full((8,), -7, dtype=torch.int32)
    copy_kernel[(1,)](src, dst, 5, BLOCK=4)
    assert dst.tolist() == [1, 2, 3, 4, 5, -7, -7, -7], repro("test_the_producer_copies_exactly_n_words") + f": {dst}"


class _Launcher:
    """A Triton kernel's stand-in: kernel[grid](*args, **kw) appends (name, args, kw) to log."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *a, **kw: self.log.append((self.name, a, kw))


@pytest.fixture
def hold(monkeypatch):
    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: object())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(overlap, "_rendezvous_kernel", _Launcher("gate", log))
    monkeypatch.setattr(overlap, "_hold_kernel", _Launcher("producer", log))
    monkeypatch.setattr(overlap, "_probe_kernel", _Launcher("probe", log))
    h = overlap.Hold(device="cpu")
    warm_probe = next(e[2] for e in log if e[0] == "probe")      # the constructor's warm-up
    log.clear()
    return h, log, warm_probe


def test_the_warm_ups_launch_what_the_real_calls_launch(monkeypatch):
    """A Rendezvous compiles its kernel in the constructor, never inside a graph capture: the
    warm-up is a party of one (it returns at once) with meet()'s constants and warps, so meet()
    finds that binary. The Hold's probe is warmed as the dependent launch probe() makes."""
    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(overlap, "_rendezvous_kernel", _Launcher("rendezvous", log))
    r = overlap.Rendezvous(2, device="cpu", max_spin=64)
    r.meet()
    (_, warm_args, warm_kw), (_, args, kw) = log
    where = repro("test_the_warm_ups_launch_what_the_real_calls_launch") + f": {log}"
    assert warm_args[1] == 1 and args[1] == 2 and args[0] is r.state, where
    assert warm_kw == kw == {"MAX_SPIN": 64, "num_warps": 1}, where


def test_the_probe_is_warmed_as_it_is_launched(hold):
    h, log, warm_probe = hold
    h.probe()
    assert log[-1][0] == "probe" and log[-1][2] == warm_probe, (
        repro("test_the_probe_is_warmed_as_it_is_launched") + f": {log[-1][2]} after {warm_probe}")


def test_the_hold_s_witness_judges_each_stretch_of_rounds_anew(hold):
    """Every round is two arrivals at the gate (arm and release): one round with both met is
    released; two more rounds with three arrivals met are not; no round since is trivially
    released. done is the producer's flag 1, held_ns its end minus its start."""
    h, _, _ = hold
    h.arm()
    h._gate.state[1] = 2
    h._state.copy_(torch.tensor([1, 1000, 201000, 77]))
    w = h.witness()
    where = repro("test_the_hold_s_witness_judges_each_stretch_of_rounds_anew") + f": {w}"
    assert w == dict(released=True, done=True, t0=1000, held_ns=200000, spins=77), where
    h.arm()
    h.arm()
    h._gate.state[1] = 5
    w = h.witness()
    assert w["released"] is False and w["done"] is False, where + f" then {w}"
    assert h.witness()["released"] is True, where


def test_the_producer_gets_four_copy_slots_and_the_probe_is_a_dependent_launch(hold):
    """One copy given: the producer's arguments are that copy, then three empty slots (a dummy
    pair, 0 words), the state and the hold; the probe is launched with launch_pdl=True."""
    h, log, _ = hold
    src, dst = torch.arange(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    h.arm([(src, dst)])
    h.probe()
    producer = [e for e in log if e[0] == "producer"][-1][1]
    where = repro("test_the_producer_gets_four_copy_slots_and_the_probe_is_a_dependent_launch")
    assert len(producer) == 4 * 3 + 2 and producer[-1] == h.hold_ns, where + f": {len(producer)} arguments"
    assert producer[2] == 4 and [producer[i] for i in (5, 8, 11)] == [0, 0, 0], where
    assert log[-1][0] == "probe" and log[-1][2].get("launch_pdl") is True, where + f": {log[-1]}"


def test_word_views_take_four_copies_of_whole_words_on_one_device():
    """Four copies are the producer's slots (a fifth is refused); a copy must match in dtype,
    shape and device; a tensor must be contiguous and a whole number of 32-bit words."""
    four = [(torch.zeros(2, dtype=torch.int16), torch.ones(2, dtype=torch.int16))] * 4
    assert len(overlap.word_views(four)) == 4
    where = repro("test_word_views_take_four_copies_of_whole_words_on_one_device")
    with pytest.raises(ValueError, match="at most four"):
        overlap.word_views(four + four[:1])
    a = torch.zeros(4, dtype=torch.float32)
    for dst in (torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2), torch.zeros(4, device="meta")):
        with pytest.raises(ValueError, match="Hold: copy"):
            overlap.word_views([(a, dst)])
            pytest.fail(where + f": {dst.dtype} {tuple(dst.shape)} on {dst.device} accepted")
    with pytest.raises(ValueError, match="whole 32-bit words"):
        overlap.word_views([(torch.zeros(3, dtype=torch.int16), torch.zeros(3, dtype=torch.int16))])
    strided = torch.zeros(4, 2, dtype=torch.int32)[:, 0]
    with pytest.raises(ValueError, match="contiguous"):
        overlap.word_views([(strided, strided.clone())])


# --- gsm8k runs: the run folder's key, its records, its resume ------------------------------
REC = {"tokens": [1], "topk": [[[1, -0.1]]], "text": "t", "correct": False, "invalid": True, "strict_invalid": True}


def test_a_run_folder_is_keyed_by_its_settings_in_any_order(tmp_path):
    """The key is the first 12 hex digits of the SHA-256 of the settings as sorted JSON
    (computed here): the same settings written in another order resume the same folder, and
    an earlier run's folder name stays valid. --out may name a folder whose parents are new."""
    from pq2verify.gsm8k import runs
    cfg = {"model": "m", "digits": 2, "spec": {"set": "tuned", "paths": {}}}
    want = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]
    a = runs.RunDir(tmp_path / "new" / "out", "a", cfg)
    b = runs.RunDir(tmp_path / "new" / "out", "a", dict(reversed(list(cfg.items()))))
    assert a.path.name == f"a-{want}" and b.path == a.path, (
        repro("test_a_run_folder_is_keyed_by_its_settings_in_any_order") + f": {a.path.name}, {b.path.name}, {want}")


@pytest.mark.parametrize("qid, ok", [(0, True), (7, True), (-1, False), (True, False), ("3", False)])
def test_question_ids_are_the_non_negative_integers(qid, ok, tmp_path, capsys):
    """Question 0 is a question; -1, a bool and a string are not (set aside as damaged)."""
    from pq2verify.gsm8k import runs
    rd = runs.RunDir(tmp_path, "a", {"k": 1})
    rd.file.write_text(json.dumps({**REC, "id": qid}) + "\n")
    again = runs.RunDir(tmp_path, "a", {"k": 1})
    assert (list(again.done) == [qid]) == ok, repro("test_question_ids_are_the_non_negative_integers") + f": {again.done}"
    err = capsys.readouterr().err
    assert ("is not a question id" in err) == (not ok), err


def test_append_writes_a_question_once_and_says_whether_it_did(tmp_path):
    from pq2verify.gsm8k import runs
    rd = runs.RunDir(tmp_path, "a", {"k": 1})
    assert rd.append({**REC, "id": 3}) is True
    assert rd.append({**REC, "id": 3, "text": "other"}) is False, repro("test_append_writes_a_question_once_and_says_whether_it_did")
    assert [json.loads(x)["text"] for x in rd.file.read_text().splitlines()] == ["t"]


def test_the_damage_message_lists_five_lines_then_dots(tmp_path, capsys):
    """Five damaged lines are all listed; six list the first five and end in ' ...'. A torn last
    line is numbered after the last whole line."""
    from pq2verify.gsm8k import runs
    where = repro("test_the_damage_message_lists_five_lines_then_dots")
    for bad in (5, 6):
        rd = runs.RunDir(tmp_path / str(bad), "a", {"k": 1})
        rd.file.write_text("".join(f"junk {i}\n" for i in range(bad)) + json.dumps({**REC, "id": 0}) + "\n")
        assert list(runs.RunDir(tmp_path / str(bad), "a", {"k": 1}).done) == [0]
        err = capsys.readouterr().err
        listed = [f"line {i}: not JSON" for i in range(1, bad + 1)]
        assert f"{bad} damaged line(s) set aside" in err, where + f": {err}"
        assert ("; ".join(listed[:5]) + (" ...)" if bad > 5 else ")")) in err, where + f": {err}"
        assert "line 6:" not in err, where + f": {err}"
    rd = runs.RunDir(tmp_path / "torn", "a", {"k": 1})
    rd.file.write_text(json.dumps({**REC, "id": 0}) + "\n" + json.dumps({**REC, "id": 1}) + "\n" + '{"id": 2, "to')
    assert sorted(runs.RunDir(tmp_path / "torn", "a", {"k": 1}).done) == [0, 1]
    err = capsys.readouterr().err
    assert "(line 3: the last line was cut short" in err, where + f": {err}"


def test_a_switch_value_holding_an_equals_sign_is_one_bad_value():
    """'single=on=off' splits at its first '=' only: the path single with the value 'on=off',
    refused by name as not on or off (not a failed unpacking)."""
    from pq2verify.gsm8k import runs
    with pytest.raises(ValueError, match=r"single='on=off', expected on or off"):
        runs.parse_spec("tuned,single=on=off")
        pytest.fail(repro("test_a_switch_value_holding_an_equals_sign_is_one_bad_value"))


def test_read_json_checks_only_what_the_default_declares(tmp_path, capsys):
    """No default: any JSON is returned as it is (a list too). A dict default: its keys with a
    non-None value must be there with that type; a None value declares nothing."""
    from pq2verify.gsm8k import runs
    rd = runs.RunDir(tmp_path, "a", {"k": 1})
    rd.write_json("plain.json", [1, 2])
    where = repro("test_read_json_checks_only_what_the_default_declares")
    assert rd.read_json("plain.json") == [1, 2], where
    rd.write_json("led.json", {"batches": {"0": 1}, "note": 5})
    assert rd.read_json("led.json", {"batches": {}, "note": None}) == {"batches": {"0": 1}, "note": 5}, where
    assert rd.read_json("led.json", {"batches": [], "note": None}) == {"batches": [], "note": None}, where
    assert (rd.path / "led.json.damaged").exists() and not (rd.path / "led.json").exists(), where
    assert "damaged, set aside" in capsys.readouterr().err


# --- golden capture: the reference a golden is judged against, where it is written ----------
def _case(path, m, n=32, k=128):
    from pq2verify import checks
    return checks._seeded(checks.Case(path, "t", n, k, m, "bf16", "dense" if path in ("cublas", "small_gemm") else "prepared"))


@pytest.mark.parametrize("path, m, which", [("int_gemv", 1, "quantized"), ("native", 1, "dense"), ("cublas", 1, "dense")])
def test_a_golden_is_judged_against_the_path_s_own_reference(path, m, which):
    """An integer path's golden against the quantized FP64 reference, a floating path's (PQ2
    weight or dense) against the dense one: an all-zero output is refused naming it."""
    from pq2verify import golden
    c = _case(path, m)
    _, meta = golden.weight_meta(c)
    x, w = golden.make_x(c), golden.weight_for(c, golden.make_weight(meta), "cpu")
    y = torch.zeros(c.m, c.n, dtype=torch.bfloat16)
    why = golden.numerics(c, x, w, y)
    assert why is not None and why.startswith(f"relative RMS vs {which} FP64 reference 1 > "), (
        repro("test_a_golden_is_judged_against_the_path_s_own_reference") + f": {why}")


def _refuse_all(monkeypatch):
    from pq2verify.golden import capturing

    def refused(*a, **k):
        raise RuntimeError("planted: this kernel cannot run")
    monkeypatch.setattr(capturing, "run_case", refused)


def test_a_capture_of_nothing_into_a_new_nested_folder_records_the_refusals(tmp_path, monkeypatch):
    """Every case refused, into a folder whose parents do not exist yet: the folder is made, the
    manifest lists no case and the refusals with their reason, and no output file is left."""
    from pq2verify import golden
    _refuse_all(monkeypatch)
    c = _case("int_gemv", 1)
    d = tmp_path / "a" / "b" / "interpreter"
    man = golden.capture(d, [c], "cpu", log=lambda s: None)
    where = repro("test_a_capture_of_nothing_into_a_new_nested_folder_records_the_refusals") + f": {man.get('refused')}"
    assert man["cases"] == [] and man["refused"] == [{"id": c.id, "why": "raised RuntimeError: planted: this kernel cannot run"}], where
    assert sorted(p.name for p in d.iterdir()) == [golden.INPUTS, golden.MANIFEST], where
    assert "int_gemv" not in man["paths"] and "int_gemv.safetensors" not in man["files"], where


def test_a_wrong_answer_is_refused_unless_forced(tmp_path, monkeypatch):
    """A kernel that answers zeros, deterministically: refused by default (its golden would
    freeze the bug), naming the reference; captured only with force=True."""
    from pq2verify import golden
    from pq2verify.golden import capturing
    monkeypatch.setattr(capturing, "run_case",        # capture hands it the resolved case
                        lambda rc, x, w, device, **k: torch.zeros(rc.case.m, rc.case.n, dtype=torch.bfloat16))
    c = _case("int_gemv", 1)
    man = golden.capture(tmp_path / "default", [c], "cpu", log=lambda s: None)
    where = repro("test_a_wrong_answer_is_refused_unless_forced") + f": {man['refused']}"
    assert man["cases"] == [] and len(man["refused"]) == 1, where
    assert man["refused"][0]["why"].startswith("relative RMS vs quantized FP64 reference 1 > "), where
    man = golden.capture(tmp_path / "forced", [c], "cpu", force=True, log=lambda s: None)
    assert [e["id"] for e in man["cases"]] == [c.id] and man["refused"] == [], where


def test_upgrading_a_manifest_fills_only_what_format_1_lacked():
    """_upgrade runs on every capture merged into an existing folder. A case without an x hash
    gets the hash of its stored x (SHA-256 of the bytes, computed here); one whose x is not
    stored stays without; a recorded hash is kept as it is. A path without a bits class gets the
    code's (an integer path is exact, no ISA); a path that has one keeps it, its ISA key
    included (reset, it would be compared by the bound instead of bit for bit); a path the
    registry no longer knows is left alone."""
    from pq2verify.golden import capturing
    x = torch.arange(6, dtype=torch.bfloat16).view(2, 3)
    kept = {"bits": "isa-dependent", "bits_reason": "kept", "isa": "host-key-1"}
    man = {"format": 1, "backend_key": "interpreter",
           "cases": [{"x": "x:a"}, {"x": "x:b"}, {"x": "x:a", "x_sha256": "recorded"}],
           "paths": {"native": dict(kept), "int_gemv": {}, "gone_path": {}}}
    capturing._upgrade(man, {"x:a": x})
    where = repro("test_upgrading_a_manifest_fills_only_what_format_1_lacked") + f": {man}"
    want = hashlib.sha256(x.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
    assert [e.get("x_sha256") for e in man["cases"]] == [want, None, "recorded"], where
    assert man["paths"]["native"] == kept and man["paths"]["gone_path"] == {}, where
    assert man["paths"]["int_gemv"]["bits"] == "exact" and man["paths"]["int_gemv"]["isa"] is None, where
    assert man["format"] == 2, where
