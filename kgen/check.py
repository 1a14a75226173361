"""Syntax tree → typed IR: names, dtypes, symbolic shapes, broadcasting, arity.

Declared kernels are checked once.  A headerless kernel takes its types from the
call: ``check`` receives one ``Arg`` per input (dtype, and which axes have size 1)
and every other axis gets a symbol; symbols that must agree (broadcast partners,
a matmul's inner dimension) are unified and renamed before the final pass.
"""
from __future__ import annotations

import builtins
import keyword
import math
import re
from dataclasses import dataclass

import torch

from . import dtypes as D
from . import syntax as S
from .dtypes import DType
from .errors import SpecError, Span, did_you_mean
from .lower import HELPERS
from .reference import evaluate_node
from .ir import (COMPARISONS, POINTWISE, REDUCTIONS, Dim, KernelIR, Node, Op, Param, Shape, Stmt, in_parts, is_part,
                 result_type, topo_order, type_str)


@dataclass(frozen=True)
class Arg:
    """What a call tells a headerless kernel about one input."""

    dtype: DType
    ones: tuple[bool, ...] | None   # per axis: is its size 1; None for a Python number
    is_list: bool = False


# Names that a spec may not use: generated code is Python, and its own names
# (modules, the launch machinery) must never be shadowed by a spec's.
RESERVED = (frozenset(keyword.kwlist) | frozenset(getattr(keyword, "softkwlist", ()))
            | frozenset(dir(builtins))
            | {"tl", "triton", "torch", "math", "os", "sys", "pid", "offs", "mask", "grid", "out", "n_elements",
               "kernel", "meta", "self", "cls", "inf", "nan", "config",
               # the host function's locals and the module's own names
               "device", "contiguous", "int64", "num_warps", "num_stages", "ArgumentError",
               "NotCurrentDevice",
               "n_rows", "n_cols",
               # Triton's launcher binds a kernel's arguments in a function of its own, beside
               # these names: a kernel parameter may not take them
               "options", "params", "specialization", "backend", "specialize_impl", "JITCallable"})
# Generated code derives names from a spec's (X_ptr, X_stride0) and has its own
# constexprs (BLOCK_SIZE) and locals (idx0, size1): a spec's names stay clear of both.
_RESERVED_PATTERN = re.compile(r"_|.*_(ptr|offs|stride\d*|size\d*|mask|kernel)$|(BLOCK|NUM|GROUP|USE|INT64)(_|$)"
                               r"|(idx|size|stride|rem|acc|row|col)\d*$")


@dataclass(frozen=True)
class Fn:
    op: Op
    params: tuple[str, ...]
    defaults: tuple[tuple[str, object], ...] = ()
    result: str = "same"       # same | float | promote | bool | cast


_UNARY_FLOAT = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
                "gelu", "gelu_tanh", "silu", "softplus"]
FUNCTIONS: dict[str, Fn] = {
    **{n: Fn(Op[n.upper()], ("x",), result="float") for n in _UNARY_FLOAT},
    "abs": Fn(Op.ABS, ("x",)),
    "relu": Fn(Op.RELU, ("x",)),
    "leaky_relu": Fn(Op.LEAKY_RELU, ("x", "alpha"), (("alpha", 0.01),), result="promote"),
    "maximum": Fn(Op.MAXIMUM, ("a", "b"), result="promote"),
    "minimum": Fn(Op.MINIMUM, ("a", "b"), result="promote"),
    "where": Fn(Op.WHERE, ("cond", "a", "b"), result="promote"),
    "clamp": Fn(Op.CLAMP, ("x", "lo", "hi"), (("lo", None), ("hi", None)), result="promote"),
    "sum": Fn(Op.SUM, ("x", "axis"), (("axis", -1),)),
    "max": Fn(Op.MAX, ("x", "axis"), (("axis", -1),)),
    "min": Fn(Op.MIN, ("x", "axis"), (("axis", -1),)),
    "mean": Fn(Op.MEAN, ("x", "axis"), (("axis", -1),), result="float"),
    **{d: Fn(Op.CAST, ("x",), result="cast") for d in D.BY_NAME},
}
# max and min reduce; what a second tensor argument suggests was meant
_ELEMENTWISE_HINT = {Op.MAX: " (for the elementwise maximum use maximum(a, b))",
                     Op.MIN: " (for the elementwise minimum use minimum(a, b))"}

BINARY_OPS = {"+": Op.ADD, "-": Op.SUB, "*": Op.MUL, "/": Op.DIV, "**": Op.POW, "@": Op.MATMUL,
              "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE, "==": Op.EQ, "!=": Op.NE}


def check(module: S.Module, args: dict[str, tuple[Arg, ...]] | None = None) -> tuple[KernelIR, ...]:
    """Check every kernel of ``module``; ``args`` gives headerless kernels their inputs' types."""
    _check_schedules(module)
    seen: dict[str, S.Kernel] = {}
    kernels = []
    for k in module.kernels:
        if k.name.id in seen:
            raise SpecError(f"kernel '{k.name.id}' is defined twice", k.name.span)
        seen[k.name.id] = k
        schedule = _schedule_for(module, k.name.id)
        if k.headerless:
            kernels.append(_check_headerless(k, module, (args or {}).get(k.name.id, ()), schedule))
        else:
            kernels.append(_Checker(module, strict=True).kernel(k, schedule))
    return tuple(kernels)


def check_headerless_names(kernel: S.Kernel) -> None:
    """A headerless kernel's names, checked when it is compiled as each of its specializations
    will check them: a reserved name is an error before any call."""
    inputs, _ = headerless_inputs(kernel)
    for name in inputs:
        check_name(S.Name(name, _first_use(kernel, name) or kernel.span), "parameter")
    for stmt in kernel.body:
        check_name(stmt.target, "value")
        for e, _ in S.walk(stmt.value):   # what needs no types: each call's function and arguments
            if isinstance(e, S.Call):
                _Checker.bind(_function(e), e)


def _function(e: S.Call) -> Fn:
    fn = FUNCTIONS.get(e.func.id)
    if fn is None:
        raise SpecError(f"unknown function '{e.func.id}'{did_you_mean(e.func.id, FUNCTIONS)}", e.func.span)
    return fn


def headerless_inputs(kernel: S.Kernel) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(inputs, outputs) of a headerless kernel: names read before they are assigned,
    in order of first appearance; assigned names that no later statement reads."""
    inputs: list[str] = []
    assigned: list[str] = []
    read_after: set[str] = set()
    for stmt in kernel.body:
        for name in _names_read(stmt.value):
            if name not in assigned and name not in inputs:
                inputs.append(name)
            read_after.add(name)
        if stmt.target.id in assigned:
            raise SpecError(f"'{stmt.target.id}' is assigned twice; give each value its own name",
                            stmt.target.span)
        if stmt.target.id in inputs:   # an input, as it was read before this statement
            raise SpecError(f"'{stmt.target.id}' is read before it is assigned, so it is an input; "
                            f"an input cannot be assigned: give the value its own name", stmt.target.span)
        read_after.discard(stmt.target.id)
        assigned.append(stmt.target.id)
    used_later = set()
    outputs = []
    for stmt in reversed(kernel.body):
        if stmt.target.id not in used_later:
            outputs.append(stmt.target.id)
        used_later |= set(_names_read(stmt.value))
    return tuple(inputs), tuple(reversed(outputs))


def matmul_lhs_inputs(kernel: S.Kernel) -> tuple[str, ...]:
    """The inputs that the left operand of a headerless kernel's first '@' reads, directly
    or through the statements it names, in order of appearance (the MoE form's rows)."""
    values = {stmt.target.id: stmt.value for stmt in kernel.body}
    mm = next((e for stmt in kernel.body for e, _ in S.walk(stmt.value) if isinstance(e, S.BinOp) and e.op == "@"),
              None)
    found, pending = [], _names_read(mm.left) if mm else []
    while pending:
        name = pending.pop(0)
        if name in values:
            pending = _names_read(values.pop(name)) + pending
        elif name not in found:
            found.append(name)
    return tuple(found)


def _names_read(expr: S.Expr) -> list[str]:
    return [e.id for e, _ in S.walk(expr) if isinstance(e, S.Name)]


def _check_headerless(k: S.Kernel, module: S.Module, args: tuple[Arg, ...], schedule) -> KernelIR:
    if not k.body:
        raise SpecError("the spec has no statements", k.span)
    inputs, outputs = headerless_inputs(k)
    if not args and inputs:   # kgen build / show: no call to take the types from
        raise SpecError(f"statements without a kernel header take their types from a call "
                        f"(kgen.compile); to build or show them, declare the inputs: "
                        f"kernel NAME({', '.join(f'{n}: f32[N]' for n in inputs)}) -> ... {{ ... }}", k.span)
    if len(args) != len(inputs):
        raise SpecError(f"expected {len(inputs)} inputs ({', '.join(inputs)}), got {len(args)}", k.span)
    # Pass 1: a fresh symbol per axis that is not 1; collect which symbols must agree.
    first = _Checker(module, strict=False)
    params = []
    for i, (name, a) in enumerate(zip(inputs, args)):
        shape = None if a.ones is None else tuple(1 if one else f"_{i}_{ax}" for ax, one in enumerate(a.ones))
        params.append((name, a.dtype, shape, a.is_list))
    try:
        kir = first.kernel(_headerless_kernel(k, params, outputs), schedule)
        _same_rows(first, kir)
        _same_outputs(first, kir)
    except SpecError as e:  # name the dims as pass 2 would: f16[M, N], never f16[_0_0, _0_1]
        rename = first.canonical_names(set(inputs) | {a.target.id for a in k.body})
        raise type(e)(re.sub(r"\b_\d+_\d+\b", lambda m: rename.get(m.group(0), m.group(0)), e.message),
                      e.span) from None
    # Pass 2: each class of unified symbols gets one readable name; no unification left.
    rename = first.canonical_names(set(inputs) | {a.target.id for a in k.body})
    params = [(n, dt, None if sh is None else tuple(rename.get(d, d) for d in sh), lst)
              for n, dt, sh, lst in params]
    return _Checker(module, strict=True).kernel(_headerless_kernel(k, params, outputs), schedule)


def _same_rows(checker: _Checker, kir: KernelIR) -> None:
    """Headerless row reductions: every value's axes, aligned from the right as torch
    broadcasts them, take the reduced rows' (``z - mean(x)``: z's rows are x's; ``sum(w)``
    beside ``max(x)``: w is as long as x's rows), as the row-reduction kernel computes one
    row space; the call then checks the sizes."""
    nodes = topo_order(o.node for o in kir.outputs)
    for r in nodes:
        if r.op in REDUCTIONS and r.arg == len(r.inputs[0].shape) - 1:
            rows = r.inputs[0].shape
            for n in nodes:
                for mine, theirs in zip(reversed(n.shape), reversed(rows)):
                    if isinstance(mine, str) and isinstance(theirs, str):
                        checker._unify(theirs, mine)


def _same_outputs(checker: _Checker, kir: KernelIR) -> None:
    """Headerless outputs share their axes, aligned from the right (``y = x * 2; z = w + 1``:
    w is as large as x), as one launch computes them over one index space; the call then
    checks the sizes.  Declared kernels say so themselves."""
    shapes = [o.node.shape for o in kir.outputs]
    for shape in shapes[1:]:
        for mine, theirs in zip(reversed(shape), reversed(shapes[0])):
            if isinstance(mine, str) and isinstance(theirs, str):
                checker._unify(theirs, mine)


def _headerless_kernel(k: S.Kernel, params, outputs) -> S.Kernel:
    """A headerless kernel as a declared one, named after its outputs."""
    span = k.span
    sparams = []
    for name, dt, shape, is_list in params:
        dims = None if shape is None else tuple(S.Number(d, str(d), span) if isinstance(d, int)
                                                else S.Name(d, span) for d in shape)
        span_of = _first_use(k, name) or span
        sparams.append(S.Param(S.Name(name, span_of), S.TensorType(S.Name(dt.name, span), dims, is_list, span),
                               None, span_of))
    souts = tuple(S.Param(S.Name(o, span), None, None, span) for o in outputs)
    return S.Kernel(S.Name(headerless_name(outputs), span), tuple(sparams), souts, k.body, span, headerless=True)


def headerless_name(outputs: tuple[str, ...]) -> str:
    """A headerless kernel's name: its outputs' (``y``, ``y_z``), ``kernel_`` before a reserved one."""
    base = "_".join(outputs).lower() if len(outputs) <= 3 else "kernel_" + outputs[0].lower()
    # TL = ..., Kernel = ..., X_PTR = ...: not names the module may define
    return next(n for n in (base, f"kernel_{base}", f"kernel_{base}_fn") if not is_reserved(n))


def _first_use(k: S.Kernel, name: str) -> Span | None:
    return next((e.span for s in k.body for e, _ in S.walk(s.value) if isinstance(e, S.Name) and e.id == name), None)


def _check_schedules(module: S.Module) -> None:
    names = {k.name.id for k in module.kernels}
    seen = set()
    for s in module.schedules:
        if s.kernel.id not in names:
            raise SpecError(f"schedule for unknown kernel '{s.kernel.id}'{did_you_mean(s.kernel.id, names)}",
                            s.kernel.span)
        if s.kernel.id in seen:
            raise SpecError(f"kernel '{s.kernel.id}' has two schedule sections", s.kernel.span)
        seen.add(s.kernel.id)
        keys = set()
        for c in s.choices:
            if c.key.id in keys:
                raise SpecError(f"'{c.key.id}' is set twice in this schedule", c.key.span)
            keys.add(c.key.id)
            listed = set()
            for v in c.values:   # a candidate listed twice would be tuned twice
                value, shown = (repr(v.value), v.text) if isinstance(v, S.Number) else (v.id, v.id)
                if value in listed:
                    raise SpecError(f"{shown[:24]} is listed twice for '{c.key.id}'", v.span)
                listed.add(value)


# Launch options within Triton's limits, checked here where each value's span is known;
# each pattern checks the rest of its schedule (which keys, powers of two, tl.dot's tiles).
SCHEDULE_LIMITS = {"num_warps": (1, 32), "num_stages": (1, 16), "BLOCK": (1, 2**20)}  # BLOCK*: Triton's largest tensor


def _schedule_for(module: S.Module, name: str) -> tuple[dict[str, tuple], dict[str, tuple[Span, tuple[Span, ...]]]]:
    """(key -> candidates, key -> (the entry's span, each value's span)) of ``name``'s schedule."""
    for s in module.schedules:
        if s.kernel.id == name:
            for c in s.choices:
                limits = SCHEDULE_LIMITS.get("BLOCK" if c.key.id.startswith("BLOCK") else c.key.id)
                for v in c.values if limits else ():
                    if not isinstance(v, S.Number) or not isinstance(v.value, int) \
                            or not limits[0] <= v.value <= limits[1]:
                        shown = v.text if isinstance(v, S.Number) else v.id
                        raise SpecError(f"{c.key.id} takes integers from {limits[0]} to {limits[1]}, got {shown[:24]}",
                                        v.span)
            return ({c.key.id: tuple(v.value if isinstance(v, S.Number) else v.id for v in c.values)
                     for c in s.choices}, {c.key.id: (c.span, tuple(v.span for v in c.values)) for c in s.choices})
    return {}, {}


def is_reserved(name: str) -> bool:
    return name in RESERVED or name in FUNCTIONS or name in HELPERS or bool(_RESERVED_PATTERN.match(name))


def check_name(name: S.Name, what: str) -> None:
    """Reject names that would shadow Python or the generated code's own names."""
    if name.id in ("nan", "inf"):   # read as numbers, which the language writes otherwise
        raise SpecError(f"'{name.id}' is no number in kgen's language (0.0 / 0.0 is NaN, 1 / 0 is inf) "
                        f"and cannot name a {what}", name.span)
    if is_reserved(name.id):
        raise SpecError(f"'{name.id}' cannot name a {what}: it is reserved in the generated Python; "
                        f"choose another name", name.span)


class _Checker:
    def __init__(self, module: S.Module, strict: bool):
        self.module = module
        self.strict = strict
        self.parent: dict[str, str] = {}     # union-find over symbols (strict=False only)
        self.order: list[str] = []
        self.hints: dict[str, str] = {}     # symbol -> the name its role suggests (M, K, N)
        self.targets: frozenset[str] = frozenset()   # the kernel body's assigned names

    # --- symbols ------------------------------------------------------------
    def _find(self, d: str) -> str:
        while self.parent.get(d, d) != d:
            d = self.parent[d]
        return d

    def _unify(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def canonical_names(self, taken: set[str]) -> dict[str, str]:
        """Symbol → readable name; one name per class of unified symbols."""
        names: dict[str, str] = {}
        rename = {}
        used = set(taken)
        hinted: dict[str, str] = {}
        for sym, hint in self.hints.items():
            hinted.setdefault(self._find(sym), hint)
        for sym in self.order:     # a matmul's dims first, as GEMMs read: [M, K] @ [K, N]
            root = self._find(sym)
            if root not in names and hinted.get(root, "") not in used | {""}:
                names[root] = hinted[root]
                used.add(names[root])
        pool = iter(n for n in ["M", "N", "K", "L", "P", "Q", "R", "S", "T", "U", "V", "W"] +
                    [f"D{i}" for i in range(100)] if n not in used)
        for sym in self.order:
            root = self._find(sym)
            if root not in names:
                names[root] = next(pool)
            rename[sym] = names[root]
        return rename

    def _note(self, shape: Shape) -> None:
        for d in shape:
            if isinstance(d, str) and d not in self.order:
                self.order.append(d)

    # --- kernel ---------------------------------------------------------------
    def kernel(self, k: S.Kernel, schedule: tuple[dict[str, tuple], dict]) -> KernelIR:
        """``schedule``: ``_schedule_for``'s candidates and spans."""
        check_name(k.name, "kernel")
        env: dict[str, Node] = {}
        params = []
        for p in k.params:
            check_name(p.name, "parameter")
            if p.name.id in env:
                raise SpecError(f"parameter '{p.name.id}' is declared twice", p.name.span)
            param = self._param(p)
            defaulted = next((q for q in params if q.default is not None), None)
            if param.default is None and defaulted is not None:   # as in Python: callers name or skip those last
                raise SpecError(f"parameter '{param.name}' has no default but follows '{defaulted.name}', which has "
                                f"one; put the parameters with defaults last", p.name.span)
            params.append(param)
            op = Op.SCALAR if param.is_scalar else Op.INPUT
            env[p.name.id] = Node(op, param.dtype, () if param.is_scalar else param.shape, (), p.name.id, p.span)
            if not param.is_scalar:
                self._note(param.shape)
        nodes = dict(env)
        dims = {d for p in params if p.shape for d in p.shape if isinstance(d, str)}
        for name in [*(p.name for p in k.params), *(a.target for a in k.body), *(o.name for o in k.outputs)]:
            if name.id in dims:
                raise SpecError(f"'{name.id}' names both a dimension and a value; rename one", name.span)
        stmts = []
        self.targets = frozenset(a.target.id for a in k.body)
        for a in k.body:
            check_name(a.target, "value")
            if a.target.id in env:
                what = "a parameter" if a.target.id in nodes else "already assigned"
                raise SpecError(f"'{a.target.id}' is {what}; give each value its own name", a.target.span)
            node = self.expr(a.value, env)
            env[a.target.id] = node
            stmt = Stmt(a.target.id, node, _source(self.module.text, a.span), a.span)
            parts = in_parts(stmt, {id(n) for n in env.values()} - {id(node)}, sum(map(is_part, stmts)))
            stmts += [*parts, stmt]
        by_name = {s.name: s for s in stmts}
        outputs = []
        for o in k.outputs:
            check_name(o.name, "output")
            if o.name.id not in by_name:
                raise SpecError(f"output '{o.name.id}' is never assigned", o.name.span)
            stmt = by_name[o.name.id]
            if o.type is not None:
                stmt = self._declared_output(o, stmt, any(p.is_list for p in params))
            outputs.append(stmt)
        if not outputs:
            raise SpecError("the kernel has no outputs", k.span)
        if len({o.name for o in outputs}) != len(outputs):
            raise SpecError("an output is listed twice", k.span)
        return KernelIR(k.name.id, tuple(params), tuple(stmts), tuple(outputs), schedule[0], nodes,
                        k.headerless, self.module.path, self.module.text, k.span, schedule[1])

    def _param(self, p: S.Param) -> Param:
        t = p.type
        dtype = _dtype(t.dtype)
        shape = None
        if t.shape is not None:
            dims = []
            for d in t.shape:
                if isinstance(d, S.Number):
                    dims.append(_literal_dim(d))
                else:
                    if self.strict:
                        check_name(d, "dimension")
                    dims.append(d.id)
            shape = tuple(dims)
            if len(shape) > 4:
                raise SpecError(f"tensors of rank {len(shape)} are not supported (at most 4)", t.span)
        elif t.is_list:
            raise SpecError("a list type needs a shape, such as [f16[M, K]]", t.span)
        if shape is None and dtype.is_float and dtype.bits < 32:
            raise SpecError(f"a scalar parameter is f32, i32 or bool, not {dtype.name}: scalars take part in "
                            f"math as Python numbers do (f16 tensors times a scalar give f16, computed in f32); "
                            f"declare it f32", t.span)
        default = None
        if p.default is not None:
            if shape is not None:
                raise SpecError("only scalar parameters can have a default", p.default.span)
            default = p.default.value
            if dtype.category < 2 and isinstance(default, float) or dtype.category == 0 and default not in (0, 1):
                raise SpecError(f"default {p.default.text} is not a valid {dtype.name}"
                                + (" (0 or 1)" if dtype.category == 0 else ""), p.default.span)
            if dtype.category == 0:
                default = bool(default)
        return Param(p.name.id, dtype, shape, t.is_list, default, p.span)

    def _declared_output(self, o: S.Param, stmt: Stmt, grouped: bool) -> Stmt:
        """``grouped``: the kernel has list parameters, so each output is a list, one per problem."""
        t = o.type
        dtype = _dtype(t.dtype)
        node = stmt.node
        if t.is_list != grouped:
            why = "a list, but the kernel has no list parameters" if t.is_list else \
                (f"one tensor, but the kernel computes one per problem of its list parameters: declare it "
                 f"[{type_str(dtype, node.shape)}]")
            raise SpecError(f"output '{o.name.id}' is declared {why}", t.span)
        if t.shape is not None:
            shape = tuple(_literal_dim(d) if isinstance(d, S.Number) else d.id for d in t.shape)
            if shape != node.shape:
                declared, computed = type_str(dtype, shape), type_str(node.dtype, node.shape)
                if grouped:
                    declared, computed = f"[{declared}]", f"[{computed}]"
                raise SpecError(f"output '{o.name.id}' is declared {declared} but the body "
                                f"computes {computed}", t.span)
        if dtype is D.I32 and node.op is Op.CONST and not _fits_i32(node.arg):
            raise SpecError(f"output '{o.name.id}' is declared i32, which cannot hold {node.arg!r}", t.span)
        if dtype is not node.dtype:
            node = _folded(Node(Op.CAST, dtype, node.shape, (node,), dtype, node.span))
        return Stmt(stmt.name, node, stmt.source, stmt.span)

    # --- expressions ----------------------------------------------------------
    def expr(self, e: S.Expr, env: dict[str, Node]) -> Node:
        if isinstance(e, S.Number):
            dtype = D.I32 if isinstance(e.value, int) else D.F32
            return Node(Op.CONST, dtype, (), (), e.value, e.span)
        if isinstance(e, S.Name):
            if e.id not in env:
                check_name(e, "value")   # nan and inf: the language writes them otherwise
                if e.id in self.targets:
                    raise SpecError(f"'{e.id}' is read before it is assigned; assign it first", e.span)
                raise SpecError(f"unknown name '{e.id}'{did_you_mean(e.id, env)}", e.span)
            return env[e.id]
        if isinstance(e, S.Neg):
            x = self.expr(e.operand, env)
            self._no_bool(x, "-", e.span)
            return _folded(Node(Op.NEG, x.dtype, x.shape, (x,), None, e.span))
        if isinstance(e, S.BinOp):
            return _folded(self.binary(e, self.expr(e.left, env), self.expr(e.right, env)))
        return _folded(self.call(e, env))

    def binary(self, e: S.BinOp, a: Node, b: Node) -> Node:
        op = BINARY_OPS[e.op]
        if op is Op.MATMUL:
            return self.matmul(e, a, b)
        shape = self.broadcast(a, b, e.span)
        if op in COMPARISONS:
            common = result_type(a, b)
            a, b = _promoted(a, common, every=True), _promoted(b, common, every=True)
            return Node(op, D.BOOL, shape, (a, b), None, e.span)
        self._no_bool(a, e.op, e.left.span)
        self._no_bool(b, e.op, e.right.span)
        dtype = result_type(a, b)
        a, b = _promoted(a, dtype, every=op is Op.POW), _promoted(b, dtype, every=op is Op.POW)
        if op is Op.DIV and not dtype.is_float:
            dtype = D.F32
        if op is Op.POW and not dtype.is_float:
            if a.op is Op.CONST and b.op is Op.CONST:   # numbers alone (x * 2 ** 3): Python's value
                return _integer_power(a.arg, b.arg, e.span)
            raise SpecError("integer powers are not supported; cast the base with f32(...)", e.span)
        return Node(op, dtype, shape, (a, b), None, e.span)

    def matmul(self, e: S.BinOp, a: Node, b: Node) -> Node:
        for x, side in ((a, e.left), (b, e.right)):
            if len(x.shape) not in (2, 3):
                raise SpecError(f"'@' needs 2-D or 3-D operands, got {type_str(x.dtype, x.shape)}", side.span)
            if not x.dtype.is_float:
                raise SpecError(f"'@' needs floating-point operands, got {type_str(x.dtype, x.shape)}", side.span)
        k_a, k_b = a.shape[-1], b.shape[-2]
        if not self._same_dim(k_a, k_b):
            raise SpecError(f"inner dimensions differ: {type_str(a.dtype, a.shape)} @ {type_str(b.dtype, b.shape)} "
                            f"({k_a} vs {k_b})", e.span)
        for d, hint in ((a.shape[-2], "M"), (k_a, "K"), (b.shape[-1], "N")):
            if isinstance(d, str) and not self.strict:    # a headerless call's dims, in messages too
                self.hints.setdefault(d, hint)
        if a.dtype is not b.dtype:
            raise SpecError(f"'@' needs operands of one dtype, got {type_str(a.dtype, a.shape)} and "
                            f"{type_str(b.dtype, b.shape)}; cast one of them", e.span)
        batch = self._broadcast_shapes(a.shape[:-2], b.shape[:-2], a, b, e.span)
        return Node(Op.MATMUL, a.dtype, batch + (a.shape[-2], b.shape[-1]), (a, b), None, e.span)

    def call(self, e: S.Call, env: dict[str, Node]) -> Node:
        name = e.func.id
        fn = _function(e)
        bound = self.bind(fn, e)
        if fn.op in (Op.SUM, Op.MAX, Op.MIN, Op.MEAN):
            return self.reduction(fn, e, bound, env)
        operands = []
        for pname in fn.params:
            v = bound[pname]
            if v is None:
                continue
            operands.append(self.expr(v, env) if not isinstance(v, (int, float))
                            else Node(Op.CONST, D.I32 if isinstance(v, int) else D.F32, (), (), v, e.span))
        shape = operands[0].shape
        for other in operands[1:]:
            shape = self._broadcast_shapes(shape, other.shape, operands[0], other, e.span)
        x = operands[0]
        arg = None
        if fn.result == "cast":
            dtype = D.BY_NAME[name]
            arg = dtype
        elif fn.result == "float":
            self._no_bool(x, name, e.span)
            dtype = x.dtype if x.dtype.is_float else D.F32
        elif fn.result == "same":
            self._no_bool(x, name, e.span)
            dtype = x.dtype
        else:  # promote over the value operands
            values = operands[1:] if fn.op is Op.WHERE else operands
            if fn.op is Op.WHERE and operands[0].dtype is not D.BOOL:
                raise SpecError(f"where's condition must be bool (a comparison), got {operands[0].dtype}",
                                bound["cond"].span)
            for v in values:
                self._no_bool(v, name, e.span)
            dtype = result_type(*values)
            operands[-len(values):] = [_promoted(v, dtype) for v in values]
        if fn.op is Op.CLAMP:
            if bound["lo"] is None and bound["hi"] is None:
                raise SpecError("clamp needs lo, hi or both", e.span)
            arg = (bound["lo"] is not None, bound["hi"] is not None)
        return Node(fn.op, dtype, shape, tuple(operands), arg, e.span)

    def reduction(self, fn: Fn, e: S.Call, bound: dict, env) -> Node:
        x = self.expr(bound["x"], env)
        axis_expr = bound["axis"]
        if isinstance(axis_expr, int):
            axis, span = axis_expr, e.span
        elif isinstance(axis_expr, S.Number) and isinstance(axis_expr.value, int):
            axis, span = axis_expr.value, axis_expr.span
        else:
            hint = _ELEMENTWISE_HINT.get(fn.op, "") if len(e.args) > 1 else ""   # max(x, w): maximum?
            raise SpecError(f"axis must be an integer literal{hint}", getattr(axis_expr, "span", e.span))
        rank = len(x.shape)
        if rank == 0:
            raise SpecError(f"{e.func.id} needs a tensor with at least one axis, got {type_str(x.dtype, x.shape)}",
                            bound["x"].span)
        if not -rank <= axis < rank:
            raise SpecError(f"axis {axis} is out of range for {type_str(x.dtype, x.shape)} (rank {rank})", span)
        axis %= rank
        if x.dtype is D.BOOL or (fn.op in (Op.SUM, Op.MEAN) and not x.dtype.is_float):
            raise SpecError(f"{e.func.id} of {x.dtype} is not supported; cast with f32(...) first", e.span)
        dtype = x.dtype
        shape = x.shape[:axis] + (1,) + x.shape[axis + 1:]
        return Node(fn.op, dtype, shape, (x,), axis, e.span)

    @staticmethod
    def bind(fn: Fn, e: S.Call) -> dict:
        name = e.func.id
        if len(e.args) > len(fn.params):
            hint = _ELEMENTWISE_HINT.get(fn.op, "")
            raise SpecError(f"{name} takes at most {len(fn.params)} arguments "
                            f"({', '.join(fn.params)}), got {len(e.args)}{hint}", e.span)
        bound = dict(zip(fn.params, e.args))
        for key, value in e.kwargs:
            if key.id not in fn.params:
                raise SpecError(f"{name} has no argument '{key.id}'{did_you_mean(key.id, fn.params)}", key.span)
            if key.id in bound:
                raise SpecError(f"{name} got '{key.id}' twice", key.span)
            bound[key.id] = value
        defaults = dict(fn.defaults)
        for p in fn.params:
            if p not in bound:
                if p not in defaults:
                    raise SpecError(f"{name} needs '{p}' ({', '.join(fn.params)})", e.span)
                bound[p] = defaults[p]
        return bound

    # --- shapes -----------------------------------------------------------------
    def _same_dim(self, a: Dim, b: Dim) -> bool:
        if a == b:
            return True
        if not self.strict and isinstance(a, str) and isinstance(b, str):
            self._unify(a, b)
            return True
        return False

    def broadcast(self, a: Node, b: Node, span: Span) -> Shape:
        return self._broadcast_shapes(a.shape, b.shape, a, b, span)

    def _broadcast_shapes(self, sa: Shape, sb: Shape, a: Node, b: Node, span: Span) -> Shape:
        out = []
        n = max(len(sa), len(sb))
        pa, pb = (1,) * (n - len(sa)) + tuple(sa), (1,) * (n - len(sb)) + tuple(sb)
        for da, db in zip(pa, pb):
            if da == 1:
                out.append(db)
            elif db == 1 or self._same_dim(da, db):
                out.append(da)
            else:
                raise SpecError(f"cannot broadcast {type_str(a.dtype, a.shape)} with {type_str(b.dtype, b.shape)}",
                                span)
        return tuple(out)

    def _no_bool(self, x: Node, what: str, span: Span) -> None:
        if x.dtype is D.BOOL:
            raise SpecError(f"'{what}' does not take bool values; cast with f32(...) first", span)


def _dtype(name: S.Name) -> DType:
    if name.id not in D.BY_NAME:
        raise SpecError(f"unknown dtype '{name.id}'{did_you_mean(name.id, D.BY_NAME)}", name.span)
    return D.BY_NAME[name.id]


def _fits_i32(value: int | float) -> bool:
    return math.isfinite(value) and -2**31 <= math.trunc(value) < 2**31


def _folded(node: Node) -> Node:
    """Math on numbers alone (``1 / 0``, ``65536 * 65536``, ``exp(1.0)``) as one constant, computed
    as the reference evaluator computes it (floats in float64, integers exactly): left to the
    kernel it would be Python's arithmetic at compile time, which raises on ``1 / 0`` and
    leaves int32 on ``65536 * 65536``.  An integer result past int32 is a float, as the parser
    reads ``2147483648``; a number cast to i32 must fit it."""
    if node.op is Op.CAST and node.arg is D.I32 and node.inputs[0].op is Op.CONST:
        value = node.inputs[0].arg
        if not _fits_i32(value):
            raise SpecError(f"i32({value!r}) is outside int32", node.span)
        # the integer itself, cast: tl.cast(123456789.0, tl.int32) would round through f32
        whole = Node(Op.CONST, D.I32, (), (), math.trunc(value), node.inputs[0].span)
        return Node(Op.CAST, D.I32, (), (whole,), D.I32, node.span)
    if node.op not in POINTWISE or node.op is Op.CAST or any(i.op is not Op.CONST for i in node.inputs):
        return node
    operands = [torch.tensor(i.arg, dtype=torch.float64 if i.dtype.is_float else torch.int64 if i.dtype is D.I32
                             else torch.bool) for i in node.inputs]
    try:
        value = evaluate_node(node, operands).item()
    except (RuntimeError, ValueError, ZeroDivisionError) as e:
        raise SpecError(f"cannot compute this from its numbers: {e}", node.span) from None
    if node.dtype is D.BOOL:
        return Node(Op.CONST, D.BOOL, (), (), bool(value), node.span)
    if not node.dtype.is_float and -2**31 <= value < 2**31:
        return Node(Op.CONST, D.I32, (), (), int(value), node.span)
    return Node(Op.CONST, D.F32, (), (), float(value), node.span)


def _integer_power(base: int, exponent: int, span: Span) -> Node:
    """``2 ** 3`` on numbers alone, as Python computes it: an integer for an exponent of 0 or
    more (a float past int32, as the parser reads ``2147483648``), a float for a negative one
    (``2 ** -1`` is 0.5).  Not through the reference's int64 ``torch.pow``, which raises on a
    negative exponent and wraps past int64 (``3 ** 40``): exactly where the result fits 63
    bits, else in float64 (``10 ** 400`` is inf, as ``1e400`` would be)."""
    if exponent >= 0 and (abs(base) <= 1 or exponent * math.log2(abs(base)) < 62):
        value: int | float = base ** exponent
    else:
        value = torch.pow(torch.tensor(float(base), dtype=torch.float64), float(exponent)).item()
    if isinstance(value, int) and -2**31 <= value < 2**31:
        return Node(Op.CONST, D.I32, (), (), value, span)
    return Node(Op.CONST, D.F32, (), (), float(value), span)


def _promoted(x: Node, common: DType, every: bool = False) -> Node:
    """x as torch on the GPU hands it to an op whose operands promote to a 16-bit float
    ``common`` (kgen computes in f32): a tensor of another dtype, 0-dim ones included, cast to
    ``common`` first (i32 2049 minus f16 2048 is 0, not 1; f16 x - f32 0-dim 0.1 is 0 where x
    is f16(0.1)), and for a comparison or a power (``every``) Python numbers too (f16
    x == 0.1 holds there; x ** 0.3 takes f16(0.3)); elsewhere numbers as they are, which
    torch's arithmetic on the GPU does not round (x - 0.1 is f16(x - 0.1), computed in f32)."""
    if not (common.is_float and common.bits == 16) or x.dtype is common:
        return x
    if every and x.op is Op.CONST and x.dtype is not D.BOOL:
        # a number rounded here: x ** 2 stays a product and x ** 0.5 a root
        value = torch.tensor(x.arg, dtype=torch.float64).to(common.torch).item()
        if value == x.arg or math.isnan(value):
            return x
        if x.dtype is D.I32 and math.isfinite(value) and -2**31 <= value < 2**31:   # 2049 is 2048
            return Node(Op.CONST, D.I32, (), (), int(value), x.span)
        return Node(Op.CONST, D.F32, (), (), value, x.span)
    if every or not x.is_weak:
        return Node(Op.CAST, common, x.shape, (x,), common, x.span)
    return x


def _literal_dim(d: S.Number) -> int:
    if not isinstance(d.value, int) or d.value < 0:   # the parser keeps ints past int32 as floats
        shown = d.text if len(d.text) <= 24 else f"{d.text[:12]}..."
        raise SpecError(f"dimension {shown} is not a size: expected an integer from 0 to 2**31 - 1", d.span)
    return d.value


def _source(text: str, span: Span) -> str:
    """A statement's text on one line, comments dropped and whitespace collapsed: it is
    echoed as a comment above the code it became, so it must never hold a line break."""
    lines = text.split("\n")
    if span.line == span.end_line:
        parts = [lines[span.line - 1][span.col - 1:span.end_col - 1]]
    else:
        parts = ([lines[span.line - 1][span.col - 1:]] + lines[span.line:span.end_line - 1]
                 + [lines[span.end_line - 1][:span.end_col - 1]])
    return " ".join(" ".join(p.split("#", 1)[0] for p in parts).split())
