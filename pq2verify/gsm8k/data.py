"""GSM8K questions, the default subset, and the prompts.

Source: the project's copy (data/test.jsonl, data/train.jsonl), a JSONL or Parquet file with
`question` and `answer` fields, or a Hugging Face dataset name (needs `datasets` and a hub).
A question's id is its 0-based line (row) number in the test split.

Default subset (DEFAULT_IDS): every 10th test question from id 0, 128 questions
(0, 10, ..., 1270): spread over the whole test file, fixed so runs compare across time.

Few-shot examples are the first `shots` questions of the train split (never the test split),
their calculator annotations `<<48/2=24>>` removed. Instruct models (a chat template) get the
shots as earlier user/assistant turns; others get plain "Question: ...\\nAnswer: ..." text.
"""
import argparse
import hashlib
import json
import re
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_IDS = tuple(range(0, 1280, 10))
DEFAULT_SHOTS = 2


def _row_error(r) -> str | None:
    """What is wrong with one data row, or None: an object with text 'question' and 'answer'."""
    if not isinstance(r, dict):
        return f"expected a JSON object with 'question' and 'answer', got {_kind(r)}"
    for key in ("question", "answer"):
        if key not in r:
            return f"no {key!r} field (fields: {', '.join(map(str, sorted(r))) or 'none'})"
        if not isinstance(r[key], str):
            return f"{key!r} is {_kind(r[key])}, expected text"
        if not r[key].strip():
            return f"{key!r} is empty"
    return None


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _read_jsonl(path: Path, label: str = "") -> list[dict]:
    """Every line checked before any work, the error naming the file and its line."""
    rows = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{label}{path}: cannot read: {e.strerror or e}") from None
    with f:
        try:
            lines = list(f)
        except UnicodeDecodeError as e:
            raise ValueError(f"{label}{path}: not UTF-8 text ({e.reason})") from None
    for i, line in enumerate(lines):
        where = f"{label}{path}:{i + 1}"
        if not line.strip():
            raise ValueError(f"{where}: empty line (ids are line numbers)")
        try:
            r = json.loads(line)
        except ValueError as e:
            why = f"{getattr(e, 'msg', e)} at column {getattr(e, 'colno', '?')}"
            raise ValueError(f"{where}: not JSON ({why})") from None
        why = _row_error(r)
        if why:
            raise ValueError(f"{where}: {why}")
        rows.append(r)
    return rows


def _read_parquet(path: Path, label: str = "") -> list[dict]:
    import pyarrow.parquet as pq
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:     # pyarrow raises its own types for a file that is no Parquet
        raise ValueError(f"{label}{path}: not a Parquet file ({type(e).__name__}: {e})") from None
    return _check(rows, f"{label}{path}")


def _check(rows: list, src: str) -> list[dict]:
    for i, r in enumerate(rows):
        why = _row_error(r)
        if why:
            raise ValueError(f"{src}: row {i} (0-based): {why}")
    return rows


def load(source: str | None = None) -> tuple[list[dict], list[dict], str]:
    """(test rows, train rows, description). source None: the project's copy."""
    if source is None:
        return (_read_jsonl(DATA_DIR / "test.jsonl"), _read_jsonl(DATA_DIR / "train.jsonl"),
                "pq2verify/gsm8k/data (GSM8K, openai/grade-school-math)")
    p = Path(source)
    if p.is_dir():
        raise ValueError(f"--data {source}: is a folder; give a JSONL or Parquet file")
    if p.exists():
        rows = _read_parquet(p, "--data ") if p.suffix == ".parquet" else _read_jsonl(p, "--data ")
        if not rows:
            raise ValueError(f"--data {source}: holds no questions")
        return rows, _read_jsonl(DATA_DIR / "train.jsonl"), f"{p} (train shots: project copy)"
    if p.suffix in (".jsonl", ".json", ".parquet") or "/" not in source:
        raise ValueError(f"--data {source}: no such file")
    try:
        import datasets
    except ImportError:
        raise RuntimeError(f"--data {source}: a Hugging Face dataset name needs the `datasets` package "
                           "(not installed); give a JSONL or Parquet file instead") from None
    try:
        ds = datasets.load_dataset(source, "main")
    except Exception as e:
        raise RuntimeError(f"--data {source}: could not load from the hub ({type(e).__name__}: {e}); "
                           "no hub may be reachable here: give a JSONL or Parquet file") from None
    return (_check(list(ds["test"]), f"--data {source} test"), _check(list(ds["train"]), f"--data {source} train"),
            f"hf:{source}")


def id_spec(s: str) -> str:
    """argparse type of --ids: '0,5,7-9' checked for its form (the test split's size is checked
    once the data is read); kept as text, which the worker processes are given again."""
    parts = [p.strip() for p in s.split(",")]
    if not s.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"expected question ids like 0,5,7-9, got {s!r}")
    for p in parts:
        a, sep, b = p.partition("-")
        if not a.strip().isdigit() or (sep and not b.strip().isdigit()):
            raise argparse.ArgumentTypeError(f"{p!r} in {s!r} is not an id or a range lo-hi of ids (0-based)")
        if sep and int(b) < int(a):
            raise argparse.ArgumentTypeError(f"range {p!r} in {s!r} runs backwards")
    return s


def parse_ids(spec: str, n: int) -> list[int]:
    """'0,5,7-9' -> [0, 5, 7, 8, 9]; each must be a test line number."""
    try:
        id_spec(spec)
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"--ids: {e}") from None
    out = []
    for part in spec.split(","):
        a, sep, b = part.strip().partition("-")
        lo, hi = int(a), int(b) if sep else int(a)
        if hi >= n:          # before the range is expanded: 0-99999999999 must not fill the memory
            bad = [lo] if lo >= n else [hi]
            raise ValueError(f"--ids: {bad} outside the test split's 0..{n - 1}")
        out.extend(range(lo, hi + 1))
    return sorted(set(out))


def select(n: int, *, ids: str | None = None, all_: bool = False, limit: int | None = None) -> list[int]:
    if ids is not None:
        sel = parse_ids(ids, n)
    elif all_:
        sel = list(range(n))
    else:
        sel = [i for i in DEFAULT_IDS if i < n]
    return sel[:limit] if limit else sel


def clean_answer(a: str) -> str:
    return re.sub(r"<<[^>]*>>", "", a).strip()


def build_prompt(tokenizer, question: str, shots: list[dict]) -> tuple[str, str]:
    """(prompt text, format name). Chat template where the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        msgs = []
        for ex in shots:
            msgs += [{"role": "user", "content": ex["question"]},
                     {"role": "assistant", "content": clean_answer(ex["answer"])}]
        msgs.append({"role": "user", "content": question})
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), "chat"
    text = "".join(f"Question: {ex['question']}\nAnswer: {clean_answer(ex['answer'])}\n\n" for ex in shots)
    return text + f"Question: {question}\nAnswer:", "plain"


def stop_sequences(fmt: str) -> list[str]:
    """Where an answer ends: the next turn or question. EOS tokens stop as well."""
    if fmt == "chat":
        return ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "\nQuestion:"]
    return ["\nQuestion:", "\n\n\n", "</s>", "<|endoftext|>"]


def prompt_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
