"""A verdict must survive its rendering: a FAIL row reads FAIL and is marked in the Markdown,
the HTML, the console and the JSON of one table; no row or column is lost or reordered; a
failed verdict is never green; the error map counts and colours every output outside its
bound (a NaN among them) and keeps each column at its own n."""
import numpy as np
import pytest

from pq2verify.report import errormap, html as h
from pq2verify.report.table import Table, cell

F = "tests/test_render_verdicts.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q '{F}::{test}'"


def _table() -> Table:
    t = Table(("case", "verdict", "rel_rms"), title="checks")
    t.add("a:1", "PASS", "0.001")
    t.add("b:2", "FAIL", cell("0.9", bad=True), status="fail")
    t.add("c:3", "PASS", "0.002")
    return t


def test_a_fail_row_reads_fail_and_is_marked_in_markdown():
    t = "test_a_fail_row_reads_fail_and_is_marked_in_markdown"
    md = _table().markdown()
    assert md[0] == "| case | verdict | rel_rms |", (md, repro(t))
    assert md[2:] == ["| a:1 | PASS | 0.001 |", "| b:2 | FAIL | **0.9** |", "| c:3 | PASS | 0.002 |"], (md, repro(t))


def test_a_fail_row_reads_fail_and_is_marked_in_html():
    t = "test_a_fail_row_reads_fail_and_is_marked_in_html"
    page = _table().html()
    assert "<th>case</th><th>verdict</th><th>rel_rms</th>" in page, (page, repro(t))
    rows = [x for x in page.splitlines() if x.startswith("<tr")]
    assert rows == ['<tr class=""><td>a:1</td><td>PASS</td><td>0.001</td></tr>',
                    '<tr class="fail"><td>b:2</td><td>FAIL</td><td class="bad">0.9</td></tr>',
                    '<tr class=""><td>c:3</td><td>PASS</td><td>0.002</td></tr>'], (rows, repro(t))


def test_a_fail_row_is_marked_in_the_console_and_the_json():
    t = "test_a_fail_row_is_marked_in_the_console_and_the_json"
    from rich.console import Console
    con = Console(force_terminal=True, color_system="standard", width=120, record=True)
    con.print(_table().console())
    out = con.export_text(styles=True)
    bad = next(x for x in out.splitlines() if "b:2" in x)
    assert "FAIL" in bad and "\x1b[1;31m0.9" in bad, (repr(bad), repro(t))
    j = _table().json()
    assert [r["status"] for r in j["rows"]] == ["", "fail", ""] and j["rows"][1]["bad"] == [2], (j, repro(t))
    assert j["rows"][1]["cells"] == ["b:2", "FAIL", "0.9"], (j, repro(t))


def test_the_markdown_fail_row_reaches_the_html_page_as_fail():
    """Markdown -> HTML (the pages of gsm8k and bench): every row, in order, the bad mark bold."""
    t = "test_the_markdown_fail_row_reaches_the_html_page_as_fail"
    page = h.from_markdown("\n".join(_table().markdown()))
    body = page.split("<tbody>")[1]
    assert body.count("<tr>") == 3, (page, repro(t))
    assert "<tr><td>b:2</td><td>FAIL</td><td><b>0.9</b></td></tr>" in body, (page, repro(t))
    assert body.index("a:1") < body.index("b:2") < body.index("c:3"), (page, repro(t))


def test_a_failed_verdict_and_a_problem_list_are_never_green():
    t = "test_a_failed_verdict_and_a_problem_list_are_never_green"
    assert h.verdict(False, "FAIL: 1 of 3") == '<p class="verdict-fail">FAIL: 1 of 3</p>', repro(t)
    assert h.verdict(True, "PASS") == '<p class="verdict-pass">PASS</p>', repro(t)
    assert h.problems("not complete", ["shard 2 missing"]).startswith('<p class="verdict-fail">'), repro(t)
    tab = h.table(["case", "verdict"], [["a", "PASS"], ["b", "FAIL"]], ["", "fail"])
    assert '<tr class="fail"><td>b</td><td>FAIL</td></tr>' in tab, (tab, repro(t))


# --- the error map ------------------------------------------------------------------------------
def _map(monkeypatch, y, ref, bound, cols, bn=None):
    monkeypatch.setattr(errormap, "tiles", lambda *a, **k: ([], [], "", {"BN": bn} if bn else {}))
    n = max(cols) + 1
    return errormap.from_arrays("c", "p", np.array(y, float), np.array(ref, float), np.array(bound, float), cols, n,
                                128, True)


def test_a_nonfinite_output_is_outside_and_a_nan_reference_is_counted(monkeypatch):
    """y = [0.5, inf, 2, 1] against ref 0 (ref NaN at the last), bound 1: ratios 0.5, inf (a
    non-finite output), 2, NaN. Three are outside the bound, the one at exactly 1x would be
    inside: the figure's title counts 3."""
    t = "test_a_nonfinite_output_is_outside_and_a_nan_reference_is_counted"
    em = _map(monkeypatch, [[0.5, np.inf, 2.0, 1.0]], [[0, 0, 0, np.nan]], [[1, 1, 1, 1]], [0, 1, 2, 3])
    assert em.ratio[0, 1] == np.inf and np.isnan(em.ratio[0, 3]), (em.ratio, repro(t))
    title = errormap.figure(em).axes[0].get_title()
    assert "red: outside, 3 outputs" in title and "worst 2x" in title, (title, repro(t))


def test_a_ratio_of_exactly_one_is_coloured_inside(monkeypatch):
    """At exactly the bound (1x) an output is within it: blue (R 0.25, G 0.45, B 1), not red."""
    t = "test_a_ratio_of_exactly_one_is_coloured_inside"
    c = errormap.colours(np.array([[1.0, 1.5]]))
    assert tuple(c[0, 0, :3]) == pytest.approx((0.25, 0.45, 1.0)), (c, repro(t))
    assert c[0, 1, 0] > 0.7 and c[0, 1, 2] < 0.3, (c, repro(t))


def test_sampled_columns_are_put_in_order_and_tiles_fall_where_n_crosses_bn(monkeypatch):
    """Columns given as n = 64, 0, 10, 128 with ratios 4, 1, 2, 3: sorted to 0, 10, 64, 128 with
    ratios 1, 2, 4, 3; with BN = 64 tiles start at map columns 2 (n 64) and 3 (n 128)."""
    t = "test_sampled_columns_are_put_in_order_and_tiles_fall_where_n_crosses_bn"
    em = _map(monkeypatch, [[4.0, 1.0, 2.0, 3.0]], [[0, 0, 0, 0]], [[1, 1, 1, 1]], [64, 0, 10, 128], bn=64)
    assert list(em.cols) == [0, 10, 64, 128] and list(em.ratio[0]) == [1.0, 2.0, 4.0, 3.0], (em, repro(t))
    assert em.col_tiles == [2, 3], (em.col_tiles, repro(t))
