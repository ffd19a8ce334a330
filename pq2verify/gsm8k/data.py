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
import hashlib
import json
import re
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_IDS = tuple(range(0, 1280, 10))
DEFAULT_SHOTS = 2


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                rows.append(json.loads(line))
            else:
                raise ValueError(f"{path}:{i + 1}: empty line (ids are line numbers)")
    return rows


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq
    return pq.read_table(path).to_pylist()


def _check(rows: list[dict], src: str) -> list[dict]:
    for i, r in enumerate(rows[:1]):
        if "question" not in r or "answer" not in r:
            raise ValueError(f"{src}: rows need 'question' and 'answer' fields, got {sorted(r)}")
    return rows


def load(source: str | None = None) -> tuple[list[dict], list[dict], str]:
    """(test rows, train rows, description). source None: the project's copy."""
    if source is None:
        return (_read_jsonl(DATA_DIR / "test.jsonl"), _read_jsonl(DATA_DIR / "train.jsonl"),
                "pq2verify/gsm8k/data (GSM8K, openai/grade-school-math)")
    p = Path(source)
    if p.exists():
        rows = _read_parquet(p) if p.suffix == ".parquet" else _read_jsonl(p)
        return _check(rows, source), _read_jsonl(DATA_DIR / "train.jsonl"), f"{p} (train shots: project copy)"
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
    return _check(list(ds["test"]), source), list(ds["train"]), f"hf:{source}"


def parse_ids(spec: str, n: int) -> list[int]:
    """'0,5,7-9' -> [0, 5, 7, 8, 9]; each must be a test line number."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    bad = [i for i in out if not 0 <= i < n]
    if bad:
        raise ValueError(f"--ids: {bad[:5]} outside the test split's 0..{n - 1}")
    return sorted(set(out))


def select(n: int, *, ids: str | None = None, all_: bool = False, limit: int | None = None) -> list[int]:
    if ids:
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
