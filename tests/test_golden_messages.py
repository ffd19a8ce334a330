"""What the golden store tells a user whose capture is missing or damaged: the command that makes
the capture they asked for (a model capture when the folder is a model's), whether a committed
capture can be restored from git, and how many cases a damaged file holds, named up to three with
a count of the rest. The expected texts are written out here from the rules in the docstrings of
pq2verify/golden/store.py; the store's own functions never supply them."""
import pytest
import torch
from safetensors.torch import save_file

from pq2verify import golden
from pq2verify.golden import store

REPRO = "reproduce: .venv/bin/python -m pytest -q tests/test_golden_messages.py\n"


def _missing(d, kind=None) -> str:
    with pytest.raises(golden.NoCapture) as e:
        golden.load(d, kind=kind)
    return str(e.value)


def test_a_folder_named_model_asks_for_a_model_capture_of_its_parent(tmp_path):
    # no kind given: the folder's name says it is a model capture (<dir>/model is where
    # `golden capture --model --dir <dir>` writes)
    d = tmp_path / "x" / "model"
    msg = _missing(d)
    assert f"golden capture --model --dir {tmp_path / 'x'}" in msg, REPRO + msg
    assert "(or with --model" not in msg, REPRO + msg


def test_a_model_capture_asked_of_another_folder_names_where_it_writes(tmp_path):
    d = tmp_path / "caps"
    msg = _missing(d, kind="model")
    assert f"golden capture --model --dir {d} (it writes {d / 'model'})" in msg, REPRO + msg


def test_a_case_capture_asked_of_a_folder_named_model_is_not_a_model_capture(tmp_path):
    d = tmp_path / "model"
    msg = _missing(d, kind="cases")
    assert f"golden capture --dir {d}" in msg and "--model" not in msg, REPRO + msg


@pytest.mark.parametrize("key,committed", [("interpreter", True), ("sm90", True), ("h999", False)])
def test_a_missing_default_capture_says_whether_git_holds_it(key, committed, tmp_path, monkeypatch):
    # the committed keys are interpreter and sm90 (store.COMMITTED); a default folder of another
    # key has nothing to restore
    monkeypatch.setattr(store, "GOLDEN", tmp_path / "golden")
    msg = _missing(tmp_path / "golden" / key)
    restore = f"It is committed: restore it (git checkout -- golden/{key})"
    assert (restore in msg) is committed, REPRO + msg
    assert f"no golden capture for backend '{key}'" in msg, REPRO + msg


@pytest.mark.parametrize("key,committed", [("sm90", True), ("interpreter", False)])
def test_a_missing_default_model_capture_says_whether_git_holds_it(key, committed, tmp_path, monkeypatch):
    # only sm90's model capture is committed (store.MODEL_COMMITTED)
    monkeypatch.setattr(store, "GOLDEN", tmp_path / "golden")
    msg = _missing(tmp_path / "golden" / key / "model", kind="model")
    restore = f"It is committed: restore it (git checkout -- golden/{key}/model)"
    assert (restore in msg) is committed, REPRO + msg
    assert f"no golden model capture for backend '{key}'" in msg, REPRO + msg


def _damaged(tmp_path, n: int) -> str:
    """The naming of a path file whose n cases all fail their recorded hash."""
    ids = [f"c{i}" for i in range(n)]
    save_file({i: torch.full((2, 2), float(k)) for k, i in enumerate(ids)}, str(tmp_path / "p.safetensors"))
    man = {"backend_key": "interpreter",
           "cases": [{"id": i, "file": "p.safetensors", "y_sha256": "0" * 64, "weight": "w", "x": "x"} for i in ids]}
    return store._naming(tmp_path, man, "p.safetensors")


@pytest.mark.parametrize("n,named", [
    (1, "c0"),
    (3, "c0, c1, c2"),                    # three are named whole: no count of more
    (4, "c0, c1, c2 and 1 more"),
    (6, "c0, c1, c2 and 3 more"),
])
def test_damaged_cases_are_named_up_to_three_then_counted(n, named, tmp_path):
    msg = _damaged(tmp_path, n)
    first = msg.splitlines()[0]
    assert first == f"; {n} cases affected: {named}", REPRO + msg
    assert msg.splitlines()[1] == f"  reproduce: ./pq2 --device cpu golden verify --dir {tmp_path} --case 'c0'", \
        REPRO + msg
