"""Data sources, question selection and prompts."""
import json

import pytest

from pq2verify.gsm8k import data


def test_default_subset_is_fixed_128():
    test, train, _ = data.load()
    ids = data.select(len(test))
    assert len(ids) == 128 and ids[:3] == [0, 10, 20] and ids[-1] == 1270
    assert data.select(len(test), limit=5) == [0, 10, 20, 30, 40]
    assert data.select(len(test), all_=True) == list(range(1319))
    assert data.select(len(test), ids="3,1-2,3") == [1, 2, 3]
    with pytest.raises(ValueError):
        data.select(len(test), ids="5000")


def test_jsonl_and_parquet_files(tmp_path):
    rows = [{"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    test, train, desc = data.load(str(f))
    assert test == rows and len(train) == 7473 and str(f) in desc
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "q.parquet")
    assert data.load(str(tmp_path / "q.parquet"))[0] == rows


def test_missing_file_and_hub_name_errors(monkeypatch):
    with pytest.raises(ValueError, match="no such file"):
        data.load("/nonexistent/q.jsonl")
    import builtins
    real = builtins.__import__

    def no_datasets(name, *a, **k):
        if name == "datasets":
            raise ImportError(name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(RuntimeError, match="datasets"):
        data.load("openai/gsm8k")


def test_prompts_use_train_shots_only():
    test, train, _ = data.load()

    class Plain:
        chat_template = None
    text, fmt = data.build_prompt(Plain(), test[0]["question"], train[:2])
    assert fmt == "plain" and text.endswith("Answer:") and "<<" not in text
    assert train[0]["question"] in text and test[1]["question"] not in text
    assert data.prompt_hash(text) == data.prompt_hash(text) != data.prompt_hash(text + " ")
