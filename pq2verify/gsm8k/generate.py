"""Batched greedy generation with a KV cache, left padding and stop sequences.

Speed without changing any row's function:
- The few-shot prefix that all prompts share is prefilled once (batch 1, M = prefix length,
  a prefill path) and its KV cache copied into each batch; each batch then prefills only the
  questions, left padded *after* the prefix ([prefix][pad..][question]) with explicit position
  ids, which is the same function as one unpadded prompt per row.
- A row that stops leaves the batch (its cache rows are dropped), so decode M shrinks from
  the batch size to 1: the decode paths for M in 2..16 and M = 1 all get exercised.
Greedy: argmax of the FP32 logits (ties go to the lowest token id, torch.argmax's rule).
"""
import copy
import time
from dataclasses import dataclass, field

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
    def __init__(self, model, tokenizer, *, max_new_tokens: int, stops: list[str], top_k: int = 5,
                 eos_ids=None, pad_id=None):
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
        self.tokens_out = 0
        self.seconds = 0.0
        self._kw = _cache_kw(model)

    @torch.no_grad()
    def set_prefix(self, prefix: list[int]) -> None:
        self.prefix = list(prefix)
        self._prefix_cache = None
        if prefix:
            cache = _new_cache(self.model)
            ids = torch.tensor([prefix], device=self.device)
            self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._kw: cache})
            self._prefix_cache = cache

    def _cut(self, tokens: list[int]):
        """(text, stop reason or None) with the text cut at the first stop sequence."""
        text = self.tok.decode(tokens, skip_special_tokens=False)
        best = None
        for s in self.stops:
            i = text.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            return text[:best[0]], f"stop:{best[1]}"
        if tokens and tokens[-1] in self.eos:
            return self.tok.decode(tokens[:-1], skip_special_tokens=False), "eos"
        return text, None

    @torch.no_grad()
    def run_batch(self, reqs: list[Request], on_done) -> None:
        """Generate every request of the batch; on_done(Result) as soon as each one stops."""
        t0 = time.perf_counter()
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
        if self._prefix_cache is not None:
            cache = copy.deepcopy(self._prefix_cache)
            if B > 1:
                cache.batch_repeat_interleave(B)
        else:
            cache = _new_cache(self.model)
        dev = self.device
        mask, nxt_pos = mask.to(dev), pos[:, -1].to(dev) + 1
        out = self.model(input_ids=ids.to(dev), attention_mask=mask, position_ids=pos.to(dev),
                         use_cache=True, logits_to_keep=1, **{self._kw: cache})
        alive = list(range(B))                  # request index of each cache row
        gen = [[] for _ in reqs]
        tops = [[] for _ in reqs]
        while True:
            logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            nxt = torch.argmax(logp, dim=-1)
            k = min(self.top_k, logp.shape[-1])
            tv, ti = torch.topk(logp, k, dim=-1)
            nxt_l, tv_l, ti_l = nxt.tolist(), tv.cpu().tolist(), ti.cpu().tolist()
            keep = []
            for row, ri in enumerate(alive):
                tok = nxt_l[row]
                gen[ri].append(tok)
                tops[ri].append([[t, round(v, 6)] for t, v in zip(ti_l[row], tv_l[row])])
                self.tokens_out += 1
                text, why = self._cut(gen[ri])
                if why is None and len(gen[ri]) >= self.max_new:
                    why = "length"
                if why is None:
                    keep.append(row)
                else:
                    on_done(Result(reqs[ri].qid, gen[ri], text, why, tops[ri]))
            if not keep:
                break
            if len(keep) < len(alive):
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                mask, nxt, nxt_pos = mask[sel], nxt[sel], nxt_pos[sel]
                alive = [alive[r] for r in keep]
            mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
            out = self.model(input_ids=nxt.view(-1, 1), attention_mask=mask, position_ids=nxt_pos.view(-1, 1),
                             use_cache=True, logits_to_keep=1, **{self._kw: cache})
            nxt_pos = nxt_pos + 1
        self.seconds += time.perf_counter() - t0
