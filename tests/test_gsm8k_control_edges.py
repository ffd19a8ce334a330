"""Edges of the code that controls the GSM8K A/B: which calls the fold-reversed control reverses,
how stacked sibling projections share one matmul, what the conversion reports; the generator's
positions, decode Ms and teacher-forced scores on a model whose every logit is known; the
ledger's totals and the run summary's ranges. Expected values are derived here by hand or by a
small independent computation (FP64 sums, a plain Python greedy loop)."""
import contextlib
import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pq2verify.gsm8k import convert, execute, generate, model as mdl
from reference.q8 import quantize_q8


@pytest.fixture
def emulate(monkeypatch):
    """The torch emulation backend on the CPU, legacy kernels (int_gemv for M <= 16, mmq above)."""
    from kernels import backend
    monkeypatch.setattr(backend, "_cpu_backend", "emulate")
    monkeypatch.setenv("PQ2_KERNELS", "legacy")


# --- model.py: the fold-reversed control ---------------------------------------------------

@pytest.mark.parametrize("ranges,m,want", [
    ((), 1, False),
    (((2, 16),), 1, False), (((2, 16),), 2, True), (((2, 16),), 16, True), (((2, 16),), 17, False),
    (((5, 5),), 4, False), (((5, 5),), 5, True), (((5, 5),), 6, False),
    (((17, None),), 16, False), (((17, None),), 17, True), (((17, None),), 10 ** 6, True),
    (((1, 1), (40, None)), 1, True), (((1, 1), (40, None)), 2, False), (((1, 1), (40, None)), 39, False),
    (((1, 1), (40, None)), 40, True),          # the second range counts as much as the first
])
def test_reverses_is_membership_in_the_closed_ranges(ranges, m, want):
    """Usage.reverse holds closed ranges [lo, hi], hi None for no upper end."""
    assert mdl.Usage(reverse=ranges).reverses(m) is want


def _cancelling(rows_x):
    """One output row over three groups whose partials are +2^-10, +65504, -65504 (ternary per
    group, so one digit and lossless): folded 0, 1, 2 the tiny partial is lost (0.0); folded
    2, 1, 0 it survives (2^-10)."""
    lin = torch.nn.Sequential(torch.nn.Linear(384, 2, bias=False))
    with torch.no_grad():
        lin[0].weight.zero_()
        lin[0].weight[0, 0], lin[0].weight[0, 128], lin[0].weight[0, 256] = 2.0 ** -10, 65504.0, -65504.0
    usage = mdl.Usage()
    mdl.pq2ify(lin, None, usage=usage)
    x = torch.zeros(*rows_x, 384)
    x[..., [0, 128, 256]] = 1.0
    return lin, usage, x.to(torch.bfloat16)


@pytest.mark.parametrize("reverse,want", [(((10, 10),), 2.0 ** -10), (((2, 2),), 0.0), (((5, 5),), 0.0)])
def test_the_fold_range_applies_to_the_calls_m_not_the_batch_size(emulate, reverse, want):
    """A [2, 5, K] input is one call at M = 10 (batch x positions): the fold order follows the
    range that holds 10, not 2 (the batch) or 5 (the positions)."""
    lin, usage, x = _cancelling((2, 5))
    usage.reverse = reverse
    y = lin(x)
    assert y.shape == (2, 5, 2)
    assert (y[..., 0].float() == want).all(), (reverse, y[..., 0])
    assert usage.calls.keys() == {("int_gemv", 10)} and sum(usage.calls.values()) == 1


# --- model.py: stacked siblings -------------------------------------------------------------

class _Attn(torch.nn.Module):
    """q/k/v share their input (one stack), o_proj is alone, lm_head is never converted."""

    def __init__(self, k=256, outs=(8, 4, 4), seed=3):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        for name, n in zip(("q_proj", "k_proj", "v_proj"), outs):
            setattr(self, name, torch.nn.Linear(k, n, bias=False))
        self.o_proj = torch.nn.Linear(outs[0], k, bias=False)
        self.lm_head = torch.nn.Linear(k, 3, bias=False)
        with torch.no_grad():
            for m in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
                m.weight.copy_(torch.randint(-1, 2, m.weight.shape, generator=g).float())   # ternary: lossless


def _ref(x: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """FP64 dot of the Q8-quantized input with the (ternary, exactly converted) weight, and the
    sum of the terms' magnitudes (for the FP32 allowance)."""
    kp = -(-w.shape[1] // 128) * 128
    xp = torch.nn.functional.pad(x.float(), (0, kp - x.shape[1]))
    q8 = quantize_q8(xp)
    xd = (q8.q.astype(np.float64).reshape(x.shape[0], -1, 128) * q8.scales.astype(np.float64)[..., None])
    xd = xd.reshape(x.shape[0], kp)[:, :w.shape[1]]
    wd = w.double().numpy()
    return xd @ wd.T, np.abs(xd) @ np.abs(wd).T


def _close(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    ref, mag = _ref(x, w)
    return bool((np.abs(y.double().numpy() - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-6 * mag + 1e-30).all())


def test_siblings_called_with_one_input_share_one_matmul(emulate):
    m = _Attn()
    usage = mdl.Usage()
    digits, ternary, rel, worst, n, nbytes = mdl.pq2ify(m, None, usage=usage)
    assert (digits, ternary, rel, worst, n) == (1, True, 0.0, 0.0, 2)      # one stack + o_proj
    assert isinstance(m.lm_head, torch.nn.Linear)                            # the head stays
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 256, generator=g).to(torch.bfloat16)
    w = {k: getattr(_Attn(), k).weight.detach() for k in ("q_proj", "k_proj", "v_proj")}
    ys = {k: getattr(m, k)(x) for k in ("q_proj", "k_proj", "v_proj")}
    assert [ys[k].shape[-1] for k in ys] == [8, 4, 4]
    for k in ys:
        assert _close(ys[k], x, w[k]), k
    assert usage.calls == Counter({("int_gemv", 3): 1})                     # one call for the three
    ys2 = {k: getattr(m, k)(x) for k in ("q_proj", "k_proj", "v_proj")}   # the next layer's turn
    assert all(torch.equal(ys[k], ys2[k]) for k in ys) and usage.calls == Counter({("int_gemv", 3): 2})


def test_a_sibling_called_with_another_input_gets_its_own_result(emulate):
    """Only the very same input tensor may reuse the stack's result: k_proj on x2 after q_proj
    on x1 computes again (and v_proj on x2 then reuses that)."""
    m = _Attn()
    usage = mdl.Usage()
    mdl.pq2ify(m, None, usage=usage)
    w = {k: getattr(_Attn(), k).weight.detach() for k in ("q_proj", "k_proj", "v_proj")}
    g = torch.Generator().manual_seed(5)
    x1 = torch.randn(2, 256, generator=g).to(torch.bfloat16)
    x2 = torch.randn(2, 256, generator=g).to(torch.bfloat16)
    assert _close(m.q_proj(x1), x1, w["q_proj"])
    assert _close(m.k_proj(x2), x2, w["k_proj"])
    assert _close(m.v_proj(x2), x2, w["v_proj"])
    assert usage.calls == Counter({("int_gemv", 2): 2})


def test_siblings_of_different_input_widths_are_not_stacked():
    m = _Attn()
    m.k_proj = torch.nn.Linear(128, 4, bias=False)
    groups = mdl._linear_groups(m)
    assert sorted(names for _, names in groups) == [["k_proj"], ["o_proj"], ["q_proj"], ["v_proj"]]


def test_gate_and_up_are_stacked_and_skipped_names_left_alone():
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = torch.nn.Linear(64, 96), torch.nn.Linear(64, 96)
    mlp.down_proj = torch.nn.Linear(96, 64)
    root = torch.nn.Module()
    root.mlp, root.embed_tokens, root.score = mlp, torch.nn.Linear(4, 64), torch.nn.Linear(64, 2)
    groups = mdl._linear_groups(root)
    assert sorted(names for _, names in groups) == [["down_proj"], ["gate_proj", "up_proj"]]


# --- model.py: what the conversion reports ----------------------------------------------------

def test_max_groups_counts_every_digits_groups():
    """K 200 with 2 digits: ceil(200/128) = 2 groups per digit, 4 in all; K 384 with 2 digits:
    6. The most over the model is 6; a model without PQ2 projections has 0."""
    root = torch.nn.Module()
    root.a, root.b = torch.nn.Linear(200, 8), torch.nn.Linear(384, 4)
    assert mdl.max_groups(root) == 0
    mdl.pq2ify(root, 2)
    assert mdl.max_groups(root) == 6
    one = torch.nn.Sequential(torch.nn.Linear(128, 4))
    mdl.pq2ify(one, 1)
    assert mdl.max_groups(one) == 1


def _rel(w: torch.Tensor, digits: int) -> tuple[float, float]:
    """(squared error, squared norm) of one projection's T-digit reconstruction."""
    _, _, rec = convert.quantize_digits(w, digits)
    return float((rec.double() - w.double()).pow(2).sum()), float(w.double().pow(2).sum())


def test_the_reported_error_is_over_all_projections_and_the_worst_is_the_largest():
    """rel_rms = sqrt(sum of squared errors / sum of squared norms) over every projection; the
    worst is the largest single projection's; digits default to 4 when one projection is not
    ternary; bytes are 34 per (row, digit, group)."""
    g = torch.Generator().manual_seed(9)
    root = torch.nn.Module()
    root.a = torch.nn.Linear(256, 6, bias=False)
    root.b = torch.nn.Linear(128, 5, bias=False)
    with torch.no_grad():
        root.a.weight.copy_(torch.randint(-1, 2, (6, 256), generator=g).float() * 0.5)   # ternary
        root.b.weight.copy_(torch.randn(5, 128, generator=g))
    ea, ra = _rel(root.a.weight.detach(), 4)
    eb, rb = _rel(root.b.weight.detach(), 4)
    assert eb / rb > ea / ra > 0                                   # b is the worst, a not exact either
    digits, ternary, rel, worst, n, nbytes = mdl.pq2ify(root, None)
    assert (digits, ternary, n) == (4, False, 2)
    assert rel == pytest.approx(math.sqrt((ea + eb) / (ra + rb)), rel=1e-9)
    assert worst == pytest.approx(math.sqrt(eb / rb), rel=1e-9)
    assert nbytes == 6 * 4 * 2 * 34 + 5 * 4 * 1 * 34
    assert root.a.stack.digits == root.b.stack.digits == 4


def test_all_zero_weights_report_no_error():
    lin = torch.nn.Sequential(torch.nn.Linear(128, 4, bias=False))
    with torch.no_grad():
        lin[0].weight.zero_()
    digits, ternary, rel, worst, n, _ = mdl.pq2ify(lin, None)
    assert (digits, ternary, rel, worst, n) == (1, True, 0.0, 0.0, 1)


@pytest.mark.parametrize("graphs,device,refused", [(True, "cpu", True), (True, "cuda", False),
                                                   (False, "cpu", False), (None, "cpu", False)])
def test_graphs_are_refused_off_cuda_only(graphs, device, refused):
    if refused:
        with pytest.raises(ValueError, match="CUDA graphs need --device cuda"):
            mdl.check_graphs(graphs, device)
    else:
        assert mdl.check_graphs(graphs, device) is None


# --- generate.py: a model whose every logit is known ------------------------------------------

V = 11          # vocabulary; token t is the letter "abcdefghijk"[t]


def _hash(history) -> int:
    """The next token after a visible history [(token, position)]: sum (t + 1) * (pos + 1) mod V."""
    return sum((t + 1) * (p + 1) for t, p in history) % V


def _logits(h: int) -> list[float]:
    """Logits of the model when its hash is h: token h is the argmax, the others fall by 0.5 a step."""
    return [-0.5 * ((v - h) % V) for v in range(V)]


def _logsoftmax(z: list[float]) -> list[float]:
    mx = max(z)
    lse = mx + math.log(sum(math.exp(v - mx) for v in z))
    return [v - lse for v in z]


class _LM(torch.nn.Module):
    """A causal LM over the real DynamicCache: it stores (token + salt, position) of every input
    it sees and returns the logits of _hash over the unmasked entries. `salt` stands for another
    arithmetic (a follower's own prefill differs from the leader's), `bias` is added to the
    logits. Every forward is logged, and counted as a call at M = batch x length in `usage`."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
        self.config = None
        self.salt, self.bias, self.usage, self.log, self.folds = 0, None, None, [], []

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, logits_to_keep=1,
                past_key_values=None):
        b, n = input_ids.shape
        if len(self.log) > 500:                  # no test here needs more: a generation that never stops
            raise RuntimeError("runaway generation: more than 500 forwards")
        past = past_key_values.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n).expand(b, n)
        if attention_mask is None:
            attention_mask = torch.ones(b, past + n, dtype=torch.long)
        self.log.append((input_ids.tolist(), attention_mask.tolist(), position_ids.tolist(), self.salt))
        if self.usage is not None:
            self.usage.calls[("lm", b * n)] += 1
            self.folds.append(getattr(self.usage, "reverse", ()))
        kv = torch.stack([input_ids.double() + self.salt, position_ids.double()], dim=-1).unsqueeze(1)
        keys, _ = past_key_values.update(kv, kv, 0)
        tok, pos = keys[:, 0, :, 0], keys[:, 0, :, 1]
        h = (((tok + 1) * (pos + 1)) * attention_mask.double()).sum(-1).long() % V
        z = torch.tensor([_logits(int(x)) for x in h], dtype=torch.float32)
        if self.bias is not None:
            z = z + self.bias
        return SimpleNamespace(logits=z[:, None, :])


class _Tok:
    eos_token_id, pad_token_id = None, 0

    def decode(self, ids, skip_special_tokens=False):
        return "".join("abcdefghijk"[t] for t in ids)


PREFIX = [3, 1, 4, 1, 5]
QUESTIONS = {10: [4, 5, 6], 11: [6, 1, 8, 4], 12: [8]}     # padded to 4; they stop after 2, 8 and 4 tokens
EOS = 7


def _greedy(ids, max_new, eos=EOS):
    """The reference: one unpadded prompt at positions 0.., greedy, stopping at EOS or max_new."""
    seq, out = list(ids), []
    while True:
        out.append(_hash([(t, i) for i, t in enumerate(seq)]))
        seq.append(out[-1])
        if out[-1] == eos or len(out) >= max_new:
            return out


def _run(lm, qids, *, max_new=8, prefix=PREFIX, followers=(), memo=None, sig=None, usage=None, top_k=3):
    g = generate.Generator(lm, _Tok(), max_new_tokens=max_new, stops=[], top_k=top_k, eos_ids={EOS}, pad_id=0,
                           memo=memo, sig=sig, usage=usage)
    g.set_prefix(prefix, list(followers))
    out = {}
    g.run_batch([generate.Request(q, prefix + QUESTIONS[q]) for q in qids], lambda r: out.__setitem__(r.qid, r))
    return out, g


def test_a_padded_batch_generates_each_prompts_own_greedy_tokens():
    lm = _LM()
    res, g = _run(lm, [10, 11, 12])
    want = {q: _greedy(PREFIX + QUESTIONS[q], 8) for q in QUESTIONS}
    assert [len(want[q]) for q in (10, 11, 12)] == [2, 8, 4]              # the premise: rows stop apart
    assert {q: r.tokens for q, r in res.items()} == want
    assert {q: r.stop for q, r in res.items()} == {10: "eos", 11: "length", 12: "eos"}
    assert res[10].text == "c" and res[12].text == "fdc" and res[11].text == "".join("abcdefghijk"[t] for t in want[11])
    assert g.tokens_out == 14


def test_positions_and_masks_follow_the_prefix_and_the_left_padding():
    """Prefix at 0..4; each question right after it at 5.., its pads left of it masked out;
    every decode step one position further for each row, whichever rows are left."""
    lm = _LM()
    _run(lm, [10, 11, 12])
    (ids0, _, pos0, _), (ids1, mask1, pos1, _) = lm.log[0], lm.log[1]
    assert ids0 == [PREFIX] and pos0 == [[0, 1, 2, 3, 4]]
    assert ids1 == [[0, 4, 5, 6], [6, 1, 8, 4], [0, 0, 0, 8]]
    assert pos1 == [[5, 5, 6, 7], [5, 6, 7, 8], [5, 5, 5, 5]]
    assert mask1 == [[1] * 5 + [0, 1, 1, 1], [1] * 9, [1] * 5 + [0, 0, 0, 1]]
    decode = [(len(ids), pos) for ids, _, pos, _ in lm.log[2:]]
    # row lengths 2, 8, 4: step 1 all three (next positions 8, 9, 6), then rows 11, 12, then 11
    assert decode == [(3, [[8], [9], [6]]), (2, [[10], [7]]), (2, [[11], [8]]),
                      (1, [[12]]), (1, [[13]]), (1, [[14]]), (1, [[15]])]


def test_decode_m_and_topk_are_those_of_each_step():
    lm = _LM()
    res, _ = _run(lm, [10, 11, 12])
    assert res[10].decode_m == [[3, 1]]
    assert res[11].decode_m == [[3, 1], [2, 2], [1, 4]]
    assert res[12].decode_m == [[3, 1], [2, 2]]
    for q, r in res.items():
        seq = PREFIX + QUESTIONS[q]
        for step, top in enumerate(r.topk):
            lp = _logsoftmax(_logits(_hash([(t, i) for i, t in enumerate(seq)])))
            best = sorted(range(V), key=lambda v: -lp[v])[:3]
            assert [t for t, _ in top] == best
            assert [v for _, v in top] == pytest.approx([lp[t] for t in best], abs=1e-6)
            seq = seq + [r.tokens[step]]


@pytest.fixture
def biased():
    """A follower whose logits are the leader's plus 3.0 on token 2 (its history is the same)."""
    def follower(lm, name="f", same=lambda m: False):
        @contextlib.contextmanager
        def switch():
            lm.bias = torch.zeros(V)
            lm.bias[2] = 3.0
            try:
                yield
            finally:
                lm.bias = None
        return generate.Follower(name, switch, same=same)
    return follower


def test_teacher_scores_are_kl_of_leader_over_follower_on_the_leaders_tokens(biased):
    """KL(leader || follower) = sum p (log p - log q) per step, computed here in FP64; top1 says
    whether the follower's argmax is the leader's token; lpk the follower's log-probabilities of
    the leader's top-k. Rows leave the batch in between: each row keeps its own scores."""
    lm = _LM()
    res, _ = _run(lm, [10, 11, 12], followers=[biased(lm)])
    free, _ = _run(_LM(), [10, 11, 12])
    for q, r in res.items():
        assert r.tokens == free[q].tokens and r.topk == free[q].topk             # the leader is unchanged
        t = r.teacher["f"]
        seq = PREFIX + QUESTIONS[q]
        assert len(t["kl"]) == len(t["top1"]) == len(t["lpk"]) == len(r.tokens)
        for step, tok in enumerate(r.tokens):
            z = _logits(_hash([(x, i) for i, x in enumerate(seq)]))
            lp = _logsoftmax(z)
            lq = _logsoftmax([v + (3.0 if k == 2 else 0.0) for k, v in enumerate(z)])
            kl = sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))
            assert t["kl"][step] == pytest.approx(kl, rel=1e-5, abs=1e-9), (q, step)
            assert t["top1"][step] == (max(range(V), key=lambda v: lq[v]) == tok)
            assert t["lpk"][step] == pytest.approx([lq[k] for k, _ in r.topk[step]], abs=1e-6)
            seq = seq + [tok]
    assert not all(x for r in res.values() for x in r.teacher["f"]["top1"])   # the bias moved some argmax


@contextlib.contextmanager
def _salted(lm, salt=1):
    lm.salt = salt
    try:
        yield
    finally:
        lm.salt = 0


def _follower_tokens_seen(lm):
    """[(ids, salt)] of the forwards the follower computed itself."""
    return [(ids, salt) for ids, _, _, salt in lm.log if salt]


@pytest.mark.parametrize("shares", ["nothing", "prefix", "prefix+batch", "batch-only"])
def test_a_follower_copies_only_the_prefills_whose_arithmetic_it_shares(shares):
    """same(M) says where the follower's arithmetic is the leader's (here: M = 5, the prefix; M =
    12, the questions' batch prefill, 3 x 4). A copied prefill holds the leader's history (salt 0),
    a computed one the follower's own; a batch prefill is copied only when the prefix it extends
    was copied too (else it would sit on another prefix). Step 0's KL is 0 exactly when the
    follower's whole history up to it is the leader's."""
    P, BL = len(PREFIX), 3 * 4
    same = {"nothing": set(), "prefix": {P}, "prefix+batch": {P, BL}, "batch-only": {BL}}[shares]
    lm = _LM()
    f = generate.Follower("s", lambda: _salted(lm), same=lambda m: m in same)
    res, _ = _run(lm, [10, 11, 12], followers=[f])
    copied_prefix = P in same
    copied_batch = copied_prefix and BL in same
    computed = [len(ids[0]) for ids, _ in _follower_tokens_seen(lm) if len(ids[0]) > 1]   # its prefills
    assert computed == ([] if copied_prefix else [P]) + ([] if copied_batch else [4])
    for q, r in res.items():
        hist = [(t + (0 if copied_prefix else 1), i) for i, t in enumerate(PREFIX)]
        hist += [(t + (0 if copied_batch else 1), P + i) for i, t in enumerate(QUESTIONS[q])]
        for step, tok in enumerate(r.tokens):
            lead = _logsoftmax(_logits(_hash([(t, i) for i, t in enumerate(PREFIX + QUESTIONS[q] + r.tokens[:step])])))
            fol = _logsoftmax(_logits(_hash(hist)))
            kl = sum(math.exp(a) * (a - b) for a, b in zip(lead, fol))
            assert r.teacher["s"]["kl"][step] == pytest.approx(kl, rel=1e-5, abs=1e-9), (q, step)
            hist.append((tok + 1, len(hist)))            # decode steps: always the follower's own
        assert (r.teacher["s"]["kl"][0] == 0.0) == copied_batch


def test_shared_prefills_are_keyed_by_the_arithmetic_at_each_m():
    """Two runs with one PrefillMemo: the second copies a prefill only where its signature agrees
    at every M that made it (prefix M 5; batch prefill at M 5 and 12); a copy credits the calls
    that made it to the copier's counter and to memo.copied."""
    memo = generate.PrefillMemo()
    u1 = SimpleNamespace(calls=Counter())
    lm = _LM()
    lm.usage = u1
    first, _ = _run(lm, [10, 11, 12], memo=memo, sig=lambda m: "a", usage=u1)
    assert u1.calls[("lm", 5)] == 1 and u1.calls[("lm", 12)] == 1
    for sig2, copies in ((lambda m: "a", {5, 12}), (lambda m: "b" if m == 12 else "a", {5}),
                         (lambda m: "b" if m == 5 else "a", set())):
        u2 = SimpleNamespace(calls=Counter())
        lm2 = _LM()
        lm2.usage = u2
        before = Counter(memo.copied)
        second, _ = _run(lm2, [10, 11, 12], memo=memo, sig=sig2, usage=u2)
        assert {q: r.tokens for q, r in second.items()} == {q: r.tokens for q, r in first.items()}
        computed = {len(ids) * len(ids[0]) for ids, _, _, _ in lm2.log[:2]} & {5, 12}
        assert computed == {5, 12} - copies
        assert u2.calls == u1.calls                                  # copied calls count as made
        assert memo.copied - before == Counter({("lm", m): 1 for m in copies})


def test_a_skipped_name_does_not_hide_its_siblings():
    """lm_head is never converted; a projection next to it still is."""
    root = torch.nn.Module()
    root.lm_head, root.proj = torch.nn.Linear(64, 8), torch.nn.Linear(64, 64)
    assert [names for _, names in mdl._linear_groups(root)] == [["proj"]]


def test_the_converted_weights_go_to_the_device_asked_for():
    """device=None: where the layer lives (the CPU here); else the device given ("meta": no data)."""
    a = torch.nn.Sequential(torch.nn.Linear(128, 4))
    mdl.pq2ify(a, 1)
    b = torch.nn.Sequential(torch.nn.Linear(128, 4))
    mdl.pq2ify(b, 1, device="meta")
    assert a[0].stack.w.data.device.type == "cpu" and b[0].stack.w.data.device.type == "meta"


# --- generate.py: small rules ---------------------------------------------------------------

@pytest.mark.parametrize("seqs,want", [
    ([], 0), ([[5]], 0), ([[1, 2, 3]], 2),
    ([[1, 2, 3], [1, 2, 4]], 2), ([[1, 2], [1, 2, 3]], 1), ([[1, 2, 3, 4], [1, 2, 3]], 2),
    ([[1, 2, 3], [1, 9, 3], [1, 2, 3]], 1), ([[1, 2, 3], [1, 2, 3], [1, 7, 3]], 1),
    ([[4, 2], [1, 2]], 0), ([[], [1]], 0),
])
def test_common_prefix_leaves_every_prompt_a_token(seqs, want):
    assert generate.common_prefix(seqs) == want


@pytest.mark.parametrize("ms,want", [([], []), ([3], [[3, 1]]), ([3, 3, 2, 1, 1], [[3, 2], [2, 1], [1, 2]]),
                                     ([1, 2, 1], [[1, 1], [2, 1], [1, 1]])])
def test_decode_ms_are_run_length_encoded(ms, want):
    assert generate._rle(ms) == want


@pytest.mark.parametrize("eos_ids,tok_eos,tok_pad,eos,pad", [
    ({7}, None, None, {7}, 7),          # no pad token: an EOS id pads
    (None, 7, None, {7}, 7),            # the tokenizer's EOS
    ([7, 9], None, 3, {7, 9}, 3),       # the tokenizer's pad
    (set(), None, None, set(), 0),      # nothing: 0
])
def test_eos_and_pad_come_from_the_arguments_then_the_tokenizer(eos_ids, tok_eos, tok_pad, eos, pad):
    tok = _Tok()
    tok.eos_token_id, tok.pad_token_id = tok_eos, tok_pad
    lm = _LM()
    g = generate.Generator(lm, tok, max_new_tokens=2, stops=[], eos_ids=eos_ids)
    assert g.eos == eos
    g.set_prefix(PREFIX)
    g.run_batch([generate.Request(q, PREFIX + QUESTIONS[q]) for q in (10, 12)], lambda r: None)
    assert lm.log[1][0] == [[4, 5, 6], [pad, pad, 8]]            # the short question is left padded


class _Letters:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + t) for t in ids)


@pytest.mark.parametrize("stops,tokens,want", [
    (["cd", "b"], [0, 1, 2, 3], ("a", "stop:b")),           # the first in the text, not in the list
    (["b", "cd"], [0, 2, 3, 1], ("a", "stop:cd")),
    (["zz"], [0, 1, 25], ("ab", "eos")),                      # the EOS token is not text
    (["zz"], [0, 1], ("ab", None)),
])
def test_cut_at_the_earliest_stop_else_before_eos(stops, tokens, want):
    g = generate.Generator.__new__(generate.Generator)
    g.tok, g.stops, g.eos = _Letters(), stops, {25}
    assert g._cut(tokens) == want


def test_the_memo_holds_every_run_of_the_current_batch_and_drops_older_batches():
    """Runs A, B, F of one batch put their own prefills (other signatures): all stay until the
    next batch's first put; prefix entries stay always."""
    memo = generate.PrefillMemo()
    memo.put(("prefix", (1, 2), (2,), "a"), "pa", None, Counter())
    for sig in ("a", "b", "f"):
        memo.put(("batch", "b1", (2, 8), "a", sig), f"c-{sig}", "l", Counter({("mmq", 8): 1}))
    assert [memo.get(("batch", "b1", (2, 8), "a", s))[0] for s in ("a", "b", "f")] == ["c-a", "c-b", "c-f"]
    memo.put(("batch", "b2", (2, 8), "a", "a"), "c2", "l", Counter())
    assert all(memo.get(("batch", "b1", (2, 8), "a", s)) is None for s in ("a", "b", "f"))
    assert memo.get(("batch", "b2", (2, 8), "a", "a"))[0] == "c2" and memo.get(("prefix", (1, 2), (2,), "a"))[0] == "pa"


def test_phase_sync_on_the_cpu_syncs_nothing(monkeypatch):
    """PQ2VERIFY_PHASE_SYNC=1 synchronizes a CUDA device only; on the CPU a run goes as usual."""
    monkeypatch.setenv("PQ2VERIFY_PHASE_SYNC", "1")
    res, g = _run(_LM(), [10, 12])
    assert g._sync is None and res[12].tokens == _greedy(PREFIX + QUESTIONS[12], 8)


# --- execute.py: ledger totals and the run summary ---------------------------------------------

def test_totals_add_the_prefix_and_every_batch():
    ledger = {"prefix": {"calls": [["mmq", 40, 2]], "followers": {"f": [["mmq", 40, 2]]}, "seconds": 1.0,
                         "phases": {"prefix": 0.5}, "copied": 0},
              "batches": {"0,1": {"calls": [["mmq", 40, 3], ["int_gemv", 2, 5]], "tokens": 10, "seconds": 2.0,
                                  "followers": {"f": [["mmq", 40, 1], ["gemv", 2, 5]]},
                                  "phases": {"prefill": 0.25, "decode": 1.0}, "copied": 3},
                          "2": {"calls": [["int_gemv", 1, 4], ["int_gemv", 2, 1]], "tokens": 5, "seconds": 0.5,
                                "followers": {"f": [["gemv", 2, 1]], "b": [["gemv", 1, 4]]},
                                "phases": {"decode": 0.5}, "copied": 1}}}
    t = execute.totals(ledger)
    assert t["calls"] == Counter({("mmq", 40): 5, ("int_gemv", 2): 6, ("int_gemv", 1): 4})
    assert t["follower_calls"] == {"f": Counter({("mmq", 40): 3, ("gemv", 2): 6}), "b": Counter({("gemv", 1): 4})}
    assert (t["tokens"], t["seconds"], t["copied"]) == (15, 3.5, 4)
    assert t["phases"] == Counter({"prefix": 0.5, "prefill": 0.25, "decode": 1.5})
    ledger["batches"]["3"] = {"calls": [["gemv", 1, 2]], "seconds": 0.25}    # an older entry: no tokens, copies
    t = execute.totals(ledger)
    assert (t["tokens"], t["seconds"], t["copied"], t["calls"][("gemv", 1)]) == (15, 3.75, 4, 2)
    ledger["prefix"] = None                                   # a run not started yet
    del ledger["batches"]["3"]
    assert execute.totals(ledger)["calls"] == Counter({("mmq", 40): 3, ("int_gemv", 2): 6, ("int_gemv", 1): 4})


@pytest.mark.parametrize("ms,want", [
    ([7], "7"), ([1, 2, 3], "1-3"), ([1, 2, 3, 5, 7, 8], "1-3, 5, 7-8"), ([16, 1, 2], "1-2, 16"),
    ([1, 3, 5, 7, 9, 11, 13, 15], "1, 3, 5, 7, 9, 11, 13, 15"),                    # 8 pieces: all
    ([1, 3, 5, 7, 9, 11, 13, 15, 17], "1, 3, 5, 7, …, 13, 15, 17"),                # 9: 4 … 3
    ([1, 2, 4, 6, 8, 10, 12, 14, 16, 17], "1-2, 4, 6, 8, 10, 12, 14, 16-17"),              # 8 pieces
    ([1, 2, 4, 6, 8, 10, 12, 14, 16, 17, 19], "1-2, 4, 6, 8, …, 14, 16-17, 19"),           # 9 pieces
])
def test_ms_seen_are_written_as_compact_ranges(ms, want):
    assert execute._ranges(Counter({m: 1 for m in ms})) == want


@pytest.mark.parametrize("fold,want", [((), None), (((2, 16),), "2-16"), (((5, 5),), "5"), (((17, None),), "17+"),
                                       (((1, 1), (3, 16), (40, None)), "1, 3-16, 40+")])
def test_fold_ranges_are_written_as_the_report_says_them(fold, want):
    assert execute._text_ranges(fold) == want


def test_calls_by_path_and_by_path_and_m():
    c = Counter({("gemv", 1): 4, ("small_mma", 2): 3, ("small_mma", 5): 1, ("mmq", 40): 2})
    assert execute._by_path(c) == Counter({"gemv": 4, "small_mma": 4, "mmq": 2})
    assert execute._by_path_m(c) == {"gemv": {1: 4}, "small_mma": {2: 3, 5: 1}, "mmq": {40: 2}}


def test_todo_is_the_batches_without_an_entry_or_with_a_question_missing():
    ledger = {"batches": {"0,1": {}, "2,3": {}}}
    rd = SimpleNamespace(done={0: {}, 1: {}, 2: {}}, read_json=lambda name, default: ledger)
    assert execute.todo(rd, [[0, 1], [2, 3], [4]]) == [[2, 3], [4]]       # 3 missing; [4] has no entry


def test_configured_sets_and_restores_the_counter_and_the_fold():
    u = mdl.Usage(reverse=((9, 9),))
    keep = u.calls
    conv = SimpleNamespace(usage=u)
    mine = Counter()
    with pytest.raises(RuntimeError):
        with execute.configured(conv, {"set": "legacy", "paths": {}}, [(2, 16)], mine):
            assert u.calls is mine and u.reverse == ((2, 16),)
            raise RuntimeError("a failing forward")
    assert u.calls is keep and u.reverse == ((9, 9),)


@pytest.mark.parametrize("fold,want", [
    ((), {1: ("int_gemv", False), 16: ("int_gemv", False), 17: ("mmq", False)}),
    (((2, 16),), {1: ("int_gemv", False), 2: ("int_gemv", True), 16: ("int_gemv", True), 17: ("mmq", False)}),
    (((17, None),), {16: ("int_gemv", False), 17: ("mmq", True), 4096: ("mmq", True)}),
])
def test_a_signature_is_the_path_and_the_fold_order_at_m(fold, want):
    """The legacy set: int_gemv for M <= 16, mmq above; reversed where the fold ranges hold M."""
    from pq2verify.gsm8k import runs
    sig = execute.signature(runs.parse_spec("legacy"), fold, "cpu", torch.bfloat16)
    assert {m: sig(m) for m in want} == want


BATCHES = [[10, 11], [12]]
# By hand from _greedy's lengths (10: 2 tokens, 11: 8, 12: 4): the prefix at M 5; batch [10, 11]
# padded to 4: prefill M 8, decode M 2 once then M 1 six times; batch [12]: prefill M 1, decode
# M 1 three times.
CALLS = {1: 10, 2: 1, 5: 1, 8: 1}


def _runner_parts(tmp_path, lm):
    from pq2verify.gsm8k import runs
    conv = SimpleNamespace(model=SimpleNamespace(device="cpu", dtype=torch.bfloat16), usage=mdl.Usage())
    lm.usage = conv.usage

    def new_gen(memo, sig, usage):
        return generate.Generator(lm, _Tok(), max_new_tokens=8, stops=[], top_k=3, eos_ids={EOS}, pad_id=0,
                                  memo=memo, sig=sig, usage=usage)
    tok_ids = {q: PREFIX + QUESTIONS[q] for q in QUESTIONS}
    prompts = {q: f"question {q}" for q in QUESTIONS}
    golds = {q: "1" for q in QUESTIONS}
    spec = runs.parse_spec("legacy")
    rd = lambda label: runs.RunDir(tmp_path, label, {"label": label})
    return conv, new_gen, tok_ids, prompts, golds, spec, rd


@pytest.mark.parametrize("fold,f_calls", [
    (((1, None),), {1: 10, 2: 1, 5: 1, 8: 1}),      # F's arithmetic differs at every M: all its own
    (((6, None),), {1: 9, 2: 1, 8: 1}),             # same at M 5 and 1: the prefix and [12]'s prefill copied
])
def test_a_runs_ledger_counts_each_call_once_and_its_followers_own_calls(tmp_path, fold, f_calls):
    from pq2verify.gsm8k import runs
    from pq2verify.gsm8k.execute import Run
    lm = _LM()
    conv, new_gen, tok_ids, prompts, golds, spec, rd = _runner_parts(tmp_path, lm)
    run = Run("a", spec, followers=(Run("f", spec, fold=fold),))
    d = rd("a")
    r = execute.execute(run, d, new_gen, conv, BATCHES, tok_ids, prompts, golds, len(PREFIX))
    assert r["m_calls"] == {"lm": CALLS} and r["trace"] == {"lm": 13} and r["m_seen"] == {"lm": "1-2, 5, 8"}
    assert r["teacher_m_calls"] == {"f": {"lm": f_calls}} and r["teacher_trace"] == {"f": {"lm": sum(f_calls.values())}}
    assert r["tokens"] == 14 and r["summary"]["tokens"] == 14 and r["fold_reversed_m"] is None
    assert sorted(r["recs"]) == [10, 11, 12] and r["recs"][11]["tokens"] == _greedy(tok_ids[11], 8)
    assert set(lm.folds) == {(), fold}                       # the follower's forwards ran in its fold order
    ledger = d.read_json(execute.LEDGER)
    assert ledger["prefix"]["calls"] == [["lm", 5, 1]]
    assert ledger["batches"]["10,11"]["calls"] == [["lm", 1, 6], ["lm", 2, 1], ["lm", 8, 1]]
    assert ledger["batches"]["12"]["calls"] == [["lm", 1, 4]]
    assert [ledger["batches"][k]["tokens"] for k in ("10,11", "12")] == [10, 4]
    again = execute.execute(run, runs.RunDir(tmp_path, "a", {"label": "a"}), new_gen, conv, BATCHES, tok_ids,
                            prompts, golds, len(PREFIX))
    assert again["m_calls"] == r["m_calls"] and again["resumed_from_earlier"] == 3   # nothing redone


def test_runs_of_one_process_copy_every_prefill_with_the_same_arithmetic(tmp_path):
    """A and A2 (the same spec) batch by batch: A2 copies the prefix and both batch prefills (3
    calls), computes its decode steps, and its totals are A's; F (fold reversed from M 6) copies
    only the prefills at M <= 5: the prefix (M 5) and [12]'s prefill (M 1)."""
    from pq2verify.gsm8k.execute import Run
    lm = _LM()
    conv, new_gen, tok_ids, prompts, golds, spec, rd = _runner_parts(tmp_path, lm)
    runs_ = [(Run("a", spec), rd("a")), (Run("a2", spec, replica=1), rd("a2")),
             (Run("f", spec, fold=((6, None),)), rd("f"))]
    # a first batch of one question (--batch-size 1 starts so): its prompt gives the prefix
    a, a2, f = execute.execute_all(runs_, new_gen, conv, BATCHES[::-1], tok_ids, prompts, golds, len(PREFIX))
    assert a["copied_calls"] == 0 and a2["copied_calls"] == 3 and f["copied_calls"] == 2
    assert a["m_calls"] == a2["m_calls"] == f["m_calls"] == {"lm": CALLS}
    assert f["fold_reversed_m"] == "6+"
    assert len(lm.log) == 3 * 13 - 3 - 2                                     # forwards computed


def test_run_phases_are_each_batchs_own(tmp_path, monkeypatch):
    """A clock that advances 1 s per reading: every timed forward takes 1 s. The prefix prefill
    (1), two batch prefills (2) and ten decode forwards (7 + 3) are counted once in the totals."""
    from pq2verify.gsm8k.execute import Run
    clock = iter(range(10 ** 6))
    monkeypatch.setattr(generate, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    lm = _LM()
    conv, new_gen, tok_ids, prompts, golds, spec, rd = _runner_parts(tmp_path, lm)
    r = execute.execute(Run("a", spec), rd("a"), new_gen, conv, BATCHES, tok_ids, prompts, golds, len(PREFIX))
    assert {k: v for k, v in r["phases"].items() if k != "host"} == {"prefix": 1.0, "prefill": 2.0, "decode": 10.0}


def test_a_stop_completed_by_the_rest_of_a_character_is_seen():
    """Byte tokens: "x", then the two bytes of "é" (the first one shows as U+FFFD until the second
    comes). With the stop "xé" the row stops at the second byte, as decoding everything says."""
    pieces = {0: b"x", 1: b"\xc3", 2: b"\xa9"}
    decode = lambda ids: b"".join(pieces[t] for t in ids).decode("utf-8", errors="replace")
    g = generate.Generator.__new__(generate.Generator)
    g.stops, g.eos = ["x\u00e9"], set()
    row = generate._Text(decode)
    seen = []
    for t in (0, 1, 2):
        before = len(row.text) + len(row.pending)
        row.add(t)
        seen.append(("x\u00e9" in decode(row.ids), g._stopped(row, before)))
    assert seen == [(False, False), (False, False), (True, True)]


@pytest.mark.parametrize("pieces,stops", [
    (["a", "b", "c", "d"], ["bcd", "z"]),          # the longest stop reaches back 2 characters
    (["a", "<stop>"], ["<stop>"]),                 # one token brings a whole stop after 1 character
    (["ab", "c", "<sto", "p>"], ["c<stop>"]),
])
def test_a_row_stops_at_the_token_that_completes_a_stop(pieces, stops):
    """Each step checks only the text's tail; a stop is still seen whatever its length and however
    the tokens cut it: _stopped says so at exactly the step whose full decode first holds it."""
    decode = lambda ids: "".join(pieces[t] for t in ids)
    g = generate.Generator.__new__(generate.Generator)
    g.stops, g.eos = stops, set()
    row = generate._Text(decode)
    got, want = [], []
    for t in range(len(pieces)):
        before = len(row.text) + len(row.pending)
        row.add(t)
        got.append(g._stopped(row, before))
        want.append(any(s in decode(row.ids) for s in stops))
    assert got == want and want[-1] and not any(want[:-1])
