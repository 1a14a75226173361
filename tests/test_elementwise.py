"""The elementwise pattern, end to end: kgen's kernel against the float64 reference
(``kgen.reference.evaluate``) and, for dtypes and shapes, against the same statements
run in eager PyTorch.

Hypothesis draws the program (a random pointwise DAG over DESIGN.md's function set),
the output's rank and shape (0-size, 1, primes, sizes past a block), how each operand
broadcasts (axes set to 1 or dropped), its layout (contiguous, transposed, sliced with
a step, expanded), its dtype and its values.  Without a GPU the kernels run on
Triton's interpreter, so sizes stay small; bf16 runs only where CUDA is.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
import triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

import kgen
from kgen.ir import Op, topo_order
from kgen.reference import evaluate, evaluate_node

from conftest import DEVICE, examples

SETTINGS = settings(deadline=None, max_examples=examples(200), print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# (atol, rtol) by output dtype.  The kernel computes in f32 (16-bit loads widened, a
# single rounding on store); the reference computes in float64 and is rounded to the
# output dtype before comparing, so 16-bit outputs may differ by one unit in the last
# place and f32 outputs by f32 rounding of bounded intermediates.
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 1.6e-2)}

SIZES = (1, 2, 3, 5, 7, 16, 17, 31, 33, 64, 127, 257)     # and 0, drawn apart
MAX_ELEMENTS = 300


# --------------------------------------------------------------------------- helpers

def assert_matches(got, want, dtype=None, slack=None):
    """``got`` (the kernel's output) equals the reference ``want`` rounded to got's dtype.
    ``slack`` (a float64 tensor of want's shape): how far the reference itself may be off,
    elementwise, on top of the tolerances; a finite difference is shortened by it first."""
    assert isinstance(got, torch.Tensor)
    want = torch.as_tensor(want)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    if dtype is not None:
        assert got.dtype == dtype
    want = want.to(device=got.device)
    if got.dtype == torch.bool or not got.dtype.is_floating_point:
        assert torch.equal(got, want.to(got.dtype)), (got, want)
        return
    atol, rtol = TOL[got.dtype]
    got, want = got.double(), want.to(got.dtype).double()
    if slack is not None:
        diff = got - want
        slack = slack.to(device=got.device)
        got = torch.where(diff.isfinite(), got - torch.minimum(torch.maximum(diff, -slack), slack), got)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


# How far a value kgen (or torch) computes in f32 can lie from the exact one: a few f32 ulps
# (2**-23 relative each) of a function and the arithmetic around it.
F32_ERROR = 2.0 ** -20


def rounding_slack(kir, args) -> list:
    """Per output of ``kir``: how far, elementwise, ``evaluate``'s exact reference may be from
    what kgen computes because of its 16-bit roundings of computed values (a 0-dim one that meets
    an f16 tensor with dims is rounded to f16, as torch rounds it).  kgen rounds its f32
    value, the reference the exact one: where that lies within F32_ERROR of a midpoint between
    two 16-bit values, the two may round to different neighbours.  The slack is what rounding
    to the other neighbour changes in the output, summed over such roundings; 0 elsewhere."""
    nodes = topo_order(o.node for o in kir.outputs)
    exact = set()          # inputs, numbers and casts of them: the same value on both sides
    for node in nodes:
        if node.op in (Op.INPUT, Op.SCALAR, Op.CONST) or node.op is Op.CAST and id(node.inputs[0]) in exact:
            exact.add(id(node))
    roundings = [n for n in nodes if n.op is Op.CAST and n.dtype.is_float and n.dtype.bits == 16
                 and n.inputs[0].dtype.is_float and id(n.inputs[0]) not in exact]

    def outputs(flip=None):
        values = {}
        for node in nodes:
            if node.op in (Op.INPUT, Op.SCALAR):
                value = args[node.arg]
                value = value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
            elif node.op is Op.CONST:
                value = node.arg
            else:
                operands = [values[id(i)] for i in node.inputs]
                value = evaluate_node(node, operands)
                if node is flip:   # the other neighbour where the exact value is near a midpoint
                    x = torch.as_tensor(operands[0], dtype=torch.float64)
                    lo, hi = ((x * (1 + e)).to(node.dtype.torch).double() for e in (-F32_ERROR, F32_ERROR))
                    value = torch.where(lo == value, hi, lo)
            values[id(node)] = value
        return [torch.as_tensor(values[id(o.node)]).double() for o in kir.outputs]

    exact_outputs = outputs()
    slack = [torch.zeros_like(w) for w in exact_outputs]
    for node in roundings:
        for total, w, other in zip(slack, exact_outputs, outputs(node)):
            total += torch.nan_to_num((other - w).abs(), nan=0.0, posinf=0.0)
    return slack


# Eager PyTorch for the language's statements: dtypes and shapes must agree with it.
# Functions of several operands promote them in one step, over tensors and Python
# numbers alike, as torch's own elementwise ops do (torch._prims_common has the rule);
# kgen has no i64, so torch's int64 for Python ints reads as i32.
def _t(x):
    return x if isinstance(x, torch.Tensor) else torch.tensor(x)


def _f(x):
    """Float functions take integers in kgen (as f32); torch wants a float tensor for some."""
    x = _t(x)
    return x if x.dtype.is_floating_point else x.float()


def _promoted(*values) -> torch.dtype:
    dtype = elementwise_dtypes(*(v for v in values if v is not None),
                               type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]
    return torch.int32 if dtype == torch.int64 else dtype


def _as(v, dtype):
    return None if v is None else _t(v).to(dtype)


def _clamp(x, lo=None, hi=None):
    dtype = _promoted(x, lo, hi)
    values = [_as(v, dtype) for v in (x, lo, hi)]
    # torch.clamp takes its bounds on the input's device; Python numbers become CPU tensors
    device = next((v.device for v in values if v is not None and v.device.type != "cpu"), torch.device("cpu"))
    return torch.clamp(*(None if v is None else v.to(device) for v in values))


def _binary(fn):
    def apply(a, b):
        dtype = _promoted(a, b)
        return fn(_as(a, dtype), _as(b, dtype))
    return apply


def _leaky_relu(x, alpha=0.01):
    dtype = _promoted(x, alpha)
    x, alpha = _as(x, dtype), _as(alpha, dtype)
    return torch.where(x > 0, x, x * alpha)


EAGER = {
    "exp": lambda x: torch.exp(_t(x)), "exp2": lambda x: torch.exp2(_t(x)), "log": lambda x: torch.log(_t(x)),
    "log2": lambda x: torch.log2(_t(x)), "sqrt": lambda x: torch.sqrt(_t(x)), "rsqrt": lambda x: torch.rsqrt(_t(x)),
    "abs": lambda x: torch.abs(_t(x)), "sin": lambda x: torch.sin(_t(x)), "cos": lambda x: torch.cos(_t(x)),
    "tanh": lambda x: torch.tanh(_t(x)), "sigmoid": lambda x: torch.sigmoid(_t(x)),
    "relu": lambda x: torch.relu(_t(x)), "gelu": lambda x: F.gelu(_f(x)),
    "gelu_tanh": lambda x: F.gelu(_f(x), approximate="tanh"), "silu": lambda x: F.silu(_f(x)),
    "softplus": lambda x: F.softplus(_f(x)), "leaky_relu": _leaky_relu,
    "maximum": _binary(torch.maximum), "minimum": _binary(torch.minimum),
    "where": lambda c, a, b: torch.where(_t(c), *(_as(v, _promoted(a, b)) for v in (a, b))),
    "clamp": _clamp,
    "f16": lambda x: _t(x).to(torch.float16), "f32": lambda x: _t(x).to(torch.float32),
    "bf16": lambda x: _t(x).to(torch.bfloat16), "i32": lambda x: _t(x).to(torch.int32),
    "bool": lambda x: _t(x).to(torch.bool),
}


CASTS = ("f16", "f32", "bf16", "i32", "bool")


def _weak(fn):
    """Math on Python numbers alone gives a Python number, as in Python: it stays weak in
    torch's promotion (``abs(0.5) * A`` keeps A's dtype), as kgen's literals do."""
    def apply(*args, **kwargs):
        if any(isinstance(v, torch.Tensor) for v in (*args, *kwargs.values())):
            result = fn(*args, **kwargs)
            return result.to(torch.int32) if result.dtype == torch.int64 else result
        number = lambda v: torch.tensor(v, dtype=torch.float64 if isinstance(v, float) else None)  # noqa: E731
        return fn(*map(number, args), **{k: number(v) for k, v in kwargs.items()}).item()
    return apply


def eager(text: str, args: dict) -> dict:
    """Run the statements as Python over torch (the language is Python's expression syntax)."""
    # a cast makes a typed 0-dim tensor, as torch.tensor(x, dtype=...) does, even of a number
    env = {name: fn if name in CASTS else _weak(fn) for name, fn in EAGER.items()}
    env.update(args)
    for stmt in re.split(r"[;\n]", text):
        if stmt.strip():
            name, expr = stmt.split("=", 1)
            # (__import__: torch's C++ code imports lazily through the calling frame's builtins)
            scope = {"__builtins__": {"__import__": __import__}}
            env[name.strip()] = eval(expr, scope, env)  # noqa: S307 - our own test text
    return env


# --------------------------------------------------------------------------- strategies

@st.composite
def shapes(draw, max_rank: int = 4, max_elements: int = MAX_ELEMENTS):
    rank = draw(st.integers(0, max_rank))
    shape, budget = [], max_elements
    for _ in range(rank):
        size = draw(st.sampled_from([s for s in SIZES if s <= max(budget, 1)]))
        shape.append(size)
        budget //= size
    if rank and draw(st.integers(0, 9)) == 0:           # 0-size: empty outputs, no launch
        shape[draw(st.integers(0, rank - 1))] = 0
    return tuple(shape)


@st.composite
def broadcast_of(draw, out_shape):
    """An operand shape that broadcasts to ``out_shape``: leading axes dropped, others set to 1."""
    if draw(st.booleans()):
        return tuple(out_shape)                          # the flat path's case, when all are full
    drop = draw(st.integers(0, len(out_shape)))
    kept = out_shape[drop:]
    return tuple(1 if draw(st.booleans()) and draw(st.booleans()) else d for d in kept)


LAYOUTS = ("contiguous", "transposed", "rotated", "sliced", "expanded")


def make_tensor(values: torch.Tensor, layout: str, out_shape, dtype) -> torch.Tensor:
    """``values`` (float64) as a tensor of ``dtype`` laid out as ``layout`` asks."""
    values = values.to(dtype)
    rank = values.dim()
    if layout in ("transposed", "rotated") and rank >= 2:
        # memory order reversed, or the first axis innermost
        perm = list(range(rank))[::-1] if layout == "transposed" else list(range(1, rank)) + [0]
        inverse = [perm.index(i) for i in range(rank)]
        base = values.permute(perm).contiguous()
        return base.permute(inverse)
    if layout == "sliced" and rank >= 1:
        # every other element of a larger buffer, from an offset; the gaps hold a sentinel
        fill = float("nan") if dtype.is_floating_point else -12345
        base = torch.full([2 * s + 1 for s in values.shape], fill, dtype=dtype, device=DEVICE)
        view = base[tuple(slice(1, None, 2) for _ in values.shape)]
        view.copy_(values)
        return view
    if layout == "expanded" and rank >= 1:
        target = tuple(out_shape[len(out_shape) - rank:])
        if any(s == 1 and t != 1 for s, t in zip(values.shape, target)):
            return values.contiguous().expand(target)
    return values.contiguous()


def draw_values(data, shape, dtype, nan: bool, scale: float | None = None) -> torch.Tensor:
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)
    if not dtype.is_floating_point:
        return torch.randint(-5, 6, shape, generator=gen).to(torch.float64).to(DEVICE)
    scale = scale if scale is not None else data.draw(st.sampled_from([0.5, 1.0, 3.0]), label="scale")
    values = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if values.numel():
        # exact zeros, ones and repeated values, which hypothesis likes and kernels trip on
        special = torch.rand(shape, generator=gen, dtype=torch.float64)
        values = torch.where(special < 0.05, torch.zeros_like(values), values)
        values = torch.where((special >= 0.05) & (special < 0.08), torch.ones_like(values), values)
        if nan:
            values = torch.where(special > 0.95, torch.full_like(values, math.nan), values)
    return values.to(dtype).to(torch.float64).to(DEVICE)   # representable in dtype


# Random pointwise programs over bounded values, away from singular points, so that f32
# rounding stays far below the tolerances: a power's base is clamped, and sin and cos take
# arguments within 64, where a few f32 ulps of error in the argument move them by under 2**-15
# (products of products reach 1e6 and more: sin((t) * (t)) with t = (A * B) * (C * A) was off
# by 0.2); functions outside that (log near 0, NaN-producing domains, infinities, trigonometry
# of large arguments) are covered one function at a time in test_each_function_special_values.
UNARY = ["abs({})", "sin(clamp({}, -64, 64))", "cos(clamp({}, -64, 64))", "tanh({})", "sigmoid({})", "relu({})",
         "gelu({})", "gelu_tanh({})",
         "silu({})", "softplus({})", "leaky_relu({})", "leaky_relu({}, 0.2)", "leaky_relu({}, alpha=0.05)",
         "-({})", "exp(clamp({}, -3, 3))", "exp2(minimum({}, 4))", "log(abs({}) + 1)", "log2(abs({}) + 0.5)",
         "sqrt(abs({}) + 1)", "rsqrt(abs({}) + 0.25)", "f32(clamp({}, -16, 16)) ** 2", "f32(clamp({}, -4, 4)) ** 3",
         "(abs({}) + 1) ** 1.5",
         "(abs({}) + 1) ** -0.5", "sigmoid({}) ** 0.5", "clamp({}, -1, 2)", "clamp({}, lo=-0.5)",
         "clamp({}, hi=1)", "clamp(x={}, lo=0, hi=1.5)", "maximum({}, 0.25)", "minimum(1, {})"]
BINARY = ["({}) + ({})", "({}) - ({})", "({}) * ({})", "({}) / (abs({}) + 1)", "maximum({}, {})",
          "minimum({}, {})", "(sigmoid({}) + 0.5) ** clamp({}, -2, 2)", "leaky_relu({}, sigmoid({}))"]
COMPARE = ["<", "<=", ">", ">=", "==", "!="]
CONSTANTS = ["0.5", "2", "-1.5", "3", "0.1"]


@dataclass
class Program:
    text: str
    tensors: tuple[str, ...]      # names that are tensor inputs
    scalars: tuple[str, ...]      # names that are Python-number inputs


@st.composite
def leaves(draw, names):
    name = draw(st.sampled_from(names))
    how = draw(st.integers(0, 9))
    if how == 0:
        return draw(st.sampled_from(CONSTANTS))
    if how == 1:
        return f"f32({name})"
    if how == 2 and name != "t":
        return f"f16({name})"     # rounding an input (not a computed value): the same on both sides
    return name


@st.composite
def conditions(draw, names):
    a = draw(st.sampled_from(names))
    how = draw(st.integers(0, 3))
    if how == 0:
        return f"bool({a})"
    b = draw(st.sampled_from(names + CONSTANTS[:2]))
    return f"{a} {draw(st.sampled_from(COMPARE))} {b}"


@st.composite
def expressions(draw, names, depth):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(leaves(names))
    kind = draw(st.integers(0, 9))
    sub = lambda: draw(expressions(names, depth - 1))  # noqa: E731
    if kind <= 3:
        return draw(st.sampled_from(UNARY)).format(sub())
    if kind <= 7:
        return draw(st.sampled_from(BINARY)).format(sub(), sub())
    if kind == 8:
        return f"where({draw(conditions(names))}, {sub()}, {sub()})"
    lo, hi = sorted([draw(leaves(names)), draw(leaves(names))])
    return f"clamp({sub()}, {lo}, {hi})"


@st.composite
def programs(draw):
    n_tensors = draw(st.integers(1, 3))
    tensors = ("A", "B", "C")[:n_tensors]
    scalars = ("s",) if draw(st.booleans()) else ()
    names = list(tensors + scalars)
    stmts = []
    if draw(st.booleans()):                       # an intermediate the outputs read
        stmts.append(f"t = {draw(expressions(names, 2))}")
        names = names + ["t"]
    outputs = draw(st.integers(1, 2))
    for i, out in enumerate(("Y", "Z")[:outputs]):
        e = draw(expressions(names, 3))
        if i == 0 and "t" in names and not re.search(r"\bt\b", e):
            e = f"({e}) + t"                      # t must be read, or it becomes an output too
        # every output reads every tensor input, so that all outputs have one shape
        reached = e + (" " + stmts[0] if "t" in names and re.search(r"\bt\b", e) else "")
        missing = [n for n in tensors if n not in first_appearance(reached, tensors)]
        e = " + ".join([f"({e})"] + [f"relu({n})" for n in missing]) if missing else e
        stmts.append(f"{out} = {e}")
    sep = draw(st.sampled_from(["\n", "; "]))
    return Program(sep.join(stmts), tensors, scalars)


def first_appearance(text: str, candidates) -> list[str]:
    seen = []
    for tok in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text):
        if tok in candidates and tok not in seen:
            seen.append(tok)
    return seen


# --------------------------------------------------------------------------- property tests

@SETTINGS
@given(data=st.data())
def test_random_program_matches_reference(data):
    prog = data.draw(programs(), label="program")
    out_shape = data.draw(shapes(), label="shape")
    inputs = first_appearance(prog.text, prog.tensors + prog.scalars)
    nan = data.draw(st.booleans(), label="nan")
    args = {}
    for name in inputs:
        if name in prog.scalars:
            args[name] = data.draw(st.sampled_from([0.75, -2.0, 3, 0, 1.5]), label=name)
            continue
        shape = data.draw(broadcast_of(out_shape), label=f"{name} shape")
        dtype = data.draw(st.sampled_from([torch.float16, torch.float32, torch.float32, torch.int32]),
                          label=f"{name} dtype")
        layout = data.draw(st.sampled_from(LAYOUTS), label=f"{name} layout")
        args[name] = make_tensor(draw_values(data, shape, dtype, nan), layout, out_shape, dtype)

    kernel = kgen.compile(prog.text)
    assert list(kernel.inputs) == inputs
    env = eager(prog.text, args)
    want_eager = {o: torch.as_tensor(env[o]) for o in kernel.outputs}
    out_layout = data.draw(st.sampled_from([None, "contiguous", "transposed", "sliced"]), label="out")
    if out_layout is None:
        got = as_tuple(kernel(*(args[n] for n in inputs)))
    else:                                        # the outputs written into views the caller owns
        outs = tuple(make_tensor(torch.zeros(want_eager[o].shape, dtype=torch.float64, device=DEVICE),
                                 out_layout, (), want_eager[o].dtype) for o in kernel.outputs)
        got = as_tuple(kernel(*(args[n] for n in inputs), out=outs if len(outs) > 1 else outs[0]))
        assert all(g is o for g, o in zip(got, outs))
    want = evaluate(kernel.ir, args)
    assert len(got) == len(want) == len(kernel.outputs)
    for name, g, w, slack in zip(kernel.outputs, got, want, rounding_slack(kernel.ir, args)):
        e = want_eager[name]
        assert g.dtype == e.dtype, f"{name}: kgen gives {g.dtype}, torch {e.dtype}"
        assert g.shape == e.shape
        assert_matches(g, w, slack=slack)


@SETTINGS
@given(data=st.data())
def test_layouts_and_broadcasting(data):
    """One fixed fused expression; everything about the operands is drawn."""
    out_shape = data.draw(shapes(), label="shape")
    args = []
    for name in ("X", "G", "B"):
        shape = data.draw(broadcast_of(out_shape), label=f"{name} shape")
        dtype = data.draw(st.sampled_from([torch.float16, torch.float32]), label=f"{name} dtype")
        layout = data.draw(st.sampled_from(LAYOUTS), label=f"{name} layout")
        args.append(make_tensor(draw_values(data, shape, dtype, nan=True), layout, out_shape, dtype))
    kernel = kgen.compile("Y = silu(X) * G + B")
    got = kernel(*args)
    x, g, b = (a.double() for a in args)

    def operand(value, actual, other, computed):
        """The values the operand may take.  As torch hands a 0-dim tensor to an op with one
        that has dims, it is cast to their dtype where that is another (f32 to f16); one
        already of it stays exact, as kgen computes 16-bit values in f32 and rounds only what
        it stores.  A computed value is rounded from its f32 approximation (kgen's and torch's
        alike): where the exact one lies within that approximation's error (F32_ERROR)
        of a midpoint between two 16-bit values, either of them is right."""
        dtype = torch.result_type(actual, other)
        if actual.dim() == 0 and other.dim() > 0 and dtype != actual.dtype:
            if computed and dtype.itemsize == 2:
                return [(value * (1 + e)).to(dtype).double() for e in (-F32_ERROR, F32_ERROR)]
            return [value.to(dtype).double()]
        return [value]
    silu, product = F.silu(args[0]), F.silu(args[0]) * args[1]
    wants = [s * h for s in operand(F.silu(x), silu, args[1], True) for h in operand(g, args[1], silu, False)]
    wants = [p + c for w in wants for p in operand(w, product, args[2], True)
             for c in operand(b, args[2], product, False)]
    # the reference is off by what the other rounding of such an operand would change
    want = wants[0]
    slack = torch.nan_to_num(torch.stack([(w - want).abs() for w in wants]).amax(0), nan=0.0, posinf=0.0)
    assert got.dtype == (F.silu(args[0]) * args[1] + args[2]).dtype
    assert_matches(got, want, slack=slack)
    assert_matches(got, evaluate(kernel.ir, dict(zip("XGB", args)))[0], slack=slack)


@settings(deadline=None, max_examples=examples(30), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_block_boundaries(data):
    """Sizes around the block size: a declared schedule makes blocks small enough to cross
    several on the interpreter, and the default schedule sees n_elements past 1024."""
    block = data.draw(st.sampled_from([16, 32]), label="BLOCK_SIZE")
    m = data.draw(st.sampled_from([1, 2, 3, 5]), label="M")
    n = data.draw(st.sampled_from([block - 1, block, block + 1, 2 * block + 1, 3]), label="N")
    transposed = data.draw(st.booleans(), label="transposed")
    spec = f"""kernel scaled(X: f32[M, N], b: f32[N], alpha: f32 = 2.0) -> Y: f32[M, N] {{
    Y = tanh(X * alpha) + b
}}
schedule scaled {{
    BLOCK_SIZE = {block}
}}
"""
    kernel = kgen.compile(spec)
    x = torch.randn(n, m, device=DEVICE).t() if transposed else torch.randn(m, n, device=DEVICE)
    b = torch.randn(n, device=DEVICE)
    assert_matches(kernel(x, b), torch.tanh(x.double() * 2.0) + b.double())
    assert_matches(kernel(x, b, alpha=-0.5), torch.tanh(x.double() * -0.5) + b.double())


@pytest.mark.parametrize("schedule", ["BLOCK_SIZE = [16, 32]\n    num_warps = [1, 2]", "num_warps = [2, 4]",
                                      "BLOCK_SIZE = 64\n    num_warps = 2"])
def test_schedules_with_candidates(schedule):
    """A schedule's lists are autotuning candidates; any of them computes the same values."""
    spec = f"""kernel tuned(X: f16[M, N], b: f16[N]) -> Y: f16[M, N] {{
    Y = silu(X) * b
}}
schedule tuned {{
    {schedule}
}}
"""
    kernel = kgen.compile(spec)
    for m, n in [(3, 17), (5, 33), (1, 1), (0, 4)]:
        x, b = torch.randn(m, n, device=DEVICE).half(), torch.randn(n, device=DEVICE).half()
        assert_matches(kernel(x, b), F.silu(x.double()) * b.double())


def test_copies_and_aliases():
    x = torch.randn(3, 4, device=DEVICE)
    assert_matches(kgen.compile("Y = X")(x.t()), x.t().double())
    y, z = kgen.compile("t = X * 2; Y = t; Z = t")(x)
    assert_matches(y, x.double() * 2)
    assert_matches(z, x.double() * 2)
    assert y.data_ptr() != z.data_ptr()
    a, b = kgen.compile("Y = X; Z = X")(x)
    assert_matches(a, x.double())
    assert_matches(b, x.double())


@pytest.mark.parametrize("n", [1023, 1024, 1025, 2049])
@pytest.mark.parametrize("contiguous", [True, False])
def test_default_blocks_crossed(n, contiguous):
    kernel = kgen.compile("Y = X * 2 + Z")
    x = torch.randn(n, device=DEVICE)
    z = torch.randn(2 * n, device=DEVICE)
    z = z[::2] if not contiguous else z[:n]
    assert_matches(kernel(x, z), x.double() * 2 + z.double())


# --------------------------------------------------------------------------- each function

SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, 20.0,
           20.5, 30.0, -30.0, 88.0, 89.0, -88.0, -104.0, 1e4, -1e4, 65504.0, 1e-6, -1e-6, 1e-30, 1e30, -1e38]

UNARY_FUNCTIONS = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh", "sigmoid", "relu",
                   "leaky_relu", "gelu", "gelu_tanh", "silu", "softplus"]
TORCH_UNARY = {"exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
               "rsqrt": torch.rsqrt, "abs": torch.abs, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
               "sigmoid": torch.sigmoid, "relu": torch.relu, "leaky_relu": F.leaky_relu, "gelu": F.gelu,
               "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "softplus": F.softplus}


def special_values(dtype):
    x = torch.tensor(SPECIAL, dtype=torch.float64)
    if dtype == torch.float16:
        x = x.clamp(-65504, 65504).where(x.isfinite() | x.isnan(), x)
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("fn", UNARY_FUNCTIONS)
def test_each_function_special_values(fn, dtype):
    """NaN, infinities, signed zeros, overflow thresholds: where torch is defined, so is kgen,
    the sign of a zero result included (1 / tanh(-0.0) is -inf)."""
    x = special_values(dtype)
    kernel = kgen.compile(f"Y = {fn}(X)")
    got = kernel(x)
    want = TORCH_UNARY[fn](x.double())
    assert got.dtype == TORCH_UNARY[fn](x).dtype
    assert_matches(got, want)
    zero = (want == 0) & (fn != "relu")   # torch's relu(-0.0) is +0.0 on the GPU, -0.0 on the CPU
    assert torch.equal(got[zero].signbit(), want[zero].signbit()), (x[zero], got[zero])
    assert_matches(got, evaluate(kernel.ir, {"X": x})[0])


@pytest.mark.parametrize("alpha", [0.01, -0.5, float("inf"), float("nan")])
def test_leaky_relu_at_zero_is_torchs(alpha):
    """torch's leaky_relu keeps x where x > 0: at either zero it gives alpha * x (NaN for an
    infinite alpha, -0.0 for +0.0 times a negative one)."""
    x = torch.tensor([0.0, -0.0, 2.0, -2.0], device=DEVICE)
    kernel = kgen.compile("Y = leaky_relu(X, a)")
    got, want = kernel(x, alpha), F.leaky_relu(x, alpha)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    number = ~want.isnan()   # (a NaN's sign bit means nothing)
    assert torch.equal(got[number].signbit(), want[number].signbit()), got
    reference = evaluate(kernel.ir, {"X": x, "a": alpha})[0]
    assert torch.equal(reference.isnan(), want.isnan())
    assert torch.equal(reference[number].signbit(), want[number].signbit()), reference


TINY = torch.logspace(-30, 0, 61, dtype=torch.float64)
ACCURACY_RANGES = {
    "tanh": torch.cat([TINY, -TINY, torch.linspace(-20, 20, 160, dtype=torch.float64)]),
    "softplus": torch.cat([TINY, -TINY, torch.linspace(-80, 30, 221, dtype=torch.float64)]),
    "gelu_tanh": torch.cat([TINY, -TINY]),
}


@pytest.mark.parametrize("fn", sorted(ACCURACY_RANGES))
def test_functions_keep_relative_accuracy(fn):
    """Where a closed form cancels (tanh near 0, log(1 + e^x) for very negative x), f32
    results keep their relative accuracy, not only the absolute one."""
    x = ACCURACY_RANGES[fn].to(torch.float32)
    got = kgen.compile(f"Y = {fn}(X)")(x.to(DEVICE)).cpu().double()
    want = TORCH_UNARY[fn](x.double())
    assert want.abs().min() > 0
    assert ((got - want).abs() / want.abs()).max() <= 1e-5


# the most f32 ulps (of 2**-23 relative) that exp2(y * log2|x|) is off in test_f32_powers_are_within_their_ulps:
# 48 on Triton's interpreter (numpy's f32 log2 and exp2) and 51 on an H100 (2026-11-26)
POW_ULPS = 64

HALVES = torch.tensor([0.1, 2048.0, -0.1, 0.3, 2050.0, 1.0, 65504.0], dtype=torch.float16)
INTS = torch.tensor([1, 2049, 0, 2048, 2051, 1, 65520], dtype=torch.int32)


@pytest.mark.parametrize("text, args, fn", [
    ("y = x == 0.1", (HALVES,), lambda x: x == 0.1),
    ("y = x < 0.1", (HALVES,), lambda x: x < 0.1),
    ("y = x >= 2049", (HALVES,), lambda x: x >= 2049),
    ("y = x < s", (HALVES, 0.3), lambda x, s: x < s),
    ("y = x <= t", (HALVES, torch.tensor(0.3)), lambda x, t: x <= t),
    ("y = a == x", (INTS, HALVES), lambda a, x: a == x),
    ("y = a - x", (INTS, HALVES), lambda a, x: a - x),
    ("y = x * a", (HALVES, INTS), lambda x, a: x * a),
    ("y = maximum(a, x)", (INTS, HALVES), torch.maximum),
    ("y = where(x > 1, a, x)", (HALVES, INTS), lambda x, a: torch.where(x > 1, a, x)),
    # 0-dim tensors and cast numbers are tensors: rounded too (f16(0.1) - f32(0.1) is 0)
    ("y = x - t", (HALVES, torch.tensor(0.1)), lambda x, t: x - t),
    ("y = x - f32(0.1)", (HALVES,), lambda x: x - torch.tensor(0.1, device=x.device)),
    # a number exponent is rounded to the base's dtype, as torch's pow on the GPU takes it
    ("y = x ** 0.3", (HALVES.abs(),), lambda x: (x.float() ** torch.tensor(0.3).half().float()).half()),
    ("y = x ** p", (HALVES.abs(), 0.3), lambda x, p: (x.float() ** torch.tensor(p).half().float()).half()),
    # ... where arithmetic on the GPU takes a Python number as it is (torch on the CPU rounds
    # those of + and -): f16(0.1) - 0.1 is f16 of the f32 difference, 1 + 2049 is 2050
    ("y = x - 0.1 + 2049", (HALVES,), lambda x: (x.float() - 0.1 + 2049).half()),
    ("y = x - s", (HALVES, 0.1), lambda x, s: (x.float() - s).half()),
])
def test_operands_promoted_to_a_16_bit_dtype_are_rounded_to_it(text, args, fn):
    """torch on the GPU casts a tensor (0-dim too) to the 16-bit float it promotes to, and a
    comparison or a power rounds numbers to it as well (f16 0.1 == 0.1, f16 2048 >= 2049): so
    does kgen, which otherwise computes 16-bit values in f32."""
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    got = kgen.compile(text)(*args)
    want = fn(*args)
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


F32_TENTHS = torch.tensor([0.1, 0.2, 0.3, 0.7])
BIG_INTS = torch.tensor([16777217, 16777216, 3, -16777217], dtype=torch.int32)


@pytest.mark.parametrize("text, args, fn", [
    ("y = f32(x == 0.1)", (F32_TENTHS,), lambda x: (x == 0.1).float()),
    ("y = where(x > 0.2, x, 0.0)", (F32_TENTHS,), lambda x: torch.where(x > 0.2, x, 0.0)),
    ("y = f32(x <= s)", (F32_TENTHS, 0.3), lambda x, s: (x <= s).float()),
    ("y = f32(0.7 != x)", (F32_TENTHS,), lambda x: (0.7 != x).float()),
    ("y = f32(i == x)", (BIG_INTS, torch.full((4,), 16777216.0)), lambda i, x: (i == x).float()),
    ("y = f32(i > 16777216.0)", (BIG_INTS,), lambda i: (i > 16777216.0).float()),
])
def test_comparisons_meet_in_f32_as_in_torch(text, args, fn):
    """A comparison whose sides promote to f32 rounds each side to f32 (an f32 0.1 equals the
    number 0.1; int32 16777217 equals f32 16777216), in the kernel as in torch, and in kgen's
    float64 reference too, which would otherwise hold 0.1 exactly."""
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    kernel = kgen.compile(text)
    got, want = kernel(*args), fn(*args)
    reference = evaluate(kernel.ir, dict(zip(kernel.inputs, args)))[0]
    assert torch.equal(got, want) and torch.equal(reference.to(got.dtype), got), (got, want, reference)


F16_NEAR = torch.tensor([1.0009765625, 1.0, 0.5, -0.45947265625], dtype=torch.float16)


@pytest.mark.parametrize("text, args, fn", [
    ("y = x * 1023 >= 1024", (F16_NEAR,), lambda x: x.float() * 1023 >= 1024),
    ("z = where(x * 3 > y, x, y)", (F16_NEAR, torch.full((4,), -1.37890625, dtype=torch.float16)),
     lambda x, y: torch.where(x.float() * 3 > y.float(), x, y)),
    ("y = f16(x * 1023) >= 1024", (F16_NEAR,), lambda x: (x * 1023).float() >= 1024),
    ("y = x == 0.1", (torch.tensor([0.1, 0.2], dtype=torch.float16),), lambda x: x == 0.1),
])
def test_the_reference_compares_a_computed_16_bit_value_as_the_kernel_holds_it(text, args, fn):
    """A computed f16 value is the kernel's f32 one (README, "Promotion"): the reference compares
    it unrounded too, as it rounds an input, a cast or a number to f16 (it had rounded x * 1023 to
    f16, and kgen run reported the right kernel off by 1)."""
    args = tuple(a.to(DEVICE) for a in args)
    kernel = kgen.compile(text)
    got, want = kernel(*args), fn(*args)
    reference = evaluate(kernel.ir, dict(zip(kernel.inputs, args)))[0]
    assert torch.equal(got, want) and torch.equal(reference.to(got.dtype), got), (got, want, reference)


BINARY_SPECS = {
    "X + Y": lambda x, y: x + y, "X - Y": lambda x, y: x - y, "X * Y": lambda x, y: x * y,
    "X / Y": lambda x, y: x / y, "X ** Y": torch.pow, "maximum(X, Y)": torch.maximum,
    "minimum(X, Y)": torch.minimum, "where(X > Y, X, Y)": lambda x, y: torch.where(x > y, x, y),
    "leaky_relu(X, Y)": lambda x, y: torch.where(x > 0, x, x * y), "clamp(X, Y, 1)": lambda x, y: torch.clamp(
        torch.clamp(x, min=y), max=torch.tensor(1.0, dtype=x.dtype, device=x.device)),
    "X < Y": torch.lt, "X <= Y": torch.le, "X > Y": torch.gt, "X >= Y": torch.ge, "X == Y": torch.eq,
    "X != Y": torch.ne,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("spec", list(BINARY_SPECS))
def test_each_binary_special_values(spec, dtype):
    """Every pair of special values, through each binary function and operator."""
    v = special_values(dtype)
    x = v.repeat_interleave(len(v))
    y = v.repeat(len(v))
    kernel = kgen.compile(f"Z = {spec}")
    got = kernel(x, y)
    want = BINARY_SPECS[spec](x.double(), y.double())
    assert_matches(got, want)
    assert_matches(got, evaluate(kernel.ir, {"X": x, "Y": y})[0])


@pytest.mark.parametrize("exponent", ["0.5", "-0.5", "2", "3", "4", "-1", "-2", "1.5", "0", "1", "2.0"])
def test_power_by_constant(exponent):
    """``x ** c`` as torch.pow(x, c): small integers as products, 0.5 as sqrt, as torch does."""
    x = special_values(torch.float32)
    kernel = kgen.compile(f"Y = X ** {exponent}")
    want = torch.pow(x.double(), float(exponent) if "." in exponent else int(exponent))
    assert_matches(kernel(x), want)
    assert_matches(kernel(x), evaluate(kernel.ir, {"X": x})[0])


@pytest.mark.parametrize("text, fn", [
    ("Y = exp(I)", torch.exp), ("Y = sqrt(I)", torch.sqrt), ("Y = sigmoid(I)", torch.sigmoid),
    ("Y = silu(I)", lambda i: F.silu(i.float())), ("Y = softplus(I)", lambda i: F.softplus(i.float())),
    ("Y = I / 2", lambda i: i / 2),
    ("Y = I / J", lambda i: i / i.flip(0).clamp(min=1)), ("Y = abs(I) + J", lambda i: i.abs() + i.flip(0).clamp(min=1)),
    ("Y = 2 ** f32(I)", lambda i: torch.pow(2.0, i.float())), ("Y = relu(I)", torch.relu),
    ("Y = I * 0.5", lambda i: i * 0.5), ("Y = f32(I) ** I", lambda i: torch.pow(i.float(), i)),
    ("Y = i32(X * 3)", None), ("Y = bool(I)", lambda i: i.bool()), ("Y = -I", torch.neg),
    ("Y = clamp(I, 0, 3)", lambda i: i.clamp(0, 3)), ("Y = minimum(2, I)", lambda i: i.clamp(max=2)),
    # no torch function takes an integer leaky_relu: its definition, which kgen computes in i32
    ("Y = leaky_relu(I, 2)", lambda i: torch.where(i > 0, i, i * 2)),
])
def test_integer_operands(text, fn):
    """i32 inputs: float functions widen them to f32 as torch does; integer math stays i32."""
    i = torch.arange(-6, 7, dtype=torch.int32, device=DEVICE)
    j = i.flip(0).clamp(min=1)
    x = torch.arange(-6, 7, device=DEVICE) * 0.375      # X * 3 is exact: truncation agrees
    kernel = kgen.compile(text)
    env = {"I": i, "J": j, "X": x}
    args = [env[n] for n in kernel.inputs]
    got = kernel(*args)
    want = fn(i) if fn is not None else (x * 3).to(torch.int32)
    assert got.dtype == want.dtype
    reference = evaluate(kernel.ir, dict(zip(kernel.inputs, args)))[0]
    if got.dtype.is_floating_point:
        assert_matches(got, want.double())
        assert_matches(got, reference)
    else:   # integer math is exact: the reference's too, in the kernel's dtype
        assert torch.equal(got, want) and torch.equal(reference, got), (got, want, reference)


@pytest.mark.parametrize("text", [
    "Y = X * exp(1.0)", "Y = X + sigmoid(0.5)", "Y = X + maximum(1.0, 2.0)", "Y = X + f16(0.1)",
    "Y = X * (1 / 3)", "Y = X + abs(-2)", "Y = X + clamp(5.0, 0, 1)", "Y = X + 2 ** 0.5", "Y = X + (1 + 2)",
    "Y = X + leaky_relu(-1.0)", "Y = X * f32(2)", "Y = X + gelu(1.0) * tanh(0.5)", "Y = where(X > 0, 1.5, -2) + X",
])
def test_constant_subexpressions(text):
    """Math on literals alone is computed as torch would (the reference too)."""
    x = torch.linspace(-2, 2, 9, device=DEVICE)
    kernel = kgen.compile(text)
    got = kernel(x)
    want = eager(text, {"X": x.double()})["Y"]
    assert_matches(got, want)
    assert_matches(got, evaluate(kernel.ir, {"X": x})[0])


@pytest.mark.parametrize("value", [2.0, 1, -3, 0.1])
@pytest.mark.parametrize("text", ["Y = X + f32(s)", "Y = X * f16(s)", "Y = X + i32(s)", "Y = X * exp(s)",
                                  "Y = X + sigmoid(s) * s", "Y = where(X > s, X, s)", "Y = clamp(X, s, 2)"])
def test_scalar_inputs(text, value):
    """A Python number for an input makes it a runtime scalar; casts and functions take it."""
    x = torch.linspace(-2, 2, 9, device=DEVICE)
    kernel = kgen.compile(text)
    got = kernel(x, value) if kernel.inputs == ("X", "s") else kernel(value, x)
    want = eager(text, {"X": x.double(), "s": value})["Y"]
    assert_matches(got, want)
    assert_matches(got, evaluate(kernel.ir, {"X": x, "s": value})[0])


def test_scalars_only():
    """No tensor at all: a 0-dim result on the device torch would pick."""
    k = kgen.compile("Y = a * 2 + b")
    got = k(1.5, 0.25)
    assert got.shape == () and got.dtype == torch.float32
    assert_matches(got, torch.tensor(1.5 * 2 + 0.25, dtype=torch.float64))
    declared = kgen.compile("kernel twice(a: f32) -> Y {\n    Y = a * 2\n}\n")
    assert_matches(declared(3.0), torch.tensor(6.0, dtype=torch.float64))


# --------------------------------------------------------------------------- calls

def test_several_outputs_in_order_of_assignment():
    k = kgen.compile("t = X * W\nZ = t + 1; Y = relu(t)\nV = t > 0.5")
    assert k.inputs == ("X", "W") and k.outputs == ("Z", "Y", "V")
    x, w = torch.randn(4, 5, device=DEVICE), torch.randn(5, device=DEVICE)
    z, y, v = k(x, w)
    t = x.double() * w.double()
    assert_matches(z, t + 1)
    assert_matches(y, torch.relu(t))
    assert v.dtype == torch.bool
    assert torch.equal(v, x * w > 0.5)
    # a value a later statement reads is not an output
    k = kgen.compile("Y = relu(X)\nZ = Y * 2")
    assert k.outputs == ("Z",)
    assert isinstance(k(x), torch.Tensor)


def test_headerless_outputs_from_different_inputs_share_their_shape():
    """One launch computes every output over one index space: outputs read from different
    inputs take one shape, aligned from the right, and a call whose inputs disagree is a
    CallError before any launch; outputs of two ranks are refused at the call."""
    k = kgen.compile("Y = A * 2; Z = exp(B) - C")
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(4, 7, generator=g).to(DEVICE), torch.randn(4, 7, generator=g).to(DEVICE)
    c = torch.randn(7, generator=g).to(DEVICE)
    y, z = k(a, b.t().contiguous().t(), c)
    want = evaluate(k._last.ir, {"A": a, "B": b, "C": c})
    assert_matches(y, want[0])
    assert_matches(z, want[1])
    with pytest.raises(kgen.CallError, match=r"B: expected f32\[M, N\] = \[4, 7\] \(sizes from A\)"):
        k(a, b[:, :6], c[:6])
    with pytest.raises(kgen.UnsupportedError, match="must share one shape"):
        k(a, c, c)


def test_a_dimension_repeated_in_one_tensor_says_its_size():
    """f32[N, N]: the first axis gives N, which the second must match; the message shows both
    sizes, not a free first axis."""
    square = kgen.compile("kernel f(x: f32[N, N]) -> y { y = x * 2 }")
    with pytest.raises(kgen.CallError, match=r"^f: x: expected f32\[N, N\] = \[3, 3\] \(sizes from x\), "
                                             r"got shape \(3, 4\)$"):
        square(torch.randn(3, 4, device=DEVICE))
    x = torch.randn(3, 3, device=DEVICE)
    assert_matches(square(x), x.double() * 2)
    with pytest.raises(kgen.CallError, match=r"x: expected f32\[M, M\] = \[4, 4\] \(sizes from x\)"):
        kgen.compile("y = x @ x")(torch.randn(4, 8, device=DEVICE))


def test_out_argument_is_written_and_returned():
    k = kgen.compile("Y = X * 2; Z = X + 1")
    x = torch.randn(3, 4, device=DEVICE)
    y = torch.empty(4, 3, device=DEVICE).t()          # a strided out
    z = torch.empty(3, 4, device=DEVICE)
    ry, rz = k(x, out=(y, z))
    assert ry is y and rz is z
    assert_matches(y, x.double() * 2)
    assert_matches(z, x.double() + 1)
    single = kgen.compile("specs/vector_add.k")
    a, b = torch.randn(10, device=DEVICE), torch.randn(10, device=DEVICE)
    o = torch.empty(10, device=DEVICE)
    assert single(a, b, out=o) is o
    assert_matches(o, a.double() + b.double())


def test_keyword_calls():
    k = kgen.compile("Y = A * B + C")
    a, b, c = (torch.randn(2, 3, device=DEVICE) for _ in range(3))
    want = a.double() * b.double() + c.double()
    assert_matches(k(C=c, A=a, B=b), want)
    assert_matches(k(a, C=c, B=b), want)
    declared = kgen.compile("specs/vector_add.k")
    x, y = torch.randn(5, device=DEVICE), torch.randn(5, device=DEVICE)
    assert_matches(declared(y=y, x=x), x.double() + y.double())


def test_scalar_parameter_default_and_keyword():
    spec = "kernel act(X: f16[N], alpha: f32 = 0.2) -> Y: f16[N] {\n    Y = leaky_relu(X, alpha)\n}\n"
    k = kgen.compile(spec)
    x = torch.randn(50, device=DEVICE).half()
    assert_matches(k(x), F.leaky_relu(x.double(), 0.2))
    assert_matches(k(x, alpha=0.5), F.leaky_relu(x.double(), 0.5))
    assert_matches(k(x, 3), F.leaky_relu(x.double(), 3.0))


def test_one_launch_per_call(watch):
    k = kgen.compile("t = exp(X) * B\nY = t + sigmoid(t)\nZ = t * B")
    x, b = torch.randn(6, 7, device=DEVICE), torch.randn(7, device=DEVICE)
    k(x, b)                                          # specialize first
    launches = watch(k._last.module)
    y, z = k(x, b)
    assert launches.count == 1
    k(x.t().contiguous().t(), b)
    assert launches.count == 2


def test_zero_size_gives_empty_outputs_without_launch(watch):
    k = kgen.compile("Y = X + B; Z = X * 2")
    x, b = torch.randn(0, 5, device=DEVICE), torch.randn(5, device=DEVICE)
    k(torch.randn(2, 5, device=DEVICE), b)
    launches = watch(k._last.module)
    y, z = k(x, b)
    assert launches.count == 0
    assert y.shape == z.shape == (0, 5) and y.dtype == torch.float32
    declared = kgen.compile("specs/vector_add.k")
    launches = watch(declared.module)
    assert declared(torch.empty(0, device=DEVICE), torch.empty(0, device=DEVICE)).shape == (0,)
    assert launches.count == 0


def test_same_text_reuses_module(cache_dir):
    text = "Y = cos(X) * 3 - X  # reuse"
    x = torch.randn(8, device=DEVICE)
    k1 = kgen.compile(text)
    k1(x)
    files = sorted(cache_dir.glob("*.py"))
    k2 = kgen.compile(text)
    k2(x)
    assert k2._last.module is k1._last.module
    assert sorted(cache_dir.glob("*.py")) == files
    d1, d2 = kgen.compile("specs/vector_add.k"), kgen.compile("specs/vector_add.k")
    assert d1.module is d2.module


def test_cache_file_is_reused_across_processes(cache_dir, monkeypatch):
    """A fresh process (no modules in memory) imports the file on disk without rewriting it,
    and rewrites a file whose content does not match its hash."""
    from kgen import runtime
    text = "Y = sin(X) + 0.125"
    x = torch.randn(5, device=DEVICE)
    first = kgen.compile(text)
    first(x)
    source = first.source                          # the source this call ran
    monkeypatch.setattr(runtime, "_modules", {})
    path = next(p for p in cache_dir.glob("*.py") if p.read_text() == source)
    mtime = path.stat().st_mtime_ns
    k = kgen.compile(text)
    assert_matches(k(x), torch.sin(x.double()) + 0.125)
    assert path.stat().st_mtime_ns == mtime
    monkeypatch.setattr(runtime, "_modules", {})
    path.write_text("this is not the generated module\n")
    k = kgen.compile(text)
    assert_matches(k(x), torch.sin(x.double()) + 0.125)
    assert path.read_text() == source


def test_new_shape_reuses_compiled_kernel(cache_dir):
    k = kgen.compile("Y = X * B + 1")
    k(torch.randn(3, 4, device=DEVICE), torch.randn(4, device=DEVICE))
    host, files = k._last._host, sorted(cache_dir.glob("*.py"))
    for m, n in [(5, 7), (2, 3), (17, 33), (0, 3)]:
        x, b = torch.randn(m, n, device=DEVICE), torch.randn(n, device=DEVICE)
        assert_matches(k(x, b), x.double() * b.double() + 1)
        assert k._last._host is host
    assert sorted(cache_dir.glob("*.py")) == files
    # a size-1 axis is part of the key (it broadcasts): that compiles once more, then is reused
    k(torch.randn(3, 1, device=DEVICE), torch.randn(4, device=DEVICE))
    other = k._last._host
    assert other is not host
    k(torch.randn(6, 1, device=DEVICE), torch.randn(9, device=DEVICE))
    assert k._last._host is other


def test_source_and_pattern():
    k = kgen.compile("Y = X * sigmoid(X) + B")
    assert k.pattern == "elementwise"
    assert "@triton.jit" in k.source and "# Y = X * sigmoid(X) + B" in k.source
    d = kgen.compile("specs/vector_add.k")
    assert d.pattern == "elementwise" and "def vector_add(" in d.source
    assert d.inputs == ("x", "y") and d.outputs == ("z",)


# --------------------------------------------------------------------------- int64 offsets

def _meta_launches(module, watch, monkeypatch):
    """Run the host function on meta tensors (shapes and strides, no memory), with the
    launch recorded, not run: checks that look at devices or addresses stand aside."""
    monkeypatch.setattr(module, "_device", lambda *named: torch.device("meta"))
    if hasattr(module, "_overlap"):
        monkeypatch.setattr(module, "_overlap", lambda a, b: False)
    return watch(module, run=False)


def test_int64_decision_for_huge_views(watch, monkeypatch):
    """Offsets past 2**31 need int64: decided per call from shapes and strides.  Checked on
    meta tensors with the launch intercepted, so nothing of that size is allocated or run."""
    k = kgen.compile("specs/vector_add.k")
    launches = _meta_launches(k.module, watch, monkeypatch)
    n = 2**31 + 5
    k(torch.empty(n, device="meta"), torch.empty(n, device="meta"), out=torch.empty(n, device="meta"))
    assert launches.kwargs[-1]["INT64"] is True
    k(torch.empty(1000, device="meta"), torch.empty(1000, device="meta"), out=torch.empty(1000, device="meta"))
    assert launches.kwargs[-1]["INT64"] is False
    # under 2**31 elements, but a hand config's block of 2**20 takes the last one's offsets past it
    n = 2**31 - 2**16 - 1
    big = [torch.empty(n, device="meta") for _ in range(3)]
    k(big[0], big[1], out=big[2])
    assert launches.kwargs[-1]["INT64"] is False and launches.kwargs[-1]["BLOCK_SIZE"] == 1024
    k(big[0], big[1], out=big[2], config={"BLOCK_SIZE": 2**20, "num_warps": 8})
    assert launches.kwargs[-1]["INT64"] is True

    h = kgen.compile("Y = X + 1")
    h(torch.randn(2, 3, device=DEVICE))
    launches = _meta_launches(h._last.module, watch, monkeypatch)
    expanded = torch.empty(1, 1, device="meta").expand(2**16, 2**15 + 1)   # stride 0, > 2**31 elements
    h(expanded)
    assert launches.kwargs[-1]["INT64"] is True
    assert launches.kwargs[-1]["CONTIGUOUS"] is False
    # few elements, but one operand's strides reach past 2**31
    h(torch.empty(3, 2**30, device="meta")[:, :2], out=torch.empty(3, 2, device="meta"))
    assert launches.kwargs[-1]["INT64"] is True
    h(torch.empty(3, 2**20, device="meta")[:, :2], out=torch.empty(3, 2, device="meta"))
    assert launches.kwargs[-1]["INT64"] is False
    assert launches.count == 3


def test_needs_int64_helper():
    k = kgen.compile("specs/vector_add.k")
    needs = k.module._needs_int64
    assert needs(torch.empty(2**31 + 5, device="meta"))
    assert not needs(torch.empty(1).expand(2**31 + 5))             # stride 0: every offset is 0
    assert needs(torch.empty(1).expand(2**31 + 5), torch.empty(2**31 + 5, device="meta"))
    assert needs(torch.empty(3, 2**30, device="meta")[:, :1])       # large stride, 3 elements
    assert not needs(torch.empty(2**20, device="meta"))
    assert not needs(torch.empty(2**31 + 5, device="meta")[:100])  # a big storage, a small view of it
    limit = k.module._SIZE_LIMIT   # a size within reach of 2**31 (a kernel adds a tile or a step to it)
    assert needs(sizes=(3, limit)) and not needs(torch.empty(3), sizes=(3, limit - 1)) and not needs()


def test_host_integer_helpers_match_triton():
    """The generated host's _cdiv and _next_pow2 (plain Python) agree with Triton's."""
    module = kgen.compile("specs/layernorm.k").module
    for n in [*range(1, 3000), 2**31 - 1, 2**31, 2**31 + 1, 3 * 2**40 + 7]:
        assert module._next_pow2(n) == triton.next_power_of_2(n), n
        for d in (1, 7, 64, 1024):
            assert module._cdiv(n, d) == triton.cdiv(n, d), (n, d)
    assert module._next_pow2(0) == 1 and module._cdiv(0, 64) == 0


def _block(launches):
    return launches.kwargs[-1]["BLOCK_SIZE"], launches.kwargs[-1]["num_warps"]


def test_large_contiguous_calls_take_sixteen_warps(watch, monkeypatch):
    """Contiguous calls of WIDE_FROM elements or more take 16 warps and 8 bytes of the widest
    element a thread; smaller or strided calls, broadcasting kernels and a spec's schedule keep
    their blocks.  On meta tensors with the launch recorded, so nothing that size is allocated."""
    from kgen.patterns.elementwise import WIDE_FROM

    def meta(*shape, dtype=torch.float32):
        return torch.empty(*shape, device="meta", dtype=dtype)

    n, rows = WIDE_FROM, WIDE_FROM // 4096
    add = kgen.compile("specs/vector_add.k")
    launches = _meta_launches(add.module, watch, monkeypatch)
    add(meta(n), meta(n), out=meta(n))
    assert _block(launches) == (1024, 16)
    add(meta(n - 16), meta(n - 16), out=meta(n - 16))
    assert _block(launches) == (1024, 4)
    add(meta(2 * n)[::2], meta(n), out=meta(n))
    assert _block(launches) == (1024, 4)

    swiglu = kgen.compile("specs/swiglu_residual.k")
    launches = _meta_launches(swiglu.module, watch, monkeypatch)
    swiglu(*(meta(rows, 4096, dtype=torch.float16) for _ in range(3)), out=meta(rows, 4096, dtype=torch.float16))
    assert _block(launches) == (2048, 16)

    mixed = kgen.compile("Y = A * B")          # f16 and f32 operands: 8 bytes of f32 a thread
    mixed(torch.randn(2, 3, device=DEVICE).half(), torch.randn(2, 3, device=DEVICE))
    launches = _meta_launches(mixed._last.module, watch, monkeypatch)
    mixed(meta(rows, 4096, dtype=torch.float16), meta(rows, 4096), out=meta(rows, 4096))
    assert _block(launches) == (1024, 16)

    bias_gelu = kgen.compile("specs/bias_gelu.k")   # a broadcast operand: no flat path
    launches = _meta_launches(bias_gelu.module, watch, monkeypatch)
    bias_gelu(meta(rows, 4096, dtype=torch.float16), meta(4096, dtype=torch.float16),
              out=meta(rows, 4096, dtype=torch.float16))
    assert _block(launches) == (1024, 4)

    scaled = kgen.compile("Y = X * s")      # a 0-dim operand: one load, the flat path all the same
    scaled(torch.randn(2, 3, device=DEVICE), torch.tensor(2.0, device=DEVICE))
    launches = _meta_launches(scaled._last.module, watch, monkeypatch)
    scaled(meta(rows, 4096), torch.empty((), device="meta"), out=meta(rows, 4096))
    assert _block(launches) == (1024, 16) and launches.kwargs[-1]["CONTIGUOUS"] is True

    scheduled = kgen.compile("""kernel twice(x: f32[N]) -> y: f32[N] {
    y = x * 2
}
schedule twice {
    BLOCK_SIZE = 512
}
""")
    launches = _meta_launches(scheduled.module, watch, monkeypatch)
    scheduled(meta(n), out=meta(n))
    assert _block(launches) == (512, 4)

    for schedule in ("num_warps = 4", "BLOCK_SIZE = 1024", "BLOCK_SIZE = [256, 1024]\n    num_warps = [8, 4]"):
        pinned = kgen.compile(f"kernel twice(x: f32[N]) -> y: f32[N] {{ y = x * 2 }}\n"
                              f"schedule twice {{\n    {schedule}\n}}")
        launches = _meta_launches(pinned.module, watch, monkeypatch)
        pinned(meta(n), out=meta(n))   # the defaults' values given are kept; untuned, lists give their first
        assert _block(launches) == ((1024, 4) if "[" not in schedule else (256, 8)), schedule


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_one_element_operands_take_the_flat_path(shape, device):
    """An operand of one element (0-dim, or every dim 1) beside full ones: the flat path where
    the others are contiguous, the strided one where not, both right."""
    k = kgen.compile("Y = X * s + Z")
    x, z = torch.randn(5, 7, device=device), torch.randn(7, 5, device=device).T
    s = torch.randn(shape, device=device)
    for a, b in ((x, x.contiguous()), (x, z)):
        torch.testing.assert_close(k(a, s, b), a * s + b)
    assert "if CONTIGUOUS:" in k.source


@pytest.mark.gpu
def test_large_contiguous_calls_on_gpu():
    """The 16-warp blocks of large contiguous calls compute every element, the last block's too."""
    n = 2**25 + 2**10 + 3
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    assert torch.equal(kgen.compile("specs/vector_add.k")(x, y), x + y)
    x16, g16, r16 = (torch.randn(2**13 + 1, 4096, device="cuda").half() for _ in range(3))
    assert_matches(kgen.compile("specs/swiglu_residual.k")(x16, g16, r16),
                   r16.double() + F.silu(g16.double()) * x16.double())


@pytest.mark.gpu
def test_int64_offsets_on_gpu():
    """Past 2**31 elements the offsets are int64: the last elements are written, and right."""
    n = 2**31 + 2**12 + 3
    x = torch.zeros(n, dtype=torch.float16, device="cuda")
    x[:4096] = torch.randn(4096, device="cuda").half()
    x[-4096:] = torch.randn(4096, device="cuda").half()
    y = kgen.compile("Y = X * 2 + 1")(x)
    assert_matches(y[:4096], x[:4096].double() * 2 + 1)
    assert_matches(y[-4096:], x[-4096:].double() * 2 + 1)
    del y
    # strided: a transposed view whose strides reach past 2**31
    t = x[: 2**31 + 2].view(2, 2**30 + 1).t()
    z = kgen.compile("Z = T - 1")(t)
    assert_matches(z[-8:], t[-8:].double() - 1)


# --------------------------------------------------------------------------- bf16 (GPU only)

@pytest.mark.gpu
@settings(deadline=None, max_examples=examples(40))
@given(data=st.data())
def test_bf16_random_programs(data):
    prog = data.draw(programs(), label="program")
    out_shape = data.draw(shapes(), label="shape")
    inputs = first_appearance(prog.text, prog.tensors + prog.scalars)
    args = {}
    for name in inputs:
        if name in prog.scalars:
            args[name] = 0.75
            continue
        shape = data.draw(broadcast_of(out_shape), label=f"{name} shape")
        dtype = data.draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), label=f"{name} dtype")
        layout = data.draw(st.sampled_from(LAYOUTS), label=f"{name} layout")
        args[name] = make_tensor(draw_values(data, shape, dtype, nan=True), layout, out_shape, dtype)
    kernel = kgen.compile(prog.text)
    want_eager = eager(prog.text, args)
    if len({tuple(torch.as_tensor(want_eager[o]).shape) for o in kernel.outputs}) > 1:
        return
    got = as_tuple(kernel(*(args[n] for n in inputs)))
    for name, g, w, slack in zip(kernel.outputs, got, evaluate(kernel.ir, args), rounding_slack(kernel.ir, args)):
        assert g.dtype == torch.as_tensor(want_eager[name]).dtype
        assert_matches(g, w, slack=slack)


@pytest.mark.gpu
def test_bf16_casts():
    x = torch.randn(33, 17, device="cuda").bfloat16()
    k = kgen.compile("Y = bf16(X * 3) + f32(X)")
    assert_matches(k(x), (x.double() * 3).bfloat16().double() + x.double())
    assert kgen.compile("Y = silu(X) * X")(x).dtype == torch.bfloat16


_I32 = torch.int32


def test_integers_to_bf16_go_through_f32_as_torch_converts_them():
    """An i32 or bool becomes bf16 as torch converts it, where Triton's interpreter, converting an
    int straight to bf16, read its bits as a bf16's (1 was 0): in a cast, a promotion, a row kernel,
    a store, and of a scalar argument.  (Not 2**24 + 2**16 + 1: see the README on integers past
    2**24, which the GPU rounds once to bf16 where torch rounds them to f32 first.)"""
    c = torch.tensor([1, 2, 3, 100, -5, 0, 2**24 + 1, -(2**24 + 1), 2**24 + 2**17 + 1, 2**31 - 1], dtype=_I32,
                     device=DEVICE)
    one = torch.tensor(1.0, dtype=torch.bfloat16, device=DEVICE)
    bf16_out = kgen.compile("kernel to_bf16(c: i32[N]) -> y: bf16[N] {\n    y = c\n}\n")
    scalar = kgen.compile("kernel scalar_bf16(c: i32[N], n: i32) -> y: bf16[N] {\n    y = bf16(n) + c * 0\n}\n")
    cases = [(kgen.compile("y = bf16(c)")(c), c.to(torch.bfloat16)),
             (kgen.compile("y = c * b")(c, one), c * one),
             (kgen.compile("y = bf16(c > 2)")(c), (c > 2).to(torch.bfloat16)),
             (bf16_out(c), c.to(torch.bfloat16)),
             (kgen.compile("y = c - max(w)")(c[None], torch.zeros(1, 10, dtype=torch.bfloat16, device=DEVICE)),
              c[None].to(torch.bfloat16)),
             (scalar(c, 2**24 + 2**17 + 1), c.new_tensor(2**24 + 2**17 + 1).to(torch.bfloat16).expand(10))]
    for got, want in cases:
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), (got, want)


@pytest.mark.parametrize("text, args, fn", [
    # casts of numbers are typed values (0-dim tensors), never Python numbers in the kernel
    ("y = x * i32(3)", (torch.tensor([1., 2.], dtype=torch.float16),),
     lambda x: x * torch.tensor(3, dtype=_I32)),
    ("y = x + f16(i32(3))", (torch.tensor([1., 2.], dtype=torch.float16),),
     lambda x: x + torch.tensor(3, dtype=_I32).half()),
    ("y = x + exp(i32(2))", (torch.tensor([1., 2.]),), lambda x: x + torch.exp(torch.tensor(2, dtype=_I32))),
    ("y = x + f16(f32(1.5))", (torch.tensor([1., 2.]),), lambda x: x + torch.tensor(1.5).half()),
    ("y = f32(0.0) ** x", (torch.tensor([0., 1., -2.]),), lambda x: torch.tensor(0.0) ** x),
    # an integer tensor to a small float power is squared in f32, not in int32
    ("y = c ** 2.0", (torch.tensor([3, -7, 50000], dtype=_I32),), lambda c: c ** 2.0),
    ("y = (c ** 3.0) ** 0.5", (torch.tensor([3, 7, 2000], dtype=_I32),), lambda c: (c ** 3.0) ** 0.5),
    # ... and a computed base to a small power is a product too, as in torch: exact here, where
    # exp2(2 * log2(15625)) was 15625.0005 and its sin 1e-3 off
    ("y = sin((f32(c) ** 3) ** 2) + (c + 1) ** 2.0", (torch.tensor([5, -4, 7], dtype=_I32),),
     lambda c: torch.sin((c.float() ** 3) ** 2) + (c + 1) ** 2.0),
    # math on numbers alone: torch's values (1 / 0 is inf), not Python's errors at compile time
    ("y = x * (1 / 0)", (torch.tensor([1., -2.]),), lambda x: x * math.inf),
    ("y = x + 0.0 * (1 / 0)", (torch.tensor([1., -2.]),), lambda x: x + math.nan),
    ("y = x * (65536 * 65536)", (torch.tensor([1., -2.]),), lambda x: x * 65536 * 65536),
    ("y = x + (2147483647 + 1)", (torch.tensor([1, 2], dtype=_I32),), lambda x: x + 2147483648.0),
    ("y = x * exp(1.0) - (-(2 ** 0.5))", (torch.tensor([1., -2.]),), lambda x: x * math.e + 2 ** 0.5),
    ("y = where(1 < 2, x, 0.0)", (torch.tensor([1., -2.]),), lambda x: x),
    # integer powers of numbers alone are Python's: exact, a float past int32 or for a negative exponent
    ("y = x ** 2 ** 3", (torch.tensor([1., -2.]),), lambda x: x ** 2 ** 3),
    ("y = c * 2 ** 3 - (-3) ** 3", (torch.tensor([1, -2], dtype=_I32),), lambda c: c * 2 ** 3 - (-3) ** 3),
    ("y = c * 2 ** -1", (torch.tensor([1, -2], dtype=_I32),), lambda c: c * 2 ** -1),
    ("y = x * 3 ** 40", (torch.tensor([1., -2.]),), lambda x: x * float(3 ** 40)),
    # -2147483648 is int32's least, an integer (2147483648 alone is past int32, a float)
    ("y = c + -2147483648", (torch.tensor([1, -2], dtype=_I32),), lambda c: c + -2147483648),
    ("y = c + -(2147483648) - --2147483648", (torch.tensor([1, -2], dtype=_I32),),
     lambda c: c + -2147483648 - 2147483648.0),
    # a float cast to i32 is the integer itself, not the float rounded to f32 first (123456792)
    ("y = c + i32(123456789.0) - i32(-7.9)", (torch.tensor([0, 1], dtype=_I32),),
     lambda c: c + torch.tensor(123456789.0, dtype=torch.float64).int() - torch.tensor(-7.9).int()),
    ("y = c + i32(2147483600.0)", (torch.tensor([0, 1], dtype=_I32),),
     lambda c: c + torch.tensor(2147483600.0, dtype=torch.float64).int()),
])
def test_numbers_and_their_casts_compute_as_in_torch(text, args, fn):
    """Math on numbers alone is folded as the reference computes it, so the kernel never
    evaluates Python arithmetic on numbers (which raised on 1 / 0 and left int32 on
    65536 * 65536), and a cast number is a typed value: both agree with torch."""
    args = tuple(a.to(DEVICE) for a in args)
    got = kgen.compile(text)(*args)
    want = fn(*args)
    close = torch.allclose(got, want, rtol=1e-6, equal_nan=True) if want.is_floating_point() else torch.equal(got, want)
    assert got.dtype == want.dtype and close, (got, want)


@pytest.mark.parametrize("text, fn", [
    ("y = x + b / c", lambda x, b, c: x + b / c),
    ("y = x + 1 / (b * c)", lambda x, b, c: x + 1 / (b * c)),
    ("y = x + f32(bool(b)) - i32(bool(c))", lambda x, b, c: x + b.bool().float() - c.bool().int()),
    ("y = x * (b + c ** -1)", lambda x, b, c: x * (b + c ** -1)),
    ("y = x * ((b + c) ** -1 - c ** -2)", lambda x, b, c: x * ((b + c) ** -1 - c ** -2)),
])
@pytest.mark.parametrize("b, c", [(2.0, 0.0), (-2.5, 0.0), (math.nan, 0.0), (0.0, 3.0), (0.0, -0.0)])
def test_math_on_float_arguments_alone_computes_as_torch_does(text, fn, b, c):
    """Float arguments stay Python floats on Triton's interpreter: their quotient by 0.0 (b / c,
    c ** -1) raised ZeroDivisionError and bool(b) was a Python bool with no .to for the cast around it; the
    GPU computes both as torch does (inf, NaN, True), and so does the interpreter now."""
    x = torch.tensor([1.0, -2.0], device=DEVICE)
    got = kgen.compile(text)(x, b, c)
    want = fn(x.double(), torch.tensor(b, dtype=torch.float64), torch.tensor(c, dtype=torch.float64))
    assert torch.allclose(got.double(), want, rtol=1e-6, equal_nan=True), (got, want)


@pytest.mark.parametrize("text, args, ulps", [
    # products and reciprocals, as torch computes these powers: within an ulp or two (a GPU's f32
    # division, Triton's `/`, is div.full.f32, within 2 ulps where torch's rounds correctly)
    ("y = x ** 1", (), 0), ("y = x ** 2", (), 0.5), ("y = x ** 3", (), 1), ("y = x ** -1", (), 1),
    ("y = x ** -2", (), 1.5), ("y = (x * 2) ** -2", (), 1.5), ("y = x ** p", (1.0,), 0), ("y = x ** p", (2.0,), 0.5),
    ("y = x ** p", (3.0,), 1), ("y = x ** p", (-1.0,), 1), ("y = x ** p", (-2.0,), 1.5),
    ("y = x ** 4", (), 2), ("y = x * 0 + 10.0 ** p", (2.0,), 0),
    # exp2(y * log2|x|) in f32 elsewhere: its error grows with |y * log2|x||
    ("y = x ** 5", (), POW_ULPS), ("y = x ** 2.5", (), POW_ULPS), ("y = x ** -3.75", (), POW_ULPS),
    ("y = x ** p", (-7.0,), POW_ULPS), ("y = x ** e", "tensor", POW_ULPS),
    ("y = x * 0 + 10.0 ** (e * 4)", "tensor", POW_ULPS)])
def test_f32_powers_are_within_their_ulps(text, args, ulps):
    """x ** 1 is x and 10 ** 2 is 100, as in torch, whose pow computes these as products and
    reciprocals (powf's exp2(log2) had been 5 ulps off for x ** 1); other powers stay within
    POW_ULPS of the exact power, over f32's range."""
    x = torch.cat([torch.logspace(-7, 7, 57), -torch.logspace(-3, 3, 13), torch.arange(1.0, 40.0)]).to(DEVICE)
    if args == "tensor":
        args = (torch.linspace(-5.0, 5.0, x.numel(), device=DEVICE).round(),)
    got = kgen.compile(text)(x, *args).double()
    scope = {"x": x.double(), "p": args[0] if args else None,
             "e": args[0].double() if args and torch.is_tensor(args[0]) else None}
    want = eval(text.split("=", 1)[1], scope)
    want = want.float().double()   # the exact power's f32 value: infinities and zeros where f32 has them
    finite = want.isfinite() & (want != 0)
    torch.testing.assert_close(got[~finite], want[~finite], rtol=0, atol=0, equal_nan=True)
    error = ((got - want)[finite].abs() / (want[finite].abs() * 2.0 ** -23)).max().item()
    assert error <= ulps, (text, error)


@pytest.mark.parametrize("text", ["y = x ** p", "y = x ** (p * 1.0)"])
@pytest.mark.parametrize("p", [0.5, -0.5, 1.5, 2.0, -1.0])
def test_a_number_exponent_computes_as_torch_takes_one(text, p):
    """torch takes a Python-number exponent its own way (x ** 0.5 is sqrt(x): (-inf) ** 0.5
    is NaN, (-0.0) ** 0.5 is -0.0, where a tensor exponent gives IEEE pow's inf and 0.0);
    a scalar argument is such a number, as is math on one."""
    x = special_values(torch.float32)
    got = kgen.compile(text)(x, p)
    want = (x.double() ** p).float()
    assert torch.allclose(got, want, rtol=1e-5, atol=0, equal_nan=True), (x, got, want)
    finite_zero = (want == 0)
    assert torch.equal(torch.signbit(got[finite_zero]), torch.signbit(want[finite_zero]))


@pytest.mark.parametrize("text", [
    "kernel g(x: f32[N]) -> (y: f16[N], z: f32[N]) { h = x * 2; y = h; z = h + 1 }",
    "kernel g(x: f32[M, N]) -> (y: f16[M, N], z: f32[M, N]) { h = x * 2; y = h; z = h - max(h) }",
])
def test_a_value_given_a_second_name_is_read_by_the_name_the_spec_reads(text):
    """An output naming an earlier value (y = h, stored as f16) leaves the statements after it
    reading h, as their comments say: z = h + 1 under # z = h + 1, never z = y + 1."""
    k = kgen.compile(text)
    lines = [line.strip() for line in k.source.splitlines()]
    under = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith("# z = ")]
    assert under and all(code.startswith("z = ") and " h" in code and " y" not in code for code in under), under
    x = torch.randn(3, 5, device=DEVICE) * 1000
    x = x.reshape(-1) if "x: f32[N]" in text else x
    y, z = k(x)
    h = x * 2
    assert torch.equal(y, h.half())
    torch.testing.assert_close(z, h + 1 if "+ 1" in text else h - h.amax(-1, keepdim=True))


@pytest.mark.parametrize("shapes", [((3, 1), (3, 1)), ((1, 4), (1, 4)), ((2, 1, 4), (2, 1, 4)),
                                    ((2, 1, 1, 5), (1, 1, 1, 5)), ((1, 1), (1, 1)), ((), ()), ((2, 3, 4), (3, 1))])
def test_axes_of_size_one_take_no_coordinates(shapes):
    """An output axis whose size is 1 has coordinate 0, which no operand's offsets read: the
    block function splits offs over the other axes only, and takes no size it does not read."""
    import ast
    a, b = torch.randn(shapes[0], device=DEVICE), torch.randn(shapes[1], device=DEVICE)
    if b.dim() > 1:   # column-major: the strided path
        b = b.mT.contiguous().mT
    k = kgen.compile("y = a * b")
    assert torch.equal(k(a, b), a * b)
    fn = next(node for node in ast.parse(k.source).body
              if isinstance(node, ast.FunctionDef) and node.name == "_y_block")
    names = [n for n in ast.walk(fn) if isinstance(n, ast.Name)]
    read = {n.id for n in names if isinstance(n.ctx, ast.Load)}
    assert {n.id for n in names if isinstance(n.ctx, ast.Store)} <= read
    assert {a.arg for a in fn.args.args if a.arg.startswith("size")} <= read


def test_a_comment_that_says_kernel_does_not_start_a_header():
    x = torch.randn(5, device=DEVICE)
    for text in ("# kernel to scale x\ny = x * 2", "#kernel y\ny = x * 2", "# schedule: none\ny = x * 2"):
        assert torch.equal(kgen.compile(text)(x), x * 2), text


@pytest.mark.parametrize("text", ["y = sqrt(x)", "y = rsqrt(x)", "y = sin(x)", "y = exp2(x)", "y = x ** 0.5",
                                  "y = x ** -0.5", "y = x ** p", "y = x ** 1.5", "y = exp(x)"])
def test_subnormals_in_and_out_as_torch_keeps_them(text):
    """torch keeps f32 subnormals (2**-149 to 2**-126) on the GPU; the GPU's approximate
    sqrt, rsqrt, sin and exp2 flush them to zero unless kgen scales them into range."""
    tiny = [2.0 ** -149, 1e-42, 1e-40, 5e-39, 1.1e-38, 1.2e-38, 1e-30, 1e-20, 0.001, 0.1]
    x = torch.tensor(tiny + [-v for v in tiny] + [-126.5, -130.0, -148.5, -149.5, 0.0, -0.0, 1e38], device=DEVICE)
    k = kgen.compile(text)
    got = k(x, 1.5) if "p" in k.inputs else k(x)
    want = evaluate(k._last.ir, {"x": x.double(), "p": 1.5})[0].float()
    finite = want.isfinite()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~finite & ~want.isnan()],
                                                                    want[~finite & ~want.isnan()]), (got, want)
    # (powf's exp2(y * log2 |x|) loses a few ulps as |y * log2 |x|| grows)
    close = (got[finite] - want[finite]).abs() <= 1e-5 * want[finite].abs() + 2.0 ** -146
    assert close.all(), (x[finite][~close], got[finite][~close], want[finite][~close])
    assert torch.equal(torch.signbit(got[want == 0]), torch.signbit(want[want == 0]))


def test_a_folded_number_to_a_scalar_power():
    """A base of numbers alone (folded to one) to a weak exponent (math on a scalar argument):
    the reference takes them as torch takes a Python number to a Python number power."""
    k = kgen.compile("t = abs((sigmoid(0.5) + 0.5) ** clamp(s, -2, 2))\nY = 0.5 + t + relu(A)")
    a = torch.randn(7, device=DEVICE)
    for s in (0.75, -3.0, 2.5):
        base = torch.sigmoid(torch.tensor(0.5, dtype=torch.float64)) + 0.5
        want = 0.5 + (base ** min(max(s, -2.0), 2.0)).abs() + torch.relu(a.double())
        assert_matches(k(s, a), want)
        assert_matches(k(s, a), evaluate(k._last.ir, {"s": s, "A": a})[0])


@pytest.mark.parametrize("n", [1, 15, 16, 17, 47, 48, 49])
@pytest.mark.parametrize("layout", ["flat", "strided"])
def test_whole_blocks_run_unmasked_and_the_last_one_masked(n, layout):
    """Blocks wholly inside the output take the unmasked path, the last partial one the
    masked path (blocks of 16 here): every element is computed once and nothing past the
    output's end, or between a strided output's elements, is read into it or written."""
    k = kgen.compile("y = x * sigmoid(x) + b")
    buffer = torch.full((2 * n + 5,), float("nan"), device=DEVICE)
    x = torch.linspace(-3, 3, n, dtype=torch.float64).to(DEVICE, torch.float32)
    b = 0.5
    out = buffer[:n] if layout == "flat" else buffer[1:2 * n + 1:2]
    got = k(x, b, out=out, config={"BLOCK_SIZE": 16, "num_warps": 1})
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, x * torch.sigmoid(x) + b)
    written = torch.zeros_like(buffer, dtype=torch.bool)
    written[:n] = layout == "flat"
    written[1:2 * n + 1:2] |= layout == "strided"
    assert torch.isnan(buffer[~written]).all()
