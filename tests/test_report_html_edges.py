"""Edges of the HTML rendering of the suite's Markdown reports (pq2verify.report.html) that
fault injection found unpinned: the provenance line, a table whose separator row carries
alignment colons, the header row, and a WARNING bullet. Each expected string is written out by
hand from the Markdown given."""
import pytest

from pq2verify.report import html

F = "tests/test_report_html_edges.py"


def _repro(test):
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


def test_the_provenance_line_lists_every_item_but_the_backend_status():
    """Items commit=abc and gpu=H200, with no backend status to warn of: one grey line
    'commit: abc · gpu: H200', the status key itself never shown."""
    got = html.meta({"commit": "abc", "gpu": "H200", "backend_status": None})
    assert got == '<p class="meta">commit: abc · gpu: H200</p>', (got, _repro(
        "test_the_provenance_line_lists_every_item_but_the_backend_status"))


# (Markdown, the HTML written out from it): a separator with alignment colons holds exactly the
# characters '-', ':' and ' ', so it is no data row; the header is the first row, the body the rest
TABLES = [
    ("| a | b |\n| :--- | ---: |\n| 1 | 2 |",
     "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table>"),
    ("| x | y |\n| --- | --- |\n| 1 | 2 |\n| 3 | 4 |",
     "<table><thead><tr><th>x</th><th>y</th></tr></thead><tbody>"
     "<tr><td>1</td><td>2</td></tr><tr><td>3</td><td>4</td></tr></tbody></table>"),
]


@pytest.mark.parametrize("md, want", TABLES, ids=["aligned-separator", "two-body-rows"])
def test_a_table_is_its_header_row_then_its_body_rows(md, want):
    """'| :--- | ---: |' is a separator, not a row reading ':---'; the head is a, b (x, y) and the
    body the one row 1, 2 (the two rows 1, 2 and 3, 4)."""
    got = html.from_markdown(md)
    assert got == want, (got, _repro("test_a_table_is_its_header_row_then_its_body_rows"))


def test_a_warning_bullet_is_a_warning_not_a_list_item():
    """'- WARNING: no records' is the provenance's backend line: a warning paragraph with the
    dash dropped. '- plain' beside it is an ordinary list item."""
    got = html.from_markdown("- plain\n- WARNING: no records")
    want = '<ul><li>plain</li></ul>\n<p class="warn">WARNING: no records</p>'
    assert got == want, (got, _repro("test_a_warning_bullet_is_a_warning_not_a_list_item"))
