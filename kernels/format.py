"""The PQ2 weight format: one allocation, validated once, with typed views for the kernels.

Raw layout: [N, G*34] bytes, each block = fp16 scale (2 bytes) + 32 code bytes.
Prepared layout: one flat allocation, code plane [N, K/4] then scale plane [N, G] fp16.
Kernels read both through the same strides (in bytes for codes, in halves for scales).
"""
import numbers
import zlib
from dataclasses import dataclass, field

import torch

BLOCK = 128
BLOCK_BYTES = 34


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] in 0..3 -> code bytes [..., K/4]: weight 4b+s at bits 2s of byte b
    (SPEC §2). The one torch packing; reference.pq2 keeps its own as the oracle. Byte arithmetic:
    the low 8 bits of shifts and ORs depend only on the operands' low 8 bits, and a wider copy
    would take 4 bytes per code (lm_head's 1.27 G codes: 5 GB of a test worker's GPU share)."""
    c = codes.reshape(*codes.shape[:-1], -1, 4).to(torch.uint8)
    return c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)


def unpack_codes(code_bytes: torch.Tensor) -> torch.Tensor:
    """Code bytes [..., B] -> uint8 codes [..., 4B] in 0..3 (inverse of pack_codes)."""
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=code_bytes.device)
    c = (code_bytes.to(torch.int32)[..., None] >> shifts) & 3
    return c.reshape(*code_bytes.shape[:-1], -1).to(torch.uint8)


class PQ2FormatError(ValueError):
    """A weight that is not valid PQ2_0 (shape, dtype, byte count, code 3, ...)."""


ALIGN = 16   # bytes: kernels read int32 code words and 16-byte vectors from the allocation


def _find_code3(codes: torch.Tensor):
    """First (row, byte) whose byte holds a 2-bit field equal to 3, or None. codes: uint8 [N, B].
    A field is 3 when both of its bits are set: byte & (byte >> 1) & 0b01010101 (no widening,
    so a weight of hundreds of MB costs one extra byte plane, not four)."""
    bad = (codes & (codes >> 1) & 0x55) != 0
    if not bool(bad.any()):
        return None
    idx = int(torch.nonzero(bad.flatten())[0])
    return divmod(idx, codes.shape[1])


def _version(t: torch.Tensor):
    """torch's count of in-place writes to t's allocation; None for inference tensors (which
    keep none: in-place writes to those cannot be seen)."""
    try:
        return t._version
    except (RuntimeError, AttributeError):
        return None


def _fingerprint(t: torch.Tensor):
    """CRC-32 of a CPU tensor's bytes (about 0.3 ms a MB), None elsewhere. On the CPU the bytes
    can change behind torch's version counter (a numpy view, a buffer shared by pointer)."""
    if t.device.type != "cpu":
        return None
    return zlib.crc32(t.detach().reshape(-1).numpy())


def _stamp(t: torch.Tensor, fp) -> tuple:
    return (_version(t), fp)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and ALIGN-byte aligned: a slice at an odd offset of a larger buffer is copied
    (documented policy: weights are copied at load, never per call)."""
    t = t.contiguous()
    return t if t.data_ptr() % ALIGN == 0 else t.clone()


@dataclass(eq=False)
class PQ2Weight:
    """A PQ2_0 weight, N x K, in the raw or prepared layout (module docstring).

    Validation (code 3 and non-finite scales are refused, naming row and block) runs once per
    bytes: at load, or at the first call for a weight built by hand, and again whenever the
    bytes may have changed since. The bytes are taken to have changed when
    - torch says so: an in-place write through any torch view of the allocation bumps its
      version counter (`w.data[...] = ...`, `copy_`, a kernel's `out=`); or
    - on the CPU, their CRC-32 differs: each call through pq2_matmul or a kernel wrapper
      compares it, so a write torch does not count (through a numpy view of the data, or
      any other alias of the buffer) is seen at the next call. This costs one pass over the
      weight bytes per call, about 0.3 ms a MB.
    Either way the validation verdict and everything derived from the bytes (typed views, the
    emulation's decoded weights) are dropped and rebuilt: a changed weight gives the new
    weight's result, and code 3 written in after a first call is refused at the next one.
    On a GPU, writes must go through torch: one that bypasses the version counter (DLPack,
    a raw pointer) after the first call is not detected (the check would cost a device sync
    per call). Inference tensors (made under torch.inference_mode) keep no version counter,
    so they are refused as data on every device: build the weight outside inference mode.
    n, k and layout describe the bytes and are read-only; assign `data` (same size) to swap
    the bytes, or build a new weight.
    """
    data: torch.Tensor          # uint8; raw [N, G*34] or prepared flat [N*G*34]
    n: int
    k: int
    layout: str                 # "raw" | "prepared"
    checked: bool = field(default=False, repr=False)   # validate() passed on the bytes as they were then

    def __post_init__(self):
        # structure only (no data read): a weight built by hand must still be self-consistent
        for name in ("n", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"weight: {name.upper()} must be an int, got {type(v).__name__} {v!r}")
            object.__setattr__(self, name, int(v))
        if self.layout not in ("raw", "prepared"):
            raise PQ2FormatError(f"weight: layout must be 'raw' or 'prepared', got {self.layout!r}")
        if not isinstance(self.data, torch.Tensor):
            raise TypeError(f"weight: data must be a uint8 torch.Tensor, got {type(self.data).__name__}")
        if self.data.dtype != torch.uint8:
            raise PQ2FormatError(f"weight: data must be a uint8 tensor, got {self.data.dtype}")
        _refuse_inference(self.data)
        if self.n < 0:
            raise PQ2FormatError(f"weight: N={self.n} is negative")
        if self.k <= 0 or self.k % BLOCK:
            raise PQ2FormatError(f"weight: K={self.k} is not a positive multiple of {BLOCK}")
        if self.data.numel() != self.nbytes:
            raise PQ2FormatError(f"weight: {self.data.numel()} bytes, expected N*K/128*34 = {self.nbytes} "
                                 f"for N={self.n}, K={self.k}")
        if self.data.data_ptr() % ALIGN or not self.data.is_contiguous():
            self.data = _aligned(self.data)   # copied once here, never per call

    def __setattr__(self, name, value):
        # Views, derived tensors and the validation verdict belong to the bytes they were made
        # from: replacing the data drops them, or a kernel would read the old ones.
        built = "checked" in self.__dict__
        if built and name in ("n", "k", "layout"):
            raise AttributeError(f"PQ2Weight.{name} is read-only: it describes the bytes; build a new weight "
                                 "(PQ2Weight.from_raw / from_prepared) for another shape or layout")
        if built and name == "data":
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"weight: data must be a uint8 torch.Tensor, got {type(value).__name__}")
            if value.dtype != torch.uint8 or value.numel() != self.nbytes:
                raise PQ2FormatError(f"weight: new data must be {self.nbytes} uint8 bytes (N={self.n}, K={self.k}), "
                                     f"got {value.numel()} of {value.dtype}")
            _refuse_inference(value)
        object.__setattr__(self, name, value)
        if name == "checked":
            if value:
                fp = self.__dict__["_fp"] = _fingerprint(self.data)
                self.__dict__["_checked_at"] = _stamp(self.data, fp)
            else:
                self.__dict__["_checked_at"] = None
        elif name == "data" and built:
            self.__dict__.pop("_cache", None)
            self.__dict__.pop("_fp", None)
            object.__setattr__(self, "checked", False)

    @property
    def _views(self) -> dict:
        """Per-object cache of what is derived from the data (typed views here; emulation's
        decoded weights). Also dropped when the data is written in place (torch's version
        counter, shared by all views of the allocation; on the CPU also the CRC-32 the last
        ensure_checked saw): nothing derived outlives its bytes."""
        ver = _stamp(self.data, self.__dict__.get("_fp"))
        if "_cache" not in self.__dict__ or self.__dict__.get("_cache_at") != ver:
            self.__dict__["_cache"], self.__dict__["_cache_at"] = {}, ver
        return self.__dict__["_cache"]

    @property
    def groups(self) -> int:
        return self.k // BLOCK

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.n * self.groups * BLOCK_BYTES

    @classmethod
    def from_raw(cls, raw: torch.Tensor, *, validate: bool = True) -> "PQ2Weight":
        if not isinstance(raw, torch.Tensor):
            raise TypeError(f"weight: expected a torch.Tensor of uint8, got {type(raw).__name__}")
        if raw.dtype != torch.uint8:
            raise PQ2FormatError(f"weight: expected dtype uint8, got {raw.dtype}")
        if raw.dim() != 2:
            raise PQ2FormatError(f"weight: expected a raw matrix [N, K/128*34] (rank 2), got rank {raw.dim()}")
        n, rs = raw.shape
        if rs == 0 or rs % BLOCK_BYTES:
            raise PQ2FormatError(
                f"weight: row of {rs} bytes is not a multiple of {BLOCK_BYTES} (one block = fp16 scale + 32 code bytes)")
        w = cls(_aligned(raw), n, rs // BLOCK_BYTES * BLOCK, "raw")
        if validate:
            w.validate()
        return w

    @classmethod
    def from_prepared(cls, flat: torch.Tensor, n: int, k: int, *, validate: bool = True) -> "PQ2Weight":
        if not isinstance(flat, torch.Tensor) or flat.dtype != torch.uint8:
            raise PQ2FormatError(f"weight: expected a flat uint8 tensor, got {getattr(flat, 'dtype', type(flat))}")
        if k <= 0 or k % BLOCK:
            raise PQ2FormatError(f"weight: K={k} is not a positive multiple of {BLOCK}")
        if flat.dim() != 1 or flat.numel() != n * k // BLOCK * BLOCK_BYTES:
            raise PQ2FormatError(
                f"weight: prepared buffer must be flat with N*K/128*34 = {n * k // BLOCK * BLOCK_BYTES} bytes, "
                f"got shape {tuple(flat.shape)}")
        w = cls(_aligned(flat), n, k, "prepared")
        if validate:
            w.validate()
        return w

    def validate(self) -> None:
        """Reject code 3 and non-finite scales, naming the first bad row and block."""
        self.__dict__["_fp"] = _fingerprint(self.data)      # of the bytes judged here
        codes, scales = self.codes_matrix(), self.scales_matrix()
        hit = _find_code3(codes)
        if hit is not None:
            row, byte = hit
            raise PQ2FormatError(
                f"weight: code 3 in row {row}, block {byte // 32} (byte {byte % 32} of the block); "
                "PQ2_0 codes are 0, 1, 2 (-1, 0, +1)")
        bad = ~torch.isfinite(scales.float())
        if bool(bad.any()):
            row, blk = divmod(int(torch.nonzero(bad.flatten())[0]), self.groups)
            raise PQ2FormatError(f"weight: non-finite fp16 scale in row {row}, block {blk}")
        self.checked = True

    def ensure_checked(self) -> None:
        """validate() once per bytes: again after they were replaced or written in place (torch's
        version counter; on the CPU also their CRC-32, see the class docstring). Skipped while
        a CUDA graph is being captured (validation reads the data back to the host); the eager
        warm-up call that must precede a capture has done it."""
        fp = _fingerprint(self.data)
        if fp != self.__dict__.get("_fp"):
            self.__dict__["_fp"] = fp           # derived caches (_views) follow the new bytes
        if self.checked and self.__dict__.get("_checked_at") == _stamp(self.data, fp):
            return
        if self.data.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        self.validate()

    # --- plane views (copies for raw; views for prepared) -------------------------------
    def codes_matrix(self) -> torch.Tensor:
        """uint8 [N, K/4] code bytes, blocks in order."""
        if self.layout == "prepared":
            return self.data[: self.n * self.k // 4].view(self.n, self.k // 4)
        blocks = self.data.view(self.n, self.groups, BLOCK_BYTES)
        return blocks[:, :, 2:].reshape(self.n, self.k // 4)

    def scales_matrix(self) -> torch.Tensor:
        """float16 [N, G] scales."""
        if self.layout == "prepared":
            return self.data[self.n * self.k // 4:].view(torch.float16).view(self.n, self.groups)
        blocks = self.data.view(self.n, self.groups, BLOCK_BYTES)
        return blocks[:, :, :2].contiguous().view(torch.float16).view(self.n, self.groups)

    def to_prepared(self) -> "PQ2Weight":
        if self.layout == "prepared":
            return self
        flat = torch.cat([self.codes_matrix().reshape(-1), self.scales_matrix().reshape(-1).view(torch.uint8)])
        return PQ2Weight(flat, self.n, self.k, "prepared", checked=self.checked)

    def to_raw(self) -> "PQ2Weight":
        if self.layout == "raw":
            return self
        blocks = torch.cat([self.scales_matrix().contiguous().view(torch.uint8).view(self.n, self.groups, 2),
                            self.codes_matrix().reshape(self.n, self.groups, 32)], dim=2)
        return PQ2Weight(blocks.reshape(self.n, self.groups * BLOCK_BYTES).contiguous(), self.n, self.k, "raw",
                         checked=self.checked)

    def to(self, device) -> "PQ2Weight":
        return PQ2Weight(self.data.to(device), self.n, self.k, self.layout, checked=self.checked)

    # --- what the kernels read: typed views of the ONE allocation, plus strides -----------
    @property
    def flat(self) -> torch.Tensor:
        return self.data.view(-1)

    @property
    def codes_u8(self) -> torch.Tensor:
        return self.flat

    @property
    def scales_f16(self) -> torch.Tensor:
        v = self._views.get("f16")
        if v is None:
            v = self._views["f16"] = self.flat.view(torch.float16)
        return v

    @property
    def codes_i32(self) -> torch.Tensor:
        """int32 view of the code plane (prepared layout only: raw code bytes are not 4-aligned)."""
        if self.layout != "prepared":
            raise PQ2FormatError("weight: int32 code words need the prepared layout")
        v = self._views.get("i32")
        if v is None:
            v = self._views["i32"] = self.flat[: self.n * self.k // 4].view(torch.int32)
        return v

    @property
    def strides(self) -> dict:
        """Byte strides of code bytes and half strides of scales, for both layouts."""
        return layout_strides(self.n, self.k, self.layout)


def _refuse_inference(t: torch.Tensor) -> None:
    if t.is_inference():
        raise TypeError("weight: data is an inference tensor (made under torch.inference_mode), which keeps no "
                        "version counter, so a write to it after the first call could not be seen; build the "
                        "weight outside inference mode (e.g. from data.clone() made there)")


def layout_strides(n: int, k: int, layout: str) -> dict:
    """PQ2Weight.strides of an N x K weight in `layout` without building one (tools that
    compile kernels for a shape need the kernel arguments' values only)."""
    g = k // BLOCK
    if layout == "raw":
        rs = g * BLOCK_BYTES
        return dict(code_row=rs, code_group=BLOCK_BYTES, code_off=2,
                    scale_row=rs // 2, scale_group=BLOCK_BYTES // 2, scale_off=0)
    return dict(code_row=k // 4, code_group=32, code_off=0, scale_row=g, scale_group=1, scale_off=n * k // 8)
