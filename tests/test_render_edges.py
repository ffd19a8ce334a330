"""Edges of the rendering code that planted faults showed unpinned. The error map
(pq2verify.report.errormap): the exact colour of each class of element (inside, exactly at the
bound, just past it, far past it, non-finite), the count of outputs outside in the figure's title
with an element at exactly 1x counted inside, the tile boundaries and split-K sentence that
tiles() reads off a kernel's config, the row labels up to 24 rows, and the file-name slug. The
bench report (pq2verify.bench.report): the progress line of an error, an A == B, a skipped, a
timed shape and a timed step row; an error row's cells and red style in the console tables and
its cells in the Markdown; and the BF16 step sentence for each way the BF16 step was timed. Every
expected value is derived by hand from the inputs in the test's docstring."""
import sys
import types

import numpy as np
import pytest

from pq2verify import registry
from pq2verify.bench import report
from pq2verify.report import errormap

F = "tests/test_render_edges.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


# --- error map: colours --------------------------------------------------------------------------
def test_each_class_of_element_gets_its_own_colour():
    """colours() starts from white (1, 1, 1, 1) and sets R, G, B per class:
    - inside (ratio <= 1), t = ratio: R = 1 - 0.75 t, G = 1 - 0.55 t, B = 1. Ratio 0: white;
      0.5: (0.625, 0.725, 1); exactly 1.0 (at the bound, inside): (0.25, 0.45, 1).
    - outside (finite, > 1), s = clip(log10 ratio, 0, 1): R = 1 - 0.3 s, G = B = 0.25 (1 - s).
      1 + 1e-9: s ~ 4e-10, so (1, 0.25, 0.25) to 1e-6; 10: s = 1, (0.7, 0, 0); 100 saturates
      at s = 1: (0.7, 0, 0) too.
    - non-finite (inf, NaN): magenta (0.85, 0, 0.85).
    Alpha stays 1 everywhere."""
    t = "test_each_class_of_element_gets_its_own_colour"
    ratio = np.array([[0.0, 0.5, 1.0, 1.0 + 1e-9, 10.0, 100.0, np.inf, np.nan]])
    want = [(1.0, 1.0, 1.0, 1.0), (0.625, 0.725, 1.0, 1.0), (0.25, 0.45, 1.0, 1.0), (1.0, 0.25, 0.25, 1.0),
            (0.7, 0.0, 0.0, 1.0), (0.7, 0.0, 0.0, 1.0), (0.85, 0.0, 0.85, 1.0), (0.85, 0.0, 0.85, 1.0)]
    got = errormap.colours(ratio)
    assert got.shape == (1, 8, 4), (got.shape, repro(t))
    for j, (r, w) in enumerate(zip(ratio[0], want)):
        assert tuple(got[0, j]) == pytest.approx(w, abs=1e-6), (f"ratio {r}", tuple(got[0, j]), w, repro(t))


def test_an_element_at_exactly_its_bound_is_inside_and_just_past_it_is_red():
    """Ratio 1.0 is within the bound: blue-ish (B channel 1, R 0.25), never red and never left
    white; 1.0 + 1e-12 is outside: R ~ 1 with G and B ~ 0.25 (red). The two differ although their
    ratios differ by 1e-12."""
    t = "test_an_element_at_exactly_its_bound_is_inside_and_just_past_it_is_red"
    at, past = errormap.colours(np.array([[1.0, 1.0 + 1e-12]]))[0]
    assert tuple(at[:3]) == pytest.approx((0.25, 0.45, 1.0)), (at, repro(t))
    assert tuple(past[:3]) == pytest.approx((1.0, 0.25, 0.25), abs=1e-9), (past, repro(t))


# --- error map: the figure -----------------------------------------------------------------------
def _em(ratio, config=None, split="", cols=None):
    ratio = np.asarray(ratio, dtype=np.float64)
    cols = np.arange(ratio.shape[1]) if cols is None else np.asarray(cols)
    return errormap.ErrorMap("c", "p", ratio, cols, [], [], split, config or {})


def test_the_title_counts_an_element_at_exactly_1x_as_inside():
    """Ratios 1.0, 0.5, 2.0: only 2.0 is outside (1.0 is at the bound, inside), so the title says
    1 output; the worst finite ratio is 2 (:.3g gives '2'); no BM/BN in the config: 'no tiles'.
    With BM=16, BN=128 and a split-K sentence the tiles line names both, '; ' between. Ratios
    1.0, 1.0, inf: 1 outside (the inf), worst finite 1."""
    t = "test_the_title_counts_an_element_at_exactly_1x_as_inside"
    title = errormap.figure(_em([[1.0, 0.5, 2.0]])).axes[0].get_title()
    assert title == "p: |y - ref| / bound (red: outside, 1 outputs; worst 2x)\ntiles no tiles", (title, repro(t))
    sp = "split-K: 2 splits of 4 groups of 128 (each output sums all of them)"
    title = errormap.figure(_em([[1.0, 1.0, np.inf]], {"BM": 16, "BN": 128}, sp)).axes[0].get_title()
    assert title == ("p: |y - ref| / bound (red: outside, 1 outputs; worst 1x)\ntiles BM=16, BN=128; " + sp), \
        (title, repro(t))


def test_rows_are_labelled_one_by_one_up_to_24_rows_only():
    """m = 24 rows: each row i gets a tick at i + 0.5 (its cell's centre) labelled str(i), 0..23.
    m = 25: the labels are left to matplotlib's own locator, which puts ticks on whole numbers
    (no tick at a half-integer), so not 25 per-row labels."""
    t = "test_rows_are_labelled_one_by_one_up_to_24_rows_only"
    ax = errormap.figure(_em(np.zeros((24, 3)))).axes[0]
    assert list(ax.get_yticks()) == [i + 0.5 for i in range(24)], (list(ax.get_yticks()), repro(t))
    assert [x.get_text() for x in ax.get_yticklabels()] == [str(i) for i in range(24)], repro(t)
    ax = errormap.figure(_em(np.zeros((25, 3)))).axes[0]
    ticks = list(ax.get_yticks())
    assert ticks and all(float(v).is_integer() for v in ticks), (ticks, repro(t))
    assert [x.get_text() for x in ax.get_yticklabels()] != [str(i) for i in range(25)], repro(t)


# --- error map: the figure's size, image, lines, title and column ticks ---------------------------
def test_the_figure_is_sized_from_its_shape_and_capped():
    """figsize = (min(12, 3 + n / 40), min(6, 1.6 + m / 6)) inches at 100 dpi.
    - m = 6 rows, n = 40 columns: (min(12, 3 + 1), min(6, 1.6 + 1)) = (4, 2.6) inches, so a PNG
      of 400 x 260 pixels.
    - m = 60, n = 800: 3 + 20 = 23 and 1.6 + 10 = 11.6 are both over their caps: (12, 6)."""
    t = "test_the_figure_is_sized_from_its_shape_and_capped"
    fig = errormap.figure(_em(np.zeros((6, 40))))
    assert fig.dpi == 100, (fig.dpi, repro(t))
    assert tuple(fig.get_size_inches()) == pytest.approx((4.0, 2.6)), (fig.get_size_inches(), repro(t))
    assert fig.canvas.get_width_height() == (400, 260), (fig.canvas.get_width_height(), repro(t))
    fig = errormap.figure(_em(np.zeros((60, 800))))
    assert tuple(fig.get_size_inches()) == pytest.approx((12.0, 6.0)), (fig.get_size_inches(), repro(t))


def test_the_image_covers_the_cells_and_the_tile_lines_are_thin_black_dashes():
    """A 2 x 3 map is drawn over extent (left 0, right 3, bottom 2, top 0): cell (i, j) spans
    x in [j, j + 1], y in [i, i + 1], row 0 on top. A column tile starting at map column 2 is
    one vertical line at x = 2, a row tile at row 1 one horizontal line at y = 1; both black,
    0.8 points wide, dashed ('--'). The title is set in 8 points."""
    t = "test_the_image_covers_the_cells_and_the_tile_lines_are_thin_black_dashes"
    em = errormap.ErrorMap("c", "p", np.zeros((2, 3)), np.arange(3), [1], [2], "", {})
    ax = errormap.figure(em).axes[0]
    assert tuple(ax.get_images()[0].get_extent()) == (0, 3, 2, 0), (ax.get_images()[0].get_extent(), repro(t))
    assert len(ax.lines) == 2, (ax.lines, repro(t))
    v, h = ax.lines
    assert list(v.get_xdata()) == [2, 2] and list(h.get_ydata()) == [1, 1], (v.get_xdata(), h.get_ydata(), repro(t))
    for line in (v, h):
        assert (line.get_linewidth(), line.get_linestyle(), line.get_color()) == (0.8, "--", "black"), (
            line.get_linewidth(), line.get_linestyle(), line.get_color(), repro(t))
    assert ax.title.get_fontsize() == 8, (ax.title.get_fontsize(), repro(t))


def test_a_map_with_no_finite_ratio_reports_worst_0x():
    """Ratios inf (a non-finite output) and NaN (a NaN reference): both outside, so 2 outputs;
    no finite ratio to take the worst of, so the title says 0x (:.3g of 0 is '0')."""
    t = "test_a_map_with_no_finite_ratio_reports_worst_0x"
    title = errormap.figure(_em([[np.inf, np.nan]])).axes[0].get_title()
    assert title == "p: |y - ref| / bound (red: outside, 2 outputs; worst 0x)\ntiles no tiles", (title, repro(t))


def test_sampled_columns_are_labelled_by_their_n_and_all_columns_are_not():
    """cols = 0, 1, 2 (every column, in order): the plain label 'output column n' and
    matplotlib's own ticks (none at a half-integer).
    cols = 5, 10, 20 (sampled): min(8, 3) = 3 ticks at linspace(0, 2, 3) = map columns 0, 1, 2,
    placed at their centres 0.5, 1.5, 2.5 and labelled by their n '5', '10', '20'; the label
    names 3 sampled columns.
    cols = 0, 2, .., 38 (20 sampled): min(8, 20) = 8 ticks at linspace(0, 19, 8) = k * 19 / 7,
    k = 0..7 = 0, 2.71, 5.43, 8.14, 10.86, 13.57, 16.29, 19, cut to 0, 2, 5, 8, 10, 13, 16, 19
    (none is within 0.1 of the next integer); centres t + 0.5, labels n = 2 t."""
    t = "test_sampled_columns_are_labelled_by_their_n_and_all_columns_are_not"
    ax = errormap.figure(_em(np.zeros((2, 3)))).axes[0]
    assert ax.get_xlabel() == "output column n", (ax.get_xlabel(), repro(t))
    assert not any(float(v) % 1 == 0.5 for v in ax.get_xticks()), (list(ax.get_xticks()), repro(t))
    ax = errormap.figure(_em(np.zeros((2, 3)), cols=[5, 10, 20])).axes[0]
    assert ax.get_xlabel() == "output column n (3 sampled columns, in order)", (ax.get_xlabel(), repro(t))
    assert list(ax.get_xticks()) == [0.5, 1.5, 2.5], (list(ax.get_xticks()), repro(t))
    assert [x.get_text() for x in ax.get_xticklabels()] == ["5", "10", "20"], repro(t)
    ax = errormap.figure(_em(np.zeros((2, 20)), cols=2 * np.arange(20))).axes[0]
    idx = [0, 2, 5, 8, 10, 13, 16, 19]
    assert ax.get_xlabel() == "output column n (20 sampled columns, in order)", (ax.get_xlabel(), repro(t))
    assert list(ax.get_xticks()) == [i + 0.5 for i in idx], (list(ax.get_xticks()), repro(t))
    assert [x.get_text() for x in ax.get_xticklabels()] == [str(2 * i) for i in idx], repro(t)


# --- error map: tiles from a config --------------------------------------------------------------
@pytest.fixture
def config_of(monkeypatch):
    """Make tiles() read the config dict given (its path's module is a fake whose config returns
    it; None: config raises, as for a library path)."""
    holder = {}
    mod = types.ModuleType("fake_errormap_config")

    def config(n, k, m, interpret=False):
        if holder["cfg"] is None:
            raise ValueError("no config for this shape")
        return holder["cfg"]
    mod.config = config
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setattr(registry, "get", lambda name: types.SimpleNamespace(module=mod.__name__))

    def set_(cfg):
        holder["cfg"] = cfg
        return errormap.tiles("fake", 300, 1024, 40, interpret=True)
    return set_


def test_tiles_name_the_split_in_groups_or_in_k(config_of):
    """n = 300, k = 1024 (8 groups of 128), m = 40.
    - BM 16, BN 128, groups_per_split 4, SPLIT 2: rows start at 16, 32 (range(16, 40, 16)),
      columns at 128, 256; split-K given: 2 splits of 4 groups of 128.
    - groups_per_split 8, SPLIT 1: one split, no sentence; no BM/BN: no boundaries.
    - groups_per_split 2, no SPLIT: ceil(8 groups / 2) = 4 splits of 2 groups of 128.
    - groups_per_split 8 (all of them), no SPLIT: ceil(8 / 8) = 1, no sentence.
    - k_per_split 256, no SPLIT (K-tiled): ceil(1024 K / 256) = 4 splits of 256 K.
    - k_per_split 512, SPLIT 2: 2 splits of 512 K.
    - a config that raises: no boundaries, no split, config {}."""
    t = "test_tiles_name_the_split_in_groups_or_in_k"

    def sp(s, per, unit):
        return f"split-K: {s} splits of {per} {unit} (each output sums all of them)"
    cases = [({"BM": 16, "BN": 128, "groups_per_split": 4, "SPLIT": 2}, [16, 32], [128, 256], sp(2, 4, "groups of 128")),
             ({"groups_per_split": 8, "SPLIT": 1}, [], [], ""),
             ({"groups_per_split": 2}, [], [], sp(4, 2, "groups of 128")),
             ({"groups_per_split": 8}, [], [], ""),
             ({"BN": 64, "k_per_split": 256}, [], [64, 128, 192, 256], sp(4, 256, "K")),
             ({"k_per_split": 512, "SPLIT": 2}, [], [], sp(2, 512, "K"))]
    for cfg, rows, cols, split in cases:
        got = config_of(cfg)
        assert got == (rows, cols, split, cfg), (cfg, got, repro(t))
    assert config_of(None) == ([], [], "", {}), repro(t)


def test_one_group_per_split_counts_every_group_of_128(config_of):
    """k = 1024 is 1024 // 128 = 8 groups; groups_per_split 1, no SPLIT: ceil(8 / 1) = 8 splits
    of 1 group (dividing K by anything but 128 would give another count, e.g. 1024 // 129 = 7)."""
    t = "test_one_group_per_split_counts_every_group_of_128"
    got = config_of({"groups_per_split": 1})
    assert got[2] == "split-K: 8 splits of 1 groups of 128 (each output sums all of them)", (got, repro(t))


def test_the_maps_tiles_come_from_its_rows_and_a_boundary_after_the_first_column(config_of):
    """BM 16, BN 64; y is 40 rows x 3 compared columns at n = 0, 64, 128 (the map is taller than
    wide). Row tiles from the 40 rows: range(16, 40, 16) = 16, 32. Column tiles: n // 64 is
    0, 1, 2, so a tile starts at map column 1 (the first column after column 0) and at 2."""
    t = "test_the_maps_tiles_come_from_its_rows_and_a_boundary_after_the_first_column"
    config_of({"BM": 16, "BN": 64})
    z = np.zeros((40, 3))
    em = errormap.from_arrays("c", "fake", z, z, np.ones((40, 3)), [0, 64, 128], 192, 1024, interpret=True)
    assert (em.row_tiles, em.col_tiles) == ([16, 32], [1, 2]), (em.row_tiles, em.col_tiles, repro(t))


# --- error map: file names -----------------------------------------------------------------------
def test_the_slug_keeps_letters_digits_dash_and_underscore_only():
    """'gemv:bf16-prepared_m1/n 200.x' keeps letters, digits, '-' and '_' and turns ':', '/',
    ' ' and '.' into '_': 'gemv_bf16-prepared_m1_n_200_x'. 130 characters are cut to 120."""
    t = "test_the_slug_keeps_letters_digits_dash_and_underscore_only"
    assert errormap.slug("gemv:bf16-prepared_m1/n 200.x") == "gemv_bf16-prepared_m1_n_200_x", repro(t)
    assert errormap.slug("a-_b") == "a-_b", repro(t)
    assert errormap.slug("x" * 130) == "x" * 120, repro(t)


# --- bench report: progress lines ----------------------------------------------------------------
def _shape_row(**kw):
    return {"kind": "shape", "key": "shape:out:m1", "shape": "out", "n": 5120, "k": 6144, "m": 1, "ratios": {},
            "sides": {"a": {"path": "int_gemv", "gate": "PASS"}, "b": {"path": "gemv", "gate": "PASS"},
                      "bf16": {"path": "cublas", "gate": "PASS"}}, **kw}


def _step_row(**kw):
    return {"kind": "step", "key": "step:m1", "m": 1, "calls": 305, "dense_calls": 48, "ratios": {},
            "sides": {"a": {"paths": {"out": "int_gemv", "down": "int_gemv"}, "gate": "PASS"},
                      "b": {"paths": {"out": "gemv", "down": "single"}, "gate": "PASS"},
                      "bf16": {"paths": {"out": "cublas", "down": "cublas"}, "gate": "PASS"}}, **kw}


def test_an_error_row_prints_its_key_and_error():
    """An item that raised: '[i/n] key: ERROR error', whatever its kind."""
    t = "test_an_error_row_prints_its_key_and_error"
    for row in ({"kind": "shape", "key": "shape:out:m1", "status": "error", "error": "CUDA out of memory"},
                {"kind": "step", "key": "step:m1", "status": "error", "error": "CUDA out of memory"}):
        got = report.progress_line(3, 9, row)
        assert got == f"[3/9] {row['key']}: ERROR CUDA out of memory", (got, repro(t))


def test_an_a_equals_b_row_prints_its_note_under_its_kind():
    """status 'same': '<what>: note', what = 'out M=1' for a shape row (no N x K), 'decode step
    M=1' for a step row."""
    t = "test_an_a_equals_b_row_prints_its_note_under_its_kind"
    got = report.progress_line(1, 2, _shape_row(status="same", note="A == B (gemv), not timed"))
    assert got == "[1/2] out M=1: A == B (gemv), not timed", (got, repro(t))
    got = report.progress_line(2, 2, _step_row(status="same", note="A == B (every shape on the same path), not timed"))
    assert got == "[2/2] decode step M=1: A == B (every shape on the same path), not timed", (got, repro(t))


def test_a_skipped_row_prints_its_sides_and_why():
    """Skipped (no GPU): no times, no ratios, no %BW or %floor bit (neither is set), and the note
    last. Shape: 'out 5120x6144 M=1: A int_gemv PASS | B gemv PASS | BF16 cublas PASS | note'.
    Step: the label counts its calls, each side names its distinct paths sorted and joined by
    '+': 'decode step M=1 (305 calls): A int_gemv PASS | B gemv+single PASS | BF16 cublas PASS
    | note'. A launch row: 'launch cost out M=2048: note'; an A/A row: 'A/A out M=1 int_gemv:
    note', and a blocked A/A row says BLOCKED."""
    t = "test_a_skipped_row_prints_its_sides_and_why"
    got = report.progress_line(2, 9, _shape_row(status="skipped", note="no GPU: a dry run"))
    assert got == "[2/9] out 5120x6144 M=1: A int_gemv PASS | B gemv PASS | BF16 cublas PASS | no GPU: a dry run", \
        (got, repro(t))
    got = report.progress_line(5, 9, _step_row(status="skipped", note="no GPU", floor_ms=None))
    assert got == "[5/9] decode step M=1 (305 calls): A int_gemv PASS | B gemv+single PASS | BF16 cublas PASS | no GPU", \
        (got, repro(t))
    launch = {"kind": "launch", "key": "launch:out:m2048", "shape": "out", "m": 2048, "status": "skipped",
              "note": "no GPU"}
    assert report.progress_line(4, 9, launch) == "[4/9] launch cost out M=2048: no GPU", repro(t)
    aa = {"kind": "aa", "key": "aa:first", "shape": "out", "m": 1, "status": "skipped", "note": "no GPU",
          "sides": {"a": {"path": "int_gemv", "gate": "PASS"}}}
    assert report.progress_line(1, 9, aa) == "[1/9] A/A out M=1 int_gemv: no GPU", repro(t)
    assert report.progress_line(1, 9, {**aa, "status": "blocked"}) == "[1/9] A/A out M=1 int_gemv: BLOCKED", repro(t)


def test_a_timed_shape_row_prints_its_percent_of_bandwidth():
    """A 20 µs, B 10 µs (one decimal for µs), B/A 2.00x [1.90-2.10], B at 0.8 of the bandwidth:
    '80%', SM clock median 1980 (1900-1995). No 'of floor' bit: that is the step's."""
    t = "test_a_timed_shape_row_prints_its_percent_of_bandwidth"
    row = _shape_row(status="timed", ratios={"b_over_a": {"median": 2.0, "lo": 1.9, "hi": 2.1}})
    row["sides"] = {"a": {"path": "int_gemv", "gate": "PASS", "time": {"median": 20.0}},
                    "b": {"path": "gemv", "gate": "PASS", "time": {"median": 10.0}, "pct_bw": 0.8,
                          "clocks": {"sm_mhz": {"median": 1980.0, "min": 1900.0, "max": 1995.0}}}}
    got = report.progress_line(2, 5, row)
    assert got == ("[2/5] out 5120x6144 M=1: A int_gemv PASS 20.0 µs | B gemv PASS 10.0 µs | B/A 2.00x [1.90-2.10] | "
                   "B 80% of BW, SM 1980 (1900-1995) MHz"), (got, repro(t))


def test_a_timed_step_row_prints_its_percent_of_the_floor():
    """A 2.5 ms, B 1.5 ms (three decimals for ms), B/A 1.67x [1.60-1.70], B at 0.8 of a floor of
    1.25 ms: 'B at 80% of floor 1.250 ms'. A stray pct_bw on the step's B is not shown ('of BW'
    is the shape's)."""
    t = "test_a_timed_step_row_prints_its_percent_of_the_floor"
    row = _step_row(status="timed", floor_ms=1.25, ratios={"b_over_a": {"median": 1.666, "lo": 1.6, "hi": 1.7}})
    row["sides"] = {"a": {"paths": {"out": "int_gemv"}, "gate": "PASS", "time": {"median": 2.5}},
                    "b": {"paths": {"out": "gemv", "down": "single"}, "gate": "PASS", "time": {"median": 1.5},
                          "pct_floor": 0.8, "pct_bw": 0.5}}
    got = report.progress_line(7, 9, row)
    assert got == ("[7/9] decode step M=1 (305 calls): A int_gemv PASS 2.500 ms | B gemv+single PASS 1.500 ms | "
                   "B/A 1.67x [1.60-1.70] | B at 80% of floor 1.250 ms"), (got, repro(t))


# --- bench report: error rows in the tables -------------------------------------------------------
CFG = {"a": "legacy", "b": "tuned", "dtype": "bf16", "layout": "prepared", "pairs": 7, "warmup": 1, "rotate_gb": 1,
       "min_sample_ms": 1, "reruns": 1, "budget_s": 10}


def _res(rows):
    return {"header": {"provenance": {}}, "config": CFG, "targets": [], "rows": rows}


def _error(kind, **kw):
    return {"kind": kind, "key": f"{kind}:x", "status": "error", "error": "boom", **kw}


def test_error_cells_fill_every_column_after_the_error():
    """_error_cells: the row's identity (shape: shape, M; A/A: key, shape, M; step: M), then
    'ERROR: <error>', then '-' up to n cells. Shape out M=1, n = 5: ['out', '1', 'ERROR: boom',
    '-', '-']; a shape row without a shape: '-' for it; A/A n = 6: ['aa:x', 'out', '1',
    'ERROR: boom', '-', '-']; step M=4, n = 3: ['4', 'ERROR: boom', '-']."""
    t = "test_error_cells_fill_every_column_after_the_error"
    assert report._error_cells(_error("shape", shape="out", m=1), 5) == ["out", "1", "ERROR: boom", "-", "-"], repro(t)
    assert report._error_cells(_error("shape", m=1), 3) == ["-", "1", "ERROR: boom"], repro(t)
    assert report._error_cells(_error("aa", shape="out", m=1), 6) == ["aa:x", "out", "1", "ERROR: boom", "-", "-"], \
        repro(t)
    assert report._error_cells(_error("step", m=4), 3) == ["4", "ERROR: boom", "-"], repro(t)


def test_console_error_and_blocked_rows_are_red_and_the_error_row_is_its_error_cells():
    """Per shape table (19 columns): a timed row (unstyled), a blocked row and an error row (both
    red). The error row's cells are exactly _error_cells: 'out', '2', 'ERROR: boom', then 16 '-';
    the timed row's gate column reads PASS, the blocked row's 'BLOCKED b'. The step table and the
    SOL table show the step error row as '4', 'ERROR: boom' and '-' to their widths, red."""
    t = "test_console_error_and_blocked_rows_are_red_and_the_error_row_is_its_error_cells"
    timed = _shape_row(status="timed")
    blocked = _shape_row(status="blocked", m=17, key="shape:out:m17")
    blocked["sides"]["b"]["gate"] = "BLOCKED"
    err = _error("shape", shape="out", m=2)
    serr = _error("step", m=4)
    tables = report.console_tables(_res([timed, blocked, err, serr]))
    head = report.title(_res([])) + ": "

    def by(name):
        return next(tb for tb in tables if tb.title == head + name)
    sh = by("per shape (µs per call)")
    rows = list(zip(*[list(c.cells) for c in sh.columns]))
    assert [r[1] for r in rows] == ["1", "2", "17"], (rows, repro(t))      # by M
    assert [r.style for r in sh.rows] == [None, "red", "red"], ([r.style for r in sh.rows], repro(t))
    assert list(rows[1]) == ["out", "2", "ERROR: boom"] + ["-"] * 16, (rows[1], repro(t))
    assert rows[0][4] == "PASS" and rows[2][4] == "BLOCKED b", (rows, repro(t))
    for name, n in (("chained decode step (ms per step)", 16), ("decode step against the speed of light", 12)):
        st = by(name)
        rows = list(zip(*[list(c.cells) for c in st.columns]))
        assert rows == [tuple(["4", "ERROR: boom"] + ["-"] * (n - 2))], (name, rows, repro(t))
        assert [r.style for r in st.rows] == ["red"], (name, repro(t))


def test_markdown_error_rows_are_their_error_cells_in_bold():
    """In the Markdown every error row is _error_cells, its ERROR cell bold: the A/A row 'aa:x |
    out | 1 | **ERROR: boom** |' then four '-' (8 columns); the step table (16 columns) and the SOL
    table (12) '| 4 | **ERROR: boom** |' then 14 and 10 '-'; the shape table (19) '| out | 2 |
    **ERROR: boom** |' then 16 '-'."""
    t = "test_markdown_error_rows_are_their_error_cells_in_bold"
    md = report.markdown(_res([_error("aa", shape="out", m=1), _error("step", m=4),
                               _error("shape", shape="out", m=2)]), None).splitlines()

    def line(cells):
        return "| " + " | ".join(cells) + " |"
    assert line(["aa:x", "out", "1", "**ERROR: boom**"] + ["-"] * 4) in md, (md, repro(t))
    for n in (16, 12):
        assert line(["4", "**ERROR: boom**"] + ["-"] * (n - 2)) in md, (n, md, repro(t))
    assert line(["out", "2", "**ERROR: boom**"] + ["-"] * 16) in md, (md, repro(t))


# --- bench report: the BF16 step sentence ------------------------------------------------------
def _timed_step(m, method):
    return _step_row(m=m, key=f"step:m{m}", status="timed", floor_ms=1.25, weight_bytes=15e9,
                     bf16_bytes=54_321_000_000,
                     sides={"a": {"paths": {"out": "int_gemv"}, "gate": "PASS"},
                            "b": {"paths": {"out": "gemv"}, "gate": "PASS"},
                            "bf16": {"paths": {"out": "cublas"}, "gate": "PASS", "method": method}})


GRAPH = "one chained graph of 305 distinct bf16 weight copies (54.3 GB)"
SUM = "sum of the per-shape cuBLAS medians of this run times the calls per step"


@pytest.mark.parametrize("methods, want", [
    (("graph",), "BF16 step: " + GRAPH),
    (("sum",), "BF16 step: " + SUM),
    (("graph", "sum"), "BF16 step: " + GRAPH + "; " + SUM),
])
def test_the_bf16_step_sentence_names_how_it_was_timed(methods, want):
    """305 calls and 54,321,000,000 BF16 bytes: 54.321 GB, shown to one decimal, 54.3. A step
    timed as one graph names the graph; one timed as the sum of per-shape medians names the sum;
    a run with both (one step each) names both, graph first, joined by '; '."""
    t = "test_the_bf16_step_sentence_names_how_it_was_timed"
    md = report.markdown(_res([_timed_step(i + 1, m) for i, m in enumerate(methods)]), None).splitlines()
    got = [x for x in md if x.startswith("BF16 step:")]
    assert got == [want], (got, repro(t))


def test_a_run_whose_steps_were_not_timed_says_so_for_bf16():
    """A step row skipped before timing (no bf16 method recorded) leaves no method to name: the
    sentence says the BF16 step was not timed instead of ending at 'BF16 step: '."""
    t = "test_a_run_whose_steps_were_not_timed_says_so_for_bf16"
    row = _step_row(status="skipped", why="no GPU", floor_ms=1.25, weight_bytes=15e9)
    md = report.markdown(_res([row]), None).splitlines()
    got = [x for x in md if x.startswith("BF16 step:")]
    assert got == ["BF16 step: not timed (no step row was timed)"], (got, repro(t))


def test_a_failed_fit_row_has_as_many_cells_as_the_fit_table():
    """A side whose fit raised still fills a row of the fit table: shape, M, side, path, the
    error, then a dash for each of the remaining columns, len(FIT_COLS) cells in all."""
    t = "test_a_failed_fit_row_has_as_many_cells_as_the_fit_table"
    row = {"kind": "shape", "key": "shape:out:m1", "shape": "out", "m": 1, "status": "timed",
           "sides": {"a": {"path": "int_gemv", "fit_error": "one byte count"}}}
    rows = report.fit_rows(_res([row]))
    assert rows == [["out", "1", "A", "int_gemv", "ERROR: one byte count"] + ["-"] * (len(report.FIT_COLS) - 5)], (
        rows, repro(t))


def test_a_report_is_written_into_a_folder_that_exists(tmp_path):
    """Writing the report twice into the same folder (a rerun): the folder exists the second
    time, and both writes succeed with the Markdown in place."""
    t = "test_a_report_is_written_into_a_folder_that_exists"
    md = tmp_path / "out" / "bench.md"
    for _ in range(2):
        path, _ = report.write(_res([]), md)
        assert path == md and md.read_text().startswith("#"), repro(t)
