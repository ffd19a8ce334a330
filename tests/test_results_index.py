"""results/ is organised by question: every folder there is named by date and subject, listed in
results/README.md's index and carries a README naming a commit and a command; every
results/... path the project cites exists; and no text in the project names a numbered work
period (the project speaks of itself, not of the periods it was written in)."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
REPRO = "reproduce: .venv/bin/python -m pytest -p no:randomly -q tests/test_results_index.py  # "

FOLDER = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9]+(-[a-z0-9_]+)*$")
COMMIT = re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
COMMAND = re.compile(r"(pq2verify |\./pq2 |pytest |python3? |tools/\S+\.(py|sh))")
CITED = re.compile(r"(?<![\w/.-])results/[\w.*-]+(?:/[\w.*-]+)*/?")
RELATIVE = re.compile(r"`(\.\./[\w.-]+(?:/[\w.*<>-]+)*)/?`")

# Work-period names: a folder cited as sN/, ordinals or "this"/"that" before session, "this
# wave", a session or wave with a number, and sN used as the name of a period's folder or rule.
PERIOD = [
    re.compile(r"\bs[0-9]+/"),
    re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
               r"twelfth|this|that|last|next|previous|earlier|later|same)[- ](session|work period)s?\b",
               re.I),
    re.compile(r"\b(this|that|next|previous) wave\b", re.I),  # a grid's "last wave" is a GPU term
    re.compile(r"\b[0-9]+(st|nd|rd|th)[- ](session|wave)s?\b", re.I),
    re.compile(r"\b(session|wave)s? [0-9]+\b", re.I),
    re.compile(r"\bs[0-9]+ (session|folder|README|split|run)s?\b"),
]
# Text that is not the project's prose: third-party data, and this file (it spells the patterns).
NOT_PROSE = ("pq2verify/gsm8k/data/", Path(__file__).resolve().relative_to(ROOT).as_posix())
SKIP_DIRS = {".git", ".venv", "runs", "build", "__pycache__", ".pytest_cache", ".hypothesis",
             ".benchmarks", ".whl", ".model", ".carry"}


def _files() -> list[str]:
    """The project's files: git's view (tracked plus untracked, not ignored) where .git exists,
    else a walk that leaves out the ignored folders (a device copy may carry no .git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout
        return sorted({f for f in out.decode().split("\0") if f and (ROOT / f).is_file()})
    except (OSError, subprocess.CalledProcessError):
        found = []
        for d, dirs, files in os.walk(ROOT):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info")]
            found += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
        return sorted(found)


def _text(rel: str) -> str | None:
    p = ROOT / rel
    if p.stat().st_size > 8 << 20:
        return None
    data = p.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _texts() -> dict[str, str]:
    return {f: t for f in _files() if (t := _text(f)) is not None}


def _folders() -> list[str]:
    return sorted(p.name for p in RESULTS.iterdir() if p.is_dir()) if RESULTS.is_dir() else []


def _indexed() -> list[str]:
    index = RESULTS / "README.md"
    assert index.is_file(), REPRO + "results/README.md (the index table) is missing"
    rows = [line for line in index.read_text().splitlines() if line.startswith("| 20")]
    return [m.group(1) for line in rows for m in [re.search(r"\[([^\]]+)\]\(\1/?\)", line)] if m]


def test_every_results_folder_is_named_by_date_and_subject_and_indexed():
    folders, indexed = _folders(), _indexed()
    assert folders, REPRO + "no folders under results/"
    bad = [f for f in folders if not FOLDER.match(f)]
    assert not bad, REPRO + f"results/ folders not named YYYY-MM-DD-subject: {bad}"
    assert not [f for f in folders if f not in indexed], \
        REPRO + f"folders missing from results/README.md: {[f for f in folders if f not in indexed]}"
    assert not [f for f in indexed if f not in folders], \
        REPRO + f"indexed folders that do not exist: {[f for f in indexed if f not in folders]}"
    loose = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md")
    assert not loose, REPRO + f"files outside a question folder: {loose}"


@pytest.mark.parametrize("folder", _folders() or ["(none)"])
def test_each_folder_readme_names_a_commit_and_a_command(folder):
    readme = RESULTS / folder / "README.md"
    assert readme.is_file(), REPRO + f"results/{folder}/README.md is missing"
    text = readme.read_text()
    assert text.startswith("# "), REPRO + f"results/{folder}/README.md: no title (the question)"
    assert COMMIT.search(text), REPRO + f"results/{folder}/README.md names no commit (a hex id)"
    assert COMMAND.search(text), REPRO + f"results/{folder}/README.md names no command"


def test_no_generated_html_under_results():
    html = [f for f in _files() if f.startswith("results/") and f.endswith(".html")]
    assert not html, REPRO + f"generated HTML kept under results/: {html}"


def _cited(texts: dict[str, str]):
    """(file, cited path) for every results/... path in the project's prose and the results
    READMEs; the measurement files themselves record the commands as they ran, paths included."""
    for f, t in texts.items():
        if f.startswith(NOT_PROSE) or f == ".gitignore":
            continue
        if f.startswith("results/") and not f.endswith("README.md"):
            continue
        for m in CITED.finditer(t):
            yield f, m.group(0).rstrip(".,;:")
        if f.startswith("results/"):
            for m in RELATIVE.finditer(t):
                yield f, os.path.normpath(os.path.join(os.path.dirname(f), m.group(1)))


def test_every_cited_results_path_exists():
    missing = sorted({(f, c) for f, c in _cited(_texts())
                      if not ("<" in c or list(ROOT.glob(c.rstrip("/"))) or (ROOT / c).exists())})
    assert not missing, REPRO + "cited results paths that do not exist:\n" + "\n".join(
        f"  {f}: {c}" for f, c in missing)


def test_no_work_period_names_in_the_project():
    hits = []
    for f, t in _texts().items():
        if f.startswith(NOT_PROSE):
            continue
        for n, line in enumerate(t.splitlines(), 1):
            hits += [f"  {f}:{n}: {m.group(0)!r} in {line.strip()[:100]}"
                     for rx in PERIOD for m in rx.finditer(line)]
    assert not hits, REPRO + f"{len(hits)} work-period names (say what the project did instead):\n" \
        + "\n".join(hits[:40])
