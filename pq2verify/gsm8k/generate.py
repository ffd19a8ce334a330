"""Batched greedy generation with a KV cache, left padding and stop sequences.

Speed without changing any row's function:
- The few-shot prefix that all prompts share is prefilled once (batch 1, M = prefix length,
  a prefill path) and its KV cache copied into each batch; each batch then prefills only the
  questions, left padded *after* the prefix ([prefix][pad..][question]) with explicit position
  ids, which is the same function as one unpadded prompt per row.
- A row that stops leaves the batch (its cache rows are dropped), so decode M shrinks from
  the batch size to 1: the decode paths for M in 2..16 and M = 1 all get exercised. A row's
  decode M therefore depends on when its batch-mates stop; each result records its Ms
  (`decode_m`) so that a comparison can tell a kernel difference from a batch-mate's.
- Text is decoded incrementally (a few tokens per step, not the whole generation).
- Runs of one session share prefills through a PrefillMemo: a prefill is computed once and
  copied by every run (or follower) whose projections at that M take the same path in the same
  fold order (`sig`), which is bit for bit what it would compute; the copier's call counter gets
  the calls that made it, so its trace reads as if it had computed them.
Phase seconds (Generator.phases): prefix, prefill, decode, teacher:<name>, host (sampling, text,
bookkeeping). PQ2VERIFY_PHASE_SYNC=1 synchronizes the GPU after each forward so that they are
exact there (else a forward's time may show up in the next phase that waits for the GPU).
Greedy: argmax of the FP32 logits (ties go to the lowest token id, torch.argmax's rule).
Top-k log-probabilities are kept as the float32 values themselves (exact in JSON), so two
runs' first numeric difference is found however small.

Teacher forcing (followers): other kernel configurations run in lockstep with the generating
one, each with its own KV cache, fed the leader's tokens, on the same rows and so at the same
M every step. Per step and row they record KL(leader || follower) over the whole vocabulary,
whether their argmax is the leader's token, and their log-probabilities of the leader's top-k.
"""
import copy
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import torch


@dataclass
class Request:
    qid: int
    ids: list[int]


@dataclass
class Result:
    qid: int
    tokens: list[int]
    text: str
    stop: str                      # "eos" | "stop:<seq>" | "length"
    topk: list = field(default_factory=list)    # per step [[token, logprob], ...] best first
    decode_m: list = field(default_factory=list)  # [[M, steps], ...]: the M of each decode step
    teacher: dict = field(default_factory=dict)   # follower name -> {"kl", "top1", "lpk"} per step


@dataclass
class Follower:
    """A configuration scored on the leader's tokens; switch() -> the context of its forwards.
    same(M): whether its projections at M run the leader's path in the leader's fold order; a
    prefill whose every call does is bit for bit the leader's, so its cache and logits are
    copied instead of computed again (the prefills are most of a CPU run's time)."""
    name: str
    switch: Callable[[], Any]
    same: Callable[[int], bool] = lambda m: False
    sig: Callable[[int], Any] | None = None      # its arithmetic at M, for the PrefillMemo
    prefix_cache: Any = None
    shared_prefix: bool = False


class PrefillMemo:
    """Prefills shared by the runs of one session, keyed by the tokens and the arithmetic (sig)
    of every call that made them. Holds each prefix and the latest batch's prefills only."""

    def __init__(self):
        self.entries: dict = {}
        self.batch = None
        self.copied = Counter()        # calls copied instead of computed, per (path, M)

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, cache, logits, calls: Counter) -> None:
        if key[0] == "batch" and key[1] != self.batch:   # a new batch: drop the previous one's
            self.entries = {k: v for k, v in self.entries.items() if k[0] != "batch"}
            self.batch = key[1]
        self.entries[key] = (copy.deepcopy(cache), logits, Counter(calls))


def _rle(ms: list[int]) -> list[list[int]]:
    out = []
    for m in ms:
        if out and out[-1][0] == m:
            out[-1][1] += 1
        else:
            out.append([m, 1])
    return out


class _Text:
    """Incremental detokenization of one row (vLLM's prefix/read offsets): the text that the
    newest tokens add is decode(ids[prefix:]) minus decode(ids[prefix:read]), a few tokens each
    step; a tail ending in U+FFFD (an unfinished UTF-8 sequence) waits for the next token."""

    def __init__(self, decode):
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""              # settled text
        self.pending = ""           # text of the tail that is not settled yet
        self.prefix = self.read = 0

    def add(self, t: int) -> str:
        """Append a token; the text so far (settled + pending)."""
        self.ids.append(t)
        head = self.decode(self.ids[self.prefix:self.read])
        full = self.decode(self.ids[self.prefix:])
        new = full[len(head):]
        if new and not new.endswith("\ufffd"):
            self.text += new
            self.pending = ""
            self.prefix, self.read = self.read, len(self.ids)
        else:
            self.pending = new
        return self.text + self.pending


def common_prefix(seqs: list[list[int]]) -> int:
    """Length of the longest token prefix shared by all, leaving each at least one token."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for i in range(max(n, 0)):
        t = first[i]
        if any(s[i] != t for s in seqs):
            return i
    return max(n, 0)


def _cache_kw(model) -> str:
    """The forward argument that takes the KV cache: `cache` in newer transformers,
    `past_key_values` before (deprecated there, to be removed)."""
    import inspect
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


class Generator:
    """memo, sig, usage: share prefills with other runs (PrefillMemo; sig(M) this run's arithmetic
    at M; usage the model's call counter, model.Usage); without them every prefill is computed."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int, stops: list[str], top_k: int = 5,
                 eos_ids=None, pad_id=None, memo: PrefillMemo | None = None, sig=None, usage=None):
        self.model, self.tok = model, tokenizer
        self.max_new = max_new_tokens
        self.stops = list(stops)
        self.top_k = top_k
        eos = eos_ids if eos_ids is not None else tokenizer.eos_token_id
        self.eos = set([eos] if isinstance(eos, int) else (eos or []))
        self.pad = pad_id if pad_id is not None else (tokenizer.pad_token_id or next(iter(self.eos), 0))
        self.device = next(model.parameters()).device
        self.prefix: list[int] = []
        self._prefix_cache = None
        self.followers: list[Follower] = []
        self.tokens_out = 0
        self.seconds = 0.0
        self.phases = Counter()
        self.memo, self.sig, self.usage = memo, sig, usage
        self._kw = _cache_kw(model)
        self._sync = (torch.cuda.synchronize if self.device.type == "cuda"
                      and os.environ.get("PQ2VERIFY_PHASE_SYNC") == "1" else None)

    def _timed(self, phase: str, fn):
        t0 = time.perf_counter()
        r = fn()
        if self._sync:
            self._sync()
        self.phases[phase] += time.perf_counter() - t0
        return r

    def _shared(self, key, sig, compute):
        """compute() -> (cache, logits), or a copy of what a run with the same arithmetic (sig at
        every M of the key) computed; its calls are added to the current call counter."""
        if self.memo is None or sig is None or self.usage is None:
            return compute()
        key = key + tuple(sig(m) for m in key[-1])
        hit = self.memo.get(key)
        if hit is not None:
            cache, logits, calls = hit
            self.usage.calls.update(calls)
            self.memo.copied.update(calls)
            return copy.deepcopy(cache), logits
        before = Counter(self.usage.calls)
        cache, logits = compute()
        self.memo.put(key, cache, logits, self.usage.calls - before)
        return cache, logits

    @torch.no_grad()
    def set_prefix(self, prefix: list[int], followers: list[Follower] = ()) -> None:
        """Prefill the prompts' shared prefix once, for the leader and each follower."""
        self.prefix = list(prefix)
        self.followers = list(followers)
        self._prefix_cache = self._timed("prefix", lambda: self._prefill_prefix(self.sig))
        for f in self.followers:
            f.shared_prefix = f.same(len(self.prefix))
            if f.shared_prefix:
                f.prefix_cache = copy.deepcopy(self._prefix_cache)
                continue
            with f.switch():
                f.prefix_cache = self._timed(f"teacher:{f.name}", lambda: self._prefill_prefix(f.sig))

    def _prefill_prefix(self, sig):
        if not self.prefix:
            return None

        def compute():
            cache = _new_cache(self.model)
            ids = torch.tensor([self.prefix], device=self.device)
            self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._kw: cache})
            return cache, None
        return self._shared(("prefix", tuple(self.prefix), (len(self.prefix),)), sig, compute)[0]

    def _decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens, skip_special_tokens=False)

    def _cut(self, tokens: list[int]):
        """(text, stop reason or None) with the text cut at the first stop sequence: the whole
        generation decoded once (used when a row ends)."""
        text = self._decode(tokens)
        best = None
        for s in self.stops:
            i = text.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            return text[:best[0]], f"stop:{best[1]}"
        if tokens and tokens[-1] in self.eos:
            return self._decode(tokens[:-1]), "eos"
        return text, None

    def _stopped(self, row: _Text, before: int) -> bool:
        """Whether the row's newest token ends it: a stop sequence that ends after `before`
        (the text's length one token ago; only the tail is searched), or an EOS token."""
        start = max(0, before - max((len(s) for s in self.stops), default=0))
        n = len(row.text)
        tail = row.text[start:] + row.pending if start < n else row.pending[start - n:]
        return any(s in tail for s in self.stops) or row.ids[-1] in self.eos

    def _batch_cache(self, prefix_cache, b: int):
        if prefix_cache is None:
            return _new_cache(self.model)
        cache = copy.deepcopy(prefix_cache)
        if b > 1:
            cache.batch_repeat_interleave(b)
        return cache

    def _forward(self, ids, mask, pos, cache):
        return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                          logits_to_keep=1, **{self._kw: cache})

    @torch.no_grad()
    def run_batch(self, reqs: list[Request], on_done) -> None:
        """Generate every request of the batch; on_done(Result) as soon as each one stops."""
        t0 = time.perf_counter()
        timed0 = sum(self.phases.values())
        P = len(self.prefix)
        for r in reqs:
            if r.ids[:P] != self.prefix or len(r.ids) <= P:
                raise ValueError(f"question {r.qid}: prompt does not extend the shared prefix")
        suf = [r.ids[P:] for r in reqs]
        B, L = len(reqs), max(len(s) for s in suf)
        ids = torch.full((B, L), self.pad, dtype=torch.long)
        mask = torch.zeros((B, P + L), dtype=torch.long)
        mask[:, :P] = 1
        pos = torch.full((B, L), P, dtype=torch.long)
        for i, s in enumerate(suf):
            ids[i, L - len(s):] = torch.tensor(s)
            mask[i, P + L - len(s):] = 1
            pos[i, L - len(s):] = torch.arange(P, P + len(s))
        dev = self.device
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        nxt_pos = pos[:, -1] + 1
        # the batch's tokens and the Ms of the calls that make its prefill: its memo key
        key = ("batch", (tuple(self.prefix), tuple(tuple(r.ids) for r in reqs)), (P, B * L) if P else (B * L,))

        def prefill(prefix_cache, phase, sig):
            def compute():
                c = self._batch_cache(prefix_cache, B)
                return c, SimpleNamespace(logits=self._forward(ids, mask, pos, c).logits)
            return self._timed(phase, lambda: self._shared(key, sig, compute))
        cache, out = prefill(self._prefix_cache, "prefill", self.sig)
        fol = []                                 # [follower, its cache, its last output]
        for f in self.followers:
            if f.shared_prefix and f.same(B * L):
                fol.append([f, copy.deepcopy(cache), out])
                continue
            with f.switch():
                fol.append([f, *prefill(f.prefix_cache, f"teacher:{f.name}", f.sig)])
        alive = list(range(B))                  # request index of each cache row
        texts = [_Text(self._decode) for _ in reqs]
        tops = [[] for _ in reqs]
        ms = [[] for _ in reqs]
        teach = [{f.name: {"kl": [], "top1": [], "lpk": []} for f in self.followers} for _ in reqs]
        m = None                                # M of the decode forward that gave these logits
        while True:
            logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            nxt = torch.argmax(logp, dim=-1)
            k = min(self.top_k, logp.shape[-1])
            tv, ti = torch.topk(logp, k, dim=-1)
            nxt_l, tv_l, ti_l = nxt.tolist(), tv.cpu().tolist(), ti.cpu().tolist()
            for f, _, fout in fol:
                flp = torch.log_softmax(fout.logits[:, -1].float(), dim=-1)
                kl = (logp.double().exp() * (logp.double() - flp.double())).sum(-1).tolist()
                agree = (torch.argmax(flp, dim=-1) == nxt).tolist()
                lpk = flp.gather(1, ti).cpu().tolist()
                for row, ri in enumerate(alive):
                    t = teach[ri][f.name]
                    t["kl"].append(kl[row])
                    t["top1"].append(bool(agree[row]))
                    t["lpk"].append(lpk[row])
            keep = []
            for row, ri in enumerate(alive):
                row_text = texts[ri]
                before = len(row_text.text) + len(row_text.pending)
                row_text.add(nxt_l[row])
                tops[ri].append([[t, v] for t, v in zip(ti_l[row], tv_l[row])])   # float32 values, exact
                if m is not None:
                    ms[ri].append(m)
                self.tokens_out += 1
                gen = row_text.ids
                why = None
                if self._stopped(row_text, before):
                    text, why = self._cut(gen)
                if why is None and len(gen) >= self.max_new:
                    text, why = self._decode(gen), "length"
                if why is None:
                    keep.append(row)
                else:
                    on_done(Result(reqs[ri].qid, list(gen), text, why, tops[ri], _rle(ms[ri]), teach[ri]))
            if not keep:
                break
            if len(keep) < len(alive):
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                for entry in fol:
                    entry[1].batch_select_indices(sel)
                mask, nxt, nxt_pos = mask[sel], nxt[sel], nxt_pos[sel]
                alive = [alive[r] for r in keep]
            mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
            m = len(alive)
            step = nxt.view(-1, 1), mask, nxt_pos.view(-1, 1)
            out = self._timed("decode", lambda: self._forward(*step, cache))
            for entry in fol:
                with entry[0].switch():
                    entry[2] = self._timed(f"teacher:{entry[0].name}", lambda: self._forward(*step, entry[1]))
            nxt_pos = nxt_pos + 1
        spent = time.perf_counter() - t0
        self.seconds += spent
        self.phases["host"] += spent - (sum(self.phases.values()) - timed0)
