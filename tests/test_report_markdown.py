"""Markdown as the HTML pages show it (report.html.from_markdown, used by the GSM8K and bench
pages): its marks are rendered, not shown raw, and an escaped pipe stays inside its cell."""
from pq2verify.report import html as h
from pq2verify.report.table import Cell, Table, code

MD = """# Title with `code`

**3 of 4 cases passed.**

- first **bad** item, run `./pq2 check --case a:b`
- second item

| path | value | reproduce |
|---|---|---|
| a\\|b | **9.9** | `./pq2 check --case x` |

```
./pq2 check --case x
```
"""


def test_marks_are_rendered_not_shown():
    page = h.from_markdown(MD)
    assert "**" not in page and "`" not in page, page
    assert "<h2>Title with <code>code</code></h2>" in page
    assert "<p><b>3 of 4 cases passed.</b></p>" in page
    assert "<ul><li>first <b>bad</b> item, run <code>./pq2 check --case a:b</code></li><li>second item</li></ul>" in page
    assert "<td>a|b</td><td><b>9.9</b></td><td><code>./pq2 check --case x</code></td>" in page
    assert "<pre>./pq2 check --case x</pre>" in page


def test_a_table_model_round_trips_through_markdown():
    t = Table(("name", "x", "cmd"))
    t.add("p|q", Cell("1.5", bad=True), code("./pq2 check --case p|q"))
    page = h.from_markdown("\n".join(t.markdown()))
    assert "<td>p|q</td><td><b>1.5</b></td><td><code>./pq2 check --case p|q</code></td>" in page, page
