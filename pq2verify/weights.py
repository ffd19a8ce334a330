"""The PQ2 weight object: one allocation, validated once, with typed views for the kernels.

Raw layout: [N, G*34] bytes, each block = fp16 scale (2 bytes) + 32 code bytes.
Prepared layout: one flat allocation, code plane [N, K/4] then scale plane [N, G] fp16.
Kernels read both through the same strides (in bytes for codes, in halves for scales).
"""
from dataclasses import dataclass, field

import torch

BLOCK = 128
BLOCK_BYTES = 34


class PQ2FormatError(ValueError):
    """A weight that is not valid PQ2_0 (shape, dtype, byte count, code 3, ...)."""


def _find_code3(codes: torch.Tensor):
    """First (row, byte) whose byte holds a 2-bit field equal to 3, or None. codes: uint8 [N, B]."""
    c = codes.to(torch.int32)
    bad = torch.zeros_like(c, dtype=torch.bool)
    for s in range(4):
        bad |= ((c >> (2 * s)) & 3) == 3
    if not bool(bad.any()):
        return None
    idx = int(torch.nonzero(bad.flatten())[0])
    return divmod(idx, codes.shape[1])


@dataclass(eq=False)
class PQ2Weight:
    data: torch.Tensor          # uint8; raw [N, G*34] or prepared flat [N*G*34]
    n: int
    k: int
    layout: str                 # "raw" | "prepared"
    _views: dict = field(default_factory=dict, repr=False)

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
        raw = raw.contiguous()
        w = cls(raw, n, rs // BLOCK_BYTES * BLOCK, "raw")
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
        w = cls(flat.contiguous(), n, k, "prepared")
        if validate:
            w.validate()
        return w

    def validate(self) -> None:
        """Reject code 3 and non-finite scales, naming the first bad row and block."""
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
        return PQ2Weight(flat, self.n, self.k, "prepared")

    def to_raw(self) -> "PQ2Weight":
        if self.layout == "raw":
            return self
        blocks = torch.cat([self.scales_matrix().contiguous().view(torch.uint8).view(self.n, self.groups, 2),
                            self.codes_matrix().reshape(self.n, self.groups, 32)], dim=2)
        return PQ2Weight(blocks.reshape(self.n, self.groups * BLOCK_BYTES).contiguous(), self.n, self.k, "raw")

    def to(self, device) -> "PQ2Weight":
        return PQ2Weight(self.data.to(device), self.n, self.k, self.layout)

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
        g = self.groups
        if self.layout == "raw":
            rs = g * BLOCK_BYTES
            return dict(code_row=rs, code_group=BLOCK_BYTES, code_off=2,
                        scale_row=rs // 2, scale_group=BLOCK_BYTES // 2, scale_off=0)
        return dict(code_row=self.k // 4, code_group=32, code_off=0,
                    scale_row=g, scale_group=1, scale_off=self.n * self.k // 8)
