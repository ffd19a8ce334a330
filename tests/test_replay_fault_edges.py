"""The replay gate's planted faults are what FAULTS says they are, at their edges: one ulp is
one ulp, a dropped group is the last one, a scale fault keeps the weight's layout and codes,
the directed roundings fold in ascending order, and a fault's targets are the weights its
selector names. Expected values are derived here: numpy's nextafter on fp16, FP32 folds written
out in numpy, and hand-built call lists."""
import numpy as np
import pytest
import torch

from kernels import emulation
from pq2verify import inputs, replay
from pq2verify.replay import Call, ReplayError, parse_fault

S = torch.tensor([0.5, -0.5, 3.0e-5, -1.0, 1.0, 6.0e-8, -6.0e-8, 65504.0 / 2], dtype=torch.float16)


def test_ulp_up_is_exactly_the_next_fp16_away_from_zero():
    s = S.numpy()
    want = np.nextafter(s, np.copysign(np.float16(np.inf), s))
    assert np.array_equal(replay._ulp_up(S.clone()).numpy(), want)


def test_ulp_down_is_exactly_the_next_fp16_toward_zero_and_keeps_zero():
    s = torch.cat([S, torch.tensor([0.0], dtype=torch.float16)])
    want = np.nextafter(s.numpy(), np.float16(0))
    got = replay._ulp_down(s.clone()).numpy()
    assert np.array_equal(got, want) and got[-1] == 0 and not np.signbit(got[-1])


@pytest.mark.parametrize("name, ratio", [("scale_1pct", 1.01), ("scale_1pct_down", 0.99)])
def test_one_percent_faults_scale_by_their_factor(name, ratio):
    s = torch.tensor([0.25, -0.75, 2.0, -3.0e-3], dtype=torch.float16)
    got = replay._SCALE[name](s.clone()).double()
    want = s.double() * ratio
    # fp16 keeps 11 bits: the result is the factor's product to within half an fp16 spacing
    assert ((got - want).abs() <= want.abs() * 2.0 ** -11).all(), (got, want)


def test_drop_group_zeroes_the_last_group_of_every_row_and_nothing_else():
    s = torch.arange(1, 13, dtype=torch.float16).view(3, 4)
    got = replay._last_group_zero(s.clone())
    assert (got[:, -1] == 0).all() and torch.equal(got[:, :-1], s[:, :-1])


@pytest.mark.parametrize("layout", ["raw", "prepared"])
def test_a_scale_fault_keeps_the_layout_and_the_codes(layout):
    w = inputs.ternary_weight(16, 384, 3, "cpu", layout=layout)
    f = replay._scales_changed(w, lambda s: s * 2)
    assert f.layout == w.layout and (f.n, f.k) == (w.n, w.k)
    a, b = w.to_prepared(), f.to_prepared()
    cut = w.n * w.k // 4
    assert torch.equal(a.data[:cut], b.data[:cut])                      # the codes
    assert torch.equal(b.data[cut:].view(torch.float16), a.data[cut:].view(torch.float16) * 2)


def _np_fold(x, w, dots, reverse):
    """sum over groups of (dot * xs) * ws in FP32 from 0.0, in numpy, ascending or descending."""
    _, xs = emulation.quantize_q8(x)
    xs, ws = xs.numpy().astype(np.float32), w.scales_matrix().float().numpy()
    d = dots.numpy().astype(np.float32)
    acc = np.zeros(d.shape[:2], np.float32)
    for g in (reversed(range(w.groups)) if reverse else range(w.groups)):
        acc = acc + (d[:, :, g] * xs[:, g:g + 1]) * ws[:, g]
    return acc


def _case(seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 640, generator=g).bfloat16()
    w = inputs.ternary_weight(64, 640, 5, "cpu")
    q, _ = emulation.quantize_q8(x)
    return x, w, emulation.group_dots(q, w).permute(1, 2, 0).to(torch.int32)


def test_the_faults_folds_are_ascending_and_the_control_descending():
    # the FP32 sums themselves (the directed roundings start from the ascending one: next test)
    x, w, dots = _case()
    up = _np_fold(x, w, dots, reverse=False)
    assert not np.array_equal(up, _np_fold(x, w, dots, reverse=True))   # the orders differ here
    assert np.array_equal(replay._refold(x, w, dots, torch.float32).numpy(), up)
    assert np.array_equal(replay._refold_reversed(x, w, dots, torch.float32).numpy(),
                          _np_fold(x, w, dots, reverse=True))


@pytest.mark.parametrize("rounding", ["up", "down"])
def test_directed_rounding_steps_only_where_nearest_went_the_other_way(rounding):
    """bf16 of the ascending FP32 fold: kept where it already lies on the stated side (equal
    included), else the next bf16 that way."""
    x, w, dots = _case(11)
    acc = torch.from_numpy(_np_fold(x, w, dots, reverse=False))
    near = acc.bfloat16()
    got = replay._refold(x, w, dots, torch.bfloat16, rounding=rounding)
    a, n = acc.double(), near.double()
    ok_side = (n >= a) if rounding == "up" else (n <= a)
    assert torch.equal(got[ok_side].view(torch.int16), near[ok_side].view(torch.int16))
    bad = ~ok_side
    assert bad.any() and ok_side.any()
    # elsewhere the next bf16 that way (torch.nextafter on the nearest value)
    inf = float("inf") if rounding == "up" else -float("inf")
    want = torch.nextafter(near[bad], torch.full_like(near[bad], inf))
    assert torch.equal(got[bad].view(torch.int16), want.view(torch.int16))


def test_an_exact_sum_is_not_moved_by_a_directed_rounding():
    # an FP32 sum that bf16 holds exactly (zero dots: +0.0) stays as it is either way
    x, w, dots = _case()
    for rounding in ("up", "down"):
        y = replay._refold(x, w, torch.zeros_like(dots), torch.bfloat16, rounding=rounding)
        assert (y.view(torch.int16) == 0).all(), (rounding, y)


def _call(layer, pos, x):
    return Call(key=f"{layer}@{pos}", layer=layer, kind=replay.kind_of(layer), position=pos, x=x)


def _calls(same_second=False):
    a, b = torch.ones(1, 128), torch.full((1, 128), 2.0)
    g = "model.layers.0.mlp.gate_proj+up_proj"
    d = "model.layers.0.mlp.down_proj"
    o = "model.layers.1.self_attn.o_proj"
    return [_call(g, 0, a), _call(g, 1, a if same_second else b), _call(d, 0, a), _call(o, 0, a), _call(o, 1, b)]


def test_stale_tile_is_accepted_when_one_of_its_targets_has_two_inputs():
    # layer 0's gate_up has two equal inputs, its down one input, layer 1's o_proj two distinct
    f = parse_fault("stale_tile:all", _calls(same_second=True))
    assert len(f.targets) == 3


def test_stale_tile_is_refused_when_no_target_has_two_distinct_inputs():
    calls = _calls(same_second=True)
    with pytest.raises(ReplayError, match="needs two replayed calls"):
        parse_fault("stale_tile:0", calls)        # layer 0: gate_up's two inputs are equal
    # another layer's two distinct inputs do not count for this one
    assert replay._two_inputs(calls, "model.layers.0.mlp.gate_proj+up_proj") is False
    assert replay._two_inputs(calls, "model.layers.1.self_attn.o_proj") is True


def test_coherent_on_all_targets_only_the_gate_up_weights():
    f = parse_fault("coherent:all", _calls())
    assert f.targets == ["model.layers.0.mlp.gate_proj+up_proj"]


def test_a_layer_index_selects_every_projection_of_that_layer_only():
    f = parse_fault("scale_ulp:0", _calls())
    assert f.targets == ["model.layers.0.mlp.gate_proj+up_proj", "model.layers.0.mlp.down_proj"]
    f = parse_fault("scale_ulp:o_proj", _calls())
    assert f.targets == ["model.layers.1.self_attn.o_proj"]


def test_a_scale_fault_changes_only_its_targets_weights():
    w = inputs.ternary_weight(16, 128, 3, "cpu")
    f = parse_fault("scale_ulp:o_proj", _calls())
    assert f.weight("model.layers.0.mlp.down_proj", w) is w
    fw = f.weight("model.layers.1.self_attn.o_proj", w)
    assert fw is not w and not torch.equal(fw.data, w.data)
    assert f.weight("model.layers.1.self_attn.o_proj", w) is fw          # once per weight and run


def test_two_inputs_at_one_m_are_enough_whatever_the_other_ms_hold():
    o = "model.layers.1.self_attn.o_proj"
    calls = [_call(o, 0, torch.ones(1, 128)), _call(o, 1, torch.zeros(1, 128)), _call(o, "M2", torch.ones(2, 128))]
    assert replay._two_inputs(calls, o) is True
    assert parse_fault("stale_tile:o_proj", calls).targets == [o]


@pytest.mark.parametrize("sign, rounding, bits", [(1, "up", 0x0001), (-1, "down", -0x7FFF),
                                                  (1, "down", 0x0000), (-1, "up", -0x8000)])
def test_a_sum_that_rounds_to_zero_steps_to_the_smallest_subnormal_of_its_side(sign, rounding, bits):
    """acc = sign * xs * ws is about 5e-43, far below half of bf16's smallest subnormal (9.2e-41):
    to nearest it is a zero of acc's sign. Toward acc's side it must become that side's smallest
    subnormal (bits 0x0001, 0x8001); away from it, the zero stays (+0.0, -0.0)."""
    x = torch.full((1, 128), 1e-33).bfloat16()
    w = replay._scales_changed(inputs.ternary_weight(4, 128, 3, "cpu"),
                               lambda s: torch.full_like(s, 2.0 ** -24))      # fp16's smallest subnormal
    dots = torch.full((1, 4, 1), sign, dtype=torch.int32)
    acc = replay._refold(x, w, dots, torch.float32)
    assert (acc.abs() > 0).all() and (acc.abs() < 1e-41).all() and (torch.sign(acc) == sign).all()
    y = replay._refold(x, w, dots, torch.bfloat16, rounding=rounding)
    assert (y.view(torch.int16) == bits).all(), y.view(torch.int16)


def test_a_fault_free_side_runs_the_weights_as_given_and_a_faulted_one_only_its_targets():
    from kernels import backend, dispatch, use
    from pq2verify.gsm8k.runs import parse_spec, run_spec
    g, o = "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"
    weights = {g: inputs.ternary_weight(16, 128, 3, "cpu"), o: inputs.ternary_weight(16, 128, 4, "cpu")}
    x = torch.randn(1, 128, generator=torch.Generator().manual_seed(5)).bfloat16()
    calls = [_call(g, 0, x), _call(o, 0, x)]
    with backend.using_cpu_backend("emulate"):
        with use(run_spec(parse_spec("legacy"))):
            plain = [dispatch.pq2_matmul(x, weights[c.layer]) for c in calls]
        a = replay.run_side(parse_spec("legacy"), calls, weights)
        b = replay.run_side(parse_spec("legacy"), calls, weights, parse_fault("scale_1pct:o_proj", calls))
    assert all(torch.equal(o_.y, p) for o_, p in zip(a, plain))
    assert torch.equal(b[0].y, plain[0]) and not torch.equal(b[1].y, plain[1])


def test_stale_tile_plants_the_previous_calls_tile_into_the_second_call_only():
    o = "model.layers.1.self_attn.o_proj"
    n = replay.STALE_TILE_N + 8
    ys = [torch.full((1, n), float(i + 1)) for i in range(3)]
    f = parse_fault("stale_tile:o_proj", [_call(o, i, torch.full((1, 128), float(i))) for i in range(3)])
    got, prev = [], None
    for i, y in enumerate(ys):
        got.append(f.output(_call(o, i, torch.zeros(1, 128)), None, y, None, prev))
        prev = got[-1]
    assert torch.equal(got[0], ys[0]) and torch.equal(got[2], ys[2])
    assert torch.equal(got[1][:, :replay.STALE_TILE_N], ys[0][:, :replay.STALE_TILE_N])
    assert torch.equal(got[1][:, replay.STALE_TILE_N:], ys[1][:, replay.STALE_TILE_N:])
    assert torch.equal(ys[1], torch.full((1, n), 2.0))                  # the call's own output untouched
