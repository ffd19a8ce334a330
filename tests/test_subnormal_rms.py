"""The relative-RMS bound below the normal range (numerics.subnormal_floor): an output in the
fp16 subnormal range rounds within half the subnormal spacing h = 2^-25, absolute, so its
relative error can exceed the unit roundoff u; the bound is u ||Y|| + h sqrt(n) over ||Y||. A
correct kernel's subnormal output passes, an error of a few spacings still fails, and outputs
in the normal range keep the bound they had."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pq2verify import checks, numerics, verdicts
from pq2verify.cases import Case

INTEGER = SimpleNamespace(reference="quantized", arithmetic="integer")
H = 2.0 ** -25          # half the fp16 subnormal spacing 2^-24


def _quantized_rms(y, ref, dtype=torch.float16):
    refs = {"quantized": ref, "dense": ref}
    (v,) = verdicts.rms(INTEGER, y, refs.get, dtype, only=("quantized",))
    return v


def test_a_subnormal_output_rounded_once_passes():
    # Y just under a half-way point of the subnormal grid: its rounding error is almost h,
    # 0.0022 relative at Y = 2.7e-5, four times u = 2^-11
    k = 452
    ref = np.array([[(k + 0.5 - 1e-3) * 2.0 ** -24]])
    y = np.array([[float(torch.tensor(ref[0, 0]).half())]])
    assert abs(y[0, 0] - ref[0, 0]) / ref[0, 0] > 2.0 ** -11     # beyond u: the old bound failed it
    v = _quantized_rms(y, ref)
    assert v.ok, (v.err, v.tol)


def test_a_subnormal_output_two_spacings_off_fails():
    ref = np.array([[452 * 2.0 ** -24]])
    y = ref + 2 * 2.0 ** -24
    v = _quantized_rms(y, ref)
    assert not v.ok, (v.err, v.tol)


def test_outputs_in_the_normal_range_keep_their_bound():
    ref = np.linspace(0.01, 1.0, 1000).reshape(1, -1)
    floor = numerics.subnormal_floor(torch.float16, ref)
    assert floor == pytest.approx(H * math.sqrt(1000) / float(np.linalg.norm(ref)))
    assert floor < 1e-6
    assert numerics.subnormal_floor(torch.float16, np.zeros((1, 4))) == 0.0     # zero refs match only exactly


def test_the_fuzzed_case_that_found_it_passes(device):
    # CI's fuzz (seed 3326968078, case 95) failed this correct single-element fp16 output:
    # 2.694e-5 against 2.696e-5, 0.32 of a subnormal spacing, inside its per-element bound
    c = Case.parse("single:t=1x384:m1:fp16:raw:tiny:seed10952")
    r = checks.evaluate(c, device, checks=("rms",), reruns=1)
    assert r.ok, r.message()
