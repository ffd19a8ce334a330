"""replay's default call sizes come from the path table: every path a kernel set dispatches to
for some decode M is dispatched to at one of them (a path added for M = 2 once went ungated
because the default was a fixed 1, 4, 16)."""
import pytest
import torch

from kernels import dispatch, table
from pq2verify import inputs
from pq2verify.replay_cli import default_ms


def _decode_top() -> int:
    return max(p.m_max for p in table.all_paths() if p.m_max is not None)


def _serving(m: int) -> frozenset:
    return frozenset(p.name for p in table.all_paths() if p.m_min <= m and (p.m_max is None or m <= p.m_max))


def test_every_decode_m_is_served_like_a_default_m():
    top = _decode_top()
    ds = default_ms()
    assert ds[0] == 1 and ds[-1] == top
    for m in range(1, top + 1):
        # the last default M at or below m: the paths serving m serve it too, and no others
        d = max(x for x in ds if x <= m)
        assert _serving(m) == _serving(d), (m, d)


@pytest.mark.parametrize("kset", ["legacy", "tuned"])
@pytest.mark.parametrize("layout", ["raw", "prepared"])
def test_every_path_a_set_dispatches_for_decode_runs_at_a_default_m(kset, layout, device):
    w = inputs.ternary_weight(64, 256, 5, device, layout=layout)
    x = torch.zeros(1, 256, dtype=torch.bfloat16, device=device)
    picked = {m: dispatch.resolve(m, w, x, kset).name for m in range(1, _decode_top() + 1)}
    assert {picked[m] for m in default_ms()} == set(picked.values()), picked


def test_a_path_with_its_own_decode_range_moves_the_default(register_path):
    from kernels import int_gemv
    register_path(table.Entry("mid_range", "kernels.test_mid_range", "tuned", 5, 8, counterpart="int_gemv"),
                  int_gemv.run, protocol={"fold": int_gemv.fold}, tol_reason="t")
    ds = default_ms()
    assert {5, 9} <= set(ds)
    for m in range(1, _decode_top() + 1):
        assert _serving(m) == _serving(max(x for x in ds if x <= m)), m


def test_a_table_of_open_ranges_only_replays_m_1(monkeypatch):
    import types
    host = types.SimpleNamespace(PATHS=(table.Entry("open", "kernels.open", "tuned", 1, None),), BY_NAME={})
    monkeypatch.setattr(table, "_source", host)
    assert default_ms() == (1,)
