"""The dtype table: names, torch and Triton spellings, and torch's promotion."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    name: str          # as written in specs: f16
    torch: torch.dtype
    triton: str        # tl.float16
    category: int      # 0 bool, 1 integer, 2 floating (torch's promotion categories)
    bits: int

    @property
    def is_float(self) -> bool:
        return self.category == 2

    @property
    def bytes(self) -> int:
        """Its size in memory (bool takes a byte)."""
        return (self.bits + 7) // 8

    @property
    def compute(self) -> DType:
        """16-bit floats are computed in f32 and rounded on store."""
        return F32 if self.is_float and self.bits < 32 else self

    def __str__(self) -> str:
        return self.name


BOOL = DType("bool", torch.bool, "tl.int1", 0, 1)
I32 = DType("i32", torch.int32, "tl.int32", 1, 32)
F16 = DType("f16", torch.float16, "tl.float16", 2, 16)
BF16 = DType("bf16", torch.bfloat16, "tl.bfloat16", 2, 16)
F32 = DType("f32", torch.float32, "tl.float32", 2, 32)

BY_NAME = {d.name: d for d in (BOOL, I32, F16, BF16, F32)}
BY_TORCH = {d.torch: d for d in BY_NAME.values()}


def promote(a: DType, b: DType) -> DType:
    """torch.promote_types restricted to kgen's dtypes."""
    return BY_TORCH[torch.promote_types(a.torch, b.torch)]


def promote_weak(tensor: DType, weak: DType) -> DType:
    """Promotion against a scalar (literal or scalar parameter): the scalar only
    decides when it is of a higher category, as torch does for Python numbers."""
    if weak.category > tensor.category:
        return F32 if weak.is_float else weak
    return tensor
