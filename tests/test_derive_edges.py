"""The exactness derivation's judging code at its edges (pq2verify.derive): the verdict from its
evidence, the grid count of declared fold orders, the dots_equal_to chain, the shared-epilogue
test and the shapes the construction searches. Each expected value is derived here from the
registry's own declarations and the grid, never from the function under test; each test was
written against a fault planted in that code that the rest of the suite let pass."""
import dataclasses

import pytest

from pq2verify import adversarial, derive, registry, tiles

pytestmark = pytest.mark.exact

HERE = ".venv/bin/python -m pytest -q -p no:randomly 'tests/test_derive_edges.py::{}'"


def repro(name: str) -> str:
    return "reproduce: " + HERE.format(name)


def _evidence(**over) -> dict:
    """Evidence on which mmq_planes (declared dots_equal_to mmq, shared epilogue) is proven:
    cases run, all identical, dots compared and equal, one fold order on every grid point."""
    ev = dict(tried=4, identical=4, first_diff=None, dots_tried=4, dots_equal=4, first_dots_diff=None,
              folds={"points": 1, "differ": 0, "first_differ": None,
                     "orders": [{"splits": 1, "lanes": 1, "groups_per_split": "G"}]},
              refutation=None)
    ev.update(over)
    return ev


def _pair():
    return registry.get("mmq_planes"), registry.get("mmq")


def test_one_grid_point_with_one_order_is_enough_and_none_is_not():
    """A single grid shape served by both, with the same fold, is evidence; zero shapes is none.
    The orders print with sorted keys, so the record's text does not depend on dict order."""
    p, q = _pair()
    rule, basis = derive.judge(p, q, **_evidence())
    assert rule == "proven", repro("test_one_grid_point_with_one_order_is_enough_and_none_is_not") + ": " + basis
    assert '{"groups_per_split": "G", "lanes": 1, "splits": 1}' in basis, basis
    assert "on all 1 grid shapes" in basis and "declared dots_equal_to mmq" in basis, basis
    rule, basis = derive.judge(p, q, **_evidence(folds={"points": 0, "differ": 0, "first_differ": None,
                                                        "orders": []}))
    assert rule == "unproven" and "no grid shape served by both" in basis, basis


def test_the_chain_of_declared_equal_dots():
    """gemv declares dots_equal_to int_gemv, which declares nothing: the chain from gemv reaches
    int_gemv, never mmq; from int_gemv (no declaration) it reaches nothing."""
    g, i, m = registry.get("gemv"), registry.get("int_gemv"), registry.get("mmq")
    assert g.dots_equal_to == "int_gemv" and i.dots_equal_to is None
    assert derive.dots_chain(g, i) is True
    assert derive.dots_chain(g, m) is False, repro("test_the_chain_of_declared_equal_dots")
    assert derive.dots_chain(i, g) is False


def test_an_integer_path_without_the_shared_epilogue_is_not_covered():
    """The shared-epilogue test needs both: integer arithmetic and every shared function in the
    kernel file. kernels/cublas.py (a library call) has none of them, so an integer path pointing
    there fails it; gemv's own file passes; a floating path fails whatever its file holds."""
    g = registry.get("gemv")
    src_less = dataclasses.replace(g, module="kernels.cublas")
    assert derive.epilogue(g) is True
    assert derive.epilogue(src_less) is False, repro("test_an_integer_path_without_the_shared_epilogue_is_not_covered")
    assert derive.epilogue(dataclasses.replace(g, arithmetic="floating")) is False


def test_the_fold_grid_counts_every_shared_point_once():
    """gemv serves M = 1 only, int_gemv M = 1..16: they share one M per grid shape, so the
    points are the grid's (N, K) pairs. The interpreter's gemv folds in two lanes (GC = 2) and
    int_gemv in one, so every point differs."""
    g, i = registry.get("gemv"), registry.get("int_gemv")
    shapes = len(set(tiles.grid("pq2")))
    f = derive.fold_grid(g, i, interpret=True)
    assert f["points"] == shapes, repro("test_the_fold_grid_counts_every_shared_point_once") + f": {f['points']} != {shapes}"
    assert f["differ"] == shapes and f["first_differ"]["m"] == 1, f
    assert f["orders"] == []


def test_the_construction_searches_every_k_of_three_groups_or_more():
    """One shape per K of the grid with K/128 >= 3 (the construction's cancelling groups need
    three), smallest first, at most ADVERSARIAL_SHAPES; its N is the construction's own row
    count for that K."""
    g, i = registry.get("gemv"), registry.get("int_gemv")
    ks = sorted({k for _, k in tiles.grid("pq2") if k >= 3 * 128})[:derive.ADVERSARIAL_SHAPES]
    got = derive._search_shapes(g, i, interpret=True)
    assert [k for _, k, _ in got] == ks, repro("test_the_construction_searches_every_k_of_three_groups_or_more") + f": {got}"
    assert 384 in ks
    for n, k, m in got:
        assert n == len(adversarial.rows(k // 128, derive.ADVERSARIAL_GROUPS)) and m == 1, (n, k, m)


def test_an_unknown_name_and_a_path_with_no_counterpart_are_told_apart():
    with pytest.raises(ValueError, match="not a known path"):
        derive.tuned_paths(["no_such_path"])
    with pytest.raises(ValueError, match="not a tuned path with a legacy counterpart"):
        derive.tuned_paths(["int_gemv"])
