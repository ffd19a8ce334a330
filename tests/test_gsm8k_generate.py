"""The generator on the tiny random model: incremental text, exact top-k log-probabilities, the
decode M of every step, and teacher-forced followers in lockstep."""
import contextlib
import functools
import math
import random

import pytest
import torch

from test_gsm8k_cli import tiny_model  # noqa: F401  (the module-scoped fixture)

pytest.importorskip("transformers")


@pytest.fixture
def conv(tiny_model, monkeypatch):  # noqa: F811
    from kernels import backend, emulation
    from pq2verify.gsm8k import model as mdl
    monkeypatch.setattr(backend, "_cpu_backend", "emulate")
    monkeypatch.setattr(emulation, "_GEMM", "fp32")        # same integers as oneDNN's, faster here
    monkeypatch.setenv("PQ2_KERNELS", "legacy")
    return mdl.prepare(str(tiny_model), 2, "cpu")


def _prompts(tok, ids):
    from pq2verify.gsm8k import data
    test, train, _ = data.load()
    return {i: tok(data.build_prompt(tok, test[i]["question"], train[:1])[0], add_special_tokens=False).input_ids
            for i in ids}


def _generate(conv, ids, *, max_new=8, followers=(), stops=("\nQuestion:",), eos=None):
    from pq2verify.gsm8k import generate
    ps = _prompts(conv.tokenizer, ids)
    g = generate.Generator(conv.model, conv.tokenizer, max_new_tokens=max_new, stops=list(stops), top_k=4,
                           eos_ids=eos)
    prefix = ps[ids[0]][:generate.common_prefix(list(ps.values()))]
    g.set_prefix(prefix, list(followers)) if followers else g.set_prefix(prefix)
    out = {}
    g.run_batch([generate.Request(i, ps[i]) for i in ids], lambda r: out.__setitem__(r.qid, r))
    return out


def _old_cut(tok, stops, eos, tokens):
    """The previous generator's rule, decoding the whole generation at every step."""
    text = tok.decode(tokens, skip_special_tokens=False)
    hits = [(text.find(s), s) for s in stops if text.find(s) >= 0]
    if hits:
        i, s = min(hits)
        return text[:i], f"stop:{s}"
    if tokens and tokens[-1] in eos:
        return tok.decode(tokens[:-1], skip_special_tokens=False), "eos"
    return text, None


def test_incremental_text_stops_where_the_full_decode_does(tiny_model):  # noqa: F811
    """Random token streams (multi-byte characters split over byte tokens included): the step
    at which a row stops, its reason and its text are those of decoding everything each step,
    while the tokens decoded per step stay bounded (the old rule decoded n tokens at step n)."""
    from transformers import AutoTokenizer
    from pq2verify.gsm8k import generate
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    stops, eos = ["\nQuestion:", "<|im_end|>", "ab"], {tok.eos_token_id}
    vocab = len(tok)
    seed = 5
    rng = random.Random(seed)
    g = generate.Generator.__new__(generate.Generator)
    g.tok, g.stops, g.eos = tok, stops, eos
    counted = {"n": 0}

    def decode(ids, **kw):
        counted["n"] += len(ids)
        return tok.decode(ids, **kw)

    for trial in range(40):
        row = generate._Text(lambda ids: decode(ids, skip_special_tokens=False))
        want = None
        for step in range(60):
            t = rng.randrange(vocab)
            before = len(row.text) + len(row.pending)
            row.add(t)
            old = _old_cut(tok, stops, eos, row.ids)
            if old[1] is not None:
                want = (step, old)
                break
            assert not g._stopped(row, before), f"seed {seed} trial {trial}: stopped early at {step}"
        if want is not None:
            assert g._stopped(row, before), f"seed {seed} trial {trial}: missed the stop at {want[0]}"
            assert g._cut(row.ids) == want[1]
        assert (row.text + row.pending) == tok.decode(row.ids, skip_special_tokens=False) or "\ufffd" in row.pending
    assert counted["n"] < 8 * sum(1 for _ in range(40)) * 60        # linear, not quadratic


def test_topk_logprobs_are_the_float32_values(conv):
    """Stored unrounded: equal to the log-softmax of the logits that produced them."""
    seen = []
    real = conv.model.forward

    @functools.wraps(real)                        # keeps the signature (the cache argument's name)
    def spy(*a, **k):
        out = real(*a, **k)
        seen.append(torch.log_softmax(out.logits[:, -1].float(), dim=-1))
        return out
    conv.model.forward = spy
    try:
        res = _generate(conv, [3], max_new=3)[3]
    finally:
        del conv.model.forward
    for step, top in enumerate(res.topk):
        for t, v in top:
            assert v == seen[step + 1][0, t].item()       # seen[0]: the shared-prefix prefill
    assert any(round(v, 6) != v for top in res.topk for _, v in top)


def test_decode_m_follows_the_rows_still_generating(conv, monkeypatch):
    """Each step's M is the number of rows still generating: rows made to stop after 2, 5 and
    3 tokens give decode Ms 3 | 3, 2, 1, 1 | 3, 2 (steps 1.. of each row; step 0 is the prefill)."""
    from pq2verify.gsm8k import generate
    free = _generate(conv, [0, 7, 12], max_new=6, eos=set())
    assert all(r.decode_m == [[3, 5]] for r in free.values())         # 3 rows, 5 decode steps each
    rows, length = [], {0: 2, 1: 5, 2: 3}                               # by row (request order)
    real_init = generate._Text.__init__

    def init(self, decode):
        real_init(self, decode)
        rows.append(self)
    monkeypatch.setattr(generate._Text, "__init__", init)
    monkeypatch.setattr(generate.Generator, "_stopped", lambda self, row, before: len(row.ids) >= length[rows.index(row)])
    monkeypatch.setattr(generate.Generator, "_cut", lambda self, tokens: ("", "stop:test"))
    res = _generate(conv, [0, 7, 12], max_new=6, eos=set())
    assert [len(res[q].tokens) for q in (0, 7, 12)] == [2, 5, 3]
    assert res[0].decode_m == [[3, 1]] and res[7].decode_m == [[3, 1], [2, 1], [1, 2]]
    assert res[12].decode_m == [[3, 1], [2, 1]]
    for q in res:
        assert res[q].tokens == free[q].tokens[:len(res[q].tokens)]


@contextlib.contextmanager
def _head_bias(model, token, delta):
    """A follower whose logits are the leader's plus delta on one token."""
    head = model.get_output_embeddings()
    b = torch.zeros(head.weight.shape[0])
    b[token] = delta
    head.bias = torch.nn.Parameter(b, requires_grad=False)
    try:
        yield
    finally:
        head.bias = None


def test_followers_are_fed_the_leaders_tokens(conv):
    from pq2verify.gsm8k import generate
    free = _generate(conv, [0, 7, 12], max_new=6)
    tok = free[0].topk[2][1][0]                   # the leader's runner-up at one step, pushed to the top
    delta = 20.0
    same = generate.Follower("same", contextlib.nullcontext)
    biased = generate.Follower("biased", lambda: _head_bias(conv.model, tok, delta))
    res = _generate(conv, [0, 7, 12], max_new=6, followers=[same, biased])
    for q, r in res.items():
        assert r.tokens == free[q].tokens and r.topk == free[q].topk      # the leader is unchanged
        t0, t1 = r.teacher["same"], r.teacher["biased"]
        n = len(r.tokens)
        assert len(t0["kl"]) == len(t1["kl"]) == n
        assert t0["kl"] == [0.0] * n and all(t0["top1"])
        assert t0["lpk"] == [[v for _, v in top] for top in r.topk]
        for s, top in enumerate(r.topk):
            p_tok = next((math.exp(v) for t, v in top if t == tok), None)
            if p_tok is None:
                continue
            shift = math.log1p(p_tok * (math.exp(delta) - 1))      # the follower's log-normalizer moves by this
            for (t, v), lf in zip(top, t1["lpk"][s]):
                assert lf == pytest.approx(v + (delta if t == tok else 0.0) - shift, abs=1e-4)
            assert t1["kl"][s] > 0
    assert any(not x for r in res.values() for x in r.teacher["biased"]["top1"])   # argmax moved, still fed A's


def test_each_step_decodes_a_few_tokens_not_the_whole_generation(conv, monkeypatch):
    """Tokens passed to decode over a whole generation grow linearly with its length."""
    tok = conv.tokenizer
    real = tok.decode
    counted = {"n": 0}

    def decode(ids, **kw):
        counted["n"] += len(ids)
        return real(ids, **kw)
    monkeypatch.setattr(tok, "decode", decode)
    res = _generate(conv, [0, 7, 12], max_new=40, stops=(), eos=set())
    n = sum(len(r.tokens) for r in res.values())
    assert n == 120 and counted["n"] <= 6 * n, f"{counted['n']} tokens decoded for {n} generated"


def test_a_prefill_the_follower_shares_is_copied_not_computed(conv):
    """same(M) true at the prefill Ms only: step 0 (the prefill's logits) is the leader's even
    though this follower's own forwards would differ; later steps are computed under it."""
    from pq2verify.gsm8k import generate
    tok = _generate(conv, [0, 7], max_new=4)[0].topk[1][1][0]
    f = generate.Follower("f", lambda: _head_bias(conv.model, tok, 20.0), same=lambda m: m > 2)
    res = _generate(conv, [0, 7], max_new=4, followers=[f])
    for r in res.values():
        kl = r.teacher["f"]["kl"]
        assert kl[0] == 0.0 and all(k > 0 for k in kl[1:]), kl
