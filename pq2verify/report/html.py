"""Self-contained HTML pages for reports (`--html F` of check, golden, gsm8k, bench): one file
with its styles and images inline, readable offline and attachable to a CI run as it is."""
import base64
import html
import re

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


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_CELL = re.compile(r"(?<!\\)\|")


def inline(text: str) -> str:
    """Markdown's inline marks our reports write, as HTML: `code`, **bold**, ![alt](file) (a
    link to the file beside the page); everything else escaped."""
    out, last = [], 0
    for m in _CODE.finditer(text):             # code first: nothing inside it is markup
        out.append(_marks(text[last:m.start()]) + f"<code>{esc(m.group(1))}</code>")
        last = m.end()
    return "".join(out) + _marks(text[last:])


def _marks(text: str) -> str:
    t = esc(text)
    t = _IMAGE.sub(lambda m: f'<a href="{m.group(2)}">{m.group(1) or m.group(2)}</a>', t)
    return _BOLD.sub(lambda m: f"<b>{m.group(1)}</b>", t)


def _cells(row: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in _CELL.split(row.strip().strip("|"))]


def from_markdown(md: str) -> str:
    """The Markdown our reports write, as HTML: headings, tables, bullet lists, fenced code,
    paragraphs, and the inline marks of `inline`."""
    out, rows, items, fence = [], [], [], None

    def flush():
        if rows:
            cells = [_cells(r) for r in rows if not set(r.replace("|", "").strip()) <= set("-: ")]
            head = "".join(f"<th>{inline(c)}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            rows.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()
    for line in md.splitlines():
        if fence is not None:
            if line.strip().startswith("```"):
                out.append(pre("\n".join(fence)))
                fence = None
            else:
                fence.append(line.strip())
            continue
        if line.strip().startswith("```"):
            flush()
            fence = []
            continue
        if line.lstrip().startswith("|"):
            if items:
                flush()
            rows.append(line)
            continue
        if rows:
            flush()
        text = line.strip()
        if text.startswith("- ") and not text[2:].startswith("WARNING:"):
            items.append(text[2:])
            continue
        flush()
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 4)
            out.append(f"<h{level}>{inline(line.lstrip('#').strip())}</h{level}>")
        elif text.lstrip("- ").startswith("WARNING:"):
            out.append(warning(text.lstrip("- ")))      # provenance.markdown_lines' backend line
        elif text:
            out.append(f"<p>{inline(text)}</p>")
    if fence is not None:
        out.append(pre("\n".join(fence)))
    flush()
    return "\n".join(out)


def page(title: str, body: list[str]) -> str:
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n<body>\n<h1>{esc(title)}</h1>\n"
            + "\n".join(body) + "\n</body></html>\n")
