"""The shapes and Ms the static checks compile for: every PQ2 call the bench, the GPU check and
the GSM8K model make."""
import functools


@functools.cache
def model_shapes() -> list[tuple[str, int, int]]:
    """(label, N, K) of every PQ2 matrix the GSM8K model (SmolLM2-135M's config,
    pq2verify.gsm8k.architecture) runs, as pq2verify.gsm8k.model converts it: siblings stacked
    along N, K padded to whole groups, times the digits (4 by default, 1 for a ternary
    checkpoint). Built on the meta device: shapes only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from pq2verify.gsm8k import convert, model as mdl
    from pq2verify.gsm8k.architecture import SMOLLM2_135M
    with torch.device("meta"):
        net = LlamaForCausalLM(LlamaConfig(**{**SMOLLM2_135M, "num_hidden_layers": 1}))
    out = []
    for parent, names in mdl._linear_groups(net):
        mods = [getattr(parent, x) for x in names]
        kp = convert.pad_k(torch.empty(1, mods[0].in_features, device="meta")).shape[1]
        for digits in (4, 1):
            out.append((f"gsm8k:{'+'.join(names)}x{digits}", sum(x.out_features for x in mods), digits * kp))
    return out


def run_shapes(model: bool = True) -> list[tuple[str, int, int, tuple]]:
    """(label, N, K, Ms) of every PQ2 call the bench, the GPU check and the GSM8K model make:
    the bonsai27b shapes at the bench's Ms (step and shape rows, and the prefill sizes it reports
    beside its target) and the check's; the model's
    at every decode M (rows still generating, 1..16) and its prefill (17+: no PDL path); not
    the model's unless `model`."""
    from pq2verify import bench, cases
    ms = tuple(sorted(set(bench.STEP_MS) | set(bench.DEFAULT_MS) | set(bench.REPORT_MS) | set(cases.MS["bonsai27b"])))
    out = [(f"bonsai27b:{s}", n, k, ms) for s, n, k in cases.SHAPES["bonsai27b"]["pq2"]]
    return out + [(label, n, k, tuple(range(1, 18))) for label, n, k in (model_shapes() if model else [])]
