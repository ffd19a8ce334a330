"""Golden captures: frozen output bytes of every path on a fixed set of cases, per backend
(golden/interpreter/, golden/sm90/: GPU and interpreter rounding differ).

A capture directory holds
- inputs.safetensors: the activations and weights of every case (format-1 captures stored only
  weights up to 64 KB and regenerate the others from their seed, which holds only on a host
  whose torch CPU capability gives the same randn bits),
- <path>.safetensors: that path's output of every case, keyed by case id,
- manifest.json: per-file sha256, the cases (each with the sha256 of its x and y), each weight
  as seed + shape + sha256, per path the sha256 of its kernel sources, how its bits may be
  compared ("bits", see below) and the CPU it was captured on ("isa"), torch and triton
  versions, GPU name or 'interpreter', commit and date.

`verify` recomputes every case twice, each run into a fresh output buffer whose storage is
neither the other run's nor the golden's (a kernel that returns or rewrites a buffer it returned
before cannot make a comparison compare a tensor with itself), and compares the whole output with
the capture's whole tensor (a stored tensor that is not the case's full shape is an integrity
failure); it also fails every case the code expects for the backend (cases(key)) that the capture
lacks or refused, every case whose stored bytes do not match their sha256, a folder holding files
its manifest does not list, and a capture of another backend than the one running (the bits class
is the code's, from the registry entry and the running backend; a manifest's record of it that
disagrees is a failure, never a looser comparison). A missing capture raises NoCapture: a failure
for a backend in COMMITTED (the capture is in git), reported with how to capture; a file whose hash does not
match the manifest raises GoldenIntegrityError naming the cases it holds (an error, never a
pass); a kernel whose source changed while its output still matches is reported as 'source
changed, output identical'.

Bits that depend on the CPU. On the interpreter a floating path's FP32 fold order is chosen by
the CPU's instruction set, not by our code: Triton's interpreter runs a floating tl.dot as numpy
float32 matmul, i.e. OpenBLAS sgemm, whose kernel (and so its summation order) OpenBLAS picks per
CPU core type (native, small_gemm); the cublas path is torch.matmul, whose bf16/fp16 kernel ATen,
oneDNN and MKL pick by the CPU (ATEN_CPU_CAPABILITY, avx512_bf16, AMX...). Measured on an AVX-512
EPYC (2026-11-30): cublas M=17 differs by 1 ulp in 1-3 of 1632 elements between AVX-512 with bf16,
ONEDNN_MAX_CPU_ISA=AVX2 and ATEN_CPU_CAPABILITY=default; small_gemm's output differs on 1 of 16
bf16 and 7 of 16 fp16 random M=16 inputs between OPENBLAS_CORETYPE=Haswell and SkylakeX. Such a
path is captured with "bits": "isa-dependent", the reason, and the ISA key of the machine (isa():
CPU flags, torch's CPU capability, numpy's BLAS core, threads...). It is compared bit for bit
where the ISA key equals the capture's, and otherwise per element within a derived bound: two
FP32 folds of the same exact products, in any orders, each lie within F of the exact sum
(F = (K + 2) 2^-24 S with S = sum_k |x_k||w_k| from the captured inputs, see fold_bound), and
each is then rounded once to the output dtype (half a spacing), so
    |y - golden| <= 2 F + spacing(max(|y|, |golden|)).
Integer paths stay exact everywhere: their INT8 dots are exact and their FP32 epilogue is a fixed
sequence of elementwise IEEE operations (identical bits under every setting above). GPU captures
are keyed by the architecture (sm90) and compared bit for bit.
"""
import importlib

# One module per concern; every name stays readable as pq2verify.golden.<name>, looked up in them
# when read, so a test that replaces (say) store.default_dir is seen by every reader.
_PARTS = ("store", "isakey", "sources", "capturing", "verifying")
_MODULES = [importlib.import_module(f"{__name__}.{m}") for m in _PARTS]


def __getattr__(name: str):
    for m in _MODULES:
        if name in vars(m):
            return vars(m)[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {n for m in _MODULES for n in vars(m) if not n.startswith("__")})
