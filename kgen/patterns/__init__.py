"""Typed IR → plan: ordered matchers, the first that fits wins.

A matcher returns a plan (a frozen dataclass the pattern's template prints) or
``None`` when the kernel is not its shape.  What fits no pattern gets an error
that points at the part of the spec outside the supported patterns.
"""
from __future__ import annotations

from ..errors import UnsupportedError
from ..ir import KernelIR, Op, topo_order
from . import elementwise, gemm, grouped_gemm, row_reduce

# Most specific first.
MATCHERS = (grouped_gemm.match, gemm.match, row_reduce.match, elementwise.match)


def classify(kir: KernelIR):
    for match in MATCHERS:
        plan = match(kir)
        if plan is not None:
            return plan
    raise _unsupported(kir)


def _unsupported(kir: KernelIR) -> UnsupportedError:
    for node in topo_order(o.node for o in kir.outputs):
        if node.op is Op.MATMUL:
            return UnsupportedError("matmul kernels are not supported yet", node.span)
        if node.op in (Op.SUM, Op.MAX, Op.MIN, Op.MEAN):
            return UnsupportedError(f"{node.op.value} over axis {node.arg} of a rank-{len(node.inputs[0].shape)} "
                                    f"tensor is outside the supported patterns", node.span)
    return UnsupportedError("this kernel fits none of kgen's patterns", kir.span)
