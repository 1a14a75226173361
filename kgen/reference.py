"""The IR evaluated with torch ops: the oracle for tests and ``kgen run``.

``exact=True`` computes every floating value in float64 (rounding only where the
spec casts); ``exact=False`` computes in the spec's own dtypes, as a user writing
the same math in eager PyTorch would: that is the baseline ``kgen bench`` times,
eagerly and under ``torch.compile``.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F

from .ir import COMPARISONS, KernelIR, Node, Op, result_type, topo_order


def _leaky_relu(x, alpha):
    if not isinstance(x, torch.Tensor):  # leaky_relu(0.5, sigmoid(A))
        x = _as_tensor(x, alpha)
    if isinstance(alpha, (int, float)) and x.is_floating_point():  # what a user writes: one kernel in eager mode
        return F.leaky_relu(x, alpha)
    return torch.where(x > 0, x, x * alpha)   # (torch has no integer leaky_relu: i32 x, alpha 2)


def _clamp(node: Node):
    has_lo, has_hi = node.arg

    def clamp(x, *bounds):
        it = iter(bounds)
        lo = next(it) if has_lo else None
        hi = next(it) if has_hi else None
        if not isinstance(x, torch.Tensor):  # clamp(0.5, A, B)
            x = _as_tensor(x, next(b for b in bounds if isinstance(b, torch.Tensor)))
        lo, hi = _as_tensor(lo, x), _as_tensor(hi, x)
        # a cast scalar is a 0-dim CPU tensor, which torch.clamp will not mix with CUDA bounds
        device = next((t.device for t in (x, lo, hi) if t is not None and t.device.type != "cpu"), x.device)
        x, lo, hi = (None if t is None else t.to(device) for t in (x, lo, hi))
        return torch.clamp(x, lo, hi)
    return clamp


def _as_tensor(v, like):
    """A number beside the tensor ``like`` as a 0-dim tensor that promotes with it as the number
    would: in ``like``'s floating dtype, else its own category's (minimum(2, i) stays int32)."""
    if v is None or isinstance(v, torch.Tensor):
        return v
    dtype = like.dtype if like.is_floating_point() else {bool: torch.bool, int: torch.int64}.get(type(v), torch.float64)
    return torch.tensor(v, dtype=dtype, device=like.device)


def _binary_tensor(fn):
    """torch.maximum and friends want tensors on both sides."""
    def apply(a, b):
        if not isinstance(a, torch.Tensor):
            a = _as_tensor(a, b)
        if not isinstance(b, torch.Tensor):
            b = _as_tensor(b, a)
        return fn(a, b)
    return apply


def _extreme(x: torch.Tensor, axis: int, largest: bool) -> torch.Tensor:
    """``amax``/``amin`` keeping the axis; over an axis of 0 elements, where torch raises, the
    reduction's identity, as the kernels give it (max: -inf, or the dtype's least value)."""
    if x.shape[axis] != 0:
        return x.amax(axis, keepdim=True) if largest else x.amin(axis, keepdim=True)
    shape = list(x.shape)
    shape[axis] = 1
    return torch.full(shape, _identity(x.dtype, largest), dtype=x.dtype, device=x.device)


def _identity(dtype: torch.dtype, largest: bool) -> float | int | bool:
    """The value no element can be below (for max) or above (for min)."""
    if dtype.is_floating_point:
        return -math.inf if largest else math.inf
    if dtype == torch.bool:
        return not largest
    info = torch.iinfo(dtype)
    return info.min if largest else info.max


REFERENCE_OPS = {
    Op.NEG: torch.neg, Op.ABS: torch.abs, Op.EXP: torch.exp, Op.EXP2: torch.exp2,
    Op.LOG: torch.log, Op.LOG2: torch.log2, Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt,
    Op.SIN: torch.sin, Op.COS: torch.cos, Op.TANH: torch.tanh, Op.SIGMOID: torch.sigmoid,
    Op.RELU: torch.relu, Op.GELU: F.gelu, Op.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
    Op.SILU: F.silu, Op.SOFTPLUS: F.softplus,
    Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.true_divide,
    Op.POW: torch.pow, Op.MAXIMUM: _binary_tensor(torch.maximum), Op.MINIMUM: _binary_tensor(torch.minimum),
    Op.LEAKY_RELU: _leaky_relu,
    # the operators, not torch.lt & co: they take a number on either side (0.5 < X)
    Op.LT: operator.lt, Op.LE: operator.le, Op.GT: operator.gt, Op.GE: operator.ge, Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.WHERE: torch.where,
    Op.SUM: lambda x, axis: x.sum(axis, keepdim=True),
    Op.MAX: lambda x, axis: _extreme(x, axis, largest=True),
    Op.MIN: lambda x, axis: _extreme(x, axis, largest=False),
    Op.MEAN: lambda x, axis: x.mean(axis, keepdim=True),
    Op.MATMUL: torch.matmul,
}


def evaluate(kir: KernelIR, args: dict, exact: bool = True) -> tuple:
    """Outputs of ``kir`` for ``args`` (parameter name → tensor or number), in order.
    A grouped kernel (list parameters) is evaluated once per problem, with the i-th tensor
    of each list; each of its outputs is a list."""
    lists = [p.name for p in kir.params if p.is_list]
    if lists:
        problems = [_evaluate(kir, {**args, **{n: args[n][i] for n in lists}}, exact)
                    for i in range(len(args[lists[0]]))]
        return tuple(list(outs) for outs in zip(*problems)) if problems else tuple([] for _ in kir.outputs)
    return _evaluate(kir, args, exact)


def _evaluate(kir: KernelIR, args: dict, exact: bool) -> tuple:
    values: dict[int, object] = {}
    for node in topo_order(o.node for o in kir.outputs):
        values[id(node)] = _eval(node, [values[id(i)] for i in node.inputs], args, exact)
    return tuple(values[id(o.node)] for o in kir.outputs)


def evaluate_node(node: Node, operands: list):
    """One pointwise node of the exact reference on ``operands`` (tensors or numbers)."""
    return _eval(node, operands, {}, exact=True)


def _compared_in(operand: Node, common):
    """The dtype a comparison's operand is rounded to: the one the sides meet in, or f32 for a
    value of that 16-bit dtype (an input's or a cast's is exact there, a computed one is not rounded)."""
    return common.compute if operand.dtype is common and not operand.is_weak else common


def _eval(node: Node, operands: list, args: dict, exact: bool):
    if node.op is Op.INPUT:
        x = args[node.arg]
        return _widen(x) if exact else x
    if node.op is Op.SCALAR:
        return args[node.arg]
    if node.op is Op.CONST:
        return node.arg
    if node.op is Op.CAST:
        (x,) = operands
        x = x.to(node.dtype.torch) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=node.dtype.torch)
        return _widen(x) if exact else x
    if not any(isinstance(o, torch.Tensor) for o in operands):
        # math on numbers alone (exp(1.0), 1 / 0, maximum(1, 2)): as 0-dim tensors, so that
        # torch's functions take them and the result is torch's, never Python's
        operands = [torch.tensor(o, dtype=torch.float64 if exact and i.dtype.is_float else i.dtype.torch)
                    for o, i in zip(operands, node.inputs)]
    if exact and node.dtype.is_float:
        operands = [_widen(o, ints_too=True) for o in operands]
    elif exact and node.op in COMPARISONS and (common := result_type(*node.inputs)).is_float:
        # compared as the kernel compares them: each side rounded to the dtype they meet in (f32
        # x == 0.1 holds for x = f32(0.1); i32 16777217 == f32 16777216.0 holds), but a side of
        # that 16-bit dtype to f32, which holds it in the kernel (a computed f16 x * 3 unrounded)
        operands = [torch.as_tensor(o, dtype=torch.float64).to(_compared_in(i, common).torch)
                    if not isinstance(o, torch.Tensor) else o.to(_compared_in(i, common).torch)
                    for o, i in zip(operands, node.inputs)]
    if node.op in (Op.SUM, Op.MAX, Op.MIN, Op.MEAN):
        result = REFERENCE_OPS[node.op](operands[0], node.arg)
    elif node.op is Op.CLAMP:
        result = _clamp(node)(*operands)
    elif node.op is Op.POW and node.inputs[1].is_weak and isinstance(operands[1], torch.Tensor):
        # math on numbers came back a 0-dim tensor; torch takes a Python number exponent
        # its own way (x ** 0.5 is sqrt(x)), as the user's x ** (p * 2) would be
        base = operands[0]
        if not isinstance(base, torch.Tensor):   # a folded number: torch.pow takes no two numbers
            base = torch.tensor(base, dtype=torch.float64 if exact else node.dtype.torch)
        result = torch.pow(base, operands[1].item())
    elif node.op is Op.WHERE and not isinstance(operands[0], torch.Tensor):   # a bool scalar parameter
        result = torch.where(torch.tensor(operands[0]), *operands[1:])
    else:
        result = REFERENCE_OPS[node.op](*operands)
    if not exact and isinstance(result, torch.Tensor) and result.dtype != node.dtype.torch:
        result = result.to(node.dtype.torch)
    return result


def _widen(x, ints_too: bool = False):
    """float64 for floating tensors (and integer ones when the result is floating)."""
    if isinstance(x, torch.Tensor) and (x.is_floating_point() or (ints_too and x.dtype != torch.bool)):
        return x.to(torch.float64)
    return x


def compare(got, want) -> tuple[float, int]:
    """(max abs error, inf/NaN mismatches) of a kernel's output against the float64 reference, as
    the tests compare them (``torch.testing.assert_close(..., equal_nan=True)`` against the
    reference rounded to the output's dtype): where either side is inf or NaN the two must be the
    same after that rounding (NaN matching NaN, an inf the inf of its sign), else the element is a
    mismatch; the error is the largest over the elements finite on both sides, against the
    unrounded reference.  Lists (a grouped kernel's problems) count every problem's elements."""
    if isinstance(got, (list, tuple)):
        pairs = [compare(g, w) for g, w in zip(got, want)]
        return max((e for e, _ in pairs), default=0.0), sum(m for _, m in pairs)
    want = torch.as_tensor(want).to(got.device)
    g, exact = got.double(), want.double()
    rounded = want.to(got.dtype).double()
    finite = torch.isfinite(g) & torch.isfinite(rounded)
    same = (g == rounded) | (torch.isnan(g) & torch.isnan(rounded))
    mismatched = int((~finite & ~same).sum())
    error = (g - exact).abs()[finite & torch.isfinite(exact)]
    return (error.max().item() if error.numel() else 0.0), mismatched
