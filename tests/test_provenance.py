"""Where a result came from: the commit a copied work tree ran is the one its sender names."""
from pq2verify import provenance


def test_commit_from_git(monkeypatch):
    monkeypatch.delenv("PQ2VERIFY_COMMIT", raising=False)
    c = provenance.commit()
    assert c == "unknown" or len(c.split("+")[0]) == 12


def test_told_commit_wins_over_a_stale_git(monkeypatch):
    # a device copy once carried an old .git: results there named the wrong commit
    monkeypatch.setenv("PQ2VERIFY_COMMIT", "bee2a269297c")
    assert provenance.commit() == "bee2a269297c (told)"
