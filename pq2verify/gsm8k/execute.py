"""One run of the A/B: generate the questions of its batches not yet done, with its teacher-forced
followers in lockstep, and keep a ledger of what each batch cost.

The ledger (ledger.json, replaced atomically after every batch) has one entry per finished
batch (its calls per path and M, tokens, seconds; its followers' calls) and one for the shared
prefix. A batch counts once, when its entry is written: a session killed inside a batch leaves
no entry for it, and the resumed session replays exactly the batches without one (the same
batch, hence the same M and the same bits; its already written questions are not appended
again) and writes their entries. The shared prefix is prefilled again by every session, and its
entry is replaced, not added to. So a resumed run's totals equal an uninterrupted run's.
"""
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

LEDGER = "ledger.json"


@dataclass(frozen=True)
class Run:
    """label: a, b, f (the noise floor), a2 (the A/A control). fold: M ranges whose calls fold
    the K groups in reverse order (model.Usage.reverse). followers: runs scored teacher-forced on
    this run's tokens, in lockstep."""
    label: str
    spec: dict
    replica: int = 0
    fold: tuple = ()
    followers: tuple = field(default=())


def batch_key(batch: list[int]) -> str:
    return ",".join(map(str, batch))


@contextmanager
def configured(conv, spec: dict, fold: tuple, calls: Counter):
    """The model runs under a kernel spec and a fold order, counting its calls into `calls`."""
    from .runs import EnvSwitch, spec_env
    u = conv.usage
    saved = u.calls, u.reverse
    u.calls, u.reverse = calls, tuple(fold)
    try:
        with EnvSwitch(spec_env(spec)):
            yield
    finally:
        u.calls, u.reverse = saved


def _same_arithmetic(conv, leader: Run, follower: Run):
    """M -> whether the follower's calls at M take the leader's path in the leader's fold order."""
    import torch
    from .. import dispatch
    from ..weights import PQ2Weight
    from .runs import EnvSwitch, spec_env
    dev, dtype = conv.model.device, conv.model.dtype
    w = PQ2Weight.from_prepared(torch.zeros(128 // 4 + 2, dtype=torch.uint8), 1, 128).to(dev)

    def path(spec, m):
        with EnvSwitch(spec_env(spec)):
            return dispatch.resolve(m, w, torch.empty(m, 128, dtype=dtype, device=dev), dispatch.kernel_set()).name

    def same(m: int) -> bool:
        u = type(conv.usage)
        return (path(leader.spec, m) == path(follower.spec, m)
                and u(reverse=leader.fold).reverses(m) == u(reverse=follower.fold).reverses(m))
    return same


def _pairs(c: Counter) -> list:
    return [[name, m, n] for (name, m), n in sorted(c.items())]


def todo(rd, batches) -> list:
    """Batches without a ledger entry, or with a question missing from generations.jsonl."""
    done = rd.read_json(LEDGER, {"batches": {}})["batches"]
    return [b for b in batches if batch_key(b) not in done or any(q not in rd.done for q in b)]


def totals(ledger: dict) -> dict:
    """calls per (path, M), tokens and seconds: the prefix entry plus every batch entry."""
    calls, fcalls = Counter(), {}
    entries = ([ledger["prefix"]] if ledger.get("prefix") else []) + list(ledger["batches"].values())
    for e in entries:
        for name, m, n in e["calls"]:
            calls[(name, m)] += n
        for f, pairs in e.get("followers", {}).items():
            for name, m, n in pairs:
                fcalls.setdefault(f, Counter())[(name, m)] += n
    return {"calls": calls, "follower_calls": fcalls, "tokens": sum(e.get("tokens", 0) for e in entries),
            "seconds": sum(e["seconds"] for e in entries)}


def execute(run: Run, rd, gen, conv, batches, tok_ids, prompts, golds, prefix_len) -> dict:
    """Generate what the run lacks; return its records, trace and totals."""
    from . import data, extract, generate
    from .report import summarize
    from .runs import spec_text

    left = todo(rd, batches)
    pre = len(rd.done)
    n_left = sum(1 for b in left for q in b if q not in rd.done)
    ledger = rd.read_json(LEDGER, {"prefix": None, "batches": {}})
    tokens0 = gen.tokens_out
    t0 = time.perf_counter()
    bar = _bar(n_left, f"{run.label} {spec_text(run.spec)}")

    def done(res: generate.Result):
        sc = extract.score(res.text, golds[res.qid])
        rec = {"id": res.qid, "prompt_hash": data.prompt_hash(prompts[res.qid]), "tokens": res.tokens,
               "text": res.text, "stop": res.stop, "gold": golds[res.qid], **sc, "topk": res.topk,
               "decode_m": res.decode_m}
        if res.teacher:
            rec["teacher"] = res.teacher
        if rd.append(rec):
            bar.update(1)
            bar.set_postfix_str(f"{(gen.tokens_out - tokens0) / max(time.perf_counter() - t0, 1e-9):.1f} tok/s")

    calls = Counter()
    fcalls = {f.label: Counter() for f in run.followers}
    followers = [generate.Follower(f.label, lambda f=f: configured(conv, f.spec, f.fold, fcalls[f.label]),
                                   same=_same_arithmetic(conv, run, f)) for f in run.followers]
    with configured(conv, run.spec, run.fold, calls):
        if left:
            s0 = time.perf_counter()
            gen.set_prefix(tok_ids[left[0][0]][:prefix_len], followers)
            ledger["prefix"] = {"calls": _pairs(calls), "seconds": time.perf_counter() - s0,
                                "followers": {k: _pairs(v) for k, v in fcalls.items()}}
        for b in left:
            calls.clear()
            for c in fcalls.values():
                c.clear()
            secs, toks = gen.seconds, gen.tokens_out
            gen.run_batch([generate.Request(q, tok_ids[q]) for q in b], done)
            ledger["batches"][batch_key(b)] = {
                "calls": _pairs(calls), "tokens": gen.tokens_out - toks, "seconds": gen.seconds - secs,
                "followers": {k: _pairs(v) for k, v in fcalls.items()}}
            rd.write_json(LEDGER, ledger)      # after the batch's questions: a crash between replays it
    bar.close()
    tot = totals(ledger)
    recs = {q: rd.done[q] for b in batches for q in b if q in rd.done}
    paths = Counter()
    m_seen = {}
    for (name, m), n in tot["calls"].items():
        paths[name] += n
        m_seen.setdefault(name, Counter())[m] += n
    secs, toks = tot["seconds"], tot["tokens"]
    return {"label": run.label, "spec": spec_text(run.spec), "fold_reversed_m": _text_ranges(run.fold),
            "dir": str(rd.path), "recs": recs, "summary": summarize(recs), "trace": dict(paths),
            "m_seen": {k: _ranges(v) for k, v in sorted(m_seen.items())},
            "m_calls": {k: dict(sorted(v.items())) for k, v in sorted(m_seen.items())},
            "teacher_trace": {f: dict(sorted(_by_path(c).items())) for f, c in tot["follower_calls"].items()},
            "seconds": round(secs, 2), "tokens": toks, "tok_per_s": round(toks / secs, 2) if secs else None,
            "resumed_from_earlier": pre}


def _by_path(c: Counter) -> Counter:
    out = Counter()
    for (name, _), n in c.items():
        out[name] += n
    return out


def _text_ranges(fold: tuple) -> str | None:
    if not fold:
        return None
    return ", ".join(f"{lo}+" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}") for lo, hi in fold)


def _ranges(c: Counter) -> str:
    """Ms seen as compact ranges: '1-16, 207, 1040-1712'."""
    ms = sorted(c)
    out, i = [], 0
    while i < len(ms):
        j = i
        while j + 1 < len(ms) and ms[j + 1] == ms[j] + 1:
            j += 1
        out.append(str(ms[i]) if i == j else f"{ms[i]}-{ms[j]}")
        i = j + 1
    if len(out) > 8:
        out = out[:4] + ["…"] + out[-3:]
    return ", ".join(out)


def _bar(total, desc):
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="q", file=sys.stderr, dynamic_ncols=True,
                    position=int(os.environ.get("PQ2VERIFY_BAR_POSITION", "0")))
    except ImportError:
        class _No:
            def update(self, n): pass
            def set_postfix_str(self, s): pass
            def close(self): pass
        return _No()
