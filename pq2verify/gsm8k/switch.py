"""What an A/B compares: A and B run different paths, and the noise floor F differs from A.

Before the model loads (`predict`, `differences`): each kernel spec is resolved for every class
of call the model can make, on this device and dtype, in the prepared layout the model runs:
every M range of the registry's paths (decode reaches M 1..batch, prefills any length) times
every K fit (the model's K are multiples of 128; a path fits K by its k_multiple). Specs that
resolve alike in every class would compare one configuration with itself: refused (exit 2).

After the runs (`trace_proof`), from the dispatch traces (calls per path and M): B must have
served some M with other paths than A did at that same M, both in its free run (the answers
compared) and teacher-forced at A's Ms (the KL verdict). A trace without one fails the run.

The floor F (`floor_control`) must be a control: its fold order differs from A's (F made
calls at an M whose K groups it reverses, on a model with a matrix of three groups or more:
two partial sums add alike in either order), and at least one of its outputs differs from A's (a
generated token, a recorded log-probability, or a teacher-forced metric). Else the floor is
void, and the verdict says so instead of comparing B against it.
"""
import math
from functools import reduce


def _classes():
    from .. import registry
    cuts = sorted({p.m_min for p in registry.PATHS} | {p.m_max + 1 for p in registry.PATHS if p.m_max} | {1})
    lcm = reduce(lambda a, b: a * b // math.gcd(a, b), {p.k_multiple for p in registry.PATHS}, 128)
    ks = list(range(128, lcm + 1, 128))
    spans = [(lo, cuts[i + 1] - 1 if i + 1 < len(cuts) else None) for i, lo in enumerate(cuts)]
    return ks, spans


def predict(spec: dict, device, dtype) -> dict:
    """(K, (M lo, M hi or None)) -> the path the spec resolves to, for every class of call."""
    import torch
    from kernels import dispatch
    from kernels.format import PQ2Weight
    from .runs import EnvSwitch, spec_env
    ks, spans = _classes()
    out = {}
    with EnvSwitch(spec_env(spec)):
        for k in ks:
            w = PQ2Weight.from_prepared(torch.zeros(k // 4 * 1 + 2 * (k // 128), dtype=torch.uint8), 1, k).to(device)
            for span in spans:
                x = torch.empty(span[0], k, dtype=dtype, device=device)
                out[(k, span)] = dispatch.resolve(span[0], w, x, dispatch.kernel_set()).name
    return out


def _span(s) -> str:
    lo, hi = s
    return f"{lo}+" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}")


def describe(pred: dict) -> str:
    """A prediction as 'M 1 gemv, M 2-16 small_mma, M 17+ mmq_wgmma' (K named if it matters)."""
    ks = {k for k, _ in pred}
    return ", ".join((f"K {k} " if len(ks) > 1 else "") + f"M {_span(s)} {pred[(k, s)]}"
                     for (k, s) in sorted(pred, key=lambda c: (c[0], c[1][0])))


def differences(pred_a: dict, pred_b: dict) -> list[str]:
    """Where two predictions differ, as 'M 2-16: small_mma vs int_gemv' (K named if it matters)."""
    ks = {k for k, _ in pred_a}
    return [(f"K {k} " if len(ks) > 1 else "") + f"M {_span(s)}: {pred_a[(k, s)]} vs {pred_b[(k, s)]}"
            for (k, s) in sorted(pred_a, key=lambda c: (c[0], c[1][0])) if pred_a[(k, s)] != pred_b[(k, s)]]


def by_m(m_calls: dict) -> dict:
    """{path: {M: calls}} -> {M: the set of paths that served M}."""
    out = {}
    for name, ms in m_calls.items():
        for m, n in ms.items():
            if n:
                out.setdefault(int(m), set()).add(name)
    return out


def differing_ms(m_calls_a: dict, m_calls_b: dict) -> list[int]:
    """The Ms both traces hold at which B's paths are not A's."""
    a, b = by_m(m_calls_a), by_m(m_calls_b)
    return sorted(m for m in set(a) & set(b) if a[m] != b[m])


def trace_proof(run_a: dict, run_b: dict, follower: str = "b") -> dict:
    """From the traces: the Ms where B's paths differ from A's, free-running and teacher-forced."""
    free = differing_ms(run_a["m_calls"], run_b["m_calls"])
    tf_calls = (run_a.get("teacher_m_calls") or {}).get(follower)
    teacher = differing_ms(run_a["m_calls"], tf_calls) if tf_calls is not None else None
    errors = []
    if not free:
        errors.append("free runs: at every M both ran, B's paths were A's")
    if teacher is not None and not teacher:
        errors.append("teacher-forced at A's Ms: B's paths were A's at every M")
    return {"ok": not errors, "free_ms": _short(free), "teacher_ms": None if teacher is None else _short(teacher),
            "errors": errors}


def _short(ms: list[int]) -> list[int]:
    return ms if len(ms) <= 12 else ms[:6] + ms[-6:]


def _in(m: int, fold) -> bool:
    return any(m >= lo and (hi is None or m <= hi) for lo, hi in fold)


def _outputs_differ(recs_a: dict, recs_f: dict, follower: str) -> str | None:
    """The first output of F that differs from A's, described; None if every one is equal."""
    for q in sorted(set(recs_a) & set(recs_f)):
        ra, rf = recs_a[q], recs_f[q]
        if ra["tokens"] != rf["tokens"]:
            return f"question {q}: generated tokens differ"
        if ra["topk"] != rf["topk"]:
            return f"question {q}: recorded log-probabilities differ"
    for q in sorted(recs_a):
        ra = recs_a[q]
        t = (ra.get("teacher") or {}).get(follower)
        if t is None:
            continue
        if any(k != 0 for k in t["kl"]) or not all(t["top1"]):
            return f"question {q}: teacher-forced KL or top-1 differs"
        if any(lpk[0] != top[0][1] for lpk, top in zip(t["lpk"], ra["topk"])):
            return f"question {q}: teacher-forced log-probability of A's token differs"
    return None


def floor_control(run_a: dict, run_f: dict, fold, groups: int, recs_a: dict, recs_f: dict,
                  follower: str = "f") -> dict:
    """Is F a control? groups: the most K groups of one matrix in the model (two or fewer: the
    reversed sum is the same). Returns {'void': reason or None, ...}."""
    f_ms = [int(m) for ms in run_f["m_calls"].values() for m in ms]
    tf = ((run_a.get("teacher_m_calls") or {}).get(follower)) or {}
    tf_ms = [int(m) for ms in tf.values() for m in ms]
    reversed_ms = sum(1 for m in f_ms + tf_ms if _in(m, fold))
    why = None
    if not fold:
        why = "F reverses the fold order at no M"
    elif groups < 3:
        why = (f"every matrix has at most {groups} K group(s): a sum of two or fewer terms is the same "
               "in either order, so reversing the fold order changes nothing")
    elif not reversed_ms:
        why = "F made no call at an M whose fold order it reverses"
    diff = _outputs_differ(recs_a, recs_f, follower)
    if why is None and diff is None:
        why = "no output of F differs from A's (tokens, log-probabilities, teacher-forced metrics)"
    return {"void": why, "fold_differs": bool(fold) and groups >= 3 and reversed_ms > 0,
            "reversed_ms": reversed_ms, "first_difference": diff}
