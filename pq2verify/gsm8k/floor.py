"""The A/B's own noise floor and the teacher-forced metrics, and the verdict.

Floor run F (A'): A's kernels with the K groups of every projection folded in reverse order, on
the calls whose M B serves with another path than A (model.Usage.reverse; all calls if B
changes none): the same arithmetic in another valid FP32 order, where B changes the order.
A vs F then shows what fold-order noise alone does to answers, generations and margins.

Teacher forcing: B and F run in lockstep with A, fed A's tokens (generate.Follower), so at
every step of every question they see A's exact prefix at A's M. Per question: the mean over
its steps of KL(A || X) (whole vocabulary), the share of steps whose argmax under X is A's
token, and the largest |log p_X - log p_A| of A's token, with its step.

Verdict: per question, is A->B's mean KL larger than A->F's? Under the null hypothesis that B
is a reordering of A's sums no worse than F's, each question is as likely to go either way; the
one-sided sign test (exact binomial, ties dropped) gives P(at least this many questions with
B above F). p < ALPHA: "beyond arithmetic noise", else "within arithmetic noise".

Each flip (the first differing token of A/B or A/F) is also classified against the drift the
floor measured at that very step: F's teacher-forced change of A's margin between the two
tokens, |(lp_F(a) - lp_F(b)) - (lp_A(a) - lp_A(b))|. A margin no larger than that drift is
"within floor drift" (the floor's reordering moved this very margin as far); else "beyond floor
drift", or "n/a" where B's token is outside A's recorded top-k. Selection makes a flip look
large against any single other run's drift at that step, so the count is read against its
control with the roles swapped: A/F flips against B's drift. Two reorderings that are equally
noisy give alike counts; a real fault gives many more A/B flips beyond F's drift.
"""
from math import comb, isfinite, log2

ALPHA = 0.01


def fold_ranges(spec_a: dict, spec_b: dict, device: str, dtype) -> tuple:
    """M ranges [(lo, hi or None)] where A's and B's kernel specs resolve to different paths
    (all Ms if none): the calls whose fold order the floor run reverses."""
    import torch
    from kernels import dispatch
    from kernels.format import PQ2Weight
    from .. import registry
    from .runs import EnvSwitch, spec_env
    cuts = sorted({p.m_min for p in registry.PATHS} | {p.m_max + 1 for p in registry.PATHS if p.m_max} | {1})
    w = PQ2Weight.from_prepared(torch.zeros(128 // 4 + 2, dtype=torch.uint8), 1, 128).to(device)
    out = []
    for i, lo in enumerate(cuts):
        hi = cuts[i + 1] - 1 if i + 1 < len(cuts) else None
        x = torch.empty(lo, 128, dtype=dtype, device=device)
        names = []
        for spec in (spec_a, spec_b):
            with EnvSwitch(spec_env(spec)):
                names.append(dispatch.resolve(lo, w, x, dispatch.kernel_set()).name)
        if names[0] != names[1]:
            if out and out[-1][1] is not None and out[-1][1] + 1 == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
    return tuple(out) or ((1, None),)


def teacher(recs: dict, name: str) -> dict | None:
    """Teacher-forced metrics of follower `name` over the records of its leader. The worst
    question has the largest |delta log p|; on a tie, the first in question order (and in a
    question, the first step) is named, so a report names the same one every run."""
    per_q, kl_all, agree, n, worst = {}, 0.0, 0, 0, None
    for q, r in sorted(recs.items()):
        t = (r.get("teacher") or {}).get(name)
        if t is None:
            return None
        steps = len(t["kl"])
        if not steps:
            continue
        dlp = [lpk[0] - top[0][1] for lpk, top in zip(t["lpk"], r["topk"])]
        i = max(range(steps), key=lambda s: abs(dlp[s]))
        per_q[q] = {"kl": sum(t["kl"]) / steps, "top1": sum(t["top1"]) / steps, "max_dlp": abs(dlp[i]), "step": i}
        kl_all += sum(t["kl"])
        agree += sum(t["top1"])
        n += steps
        if worst is None or abs(dlp[i]) > worst["dlp"]:
            worst = {"id": q, "step": i, "dlp": abs(dlp[i]), "token": r["tokens"][i]}
    if not n:
        return {"tokens": 0, "mean_kl": None, "top1": None, "worst": None, "per_question": per_q}
    kls = sorted(v["kl"] for v in per_q.values())
    return {"tokens": n, "mean_kl": kl_all / n, "top1": agree / n, "median_question_kl": kls[len(kls) // 2],
            "worst": worst, "per_question": per_q}


def sign_test(a: dict, b: dict) -> dict:
    """One-sided exact sign test that a[q] > b[q] more often than not (ties dropped)."""
    up = sum(1 for q in a if q in b and a[q] > b[q])
    down = sum(1 for q in a if q in b and a[q] < b[q])
    n = up + down
    p = sum(comb(n, k) for k in range(up, n + 1)) / 2 ** n if n else 1.0
    # the other tail too (B closer to A than the floor on most questions): reported, not a verdict
    p_below = sum(comb(n, k) for k in range(0, up + 1)) / 2 ** n if n else 1.0
    return {"above": up, "below": down, "ties": sum(1 for q in a if q in b) - n, "p": p, "p_below": p_below}


def min_questions(alpha: float = ALPHA) -> int:
    """The fewest untied questions at which the one-sided sign test can reach alpha: its
    smallest p is 2^-n (B above F on every one), and p < alpha needs 2^-n < alpha, that is
    n > log2(1/alpha): the next integer (exact at powers of two, where log2 is exact)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha {alpha}: expected a probability in (0, 1)")
    return int(-log2(alpha)) + 1   # -log2(alpha) > 0: int() is its floor


def verdict(tf_b: dict | None, tf_f: dict | None, alpha: float = ALPHA) -> dict | None:
    if not tf_b or not tf_f or tf_b["mean_kl"] is None or tf_f["mean_kl"] is None:
        return None
    kb = {q: v["kl"] for q, v in tf_b["per_question"].items()}
    kf = {q: v["kl"] for q, v in tf_f["per_question"].items()}
    st = sign_test(kb, kf)
    # a NaN KL compares false both ways (the sign test would drop it as a tie): never within
    within = st["p"] >= alpha and all(isfinite(v) for v in (*kb.values(), *kf.values()))
    need = min_questions(alpha)
    small = st["above"] + st["below"] < need       # p = 1/2^n at best: alpha out of reach
    return {"verdict": "too small to decide" if small else "within arithmetic noise" if within
            else "beyond arithmetic noise", "decided": not small, "alpha": alpha, "min_questions": need,
            "reason": (f"{st['above'] + st['below']} untied question(s); the sign test can reach alpha {alpha} "
                       f"only from {need} (its smallest p is 2^-n)") if small else None,
            "test": f"one-sided exact sign test on per-question mean teacher-forced KL, A->B vs A->F "
                    f"(alpha {alpha}); H0: B's reordering is no worse than the floor's",
            **st, "kl_ratio": tf_b["mean_kl"] / tf_f["mean_kl"] if tf_f["mean_kl"] else None}


def floor_drift(rec_a: dict, floor: str, step: int, tok_a, tok_b):
    """The floor's teacher-forced change of A's margin between tok_a and tok_b at `step`, or
    None where it is not recorded (no floor, or tok_b outside A's recorded top-k)."""
    t = (rec_a.get("teacher") or {}).get(floor)
    if t is None or step >= len(t["lpk"]) or tok_a is None or tok_b is None:
        return None
    ids = [tk for tk, _ in rec_a["topk"][step]]
    if tok_a not in ids or tok_b not in ids:
        return None
    ia, ib = ids.index(tok_a), ids.index(tok_b)
    lp_a = rec_a["topk"][step]
    moved = (t["lpk"][step][ia] - t["lpk"][step][ib]) - (lp_a[ia][1] - lp_a[ib][1])
    return abs(moved)


def classify(cmp: dict, recs_a: dict, floor: str) -> None:
    """Add each diff row's floor drift and its class against it (in place)."""
    counts = {"within floor drift": 0, "beyond floor drift": 0, "n/a": 0}
    for i, row in enumerate(cmp["diffs"] + cmp["text_only"]):
        d = floor_drift(recs_a[row["id"]], floor, row["step"], row["token_a"], row["token_b"])
        row["floor_drift"] = d
        m = row.get("margin_a")
        if d is None or m is None or row.get("margin_a_bound"):
            row["vs_floor"] = "n/a"
        else:
            row["vs_floor"] = "within floor drift" if m <= d else "beyond floor drift"
        if i < len(cmp["diffs"]):
            counts[row["vs_floor"]] += 1
    cmp["answer_diffs_vs_floor"] = counts
    cmp["drift_of"] = floor
