"""A few fast self-checks of the FP64 reference, run by `pq2verify check` before any kernel is
judged against it (the full property tests live in tests/test_reference_*.py)."""
import numpy as np
import torch

from . import inputs


def _decode_by_hand(raw: np.ndarray) -> np.ndarray:
    n, rs = raw.shape
    out = np.zeros((n, rs // 34 * 128))
    for r in range(n):
        for g in range(rs // 34):
            blk = raw[r, g * 34:(g + 1) * 34]
            s = float(blk[:2].view(np.float16)[0])
            for b in range(32):
                for t in range(4):
                    out[r, g * 128 + 4 * b + t] = (((int(blk[2 + b]) >> (2 * t)) & 3) - 1) * s
    return out


def run_all():
    from reference import metrics, pq2, projection, q8
    res = []
    w = inputs.ternary_weight(3, 256, seed=7, layout="raw")
    raw = w.data.numpy()
    ok = np.array_equal(pq2.decode(raw), _decode_by_hand(raw))
    res.append(("decode == decode by hand", ok, "3x256 raw weight, every element"))
    flat = w.to_prepared().data.numpy()
    ok = np.array_equal(pq2.decode(flat, layout="prepared", n=3, k=256), pq2.decode(raw))
    res.append(("raw decode == prepared decode", ok, "same values through both layouts"))
    x = inputs.activations(4, 256, seed=3, kind="ties", dtype=torch.float32)
    qz = q8.quantize_q8(x)
    # widened first: abs of an int8 -128 wraps to -128, so the range test could never fail
    ok = bool(np.abs(qz.q.astype(np.int16)).max() <= 127) and np.array_equal(qz.q[0, 1:5], np.rint(x[0, 1:5].numpy()))
    res.append(("Q8 ties round half to even", ok, "amax 127 groups: q == rint(a) (scale exactly 1.0)"))
    xz = torch.zeros(2, 256)
    qz0 = q8.quantize_q8(xz)
    res.append(("Q8 zero group", bool((qz0.q == 0).all() and (qz0.scales == 0).all()), "codes 0 and scale 0"))
    x = inputs.activations(5, 256, seed=4, kind="heavy")
    qz = q8.quantize_q8(x)
    direct = (qz.q.astype(np.float64).reshape(5, 2, 128) * qz.scales[:, :, None]).reshape(5, 256) @ pq2.decode(raw).T
    err = metrics.relative_rms(projection.quantized(x, raw), direct)
    res.append(("quantized projection == direct FP64", err <= 1e-12, f"relative difference {err:.1e} (≤ 1e-12)"))
    y = np.array([1.0, float("nan")])
    res.append(("NaN never passes", not metrics.relative_rms(y, np.ones(2)) <= 1.0, "relative_rms with a NaN is inf"))
    return res
