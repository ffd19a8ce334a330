"""Inputs built to tell two FP32 fold orders apart, for `check --derive-exact` where bit identity
is not proven: group contributions that cancel (a large positive group, a tiny one, a large
negative one, in every order of the groups) and sums that land exactly on half a bf16/fp16
spacing in one order and off it in another (the output rounding's tie).

Every weight row n encodes one placement of the special groups, so one call covers every order.
x has, in each group, elements 0..5 equal to 1.0 (the rest 0), so Q8 gives q = 127 there and
xs = fp32(1/127); a row's term for group g is dot*xs*ws = c*ws exactly, with c (0..6) the
number of those elements whose weight is +1 (or -1 for a negative term) and ws the row's fp16
scale of group g (127c * fp32(1/127) rounds to c for c <= 128, and c*ws is exact in FP32).
Row m of x is row 0 times 2^m: every term doubles, the relations between them stay.

Reproduce one refutation: python -m pq2verify.adversarial --paths P,Q --k K --m M --dtype D
(prints the first differing row, its placement and both outputs; exit 1 where they differ)."""
import argparse
import itertools
import sys

import torch

from kernels.format import BLOCK, PQ2Weight, pack_codes

ONES = 6   # elements of each group set to 1.0 in x

# (name, [(c, sign, ws) of the special groups in placement order]): terms c*sign*ws.
# cancel: L + T - L with T a quarter of L's FP32 ulp: 0 in some orders, T in others.
# tie_bf16: A = 2^14 (1 + 2^-8) is half a bf16 spacing above 2^14; B = C = 3*2^-12 are 0.375 of
#   A's FP32 ulp each: (A+B)+C stays A (rounds to even, 2^14), A+(B+C) is A+ulp (rounds up).
# tie_fp16: A = 4098 is half an fp16 spacing above 4096; B = C = 3*2^-14 (0.375 ulp each).
FAMILIES = {
    "cancel": [(1, 1, 2048.0), (1, 1, 2.0 ** -14), (1, -1, 2048.0)],
    "tie_bf16": [(1, 1, 16448.0), (3, 1, 2.0 ** -12), (3, 1, 2.0 ** -12)],
    "tie_fp16": [(6, 1, 683.0), (3, 1, 2.0 ** -14), (3, 1, 2.0 ** -14)],
}


def special_groups(groups: int, span: int | None = None) -> list[int]:
    """The groups the special terms are placed in: all, or (span < groups) the first span - 2
    and the last 2 (where splits and lanes begin and end on small shapes)."""
    if span is None or span >= groups:
        return list(range(groups))
    return list(range(span - 2)) + [groups - 2, groups - 1]


def placements(groups: int, family: str, span: int | None = None) -> list[tuple[int, ...]]:
    """Every ordered choice of distinct groups (of special_groups) for the family's special
    terms; placements that only swap two equal terms are listed once."""
    terms = FAMILIES[family]
    seen, out = set(), []
    for pos in itertools.permutations(special_groups(groups, span), len(terms)):
        key = tuple(sorted(zip(pos, map(tuple, terms))))
        if key not in seen:
            seen.add(key)
            out.append(pos)
    return out


def rows(groups: int, span: int | None = None) -> list[tuple[str, int, tuple[int, ...]]]:
    """(family, sign of the whole row, placement) for every weight row, in row order."""
    return [(f, s, pos) for f in FAMILIES for pos in placements(groups, f, span) for s in (1, -1)]


def _check_k(k: int) -> None:
    if type(k) is not int or k % BLOCK or k // BLOCK < 3:
        raise ValueError(f"--k: {k!r} must be a multiple of {BLOCK} with at least 3 groups")


def weight(k: int, device="cpu", span: int | None = None, n: int | None = None) -> PQ2Weight:
    """The prepared weight of every placement and its negation, one a row: [len(rows), k], or
    [n, k] with the rows repeated cyclically (a GPU config can depend on N)."""
    _check_k(k)
    groups = k // BLOCK
    spec = rows(groups, span)
    n = n or len(spec)
    codes = torch.ones(n, k, dtype=torch.uint8)           # code 1: weight 0
    scales = torch.ones(n, groups, dtype=torch.float16)
    for r in range(n):
        fam, sign, pos = spec[r % len(spec)]
        for g, (c, s, ws) in zip(pos, FAMILIES[fam]):
            codes[r, g * BLOCK: g * BLOCK + c] = 1 + s * sign      # code 2: +1, code 0: -1
            scales[r, g] = ws
    flat = torch.cat([pack_codes(codes).reshape(-1), scales.reshape(-1).view(torch.uint8)])
    return PQ2Weight(flat, n, k, "prepared").to(device)


def activations(m: int, k: int, dtype, device="cpu") -> torch.Tensor:
    x = torch.zeros(m, k // BLOCK, BLOCK)
    x[:, :, :ONES] = 1.0
    x = x * (2.0 ** torch.arange(m)).view(m, 1, 1)
    return x.reshape(m, k).to(dtype).to(device)


def describe(k: int, row: int, span: int | None = None) -> str:
    spec = rows(k // BLOCK, span)
    fam, sign, pos = spec[row % len(spec)]
    terms = ", ".join(f"group {g}: {sign * s * c * ws:g}" for g, (c, s, ws) in zip(pos, FAMILIES[fam]))
    return f"{fam} row {row} ({terms}; other groups 0)"


def command(p: str, q: str, k: int, m: int, dtype: str, device: str = "cpu", span=None, n=None) -> str:
    return (f"python -m pq2verify.adversarial --device {device} --paths {p},{q} --k {k} --m {m} --dtype {dtype}"
            + (f" --span {span}" if span is not None and span < k // BLOCK else "") + (f" --n {n}" if n else ""))


def compare(p, q, k: int, m: int, dtype: str, device="cpu", run=None, span=None, n=None):
    """Run paths p and q (registry.Path) on the construction; None where every output's bytes are
    equal, else {k, m, dtype, n, element, input, differing, p, q, command} for the first
    difference. run(path, x, w) -> y (default: the path's kernel)."""
    from .bits import bits
    from .cases import DTYPES
    w = weight(k, device, span, n)
    x = activations(m, k, DTYPES[dtype], device)
    run = run or (lambda path, x, w: path.kernel()(x, w))
    y1, y2 = run(p, x, w), run(q, x, w)
    diff = (bits(y1) != bits(y2)).nonzero()
    if not diff.numel():
        return None
    i, r = (int(v) for v in diff[0])
    return {"k": k, "m": m, "dtype": dtype, "n": w.n, "element": [i, r], "input": describe(k, r, span),
            "differing": int(diff.shape[0]), p.name: float(y1[i, r]), q.name: float(y2[i, r]),
            "command": command(p.name, q.name, k, m, dtype, torch.device(device).type, span, n)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pq2verify.adversarial", description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", required=True, help="two registry paths, P,Q")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--m", type=int, required=True)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--span", type=int, default=None, help="groups the special terms are placed in")
    ap.add_argument("--n", type=int, default=None, help="weight rows (the placements repeated)")
    a = ap.parse_args(argv)
    from kernels import backend
    from . import registry
    names = a.paths.split(",")
    try:
        if len(names) != 2:
            raise ValueError(f"--paths: expected two paths P,Q, got {a.paths!r}")
        # the ranges first: M = 0 is a bad --m, not a path that does not serve it
        for opt, v, lo in (("--span", a.span, 3), ("--n", a.n, 1), ("--m", a.m, 1)):
            if v is not None and v < lo:
                raise ValueError(f"{opt}: expected an integer >= {lo}, got {v}")
        ps = [registry.get(n) for n in names]
        for p in ps:
            if not p.serves(a.m) or p.weight != "pq2":
                raise ValueError(f"--paths: {p.name} does not serve M={a.m} on PQ2 weights")
        _check_k(a.k)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    backend.select(a.device)
    d = compare(*ps, a.k, a.m, a.dtype, a.device, span=a.span, n=a.n)
    if d is None:
        print(f"{names[0]} and {names[1]}: every output bit-identical (K={a.k}, M={a.m}, {a.dtype})")
        return 0
    print(f"{names[0]} and {names[1]} differ on {d['differing']} outputs; first at {d['element']}: "
          f"{d['input']}: {names[0]} {d[names[0]]!r}, {names[1]} {d[names[1]]!r}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
