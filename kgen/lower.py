"""IR → Triton expressions: the table from op to format, and the statement lines
that every pattern's kernel body is made of.

A format's ``{0}``, ``{1}``... are its operands; each operand is printed with
parentheses when its own precedence is below what its slot needs.  Activations
that read their operand more than once are small ``@triton.jit`` helpers (their
source is in ``templates/macros.jinja``), so an operand is never computed twice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import dtypes as D
from .ir import LEAVES, KernelIR, Node, Op, topo_order

ATOM, CALL, UNARY, MUL, ADD, CMP = 100, 90, 30, 20, 10, 5

# op: (format, precedence of the result, precedence each operand slot needs)
TRITON_OPS: dict[Op, tuple[str, int, tuple[int, ...]]] = {
    Op.ADD: ("{0} + {1}", ADD, (ADD, ADD + 1)),
    Op.SUB: ("{0} - {1}", ADD, (ADD, ADD + 1)),
    Op.MUL: ("{0} * {1}", MUL, (MUL, MUL + 1)),
    Op.DIV: ("{0} / {1}", MUL, (MUL, MUL + 1)),
    Op.NEG: ("-{0}", UNARY, (UNARY,)),
    Op.LT: ("{0} < {1}", CMP, (CMP + 1, CMP + 1)),
    Op.LE: ("{0} <= {1}", CMP, (CMP + 1, CMP + 1)),
    Op.GT: ("{0} > {1}", CMP, (CMP + 1, CMP + 1)),
    Op.GE: ("{0} >= {1}", CMP, (CMP + 1, CMP + 1)),
    Op.EQ: ("{0} == {1}", CMP, (CMP + 1, CMP + 1)),
    Op.NE: ("{0} != {1}", CMP, (CMP + 1, CMP + 1)),
    Op.EXP: ("tl.exp({0})", CALL, (0,)),
    Op.EXP2: ("exp2({0})", CALL, (0,)),
    Op.LOG: ("tl.log({0})", CALL, (0,)),
    Op.LOG2: ("tl.log2({0})", CALL, (0,)),
    Op.SQRT: ("sqrt({0})", CALL, (0,)),
    Op.RSQRT: ("rsqrt({0})", CALL, (0,)),
    Op.ABS: ("tl.abs({0})", CALL, (0,)),
    Op.SIN: ("sin({0})", CALL, (0,)),
    Op.COS: ("tl.cos({0})", CALL, (0,)),
    Op.SIGMOID: ("tl.sigmoid({0})", CALL, (0,)),
    # NaN-propagating, as torch.relu / maximum / minimum / clamp are (and, as they do on the
    # GPU, relu(-0.0) is +0.0)
    Op.RELU: ("tl.maximum({0}, 0, propagate_nan=tl.PropagateNan.ALL)", CALL, (0,)),
    Op.MAXIMUM: ("tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", CALL, (0, 0)),
    Op.MINIMUM: ("tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", CALL, (0, 0)),
    Op.WHERE: ("tl.where({0}, {1}, {2})", CALL, (0, 0, 0)),
    Op.TANH: ("tanh({0})", CALL, (0,)),
    Op.GELU: ("gelu({0})", CALL, (0,)),
    Op.GELU_TANH: ("gelu_tanh({0})", CALL, (0,)),
    Op.SILU: ("silu({0})", CALL, (0,)),
    Op.SOFTPLUS: ("softplus({0})", CALL, (0,)),
    Op.LEAKY_RELU: ("leaky_relu({0}, {1})", CALL, (0, 0)),
    Op.POW: ("powf({0}, {1})", CALL, (0, 0)),
}

# Helpers each op needs, in the order the module defines them (a helper before its users).
HELPERS = ("exp2", "sqrt", "rsqrt", "sin", "tanh", "gelu", "gelu_tanh", "silu", "softplus", "leaky_relu", "powf",
           "pow_number", "pow_int",
           "max_combine", "min_combine", "check_config", "check_tile_config", "bf16_dot", "vec", "num_sms", "tma_host",
           "launch_rows", "launch_split", "group_host")
_NEEDS = {Op.EXP2: ("exp2",), Op.SQRT: ("sqrt",), Op.RSQRT: ("rsqrt",), Op.SIN: ("sin",),
          Op.TANH: ("tanh",), Op.GELU: ("gelu",), Op.GELU_TANH: ("tanh", "gelu_tanh"),
          Op.SILU: ("silu",), Op.SOFTPLUS: ("softplus",), Op.LEAKY_RELU: ("leaky_relu",),
          Op.POW: ("exp2", "powf")}

# A cast rounds to its target and, for 16-bit floats, computes on in f32.
CASTS = {
    D.F16: ("{0}.to(tl.float16).to(tl.float32)", CALL, (ATOM,)),
    D.BF16: ("{0}.to(tl.bfloat16).to(tl.float32)", CALL, (ATOM,)),
    D.F32: ("{0}.to(tl.float32)", CALL, (ATOM,)),
    D.I32: ("{0}.to(tl.int32)", CALL, (ATOM,)),
    D.BOOL: ("{0} != 0", CMP, (CMP + 1,)),
}

# A weak value (a literal, a scalar argument, or math on them) may be a Python number
# in the kernel, which has no ``.to``: ``tl.cast`` takes numbers and tensors alike.
WEAK_CASTS = {
    D.F16: ("tl.cast({0}, tl.float16).to(tl.float32)", CALL, (0,)),
    D.BF16: ("tl.cast({0}, tl.bfloat16).to(tl.float32)", CALL, (0,)),
    D.F32: ("tl.cast({0}, tl.float32)", CALL, (0,)),
    D.I32: ("tl.cast({0}, tl.int32)", CALL, (0,)),
    # not ``{0} != 0``: on Triton's interpreter a float argument is a Python float, and b != 0 a
    # Python bool, which has no ``.to`` for a cast around it (f32(bool(b)))
    D.BOOL: ("tl.cast({0}, tl.int1)", CALL, (0,)),
}

# An integer (or bool) converted to bf16 goes through f32, as torch converts it; Triton's
# interpreter would read the integer's bits as a bf16's.  (On the GPU the compiler makes the two
# conversions one, rounding once where torch rounds twice: README, "integers past 2**24".)
INT_TO_BF16 = ("{0}.to(tl.float32).to(tl.bfloat16).to(tl.float32)", CALL, (ATOM,))
WEAK_INT_TO_BF16 = ("tl.cast(tl.cast({0}, tl.float32), tl.bfloat16).to(tl.float32)", CALL, (0,))


def store_cast(computed: D.DType, stored: D.DType) -> str:
    """What a value computed in ``computed.compute`` (f32 for 16-bit floats) takes to be stored
    as ``stored``: rounded on store, an integer to bf16 through f32 (``.to(tl.float32).to(...)``)."""
    if computed.compute is stored:
        return ""
    return f"{'.to(tl.float32)' * (stored is D.BF16 and not computed.is_float)}.to({stored.triton})"


# Ops whose Triton functions take floating operands only: an integer operand is
# converted to f32 first, as torch does for exp(int tensor).
FLOAT_OPERANDS = frozenset({Op.EXP, Op.EXP2, Op.LOG, Op.LOG2, Op.SQRT, Op.RSQRT, Op.SIN, Op.COS, Op.TANH,
                            Op.SIGMOID, Op.GELU, Op.GELU_TANH, Op.SILU, Op.SOFTPLUS, Op.POW})

# Small integer powers are products (or their reciprocals): exact, and what torch computes
# for them (x ** 1 is x; powf's exp2(log2) was 5 ulps off).
_SMALL_POWERS = frozenset({1, 2, 3, 4, -1, -2})
# ... and so are roots: torch computes x ** 0.5 as sqrt(x), so (-inf) ** 0.5 is NaN there too.
_ROOT_POWERS = {0.5: Op.SQRT, -0.5: Op.RSQRT}


def _number_power(node: Node) -> bool:
    """x ** p for a Python-number p that is not a literal (a scalar argument, math on one)."""
    if node.op is not Op.POW:
        return False
    exponent = node.inputs[1]
    if exponent.op is Op.CAST and exponent.inputs[0].is_weak:   # rounded to a 16-bit base's dtype
        exponent = exponent.inputs[0]
    return exponent.is_weak and exponent.op is not Op.CONST


def _needs(node: Node) -> tuple[str, ...]:
    """The helpers a node's printed form calls (Printer.expr: roots print as sqrt or rsqrt)."""
    if node.op is Op.POW and node.inputs[1].op is Op.CONST and node.inputs[1].arg in _ROOT_POWERS:
        return _NEEDS[_ROOT_POWERS[node.inputs[1].arg]]
    if _number_power(node):
        return _NEEDS[Op.SQRT] + _NEEDS[Op.RSQRT] + _NEEDS[Op.POW] + ("pow_number",)
    if node.op is Op.POW and node.inputs[1].op is Op.CONST and node.inputs[1].arg in _SMALL_POWERS:
        return () if node.inputs[0].op in LEAVES or abs(node.inputs[1].arg) == 1 else ("pow_int",)
    return _NEEDS.get(node.op, ())


def helpers_for(nodes) -> tuple[str, ...]:
    needed = {h for n in nodes for h in _needs(n)}
    return tuple(h for h in HELPERS if h in needed)


def literal(value: int | float) -> str:
    """A constant re-printed from its parsed value, never from spec text."""
    if isinstance(value, bool):
        return repr(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"not a numeric literal: {value!r}")
    if isinstance(value, float) and not math.isfinite(value):   # a folded 1 / 0
        return f'float("{value!r}")'
    return repr(int(value)) if isinstance(value, int) else repr(float(value))


def config_text(config: dict) -> str:
    """A launch config re-printed as ``dict(BLOCK_M=64, num_warps=4, TMA=True)``: keys are
    the patterns' own identifiers, values numbers and flags."""
    for key, value in config.items():
        if not key.isidentifier() or not isinstance(value, (bool, int)):
            raise TypeError(f"not a launch config entry: {key!r}: {value!r}")
    return f"dict({', '.join(f'{k}={v!r}' for k, v in config.items())})"


def config_check(required: tuple[str, ...], optional: tuple[str, ...], indent: int = 8, tiles: bool = False) -> str:
    """The host line that checks a ``config=`` given by the call (the check_config helper, or
    check_tile_config's for a GEMM's ``tiles``), printed at ``indent``:
    ``config = _check_config(config, ("BLOCK_SIZE", "num_warps"), ())``."""
    def keys(names: tuple[str, ...]) -> str:
        if not all(k.isidentifier() for k in names):
            raise TypeError(f"not config keys: {names!r}")
        quoted = ", ".join('"' + k + '"' for k in names)
        return f"({quoted},)" if len(names) == 1 else f"({quoted})"
    call = f"config = _check{'_tile' if tiles else ''}_config("
    line = f"{call}config, {keys(required)}, {keys(optional)})"
    if indent + len(line) <= 100:
        return line
    return f"{call}config, {keys(required)},\n{' ' * (indent + len(call))}{keys(optional)})"


@dataclass(frozen=True)
class Line:
    """One statement of a kernel body: the spec line as a comment, then its code."""

    comment: str
    code: tuple[str, ...]


class Printer:
    """Prints nodes as Triton expressions; named nodes print as their variable."""

    def __init__(self, names: dict[int, str]):
        self.names = dict(names)

    def expr(self, node: Node) -> tuple[str, int]:
        if id(node) in self.names:
            return self.names[id(node)], ATOM
        if node.op is Op.CONST:
            text = literal(node.arg)
            return text, UNARY if text.startswith("-") else ATOM
        if node.op is Op.CAST:
            fmt, prec, slots = (WEAK_CASTS if node.inputs[0].is_weak else CASTS)[node.arg]
            if node.arg is D.BF16 and not node.inputs[0].dtype.is_float:
                fmt, prec, slots = WEAK_INT_TO_BF16 if node.inputs[0].is_weak else INT_TO_BF16
            if node.inputs[0].dtype.compute is node.arg.compute and node.arg.bits >= 32 \
                    and not node.inputs[0].is_weak:
                return self.expr(node.inputs[0])  # f32(x) of an f32 tensor
            # (a weak operand may be a Python number: i32(3) stays tl.cast(3, tl.int32), a typed value)
        elif node.op is Op.POW and node.inputs[1].op is Op.CONST and node.inputs[1].arg in _ROOT_POWERS:
            return self.expr(Node(_ROOT_POWERS[node.inputs[1].arg], node.dtype, node.shape, node.inputs[:1]))
        elif node.op is Op.POW and node.inputs[1].op is Op.CONST and node.inputs[1].arg in _SMALL_POWERS:
            base, base_prec = self.expr(node.inputs[0])
            if not node.inputs[0].dtype.is_float:   # an integer base squared in f32, not in int32
                base, _ = self._to_f32(node.inputs[0], base, base_prec)
            n = int(node.inputs[1].arg)
            if node.inputs[0].op in LEAVES and abs(n) > 1:   # x * x; a computed base (named or not) once
                base, base_prec = " * ".join([base] * abs(n)), MUL
            elif abs(n) > 1:
                base, base_prec = f"pow_int({base}, {abs(n)})", CALL
            if n > 0:
                return base, base_prec
            # as for b / c: 1.0 / 0.0 of Python floats raises on the interpreter
            if node.inputs[0].is_weak and node.inputs[0].dtype.is_float:
                base, base_prec = WEAK_CASTS[D.F32][0].format(base), CALL
            return f"1.0 / {base if base_prec > MUL else f'({base})'}", MUL
        elif _number_power(node):
            fmt, prec, slots = "pow_number({0}, {1})", CALL, (0, 0)
        elif node.op is Op.CLAMP:
            return self._clamp(node)
        elif node.op in TRITON_OPS:
            fmt, prec, slots = TRITON_OPS[node.op]
        else:
            raise KeyError(f"{node.op.value} has no elementwise form")
        args = []
        for operand, need in zip(node.inputs, slots):
            text, p = self.expr(operand)
            if node.op is Op.POW and operand is node.inputs[0] and operand.is_weak:
                text, p = WEAK_CASTS[D.F32][0].format(text), CALL  # powf reads the base's sign bit
            elif node.op is Op.DIV and operand is node.inputs[0] and node.is_weak:
                # numbers alone (b / c of float arguments) stay Python floats on Triton's interpreter,
                # where b / 0.0 raises ZeroDivisionError: an f32 numerator divides as the GPU does (inf)
                text, p = WEAK_CASTS[D.F32][0].format(text), CALL
            elif node.op in FLOAT_OPERANDS and not operand.dtype.is_float:
                text, p = self._to_f32(operand, text, p)
            args.append(f"({text})" if p < need else text)
        return fmt.format(*args), prec

    @staticmethod
    def _to_f32(operand: Node, text: str, prec: int) -> tuple[str, int]:
        if operand.op is Op.CONST:
            return literal(float(operand.arg)), ATOM
        if operand.is_weak:
            return WEAK_CASTS[D.F32][0].format(text), CALL
        return CASTS[D.F32][0].format(text if prec >= ATOM else f"({text})"), CALL

    def _clamp(self, node: Node) -> tuple[str, int]:
        has_lo, has_hi = node.arg
        operands = iter(node.inputs[1:])
        text, _ = self.expr(node.inputs[0])
        if has_lo:
            text = f"tl.maximum({text}, {self.expr(next(operands))[0]}, propagate_nan=tl.PropagateNan.ALL)"
        if has_hi:
            text = f"tl.minimum({text}, {self.expr(next(operands))[0]}, propagate_nan=tl.PropagateNan.ALL)"
        return text, CALL


def statement_lines(kir: KernelIR, roots, names: dict[int, str]) -> list[Line]:
    """The body's statements that ``roots`` need, as lines of Triton.

    ``names`` maps already-available nodes (loaded inputs, scalars) to variables;
    nodes the pattern computes itself (a reduction, a dot) must already be named.  Each statement
    becomes ``name = expression`` under its spec line as a comment.
    """
    needed = {id(n) for n in live_nodes(roots, names)}
    printer = Printer(names)
    lines = []
    for stmt in kir.stmts:
        if id(stmt.node) not in needed or id(stmt.node) in printer.names:
            # a name for a value already named (y = h): later statements keep reading h, as the spec
            # says (an output y may be stored in another dtype than h holds)
            if id(stmt.node) in needed and printer.names[id(stmt.node)] != stmt.name:
                lines.append(Line(stmt.source, (f"{stmt.name} = {printer.names[id(stmt.node)]}",)))
            continue
        text, _ = printer.expr(stmt.node)
        lines.append(Line(stmt.source, (f"{stmt.name} = {text}",)))
        printer.names[id(stmt.node)] = stmt.name
    names.update(printer.names)
    return lines


def live_nodes(roots, names: dict[int, str]) -> list[Node]:
    """The nodes that computing ``roots`` needs, each after its inputs, stopping at named
    nodes: a named value is at hand, so what it was computed from is not needed again
    (a pattern that names a reduction or a dot must not recompute its operands)."""
    return topo_order(roots, stop=names.keys())
