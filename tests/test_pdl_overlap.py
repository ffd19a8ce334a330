"""Programmatic dependent launch, raced for certain on the GPU.

gemv, small_mma and the quantize kernel are launched with PDL: each may start while the kernel
before it on the stream still runs, and must read that kernel's output only after
griddepcontrol.wait (tests/test_pdl_order.py proves the order from the PTX). On a GPU a read
before the wait shows only when the two grids overlap, which on its own depends on timing.
Here the overlap is forced (pq2verify.overlap.Hold):

- the consumer's inputs are first filled with a poison (NaN activation scales, so every output a
  poisoned read produces is NaN, while the eager reference is finite);
- a producer kernel is enqueued behind a gate, then the consumer with launch_pdl=True on the
  same stream, then the gate is opened from another stream: both are queued before either runs,
  so host launch latency (Python, Triton's launcher) cannot eat into the hold;
- the producer's first instruction is griddepcontrol.launch_dependents, so the dependent grid
  may launch at once; it then spins on the global timer for 200 us and only then writes the
  consumer's real inputs (and zeroes its split-K counters, as the quantize kernel does).

Why that is certain: a dependent grid launches once every program of its primary has triggered
(one program here, triggering first); that takes a few microseconds (measured below by a probe
kernel and asserted under a quarter of the hold), and the chosen shapes' consumers (the model's
smallest, under 512 KB of weight codes, asserted) run in microseconds. So a consumer that reads its activations
before griddepcontrol.wait reads them during the 200 us hold, i.e. reads the poison, on every
run; one that waits sees the producer's data and matches the eager reference bit for bit. The
planted kernel is small_mma with its wait taken only when it splits (the plant of
tests/test_pdl_order.py), run at a single-split config: it must give the poisoned output in 10
of 10 repeats, and the real kernels the reference in 10 of 10.

GPU: `pytest --device cuda -p no:randomly tests/test_pdl_overlap.py`. The CPU tests build the
planted module and check the poison on the interpreter.
"""
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pq2verify import graphs, overlap, registry
from pq2verify.bits import ndiff, same_bits

ROOT = Path(__file__).parents[1]
REPEATS = 10
REPRO = "pytest --device cuda -p no:randomly tests/test_pdl_overlap.py"
ANCHOR = "    if PDL:\n        # launched with programmatic dependent launch after this call's quantize kernel"
POISON_Q, POISON_T, POISON_COUNT = 127, 0, 0x3FFF0000
# the GSM8K model's PQ2 shapes (tests/test_pdl_order.py MODEL), smallest weight first: among them
# each path has single-split and split configs (asserted)
SHAPES = sorted({(n, d * k) for n, k in ((960, 640), (576, 640), (3072, 640), (576, 1536)) for d in (4, 1)},
                key=lambda s: (s[0] * s[1], s))
MS = {"gemv": (1,), "small_mma": (2, 16)}


# --- the planted kernel --------------------------------------------------------------------
def planted_source() -> str:
    """kernels/small_mma.py with its griddepcontrol.wait taken only when it splits: a single-split
    launch reads its activations with no wait at all."""
    src = (ROOT / "kernels" / "small_mma.py").read_text()
    assert src.count(ANCHOR) == 1, "the plant's anchor moved in kernels/small_mma.py"
    # the copy is loaded under another module name: it validates as small_mma's table entry
    assert src.count("validate.kernel_out(__name__,") == 1, "small_mma's validation call moved"
    src = src.replace("validate.kernel_out(__name__,", 'validate.kernel_out("kernels.small_mma",')
    return src.replace(ANCHOR, ANCHOR.replace("if PDL:", "if PDL and SPLIT > 1:"))


def load_planted(tmp_path):
    """The planted source as a module of the kernels package (its relative imports resolve to
    the real common, prepare and splitk), compiled for real on the GPU. Not put in sys.modules."""
    import kernels  # noqa: F401  (the package its relative imports name)
    f = tmp_path / "small_mma_waits_when_split.py"
    f.write_text(planted_source())
    spec = importlib.util.spec_from_file_location("kernels.small_mma_waits_when_split", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _split(name: str, n: int, k: int, m: int) -> int:
    mod = importlib.import_module(f"kernels.{name}")
    return mod.config(n, k, m, interpret=False)["SPLIT"]


def cases():
    """(path, N, K, M, split) per path and M: the smallest model shape where the GPU chooser gives
    one split, and the smallest where it splits."""
    out = []
    for name, ms in MS.items():
        for m in ms:
            for single in (True, False):
                hit = [(n, k) for n, k in SHAPES if (_split(name, n, k, m) == 1) == single]
                assert hit, f"{name} M={m}: no model shape with {'one split' if single else 'split-K'}"
                n, k = hit[0]
                out.append((name, n, k, m, _split(name, n, k, m)))
    return out


CASES = cases()


# --- the held quantize: the consumer's inputs written by the held producer -------------------
def _poison_like(q, xs, t):
    """Tensors like the quantize outputs, holding the poison: NaN scales make every output of a
    poisoned read NaN."""
    return (torch.full_like(q, POISON_Q), torch.full_like(xs, float("nan")), torch.full_like(t, POISON_T))


def held_quantize(good, arm, log, pdl_expected=True):
    """A stand-in for kernels.prepare.quantize_q8 inside gemv.run / small_mma.run: returns
    poisoned (q, xs, t) and calls arm(copies) with what the producer must write into them (the
    real quantize's outputs `good`, and zeros for the split-K counters); run() then launches
    its kernel with launch_pdl=True right after."""
    def quantize_q8(x, order="plain", pdl=False, zero=None):
        assert order == "plane" and pdl == pdl_expected, (
            f"the consumer's quantize call: order={order!r} pdl={pdl} (pdl={pdl_expected} expected)")
        q, xs, t = _poison_like(*good)
        copies = [(good[0], q), (good[1], xs), (good[2], t)]
        if zero is not None:
            zero.fill_(POISON_COUNT)
            copies.append((torch.zeros_like(zero), zero))
        log.append(zero is not None)
        arm(copies)
        return q, xs, t
    return quantize_q8


def _inputs(name, n, k, m, seed=5):
    return graphs.make_inputs(registry.get(name), m, n, k, seed=seed, device="cuda")


def _held_runs(monkeypatch, mod, x, w, good, hold, stream):
    """REPEATS overlapped calls of mod.run: per repeat (output, hold witness). One more call goes
    first, not counted (Hold.arm compiles the producer's specialization for these copies before
    its gate; the first round is still no part of what is judged)."""
    from kernels import prepare
    log = []
    monkeypatch.setattr(prepare, "quantize_q8", held_quantize(good, hold.arm, log))
    runs = []
    for _ in range(1 + REPEATS):
        with torch.cuda.stream(stream):
            out = torch.full((x.shape[0], w.n), float("nan"), dtype=x.dtype, device=x.device)
            mod.run(x, w, out=out)
        hold.release()
        torch.cuda.synchronize()
        runs.append((out, hold.witness()))
    monkeypatch.undo()
    assert len(log) == 1 + REPEATS, f"run() called quantize_q8 {len(log)} times in {1 + REPEATS} calls"
    return runs[1:], log


def _why(r, wit, out, ref) -> str:
    return (f"repeat {r}: {ndiff(out, ref)} of {ref.numel()} outputs differ from the eager reference "
            f"(non-finite {int((~torch.isfinite(out.float())).sum())}); gate released {wit['released']}, "
            f"producer done {wit['done']}, held {wit['held_ns'] / 1e3:.1f} us")


def _check_hold(runs, hold, what):
    for r, (_, wit) in enumerate(runs):
        assert wit["released"] and wit["done"], f"{what}, repeat {r}: the gate or the producer failed: {wit}"
        assert wit["held_ns"] >= hold.hold_ns, f"{what}, repeat {r}: the producer held only {wit['held_ns']} ns"


# --- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.graph
def test_the_held_producer_lets_its_dependent_run_first():
    """The forced overlap proves itself: a PDL probe launched behind the held producer reads the
    producer's done flag as 0 before its wait and 1 after it, and starts within a quarter of the
    hold (the margin the docstring's certainty rests on)."""
    hold, stream = overlap.Hold(), torch.cuda.Stream()
    bad = []
    for r in range(REPEATS):
        with torch.cuda.stream(stream):
            hold.arm([])
            seen = hold.probe()
        hold.release()
        torch.cuda.synchronize()
        wit, (before, after, start) = hold.witness(), seen.tolist()
        latency = start - wit["t0"]
        if not (wit["released"] and wit["done"] and before == 0 and after == 1 and latency < hold.hold_ns // 4
                and wit["held_ns"] >= hold.hold_ns):
            bad.append(f"repeat {r}: done before wait {before}, after {after}, probe started {latency / 1e3:.1f} us "
                       f"after the producer (hold {hold.hold_ns / 1e3:.0f} us); {wit}")
    assert not bad, f"the held producer did not overlap its PDL dependent: {bad[:3]}; reproduce: {REPRO} -k held_producer"


@pytest.mark.gpu
@pytest.mark.graph
@pytest.mark.parametrize("name,n,k,m,split", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-m{c[3]}-split{c[4]}" for c in CASES])
def test_real_kernels_wait_for_a_held_producer(name, n, k, m, split, monkeypatch):
    """gemv and small_mma, single-split and split, launched behind the held producer: 10 of 10
    repeats give the eager reference's bits (their split-K counters, poisoned, are zeroed by the
    producer after the hold)."""
    from kernels import prepare
    mod = importlib.import_module(f"kernels.{name}")
    x, w = _inputs(name, n, k, m)
    ref = mod.run(x, w).clone()            # eager, and compiles the consumer outside the hold
    good = prepare.quantize_q8(x, order="plane")
    hold, stream = overlap.Hold(), torch.cuda.Stream()
    torch.cuda.synchronize()
    assert bool(torch.isfinite(ref.float()).all()), f"{name} {n}x{k} M={m}: the eager reference is not finite"
    runs, log = _held_runs(monkeypatch, mod, x, w, good, hold, stream)
    what = f"{name} {n}x{k} M={m} SPLIT={split}"
    assert all(log) == (split > 1), f"{what}: split-K counters passed {log} (SPLIT={split})"
    _check_hold(runs, hold, what)
    bad = [_why(r, wit, out, ref) for r, (out, wit) in enumerate(runs) if not same_bits(out, ref)]
    assert not bad, (f"{what}: {len(bad)} of {REPEATS} overlapped calls differ from the eager call (a read or "
                     f"write before griddepcontrol.wait): {bad[:3]}; reproduce: {REPRO} -k \"real and {name}-{n}x{k}-m{m}\"")


@pytest.mark.gpu
@pytest.mark.graph
def test_quantize_waits_for_a_held_producer():
    """The quantize kernel (pdl=True) behind the held producer, which writes its x (poisoned NaN)
    and then poisons its counters: 10 of 10 give the eager quantize's bits and zeroed counters (a
    read of x, or a zeroing, before the wait would show)."""
    from kernels import prepare
    m, k = 2, 2560
    x_good = graphs.make_inputs(registry.get("small_mma"), m, 576, k, seed=7, device="cuda")[0]
    ref = prepare.quantize_q8(x_good, order="plane")
    # the pdl=True specialization compiled and loaded outside any hold: loading a module while the
    # producer spins at its gate may wait for the device to go idle
    prepare.quantize_q8(x_good.clone(), order="plane", pdl=True, zero=torch.zeros(8, dtype=torch.int32, device="cuda"))
    hold, stream = overlap.Hold(), torch.cuda.Stream()
    torch.cuda.synchronize()
    bad = []
    for r in range(-1, REPEATS):           # round -1 compiles the producer's specialization: not judged
        with torch.cuda.stream(stream):
            x = torch.full_like(x_good, float("nan"))
            count = torch.zeros(8, dtype=torch.int32, device="cuda")
            hold.arm([(x_good, x), (torch.full_like(count, POISON_COUNT), count)])
            got = prepare.quantize_q8(x, order="plane", pdl=True, zero=count)
        hold.release()
        torch.cuda.synchronize()
        wit = hold.witness()
        if r < 0:
            continue
        diff = [f"{nm} {ndiff(a, b)}" for nm, a, b in zip(("q", "scales", "sums"), got, ref) if not same_bits(a, b)]
        if diff or int(count.abs().sum()) or not (wit["released"] and wit["done"] and wit["held_ns"] >= hold.hold_ns):
            bad.append(f"repeat {r}: differing {diff}, counters {count.tolist()}, {wit}")
    assert not bad, f"quantize M={m} K={k}: {bad[:3]}; reproduce: {REPRO} -k quantize"


@pytest.mark.gpu
@pytest.mark.graph
@pytest.mark.parametrize("m", MS["small_mma"])
def test_planted_read_before_the_wait_is_caught_every_time(m, tmp_path, monkeypatch):
    """small_mma waiting only when it splits, at a single-split config (the launch the static
    check's plant fails): behind the held producer, 10 of 10 repeats give the poisoned (NaN)
    output instead of the reference."""
    from kernels import prepare, small_mma
    planted = load_planted(tmp_path)
    n, k = next((n, k) for name, n, k, mm, split in CASES if name == "small_mma" and mm == m and split == 1)
    assert planted.config(n, k, m, interpret=False)["SPLIT"] == 1
    x, w = _inputs("small_mma", n, k, m)
    ref = small_mma.run(x, w).clone()
    planted.run(x, w)                      # compiles the planted kernel outside the hold (racy; ignored)
    good = prepare.quantize_q8(x, order="plane")
    hold, stream = overlap.Hold(), torch.cuda.Stream()
    torch.cuda.synchronize()
    assert bool(torch.isfinite(ref.float()).all()), f"small_mma {n}x{k} M={m}: the eager reference is not finite"
    runs, _ = _held_runs(monkeypatch, planted, x, w, good, hold, stream)
    what = f"planted small_mma {n}x{k} M={m} SPLIT=1"
    _check_hold(runs, hold, what)
    caught = [r for r, (out, _) in enumerate(runs) if not same_bits(out, ref)]
    missed = [_why(r, wit, out, ref) for r, (out, wit) in enumerate(runs) if r not in caught]
    assert len(caught) == REPEATS, (f"{what}: the read before the wait gave the reference in {len(missed)} of "
                                    f"{REPEATS} repeats: {missed[:3]}; reproduce: {REPRO} -k \"planted and {m}\"")
    # every output of a caught repeat is poisoned (NaN), not a near miss
    partial = [_why(r, wit, out, ref) for r, (out, wit) in enumerate(runs) if ndiff(out, ref) != ref.numel()]
    assert not partial, f"{what}: only part of the output came from the poison: {partial[:3]}; reproduce: {REPRO}"


# --- CPU: the construction ------------------------------------------------------------------
def test_planted_variant_is_built(tmp_path, device):
    """The plant changes exactly the wait's condition in small_mma's source; the module loads
    (here on the interpreter) with its kernel and run(); the cases cover single and split."""
    real = (ROOT / "kernels" / "small_mma.py").read_text()
    src = planted_source()
    assert src != real and src.count("if PDL and SPLIT > 1:") == 1
    diff = [(a, b) for a, b in zip(real.splitlines(), src.splitlines()) if a != b]
    assert [d for d in diff if "kernel_out" not in d[0]] == [("    if PDL:", "    if PDL and SPLIT > 1:")], diff
    assert len(diff) == 2, diff            # and the validation call names small_mma's entry
    # the changed condition guards griddepcontrol.wait, not the launch_dependents at the top
    at = src.index("if PDL and SPLIT > 1:")
    assert src.index("tl.extra.cuda.gdc_wait()", at) < src.index("_sums_scales(", at)
    mod = load_planted(tmp_path)
    assert mod.__name__ != "kernels.small_mma" and callable(mod.run)
    assert "SPLIT > 1" in inspect.getsource(mod._small_mma_kernel.fn)
    if device != "cuda":     # it runs as small_mma does (a module name alone once broke it)
        from kernels import small_mma
        x, w = graphs.make_inputs("small_mma", 2, 64, 256, seed=3, device="cpu")
        assert same_bits(mod.run(x, w), small_mma.run(x, w))
    for name in MS:
        assert {c[4] == 1 for c in CASES if c[0] == name} == {True, False}, f"{name}: single and split cases"
    # small consumers: they finish well inside the hold
    assert max(n * k // 4 for _, n, k, _, _ in CASES) <= 512 * 1024, CASES


def test_the_producer_triggers_first_and_writes_last():
    """The producer's first statement lets dependents launch; it spins before the copies; the done
    flag is its last store."""
    body = [ln.strip() for ln in inspect.getsource(overlap._hold_kernel.fn).splitlines()
            if ln.strip() and not ln.strip().startswith(("#", "@", "def ", "MAX_SPIN"))]
    assert body[0] == "tl.extra.cuda.gdc_launch_dependents()", body[:2]
    spin = next(i for i, ln in enumerate(body) if ln.startswith("while"))
    assert spin < min(i for i, ln in enumerate(body) if ln.startswith("_copy_words"))
    assert body[-1].startswith("tl.store(witness_ptr, ")


PTX_SCRIPT = """
import json
from pq2verify import overlap
from pq2verify.sm90.compiler import compile_sm90
k, _ = compile_sm90(overlap._hold_kernel,
    {**{f"s{i}": "*i32" for i in range(4)}, **{f"d{i}": "*i32" for i in range(4)}, "witness_ptr": "*i64"},
    {"n0": 2560, "n1": 20, "n2": 20, "n3": 0, "hold_ns": overlap.HOLD_NS},
    {"MAX_SPIN": overlap.HOLD_MAX_SPIN, "BLOCK": 1024}, 1, 3)
p, _ = compile_sm90(overlap._probe_kernel, {"witness_ptr": "*i64", "seen_ptr": "*i64"}, {}, {}, 1, 3)
print(json.dumps({"hold": k.asm["ptx"], "probe": p.asm["ptx"]}))
"""


def _body(ptx: str) -> str:
    return ptx[ptx.index(".entry"):ptx.index("$L__func_end0")]


def test_the_producer_and_probe_compile_in_order():
    """In their sm_90 PTX (compiled on the CPU, as tests/test_pdl_order.py does): the producer
    triggers before it reads the timer, and its spin loop (a backward branch around a timer
    read) closes before its first store; the probe reads the done flag (volatile) once before
    griddepcontrol.wait and once after."""
    cmd = [sys.executable, "-c", PTX_SCRIPT]
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "0"}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"compiling the producer for sm_90 failed: {r.stderr[-2000:]}"
    ptx = json.loads(r.stdout)
    hold, probe = _body(ptx["hold"]), _body(ptx["probe"])
    first_store = hold.index("st.global")
    assert hold.index("griddepcontrol.launch_dependents") < hold.index("%globaltimer") < first_store
    assert "griddepcontrol.wait" not in hold
    pre = hold[:first_store]
    labels = {m.group(1): m.start() for m in re.finditer(r"^(\$L\w+):", pre, re.M)}
    loops = [b for b in re.finditer(r"bra\s+(\$L\w+);", pre)
             if labels.get(b.group(1), b.start()) < b.start() and "%globaltimer" in pre[labels[b.group(1)]:b.start()]]
    assert loops, "no spin loop on %globaltimer before the producer's first store"
    loads = [m.start() for m in re.finditer(r"ld\.volatile\.global", probe)]
    wait = probe.index("griddepcontrol.wait")
    assert len(loads) == 2 and loads[0] < wait < loads[1], (loads, wait)


INTERPRETER_ONLY = "interpreter test (its configs split and run on CPU tensors); the gpu tests above cover CUDA"


def test_the_poison_reaches_every_output(monkeypatch, device):
    """On the interpreter, small_mma handed the poisoned quantize outputs (counters zeroed, no
    producer) gives NaN in every output, while the real quantize's give finite ones: the poison
    the GPU test relies on is visible in every element."""
    if device == "cuda":
        pytest.skip(INTERPRETER_ONLY)
    from kernels import prepare, small_mma
    x, w = graphs.make_inputs(registry.get("small_mma"), 3, 64, 512, seed=5)
    ref = small_mma.run(x, w)
    real = prepare.quantize_q8

    def poisoned(x_, order="plain", pdl=False, zero=None):
        q, xs, t = _poison_like(*real(x_, order=order))
        if zero is not None:
            zero.zero_()
        return q, xs, t

    monkeypatch.setattr(prepare, "quantize_q8", poisoned)
    out = small_mma.run(x, w)
    assert bool(torch.isfinite(ref.float()).all()) and bool(torch.isnan(out.float()).all()), (
        f"poisoned quantize outputs: {int(torch.isnan(out.float()).sum())} of {out.numel()} outputs NaN; "
        "reproduce: pytest -p no:randomly tests/test_pdl_overlap.py -k poison")


class _CopyAtOnce:
    """Hold's stand-in on the CPU: arm() makes the producer's copies at once, through the same
    word views, or (copy=False) never, as if every read came before the producer's writes."""

    def __init__(self, copy: bool):
        self.copy, self.rounds = copy, 0

    def arm(self, copies):
        for s, d in overlap.word_views(copies):
            if self.copy:
                d.copy_(s)
        self.rounds += 1


@pytest.mark.parametrize("name,m", [("gemv", 1), ("small_mma", 3)])
def test_the_held_quantize_hands_the_consumer_its_inputs(name, m, monkeypatch, device):
    """The GPU test's plumbing on the interpreter: run() handed the held quantize's tensors gives
    the reference's bits when the producer's copies land (split-K counters zeroed by them: the
    interpreter's configs split), and the poison (NaN in every output) when they never do."""
    if device == "cuda":
        pytest.skip(INTERPRETER_ONLY)
    from kernels import prepare
    mod = importlib.import_module(f"kernels.{name}")
    x, w = graphs.make_inputs(registry.get(name), m, 64, 512, seed=5)
    ref = mod.run(x, w)
    assert mod.config(64, 512, m)["SPLIT"] > 1, "the interpreter's config no longer splits: counters untested"
    good = prepare.quantize_q8(x, order="plane")
    for copy in (True, False):
        log, hold = [], _CopyAtOnce(copy)
        monkeypatch.setattr(prepare, "quantize_q8", held_quantize(good, hold.arm, log, pdl_expected=False))
        out = torch.full_like(ref, float("nan"))
        mod.run(x, w, out=out)
        monkeypatch.undo()
        assert log == [True] and hold.rounds == 1, (log, hold.rounds)
        if copy:
            assert same_bits(out, ref), f"{name}: {ndiff(out, ref)} outputs differ with the copies made"
        else:
            assert bool(torch.isnan(out.float()).all()), f"{name}: poison reached {ndiff(out, ref)} of {out.numel()}"


def test_word_views_refuse_what_the_producer_cannot_copy():
    a = torch.zeros(4, 8, dtype=torch.int8)
    (s, d), = overlap.word_views([(a, torch.ones_like(a))])
    assert s.dtype == torch.int32 and s.numel() == 8 and d.data_ptr() != s.data_ptr()
    with pytest.raises(ValueError, match="copy"):
        overlap.word_views([(a, torch.zeros(4, 8, dtype=torch.int16))])
    with pytest.raises(ValueError, match="whole 32-bit words"):
        overlap.word_views([(torch.zeros(3, dtype=torch.int8), torch.zeros(3, dtype=torch.int8))])
    with pytest.raises(ValueError, match="at most four"):
        overlap.word_views([(a, a)] * 5)
