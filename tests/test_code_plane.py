"""kernels.common.code_plane: (c >> 2s) & 3 for every code byte and plane. On CUDA this runs the
inline-PTX word form (one shift and AND per four bytes); on the CPU the interpreter's byte form.
Both must give the byte form's values, whatever bytes share a 32-bit word."""
import numpy as np
import torch
import triton
import triton.language as tl

from kernels import common


@triton.jit
def _planes_kernel(c_ptr, out_ptr, N: tl.constexpr, INTERP: tl.constexpr):
    i = tl.arange(0, N)
    c = tl.load(c_ptr + i)
    for s in tl.static_range(4):
        tl.store(out_ptr + s * N + i, common.code_plane(c, s, INTERP))


def test_code_plane_every_byte_and_plane(device):
    # each byte value 0..255 four times, shuffled (seed 7) so neighbours in a word differ
    rng = np.random.default_rng(7)
    vals = rng.permutation(np.tile(np.arange(256, dtype=np.uint8), 4))
    c = torch.from_numpy(vals).to(device)
    out = torch.full((4, vals.size), -1, dtype=torch.int8, device=device)
    _planes_kernel[(1,)](c, out, N=vals.size, INTERP=common.INTERPRET)
    want = np.stack([(vals >> (2 * s)) & 3 for s in range(4)]).astype(np.int8)
    got = out.cpu().numpy()
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"code_plane differs at {len(bad)} (plane, index) pairs, first {bad[:3].tolist()}: "
                           f"byte {vals[bad[0][1]]:#04x} plane {bad[0][0]} gave {got[tuple(bad[0])]}, "
                           f"want {want[tuple(bad[0])]}; reproduce: pytest --device {device} "
                           f"tests/test_code_plane.py (seed 7)")
