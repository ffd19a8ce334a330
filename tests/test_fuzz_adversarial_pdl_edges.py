"""The fuzzer's draws and judging, the fold-order construction and the sm_90 PDL launch records
at their edges (pq2verify.fuzz, pq2verify.adversarial, pq2verify.sm90.pdl,
pq2verify.sm90.launches), on the CPU. Pinned, because the rest of the CPU suite let a fault
planted there pass:

- fuzz: the tile sizes read from a kernel's configs (split totals, 16 for an MMA's M side only
  where a path serves M > 1), the edges offered for M, N and K, the three branches of a pick,
  K halved first under the size cap; a shrink that stops at its deadline and after 40
  evaluations and accepts only a case failing one of the same checks; the declared-fold check
  once per (path, M, dtype, layout) and only up to M 64 (bf16) / 16 (fp16), never off the
  interpreter; a zero budget still runs one case; the shrink's deadline; what a case that
  cannot run reports;
- adversarial: the placements (span), the rows' signs, the weight's codes and scales and the
  activations' 2^m rows by hand, the rounding each family was built for (FP32 orders that give
  other bf16 / fp16 bytes), the repro command's --span, compare on planted runs, and the
  command line's refusals;
- sm90: the launch records of gemv, small_mma, the quantize kernel and the resource gate's six
  other Triton paths against what their run() passes the kernel (recorded on a stand-in kernel
  as on an sm_90 GPU), the PDL launch list
  (split-K counters only where a launch splits, one entry per specialization) and 5f06600's old
  list.

Expected values are planted or derived by hand (a module with made-up configs, a random
generator that returns what the test says, sums worked out in FP32 by hand), never taken from
the function under test. Nothing here needs a GPU or a compile."""
import importlib
import math
import sys
import time
import types

import pytest
import torch

from pq2verify import adversarial, cases, checks, fuzz, registry

HERE = ".venv/bin/python -m pytest -q -p no:randomly 'tests/test_fuzz_adversarial_pdl_edges.py::{}'"


def repro(name: str) -> str:
    return "reproduce: " + HERE.format(name)


# --- fuzz: draws --------------------------------------------------------------------------------
class Rng:
    """A random.Random stand-in: random() returns r, choice() the last element, uniform() the
    middle of its range, randint() its low end; every call is logged."""

    def __init__(self, r):
        self.r, self.log = r, []

    def random(self):
        self.log.append(("random",))
        return self.r

    def choice(self, seq):
        self.log.append(("choice", list(seq)))
        return list(seq)[-1]

    def uniform(self, a, b):
        self.log.append(("uniform", a, b))
        return (a + b) / 2

    def randint(self, a, b):
        self.log.append(("randint", a, b))
        return a

    def randrange(self, n):
        self.log.append(("randrange", n))
        return 4242


def test_tiles_reads_every_tile_field_of_a_kernels_configs(monkeypatch):
    """A planted kernel module: BN and BM as they are, K in groups from GB, groups_per_split (and
    times SPLIT), BK and k_per_split over 128 (at least 1, and k_per_split times SPLIT); 16 is
    added to M only for a path that serves M > 1 with an upper bound."""
    t = "test_tiles_reads_every_tile_field_of_a_kernels_configs"
    mod = types.ModuleType("planted_tile_kernel")
    mod.configs = lambda interpret: [{"BN": 64, "BM": 32, "GB": 3}, {"BN": 128, "groups_per_split": 5, "SPLIT": 3},
                                     {"k_per_split": 896, "SPLIT": 4, "BK": 64}]
    monkeypatch.setitem(sys.modules, "planted_tile_kernel", mod)
    # g: GB 3; groups_per_split 5 and 5 * 3 = 15; k_per_split 896 / 128 = 7 and 896 * 4 / 128 = 28;
    # BK 64 / 128 rounds to 0, kept at 1
    for m_max, want_m in ((None, [32]), (1, [32]), (16, [16, 32])):
        p = types.SimpleNamespace(name="planted", module="planted_tile_kernel", m_max=m_max)
        monkeypatch.setattr(registry, "get", lambda name, p=p: p)
        got = fuzz.tiles.__wrapped__("planted", True)      # uncached: the planted module only
        assert got == {"n": [64, 128], "m": want_m, "g": [1, 3, 5, 7, 15, 28]}, (m_max, got, repro(t))


def test_edges_are_each_tile_and_its_neighbours():
    t = "test_edges_are_each_tile_and_its_neighbours"
    # 16: 15, 16, 17, 2 * 16 + 1 = 33, 3 * 16 - 1 = 47; 1: 0 dropped, 1, 2, 3, 2
    assert fuzz._edges([16], (1,)) == [1, 15, 16, 17, 33, 47], repro(t)
    assert fuzz._edges([1]) == [1, 2, 3], repro(t)


@pytest.mark.parametrize("r, edges, lo, hi, want, calls", [
    (0.49, [0, 5, 9, 20], 2, 10, 9, [("choice", [5, 9])]),            # an edge, of those in [lo, hi]
    (0.5, [0, 5, 9, 20], 2, 10, 4, [("uniform", math.log(2), math.log(10))]),   # log-uniform: sqrt(20)
    (0.69, [5], 2, 10, 4, [("uniform", math.log(2), math.log(10))]),
    (0.7, [5], 2, 10, 2, [("randint", 2, 10)]),                      # uniform
    (0.1, [0, 20], 2, 10, 4, [("uniform", math.log(2), math.log(10))]),   # no edge in range
    (0.6, [], 5, 5, 5, [("randint", 5, 5)]),                         # one value: no log range
])
def test_a_pick_takes_an_edge_half_the_time_else_log_uniform_or_uniform(r, edges, lo, hi, want, calls):
    t = "test_a_pick_takes_an_edge_half_the_time_else_log_uniform_or_uniform"
    rng = Rng(r)
    assert fuzz._pick(rng, edges, lo, hi) == want, (r, repro(t))
    assert rng.log == [("random",)] + calls, (rng.log, repro(t))


def test_a_draw_offers_these_edges_and_halves_k_first(monkeypatch):
    """small_mma (M 2-16) with planted tiles n [64], m [32], g [6], every pick an edge (the
    largest): M from 1, 2, 3, 15, 16, 17 and 31-95 within 2-16; K groups from 1, 2, 3, 5, 7, 9 and
    5, 6, 7, 13, 17 within 1-12; N from 1, 2, 3, 7 and 63, 64, 65, 129, 191. 191 x 9 groups is
    220,032 > 200,000 weights: K halves (9 -> 4) and N stays."""
    t = "test_a_draw_offers_these_edges_and_halves_k_first"
    monkeypatch.setattr(fuzz, "tiles", lambda name, interpret: {"n": [64], "m": [32], "g": [6]})
    rng = Rng(0.1)
    c = fuzz.draw(rng, registry.get("small_mma"), True)
    picks = [e[1] for e in rng.log if e[0] == "choice"]
    assert picks[:3] == [[2, 3, 15, 16], [1, 2, 3, 5, 6, 7, 9], [1, 2, 3, 7, 63, 64, 65, 129, 191]], (picks, repro(t))
    assert picks[3:] == [["bf16", "fp16"], ["raw", "prepared"],
                         ["normal", "heavy", "outliers", "zero_groups", "ties", "zeros", "tiny", "subnormal"]], repro(t)
    # random() 0.1 < 0.3: strided
    assert c == cases.Case("small_mma", "t", 191, 4 * 128, 16, "fp16", "prepared", "subnormal", True, 4242), (c, repro(t))


# --- fuzz: shrinking ----------------------------------------------------------------------------
def _outcome(c, failed=None):
    r = checks.Result(c)
    if failed:
        r.fail("planted", failed)
    return fuzz.Outcome(c, r, 0.0)


MMQ_BIG = cases.Case("mmq", "t", 640, 12 * 128, 130, "bf16", "prepared", "normal", False, 7)


def test_a_shrink_past_its_deadline_evaluates_nothing(monkeypatch):
    t = "test_a_shrink_past_its_deadline_evaluates_nothing"
    calls = []
    monkeypatch.setattr(fuzz, "evaluate", lambda c, *a, **kw: calls.append(c) or _outcome(c, "determinism"))
    o = _outcome(MMQ_BIG, "determinism")
    best, steps = fuzz.shrink(o, "cpu", deadline=time.time() - 1)
    assert best is o and steps == [] and calls == [], (len(calls), repro(t))


def test_a_shrink_spends_at_most_40_evaluations(monkeypatch):
    """Only N > 300 at M 130 and the whole K keeps failing: each round walks every M candidate
    (none fails) before N steps down by one (320, 319, ...), so the 40 evaluations run out first."""
    t = "test_a_shrink_spends_at_most_40_evaluations"
    calls = []

    def evaluate(c, *a, **kw):
        calls.append(c)
        return _outcome(c, "determinism" if (c.n > 300 and c.m == 130 and c.k == MMQ_BIG.k) else None)
    monkeypatch.setattr(fuzz, "evaluate", evaluate)
    best, steps = fuzz.shrink(_outcome(MMQ_BIG, "determinism"), "cpu")
    assert len(calls) == 40, (len(calls), repro(t))
    assert len({c.id for c in calls}) == 40, "a case evaluated twice"
    assert steps and all(s.startswith("N: ") for s in steps) and 300 < best.case.n < 640, (steps, repro(t))


def test_a_shrink_keeps_only_a_case_failing_the_same_check(monkeypatch):
    """Every smaller case fails another check (or does not run): nothing shrinks."""
    t = "test_a_shrink_keeps_only_a_case_failing_the_same_check"
    seen = []

    def evaluate(c, *a, **kw):
        seen.append(c)
        if len(seen) % 2:
            return fuzz.Outcome(c, None, 0.0, "out of memory: MemoryError")
        return _outcome(c, "batch invariance")
    monkeypatch.setattr(fuzz, "evaluate", evaluate)
    o = _outcome(MMQ_BIG, "determinism")
    best, steps = fuzz.shrink(o, "cpu")
    assert len(seen) > 2 and best is o and steps == [], (steps, repro(t))


# --- fuzz: the run ------------------------------------------------------------------------------
FOLD_M_MAX = {"bf16": 64, "fp16": 16}    # adversarial rows scaled by 2^m overflow past these


def _recording(monkeypatch, fail_at=None):
    """fuzz.evaluate replaced: log (case, kernel, fold), pass, or fail the fail_at-th case."""
    log = []

    def evaluate(c, device, kernel=None, fold=False):
        log.append((c, kernel, fold))
        return _outcome(c, "exactness claim" if len(log) - 1 == fail_at else None)
    monkeypatch.setattr(fuzz, "evaluate", evaluate)
    return log


def test_the_fold_check_runs_once_per_key_and_only_where_its_rows_fit(monkeypatch):
    t = "test_the_fold_check_runs_once_per_key_and_only_where_its_rows_fit"
    log = _recording(monkeypatch)
    mine = lambda c, *a: "mine"
    rep = fuzz.run(7, list(registry.PATHS), "cpu", budget_s=math.inf, max_cases=300, kernel={"mmq": mine},
                   interpret=True)
    assert len(log) == 300 and rep.stopped == "300 cases (--max-cases)" and rep.failure is None, repro(t)
    seen, why = set(), set()
    for c, kernel, fold in log:
        key = (c.path, c.m, c.dtype, c.layout)
        want = key not in seen and c.m <= FOLD_M_MAX[c.dtype]
        assert fold == want, (c.id, fold, repro(t))
        assert kernel is (mine if c.path == "mmq" else None), (c.id, repro(t))
        why.add("repeat" if key in seen else ("first" if want else f"large {c.dtype}"))
        if key not in seen and 16 < c.m <= 64:
            why.add(f"mid {c.dtype} {want}")
        seen.add(key)
    # the draw reached every reason (else this test proves little)
    assert {"repeat", "first", "large bf16", "large fp16", "mid bf16 True", "mid fp16 False"} <= why, (why, repro(t))
    log.clear()
    fuzz.run(7, list(registry.PATHS), "cpu", budget_s=math.inf, max_cases=40, interpret=False)
    assert len(log) == 40 and not any(f for _, _, f in log), "the declared-fold check ran off the interpreter"


def test_a_zero_budget_still_runs_one_case(monkeypatch):
    t = "test_a_zero_budget_still_runs_one_case"
    log = _recording(monkeypatch)
    rep = fuzz.run(3, [registry.get("mmq")], "cpu", budget_s=0, interpret=True)
    assert len(log) == 1 and rep.stopped == "budget of 0s spent" and rep.tested == 1, (rep.stopped, repro(t))


@pytest.mark.parametrize("budget, shrink_s, extra", [(10.0, None, 20.0), (100.0, None, 50.0), (100.0, 5.0, 5.0)])
def test_a_failure_stops_the_run_and_is_shrunk_within_its_time(monkeypatch, budget, shrink_s, extra):
    """shrink_s, else half the budget, at least 20 s; the failing case's kernel goes along."""
    t = "test_a_failure_stops_the_run_and_is_shrunk_within_its_time"
    log = _recording(monkeypatch, fail_at=2)
    got = {}

    def shrink(o, device, kernel=None, interpret=True, deadline=None, log=None):
        got.update(case=o.case, kernel=kernel, interpret=interpret, left=deadline - time.time())
        return o, ["planted"]
    monkeypatch.setattr(fuzz, "shrink", shrink)
    mine = lambda c, *a: "mine"
    rep = fuzz.run(3, [registry.get("mmq")], "cpu", budget_s=budget, kernel={"mmq": mine}, interpret=True,
                   shrink_s=shrink_s)
    assert len(rep.outcomes) == 3 and rep.failure is rep.outcomes[2] and rep.stopped == "a case failed", repro(t)
    assert got["case"] == log[2][0] and got["kernel"] is mine and got["interpret"] is True, repro(t)
    assert extra - 2 < got["left"] <= extra, (got["left"], repro(t))
    assert rep.shrink_steps == ["planted"], repro(t)


def test_a_case_that_cannot_run_is_not_run_and_a_crash_is_a_failure(monkeypatch):
    t = "test_a_case_that_cannot_run_is_not_run_and_a_crash_is_a_failure"
    c = cases.Case("mmq", "t", 64, 128, 17, "bf16", "prepared")

    def boom(exc):
        def f(*a, **kw):
            raise exc
        return f
    monkeypatch.setattr(checks, "Inputs", boom(ValueError("planted")))
    o = fuzz.evaluate(c, "cpu")
    assert o.result is None and o.not_run == "inputs could not be built: ValueError: planted", (o.not_run, repro(t))
    monkeypatch.setattr(checks, "Inputs", lambda c, device: "inputs")
    monkeypatch.setattr(checks, "evaluate", boom(MemoryError()))
    o = fuzz.evaluate(c, "cpu")
    assert o.result is None and o.not_run == "out of memory: MemoryError", (o.not_run, repro(t))
    monkeypatch.setattr(checks, "evaluate", boom(RuntimeError("planted crash")))
    o = fuzz.evaluate(c, "cpu")
    assert o.result.failed == ["error"] and "raised RuntimeError: planted crash" in o.result.failures[0], repro(t)
    rep = fuzz.Report(1, [o, fuzz.Outcome(c, None, 0.0, "out of memory: MemoryError")])
    assert rep.tested == 1, repro(t)
    # the fold check joins the five default checks only when asked
    asked = []
    monkeypatch.setattr(checks, "evaluate", lambda c, d, checks, reruns, inp, kernel: asked.append(checks)
                        or _outcome(c).result)
    fuzz.evaluate(c, "cpu", fold=True)
    fuzz.evaluate(c, "cpu")
    assert asked == [("rms", "exact", "determinism", "batch", "nan", "fold"),
                     ("rms", "exact", "determinism", "batch", "nan")], (asked, repro(t))


# --- adversarial: the construction by hand --------------------------------------------------------
def test_special_groups_and_placements_by_hand():
    t = "test_special_groups_and_placements_by_hand"
    assert adversarial.special_groups(5) == adversarial.special_groups(5, 5) == [0, 1, 2, 3, 4], repro(t)
    assert adversarial.special_groups(5, 9) == [0, 1, 2, 3, 4], repro(t)
    # span 5 of 8 groups: the first three and the last two
    assert adversarial.special_groups(8, 5) == [0, 1, 2, 6, 7], repro(t)
    assert adversarial.special_groups(8, 3) == [0, 6, 7], repro(t)
    # 3 groups: cancel's three distinct terms in 3! = 6 orders; a tie family's two equal terms
    # halve that to 3; each placement a row and its negation: (6 + 3 + 3) * 2 = 24 rows.
    # 4 groups: 4 * 3 * 2 = 24 and 12, 12: (24 + 12 + 12) * 2 = 96
    assert len(adversarial.placements(3, "cancel")) == 6 and len(adversarial.placements(3, "tie_bf16")) == 3, repro(t)
    assert len(adversarial.rows(3)) == 24 and len(adversarial.rows(4)) == 96, repro(t)
    assert adversarial.rows(3)[:4] == [("cancel", 1, (0, 1, 2)), ("cancel", -1, (0, 1, 2)),
                                       ("cancel", 1, (0, 2, 1)), ("cancel", -1, (0, 2, 1))], repro(t)
    # the tie family's placements that only swap B and C are listed once
    assert adversarial.placements(3, "tie_fp16") == [(0, 1, 2), (1, 0, 2), (2, 0, 1)], repro(t)


def _decoded(w, n, k):
    """float64 [n, k] weights by the reference's own reader (reference/pq2.py), not the format."""
    from reference import pq2 as ref
    return ref.decode(w.data.view(-1).cpu().numpy(), layout="prepared", n=n, k=k)


def test_the_weight_encodes_each_row_s_placement_and_sign():
    """K = 384 (3 groups): row 0 is cancel (0, 1, 2): group 0 +2048 on its first element, group 1
    +2^-14, group 2 -2048; row 1 its negation; row 12 the first tie_bf16 row: 16448 once and 3
    elements of 2^-12 in groups 1 and 2. n = 26 repeats rows 0 and 1."""
    t = "test_the_weight_encodes_each_row_s_placement_and_sign"
    w = adversarial.weight(384, n=26)
    d = _decoded(w, 26, 384)
    want = torch.zeros(3, 384, dtype=torch.float64)
    want[0, 0], want[0, 128], want[0, 256] = 2048.0, 2.0 ** -14, -2048.0
    want[1] = -want[0]
    want[2, 0] = 16448.0
    want[2, 128:131] = 2.0 ** -12
    want[2, 256:259] = 2.0 ** -12
    got = torch.from_numpy(d)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (got[0].nonzero().flatten(), repro(t))
    assert torch.equal(got[12], want[2]), (got[12].nonzero().flatten(), repro(t))
    assert torch.equal(got[24], want[0]) and torch.equal(got[25], want[1]), repro(t)
    assert adversarial.weight(384).n == 24, repro(t)


def test_activations_are_six_ones_a_group_doubling_each_row():
    t = "test_activations_are_six_ones_a_group_doubling_each_row"
    x = adversarial.activations(3, 256, torch.bfloat16)
    assert x.dtype == torch.bfloat16 and x.shape == (3, 256), repro(t)
    for m in range(3):
        for g in range(2):
            row = x[m, g * 128:(g + 1) * 128].float()
            assert torch.equal(row[:6], torch.full((6,), 2.0 ** m)) and not row[6:].any(), (m, g, repro(t))


def _bits(v, dt):
    return int(torch.tensor([v], dtype=torch.float32).to(dt).view(torch.int16)[0])


@pytest.mark.parametrize("family, dt", [("tie_bf16", torch.bfloat16), ("tie_fp16", torch.float16)])
def test_each_tie_family_rounds_apart_in_two_fp32_orders(family, dt):
    """A + B + C summed (A + B) + C and A + (B + C) in FP32 give other bf16 / fp16 bytes: the
    output rounding's tie that tells the orders apart. Terms c * ws as the weight encodes them."""
    t = "test_each_tie_family_rounds_apart_in_two_fp32_orders"
    a, b, c = (torch.tensor(cnt * s * ws, dtype=torch.float32) for cnt, s, ws in adversarial.FAMILIES[family])
    # by hand: bf16 A = 2^14 (1 + 2^-8), B = C = 3 * 2^-12; fp16 A = 4098, B = C = 3 * 2^-14
    assert (float(a), float(b)) == ((16448.0, 3 * 2.0 ** -12) if dt == torch.bfloat16 else (4098.0, 3 * 2.0 ** -14)), repro(t)
    left, right = float((a + b) + c), float(a + (b + c))
    assert _bits(left, dt) != _bits(right, dt), (family, left, right, repro(t))


def test_the_cancel_family_gives_zero_in_one_order_and_the_tiny_term_in_another():
    t = "test_the_cancel_family_gives_zero_in_one_order_and_the_tiny_term_in_another"
    big, tiny, neg = (torch.tensor(c * s * ws, dtype=torch.float32) for c, s, ws in adversarial.FAMILIES["cancel"])
    assert (float(big), float(tiny), float(neg)) == (2048.0, 2.0 ** -14, -2048.0), repro(t)
    assert float((big + tiny) + neg) == 0.0 and float((big + neg) + tiny) == 2.0 ** -14, repro(t)


def test_the_repro_command_names_span_and_n_only_where_they_matter():
    t = "test_the_repro_command_names_span_and_n_only_where_they_matter"
    base = "python -m pq2verify.adversarial --device cpu --paths gemv,int_gemv --k 1024 --m 1 --dtype bf16"
    assert adversarial.command("gemv", "int_gemv", 1024, 1, "bf16") == base, repro(t)
    assert adversarial.command("gemv", "int_gemv", 1024, 1, "bf16", span=5, n=120) == base + " --span 5 --n 120", repro(t)
    # a span of all 8 groups (or more) places as no span does
    assert adversarial.command("gemv", "int_gemv", 1024, 1, "bf16", span=8) == base, repro(t)
    assert adversarial.command("gemv", "int_gemv", 1024, 1, "bf16", "cuda", span=7).endswith("--dtype bf16 --span 7")


def test_compare_names_the_first_differing_output_of_planted_runs():
    """Planted outputs differing at y[1, 3], y[0, 9] and y[1, 20]: three outputs differ, the first
    in row-major order is [0, 9], row 9 of K = 384 being cancel placement (2, 0, 1) negated."""
    t = "test_compare_names_the_first_differing_output_of_planted_runs"
    p, q = registry.get("gemv"), registry.get("int_gemv")

    def run(path, x, w):
        y = torch.zeros(x.shape[0], w.n, dtype=x.dtype)
        if path is q:
            y[1, 3], y[0, 9], y[1, 20] = 1.0, 2.0, 3.0
        return y
    d = adversarial.compare(p, q, 384, 2, "bf16", run=run)
    assert d["element"] == [0, 9] and d["differing"] == 3 and (d["gemv"], d["int_gemv"]) == (0.0, 2.0), (d, repro(t))
    assert d["input"] == "cancel row 9 (group 2: -2048, group 0: -6.10352e-05, group 1: 2048; other groups 0)", repro(t)
    assert (d["k"], d["m"], d["n"], d["dtype"]) == (384, 2, 24, "bf16"), repro(t)
    assert d["command"] == "python -m pq2verify.adversarial --device cpu --paths gemv,int_gemv --k 384 --m 2 --dtype bf16"
    assert adversarial.compare(p, q, 384, 2, "bf16", run=lambda path, x, w: torch.zeros(2, w.n)) is None, repro(t)


@pytest.mark.parametrize("argv, msg", [
    (["--paths", "gemv", "--k", "384", "--m", "1", "--dtype", "bf16"], "expected two paths P,Q, got 'gemv'"),
    (["--paths", "gemv,int_gemv,mmq", "--k", "384", "--m", "1", "--dtype", "bf16"], "expected two paths"),
    (["--paths", "gemv,nosuch", "--k", "384", "--m", "1", "--dtype", "bf16"], "unknown path 'nosuch'"),
    (["--paths", "gemv,int_gemv", "--k", "384", "--m", "2", "--dtype", "bf16"], "gemv does not serve M=2 on PQ2 weights"),
    (["--paths", "cublas,native", "--k", "384", "--m", "1", "--dtype", "bf16"], "cublas does not serve M=1 on PQ2"),
    (["--paths", "gemv,int_gemv", "--k", "256", "--m", "1", "--dtype", "bf16"], "at least 3 groups"),
    (["--paths", "gemv,int_gemv", "--k", "400", "--m", "1", "--dtype", "bf16"], "must be a multiple of 128"),
    (["--paths", "gemv,int_gemv", "--k", "384", "--m", "1", "--dtype", "bf16", "--span", "2"], "--span: expected an integer >= 3, got 2"),
    (["--paths", "gemv,int_gemv", "--k", "384", "--m", "1", "--dtype", "bf16", "--n", "0"], "--n: expected an integer >= 1, got 0"),
    (["--paths", "native,int_gemv", "--k", "384", "--m", "0", "--dtype", "bf16"], "--m: expected an integer >= 1, got 0"),
    (["--k", "384", "--m", "1", "--dtype", "bf16"], "--paths"),
    (["--paths", "gemv,int_gemv", "--m", "1", "--dtype", "bf16"], "--k"),
    (["--paths", "gemv,int_gemv", "--k", "384", "--dtype", "bf16"], "--m"),
    (["--paths", "gemv,int_gemv", "--k", "384", "--m", "1"], "--dtype"),
])
def test_the_command_line_refuses_with_exit_2(argv, msg, capsys):
    t = "test_the_command_line_refuses_with_exit_2"
    try:
        code = adversarial.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and msg in err, (argv, code, err, repro(t))


def test_the_command_line_accepts_its_lowest_values(monkeypatch, capsys):
    """--span 3, --n 1, --m 1 are allowed; two equal (planted) paths: exit 0."""
    t = "test_the_command_line_accepts_its_lowest_values"
    from kernels import backend
    got = []
    monkeypatch.setattr(backend, "select", lambda device: got.append(device))
    monkeypatch.setattr(adversarial, "compare", lambda *a, **kw: got.append((a[2:], kw)) or None)
    code = adversarial.main(["--paths", "gemv,int_gemv", "--k", "384", "--m", "1", "--dtype", "fp16",
                             "--span", "3", "--n", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "gemv and int_gemv: every output bit-identical (K=384, M=1, fp16)" in out, (out, repro(t))
    assert got == ["cpu", ((384, 1, "fp16", "cpu"), {"span": 3, "n": 1})], (got, repro(t))
    d = {"differing": 3, "element": [0, 5], "input": "planted", "gemv": 1.0, "int_gemv": 2.0}
    monkeypatch.setattr(adversarial, "compare", lambda *a, **kw: d)
    code = adversarial.main(["--paths", "gemv,int_gemv", "--k", "384", "--m", "1", "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert code == 1 and "gemv and int_gemv differ on 3 outputs; first at [0, 5]: planted: gemv 1.0, int_gemv 2.0" in out, \
        (out, repro(t))


# --- sm90: the launch records against what run() launches ------------------------------------------
class Recorder:
    """Stands in for a Triton kernel: records each launch's arguments by the kernel's names."""

    def __init__(self, names):
        self.arg_names, self.log, self.kw = list(names), [], []

    def __getitem__(self, grid):
        return lambda *args, **kw: (self.log.append({**dict(zip(self.arg_names, args)), **kw}), self.kw.append(set(kw)))


TYPES = {torch.int32: "*i32", torch.float32: "*fp32", torch.uint8: "*u8", torch.float16: "*fp16",
         torch.bfloat16: "*bf16", torch.int8: "*i8"}


@pytest.fixture
def sm90(monkeypatch):
    """Outside the interpreter as on an sm_90 GPU (the GPU configs)."""
    import kernels.common
    from kernels import prepare
    # imported in this process's mode first: a kernel module binds the mode when imported
    for name in ("gemv", "small_mma", "native", "int_gemv", "mmq", "single", "small_gemm", "mmq_planes"):
        importlib.import_module(f"kernels.{name}")
    monkeypatch.setattr(kernels.common, "INTERPRET", False)
    monkeypatch.setattr(prepare, "INTERPRET", False)
    yield monkeypatch


def _weight(n, k, layout):
    """An N x K weight of zeros (code 1 everywhere, scales 1.0), cheap at any size."""
    from kernels.format import PQ2Weight
    flat = torch.cat([torch.full((n * k // 4,), 0x55, dtype=torch.uint8),
                      torch.ones(n * (k // 128), dtype=torch.float16).view(torch.uint8)])
    w = PQ2Weight(flat, n, k, "prepared")
    return w.to_raw() if layout == "raw" else w


def _q8_stub(m, k):
    return (torch.zeros(m, k, dtype=torch.int8), torch.zeros(m, k // 128), torch.zeros(m, k // 128, dtype=torch.int32))


def _same_launch(recorder, launch, pdl, t):
    """The recorder's last launch (by run()) against launch: (config, compile args, options): the
    same pointer types, ints, constexprs (PDL as the chooser says: run() drops it off a GPU),
    warps, stages and options."""
    rec, kw = recorder.log[-1], recorder.kw[-1]
    cfg, (fn, ptrs, ints, consts, warps, stages), opts = launch
    for a, ty in ptrs.items():
        assert TYPES[rec[a].dtype] == ty, (a, rec[a].dtype, ty, repro(t))
    for a, v in ints.items():
        assert rec[a] == v, (a, rec[a], v, repro(t))
    for a, v in consts.items():
        assert (pdl if a == "PDL" else rec[a]) == v, (a, rec[a], v, repro(t))
    # no constexpr run() passes is left out of the record
    assert kw - {"num_warps", "num_stages", "launch_pdl"} == set(consts), (kw ^ set(consts), repro(t))
    assert (rec["num_warps"], rec.get("num_stages", 1)) == (warps, stages), (rec, warps, stages, repro(t))
    assert opts == ({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}), repro(t)


def _recorded(sm90, mod, attr):
    """mod's kernel `attr` replaced by a Recorder, its Q8 activations by a stub: run() launches
    are recorded, not run."""
    from kernels import prepare
    rec = Recorder(getattr(mod, attr).arg_names)
    sm90.setattr(mod, attr, rec)
    sm90.setattr(prepare, "quantize_q8", lambda x, order, pdl, zero: _q8_stub(*x.shape))
    return rec


# (N, K): single-split and split-K, tile-aligned and a ragged N (MASKED), from the GSM8K model's shapes
GEMV_SHAPES = [(960, 2560), (576, 640), (1000, 640), (5120, 17408)]


@pytest.mark.parametrize("layout", ["prepared", "raw"])
def test_the_gemv_launch_record_is_what_gemv_run_launches(sm90, layout, cpu_only):
    t = "test_the_gemv_launch_record_is_what_gemv_run_launches"
    from kernels import gemv
    from pq2verify.sm90 import launches
    rec = _recorded(sm90, gemv, "_gemv_kernel")
    splits = set()
    for n, k in GEMV_SHAPES:
        for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            gemv.run(torch.zeros(1, k, dtype=dt), _weight(n, k, layout))
            cfg = gemv.config(n, k, 1, interpret=False)
            splits.add(cfg["SPLIT"] > 1)
            _same_launch(rec, launches.gemv_launch(n, k, None, name, layout), cfg["PDL"], t)
    assert splits == {True, False}, repro(t)


@pytest.mark.parametrize("layout", ["prepared", "raw"])
def test_the_small_mma_launch_record_is_what_small_mma_run_launches(sm90, layout, cpu_only):
    t = "test_the_small_mma_launch_record_is_what_small_mma_run_launches"
    from kernels import small_mma
    from pq2verify.sm90 import launches
    rec = _recorded(sm90, small_mma, "_small_mma_kernel")
    splits, masked = set(), set()
    for n, k in GEMV_SHAPES:
        for m in (2, 16):
            for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
                small_mma.run(torch.zeros(m, k, dtype=dt), _weight(n, k, layout))
                cfg = small_mma.config(n, k, m, interpret=False)
                splits.add(cfg["SPLIT"] > 1)
                masked.add(rec.log[-1]["MASKED"])
                _same_launch(rec, launches.small_mma_launch(small_mma, n, k, m, None, name, layout),
                             cfg.get("PDL", False), t)
    assert splits == {True, False} and (layout == "raw" or masked == {True, False}), (splits, masked, repro(t))


@pytest.mark.parametrize("m, k, counters", [(1, 640, 0), (1, 5120, 20), (16, 2560, 8), (4, 17408, 40)])
def test_the_quantize_launch_record_is_what_quantize_q8_launches_with_pdl(sm90, m, k, counters, cpu_only):
    t = "test_the_quantize_launch_record_is_what_quantize_q8_launches_with_pdl"
    from kernels import prepare
    from pq2verify.sm90 import launches
    rec = Recorder(prepare._quantize_kernel.arg_names)
    sm90.setattr(prepare, "_quantize_kernel", rec)
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        zero = torch.empty(counters, dtype=torch.int32) if counters else None
        prepare.quantize_q8(torch.zeros(m, k, dtype=dt), order="plane", pdl=True, zero=zero)
        r = rec.log[-1]
        if not counters:      # no consumer counters: the sums stand in for them (int32 either way)
            assert r["zero_ptr"] is r["t_ptr"], repro(t)
        _same_launch(rec, launches.quantize_launch(m, k, counters, name), True, t)
        assert r["launch_pdl"] is True, repro(t)


@pytest.mark.parametrize("m, k, bu", [(1, 5120, 8), (1, 256, 2), (4, 17408, 8), (16, 2560, 8)])
def test_the_quantize_launch_record_is_sm90s_in_an_interpreting_process(m, k, bu):
    """The record describes the sm_90 launch whatever this process runs: BU is the GPU's
    min(next power of 2 of M*K/128, 8) groups a program (1024 values), not the interpreter's
    up to 256 (m=1, k=5120: 40 groups -> 8, the interpreter's 64; k=256: 2 -> 2 on both)."""
    t = "test_the_quantize_launch_record_is_sm90s_in_an_interpreting_process"
    from pq2verify.sm90 import launches
    _, (fn, _ptrs, ints, consts, warps, stages), _ = launches.quantize_launch(m, k, 0)
    assert (consts["BU"], warps, stages, ints["U"]) == (bu, 4, 1, m * k // 128), (consts["BU"], repro(t))


# --- sm90: the PDL launch list ---------------------------------------------------------------------
def _consumers(m):
    """The PDL paths that serve M (gemv 1, gemv_pair 2, small_mma 2-16) and their kernel modules."""
    from pq2verify.sm90 import pdl
    return {name: importlib.import_module(f"kernels.{name}") for name in pdl.PDL_PATHS if registry.get(name).serves(m)}


def test_each_quantize_launch_zeroes_counters_only_for_a_split_consumer():
    """A quantize launch (labelled with its first use) zeroes ceil(N / BN) counters where its
    consumer splits K and none where it does not, as the consumer's sm_90 chooser says (at an M
    two PDL paths serve, one of theirs); every PDL launch records its consumer's splits, a
    quantize launch 1."""
    t = "test_each_quantize_launch_zeroes_counters_only_for_a_split_consumer"
    from pq2verify.sm90 import pdl
    seen = set()
    for e in pdl.pdl_launches():
        name, *use = e["label"].split()
        shape, nk, m = use[:3]
        n, k, m = int(nk.split("x")[0]), int(nk.split("x")[1]), int(m[2:])
        cfgs = {p: mod.config(n, k, m, interpret=False) for p, mod in _consumers(m).items()}
        ints, consts = e["launch"][2], e["launch"][3]
        assert consts["PDL"] is True, (e["label"], repro(t))
        if name == "quantize":
            wants = {-(-n // c["BN"]) if c["SPLIT"] > 1 else 0 for c in cfgs.values()}
            assert ints["Z"] in wants and e["label"].endswith(f" counters={ints['Z']}"), (e["label"], ints["Z"], wants, repro(t))
            assert e["splits"] == 1 and e["weights"] == set(), (e["label"], repro(t))
            seen.add(("quantize", ints["Z"] > 0))
        else:
            assert name in cfgs and e["splits"] == cfgs[name]["SPLIT"], (e["label"], e["splits"], cfgs, repro(t))
            assert e["weights"] == {"codes_ptr", "scales_ptr"}, repro(t)
            seen.add((name, cfgs[name]["SPLIT"] > 1))
    # split-K of 2 and more and single-split consumers are all among them
    assert seen == {(p, s) for p in ("gemv", "gemv_pair", "small_mma", "quantize") for s in (True, False)}, (seen, repro(t))


def test_the_old_launch_list_holds_its_six_launches():
    t = "test_the_old_launch_list_holds_its_six_launches"
    from pq2verify.sm90 import pdl
    old = pdl.old_pdl_launches()
    assert [e["label"] for e in old] == ["gemv 34816x5120 M=1", "gemv 5120x17408 M=1", "small_mma 34816x5120 M=16",
                                         "small_mma 5120x17408 M=4", "quantize M=1 K=5120", "quantize M=16 K=17408"], repro(t)
    # 5f06600 zeroed 544 counters at M=1 K=5120 (a launch that never happens) and 40 at M=16
    q = [e for e in old if e["label"].startswith("quantize")]
    assert [(e["launch"][2]["U"], e["launch"][2]["Z"], e["splits"]) for e in q] == [(40, 544, 1), (16 * 136, 40, 1)], repro(t)
    assert all(e["weights"] == ({"codes_ptr", "scales_ptr"} if not e["label"].startswith("quantize") else set())
               for e in old), repro(t)


def test_the_pdl_report_judges_with_and_without_the_weights_and_only_what_is_asked(monkeypatch):
    """compile_sm90 and ptx.before_wait stand-ins: the violations are judged with the value
    parameters and the weights allowed, the reads of weights with the values alone; --only
    keeps the kernels named."""
    t = "test_the_pdl_report_judges_with_and_without_the_weights_and_only_what_is_asked"
    from pq2verify.sm90 import pdl, ptx
    compiled = []

    def compile_sm90(fn, ptrs, ints, consts, warps, stages, **opts):
        compiled.append(fn.__name__)
        return types.SimpleNamespace(asm={"ptx": "planted"}), list(ptrs) + list(ints) + ["extra"]
    monkeypatch.setattr(pdl, "compile_sm90", compile_sm90)
    monkeypatch.setattr(ptx, "before_wait", lambda text, entry, params, allowed: sorted(allowed))
    rep = pdl.pdl_report(old=True, only={"quantize"})
    assert [x["kernel"] for x in rep] == ["quantize M=1 K=5120", "quantize M=16 K=17408"], repro(t)
    assert compiled == ["_quantize_kernel"] * 2, repro(t)
    for x in rep:
        # the values: every parameter but the pointers; the quantize kernel reads no weights
        assert x["violations"] == x["reads_of_weights"] == sorted(["U", "G", "stride_xm", "Z", "stride_sg", "extra"]), \
            (x, repro(t))
    rep = pdl.pdl_report(old=True, only={"gemv", "small_mma"})
    assert [x["kernel"].split()[0] for x in rep] == ["gemv", "gemv", "small_mma", "small_mma"], repro(t)
    for x in rep:
        assert set(x["violations"]) - set(x["reads_of_weights"]) == {"codes_ptr", "scales_ptr"}, (x, repro(t))
        assert "codes_ptr" not in x["reads_of_weights"] and "extra" in x["reads_of_weights"], (x, repro(t))
    assert len(pdl.pdl_report(old=True)) == 6, repro(t)


# (path, N, K, M): the resource gate's other Triton paths, at a split and a single-split shape
# where the path splits K, both dtypes, each layout the path serves
RESOURCE_CALLS = [("native", 960, 640, 32), ("int_gemv", 960, 2560, 4), ("int_gemv", 1000, 640, 16),
                  ("mmq", 960, 640, 64), ("mmq", 1000, 2560, 17), ("single", 960, 2560, 1), ("single", 1000, 640, 1),
                  ("single", 5120, 17408, 1), ("small_gemm", 960, 2560, 4), ("small_gemm", 1000, 640, 16),
                  ("small_gemm", 5120, 17408, 2), ("mmq_planes", 960, 640, 64), ("mmq_planes", 1000, 2560, 17)]


@pytest.mark.parametrize("name, n, k, m", RESOURCE_CALLS, ids=[f"{c[0]}-{c[1]}x{c[2]}-m{c[3]}" for c in RESOURCE_CALLS])
def test_the_resource_launch_records_are_what_each_run_launches(sm90, name, n, k, m, cpu_only):
    t = "test_the_resource_launch_records_are_what_each_run_launches"
    from kernels import prepare
    from pq2verify.sm90 import launches
    p = registry.get(name)
    mod = importlib.import_module(p.module)
    kname = {"int_gemv": "_gemv_kernel"}.get(name, f"_{name}_kernel")
    rec = Recorder(getattr(mod, kname).arg_names)
    sm90.setattr(mod, kname, rec)
    for where in (mod, prepare):     # the plain or plane quantize, however the module imported it
        if hasattr(where, "quantize_q8"):
            sm90.setattr(where, "quantize_q8", lambda x, order="plain", *a, **kw: _q8_stub(*x.shape))
    if hasattr(mod, "INTERPRET"):
        sm90.setattr(mod, "INTERPRET", False)
    cfg = mod.config(n, k, m, interpret=False)
    for dt, dname in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for layout in p.layouts:
            w = torch.zeros(n, k, dtype=dt) if layout == "dense" else _weight(n, k, layout)
            mod.run(torch.zeros(m, k, dtype=dt), w)
            _same_launch(rec, launches.RESOURCE_PATHS[name](n, k, m, dname, layout, cfg), None, t)
