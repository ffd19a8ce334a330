"""The FP64 oracle is independent of the runtime it checks: reference/ imports only numpy, torch
and the standard library, decodes the PQ2 bytes itself (SPEC §2), and agrees with the runtime's
own unpacking on every code value, block edge and both layouts, so that a bug planted in the
runtime's decoder shows up as a disagreement instead of hiding in both."""
import ast
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import reference
from reference import pq2, projection

import kernels.emulation as emu        # the runtime's CPU emulation and weight format
import kernels.format as fmt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF_DIR = os.path.join(ROOT, "reference")
ALLOWED = {"numpy", "torch"}
REPRO = "reproduce: .venv/bin/python -m pytest -p no:randomly -q tests/test_reference_independence.py"


def _imports(fn):
    """(line, top-level module) of every absolute import in a file."""
    tree = ast.parse(open(fn).read(), fn)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.lineno, node.module.split(".")[0]


def test_reference_imports_only_numpy_torch_and_the_stdlib():
    bad = []
    for name in sorted(os.listdir(REF_DIR)):
        if name.endswith(".py"):
            for line, mod in _imports(os.path.join(REF_DIR, name)):
                if mod not in ALLOWED and mod not in sys.stdlib_module_names:
                    bad.append(f"reference/{name}:{line} imports {mod}")
    assert not bad, "the oracle must not share code with the runtime or the suite:\n" + "\n".join(bad) + "\n" + REPRO


def test_no_runtime_object_is_reachable_from_the_reference():
    """Not by import, nor by a name bound at import (a class or function of kernels/ or
    pq2verify/ in a reference module's namespace)."""
    mods = [m for n, m in sorted(sys.modules.items()) if n == "reference" or n.startswith("reference.")]
    bad = []
    for m in mods:
        for k, v in vars(m).items():
            home = v.__name__ if isinstance(v, types.ModuleType) else getattr(v, "__module__", None)
            if isinstance(home, str) and home.split(".")[0] in ("kernels", "pq2verify"):
                bad.append(f"{m.__name__}.{k} is {home}")
    assert not bad, "\n".join(bad) + "\n" + REPRO


# the reference imported and used in a process where kernels/ and pq2verify/ cannot be imported
_BLOCKED = r"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("kernels", "pq2verify", "triton"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
import numpy as np
from reference import pq2, projection, generate
raw = generate.ternary_weight(3, 256, 5)
flat = pq2.raw_to_prepared(raw)
assert np.array_equal(pq2.decode(flat, layout="prepared", n=3, k=256), pq2.decode(raw))
x = generate.activations(2, 256, 1)
assert np.array_equal(projection.quantized(x, flat, layout="prepared", n=3, k=256), projection.quantized(x, raw))
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in ("kernels", "pq2verify")))
"""


def test_reference_works_with_the_runtime_unimportable():
    r = subprocess.run([sys.executable, "-c", _BLOCKED], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0 and r.stdout.strip() == "ok []", (r.stdout + r.stderr)[-1500:] + "\n" + REPRO


# --- the two decoders agree -------------------------------------------------------------------
def _by_hand(raw: np.ndarray):
    """SPEC §2 read literally, one block at a time: (codes [N, K] in 0..3, scales f16 [N, G])."""
    n, rs = raw.shape
    g = rs // 34
    codes = np.zeros((n, g * 128), np.uint8)
    scales = np.zeros((n, g), np.float16)
    for r in range(n):
        for b in range(g):
            blk = raw[r, 34 * b:34 * b + 34]
            scales[r, b] = np.frombuffer(bytes(blk[:2]), "<f2")[0]
            for j in range(32):
                for s in range(4):
                    codes[r, 128 * b + 4 * j + s] = (int(blk[2 + j]) >> (2 * s)) & 3
    return codes, scales


def _raw_bytes(n, g, seed, code3=True):
    """Raw bytes with every byte value 0..255 in the code bytes (every code in every field, 3
    included unless code3=False) and finite fp16 scales of every kind (subnormal, -0, large)."""
    rng = np.random.default_rng(seed)
    raw = np.zeros((n, g * 34), np.uint8)
    blocks = raw.reshape(n, g, 34)
    vals = np.arange(256, dtype=np.uint8) if code3 else np.array(
        [b for b in range(256) if all((b >> 2 * s) & 3 != 3 for s in range(4))], np.uint8)
    cb = rng.choice(vals, size=(n, g, 32))
    m = min(len(vals), cb.size)
    cb.reshape(-1)[:m] = vals[:m]                            # each value once where there is room
    blocks[:, :, 2:] = cb
    bits = rng.integers(0, 0x10000, size=(n, g), dtype=np.uint32).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBBFF                # no inf or NaN
    edge = np.array([0x0001, 0x8000, 0x7BFF, 0x3C00], np.uint16)   # smallest subnormal, -0, max, 1.0
    bits.reshape(-1)[:min(4, bits.size)] = edge[:bits.size]
    blocks[:, :, :2] = bits.astype("<u2").view(np.uint8).reshape(n, g, 2)
    return raw


def _runtime_planes(w):
    """What the runtime itself decodes: (codes [N, K], scales f16 [N, G]) through its own
    plane split and unpacking."""
    return fmt.unpack_codes(w.codes_matrix()).numpy(), w.scales_matrix().numpy()


@pytest.mark.parametrize("layout", ("raw", "prepared"))
@pytest.mark.parametrize("n,g,seed", [(1, 1, 0), (3, 2, 1), (5, 3, 2), (16, 7, 3)])
def test_the_decoders_agree_on_every_code_and_block_edge(layout, n, g, seed):
    raw = _raw_bytes(n, g, seed)
    want_codes, want_scales = _by_hand(raw)
    t = torch.from_numpy(raw)
    if layout == "raw":
        w = fmt.PQ2Weight.from_raw(t, validate=False)
        ref_codes, ref_scales = pq2.split_raw(raw)
    else:
        flat = pq2.raw_to_prepared(raw)
        w = fmt.PQ2Weight.from_prepared(torch.from_numpy(flat), n, g * 128, validate=False)
        cb, ref_scales = pq2.split_prepared(flat, n, g * 128)
        ref_codes = pq2.unpack_codes(cb)
        assert np.array_equal(w.data.numpy(), flat), "the runtime's prepared bytes differ from SPEC §2's"
    run_codes, run_scales = _runtime_planes(w)
    for name, got in (("reference", (ref_codes, ref_scales)), ("runtime", (run_codes, run_scales))):
        assert np.array_equal(got[0], want_codes), f"{name} codes differ from SPEC §2 ({layout}, {n}x{g})\n{REPRO}"
        assert np.array_equal(got[1].view(np.uint16), want_scales.view(np.uint16)), f"{name} scales ({layout})\n{REPRO}"


@pytest.mark.parametrize("layout", ("raw", "prepared"))
def test_decoded_values_agree_and_code3_is_refused_by_both(layout):
    n, g = 6, 3
    raw = _raw_bytes(n, g, 7, code3=False)
    data = torch.from_numpy(raw if layout == "raw" else pq2.raw_to_prepared(raw))
    w = (fmt.PQ2Weight.from_raw(data) if layout == "raw" else fmt.PQ2Weight.from_prepared(data, n, g * 128))
    codes, scales = _runtime_planes(w)
    runtime = ((codes.astype(np.float64) - 1).reshape(n, g, 128) * scales.astype(np.float64)[:, :, None]).reshape(n, -1)
    ref = pq2.decode(w.data, layout=layout, n=n, k=g * 128)
    assert np.array_equal(ref.view(np.uint64), runtime.view(np.uint64)), REPRO
    # code 3 in the last field of the last byte of the last block of the last row
    bad = raw.copy()
    bad[-1, -1] |= 0xC0
    data = torch.from_numpy(bad if layout == "raw" else pq2.raw_to_prepared(bad))
    with pytest.raises(pq2.PQ2FormatError, match=rf"code 3 at row {n - 1}, block {g - 1} \(weight 127"):
        pq2.decode(data, layout=layout, n=n, k=g * 128)
    with pytest.raises(fmt.PQ2FormatError, match="code 3"):
        fmt.PQ2Weight.from_raw(data) if layout == "raw" else fmt.PQ2Weight.from_prepared(data, n, g * 128)


# --- a bug planted in the runtime's decoder is caught against the reference -------------------
def _case(layout):
    from reference import generate
    n, k = 24, 512
    raw = generate.ternary_weight(n, k, 11)
    data = torch.from_numpy(raw if layout == "raw" else pq2.raw_to_prepared(raw))
    x = torch.as_tensor(generate.activations(3, k, 4)).to(torch.bfloat16)
    return n, k, data, x


def _runtime_dots(layout, n, k, data, x):
    """The runtime's exact integer group dots [M, N, G] (its CPU emulation of the integer
    paths, which decodes the weight through its own plane views)."""
    w = (fmt.PQ2Weight.from_raw(data, validate=False) if layout == "raw"
         else fmt.PQ2Weight.from_prepared(data, n, k, validate=False))
    q, _ = emu.quantize_q8(x)
    return emu.group_dots(q, w).permute(1, 2, 0).to(torch.int64).numpy()


def _swap_codes_0_2(orig):
    def unpack(b):
        c = orig(b)
        return torch.where(c == 0, 2, torch.where(c == 2, 0, c)).to(c.dtype)
    return unpack


def _misplace_block(orig):
    def codes_matrix(self):
        c = orig(self)
        return torch.roll(c.reshape(self.n, self.groups, 32), 1, dims=1).reshape(self.n, -1)
    return codes_matrix


@pytest.mark.parametrize("layout", ("raw", "prepared"))
@pytest.mark.parametrize("bug", ("codes 0 and 2 swapped in unpack", "blocks misplaced by one"))
def test_a_planted_runtime_decoder_bug_is_caught_by_the_reference(layout, bug, monkeypatch):
    n, k, data, x = _case(layout)
    ref = projection.group_dots(x, data, layout=layout, n=n, k=k)
    assert np.array_equal(_runtime_dots(layout, n, k, data, x), ref), "precondition: they agree unbroken\n" + REPRO
    ref_decoded = pq2.decode(data, layout=layout, n=n, k=k)
    if bug.startswith("codes"):
        monkeypatch.setattr(fmt, "unpack_codes", _swap_codes_0_2(fmt.unpack_codes))
        codes, _ = _runtime_planes(fmt.PQ2Weight.from_raw(data) if layout == "raw"
                                   else fmt.PQ2Weight.from_prepared(data, n, k))
        want, _ = pq2.read(data, layout=layout, n=n, k=k)
        assert not np.array_equal(codes, want), f"the planted bug ({bug}) went unseen by the reference\n{REPRO}"
    else:
        monkeypatch.setattr(fmt.PQ2Weight, "codes_matrix", _misplace_block(fmt.PQ2Weight.codes_matrix))
        got = _runtime_dots(layout, n, k, data, x)
        assert not np.array_equal(got, ref), f"the planted bug ({bug}) went unseen by the reference\n{REPRO}"
    # and the reference, which shares none of that code, still reads SPEC §2
    assert np.array_equal(pq2.decode(data, layout=layout, n=n, k=k), ref_decoded)
    assert np.array_equal(projection.group_dots(x, data, layout=layout, n=n, k=k), ref)
    hand_codes, hand_scales = _by_hand(data.numpy() if layout == "raw" else pq2.prepared_to_raw(data.numpy(), n, k))
    assert np.array_equal(pq2.read(data, layout=layout, n=n, k=k)[0], hand_codes)


def test_the_runtime_weight_class_is_refused_with_the_call_to_make():
    raw = reference.generate.ternary_weight(2, 128, 1)
    w = fmt.PQ2Weight.from_raw(torch.from_numpy(raw))
    with pytest.raises(TypeError, match=r"^weight: expected the packed bytes .*; pass w\.data, layout=w\.layout, n=w\.n, k=w\.k$"):
        pq2.decode(w)
