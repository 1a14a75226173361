"""The typed IR: one frozen node type and the kernel that holds the graph.

A ``Node`` is an operation with its result's dtype and symbolic shape, its input
nodes, one extra argument (a parameter's name, a constant, a reduction's axis, a
cast's target) and the span of the spec text it came from.  Nodes compare by
identity, so a node reached twice is one value computed once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .dtypes import BOOL, F32, I32, DType, promote
from .errors import Span

Dim = int | str          # a size: a literal or a symbol such as "M"
Shape = tuple[Dim, ...]


class Op(Enum):
    INPUT = "input"        # arg: parameter name
    SCALAR = "scalar"      # a runtime scalar parameter; arg: its name
    CONST = "const"        # arg: int | float
    # pointwise, one operand
    NEG = "neg"; ABS = "abs"; EXP = "exp"; EXP2 = "exp2"; LOG = "log"; LOG2 = "log2"
    SQRT = "sqrt"; RSQRT = "rsqrt"; SIN = "sin"; COS = "cos"; TANH = "tanh"
    SIGMOID = "sigmoid"; RELU = "relu"; GELU = "gelu"; GELU_TANH = "gelu_tanh"
    SILU = "silu"; SOFTPLUS = "softplus"
    CAST = "cast"          # arg: target DType
    # pointwise, several operands
    ADD = "add"; SUB = "sub"; MUL = "mul"; DIV = "div"; POW = "pow"
    MAXIMUM = "maximum"; MINIMUM = "minimum"; LEAKY_RELU = "leaky_relu"
    LT = "lt"; LE = "le"; GT = "gt"; GE = "ge"; EQ = "eq"; NE = "ne"
    WHERE = "where"; CLAMP = "clamp"  # clamp: arg = (has_lo, has_hi)
    # reductions; arg: the reduced axis (non-negative), kept with size 1
    SUM = "sum"; MAX = "max"; MIN = "min"; MEAN = "mean"
    MATMUL = "matmul"


LEAVES = frozenset({Op.INPUT, Op.SCALAR, Op.CONST})
REDUCTIONS = frozenset({Op.SUM, Op.MAX, Op.MIN, Op.MEAN})
COMPARISONS = frozenset({Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE})
POINTWISE = frozenset(Op) - LEAVES - REDUCTIONS - {Op.MATMUL}


@dataclass(frozen=True, eq=False)
class Node:
    op: Op
    dtype: DType
    shape: Shape
    inputs: tuple[Node, ...] = ()
    arg: object = None
    span: Span | None = None

    @property
    def is_weak(self) -> bool:
        """A Python-number-like value (literal or scalar parameter, or math on them):
        it takes part in dtype promotion as torch's Python scalars do."""
        if self.op in (Op.CONST, Op.SCALAR):
            return True
        # a cast makes a typed value, as torch.tensor(x, dtype=...) would: a 0-dim tensor
        return self.op not in (Op.INPUT, Op.CAST) and self.shape == () and all(i.is_weak for i in self.inputs)


@dataclass(frozen=True)
class Param:
    name: str
    dtype: DType
    shape: Shape | None      # None for a scalar parameter
    is_list: bool = False
    default: int | float | None = None
    span: Span | None = None

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


@dataclass(frozen=True)
class Stmt:
    """One spec statement: ``name = <source>`` became ``node``."""

    name: str
    node: Node
    source: str
    span: Span


@dataclass(frozen=True)
class KernelIR:
    name: str
    params: tuple[Param, ...]
    stmts: tuple[Stmt, ...]
    outputs: tuple[Stmt, ...]       # statements whose values are returned, in order
    schedule: dict[str, tuple]      # key -> candidates, from the spec's schedule section
    nodes: dict[str, Node]          # parameter name -> its INPUT/SCALAR node
    headerless: bool
    path: str
    text: str
    span: Span | None = None
    # key -> (the entry's span, each value's span), from the schedule section: errors point there
    schedule_spans: dict[str, tuple[Span, tuple[Span, ...]]] = field(default_factory=dict)

    def schedule_span(self, key: str, value: object = None) -> Span | None:
        """Where the schedule sets ``key``: at ``value`` (its first occurrence) when given and
        listed, else the whole entry; the kernel's header for a key the schedule does not set."""
        if key not in self.schedule_spans:
            return self.span
        entry, values = self.schedule_spans[key]
        given = self.schedule.get(key, ())
        return values[given.index(value)] if value is not None and value in given else entry


def result_type(*nodes: Node) -> DType:
    """torch's promotion: tensors with dims beat 0-dim tensors, which beat Python numbers;
    a weaker class decides only when its category (bool < integer < float) is higher."""
    classes: dict[int, list[DType]] = {2: [], 1: [], 0: []}
    for n in nodes:
        classes[0 if n.is_weak else 1 if n.shape == () else 2].append(n.dtype)
    result = None
    for cls in (2, 1, 0):
        if not classes[cls]:
            continue
        dtype = classes[cls][0]
        for other in classes[cls][1:]:
            dtype = promote(dtype, other)
        if cls == 0:   # Python numbers take torch's default dtype of their category
            dtype = {0: BOOL, 1: I32, 2: F32}[dtype.category]
        if result is None or dtype.category > result.category:
            result = dtype
    return result


def type_str(dtype: DType, shape: Shape | None) -> str:
    """``f16[M, N]`` (or ``f32`` for a scalar)."""
    if shape is None:
        return dtype.name
    return f"{dtype.name}[{', '.join(str(d) for d in shape)}]"


def topo_order(roots, stop=frozenset()) -> list[Node]:
    """Nodes reachable from ``roots``, each after its inputs (iterative, no recursion limit);
    the inputs of a node whose id is in ``stop`` are not followed."""
    order, seen, stack = [], set(), [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if id(node) not in stop:
            stack.extend((i, False) for i in reversed(node.inputs) if id(i) not in seen)
    return order


# Generated code nests about as deep as the math it prints, a cast (``x.to(tl.float16).to(
# tl.float32)``) four levels of Python's syntax tree, a clamp with both bounds two brackets:
# Triton's code generator and interpreter walk that tree recursively, and Python's parser takes
# at most 200 nested brackets.  So a statement whose code would nest past PART_DEPTH levels (by
# these costs, every other operation 3) is printed in parts, each a value of its own.
PART_DEPTH = 48
_PART_COST = {Op.CAST: 6, Op.CLAMP: 4}


def in_parts(stmt: Stmt, named: set[int], taken: int) -> list[Stmt]:
    """Statements that name the parts of ``stmt``'s math nested past PART_DEPTH levels, inner
    ones first (``_part1``, ``_part2``, ... from ``taken + 1``: a name no spec may take), for
    ``stmt`` to follow; ``named``: the ids of nodes that earlier statements and parameters name."""
    height: dict[int, int] = {}
    parts = []
    for node in topo_order([stmt.node], stop=named):
        if id(node) in named or node.op in LEAVES:
            height[id(node)] = 0
            continue
        height[id(node)] = _PART_COST.get(node.op, 3) + max(height[id(i)] for i in node.inputs)
        if height[id(node)] > PART_DEPTH and node is not stmt.node and node.op in POINTWISE:
            parts.append(Stmt(f"_part{taken + len(parts) + 1}", node,
                              f"(a part of {stmt.name}, below: its code would nest past {PART_DEPTH} levels)",
                              stmt.span))
            height[id(node)] = 0
    return parts


def is_part(stmt: Stmt) -> bool:
    """Whether ``stmt`` names a part of a spec statement (``in_parts``), not a spec statement."""
    return stmt.name.startswith("_part")


def format_ir(kir: KernelIR) -> str:
    """A readable dump for ``kgen show --emit ir``."""
    params = ", ".join(f"{p.name}: {'[' if p.is_list else ''}{type_str(p.dtype, p.shape)}"
                       f"{']' if p.is_list else ''}" for p in kir.params)
    grouped = any(p.is_list for p in kir.params)   # a list kernel's outputs are lists too
    outs = ", ".join(f"{o.name}: {'[' * grouped}{type_str(o.node.dtype, o.node.shape)}{']' * grouped}"
                     for o in kir.outputs)
    lines = [f"kernel {kir.name}({params}) -> {outs}"]
    ids: dict[int, str] = {}
    for node in topo_order(o.node for o in kir.outputs):
        ids[id(node)] = f"%{len(ids)}"
        operands = " ".join(ids[id(i)] for i in node.inputs)
        arg = "" if node.arg is None else f" {node.arg}"
        lines.append(f"  {ids[id(node)]} = {node.op.value}{arg} {operands}".rstrip()
                     + f" : {type_str(node.dtype, node.shape)}")
    for o in kir.outputs:
        lines.append(f"  return {o.name} = {ids[id(o.node)]}")
    return "\n".join(lines)
