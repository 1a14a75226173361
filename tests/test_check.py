"""check: names, dtypes (torch's promotion), symbolic shapes, broadcasting, reductions,
matmul, and the headerless form's inputs and outputs."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kgen.dtypes as D
from kgen.check import Arg, check, headerless_inputs
from kgen.errors import SpecError
from kgen.ir import Op, format_ir
from kgen.parse import parse

from conftest import examples

DTYPES = [D.BOOL, D.I32, D.F16, D.BF16, D.F32]
FLOATS = [D.F16, D.BF16, D.F32]


def checked(text: str, *args: Arg):
    """The IR of the one kernel in ``text`` (headerless: typed by ``args``)."""
    module = parse(text)
    (kir,) = check(module, {"kernel": tuple(args)} if module.kernels[0].headerless else None)
    return kir


def tensor(dtype, rank=1):
    return Arg(dtype, (False,) * rank)


def number(dtype):
    return Arg(dtype, None)


def example(dtype: D.DType, kind: str):
    """What torch sees for an operand: a tensor with dims, a 0-dim tensor, a Python number."""
    if kind == "tensor":
        return torch.ones(2, dtype=dtype.torch)
    if kind == "0-dim":
        return torch.ones((), dtype=dtype.torch)
    return 1.5 if dtype.is_float else 2


def arg(dtype, kind):
    return {"tensor": tensor(dtype), "0-dim": Arg(dtype, ()), "number": number(dtype)}[kind]


KINDS = ["tensor", "0-dim", "number"]
PAIRS = [(a, ka, b, kb) for (a, ka), (b, kb) in itertools.product(
    [(d, k) for d in [D.I32, *FLOATS] for k in KINDS if k != "number" or d in (D.I32, D.F32)], repeat=2)
    if not (ka == kb == "number")]


@pytest.mark.parametrize("op", ["+", "-", "*"])
@pytest.mark.parametrize("a, ka, b, kb", PAIRS, ids=lambda v: getattr(v, "name", v))
def test_promotion_matches_torch(op, a, ka, b, kb):
    kir = checked(f"Y = A {op} B", arg(a, ka), arg(b, kb))
    want = torch.result_type(example(a, ka), example(b, kb))
    assert kir.outputs[0].node.dtype.torch == want


@pytest.mark.parametrize("a, ka, b, kb", PAIRS, ids=lambda v: getattr(v, "name", v))
def test_division_and_functions_promote_as_torch(a, ka, b, kb):
    x, y = example(a, ka), example(b, kb)
    div = checked("Y = A / B", arg(a, ka), arg(b, kb)).outputs[0].node.dtype
    assert div.torch == (x / y).dtype
    if ka != "number" and kb != "number":
        mx = checked("Y = maximum(A, B)", arg(a, ka), arg(b, kb)).outputs[0].node.dtype
        assert mx.torch == torch.maximum(x, y).dtype
        w = checked("Y = where(C > 0, A, B)", tensor(D.F32), arg(a, ka), arg(b, kb)).outputs[0].node.dtype
        assert w.torch == torch.where(torch.ones(2, dtype=torch.bool), x, y).dtype


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_float_functions_of_integers_are_f32_and_casts_take_their_dtype(dtype):
    kir = checked("Y = exp(A); Z = f16(A); W = A > 1; V = abs(A); U = bf16(A) * 2", tensor(dtype))
    y, z, w, v, u = (o.node.dtype for o in kir.outputs)
    assert y.torch == torch.exp(torch.ones(2, dtype=dtype.torch)).dtype
    assert z is D.F16 and w is D.BOOL and v is dtype and u is D.BF16


def test_promotion_in_a_declared_kernel_with_literals_and_scalar_parameters():
    text = """kernel k(X: f16[N], I: i32[N], s: f32, n: i32) -> (A, B, C, D, E, F) {
    A = X * 2.5
    B = X * s
    C = I * 2
    D = I * s
    E = I + n
    F = X + I
}"""
    (kir,) = check(parse(text))
    x16, i32 = torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.int32)
    want = [torch.result_type(x16, 2.5), torch.result_type(x16, 1.5), torch.result_type(i32, 2),
            torch.result_type(i32, 1.5), torch.result_type(i32, 2), torch.result_type(x16, i32)]
    assert [o.node.dtype.torch for o in kir.outputs] == want
    assert kir.params[2].is_scalar and kir.params[2].dtype is D.F32


@pytest.mark.parametrize("declared", ["f16[N]", "f16"])
def test_declared_output_dtype_is_a_cast_on_store(declared):
    """With or without its shape, a declared output type casts what the body computes."""
    (kir,) = check(parse(f"kernel k(X: f32[N]) -> Y: {declared} {{\n    Y = X * 2\n}}\n"))
    node = kir.outputs[0].node
    assert node.dtype is D.F16 and node.op is Op.CAST and node.inputs[0].dtype is D.F32
    assert node.shape == ("N",)


def test_declared_broadcasting_shapes():
    text = """kernel k(X: f32[M, N], b: f32[N], c: f32[M, 1], s: f32[]) -> (Y, Z, W) {
    Y = X + b
    Z = c * b
    W = s + c
}"""
    (kir,) = check(parse(text))
    assert [o.node.shape for o in kir.outputs] == [("M", "N"), ("M", "N"), ("M", 1)]


@settings(deadline=None, max_examples=examples(150))
@given(st.data())
def test_headerless_broadcast_shapes_match_torch(data):
    """Shapes drawn with size-1 axes and dropped leading axes; kgen's symbolic result,
    with each symbol replaced by its size, is torch.broadcast_shapes of the inputs."""
    rank = data.draw(st.integers(0, 4))
    out = data.draw(st.lists(st.sampled_from([2, 3, 5]), min_size=rank, max_size=rank))
    shapes = []
    for _ in range(data.draw(st.integers(1, 3))):
        drop = data.draw(st.integers(0, rank))
        shapes.append(tuple(1 if data.draw(st.booleans()) else d for d in out[drop:]))
    names = ["A", "B", "C"][:len(shapes)]
    kir = checked("Y = " + " + ".join(names), *(Arg(D.F32, tuple(s == 1 for s in shape)) for shape in shapes))
    sizes = {}
    for p, shape in zip(kir.params, shapes):
        assert len(p.shape) == len(shape)
        for d, s in zip(p.shape, shape):
            if isinstance(d, str):
                assert sizes.setdefault(d, s) == s, "one symbol, two sizes"
            else:
                assert d == s == 1
    got = tuple(sizes.get(d, d) for d in kir.outputs[0].node.shape)
    assert got == tuple(torch.broadcast_shapes(*shapes))


def test_headerless_dims_are_unified_and_named():
    kir = checked("Y = X * sigmoid(X) + B", tensor(D.F32, 2), tensor(D.F32, 1))
    x, b = kir.params
    assert x.shape == ("M", "N") and b.shape == ("N",)
    assert kir.outputs[0].node.shape == ("M", "N")
    assert "kernel y(X: f32[M, N], B: f32[N]) -> Y: f32[M, N]" in format_ir(kir)


def test_a_list_kernels_ir_shows_its_outputs_as_lists():
    kir = check(parse("kernel g(A: [f16[M, K]], B: [f16[K, N]]) -> C: [f16[M, N]] { C = A @ B }"))[0]
    assert format_ir(kir).splitlines()[0] == "kernel g(A: [f16[M, K]], B: [f16[K, N]]) -> C: [f16[M, N]]"


def test_headerless_dim_names_avoid_value_names():
    kir = checked("N = M * 2", tensor(D.F32, 2))
    assert not {"M", "N"} & set(kir.params[0].shape)


@pytest.mark.parametrize("axis, shape", [(-1, ("M", 1)), (1, ("M", 1)), (0, (1, "N")), (-2, (1, "N"))])
@pytest.mark.parametrize("fn", ["sum", "max", "min", "mean"])
def test_reductions_keep_the_axis(fn, axis, shape):
    (kir,) = check(parse(f"kernel r(X: f16[M, N]) -> Y {{\n    Y = {fn}(X, axis={axis})\n}}\n"))
    node = kir.outputs[0].node
    assert node.shape == shape and node.arg == axis % 2
    assert node.dtype.torch == getattr(torch.ones(2, 3, dtype=torch.float16), {"max": "amax", "min": "amin"}.get(
        fn, fn))(axis, keepdim=True).dtype


def test_reduction_default_axis_and_broadcast_back():
    (kir,) = check(parse("kernel r(X: f32[M, N]) -> Y {\n    Y = X - max(X)\n}\n"))
    node = kir.outputs[0].node
    assert node.shape == ("M", "N")
    assert node.inputs[1].op is Op.MAX and node.inputs[1].arg == 1 and node.inputs[1].shape == ("M", 1)


@pytest.mark.parametrize("a, b, out", [
    ("f16[M, K]", "f16[K, N]", ("M", "N")),
    ("f16[L, M, K]", "f16[L, K, N]", ("L", "M", "N")),
    ("f16[M, K]", "f16[L, K, N]", ("L", "M", "N")),
    ("f32[1, M, K]", "f32[L, K, N]", ("L", "M", "N")),
    ("f16[64, 32]", "f16[32, N]", (64, "N")),
])
def test_matmul_shapes(a, b, out):
    (kir,) = check(parse(f"kernel m(A: {a}, B: {b}) -> C {{\n    C = A @ B\n}}\n"))
    node = kir.outputs[0].node
    assert node.op is Op.MATMUL and node.shape == out and node.dtype.name == a[:3]


def test_headerless_matmul_unifies_the_inner_dimension():
    kir = checked("C = A @ B", tensor(D.F16, 2), tensor(D.F16, 2))
    a, b = kir.params
    assert a.shape[1] == b.shape[0] and kir.outputs[0].node.shape == (a.shape[0], b.shape[1])


def test_headerless_inputs_and_outputs_order():
    (k,) = parse("t = B * X; Y = t + A\nZ = Y * 2; W = t - C\nV = exp(A)").kernels
    inputs, outputs = headerless_inputs(k)
    assert inputs == ("B", "X", "A", "C")        # first appearance
    assert outputs == ("Z", "W", "V")            # assigned and never read later, in order


def test_headerless_a_name_read_before_assignment_is_an_input():
    (k,) = parse("Y = X + 1\nX2 = Y * X").kernels
    assert headerless_inputs(k) == (("X",), ("X2",))
    with pytest.raises(SpecError, match="'X' is read before it is assigned, so it is an input"):
        headerless_inputs(parse("Y = X + 1\nX = Y").kernels[0])


def test_headerless_inputs_are_parameters_in_order():
    kir = checked("Y = B * A + B", tensor(D.F32), tensor(D.F16))
    assert [p.name for p in kir.params] == ["B", "A"]
    assert [p.dtype for p in kir.params] == [D.F32, D.F16]
    scalar = checked("Y = X * s", tensor(D.F16), number(D.F32))
    assert scalar.params[1].is_scalar and scalar.outputs[0].node.dtype is D.F16


def test_nodes_reached_twice_are_one_node():
    kir = checked("t = exp(X)\nY = t * t", tensor(D.F32))
    y = kir.outputs[0].node
    assert y.inputs[0] is y.inputs[1]


def test_statement_source_is_one_line_without_comments():
    text = "kernel k(X: f32[N]) -> Y {\n    Y = where(X > 0,   # positive\n              X, 0)\n}\n"
    (kir,) = check(parse(text))
    assert kir.stmts[0].source == "Y = where(X > 0, X, 0)"


def test_schedule_reaches_the_ir():
    text = "kernel k(X: f32[N]) -> Y {\n    Y = X\n}\nschedule k {\n    BLOCK_SIZE = [64, 128]\n    num_warps = 4\n}\n"
    (kir,) = check(parse(text))
    assert kir.schedule == {"BLOCK_SIZE": (64, 128), "num_warps": (4,)}


TRIPLES = [(x, kx, lo, klo, hi, khi) for (x, kx), (lo, klo), (hi, khi) in itertools.product(
    [(d, k) for d in [D.BOOL, D.I32, D.F16, D.F32] for k in ("tensor", "0-dim")], repeat=3)
    if x is not D.BOOL and D.BOOL not in (lo, hi)]


@pytest.mark.parametrize("x, kx, lo, klo, hi, khi", TRIPLES, ids=lambda v: getattr(v, "name", v))
def test_three_operand_promotion_is_one_shot_as_torch(x, kx, lo, klo, hi, khi):
    """clamp(x, lo, hi) promotes its three operands at once, as torch.clamp does (not pairwise:
    i32 with a 0-dim f32 and an f16 tensor is f16)."""
    kir = checked("Y = clamp(A, B, C)", arg(x, kx), arg(lo, klo), arg(hi, khi))
    want = torch.clamp(example(x, kx), example(lo, klo), example(hi, khi)).dtype
    assert kir.outputs[0].node.dtype.torch == want


@pytest.mark.parametrize("x, lo, hi", [(D.I32, "0.5", D.F16), (D.F16, "2", D.I32), (D.I32, "1", D.I32)])
def test_three_operand_promotion_with_a_literal(x, lo, hi):
    kir = checked(f"Y = clamp(A, {lo}, B)", tensor(x), tensor(hi))
    number = float(lo) if "." in lo else int(lo)
    want = torch.clamp(example(x, "tensor"), torch.tensor(number, dtype=torch.float32 if isinstance(number, float)
                                                          else torch.int32), example(hi, "tensor")).dtype
    assert kir.outputs[0].node.dtype.torch == want
