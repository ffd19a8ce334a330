"""Floating weights to PQ2_0 by balanced-ternary digits (SPEC §10).

Per group of 128 weights of a row: s = amax / ((3^T - 1) / 2), n = round(w / s) in
[-(3^T-1)/2, (3^T-1)/2], n = sum_t 3^t d_t with d_t in {-1, 0, 1}. Digit t is a PQ2_0 matrix
with scale fp16(s * 3^t); the T digit matrices side by side along K form one PQ2 matrix
[N, T*Kp] which, fed [x | x | ... ] (T copies), sums all digits in one FP32 accumulation and
rounds once. K is padded with zeros to Kp, a multiple of 128.
A matrix already ternary per group ({-a, 0, a}) is the case T = 1, and is then lossless.
"""
import torch

from kernels.format import BLOCK, BLOCK_BYTES, PQ2Weight


# balanced_ternary works on float32 integers, exact up to 2^23 in magnitude: T digits need
# (3^T - 1) / 2 <= 2^23, so T <= 15. (Past ~8 digits the lowest digits' fp16 scales s * 3^t
# run subnormal for typical weights: more digits then add bytes, not fidelity.)
EXACT_LIMIT = 2 ** 23
MAX_DIGITS = max(t for t in range(1, 64) if (3 ** t - 1) // 2 <= EXACT_LIMIT)


def pad_k(w: torch.Tensor) -> torch.Tensor:
    k = w.shape[1]
    kp = -(-k // BLOCK) * BLOCK
    return w if kp == k else torch.nn.functional.pad(w, (0, kp - k))


def balanced_ternary(n: torch.Tensor, digits: int) -> torch.Tensor:
    """Integer-valued tensor n (|n| <= (3^T-1)/2) to digits [T, *n.shape] in {-1, 0, 1}, digit 0
    lowest. Float32 arithmetic on integers below 2^24 is exact and much faster than int64:
    d = n - 3 * round(n / 3) (n / 3 is never a half), then n = (n - d) / 3 exactly."""
    n = n.to(torch.float32)
    if bool((n.abs() > EXACT_LIMIT).any()):
        raise ValueError("balanced_ternary: values must be below 2^23 in magnitude")
    out = []
    for _ in range(digits):
        d = n - 3 * torch.round(n / 3)
        out.append(d.to(torch.int8))
        n = (n - d) / 3
    if bool((n != 0).any()):
        raise ValueError(f"balanced_ternary: a value needs more than {digits} digits")
    return torch.stack(out)


def is_ternary(w: torch.Tensor) -> bool:
    """Per group of 128 (K padded with zeros), every value is -a, 0 or a for one a >= 0."""
    g = pad_k(w.float()).reshape(w.shape[0], -1, BLOCK).abs()
    amax = g.amax(dim=2, keepdim=True)
    return bool(((g == 0) | (g == amax)).all())


def pack_codes(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes uint8 [N, K] in {0,1,2}, scales fp16 [N, G] -> raw PQ2_0 bytes [N, G*34]."""
    n, k = codes.shape
    g = k // BLOCK
    c = codes.reshape(n, g, 32, 4).to(torch.int32)
    byte = (c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)).to(torch.uint8)
    sb = scales.contiguous().view(torch.uint8).reshape(n, g, 2)
    return torch.cat([sb, byte], dim=2).reshape(n, g * BLOCK_BYTES)


def quantize_digits(w: torch.Tensor, digits: int):
    """w float [N, K] -> (digits int8 [T, N, Kp], scales fp16 [T, N, G], reconstruction float32
    [N, K]) with the fp16 scales actually stored, so fidelity is measured on what runs."""
    if not 1 <= digits <= MAX_DIGITS:
        raise ValueError(f"digits: {digits} outside 1..{MAX_DIGITS} (3^T must stay exact in float32)")
    wk = pad_k(w.float())
    n, kp = wk.shape
    grp = wk.reshape(n, kp // BLOCK, BLOCK)
    half = (3 ** digits - 1) // 2
    s = grp.abs().amax(dim=2) / half                                       # [N, G]
    safe = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.round(grp / safe.unsqueeze(2)).clamp_(-half, half)
    d = balanced_ternary(q.reshape(n, kp), digits).to(torch.int8)          # [T, N, Kp]
    pow3 = torch.tensor([3.0 ** t for t in range(digits)], device=s.device).view(digits, 1, 1)
    sc = (s.unsqueeze(0) * pow3).to(torch.float16)                         # [T, N, G]
    rec = (d.float().reshape(digits, n, -1, BLOCK) * sc.float().unsqueeze(3)).sum(0)
    return d, sc, rec.reshape(n, kp)[:, : w.shape[1]]


def convert(mats: list[torch.Tensor], digits: int, *, layout: str = "prepared"):
    """The matrices stacked along N (they share K), digit t of each at columns [t*Kp, (t+1)*Kp):
    one PQ2Weight [sum(N), T*Kp]. Returns (weight, stats) with stats {sq_err, sq_ref, max_rel}."""
    ds, ss, sq_err, sq_ref, worst = [], [], 0.0, 0.0, 0.0
    for m in mats:
        d, sc, rec = quantize_digits(m, digits)
        ds.append(d)
        ss.append(sc)
        e = float((rec.double() - m.double()).pow(2).sum())
        r = float(m.double().pow(2).sum())
        sq_err, sq_ref = sq_err + e, sq_ref + r
        worst = max(worst, (e / r) ** 0.5 if r else 0.0)
    d = torch.cat(ds, dim=1)                                               # [T, Nt, Kp]
    sc = torch.cat(ss, dim=1)                                              # [T, Nt, G]
    t, nt, kp = d.shape
    codes = (d + 1).to(torch.uint8).permute(1, 0, 2).reshape(nt, t * kp)
    raw = pack_codes(codes, sc.permute(1, 0, 2).reshape(nt, -1))
    w = PQ2Weight.from_raw(raw)
    if layout == "prepared":
        w = w.to_prepared()
    return w, {"sq_err": sq_err, "sq_ref": sq_ref, "max_rel": worst}
