"""The syntax tree: frozen dataclasses that mirror the grammar's rules.

Every node has a ``span``.  Nothing here knows about types or shapes; that is
``check``'s job.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import Span


@dataclass(frozen=True)
class Number:
    value: int | float
    text: str
    span: Span


@dataclass(frozen=True)
class Name:
    id: str
    span: Span


@dataclass(frozen=True)
class Call:
    func: Name
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[Name, Expr], ...]
    span: Span


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / @ ** < <= > >= == !=
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True)
class Neg:
    operand: Expr
    span: Span


Expr = Number | Name | Call | BinOp | Neg


def walk(expr: Expr):
    """(node, depth) for each node of ``expr``, each before its operands, left to right;
    ``expr`` is at depth 1.  Iterative: a spec's nesting never meets Python's stack."""
    stack = [(expr, 1)]
    while stack:
        e, depth = stack.pop()
        yield e, depth
        if isinstance(e, Call):
            stack.extend((a, depth + 1) for a in reversed([*e.args, *(v for _, v in e.kwargs)]))
        elif isinstance(e, BinOp):
            stack.extend([(e.right, depth + 1), (e.left, depth + 1)])
        elif isinstance(e, Neg):
            stack.append((e.operand, depth + 1))


@dataclass(frozen=True)
class Assign:
    target: Name
    value: Expr
    span: Span


@dataclass(frozen=True)
class TensorType:
    """``f16[M, N]``; ``shape is None`` for a scalar such as ``f32``."""

    dtype: Name
    shape: tuple[Name | Number, ...] | None
    is_list: bool
    span: Span


@dataclass(frozen=True)
class Param:
    name: Name
    type: TensorType | None
    default: Number | None
    span: Span


@dataclass(frozen=True)
class Kernel:
    name: Name
    params: tuple[Param, ...]
    outputs: tuple[Param, ...]
    body: tuple[Assign, ...]
    span: Span
    headerless: bool = False


@dataclass(frozen=True)
class Choice:
    key: Name
    values: tuple[Number | Name, ...]
    is_list: bool
    span: Span


@dataclass(frozen=True)
class Schedule:
    kernel: Name
    choices: tuple[Choice, ...]
    span: Span


@dataclass(frozen=True)
class Module:
    kernels: tuple[Kernel, ...]
    schedules: tuple[Schedule, ...]
    path: str
    text: str
