"""The error map of a failing case (pq2verify.report.errormap): a planted tile fault, one block
of BN output columns wrong, must draw as that block: red exactly over its columns in the
picture's own pixels, not red elsewhere."""
import numpy as np
import pytest

from pq2verify import cases, registry
from pq2verify.report import errormap

# gemv on the interpreter at N=200: BN=128 column tiles, so the second tile is columns 128..199
CASE = next(c for c in cases.check_cases("small", paths=["gemv"], ms=[1], dtypes=["bf16"], layouts=["prepared"])
            if c.n == 200 and c.kind == "normal" and not c.strided)


def _tile_fault(lo, hi):
    real = registry.get(CASE.path).kernel()

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        y[:, lo:hi] *= 1.0625                   # 16 bf16 spacings off: far outside the bound
        return y
    return run


def _red(rgb):
    return (rgb[..., 0] > 0.6) & (rgb[..., 1] < 0.4) & (rgb[..., 2] < 0.4)


@pytest.fixture
def planted(cpu_only):
    bn = errormap.tiles(CASE.path, CASE.n, CASE.k, CASE.m, interpret=True)[3]["BN"]
    lo, hi = bn, min(2 * bn, CASE.n)
    assert hi > lo, "the case must have a second column tile"
    return errormap.of_case(CASE, "cpu", kernel=_tile_fault(lo, hi)), lo, hi


def test_the_map_is_outside_the_bound_exactly_on_the_wrong_block(planted):
    em, lo, hi = planted
    outside = ~(em.ratio <= 1.0)
    cols = np.flatnonzero(outside.any(0))
    assert cols.tolist() == list(range(lo, hi)), cols
    assert lo in em.col_tiles, "the tile boundary is marked where the fault starts"


def test_the_picture_is_hot_exactly_over_the_block(planted, tmp_path):
    em, lo, hi = planted
    fig = errormap.figure(em)
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
    ax = fig.axes[0]
    height = img.shape[0]
    (x0, y0), (x1, y1) = ax.transData.transform([(0, em.ratio.shape[0]), (em.ratio.shape[1], 0)])
    rows = slice(int(height - y1) + 2, int(height - y0) - 2)         # display y runs upward

    def px(col):                                                      # data column -> pixel column
        return ax.transData.transform([(col, 0)])[0][0]
    hot = _red(img[rows])
    inside = hot[:, int(px(lo)) + 3:int(px(hi)) - 3]
    left = hot[:, int(px(0)) + 3:int(px(lo)) - 3]
    right = hot[:, int(px(hi)) + 3:int(x1) - 3] if hi < em.ratio.shape[1] else np.zeros((1, 0), bool)
    assert inside.size and inside.mean() > 0.95, f"the wrong block is not red: {inside.mean():.2f} red"
    assert not left.any() and not right.any(), "red outside the wrong block"
    png = tmp_path / "map.png"
    errormap.write(em, png)
    import matplotlib.image
    got = matplotlib.image.imread(png)
    assert got.shape[:2] == img.shape[:2] and _red(got[rows, int(px(lo)) + 3:int(px(hi)) - 3, :3]).mean() > 0.95


def test_on_sampled_columns_the_boundaries_fall_between_the_samples():
    """Large N: the engine compares sampled columns only; the map keeps them in order of n and
    puts a tile boundary between the two samples on either side of it."""
    n, k, m = 1000, 384, 17
    rng = np.random.default_rng(0)
    cols = np.concatenate([[0, n - 1], rng.choice(np.arange(1, n - 1), 254, replace=False)])
    bn = errormap.tiles("mmq", n, k, m, interpret=True)[3]["BN"]
    ref = rng.standard_normal((m, cols.size))
    bound = np.full_like(ref, 1e-2)
    y = ref + np.where((cols >= bn) & (cols < 2 * bn), 0.5, 0.0)        # the second column tile wrong
    em = errormap.from_arrays("x", "mmq", y, ref, bound, cols, n, k, interpret=True)
    assert (np.diff(em.cols) > 0).all() and em.ratio.shape == (m, cols.size)
    hot = np.flatnonzero((em.ratio > 1).any(0))
    assert ((em.cols[hot] >= bn) & (em.cols[hot] < 2 * bn)).all() and hot.size == ((cols >= bn) & (cols < 2 * bn)).sum()
    assert hot[0] in em.col_tiles and hot[-1] + 1 in em.col_tiles
    assert [int(em.cols[i] // bn) for i in em.col_tiles] == list(range(1, -(-n // bn)))


def test_the_map_of_a_cpu_run_names_the_interpreters_tiles(cpu_only):
    """A case run on the CPU ran the interpreter's config, so its map carries that config (the
    one gemv.config gives with interpret=True), not the GPU's, which differs for this shape."""
    from kernels import gemv
    em = errormap.of_case(CASE, "cpu")
    want = gemv.config(CASE.n, CASE.k, CASE.m, interpret=True)
    assert want != gemv.config(CASE.n, CASE.k, CASE.m, interpret=False), "the shape must tell the two apart"
    assert em.config == want, (em.config, want, "reproduce: .venv/bin/python -m pytest -q -p no:randomly "
                            "'tests/test_report_errormap.py::test_the_map_of_a_cpu_run_names_the_interpreters_tiles'")
