"""One table model for every report: columns, rows of cells, each cell plain, highlighted (the
metric that failed) or a command to copy; rendered to the console (rich), Markdown, HTML and
JSON from the same rows, so the four cannot disagree."""
import html as _html
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cell:
    text: str
    bad: bool = False        # the metric or check that failed: highlighted in every rendering
    code: bool = False       # a command, in its own cell, to copy as it is

    def __str__(self) -> str:
        return self.text


def cell(v, bad: bool = False) -> Cell:
    return v if isinstance(v, Cell) else Cell("-" if v is None else str(v), bad=bad)


def code(cmd: str) -> Cell:
    return Cell(cmd, code=True)


@dataclass
class Table:
    columns: tuple
    title: str = ""
    rows: list = field(default_factory=list)        # [(cells, status)], status '' | 'fail' | 'warn'

    def add(self, *cells, status: str = "") -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title or 'table'}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(([cell(c) for c in cells], status))

    def markdown(self) -> list[str]:
        def md(c: Cell) -> str:
            t = c.text.replace("|", "\\|")
            return f"`{t}`" if c.code else f"**{t}**" if c.bad and t else t
        return (["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
                + ["| " + " | ".join(md(c) for c in cells) + " |" for cells, _ in self.rows])

    def html(self) -> str:
        def td(c: Cell) -> str:
            t = _html.escape(c.text)
            if c.code:
                return f'<td class="repro"><code>{t}</code></td>'
            return f'<td class="bad">{t}</td>' if c.bad else f"<td>{t}</td>"
        out = ["<table><thead><tr>" + "".join(f"<th>{_html.escape(h)}</th>" for h in self.columns)
               + "</tr></thead><tbody>"]
        out += [f'<tr class="{_html.escape(s)}">' + "".join(td(c) for c in cells) + "</tr>" for cells, s in self.rows]
        return "\n".join(out + ["</tbody></table>"])

    def console(self, **kw):
        from rich import box
        from rich.markup import escape
        from rich.table import Table as Rich
        t = Rich(title=self.title or None, box=kw.pop("box", box.SIMPLE_HEAD), pad_edge=False, **kw)
        for c in self.columns:
            t.add_column(c, no_wrap=True)
        for cells, _ in self.rows:
            t.add_row(*(f"[red bold]{escape(c.text)}[/]" if c.bad else escape(c.text) for c in cells))
        return t

    def json(self) -> dict:
        return {"title": self.title, "columns": list(self.columns),
                "rows": [{"status": s, "cells": [c.text for c in cells],
                          "bad": [i for i, c in enumerate(cells) if c.bad]} for cells, s in self.rows]}
