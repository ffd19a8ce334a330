"""Self-contained HTML pages for reports (`--html F` of check, golden, gsm8k, bench): one file
with its styles and images inline, readable offline and attachable to a CI run as it is."""
import base64
import html

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:110em;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f0f0f0;position:sticky;top:0}
tr.fail td{background:#fde8e8} tr.warn td{background:#fff6dc}
.verdict-pass{color:#176b2c;font-weight:bold} .verdict-fail{color:#b00020;font-weight:bold}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
.meta{color:#555;font-size:.85em} code{font-size:.9em}
.warn{background:#fff6dc;border:1px solid #d9a400;padding:.4em .6em}
td.bad{color:#b00020;font-weight:bold;background:#fbd0d0} td.repro code{user-select:all;white-space:nowrap}
"""


def esc(v) -> str:
    return html.escape("" if v is None else str(v))


def table(headers: list[str], rows: list[list], row_class: list[str] | None = None) -> str:
    """rows hold plain values (escaped here); row_class gives each row a class ('fail', 'warn')."""
    out = ["<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead><tbody>"]
    for i, r in enumerate(rows):
        cls = row_class[i] if row_class else ""
        out.append(f'<tr class="{esc(cls)}">' + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def verdict(ok: bool, text: str) -> str:
    return f'<p class="verdict-{"pass" if ok else "fail"}">{esc(text)}</p>'


def problems(title: str, items) -> str:
    """A red list of why a result is not what its table alone would suggest (not complete, a
    shard missing, self-checks skipped)."""
    return (f'<p class="verdict-fail">{esc(title)}</p><ul>'
            + "".join(f"<li>{esc(v)}</li>" for v in items) + "</ul>")


def pre(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


def meta(items: dict) -> str:
    """Provenance items as one grey line; a "backend_status" among them (provenance.collect's)
    is its own visible warning line where the backend lacks records, else left out."""
    from .. import backend_status
    warn = backend_status.line(items.get("backend_status"))
    rest = {k: v for k, v in items.items() if k != "backend_status"}
    return ('<p class="meta">' + " · ".join(f"{esc(k)}: {esc(v)}" for k, v in rest.items()) + "</p>"
            + (f"\n{warning(warn)}" if warn else ""))


def warning(text: str) -> str:
    return f'<p class="warn">{esc(text)}</p>'


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def from_markdown(md: str) -> str:
    """The subset of Markdown our reports write: headings, tables, bullet lines, paragraphs."""
    out, rows = [], []

    def flush():
        if rows:
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows
                     if not set(r.replace("|", "").strip()) <= set("-: ")]
            out.append(table(cells[0], cells[1:]))
            rows.clear()
    for line in md.splitlines():
        if line.lstrip().startswith("|"):
            rows.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 4)
            out.append(f"<h{level}>{esc(line.lstrip('#').strip())}</h{level}>")
        elif line.strip().lstrip("- ").startswith("WARNING:"):
            out.append(warning(line.strip().lstrip("- ")))      # provenance.markdown_lines' backend line
        elif line.strip():
            out.append(f"<p>{esc(line.strip())}</p>")
    flush()
    return "\n".join(out)


def page(title: str, body: list[str]) -> str:
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n<body>\n<h1>{esc(title)}</h1>\n"
            + "\n".join(body) + "\n</body></html>\n")
