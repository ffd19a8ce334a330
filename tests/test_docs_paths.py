"""Every file or folder the docs cite exists: a `path/like.py` (any cited file with a slash and an
extension) or a `folder/` in docs/*.md or README.md names something in the tree, relative to the
repository root. A module moved without its citations fails here, not in a reader's hands.

A citation with a placeholder (`golden/<key>/`, `exact-<key>.json`) or a wildcard is not a path
and is left out; so are URLs."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
EXTENSIONS = ("py", "md", "json", "sh", "toml", "yml", "yaml", "txt", "log", "csv", "jsonl", "safetensors")

# a run of path characters holding at least one slash, not glued to a word, a dot or a URL before it
# Files a page shows how to create: docs/ADDING_A_PATH.md's example path, which
# tests/test_adding_a_path.py installs from the page itself. Each must stay absent from the tree.
EXAMPLES = {"kernels/rowdot.py"}

_TOKEN = re.compile(r"(?<![\w./:<>*-])((?:[\w.-]+/)+[\w.-]*)")


def cited(text: str) -> list[str]:
    """The file and folder paths a Markdown text cites, in order, each once."""
    out = []
    for m in _TOKEN.finditer(text):
        tok = m.group(1)
        after = text[m.end():m.end() + 1]
        if after in ("<", "*", "{") or tok.startswith(("http", "www.")):
            continue                                           # a placeholder, a glob, a URL
        last = tok.rsplit("/", 1)[1]
        if last == "":                                         # a folder: `kernels/`
            if tok.rstrip("/").replace("/", "").replace("-", "").replace("_", "").replace(".", "").isdigit():
                continue
            out.append(tok)
        elif "." in last and last.rsplit(".", 1)[1] in EXTENSIONS:
            out.append(tok)
    return list(dict.fromkeys(out))


def test_the_scanner_reads_citations():
    text = ("see `kernels/table.py`, `pq2verify/golden/` and tools/ci/gpu_pass.sh; not golden/<key>/ nor "
            "https://x.org/a/b.py, 1/2 ulp, A/B, I/N or results/*/README.md")
    assert cited(text) == ["kernels/table.py", "pq2verify/golden/", "tools/ci/gpu_pass.sh"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_exists(doc):
    paths = cited(doc.read_text())
    missing = [p for p in paths if p not in EXAMPLES and (not (ROOT / p).exists()
               or (p.endswith("/") and not (ROOT / p).is_dir()))]
    assert not missing, (f"{doc.relative_to(ROOT)} cites paths the tree does not hold: {', '.join(missing)}\n"
                         f"  reproduce: .venv/bin/python -m pytest -q tests/test_docs_paths.py")


def test_the_examples_are_only_examples():
    present = [p for p in EXAMPLES if (ROOT / p).exists()]
    assert not present, (f"{present}: a page's example is now a file of the tree; cite it as a real path "
                         "(drop it from EXAMPLES)\n  reproduce: .venv/bin/python -m pytest -q tests/test_docs_paths.py")
