"""The tiled GEMM pattern: `C = epilogue(A @ B)`, against the float64 reference and torch.

Without a GPU the kernels run on Triton's interpreter with its config (32 x 32 x 32
tiles, GROUP_M = 2), so the sizes drawn here (1, primes, 31 / 32 / 33, 64 / 65, 97)
cross tile boundaries on every axis.  Tolerances scale with K through |A| @ |B|,
the bound on what f32 accumulation (or TF32 rounding) can be off by.
"""
from __future__ import annotations

import ast
import copy
import inspect
import json
import pickle
import re
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import triton
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgen
from kgen import autotune
from kgen.patterns import gemm
from kgen.pipeline import generate
from kgen.reference import evaluate

from conftest import DEVICE, HAS_CUDA, examples

ROOT_SPECS = Path(__file__).resolve().parent.parent / "specs"

SETTINGS = settings(deadline=None, max_examples=examples(25), suppress_health_check=[HealthCheck.too_slow])
SIZES = st.sampled_from([1, 2, 3, 7, 13, 16, 31, 32, 33, 47, 64, 65, 97])
DTYPES = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}
# Relative error of the stored result, per output dtype (rounding, plus an f16
# rounding inside the epilogue where the spec casts).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}
# Per unit of |A| @ |B|: f32 accumulation on the interpreter / IEEE, TF32 on a GPU.
# "operand16": a prologue's result rounded to a 16-bit operand (the reference keeps it exact).
ACC_EPS = {"ieee": 2.0 ** -22, "tf32": 2.0 ** -9, "operand16": 2.0 ** -10}


@lru_cache(maxsize=None)
def compiled(text: str):
    return kgen.compile(text)


def randn(*shape, dtype=torch.float32, transposed=False, scale=1.0):
    """A tensor of ``shape``; ``transposed`` makes its last two axes column-major (strides only)."""
    if transposed and len(shape) >= 2:
        t = torch.randn(*shape[:-2], shape[-1], shape[-2]) * scale
        return t.to(device=DEVICE, dtype=dtype).transpose(-1, -2)
    return (torch.randn(*shape) * scale).to(device=DEVICE, dtype=dtype)


def bound(a, b):
    """|a| @ |b| in float64: what an element of a @ b can be off by, per unit of eps."""
    return a.double().abs() @ b.double().abs()


def assert_close(got, want, err_bound, precision="ieee", factor=1.0):
    """|got - want| <= rtol * |want| + eps * (|A| @ |B|) * factor (+ a denormal floor)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    want = want.double()
    if precision == "ieee" and got.is_cuda:
        precision = "tf32"      # on a GPU, f32 operands run on TF32 tensor cores unless a schedule says ieee
    diff = (got.double() - want).abs()
    tol = RTOL[got.dtype] * want.abs() + ACC_EPS[precision] * err_bound * factor + 1e-6
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got.double()), finite), "non-finite values differ"
    bad = (diff > tol) & finite
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} elements off; worst {diff[finite].max().item():.3g}, "
                           f"at {bad.nonzero()[0].tolist()}: got {got.double()[bad][0].item()}, "
                           f"want {want[bad][0].item()}")


def check(text, *args, factor=1.0, precision="ieee", a=0, b=1):
    """Run a headerless spec and compare every output with the float64 reference."""
    k = compiled(text)
    got = k(*args)
    got = got if isinstance(got, tuple) else (got,)
    want = evaluate(k.ir, dict(zip(k.inputs, args)))
    assert k.pattern == "gemm"
    err = bound(args[a], args[b])
    for g, w in zip(got, want):
        assert_close(g, w, err, precision, factor)
    return got


# --- the headline kernels, against torch -----------------------------------------------------

def test_leaky_relu_of_matmul_matches_torch():
    k = compiled("C = leaky_relu(A @ B)")
    a, b = randn(65, 47, dtype=torch.float16), randn(47, 33, dtype=torch.float16)
    c = k(a, b)
    assert c.dtype == torch.float16 and c.shape == (65, 33)
    assert_close(c, F.leaky_relu(a.float() @ b.float(), 0.01), bound(a, b))


@pytest.mark.parametrize("alpha", [-0.5, float("inf"), float("nan")])
def test_leaky_relu_of_a_zero_product_is_torchs(alpha):
    """A product of zeros is +0.0: leaky_relu gives alpha * 0 there as torch does."""
    k = compiled("C = leaky_relu(A @ B, alpha)")
    a, b = torch.zeros(9, 7, dtype=torch.float16, device=DEVICE), randn(7, 5, dtype=torch.float16)
    got, want = k(a, b, alpha), F.leaky_relu(a @ b, alpha)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    number = ~want.isnan()   # (a NaN's sign bit means nothing)
    assert torch.equal(got[number].signbit(), want[number].signbit()), got


def test_linear_gelu_matches_torch():
    k = compiled("C = gelu(A @ W + b)")
    x, w, bias = randn(33, 70), randn(70, 31), randn(31)
    assert_close(k(x, w, bias), F.gelu(F.linear(x, w.t(), bias)), bound(x, w))


def test_spec_matmul_leaky_relu_with_alpha():
    k = kgen.compile("specs/matmul_leaky_relu.k")
    a, b = randn(40, 97, dtype=torch.float16), randn(97, 50, dtype=torch.float16)
    for alpha in (0.01, 0.2):
        c = k(a, b, alpha)
        assert_close(c, F.leaky_relu(a.double() @ b.double(), alpha), bound(a, b))
    assert_close(k(a, b), F.leaky_relu(a.double() @ b.double(), 0.01), bound(a, b))


def test_spec_linear_gelu():
    k = kgen.compile("specs/linear_gelu.k")
    x, w, bias = (randn(17, 64, dtype=torch.float16), randn(64, 45, dtype=torch.float16),
                  randn(45, dtype=torch.float16))
    assert_close(k(x, w, bias), F.gelu(x.double() @ w.double() + bias.double()), bound(x, w))


def test_spec_bmm_with_row_scale_and_residual():
    k = kgen.compile("specs/bmm.k")
    a, w = randn(3, 33, 20, dtype=torch.float16), randn(3, 20, 47, dtype=torch.float16)
    scale, r = randn(3, 33, 1), randn(3, 33, 47, dtype=torch.float16)
    want = scale.double() * (a.double() @ w.double()) + r.double()
    assert_close(k(a, w, scale, r), want, bound(a, w), factor=4.0)


# --- properties: shapes, strides, batches, epilogues, dtypes -----------------------------------

EPILOGUES = {
    # spec, extra inputs (name -> shape builder from (batch, M, N)), max |d epilogue / d acc|
    "C = A @ B": ({}, 1.0),
    "C = leaky_relu(A @ B)": ({}, 1.0),
    "C = leaky_relu(A @ B, 0.2)": ({}, 1.0),
    "C = relu(A @ B)": ({}, 1.0),
    "C = gelu(A @ B + b)": ({"b": lambda bt, m, n: (n,)}, 1.2),
    "C = gelu_tanh(A @ B)": ({}, 1.2),
    "C = silu(A @ B)": ({}, 1.2),
    "C = sigmoid(A @ B) * 3.0": ({}, 1.0),
    "C = clamp(A @ B, -2.0, 3.0)": ({}, 1.0),
    "C = (A @ B) * s": ({"s": lambda bt, m, n: (m, 1)}, 4.0),
    "C = A @ B + R": ({"R": lambda bt, m, n: bt + (m, n)}, 1.0),
    "C = f16(A @ B) * 2.0": ({}, 2.0),
    "C = f32(A @ B) - 0.5": ({}, 1.0),
}


@st.composite
def problems(draw):
    m, n, k = draw(SIZES), draw(SIZES), draw(SIZES)
    batch = draw(st.sampled_from(["", "both", "left", "right", "left1"]))
    nb = draw(st.sampled_from([2, 3]))
    a_batch = (nb,) if batch in ("both", "left") else (1,) if batch == "left1" else ()
    b_batch = (nb,) if batch in ("both", "right", "left1") else ()
    return (m, n, k, a_batch, b_batch, draw(st.booleans()), draw(st.booleans()),
            draw(st.sampled_from(sorted(EPILOGUES))), draw(st.sampled_from(["f16", "f32"])))


@SETTINGS
@given(problems())
@pytest.mark.filterwarnings("ignore::RuntimeWarning")      # exp overflowing inside sigmoid / tanh: finite results
def test_gemm_matches_reference(problem):
    m, n, k, a_batch, b_batch, a_t, b_t, text, dtype = problem
    dt = DTYPES[dtype]
    a = randn(*a_batch, m, k, dtype=dt, transposed=a_t)
    b = randn(*b_batch, k, n, dtype=dt, transposed=b_t)
    out_batch = tuple(torch.broadcast_shapes(a_batch, b_batch))
    extras, lipschitz = EPILOGUES[text]
    inputs = [randn(*shape(out_batch, m, n)) for shape in extras.values()]
    (c,) = check(text, a, b, *inputs, factor=lipschitz)
    assert c.shape == out_batch + (m, n)


@SETTINGS
@given(SIZES, SIZES, SIZES, st.sampled_from(["f16", "f32"]))
def test_plain_matmul_matches_torch(m, n, k, dtype):
    dt = DTYPES[dtype]
    a, b = randn(m, k, dtype=dt), randn(k, n, dtype=dt, transposed=True)
    c = compiled("C = A @ B")(a, b)
    want = (a.double() @ b.double())
    assert c.dtype == dt
    assert_close(c, want, bound(a, b))
    torch_c = (a.float() @ b.float()).to(dt)
    assert_close(c, torch_c.double(), bound(a, b) * 2)


@settings(deadline=None, max_examples=examples(10))
@given(st.sampled_from([(0, 5, 7), (5, 0, 7), (5, 7, 0), (0, 0, 0)]), st.sampled_from(["f16", "f32"]))
def test_empty_dims(sizes, dtype):
    m, n, k = sizes
    dt = DTYPES[dtype]
    a, b, bias = randn(m, k, dtype=dt), randn(k, n, dtype=dt), randn(n)
    c = compiled("C = exp(A @ B + b)")(a, b, bias)
    assert c.shape == (m, n)
    torch.testing.assert_close(c.double(), torch.exp(a.double() @ b.double() + bias.double()), rtol=1e-5, atol=0,
                               check_dtype=False)


def test_sliced_operands_need_no_copy():
    base_a, base_b = randn(80, 90), randn(70, 60)
    a, b = base_a[3::2, 1:60:3], base_b[5:35, ::3].t()          # [39, 20] and [20, 30], strides (180, 3), (3, 60)
    assert not a.is_contiguous() and not b.is_contiguous()
    check("C = A @ B", a, b)


@pytest.mark.parametrize("m, k, n, b_t", [(40, 1000, 1000, False), (40, 1000, 1000, True), (33, 24, 40, False),
                                          (33, 52, 30, True), (16, 64, 48, False)])
def test_the_tiled_kernel_is_told_what_divides_sizes_and_strides(m, k, n, b_t, watch):
    """N, K and every stride reach the tiled kernel with the largest power of two up to 16 that
    divides them (N_VEC, A_VEC0, ...), which it writes back into them: Triton sees multiples of 16
    only, and rows of 1000 16-bit elements would move an element at a time.  Each hint must
    divide its value exactly, or the kernel would compute with another one."""
    kernel = compiled("kernel mm(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] { C = A @ B }")
    launches = watch(kernel.module)
    a, b = randn(m, k, dtype=torch.float16), randn(k, n, dtype=torch.float16, transposed=b_t)
    got = kernel(a, b)
    values = {"N_VEC": n, "K_VEC": k, "A_VEC0": a.stride(0), "A_VEC1": a.stride(1), "B_VEC0": b.stride(0),
              "B_VEC1": b.stride(1), "C_VEC0": got.stride(0), "C_VEC1": got.stride(1)}
    hints = {key: value for key, value in launches.kwargs[0].items() if key.endswith(("_VEC", "_VEC0", "_VEC1"))}
    assert hints.keys() == values.keys()
    for key, vec in hints.items():
        largest = next(v for v in (16, 8, 4, 2, 1) if values[key] % v == 0)
        assert vec == largest, (key, values[key], vec)
    assert_close(got, a.double() @ b.double(), bound(a, b))


def test_several_outputs_and_named_intermediates():
    a, b = randn(31, 40, dtype=torch.float16), randn(40, 33, dtype=torch.float16)
    k = kgen.compile("kernel two(A: f16[M, K], B: f16[K, N]) -> (P: f32[M, N], Q: f16[M, N]) {\n"
                     "    P = A @ B\n    Q = sigmoid(P) + P\n}\n")
    p, q = k(a, b)
    exact = a.double() @ b.double()
    assert p.dtype == torch.float32 and q.dtype == torch.float16
    assert_close(p, exact, bound(a, b))
    assert_close(q, torch.sigmoid(exact) + exact, bound(a, b), factor=1.3)
    assert "# P = A @ B" in k.source and "P = acc" in k.source


def test_operand_used_in_the_epilogue_too():
    x = randn(33, 33)
    got = compiled("C = X @ X + X")(x)
    assert_close(got, x.double() @ x.double() + x.double(), bound(x, x))


@pytest.mark.parametrize("text, make, operands, precision", [
    ("C = f16(X) @ B", lambda: (randn(33, 50), randn(50, 20, dtype=torch.float16)), lambda x, b: (x, b), "ieee"),
    ("C = relu(X) @ B", lambda: (randn(33, 50, dtype=torch.float16), randn(50, 20, dtype=torch.float16)),
     lambda x, b: (x, b), "ieee"),
    ("C = exp(X * 0.1) @ B", lambda: (randn(33, 50, dtype=torch.float16), randn(50, 20, dtype=torch.float16)),
     lambda x, b: (torch.exp(x.float() * 0.1), b), "operand16"),
    ("C = A @ (Y + 1.0)", lambda: (randn(33, 50), randn(50, 20, transposed=True)), lambda a, y: (a, y + 1.0), "ieee"),
    # past K both tiles are 1 here, or inf (rsqrt(0)) against a zero: only zero-filling keeps them out
    ("C = exp(X * 0.1) @ exp(Y * 0.1)", lambda: (randn(33, 50), randn(50, 20)),
     lambda x, y: (torch.exp(x * 0.1), torch.exp(y * 0.1)), "ieee"),
    ("C = rsqrt(X) @ B", lambda: (randn(33, 50).abs() + 0.5, randn(50, 20)), lambda x, b: (torch.rsqrt(x), b),
     "ieee"),
    ("C = relu(X) @ X", lambda: (randn(45, 45),), lambda x: (x, x), "ieee"),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")      # rsqrt(0) past K, before the zero fill
def test_prologue_on_an_operand(text, make, operands, precision):
    """A pointwise function of one operand runs on each tile; past K (50 is not a
    multiple of 32) tiles stay zero even where f(0) != 0 (exp, + 1.0)."""
    args = make()
    k = compiled(text)
    got = k(*args)
    want = evaluate(k.ir, dict(zip(k.inputs, args)))[0]
    assert_close(got, want, bound(*operands(*args)), precision, factor=2.0)
    assert "on each tile of" in k.source


def test_prologue_cast_rounds_before_the_dot():
    """f16(X) @ B rounds X to f16 first: the same as torch with X.half()."""
    x, b = randn(20, 40), randn(40, 10, dtype=torch.float16)
    got = compiled("C = f16(X) @ B")(x, b)
    assert_close(got, x.half().double() @ b.double(), bound(x.half(), b))


def test_explicit_configs_agree():
    """Every config the host accepts computes the same result (GROUP_M ordering,
    tile shapes, BLOCK_K vs K)."""
    k = compiled("C = leaky_relu(A @ B + b)")
    a, b, bias = randn(70, 50), randn(50, 90), randn(90)
    k(a, b, bias)
    host = getattr(k._last.module, k._last.name)
    want = evaluate(k.ir, {"A": a, "B": b, "b": bias})[0]
    for bm, bn, bk, group in [(16, 16, 16, 1), (16, 64, 16, 3), (64, 16, 64, 8), (32, 32, 128, 2)]:
        config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": 4, "num_stages": 1}
        assert_close(host(a, b, bias, config=config), want, bound(a, b))


# what Triton's launch takes besides a kernel's own parameters
LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg"}


def test_hand_configs_launch_only_what_each_kernel_takes(watch):
    """A flag given False (TMA: False), or TMA where it cannot read the operands, launches the
    tiled kernel with the tiles alone: on a GPU Triton refuses a keyword its kernel does not
    take (the interpreter ignores it, so the launches' keywords are checked here); TMA with
    SPLIT_K is refused as a bad call, the TMA kernel taking each tile whole."""
    k = kgen.compile("specs/linear_gelu.k")
    x, w, bias = (randn(17, 64, dtype=torch.float16), randn(64, 45, dtype=torch.float16),
                  randn(45, dtype=torch.float16))
    want = F.gelu(x.double() @ w.double() + bias.double())
    tiles = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
    launches = watch(k.module)
    for flags in ({"TMA": False}, {"TMA": True}, {"TMA": 0, "SPLIT_K": 2}, {"SPLIT_K": 1}):
        assert_close(k(x, w, bias, config={**tiles, **flags}), want, bound(x, w))
    assert launches.count >= 4
    for fn, kwargs in zip(launches.kernels, launches.kwargs):
        assert set(kwargs) <= set(fn.arg_names) | LAUNCH_OPTIONS, (fn.fn.__name__, set(kwargs) - set(fn.arg_names))
    with pytest.raises(kgen.CallError, match=r"config: SPLIT_K is an option of the tiled kernel: expected TMA False "
                                             r"with SPLIT_K 2, got TMA True"):
        k(x, w, bias, config={**tiles, "TMA": True, "SPLIT_K": 2})


def test_int64_offsets_path(monkeypatch):
    """The INT64 branch (taken for tensors past 2**31 elements) computes the same values."""
    k = compiled("C = A @ B + R")
    a, b, r = randn(2, 33, 40, transposed=True), randn(40, 35), randn(2, 33, 35)
    k(a, b, r)
    module = k._last.module
    calls = []
    monkeypatch.setattr(module, "_needs_int64", lambda *ts, sizes=(): calls.append(len(ts)) or True)
    assert_close(k(a, b, r), a.double() @ b.double() + r.double(), bound(a, b))
    assert calls


def test_precision_schedule():
    spec = ("kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n    C = A @ B\n}\n"
            "schedule mm {\n    input_precision = ieee\n}\n")
    k = kgen.compile(spec)
    assert 'input_precision="ieee"' in k.source
    a, b = randn(20, 30), randn(30, 40)
    assert_close(k(a, b), a.double() @ b.double(), bound(a, b))
    assert 'input_precision="tf32"' in compiled("C = A @ B")._example().source
    half = generate("kernel h(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n    C = A @ B\n}\n").source
    assert "input_precision" not in half


class Launches:
    """Counts launches of a kernel (``kernel[grid](...)``)."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        return self.kernel[grid]


@contextmanager
def watching(module, *names):
    """Count the launches of the module's kernels ``names`` inside the block."""
    saved = [getattr(module, n) for n in names]
    launches = [Launches(k) for k in saved]
    for n, w in zip(names, launches):
        setattr(module, n, w)
    try:
        yield launches
    finally:
        for n, k in zip(names, saved):
            setattr(module, n, k)


def tma_config(bm=32, bn=32, bk=16, group=2):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": 4, "num_stages": 1,
            "TMA": True}


@settings(deadline=None, max_examples=examples(12))
@given(st.sampled_from([1, 7, 33, 64, 97]), st.sampled_from([8, 40, 64]), st.sampled_from([1, 31, 64]),
       st.booleans(), st.booleans(), st.sampled_from([tma_config(), tma_config(16, 64, 32, 1)]))
def test_persistent_tma_variant(m, k, n, a_t, b_t, config):
    """The Hopper variant (persistent programs, TMA loads; Triton's interpreter reads
    descriptors too): any M, N, K whose rows are 16-byte aligned, either layout."""
    text = "C = gelu(A @ W + b)"
    a, w, bias = randn(m, k, dtype=torch.float16, transposed=a_t), randn(k, n, dtype=torch.float16, transposed=b_t), \
        randn(n)
    kernel = compiled(text)
    kernel(a, w, bias)
    module = kernel._last.module
    with watching(module, "c_tma_kernel", "c_kernel") as (tma, tiled):
        got = getattr(module, kernel._last.name)(a, w, bias, config=config)
    aligned = (m if a_t else k) % 8 == 0 and (k if b_t else n) % 8 == 0
    assert (tma.count, tiled.count) == ((1, 0) if aligned else (0, 1))
    assert_close(got, F.gelu(a.double() @ w.double() + bias.double()), bound(a, w), factor=1.2)


def test_tma_falls_back_where_it_cannot_read():
    """Rows of 5 halves are not 16-byte aligned, a strided slice has no contiguous axis,
    K = 0 has nothing to describe: the tiled kernel runs with the same tiles."""
    k = compiled("C = A @ B")
    for a, b in [(randn(9, 5, dtype=torch.float16), randn(5, 16, dtype=torch.float16)),
                 (randn(9, 32, dtype=torch.float16)[:, ::2], randn(16, 16, dtype=torch.float16)),
                 (randn(9, 0, dtype=torch.float16), randn(0, 16, dtype=torch.float16))]:
        k(a, b)
        host = getattr(k._last.module, k._last.name)
        assert_close(host(a, b, config=tma_config()), a.double() @ b.double(), bound(a, b))


@settings(deadline=None, max_examples=examples(10))
@given(st.sampled_from([1, 40, 64]), st.sampled_from([16, 40, 64]), st.sampled_from([8, 31, 64]),
       st.booleans(), st.booleans(), st.booleans())
def test_warp_specialized_and_subtiled_epilogue(m, k, n, a_t, b_t, subtile):
    """The persistent kernel's WARP_SPECIALIZE and EPILOGUE_SUBTILE flags (Triton's interpreter
    takes warp_specialize and runs the loop as it is): same results, halves past N masked."""
    ws = "[0, 1]" if gemm.has_warp_specialize() else "0"    # not default candidates: a schedule asks
    text = ("kernel c(A: f16[M, K], W: f16[K, N], b: f32[N]) -> C: f16[M, N] {\n  C = gelu(A @ W + b)\n}\n"
            f"schedule c {{\n  TMA = 1\n  WS = {ws}\n  SUBTILE = [0, 1]\n  num_warps = [4, 8]\n}}\n")
    a, w, bias = randn(m, k, dtype=torch.float16, transposed=a_t), randn(k, n, dtype=torch.float16, transposed=b_t), \
        randn(n)
    kernel = compiled(text)
    module = kernel.module
    assert "WARP_SPECIALIZE" in kernel.source if gemm.has_warp_specialize() else "warp_specialize" not in kernel.source
    config = {**tma_config(16, 32, 16, 1), "WS": gemm.has_warp_specialize(), "SUBTILE": subtile}
    with watching(module, "c_tma_kernel", "c_kernel") as (tma, tiled):
        got = module.c(a, w, bias, config=config)
    aligned = (m if a_t else k) % 8 == 0 and (k if b_t else n) % 8 == 0
    assert (tma.count, tiled.count) == ((1, 0) if aligned else (0, 1))      # the tiled kernel ignores the flags
    assert_close(got, F.gelu(a.double() @ w.double() + bias.double()), bound(a, w), factor=1.2)


def split_config(split, bm=16, bn=16, bk=16, group=2):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": 4, "num_stages": 1,
            "SPLIT_K": split}


@settings(deadline=None, max_examples=examples(15))
@given(st.sampled_from([1, 17, 33]), st.sampled_from([1, 31, 64, 97]), st.sampled_from([5, 32]),
       st.sampled_from([1, 2, 3, 4, 8]), st.booleans(), st.sampled_from(["f16", "f32"]))
def test_split_k(m, k, n, split, a_t, dtype):
    """SPLIT_K programs per tile sum interleaved slices of K (some empty when K is short, the
    last one masked); the second kernel adds the f32 partial sums and runs the epilogue."""
    dt = DTYPES[dtype]
    a, w, bias = randn(m, k, dtype=dt, transposed=a_t), randn(k, n, dtype=dt), randn(n)
    kernel = compiled("C = gelu(A @ W + b)")
    kernel(a, w, bias)
    module = kernel._last.module
    with watching(module, "c_kernel", "c_split_k_kernel") as (tiled, reduce):
        got = getattr(module, kernel._last.name)(a, w, bias, config=split_config(split))
    assert (tiled.count, reduce.count) == (1, int(split > 1))
    assert_close(got, F.gelu(a.double() @ w.double() + bias.double()), bound(a, w), factor=1.2)


def test_split_k_batched_prologue_and_outputs():
    """Split-K with a batch (the workspace holds batch x SPLIT_K slices), an operand
    prologue, strided operands and two outputs, one of them an epilogue intermediate."""
    k = compiled("P = relu(A) @ B\nC = P * s + R\nD = sigmoid(P)")
    a, b = randn(3, 21, 70, transposed=True), randn(70, 19)
    s, r = randn(3, 21, 1), randn(3, 21, 19)
    k(a, b, s, r)
    host = getattr(k._last.module, k._last.name)
    p = torch.relu(a.double()) @ b.double()
    err = bound(torch.relu(a), b)
    for split in (1, 2, 5):
        c, d = host(a, b, s, r, config=split_config(split, bk=16))
        assert_close(c, p * s.double() + r.double(), err, factor=4.0)
        assert_close(d, torch.sigmoid(p), err)


@pytest.mark.gpu
def test_split_k_over_a_batch_past_a_grid_axis():
    """Split-K's second kernel walks batch x tiles on the grid's first axis: a batch past the
    65535 that CUDA allows its other axes launches and sums right."""
    k = compiled("C = A @ B + 1")
    a, b = randn(70000, 4, 24), randn(70000, 24, 3)
    k(a[:2], b[:2])
    got = getattr(k._last.module, k._last.name)(a, b, config=split_config(2))
    assert_close(got, a.double() @ b.double() + 1, bound(a, b))


@pytest.mark.parametrize("batch", [(2,), ()])
def test_split_k_int64_offsets(monkeypatch, batch):
    """Under INT64 the partials' offsets are int64 (in 2-D, the partial row pid_k * M + m
    cast from the slice's index)."""
    k = compiled("C = A @ B + R")
    a, b, r = randn(*batch, 33, 40), randn(40, 35), randn(*batch, 33, 35)
    k(a, b, r)
    module = k._last.module
    monkeypatch.setattr(module, "_needs_int64", lambda *ts, sizes=(): True)
    assert_close(getattr(module, k._last.name)(a, b, r, config=split_config(3)), a.double() @ b.double() + r.double(),
                 bound(a, b))


def test_without_warp_specialize_in_triton(monkeypatch):
    """A Triton whose tl.range has no warp_specialize: no WS candidate, and the persistent
    kernel's loop does not name it (the kernel would not compile)."""
    monkeypatch.setattr(gemm, "has_warp_specialize", lambda: False)
    plan = generate("kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = A @ B\n}\n")
    assert plan.plans[0].tma and not plan.plans[0].ws
    assert not any(c.get("WS") for c in plan.plans[0].tuning.configs)
    assert "warp_specialize" not in plan.source and "WARP_SPECIALIZE" not in plan.source
    assert "tl.range(start_pid, num_tiles, NUM_SMS, flatten=True)" in plan.source
    with pytest.raises(kgen.SpecError, match="WS = 1 needs a Triton"):
        generate("kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = A @ B\n}\n"
                 "schedule g {\n  TMA = 1\n  WS = 1\n}\n")


def test_warp_specialize_guard_reads_tl_range(monkeypatch):
    import triton.language as tl

    class OldRange:                 # tl.range before warp_specialize
        def __init__(self, arg1, arg2=None, step=None, num_stages=None, loop_unroll_factor=None, flatten=False):
            pass

    check = gemm.has_warp_specialize.__wrapped__        # uncached
    assert check() == ("warp_specialize" in inspect.signature(tl.range).parameters)
    monkeypatch.setattr(tl, "range", OldRange)
    assert check() is False


@pytest.mark.parametrize("schedule", ["", "schedule g {\n  BLOCK_M = 64\n  BLOCK_N = 64\n  BLOCK_K = 64\n}\n"])
def test_the_heuristic_names_each_config_once_in_a_row(schedule):
    """Neighbouring rows of one config are one row (``M <= 64 or M * N <= 524288``), and the
    merged heuristic picks what the unmerged one picked at every size."""
    head = "kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = A @ B\n}\n"
    plan = generate(head + schedule).plans[0]
    configs = [config for _, config in plan.heuristic]
    assert all(a != b for a, b in zip(configs, configs[1:])) and plan.heuristic[-1][0] == ""
    if not schedule:
        assert any(" or " in condition for condition, _ in plan.heuristic)
    unmerged = [("M <= 16", "a"), ("M <= 64", "b"), ("M * N <= 100", "b"), ("M * N <= 400", "c"), ("", "c")]
    merged = gemm._merged(unmerged)
    assert merged == (("M <= 16", "a"), ("M <= 64 or M * N <= 100", "b"), ("", "c"))
    for m in (1, 16, 17, 64, 65, 100):
        for n in (1, 2, 7):
            pick = lambda rows: next(c for cond, c in rows if not cond or eval(cond, {"M": m, "N": n}))  # noqa: E731
            assert pick(merged) == pick(unmerged)


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("group_m", [2**30, 2**31 - 1])
def test_a_group_m_past_the_rows_of_tiles_is_one_group(group_m, tma):
    """GROUP_M takes any int32 by hand: past the rows of tiles it is one group, whose
    programs-per-group count (GROUP_M times the columns of tiles) never overflows int32."""
    k = kgen.compile(ROOT_SPECS / "matmul_leaky_relu.k")
    grouped = kgen.compile(ROOT_SPECS / "grouped_gemm.k")
    a, b = randn(64, 16).half(), randn(16, 64).half()
    config = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=group_m, num_warps=4, num_stages=1, TMA=tma)
    want = torch.nn.functional.leaky_relu(a.double() @ b.double(), 0.01)
    assert_close(k(a, b, config=config), want, bound(a, b))
    listed = dict(config, programs_per_sm=1)
    problems = [(a, b), (a[:40], b[:, :48])]
    for got, (x, y) in zip(grouped(*map(list, zip(*problems)), config=listed), problems):
        assert_close(got, x.double() @ y.double(), bound(x, y))
    offs = torch.tensor([40, 64], dtype=torch.int32, device=DEVICE)
    got = grouped.moe(a, torch.stack([b, b]), offs=offs, config=listed)
    assert_close(got, a.double() @ b.double(), bound(a, b))


def test_schedule_flags():
    """SPLIT_K lists multiply the tiled candidates; WS and SUBTILE the persistent ones."""
    head = "kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = A @ B\n}\n"
    split = generate(head + "schedule g {\n  BLOCK_M = [16, 32]\n  SPLIT_K = [1, 4]\n}\n").plans[0]
    assert [(c["BLOCK_M"], c.get("SPLIT_K", 1)) for c in split.tuning.configs] == [(16, 1), (16, 4), (32, 1), (32, 4)]
    assert split.split_k and not split.tma and split.scheduled
    only = generate(head + "schedule g {\n  SPLIT_K = 2\n}\n").plans[0]
    assert only.tuning.configs == () and only.split_k                # one candidate: the heuristic splits K
    assert all("SPLIT_K=2" in config for _, config in only.heuristic)
    if gemm.has_warp_specialize():
        ws = generate(head + "schedule g {\n  TMA = 1\n  WS = [0, 1]\n  SUBTILE = 1\n  num_warps = 8\n}\n").plans[0]
        assert [(c.get("WS", False), c.get("SUBTILE")) for c in ws.tuning.configs] == [(False, True), (True, True)]
        assert ws.ws and ws.subtile and all(c["TMA"] for c in ws.tuning.configs)
        module = compiled(head + "schedule g {\n  TMA = 1\n  WS = 1\n  BLOCK_M = 64\n}\n")
        assert "flatten=not WARP_SPECIALIZE" in module.source
        # 128-row warp-specialized tiles in 4 warps never finish on an H100: not a candidate,
        # nor a heuristic, nor a config by hand
        mixed = generate(head + "schedule g {\n  TMA = 1\n  WS = 1\n  BLOCK_M = [64, 128]\n  BLOCK_N = [64, 128]\n}\n")
        mixed = mixed.plans[0]
        assert [(c["BLOCK_M"], c["BLOCK_N"]) for c in mixed.tuning.configs] == [(64, 64), (64, 128)]
        assert all("BLOCK_M=64" in config for _, config in mixed.heuristic)
        a = torch.randn(16, 16, device=DEVICE, dtype=torch.float16)
        with pytest.raises(kgen.CallError, match="expected num_warps 8 for WS with a BLOCK_M of 128 or more, got 4"):
            module(a, a, config={**tma_config(128, 32, 16, 1), "num_warps": 4, "WS": True})


# --- generated source ------------------------------------------------------------------------

def test_generated_source_reads_like_tutorial_03():
    source = generate(open("specs/matmul_leaky_relu.k").read(), "specs/matmul_leaky_relu.k").source
    assert source == generate(open("specs/matmul_leaky_relu.k").read(), "specs/matmul_leaky_relu.k").source
    for line in ["group_size_m = min(num_pid_m - first_pid_m, GROUP_M)",
                 "for k in range(0, tl.cdiv(K, BLOCK_K)):",
                 "acc = tl.dot(A, B, acc)",
                 "# C = leaky_relu(A @ B, alpha)",
                 "C = leaky_relu(acc, alpha)",
                 "def matmul_leaky_relu(A, B, alpha=0.01, *, out=None, config=None):"]:
        assert line in source, line
    body = source[source.index("def matmul_leaky_relu_kernel"):source.index("def _matmul_leaky_relu_tile")]
    assert body.count("tl.store(") == 1
    imports = {line for line in source.splitlines() if line.startswith(("import", "from"))}
    assert imports <= {"import torch", "import triton", "import triton.language as tl", "import math"}


def test_headerless_dims_read_m_k_n():
    k = compiled("C = A @ B")
    k(randn(3, 4), randn(4, 5))
    assert '"""A: f32[M, K], B: f32[K, N] -> C: f32[M, N]"""' in k.source


def test_schedule_lists_are_candidates():
    kir_plan = generate(open("specs/matmul_leaky_relu.k").read()).plans[0]
    configs = kir_plan.tuning.configs
    assert len(configs) == 2 * 2 * 2 * 2
    assert {c["BLOCK_M"] for c in configs} == {64, 128} and {c["BLOCK_K"] for c in configs} == {64}
    assert sum(bool(c.get("TMA")) for c in configs) == 8 and kir_plan.tma
    default_plan = generate("kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = A @ B\n}\n").plans[0]
    configs = default_plan.tuning.configs
    assert [tuple(c.values()) for c in configs if set(c) == set(gemm.CONFIG_KEYS)] == list(gemm.CANDIDATES_16)
    assert [tuple(c.values()) for c in configs if "SPLIT_K" in c] == list(gemm.SPLIT_K_CANDIDATES_16)
    assert [tuple(c.values())[:6] for c in configs if c.get("TMA") and not c.get("WS")] == \
        list(gemm.TMA_CANDIDATES_16)
    assert not any(c.get("WS") for c in configs)      # measured slower than plain TMA on an H200
    assert default_plan.split_k and not default_plan.ws
    assert not kir_plan.split_k and not kir_plan.ws and not kir_plan.subtile     # the spec's list has neither
    batched = generate("kernel g(A: f16[B, M, K], W: f16[K, N]) -> C: f16[B, M, N] {\n  C = A @ W\n}\n").plans[0]
    assert not batched.tma and not any(c.get("TMA") for c in batched.tuning.configs)
    fixed = generate("kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = A @ B\n}\n"
                     "schedule g {\n  BLOCK_M = 64\n  BLOCK_N = 64\n  num_warps = 4\n}\n").plans[0]
    assert fixed.tuning.configs == ()            # one candidate: nothing to tune
    assert all("BLOCK_M=64, BLOCK_N=64" in config for _, config in fixed.heuristic)


def test_tma_lists_keep_the_tiled_candidates_where_tma_cannot_read_the_operands():
    """``TMA = [0, 1]`` where the plan cannot use TMA (f32 operands, a prologue): the TMA = 1
    candidates (and the persistent kernel's WS, SUBTILE) drop out, in the GEMM and the grouped
    GEMM; ``TMA = 1`` alone stays an error, at its value."""
    f32 = generate(open("specs/matmul_leaky_relu.k").read().replace("f16", "f32")).plans[0]
    assert len(f32.tuning.configs) == 2 * 2 * 2 and not f32.tma
    assert not any(c.get("TMA") for c in f32.tuning.configs)
    prologue = generate("kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = relu(A) @ B\n}\n"
                        "schedule g {\n  BLOCK_M = [16, 32]\n  TMA = [0, 1]\n  WS = [0, 1]\n  SUBTILE = 1\n}\n")
    prologue = prologue.plans[0]
    assert [c["BLOCK_M"] for c in prologue.tuning.configs] == [16, 32]
    assert not prologue.tma and not prologue.ws and not prologue.subtile
    assert not any(c.get("TMA") or c.get("WS") or c.get("SUBTILE") for c in prologue.tuning.configs)
    grouped = generate("kernel g(A: [f32[M, K]], B: [f32[K, N]]) -> C: [f32[M, N]] {\n  C = A @ B\n}\n"
                       "schedule g {\n  BLOCK_N = [32, 64]\n  TMA = [0, 1]\n}\n").plans[0]
    assert len(grouped.tuning.configs) == 2 and not grouped.tma
    assert not any(c.get("TMA") for c in grouped.tuning.configs)
    with pytest.raises(kgen.SpecError, match="TMA = 1 needs") as info:
        generate("kernel g(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n  C = A @ B\n}\n"
                 "schedule g {\n  BLOCK_M = [16, 32]\n  TMA = 1\n}\n")
    assert (info.value.span.line, info.value.span.col) == (6, 9), str(info.value)


@pytest.mark.parametrize("schedule, message", [
    ("BLOCK_Q = 64", "not 'BLOCK_Q'"),
    ("BLOCK_M = 48", "power of two"),
    ("BLOCK_K = 8", "at least 16"),
    ("input_precision = fast", "input_precision takes one of"),
    ("TMA = 2", "TMA takes 0 or 1"),
    ("SUBTILE = 1", "need TMA = 1"),
    ("TMA = 1\n  SPLIT_K = 2", "it needs TMA = 0"),
    ("SPLIT_K = 0", "SPLIT_K takes positive integers"),
])
def test_bad_schedule(schedule, message):
    spec = (f"kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {{\n  C = A @ B\n}}\n"
            f"schedule g {{\n  {schedule}\n}}\n")
    with pytest.raises(kgen.SpecError, match=message):
        generate(spec)


@pytest.mark.parametrize("lists", [False, True])
@pytest.mark.parametrize("schedule, at", [("BLOCK_M = [64, 2048]\n  BLOCK_N = 1024", (5, 18)),
                                          ("BLOCK_K = 16384", (5, 13))])
def test_a_schedules_tiles_fit_tritons_largest_tensor(lists, schedule, at):
    """Tiles whose product passes 2**20 elements (Triton's largest tensor, which the host's
    config check refuses) are an error at the larger value, in GEMM and grouped GEMM specs."""
    header = ("(A: [f16[M, K]], B: [f16[K, N]]) -> C: [f16[M, N]]" if lists else
              "(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]")
    spec = f"kernel g{header} {{\n  C = A @ B\n}}\nschedule g {{\n  {schedule}\n}}\n"
    with pytest.raises(kgen.SpecError, match=r"must be at most 2\*\*20 \(Triton's largest tensor\)") as info:
        generate(spec)
    assert (info.value.span.line, info.value.span.col) == at, str(info.value)


# --- errors ------------------------------------------------------------------------------------

def test_inner_dims_differ_at_call_time():
    k = compiled("C = leaky_relu(A @ B)")
    with pytest.raises(kgen.CallError, match=r"B: expected f32\[K, N\] = \[4, \?\].*got shape \(5, 6\)"):
        k(randn(3, 4), randn(5, 6))
    spec = kgen.compile("specs/matmul_leaky_relu.k")
    with pytest.raises(kgen.CallError, match=r"B:.*\(5, 6\)"):
        spec(randn(3, 4, dtype=torch.float16), randn(5, 6, dtype=torch.float16))


def test_bias_that_does_not_broadcast():
    with pytest.raises(kgen.CallError, match=r"b: expected f32\[N\] = \[6\].*got shape \(7,\)"):
        compiled("C = gelu(A @ W + b)")(randn(3, 4), randn(4, 6), randn(7))


def test_batch_that_does_not_broadcast():
    with pytest.raises(kgen.CallError, match=r"B: .*\(3, 4, 6\)"):
        compiled("C = A @ B")(randn(2, 3, 4), randn(3, 4, 6))


def test_integer_and_mixed_dtypes():
    ints = torch.ones(3, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(kgen.SpecError, match="floating-point operands"):
        compiled("C = A @ B")(ints, ints.t())
    with pytest.raises(kgen.SpecError, match="one dtype"):
        compiled("C = A @ B")(randn(3, 4), randn(4, 5, dtype=torch.float16))
    spec = kgen.compile("specs/matmul_leaky_relu.k")
    with pytest.raises(kgen.CallError, match=r"A: expected f16\[M, K\], got a torch.float32"):
        spec(randn(3, 4), randn(4, 5, dtype=torch.float16))


def test_tensors_on_different_devices():
    with pytest.raises(kgen.CallError, match="b: expected a tensor on"):
        compiled("C = gelu(A @ W + b)")(randn(3, 4), randn(4, 6), torch.empty(6, device="meta"))


@pytest.mark.parametrize("text, args, message, where", [
    ("C = (A @ B) @ D", ((3, 4), (4, 5), (5, 6)), "split the spec into two kernels", "(A @ B) @ D"),
    ("C = where(A @ B > 0, A @ B, 0.0)", ((3, 4), (4, 5)), "name it once (P = A @ B)", "A @ B, 0.0)"),
    # the second matmul in the spec's order, whichever operand of its statement it is
    ("P = A @ B\nC = where(A @ B > 0, P, 0.0)", ((3, 4), (4, 5)), "name it once", "A @ B > 0"),
    ("P = A @ B\nC = (A @ B) + P", ((3, 4), (4, 5)), "name it once", "A @ B) + P"),
    ("P = A @ B\nQ = A @ D\nC = Q + P", ((3, 4), (4, 5), (4, 5)), "split the spec into two kernels", "A @ D"),
    ("C = sum(A @ B, axis=-1)", ((3, 4), (4, 5)), "after a matmul", "sum"),
    ("C = (X + Y) @ B", ((3, 4), (3, 4), (4, 5)), "pointwise function of one input", "X + Y"),
    ("C = (X + v) @ B", ((3, 4), (4,), (4, 5)), "pointwise function of one input", "X + v"),
    ("C = A @ B + R", ((3, 4), (4, 5), (2, 2, 3, 5)), "at most one batch", None),
    ("C = A @ B * k", ((3, 4), (4, 5), None), "'k' is a name the generated GEMM kernel uses", None),
    # an operand's prologue lives in the K loop, a tile at a time: not after it, nor stored
    ("X = relu(A)\nC = X @ B\nY = C + X", ((4, 4), (4, 4)), "cannot be used after the matmul", "relu(A)"),
    ("kernel k(A: f16[M, M], B: f16[M, M]) -> (C: f16[M, M], X: f16[M, M]) {\n    X = relu(A)\n    C = X @ B\n}",
     ((4, 4), (4, 4)), "X, a value computed for the matmul's operand, cannot be an output", "relu(A)"),
])
def test_outside_the_pattern(text, args, message, where):
    values = [0.5 if s is None else randn(*s) for s in args]
    with pytest.raises(kgen.UnsupportedError) as e:
        kgen.compile(text)(*values)
    assert message.replace("\n", " ") in str(e.value).replace("\n", " ")
    if where:
        line, caret = str(e.value).splitlines()[-2:]
        col = caret.index("^")
        assert line[col:].startswith(where), str(e.value)


# --- autotuning ----------------------------------------------------------------------------------

CONFIGS = tuple({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 1}
                for m, n in [(32, 32), (16, 32), (32, 16), (16, 16)])


def fake_clock(times, calls):
    """A bench that runs each candidate once (on the interpreter) and reports a made-up time."""
    def bench(run, config):
        run()
        calls.append(config)
        return times[(config["BLOCK_M"], config["BLOCK_N"])]
    return bench


def tuned_host(text="C = relu(A @ B + R)"):
    k = compiled(text)
    a, b, r = randn(40, 20), randn(20, 30), randn(40, 30)
    k(a, b, r)
    return k._last, (a, b, r)


def make_tuner(kernel, bench, device="fake-gpu", configs=CONFIGS, buckets=()):
    host = getattr(kernel.module, kernel.name)
    return autotune.Tuner(host, autotune.Tuning(configs, buckets=buckets), kernel.source, kernel.name, bench=bench,
                          device_name=device, force=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KGEN_AUTOTUNE", raising=False)
    return tmp_path


def test_tuner_picks_fastest_and_a_second_tuner_reads_the_disk(cache):
    kernel, args = tuned_host()
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}
    calls = []
    tuner = make_tuner(kernel, fake_clock(times, calls))
    assert tuner.choose(args, {}) == CONFIGS[1]
    assert len(calls) == len(CONFIGS) and tuner.tuned == 1
    assert tuner.choose(args, {}) == CONFIGS[1] and len(calls) == len(CONFIGS)   # memory
    files = list((cache / "autotune" / "fake-gpu").rglob("*.json"))
    assert len(files) == 1 and "fake-gpu" in str(files[0])
    second_calls = []
    second = make_tuner(kernel, fake_clock(times, second_calls))            # a new process, in effect
    assert second.choose(args, {}) == CONFIGS[1]
    assert second_calls == [] and second.tuned == 0
    # another problem key (a transposed B) is tuned anew and kept beside the first
    bt = args[1].t().contiguous().t()
    assert second.choose((args[0], bt, args[2]), {}) == CONFIGS[1]
    assert len(second_calls) == len(CONFIGS)
    assert len(json.loads(files[0].read_text())["entries"]) == 2


def test_a_refused_call_forgets_only_its_own_threads_decision(cache):
    """A call the host refuses drops the decision it added to the tuner's memory: its own, not
    one another thread's call added in between, which stays remembered (never tuned again)."""
    kernel, args = tuned_host()
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}
    calls = []
    tuner = make_tuner(kernel, fake_clock(times, calls))
    other = (args[0][:20], args[1], args[2][:20])      # another problem key
    chosen, resume = threading.Event(), threading.Event()

    def refused_call():
        tuner.choose(args, {})
        chosen.set()
        resume.wait(60)
        tuner.forget()
    thread = threading.Thread(target=refused_call)
    thread.start()
    assert chosen.wait(60)
    tuner.choose(other, {})                           # this thread's call, between the other's two steps
    resume.set()
    thread.join(60)
    key = tuner.tuning.key or autotune.call_key   # the memory's key of a call, as choose takes it
    assert list(tuner.memory) == [key(other, {})] and tuner.memory[key(other, {})] == CONFIGS[1]


def test_a_problem_no_candidate_runs_is_a_kgen_error(cache):
    """Every candidate failing (e.g. past the GPU's shared memory) is a KgenError naming the
    kernel and the first failure, not that failure's raw exception."""
    kernel, args = tuned_host()

    def failing(run, config):
        raise RuntimeError(f"out of resource: shared memory, required: {config['BLOCK_M'] * 4096}")
    with pytest.raises(kgen.KgenError, match=r"c: none of the 4 candidate configs ran for .* \(RuntimeError: out of "
                                             r"resource: shared memory, required: 131072\)"):
        make_tuner(kernel, failing).choose(args, {})


def test_rows_are_tuned_once_per_power_of_two(cache):
    """A GEMM keys M (in A and in the epilogue's residual) by the power of two above it:
    40 and 50 rows share one tuning, 70 rows get their own."""
    kernel, (a, b, r) = tuned_host()
    assert kernel._tuner.tuning.buckets == (("A", 0), ("R", 0))
    calls = []
    tuner = make_tuner(kernel, fake_clock({(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}, calls),
                       buckets=kernel._tuner.tuning.buckets)
    rows = lambda m: (randn(m, 20), b, randn(m, 30))  # noqa: E731
    assert tuner.choose(rows(40), {}) == CONFIGS[1] and tuner.tuned == 1
    assert tuner.choose(rows(50), {}) == CONFIGS[1] and tuner.tuned == 1 and len(calls) == len(CONFIGS)
    assert tuner.choose(rows(70), {}) == CONFIGS[1] and tuner.tuned == 2
    keys = json.loads(next((cache / "autotune").rglob("*.json")).read_text())["entries"]
    assert sorted(keys) == ["A:float32:<=128x20:s1 B:float32:20x30:s1 R:float32:<=128x30:s1",
                            "A:float32:<=64x20:s1 B:float32:20x30:s1 R:float32:<=64x30:s1"]


def test_a_call_that_launches_nothing_is_not_tuned(cache):
    """Empty outputs (no rows, or no columns) launch nothing: no candidate is timed, nothing is
    written to disk, and the heuristic (None) serves those shapes; a problem with K = 0 still
    launches (its outputs are the epilogue of zeros) and is tuned."""
    kernel, (a, b, r) = tuned_host()
    calls = []
    tuner = make_tuner(kernel, fake_clock({(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}, calls))
    for args in ((randn(0, 20), b, randn(0, 30)), (a, randn(20, 0), randn(40, 0))):
        assert tuner.choose(args, {}) is None and calls == [] and tuner.tuned == 0
    assert not list((cache / "autotune" / "fake-gpu").rglob("*.json"))
    no_k = (randn(40, 0), randn(0, 30), r)
    assert tuner.choose(no_k, {}) == CONFIGS[1] and len(calls) == len(CONFIGS) and tuner.tuned == 1
    assert_close(kernel(*no_k, config=CONFIGS[1]), torch.relu(r.double()), bound(*no_k[:2]))


def test_a_later_candidate_must_win_by_the_margin(cache):
    """Near-equal timings keep the earlier (simpler) candidate; a clear win replaces it."""
    kernel, args = tuned_host()
    close = 1 - autotune.MARGIN / 2
    times = {(32, 32): 1.0, (16, 32): close, (32, 16): 1.5, (16, 16): 2.0}
    assert make_tuner(kernel, fake_clock(times, [])).choose(args, {}) == CONFIGS[0]
    clear = 1 - 2 * autotune.MARGIN
    times[(16, 32)] = clear
    assert make_tuner(kernel, fake_clock(times, []), device="other-gpu").choose(args, {}) == CONFIGS[1]


def planted(cache):
    """A tuned kernel whose disk cache has its entry replaced by CONFIGS[3] (not yet written)."""
    kernel, args = tuned_host()
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}
    make_tuner(kernel, fake_clock(times, [])).choose(args, {})
    (path,) = (cache / "autotune" / "fake-gpu").rglob("*.json")
    data = json.loads(path.read_text())
    key = next(iter(data["entries"]))
    data["entries"][key]["config"] = dict(CONFIGS[3])      # a planted choice: used only if trusted
    return kernel, args, times, path, data, key


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign device", "foreign source", "foreign triton",
                                    "unknown config", "wrong type", "float tile", "nested too deep"])
def test_corrupt_or_foreign_cache_is_ignored(cache, damage):
    kernel, args, times, path, data, key = planted(cache)
    if damage == "garbage":
        path.write_text("\x00not json{")
    elif damage == "truncated":
        path.write_text(json.dumps(data)[:40])
    elif damage == "foreign device":
        data["device"] = "another-gpu"
    elif damage == "foreign source":
        data["source"] = "0" * 64
    elif damage == "foreign triton":
        data["triton"] = "0.0.1"
    elif damage == "unknown config":
        data["entries"][key]["config"] = {**CONFIGS[3], "BLOCK_M": 256}
    elif damage == "wrong type":
        data["entries"] = [1, 2]
    elif damage == "float tile":      # == a candidate's 16 in Python, a TypeError in a launch
        first = next(k for k, v in CONFIGS[3].items() if isinstance(v, int) and not isinstance(v, bool))
        data["entries"][key]["config"] = {**CONFIGS[3], first: float(CONFIGS[3][first])}
    elif damage == "nested too deep":
        path.write_text("[" * 100000 + "]" * 100000)
    if damage not in ("garbage", "truncated", "nested too deep"):
        path.write_text(json.dumps(data))
    calls = []
    tuner = make_tuner(kernel, fake_clock(times, calls))
    assert tuner.choose(args, {}) == CONFIGS[1]              # re-tuned, not the planted CONFIGS[3]
    assert len(calls) == len(CONFIGS)
    assert json.loads(path.read_text())["entries"][key]["config"] == CONFIGS[1]   # and rewritten


def test_concurrent_tuners_keep_every_entry(cache):
    """Processes tuning different problems of one kernel at once each add their entry: the
    file is read, extended and written under a lock."""
    import multiprocessing
    kernel, args, times, path, data, key = planted(cache)
    path.unlink()
    keys = [f"problem-{i}" for i in range(6)]
    # forked children touch only files (CUDA cannot start again in a fork): each stores into
    # the disk cache the parent made
    disk = make_tuner(kernel, fake_clock(times, []))._disk(args[0])
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=disk.store, args=(k, CONFIGS[0], 1.0)) for k in keys]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    tuner = make_tuner(kernel, fake_clock(times, []))
    assert set(keys) <= set(tuner._disk(args[0]).entries())


def test_a_long_kernel_name_still_persists_its_tuning(cache):
    """The cache file is named after the kernel: a name near the file system's limit is cut
    (the source hash beside it tells kernels apart), so a second process still reads it."""
    name = "g" * 240
    kernel = compiled(f"kernel {name}(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {{ C = relu(A @ B) }}")
    a, b = randn(40, 20), randn(20, 30)
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}
    assert make_tuner(kernel, fake_clock(times, [])).choose((a, b), {}) == CONFIGS[1]
    second = make_tuner(kernel, fake_clock(times, []))
    assert second.choose((a, b), {}) == CONFIGS[1] and second.tuned == 0


def test_the_lock_beside_a_cache_file_is_never_opened_through_a_link(cache, tmp_path_factory):
    """A link left at the lock's name in a shared cache folder would have the lock create the
    file it names: the store is refused instead (a notice, then a re-tune next time)."""
    kernel, args, times, path, data, key = planted(cache)
    victim = tmp_path_factory.mktemp("elsewhere") / "victim"
    (path.parent / f"{path.name}.lock").unlink(missing_ok=True)
    (path.parent / f"{path.name}.lock").symlink_to(victim)
    make_tuner(kernel, fake_clock(times, []))._disk(args[0]).store("another-problem", CONFIGS[0], 1.0)
    assert not victim.exists()


def test_trusted_cache_entry_is_used(cache):
    """The control for the test above: an intact planted entry is believed."""
    kernel, args, times, path, data, key = planted(cache)
    path.write_text(json.dumps(data))
    calls = []
    assert make_tuner(kernel, fake_clock(times, calls)).choose(args, {}) == CONFIGS[3]
    assert calls == []


def test_failing_configs_are_skipped(cache):
    kernel, args = tuned_host()

    def bench(run, config):
        if config["BLOCK_M"] == 16:
            raise RuntimeError("out of resources")
        return 1.0 if config["BLOCK_N"] == 16 else 2.0
    assert make_tuner(kernel, bench).choose(args, {}) == CONFIGS[2]


def test_tuning_never_writes_the_callers_out_twice(cache):
    """Timed runs write scratch outputs: the caller's out= is written once, by the call
    that gets the chosen config (out= may not overlap an input: tests/test_guarantees.py)."""
    kernel, (a, b, r) = tuned_host("C = A @ B + R")
    host = getattr(kernel.module, kernel.name)
    tuner = make_tuner(kernel, fake_clock({(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}, []))
    want = a.double() @ b.double() + r.double()
    out = torch.full_like(r, float("nan"))
    config = tuner.choose((a, b, r), {"out": out})
    assert tuner.tuned == 1 and torch.isnan(out).all()          # untouched while tuning
    host(a, b, r, out=out, config=config)
    assert_close(out, want, bound(a, b))


def test_progress_on_stderr_only_when_slow(cache, monkeypatch, capsys):
    kernel, args = tuned_host()
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}
    # the threshold both ways, not the interpreter's speed: a loaded machine takes seconds
    monkeypatch.setattr(autotune, "_PROGRESS_AFTER_S", 60.0)
    make_tuner(kernel, fake_clock(times, [])).choose(args, {})
    assert "autotuning" not in capsys.readouterr().err
    monkeypatch.setattr(autotune, "_PROGRESS_AFTER_S", 0.0)
    make_tuner(kernel, fake_clock(times, []), device="other-gpu").choose(args, {})
    err = capsys.readouterr().err
    assert "autotuning" in err and "4/4" in err and "chose BLOCK_M=16 BLOCK_N=32" in err


def test_autotune_off_and_interpreter_use_the_heuristic(cache, monkeypatch):
    kernel, args = tuned_host()
    calls = []
    host = getattr(kernel.module, kernel.name)
    monkeypatch.setenv("KGEN_AUTOTUNE", "0")                         # read when the kernel is compiled
    off = autotune.Tuner(host, autotune.Tuning(CONFIGS), kernel.source, kernel.name, bench=fake_clock({}, calls))
    assert off.choose(args, {}) is None
    for value, on in (("OFF", False), ("False", False), (" no ", False), ("On", True), ("TRUE", True), ("", True)):
        monkeypatch.setenv("KGEN_AUTOTUNE", value)
        assert autotune.enabled() is on, value
    monkeypatch.setenv("KGEN_AUTOTUNE", "of")
    with pytest.raises(kgen.KgenError, match="KGEN_AUTOTUNE: expected 1 or 0 \\(or true/false, on/off, yes/no\\), "
                                             "got 'of'"):
        autotune.Tuner(host, autotune.Tuning(CONFIGS), kernel.source, kernel.name, bench=fake_clock({}, calls))
    for untuned in (ROOT_SPECS / "vector_add.k", ROOT_SPECS / "softmax.k", "Y = X * 2"):   # nothing to tune too
        with pytest.raises(kgen.KgenError, match="KGEN_AUTOTUNE: expected 1 or 0"):
            kgen.compile(untuned)
    monkeypatch.delenv("KGEN_AUTOTUNE")
    tuner = make_tuner(kernel, fake_clock({}, calls))
    assert tuner.choose(args, {"config": CONFIGS[0]}) is None       # the caller's own config wins
    unforced = autotune.Tuner(host, autotune.Tuning(CONFIGS), kernel.source, kernel.name, bench=fake_clock({}, calls))
    if not HAS_CUDA:
        assert unforced.choose(args, {}) is None                      # interpreter: nothing to time
    assert calls == []


def test_problem_key_covers_sizes_dtypes_and_layout():
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    key = autotune.problem_key({"A": a, "B": b, "alpha": 0.5, "out": torch.empty(3)})
    assert key == "A:float32:8x4:s1 B:float32:4x6:s1"
    assert autotune.problem_key({"A": a, "B": b.t().contiguous().t()}) != key
    assert autotune.problem_key({"A": a.half(), "B": b}) != key
    assert autotune.problem_key({"A": torch.randn(8, 5), "B": b}) != key
    assert autotune.problem_key({"A": a, "B": b[:, :1].expand(4, 6)}).endswith("s0")
    rounded = autotune.problem_key({"A": torch.randn(5, 4), "B": b}, buckets=(("A", 0),))
    assert rounded == "A:float32:<=8x4:s1 B:float32:4x6:s1"
    assert autotune.problem_key({"A": torch.randn(7, 4), "B": b}, buckets=(("A", 0),)) == rounded


def default_configs():
    plan = generate("kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {\n  C = A @ B\n}\n").plans[0]
    return list(plan.tuning.configs)


def half(*shape):
    return torch.empty(*shape, dtype=torch.float16)


def test_prune_keeps_tiles_that_fit_the_problem():
    configs = default_configs()
    tiled = [c for c in configs if set(c) == set(gemm.CONFIG_KEYS)]
    big = gemm.prune(configs, {"A": half(4096, 4096), "B": half(4096, 4096)}, "A", "B")
    # big squares: every large tile, tiled and persistent; no split-K, no small tiles
    assert [c for c in configs if c["BLOCK_M"] * c["BLOCK_N"] >= 64 * 128 and "SPLIT_K" not in c] == big
    assert len(big) <= 24
    # LLM decode (M = 16): 16-row tiles, split-K among them; prefill (M = 128): tiles that fill 132 SMs
    decode = gemm.prune(configs, {"A": half(16, 4096), "B": half(4096, 4096)}, "A", "B")
    assert decode and all(c["BLOCK_M"] == 16 for c in decode) and any("SPLIT_K" in c for c in decode)
    prefill = gemm.prune(configs, {"A": half(128, 4096), "B": half(4096, 4096)}, "A", "B")
    programs = lambda c: -(-128 // c["BLOCK_M"]) * -(-4096 // c["BLOCK_N"]) * c.get("SPLIT_K", 1)  # noqa: E731
    assert all(programs(c) >= gemm.DEFAULT_SMS // 4 for c in prefill) and len(prefill) <= 24
    assert {(128, 128, 4), (64, 128, 2)} <= {(c["BLOCK_M"], c["BLOCK_N"], c["SPLIT_K"]) for c in prefill
                                              if "SPLIT_K" in c}
    # split-K needs K: 4 steps of BLOCK_K per slice
    assert not any("SPLIT_K" in c for c in gemm.prune(configs, {"A": half(16, 256), "B": half(256, 4096)}, "A", "B"))
    tiny = gemm.prune(configs, {"A": half(1, 1), "B": half(1, 1)}, "A", "B")
    assert len(tiny) == 1 and not tiny[0].get("TMA") and "SPLIT_K" not in tiny[0]
    odd = {"A": half(4096, 4095), "B": half(4095, 4096)}
    assert gemm.prune(configs, odd, "A", "B") == gemm.prune(tiled, odd, "A", "B")   # rows TMA cannot address
    batched = gemm.prune(configs, {"A": half(64, 16, 4096), "B": half(4096, 4096)}, "A", "B")
    assert not any("SPLIT_K" in c for c in batched)       # 64 batches of 16 rows fill the GPU without it


def test_operands_whose_rows_start_mid_sector_have_tma_timed_whatever_the_waves():
    """Rows 16 bytes past a multiple of 32 apart (f16 rows of 1000): the tiled kernel's copies
    lose there, TMA's loads less, so its tiles are timed even with a wave or less of them."""
    assert gemm._half_sector(half(4096, 1000)) and gemm._half_sector(half(4096, 4104)[:, :4096])
    assert not gemm._half_sector(half(4096, 1008)) and not gemm._half_sector(half(4096, 2000))
    assert gemm._half_sector(half(4096, 4104)[:, :4096].t())      # columns 4104 halfs apart
    assert not gemm._half_sector(half(1000, 4096).t())            # columns 4096 halfs apart
    configs = default_configs()
    one_wave = lambda c: c.get("TMA") and (c["BLOCK_M"], c["BLOCK_N"]) == (128, 256)  # noqa: E731  (128 tiles)
    odd = gemm.prune(configs, {"A": half(4096, 4096), "B": half(4096, 1000)}, "A", "B")
    assert any(map(one_wave, odd))
    even = gemm.prune(configs, {"A": half(4096, 4096), "B": half(4096, 1008)}, "A", "B")
    assert not any(map(one_wave, even)) and any(c.get("TMA") for c in even)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9, reason="Hopper")
def test_prune_times_tma_only_for_big_problems():
    """Below TMA_MIN_FLOP the TMA variants' host work per call costs more than their GPU
    time saves: they are not timed."""
    configs = default_configs()
    square = lambda n: {"A": torch.empty(n, n, device="cuda", dtype=torch.float16),  # noqa: E731
                        "B": torch.empty(n, n, device="cuda", dtype=torch.float16)}
    assert 2 * 2048**3 < gemm.TMA_MIN_FLOP <= 2 * 4096**3
    assert any(c.get("TMA") for c in configs)
    assert not any(c.get("TMA") for c in gemm.prune(configs, square(2048), "A", "B"))
    assert any(c.get("TMA") for c in gemm.prune(configs, square(4096), "A", "B"))
    # rows that start mid-sector: from half as many flops
    wide = lambda m, n, k: {"A": torch.empty(m, k, device="cuda", dtype=torch.float16),  # noqa: E731
                            "B": torch.empty(k, n, device="cuda", dtype=torch.float16)}
    assert 2 * 4096 * 1000 * 4096 < gemm.TMA_MIN_FLOP
    assert any(c.get("TMA") for c in gemm.prune(configs, wide(4096, 1000, 4096), "A", "B"))
    assert not any(c.get("TMA") for c in gemm.prune(configs, wide(4096, 1008, 4096), "A", "B"))
    assert not any(c.get("TMA") for c in gemm.prune(configs, wide(1024, 1000, 4096), "A", "B"))


def test_kernel_call_passes_the_tuned_config(cache, monkeypatch):
    """kgen.Kernel asks its tuner and passes the answer as config=."""
    k = kgen.compile("kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n  C = relu(A @ B)\n}\n")
    seen = []
    host = k._host
    monkeypatch.setattr(k, "_host", lambda *a, **kw: seen.append(kw.get("config")) or host(*a, **kw))
    a, b = randn(20, 30), randn(30, 10)
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}
    k._tuner = autotune.Tuner(host, autotune.Tuning(CONFIGS), k.source, k.name,
                              bench=fake_clock(times, []), device_name="fake-gpu", force=True)
    assert_close(k(a, b), torch.relu(a.double() @ b.double()), bound(a, b))
    assert seen[-1] == CONFIGS[1]


def test_tuned_configs_skip_the_hosts_check_and_cannot_change(cache, monkeypatch):
    """The tuner hands the host function its configs as the module's _Checked, which the host's
    check passes as they are rather than checking them at every call; a checked config cannot
    change, and a dict given by hand is checked at every call, changed or not."""
    k = kgen.compile("kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n  C = relu(A @ B)\n}\n")
    seen = []
    host = k._host
    monkeypatch.setattr(k, "_host", lambda *a, **kw: seen.append(kw.get("config")) or host(*a, **kw))
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0, (16, 16): 4.0}
    k._tuner = autotune.Tuner(host, autotune.Tuning(CONFIGS), k.source, k.name, bench=fake_clock(times, []),
                              device_name="fake-gpu", force=True, checked=k.module._Checked)
    a, b = randn(20, 30), randn(30, 10)
    k(a, b)
    assert_close(k(a, b), torch.relu(a.double() @ b.double()), bound(a, b))
    tuned = seen[-1]
    assert tuned == CONFIGS[1] and type(tuned) is k.module._Checked and seen[-2] is tuned
    assert k.module._check_config(tuned, (), ()) is tuned
    with pytest.raises(TypeError, match="cannot change"):
        tuned["BLOCK_M"] = 7
    assert copy.deepcopy(tuned) == tuned and pickle.loads(pickle.dumps(tuned)) == tuned
    by_hand = dict(CONFIGS[0])
    assert_close(k(a, b, config=by_hand), torch.relu(a.double() @ b.double()), bound(a, b))
    by_hand["BLOCK_M"] = 7
    with pytest.raises(kgen.CallError, match="BLOCK_M a power of two"):
        k(a, b, config=by_hand)


TUNED_ELEMENTWISE = ("kernel y(x: f16[N]) -> y: f16[N] {\n  y = x * 2\n}\n"
                     "schedule y {\n  BLOCK_SIZE = [512, 1024]\n  num_warps = [4, 8]\n}\n")


@pytest.mark.parametrize("spec", [*sorted(p.name for p in ROOT_SPECS.glob("*.k") if "@" in p.read_text()),
                                  TUNED_ELEMENTWISE])
def test_every_candidate_is_what_its_hosts_check_makes_of_it(spec):
    """Why the tuner's configs may skip the host's check: each candidate of the GEMM specs'
    kernels (list and MoE forms) and of a tuned elementwise kernel comes out of that check as
    it went in, keys, values and types."""
    kernels = kgen.compile(ROOT_SPECS / spec if spec.endswith(".k") else spec)
    for k in kernels.values() if isinstance(kernels, dict) else [kernels]:
        assert k._tuner is not None
        for tuner, host in ((k._tuner, k._host), (k._moe_tuner, k._moe_host)):
            if tuner is None:   # no MoE form
                continue
            call = re.search(r"(_check(?:_tile)?_config)\(config, (\([^)]*\)),\s*(\([^)]*\))\)",
                             inspect.getsource(host))
            required, optional = ast.literal_eval(call[2]), ast.literal_eval(call[3])
            assert tuner.checked is k.module._Checked and tuner.tuning.configs
            for config in tuner.tuning.configs:
                checked = getattr(k.module, call[1])(dict(config), required, optional)
                assert [(key, value, type(value)) for key, value in checked.items()] == \
                    [(key, value, type(value)) for key, value in config.items()]


# --- GPU ---------------------------------------------------------------------------------------

@pytest.fixture
def untuned(monkeypatch):
    monkeypatch.setenv("KGEN_AUTOTUNE", "0")       # the heuristic config: no minutes of tuning per shape


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (257, 131, 1000), (4096, 1024, 512), (16, 4096, 4096)])
def test_gpu_leaky_relu_matmul(untuned, dtype, m, n, k):
    dt = DTYPES[dtype]
    a, b = randn(m, k, dtype=dt), randn(k, n, dtype=dt, transposed=True)
    c = compiled("C = leaky_relu(A @ B)")(a, b)
    assert_close(c, F.leaky_relu(a.double() @ b.double(), 0.01), bound(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, True)])
def test_gpu_every_candidate_config(untuned, dtype, a_t, b_t):
    """Each default candidate, tiled and persistent-TMA, on edge sizes (TMA-aligned rows)."""
    dt = DTYPES[dtype]
    a, w, bias = randn(304, 136, dtype=dt, transposed=a_t), randn(136, 200, dtype=dt, transposed=b_t), randn(200)
    k = compiled("C = gelu(A @ W + b)")
    k(a, w, bias)
    module, want = k._last.module, F.gelu(a.double() @ w.double() + bias.double())
    ran = set()
    for config in module.c_configs:
        with watching(module, "c_tma_kernel") as (tma,):
            try:
                got = getattr(module, k._last.name)(a, w, bias, config=config)
            except triton.runtime.errors.OutOfResources:
                continue            # the autotuner skips a config that does not fit this GPU
        assert tma.count == bool(config.get("TMA")), config
        assert_close(got, want, bound(a, w), factor=1.2)
        ran.add(bool(config.get("TMA")))
    assert ran == {False, True}


@pytest.mark.gpu
def test_gpu_configs_are_timed_from_cuda_graphs(monkeypatch):
    """The GEMM's and the elementwise tuners time GPU work alone: every kind of GEMM config
    (tiled, split-K, persistent TMA) and an elementwise kernel's are captured in a CUDA graph,
    none timed call by call."""
    import triton.testing
    a, w, bias = randn(304, 136, dtype=torch.float16), randn(136, 200, dtype=torch.float16), randn(200)
    k = compiled("C = gelu(A @ W + b)")
    ew = kgen.compile("kernel f(x: f32[M, N]) -> y: f32[M, N] {\n    y = x * sigmoid(x) + 1\n}\n"
                      "schedule f {\n    BLOCK_SIZE = [256, 2048]\n    num_warps = [2, 8]\n}\n")
    x = randn(1000, 300)
    monkeypatch.setenv("KGEN_AUTOTUNE", "0")
    k(a, w, bias), ew(x)
    assert k._last._tuner.tuning.graphs and ew._tuner.tuning.graphs
    module, host = k._last.module, getattr(k._last.module, k._last.name)
    out = torch.empty(304, 200, device="cuda")   # f32: the bias is
    kinds = set()
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **kw: pytest.fail("a config was timed call by call"))
    for config in module.c_configs:
        try:
            host(a, w, bias, out=out, config=config)
        except triton.runtime.errors.OutOfResources:
            continue            # the autotuner skips a config that does not fit this GPU
        assert 0 < autotune.do_bench(lambda: host(a, w, bias, out=out, config=config), True) < 10, config
        kinds.add("TMA" if config.get("TMA") else "split-K" if config.get("SPLIT_K", 1) > 1 else "tiled")
        assert_close(out, F.gelu(a.double() @ w.double() + bias.double()), bound(a, w), factor=1.2)
    assert kinds == {"tiled", "split-K", "TMA"}
    y = torch.empty_like(x)
    ew_host = getattr(ew.module, ew.name)
    assert len(ew._tuner.tuning.configs) == 4
    for config in ew._tuner.tuning.configs:
        assert 0 < autotune.do_bench(lambda: ew_host(x, out=y, config=config), True) < 10
        torch.testing.assert_close(y, x * torch.sigmoid(x) + 1)


@pytest.mark.gpu
def test_gpu_f32_precisions(untuned):
    a, b = randn(300, 500), randn(500, 200)
    assert_close(compiled("C = A @ B")(a, b), a.double() @ b.double(), bound(a, b), precision="tf32")
    spec = ("kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n    C = A @ B\n}\n"
            "schedule mm {\n    input_precision = ieee\n}\n")
    assert_close(kgen.compile(spec)(a, b), a.double() @ b.double(), bound(a, b))


@pytest.mark.gpu
def test_gpu_bf16_batched_epilogue(untuned):
    a, w = randn(4, 100, 64, dtype=torch.bfloat16), randn(64, 300, dtype=torch.bfloat16)
    bias = randn(300, dtype=torch.bfloat16)
    c = compiled("C = gelu(A @ W + b)")(a, w, bias)
    assert_close(c, F.gelu(a.double() @ w.double() + bias.double()), bound(a, w), factor=1.2)


@pytest.mark.gpu
def test_gpu_autotune_persists(cache, monkeypatch):
    monkeypatch.delenv("KGEN_AUTOTUNE", raising=False)       # the test session turns tuning off
    k = compiled("C = silu(A @ B)")
    a, b = randn(512, 512, dtype=torch.float16), randn(512, 512, dtype=torch.float16)
    c = k(a, b)
    tuner = k._last._tuner
    assert tuner.tuned == 1 and tuner.last is not None and list((cache / "autotune").rglob("*.json"))
    assert_close(c, F.silu(a.double() @ b.double()), bound(a, b), factor=1.2)
    fresh = autotune.Tuner(tuner.host, tuner.tuning, tuner.source, tuner.name)     # as a second process would
    assert fresh.choose((a, b), {}) == tuner.last and fresh.tuned == 0


def test_bf16_matmuls_run_on_cuda_and_are_refused_by_the_interpreter():
    """Triton's interpreter returns garbage for a bf16 tl.dot (numpy has no bf16): there the
    GEMM hosts refuse the call, naming the bf16 operand; on a GPU they compute it."""
    a, b = randn(33, 24, dtype=torch.bfloat16), randn(24, 17, dtype=torch.bfloat16)
    grouped = kgen.compile(ROOT_SPECS.joinpath("grouped_gemm.k").read_text().replace("f16", "bf16"))
    ab = a.double() @ b.double()
    calls = [(lambda: compiled("C = leaky_relu(A @ B)")(a, b), "A", F.leaky_relu(ab, 0.01)),
             (lambda: compiled("C = bf16(X) @ W")(a.float(), b), "X", ab),
             (lambda: torch.cat(grouped([a[:5], a[5:]], [b, b])), "A", ab),
             (lambda: grouped.moe(a, torch.stack([b, b]), offs=[5, 33]), "A", ab)]
    for call, name, want in calls:
        if HAS_CUDA:
            assert_close(call(), want, bound(a, b))
        else:
            with pytest.raises(kgen.CallError, match=f"{name}: bf16 matmuls need a CUDA device"):
                call()


@pytest.mark.gpu
@pytest.mark.parametrize("m, k", [(1, 2**31 - 1000), (2**31 - 1000, 1)], ids=["deep", "tall"])
def test_gpu_sizes_within_reach_of_2_31(untuned, m, k):
    """M or K under 2**31 but within a tile of it: the kernel's tile arithmetic goes int64 (a K
    of 2**31 - 1 had left its last slice out: a product of 0), and TMA, whose coordinates are
    int32, steps aside."""
    kernel = kgen.compile("C = A @ B")
    if k > 1:   # a few nonzero products, first and last along K
        a = torch.zeros(m, k, dtype=torch.float16, device="cuda")
        b = torch.zeros(k, 1, dtype=torch.float16, device="cuda")
        a[0, 0], a[0, -1], b[0, 0], b[-1, 0] = 2.0, 1.0, 5.0, 3.0
    else:       # small integers: every product exact
        a = torch.randint(-3, 4, (m, k), dtype=torch.float16, device="cuda")
        b = torch.full((k, 1), 2.0, dtype=torch.float16, device="cuda")
    c = kernel(a, b)
    for got, rows in zip(c.split(2**28), a.split(2**28)):   # (torch's temporaries)
        assert torch.equal(got, rows @ b)
    del a, b, c
    torch.cuda.empty_cache()
