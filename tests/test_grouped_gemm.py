"""The grouped GEMM pattern: lists of GEMMs of different sizes in one persistent launch,
and the MoE layout (``kernel.moe(A, B, offs=offs)``), against the float64 reference per
problem and against torch loops.

Without a GPU the kernels run on Triton's interpreter with 32 x 32 x 32 tiles and 4
persistent programs, so the sizes drawn here (1, primes, 31 / 32 / 33, 64 / 65) cross
tile boundaries and every program walks tiles of several problems.  Tolerances scale
with K through |A| @ |B|, as in test_gemm.py.
"""
from __future__ import annotations

import random
import re
from contextlib import contextmanager
from functools import lru_cache

import numpy
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgen
from kgen import autotune
from kgen.patterns import gemm, grouped_gemm
from kgen.reference import evaluate

from conftest import DEVICE, HAS_CUDA, examples

SETTINGS = settings(deadline=None, max_examples=examples(20), suppress_health_check=[HealthCheck.too_slow])
DTYPES = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}
ACC_EPS = {"ieee": 2.0 ** -22, "tf32": 2.0 ** -9}
PRECISION = "tf32" if HAS_CUDA else "ieee"     # f32 operands use TF32 on a GPU


@lru_cache(maxsize=None)
def compiled(text: str):
    return kgen.compile(text)


def randn(*shape, dtype=torch.float32, layout="rows"):
    """A tensor of ``shape``: row-major, column-major ("cols", strides only) or a slice of a
    wider tensor ("sliced": rows 2 elements apart from a multiple of 16 bytes)."""
    if layout == "cols":
        return torch.randn(shape[1], shape[0]).to(device=DEVICE, dtype=dtype).t()
    if layout == "sliced":
        return torch.randn(shape[0], shape[1] + 3).to(device=DEVICE, dtype=dtype)[:, 3:]
    return torch.randn(*shape).to(device=DEVICE, dtype=dtype)


def bound(a, b):
    return a.double().abs() @ b.double().abs()


def assert_close(got, want, err_bound, factor=1.0, precision="ieee"):
    assert got.shape == want.shape, (got.shape, want.shape)
    want = want.double()
    if precision == "ieee" and got.is_cuda:
        precision = "tf32"      # on a GPU, f32 operands run on TF32 tensor cores
    diff = (got.double() - want).abs()
    tol = RTOL[got.dtype] * want.abs() + ACC_EPS[precision] * err_bound * factor + 1e-6
    bad = diff > tol
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} elements off; worst {diff.max().item():.3g} "
                           f"at {bad.nonzero()[0].tolist()}")


def assert_group_close(got, want, a, b, factor=1.0, precision="ieee"):
    assert isinstance(got, list) and len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        try:
            assert_close(g, w, bound(a[i], b[i]), factor, precision)
        except AssertionError as e:
            raise AssertionError(f"problem {i} of {len(got)}: {e}") from None


class Launches:
    def __init__(self, kernel):
        self.kernel, self.count, self.grids, self.flatten = kernel, 0, [], []

    def __getitem__(self, grid):
        self.count += 1
        self.grids.append(grid)

        def launch(*args, **options):
            self.flatten.append(options.get("FLATTEN"))
            return self.kernel[grid](*args, **options)
        return launch


@contextmanager
def watching(module, name):
    """Count the launches of the module's kernel ``name`` inside the block."""
    saved = getattr(module, name)
    launches = Launches(saved)
    setattr(module, name, launches)
    try:
        yield launches
    finally:
        setattr(module, name, saved)


# --- the headline calls ------------------------------------------------------------------------

def test_leaky_relu_of_matmul_over_lists_returns_a_list():
    k = compiled("C = leaky_relu(A @ B)")
    shapes = [(65, 47, 33), (1, 1, 1), (31, 70, 5)]
    a = [randn(m, kk, dtype=torch.float16) for m, n, kk in shapes]
    b = [randn(kk, n, dtype=torch.float16) for m, n, kk in shapes]
    c = k(a, b)
    assert k.pattern == "grouped_gemm" and isinstance(c, list) and len(c) == 3
    for ai, bi, ci in zip(a, b, c):
        assert ci.dtype == torch.float16 and ci.shape == (ai.shape[0], bi.shape[1])
    assert_group_close(c, [F.leaky_relu(x.float() @ y.float(), 0.01) for x, y in zip(a, b)], a, b)


def test_one_launch_for_the_group():
    k = compiled("C = A @ B")
    a = [randn(m, 40) for m in (3, 70, 0, 33)]
    b = [randn(40, n) for n in (9, 64, 5, 1)]
    k(a, b)
    module = k._last.module
    with watching(module, "c_kernel") as launches:
        c = k(a, b)
    assert launches.count == 1 and launches.grids[0][0] <= 4      # the interpreter's persistent programs
    assert_group_close(c, [x.double() @ y.double() for x, y in zip(a, b)], a, b)


def test_spec_grouped_gemm_is_tutorial_08():
    k = kgen.compile("specs/grouped_gemm.k")
    sizes = [(97, 64, 128), (33, 65, 31), (128, 32, 64), (0, 64, 64)]
    a = [randn(m, kk, dtype=torch.float16) for m, n, kk in sizes]
    b = [randn(kk, n, dtype=torch.float16) for m, n, kk in sizes]
    c = k(a, b)
    assert [tuple(t.shape) for t in c] == [(m, n) for m, n, _ in sizes]
    assert_group_close(c, [x.float() @ y.float() for x, y in zip(a, b)], a, b)


def test_spec_grouped_linear_gelu_with_bias_list():
    k = kgen.compile("specs/grouped_linear_gelu.k")
    sizes = [(17, 45, 64), (40, 8, 33), (1, 100, 7)]
    x = [randn(m, kk, dtype=torch.float16) for m, n, kk in sizes]
    w = [randn(kk, n, dtype=torch.float16, layout="cols") for m, n, kk in sizes]     # W stored as [N, K]
    bias = [randn(n, dtype=torch.float16) for m, n, kk in sizes]
    y = k(x, w, bias)
    want = [F.gelu(F.linear(xi.double(), wi.double().t(), bi.double())) for xi, wi, bi in zip(x, w, bias)]
    assert_group_close(y, want, x, w, factor=1.2)


# --- properties: group counts, sizes, layouts, dtypes, epilogues -------------------------------------

EPILOGUES = {
    # spec: extra list inputs (name -> per-problem shape from (M, N)), max |d epilogue / d acc|
    "C = A @ B": ({}, 1.0),
    "C = leaky_relu(A @ B)": ({}, 1.0),
    "C = gelu(A @ B + b)": ({"b": lambda m, n: (n,)}, 1.2),
    "C = (A @ B) * s + R": ({"s": lambda m, n: (m, 1), "R": lambda m, n: (m, n)}, 4.0),
    "C = silu(A @ B)": ({}, 1.2),
    "C = clamp(A @ B, -2.0, 3.0)": ({}, 1.0),
}
SIZES = [1, 2, 3, 7, 13, 31, 32, 33, 47, 64, 65]
SMALL = [1, 2, 5, 16, 17, 33]


@st.composite
def groups(draw):
    """G problems of sizes that cross the interpreter's 32-wide tiles; smaller when G is large;
    some problems empty (M = 0)."""
    g = draw(st.integers(1, 16))
    sizes = st.sampled_from(SIZES if g <= 4 else SMALL)
    problems = [(draw(st.sampled_from([0]) | sizes) if draw(st.integers(0, 5)) == 0 else draw(sizes),
                 draw(sizes), draw(sizes)) for _ in range(g)]
    layout = draw(st.sampled_from(["rows", "b cols", "a cols", "mixed", "sliced"]))
    return problems, layout, draw(st.sampled_from(sorted(EPILOGUES))), draw(st.sampled_from(["f16", "f32"]))


def make_group(problems, layout, dtype, rng):
    a, b = [], []
    for m, n, k in problems:
        a_layout = ("cols" if layout == "a cols" or (layout == "mixed" and rng.random() < 0.5) else
                    "sliced" if layout == "sliced" else "rows")
        b_layout = ("cols" if layout == "b cols" or (layout == "mixed" and rng.random() < 0.5) else
                    "sliced" if layout == "sliced" else "rows")
        a.append(randn(m, k, dtype=dtype, layout=a_layout))
        b.append(randn(k, n, dtype=dtype, layout=b_layout))
    return a, b


@SETTINGS
@given(groups())
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_grouped_gemm_matches_reference(case):
    problems, layout, spec, dtype_name = case
    dtype = DTYPES[dtype_name]
    rng = random.Random(len(problems))
    a, b = make_group(problems, layout, dtype, rng)
    extras, factor = EPILOGUES[spec]
    args = {"A": a, "B": b}
    for name, shape in extras.items():
        args[name] = [randn(*shape(m, n), dtype=dtype) for m, n, _ in problems]
    k = compiled(spec)
    got = k(*[args[n] for n in k.inputs])
    assert k.pattern == "grouped_gemm"
    (want,) = evaluate(k.ir, args)
    assert_group_close(got, want, a, b, factor, PRECISION)
    if spec == "C = A @ B":      # and against a torch loop
        assert_group_close(got, [x.double() @ y.double() for x, y in zip(a, b)], a, b, 1.0, PRECISION)


@pytest.mark.parametrize("sizes", [[(5, 0, 7), (0, 3, 4)], [(4, 6, 0), (9, 33, 0)], [(0, 5, 5)],
                                   [(3, 4, 5), (0, 0, 0), (2, 0, 1)]])
def test_empty_problems_and_k_zero(sizes):
    k = compiled("C = relu(A @ B + 0.5)")
    a = [randn(m, kk) for m, n, kk in sizes]
    b = [randn(kk, n) for m, n, kk in sizes]
    c = k(a, b)
    assert_group_close(c, [torch.relu(x.double() @ y.double() + 0.5) for x, y in zip(a, b)], a, b)


def test_scalar_argument_beside_lists():
    k = compiled("C = leaky_relu(A @ B, alpha)")
    a = [randn(33, 20), randn(7, 65)]
    b = [randn(20, 40), randn(65, 3)]
    for alpha in (0.2, 0.5):
        c = k(a, b, alpha)
        assert_group_close(c, [F.leaky_relu(x.double() @ y.double(), alpha) for x, y in zip(a, b)], a, b)


def test_prologue_on_an_operand():
    k = compiled("C = relu(A) @ B")
    a, b = [randn(40, 33), randn(5, 70)], [randn(33, 9), randn(70, 64)]
    c = k(a, b)
    assert_group_close(c, [torch.relu(x.double()) @ y.double() for x, y in zip(a, b)], a, b)


def test_out_lists_and_several_outputs():
    k = compiled("P = A @ B\nC = relu(P)\nD = P * 2.0")
    a, b = [randn(9, 40), randn(33, 2)], [randn(40, 17), randn(2, 65)]
    out = ([torch.empty(9, 17, device=DEVICE), torch.empty(33, 65, device=DEVICE)],
           [torch.empty(9, 17, device=DEVICE), torch.empty(33, 65, device=DEVICE)])
    c, d = k(a, b, out=out)
    assert all(x is y for x, y in zip(c + d, out[0] + out[1]))
    assert_group_close(c, [torch.relu(x.double() @ y.double()) for x, y in zip(a, b)], a, b)
    assert_group_close(d, [2 * (x.double() @ y.double()) for x, y in zip(a, b)], a, b, factor=2.0)


def test_outputs_of_one_width_share_an_allocation_and_others_are_aligned():
    k = compiled("C = A @ B")
    a = [randn(m, 8) for m in (3, 5, 7)]
    same = k(a, [randn(8, 24) for _ in a])
    assert same[1].data_ptr() == same[0].data_ptr() + 3 * 24 * 4        # rows after rows
    mixed = k(a, [randn(8, n) for n in (3, 5, 7)])
    assert all((t.data_ptr() - mixed[0].data_ptr()) % 128 == 0 and t.is_contiguous() for t in mixed)


# --- the metadata table and the layout constexprs ------------------------------------------------------

def table_of(k, a, b):
    """(module, (table, tiles, layout, shared), again): what the host computes for the interpreter's
    config, and the same computed a second time for the same tensors."""
    c = k(a, b)
    module = k._last.module
    sizes = [t.shape[0] for t in a], [t.shape[1] for t in b], [t.shape[1] for t in a]
    config = module._c_config(*sizes[:2], torch.device("cpu"))   # the small tiles the counts below assume
    table = lambda: module._group_table(torch.device(DEVICE), *sizes, (("A", a), ("B", b), ("C", c)),  # noqa: E731
                                        config, 8)
    return module, table(), table()


def test_table_rows_and_the_cache():
    k = compiled("C = A @ B")
    a = [randn(40, 64, dtype=torch.float16), randn(0, 64, dtype=torch.float16), randn(7, 16, dtype=torch.float16)]
    b = [randn(64, 33, dtype=torch.float16), randn(64, 8, dtype=torch.float16), randn(16, 64, dtype=torch.float16)]
    module, (table, tiles, layout, shared), again = table_of(k, a, b)
    ends, rows = table[:3].tolist(), table[3:].view(3, -1).tolist()
    assert ends == [4, 4, 6] and tiles == 6                       # 2 x 2 tiles, none, 1 x 2 tiles
    assert [r[:3] for r in rows] == [[40, 33, 64], [0, 8, 64], [7, 64, 16]]
    assert [r[3] for r in rows] == [t.data_ptr() for t in a] and [r[4] for r in rows] == [t.data_ptr() for t in b]
    assert rows[0][6:10] == [64, 1, 33, 1]
    assert again[0] is table          # the same tensors again: the same table, no second copy
    assert not shared                 # K differs: the kernel reads each tile's row


def test_kernels_of_one_module_do_not_share_tables():
    """Two grouped kernels of one spec file, called with the same tensors, each get the table
    and layout of their own parameters (names and roles swapped here)."""
    ks = kgen.compile("kernel g1(A: [f16[M, K]], B: [f16[K, N]]) -> C: [f16[M, N]] { C = A @ B }\n"
                      "kernel g2(B: [f16[M, K]], A: [f16[K, N]]) -> C: [f16[M, N]] { C = B @ A }\n"
                      "kernel g3(X: [f16[M, K]], W: [f16[K, N]]) -> Y: [f16[M, N]] { Y = X @ W }")
    h = torch.float16
    a = [randn(5, 8, dtype=h), randn(7, 40, dtype=h)]
    b = [randn(8, 3, dtype=h, layout="cols"), randn(40, 6, dtype=h, layout="cols")]
    out = [torch.empty(5, 3, dtype=h, device=DEVICE), torch.empty(7, 6, dtype=h, device=DEVICE)]
    for kernel in (ks.g1, ks.g2, ks.g3, ks.g1):
        for c in out:
            c.fill_(float("nan"))
        got = kernel(a, b, out=out)
        assert_group_close(got, [x.double() @ y.double() for x, y in zip(a, b)], a, b)


def test_bool_tensors_in_a_group():
    h = torch.float16
    a, b = [randn(5, 8, dtype=h), randn(33, 3, dtype=h)], [randn(8, 6, dtype=h), randn(3, 40, dtype=h)]
    positive = kgen.compile("kernel g(A: [f16[M, K]], B: [f16[K, N]]) -> C: [bool[M, N]] { C = (A @ B) > 0 }")
    got = positive(a, b)
    want = [(x.float() @ y.float()) > 0 for x, y in zip(a, b)]
    for g, w, x, y in zip(got, want, a, b):
        near_zero = (x.double() @ y.double()).abs() < 1e-2
        assert g.dtype == torch.bool and torch.equal(g | near_zero, w | near_zero)
    masks = [torch.rand(5, 6, device=DEVICE) > 0.5, torch.rand(33, 40, device=DEVICE) > 0.5]
    keep = kgen.compile("kernel g(mk: [bool[M, N]], A: [f16[M, K]], B: [f16[K, N]]) -> C: [f16[M, N]] "
                        "{ C = where(mk, A @ B, 0.0) }")
    got = keep(masks, a, b)
    assert_group_close(got, [torch.where(m, x.double() @ y.double(), 0.0) for m, x, y in zip(masks, a, b)], a, b)


def test_layout_constexprs():
    k = compiled("C = A @ B")
    h = torch.float16
    a, b = [randn(32, 64, dtype=h), randn(16, 128, dtype=h)], [randn(64, 48, dtype=h), randn(128, 8, dtype=h)]
    _, (_, _, layout, _), _ = table_of(k, a, b)
    assert layout == {"A_UNIT": 1, "B_UNIT": 1, "C_UNIT": 1, "G_BLOCK": 32, "EVEN_K": True, "ALIGNED": True,
                      "INT64": False}
    bt = [randn(64, 48, dtype=h, layout="cols"), randn(128, 8, dtype=h, layout="cols")]
    _, (_, _, layout, _), _ = table_of(k, a, bt)
    assert layout["B_UNIT"] == 0 and layout["ALIGNED"]
    mixed = [bt[0], b[1]]
    _, (_, _, layout, _), _ = table_of(k, a, mixed)
    assert layout["B_UNIT"] == -1 and not layout["ALIGNED"]     # a stride of 1 is no multiple of 8
    sliced = [randn(32, 64, dtype=h, layout="sliced"), a[1]]
    _, (_, _, layout, _), _ = table_of(k, sliced, b)
    assert layout["A_UNIT"] == 1 and not layout["ALIGNED"]
    odd = [randn(32, 60, dtype=h), a[1]], [randn(60, 48, dtype=h), b[1]]
    _, (_, _, layout, _), _ = table_of(k, *odd)
    assert not layout["EVEN_K"] and not layout["ALIGNED"]                  # K = 60 is no multiple of 8 halfs


def test_a_per_row_operand_keeps_the_group_aligned(monkeypatch):
    """A per-row [M, 1] list operand: the kernel reads its first stride only, so its second (1
    in a contiguous column, no multiple of 8) neither turns ALIGNED off nor takes the unit
    axis, which is its first; the kernel then computes what torch does, transposed or sliced."""
    h = torch.float16
    k = kgen.compile("kernel g(A: [f16[M, K]], B: [f16[K, N]], s: [f16[M, 1]]) -> C: [f16[M, N]] "
                     "{ C = (A @ B) * s }")
    a, b = [randn(32, 64, dtype=h), randn(16, 128, dtype=h)], [randn(64, 48, dtype=h), randn(128, 8, dtype=h)]
    tables = []
    table = k.module._group_table
    monkeypatch.setattr(k.module, "_group_table", lambda *args, **kw: tables.append(table(*args, **kw)) or tables[-1])
    for s, unit, aligned in (([randn(32, 1, dtype=h), randn(16, 1, dtype=h)], 0, True),
                             ([randn(1, 32, dtype=h).T, randn(1, 16, dtype=h).T], 0, True),
                             ([randn(32, 3, dtype=h)[:, 1:2], randn(16, 3, dtype=h)[:, 1:2]], -1, False)):
        got = k(a, b, s)
        assert_group_close(got, [(x.double() @ y.double()) * z.double() for x, y, z in zip(a, b, s)], a, b)
        layout = tables[-1][2]
        assert (layout["s_UNIT"], layout["ALIGNED"]) == (unit, aligned), layout


def test_problems_share_sizes_and_strides_where_every_problem_with_tiles_does():
    k = compiled("C = A @ B")
    h = torch.float16
    rows = [randn(m, 40, dtype=h) for m in (33, 0, 5)]
    weights = [randn(40, 24, dtype=h) for _ in rows]
    assert table_of(k, rows, weights)[1][3]                           # M differs, and M = 0 has no tiles
    assert not table_of(k, rows, weights[:2] + [randn(40, 8, dtype=h)])[1][3]                     # N
    assert not table_of(k, rows[:2] + [randn(5, 16, dtype=h)], weights[:2] + [randn(16, 24, dtype=h)])[1][3]  # K
    assert not table_of(k, rows, weights[:2] + [randn(40, 24, dtype=h, layout="cols")])[1][3]    # B's strides
    assert not table_of(k, rows, weights[:2] + [randn(40, 24, dtype=h, layout="sliced")])[1][3]
    many = [randn(1, 8, dtype=h) for _ in range(k._last.module._SHARED_MAX_G + 1)]
    assert not table_of(k, many, [randn(8, 8, dtype=h)] * len(many))[1][3]


@SETTINGS
@given(st.lists(st.sampled_from([0, 1, 7, 31, 33, 65]), min_size=1, max_size=6), st.sampled_from([1, 17, 32, 48]),
       st.sampled_from([1, 16, 33, 64]), st.sampled_from(["rows", "b cols", "a cols"]),
       st.sampled_from(["C = A @ B", "C = gelu(A @ B + b)", "C = (A @ B) * s + R"]))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_flattened_list_kernel_reads_shared_sizes_once_and_matches_reference(rows, n, kk, layout, spec):
    """Groups whose problems share N and K, with FLATTEN asked: where they share strides too, the
    kernel reads them once and holds each problem's M and addresses; with 16 x 16 tiles the
    interpreter's 4 programs take several tiles each (otherwise the host does not flatten: a
    GPU's programs mostly take one here, and the GPU test of every config flattens)."""
    a, b = make_group([(m, n, kk) for m in rows], layout, torch.float32, random.Random(0))
    extras, factor = EPILOGUES[spec]
    args = {"A": a, "B": b, **{name: [randn(*shape(m, n)) for m in rows] for name, shape in extras.items()}}
    k = compiled(spec)
    k(*[args[x] for x in k.inputs])
    module, name = k._last.module, k._last.name
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 1,
              "programs_per_sm": 1, "FLATTEN": True}
    with watching(module, f"{name}_kernel") as launches:
        got = getattr(module, name)(*[args[x] for x in k.inputs], config=config)
    tiles = sum(-(-m // 16) * -(-n // 16) for m in rows)
    assert launches.count == (1 if tiles else 0)
    if tiles:    # column-major A: its strides follow M
        programs = launches.grids[0][0]
        assert launches.flatten == [tiles > programs and (layout != "a cols" or len({m for m in rows if m}) == 1)]
    (want,) = evaluate(k.ir, args)
    assert_group_close(got, want, a, b, factor, PRECISION)


def test_groups_that_do_not_share_sizes_are_not_flattened():
    k = compiled("C = A @ B")
    a, b = [randn(40, 33), randn(50, 20)], [randn(33, 40), randn(20, 40)]
    k(a, b)
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 1,
              "programs_per_sm": 1, "FLATTEN": True}
    module, name = k._last.module, k._last.name
    with watching(module, f"{name}_kernel") as launches:
        got = getattr(module, name)(a, b, config=config)
    assert launches.flatten == [False]
    assert_group_close(got, [x.double() @ y.double() for x, y in zip(a, b)], a, b)


def test_int64_offsets_path(monkeypatch):
    k = compiled("C = gelu(A @ B + b)")
    a, b, bias = [randn(33, 20), randn(5, 40)], [randn(20, 47), randn(40, 3)], [randn(47), randn(3)]
    k(a, b, bias)
    module = k._last.module
    monkeypatch.setattr(module, "_I32_LIMIT", 64)
    module._GROUP_TABLES.clear()
    c = k(a, b, bias)
    (_, _, layout, _), = module._GROUP_TABLES.values()
    assert layout["INT64"]
    assert_group_close(c, [F.gelu(x.double() @ y.double() + z.double()) for x, y, z in zip(a, b, bias)], a, b, 1.2)
    offs = torch.tensor([10, 30], dtype=torch.int32, device=DEVICE)
    a2, w2, b2 = randn(30, 20), torch.randn(2, 20, 47, device=DEVICE), randn(2, 47)
    y = k.moe(a2, w2, b2, offs=offs)
    want = torch.cat([F.gelu(a2[:10].double() @ w2[0].double() + b2[0].double()),
                      F.gelu(a2[10:].double() @ w2[1].double() + b2[1].double())])
    assert_close(y, want, torch.cat([bound(a2[:10], w2[0]), bound(a2[10:], w2[1])]), 1.2)


def test_explicit_configs_agree():
    k = compiled("C = silu(A @ B)")
    a, b = [randn(70, 40), randn(3, 100)], [randn(40, 33), randn(100, 64)]
    k(a, b)
    host = getattr(k._last.module, k._last.name)
    want = [F.silu(x.double() @ y.double()) for x, y in zip(a, b)]
    for bm, bn, bk, group in [(16, 16, 16, 1), (32, 64, 16, 4), (64, 16, 32, 2)]:
        config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": 4, "num_stages": 1,
                  "programs_per_sm": 1}
        assert_group_close(host(a, b, config=config), want, a, b, 1.2)


# --- the TMA variants (Hopper; Triton's interpreter reads descriptors too) ---------------------------

def tma_config(bm=32, bn=32, bk=16, group=2):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": 4, "num_stages": 1,
            "programs_per_sm": 1, "TMA": True}


@settings(deadline=None, max_examples=examples(10))
@given(st.lists(st.tuples(st.sampled_from([0, 1, 5, 33, 64]), st.sampled_from([8, 40, 64]),
                          st.sampled_from([0, 8, 24, 64])), min_size=1, max_size=5),
       st.sampled_from(["rows", "b cols", "a cols"]), st.sampled_from([tma_config(), tma_config(16, 64, 32, 1)]))
def test_tma_variant_of_the_list_kernel(problems, layout, config):
    if layout == "a cols":      # A's rows are its contiguous axis: M a multiple of 8 halfs keeps it aligned
        problems = [(-(-m // 8) * 8, n, k) for m, n, k in problems]
    a, b = make_group(problems, layout, torch.float16, random.Random(0))
    bias = [randn(n, dtype=torch.float16) for _, n, _ in problems]
    k = compiled("C = gelu(A @ B + b)")
    k(a, b, bias)
    module = k._last.module
    with watching(module, "c_tma_kernel") as tma:
        got = getattr(module, "c")(a, b, bias, config=config)
    assert tma.count == (1 if any(m for m, _, _ in problems) else 0)
    want = [F.gelu(x.double() @ y.double() + z.double()) for x, y, z in zip(a, b, bias)]
    assert_group_close(got, want, a, b, 1.2)


def test_tma_falls_back_where_it_cannot_read():
    """Unaligned rows, or operands without a contiguous axis: the pointer kernel, same tiles."""
    k = compiled("C = A @ B")
    h = torch.float16
    a = [randn(33, 40, dtype=h, layout="sliced"), randn(8, 16, dtype=h)]
    b = [randn(40, 24, dtype=h), randn(16, 8, dtype=h)]
    k(a, b)
    module = k._last.module
    for a_, b_ in [(a, b), ([a[1]], [randn(16, 32, dtype=h)[:, ::2]])]:
        with watching(module, "c_tma_kernel") as tma, watching(module, "c_kernel") as plain:
            got = module.c(a_, b_, config=tma_config())
        assert tma.count == 0 and plain.count == 1
        assert_group_close(got, [x.double() @ y.double() for x, y in zip(a_, b_)], a_, b_)


@settings(deadline=None, max_examples=examples(10))
@given(st.lists(st.sampled_from([0, 1, 5, 33, 64]), min_size=1, max_size=6), st.sampled_from([8, 40, 64]),
       st.sampled_from([8, 24, 64]), st.booleans(), st.booleans())
def test_tma_variant_of_the_moe_kernel(rows, k, n, a_t, w_t):
    offs = [sum(rows[:i + 1]) for i in range(len(rows))]
    total = -(-(offs[-1] + 5) // 8) * 8         # aligned columns when A is column-major
    a = randn(total, k, dtype=torch.float16, layout="cols" if a_t else "rows")
    w = torch.randn(len(rows), k, n, device=DEVICE).half()
    if w_t:
        w = w.transpose(1, 2).contiguous().transpose(1, 2)
    bias = randn(len(rows), n, dtype=torch.float16)
    kernel = compiled("C = gelu(A @ B + b)")
    kernel.moe(a, w, bias, offs=offs)
    module = kernel._last.module
    out = torch.full((total, n), 3.0, device=DEVICE, dtype=torch.float16)
    with watching(module, "c_moe_tma_kernel") as tma:
        got = module.c_moe(a, w, bias, offs=offs, out=out, config=tma_config())
    assert tma.count == (0 if a_t else 1)      # a column-major A: TMA loads would start off 16-byte boundaries
    want = moe_reference(a, w, offs, lambda y, g: F.gelu(y + bias[g].double()))
    assert_close(got[:offs[-1]], want, moe_bound(a, w, offs), 1.2)
    assert (got[offs[-1]:] == 3.0).all()


# --- the MoE layout ---------------------------------------------------------------------------------

def moe_reference(a, w, offs, fn=lambda y, g: y):
    rows, start = [], 0
    for g, end in enumerate(offs):
        rows.append(fn(a[start:end].double() @ w[g].double(), g))
        start = end
    return torch.cat(rows)


def moe_bound(a, w, offs):
    parts, start = [], 0
    for g, end in enumerate(offs):
        parts.append(bound(a[start:end], w[g]))
        start = end
    return torch.cat(parts)


@SETTINGS
@given(st.lists(st.sampled_from([0, 0, 1, 5, 31, 33, 64]), min_size=1, max_size=8),
       st.sampled_from([1, 16, 33, 64]), st.sampled_from([1, 8, 47]), st.sampled_from(["f16", "f32"]),
       st.sampled_from(["rows", "w cols", "a cols"]), st.booleans())
def test_moe_layout_matches_a_torch_loop(rows, k, n, dtype_name, layout, as_list):
    dtype = DTYPES[dtype_name]
    offs = [sum(rows[:i + 1]) for i in range(len(rows))]
    total = offs[-1] + 3          # rows past offs[-1] are not the group's
    a = randn(total, k, dtype=dtype, layout="cols" if layout == "a cols" else "rows")
    w = torch.randn(len(rows), k, n).to(device=DEVICE, dtype=dtype)
    if layout == "w cols":
        w = w.transpose(1, 2).contiguous().transpose(1, 2)
    out = torch.full((total, n), 7.0, device=DEVICE, dtype=dtype)
    k_ = compiled("C = leaky_relu(A @ B)")
    got = k_.moe(a, w, offs=offs if as_list else torch.tensor(offs, dtype=torch.int32, device=DEVICE), out=out)
    assert got is out
    want = moe_reference(a, w, offs, lambda y, g: F.leaky_relu(y, 0.01))
    assert_close(got[:offs[-1]], want, moe_bound(a, w, offs), 1.0, PRECISION)
    assert (got[offs[-1]:] == 7.0).all()        # untouched


def test_moe_form_of_the_linear_gelu_spec():
    k = kgen.compile("specs/grouped_linear_gelu.k")
    offs = torch.tensor([0, 40, 41, 100], dtype=torch.int64, device=DEVICE)
    x = randn(100, 64, dtype=torch.float16)
    w = torch.randn(4, 64, 48, device=DEVICE).half()
    bias = randn(4, 48, dtype=torch.float16)                     # stacked: one [N] per problem
    y = k.moe(x, w, bias, offs=offs)
    want = moe_reference(x, w, offs.tolist(), lambda r, g: F.gelu(r + bias[g].double()))
    assert y.shape == (100, 48)
    assert_close(y, want, moe_bound(x, w, offs.tolist()), 1.2)


def test_moe_ragged_epilogue_tensors():
    """Per-row tensors (a row scale, a residual) are ragged like A: [T, 1], [T, N]."""
    k = compiled("C = (A @ B) * s + R")
    offs = [20, 20, 53]
    a, w = randn(53, 16), torch.randn(3, 16, 40, device=DEVICE)
    s, r = randn(53, 1), randn(53, 40)
    c = k.moe(a, w, s, r, offs=offs)
    want = moe_reference(a, w, offs) * s.double() + r.double()
    assert_close(c, want, moe_bound(a, w, offs), 4.0)


def test_moe_offsets_are_clamped_not_trusted():
    """Ends past T or before the previous end are clamped: no write outside C."""
    k = compiled("C = A @ B")
    a, w = randn(10, 8), torch.randn(3, 8, 5, device=DEVICE)
    out = torch.zeros(10, 5, device=DEVICE)
    c = k.moe(a, w, offs=[6, 4, 50], out=out)
    want = torch.cat([a[:6].double() @ w[0].double(), a[6:].double() @ w[2].double()])
    assert_close(c, want, torch.cat([bound(a[:6], w[0]), bound(a[6:], w[2])]))


@pytest.mark.gpu
def test_gpu_moe_matches_torch_grouped_mm():
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm is not in this torch")
    rng = random.Random(0)
    rows = [rng.choice([64, 128, 192, 256]) for _ in range(8)]
    offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    a = torch.randn(sum(rows), 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8, 256, 512, device="cuda", dtype=torch.bfloat16)
    errors = []
    for w_ in (w, w.transpose(1, 2).contiguous().transpose(1, 2)):    # it may want B column-major
        try:
            want = torch._grouped_mm(a, w_, offs=offs)
        except RuntimeError as e:
            errors.append(str(e))
            continue
        got = compiled("C = A @ B").moe(a, w_, offs=offs)
        assert_close(got, want.float(), moe_bound(a, w_, offs.tolist()), 2.0, "tf32")
    if len(errors) == 2:
        pytest.skip(f"torch._grouped_mm: {errors[0]}")


# --- bad input: KgenError before any launch ----------------------------------------------------------------

def bad_call(text, *args, **kwargs):
    k = compiled(text)
    k([randn(3, 4)], [randn(4, 5)])              # a good call first: the module is loaded
    module = k._last.module
    with watching(module, f"{k._last.name}_kernel") as launches:
        with pytest.raises(kgen.KgenError) as info:
            k(*args, **kwargs)
    assert launches.count == 0
    return str(info.value)


def test_lists_of_different_lengths():
    msg = bad_call("C = A @ B", [randn(3, 4)] * 3, [randn(4, 5)] * 2)
    assert "B" in msg and "expected a list of 3 tensors (as A), got 2" in msg


def test_lists_the_kernel_never_reads_are_checked_as_a_gemms_tensors():
    """A list parameter the body never reads is checked like the others (its length, dtype,
    rank and sizes), in the MoE form as the ragged or stacked tensor it would be; a single
    tensor beside lists is refused at compile, read or not."""
    spec = "kernel unread(A: [f32[M, K]], B: [f32[K, N]], R: [f32[M, N]]) -> C: [f32[M, N]] { C = A @ B }"
    k = kgen.compile(spec)
    a, b = [randn(3, 4), randn(2, 4)], [randn(4, 5), randn(4, 6)]
    for r, words in [(42, "R: expected a list of tensors"), ([randn(3, 5)], "R: expected a list of 2 tensors"),
                     ([randn(3, 5), randn(7)], r"R\[1\]: expected f32\[M, N\], got a torch.float32 tensor "
                                               r"of shape \(7,\)"),
                     ([randn(3, 5), randn(2, 5)], r"R\[1\]: expected N = 6 \(from B\[1\]\), got 5")]:
        with pytest.raises(kgen.CallError, match=words):
            k(a, b, r)
    for g, x, y in zip(k(a, b, [randn(3, 5), randn(2, 6)]), a, b):
        assert_close(g, x.double() @ y.double(), bound(x, y))
    rows, w = randn(6, 4), randn(2, 4, 5)
    with pytest.raises(kgen.CallError, match=r"R: expected f32\[T, N\] = \[6, 5\]"):
        k.moe(rows, w, randn(5, 99), offs=[3, 6])
    got = k.moe(rows, w, randn(6, 5), offs=[3, 6])
    assert_close(got, moe_reference(rows, w, [3, 6]), moe_bound(rows, w, [3, 6]))
    with pytest.raises(kgen.UnsupportedError, match="'R' is one tensor in a grouped GEMM"):
        kgen.compile(spec.replace("R: [f32[M, N]]", "R: f32[N]"))


def test_out_lists_given_in_the_wrong_form_say_what_was_given():
    two = kgen.compile("kernel two(A: [f32[M, K]], B: [f32[K, N]]) -> (C: [f32[M, N]], D: [f32[M, N]]) "
                       "{ C = A @ B; D = C * 2 }")
    a, b = [randn(3, 4)] * 2, [randn(4, 5)] * 2
    c = [torch.empty(3, 5, device=DEVICE) for _ in range(2)]
    with pytest.raises(kgen.CallError, match=r"out: expected a tuple of 2 lists of tensors \(C, D\), "
                                             r"got a list of 2 tensors"):
        two(a, b, out=c)
    with pytest.raises(kgen.CallError, match=r"out \(C\): expected a list of 2 tensors, got a list of 1 list$"):
        compiled("C = A @ B")(a, b, out=[c])
    with pytest.raises(kgen.CallError, match=r"B: expected a list of 1 tensor \(as A\), got 2"):
        compiled("C = A @ B")(a[:1], b)


def test_empty_list():
    assert "empty list" in bad_call("C = A @ B", [], [])
    k = kgen.compile("specs/grouped_gemm.k")
    with pytest.raises(kgen.CallError, match="A: expected a list of tensors .* got an empty list"):
        k([], [])
    with pytest.raises(kgen.CallError, match="^grouped_gemm: A: expected a list of tensors .* got an empty list"):
        k([], [randn(4, 5)] * 3)        # the empty list named, not the other measured against it


def test_inner_dims_differ_names_the_problem():
    a = [randn(3, 4), randn(5, 6), randn(7, 64)]
    b = [randn(4, 5), randn(6, 5), randn(48, 5)]
    assert "B[2]: expected K = 64 (from A[2]), got 48" in bad_call("C = A @ B", a, b)
    k = kgen.compile("specs/grouped_linear_gelu.k")
    x, w = [randn(3, 4, dtype=torch.float16)], [randn(4, 5, dtype=torch.float16)]
    with pytest.raises(kgen.CallError, match=r"b\[0\]: expected N = 5 \(from W\[0\]\), got 6"):
        k(x, w, [randn(6, dtype=torch.float16)])


def test_mixed_dtypes_across_a_list():
    msg = bad_call("C = A @ B", [randn(3, 4), randn(3, 4, dtype=torch.float16)], [randn(4, 5)] * 2)
    assert "A[1]: expected f32[M, K], got a torch.float16 tensor" in msg


def test_mixed_devices_across_a_list():
    other = torch.empty(3, 4, device="meta")
    msg = bad_call("C = A @ B", [randn(3, 4), other], [randn(4, 5)] * 2)
    assert "A[1]: expected a tensor on" in msg and "meta" in msg


def test_a_list_beside_a_plain_tensor():
    with pytest.raises(kgen.UnsupportedError, match="'B' is one tensor in a grouped GEMM"):
        compiled("C = A @ B")([randn(3, 4)], randn(4, 5))


def test_more_problems_than_the_kernel_holds_are_refused():
    """The kernel holds every problem's tile count in one vector, which Triton bounds at 2**20
    elements: a group of more problems is a CallError before anything is built or launched."""
    kernel, G = kgen.compile("specs/grouped_gemm.k"), 2**20 + 1
    a, b = randn(4, 1).half(), randn(1, 1).half()
    with pytest.raises(kgen.CallError, match=f"A: expected at most 1048576 problems, got {G}"):
        kernel([a] * G, [b] * G)
    offs = torch.full((G,), 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(kgen.CallError, match=f"expected at most 1048576 problems, got {G}"):
        kernel.moe(a, b.expand(G, 1, 1), offs=offs)


def test_moe_bad_offsets():
    k = compiled("C = A @ B")
    a, w = randn(10, 8), torch.randn(3, 8, 5, device=DEVICE)
    with pytest.raises(kgen.CallError, match="offs: expected 3 row ends"):
        k.moe(a, w, offs=[5, 10])
    with pytest.raises(kgen.CallError, match="offs: expected a 1-D int32 or int64 tensor"):
        k.moe(a, w, offs=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(kgen.CallError, match="B: expected f32\\[G, K, N\\] = \\[\\?, 8, \\?\\]"):
        k.moe(a, torch.randn(3, 9, 5, device=DEVICE), offs=[1, 2, 3])
    with pytest.raises(kgen.CallError, match="at least one problem"):
        k.moe(a, torch.randn(0, 8, 5, device=DEVICE), offs=[])
    with pytest.raises(kgen.CallError, match="offs: expected int32 row ends"):
        k.moe(a, w, offs=[5, 2**31, 10])
    ends = torch.tensor([3, 6, 10], dtype=torch.int32, device=DEVICE)
    with pytest.raises(kgen.CallError, match="offs: expected a dense tensor of row ends, got a torch.sparse_coo one"):
        k.moe(a, w, offs=ends.to_sparse())
    # values 3, 6, 10 that the kernel would read as -3, -6, -10
    with pytest.raises(kgen.CallError, match="offs: expected a tensor without torch's lazy negation bit"):
        k.moe(a, w, offs=torch._neg_view(-ends))


def test_moe_out_over_offs_is_refused_and_numpy_row_ends_are_ints(watch):
    """offs is read by every program: an out= over it would move where problems end while
    the kernel runs.  A list of row ends may hold numpy's integers (not bools, not floats)."""
    k = kgen.compile("specs/grouped_gemm.k")
    a, w = randn(8, 16, dtype=torch.float16), randn(2, 16, 4, dtype=torch.float16)
    buffer = torch.zeros(34, device=DEVICE, dtype=torch.float16)
    offs = buffer[30:].view(torch.int32)            # the last 8 bytes of out's 64, and 4 more
    offs.copy_(torch.tensor([3, 8], dtype=torch.int32))
    launches = watch(k.module)
    with pytest.raises(kgen.CallError, match="out \\(C\\): overlaps offs"):
        k.moe(a, w, offs=offs, out=buffer[:32].view(8, 4))
    assert launches.count == 0
    want = k.moe(a, w, offs=offs.clone())
    assert_close(want, moe_reference(a, w, [3, 8]), moe_bound(a, w, [3, 8]))
    assert torch.equal(k.moe(a, w, offs=[numpy.int64(3), numpy.int32(8)]), want)
    for bad, name in ((numpy.bool_(True), "bool"), (3.0, "float")):
        with pytest.raises(kgen.CallError, match=f"offs\\[0\\]: expected an int row end, got {name}"):
            k.moe(a, w, offs=[bad, 8])


def test_a_problem_list_that_starts_with_a_number_names_its_element():
    k = compiled("C = A @ B")
    a, b = randn(5, 8), randn(8, 4)
    with pytest.raises(kgen.CallError, match="A\\[0\\]: expected a tensor \\(one per problem\\), got int"):
        k([3, a], [b, b])
    with pytest.raises(kgen.CallError, match="B\\[1\\]: expected a tensor f32\\[K, N\\], got int"):
        k([a, a], [b, 3])


def test_moe_calls_without_offs_or_with_too_many_rows():
    k, declared = compiled("C = A @ B"), kgen.compile("specs/grouped_gemm.k")
    a, w = randn(10, 8), torch.randn(3, 8, 5, device=DEVICE)
    with pytest.raises(kgen.CallError, match="missing offs="):
        k.moe(a, w)
    with pytest.raises(kgen.CallError, match="grouped_gemm.moe: missing offs=, where each problem's rows end$"):
        declared.moe(a.half(), w.half())
    for kernel, operands in ((k, (a, w)), (declared, (a.half(), w.half()))):   # offs given by position
        with pytest.raises(kgen.CallError, match=r"missing offs=, .* \(offs is keyword-only; 3 arguments came "
                                                 r"for 2 inputs\)$"):
            kernel.moe(*operands, [3, 7, 10])
    with pytest.raises(kgen.CallError, match="offs: expected a 1-D int32 or int64 tensor"):
        k.moe(a, w, offs=torch.tensor(3, dtype=torch.int32, device=DEVICE))
    tall = torch.zeros(1, 8, device=DEVICE).expand(2**31 - 2**24, 8)   # row numbers (and a tile past them) past int32
    with pytest.raises(kgen.CallError, match=f"A: expected fewer than 2\\*\\*31 - 2\\*\\*24 rows, got {2**31 - 2**24}"):
        k.moe(tall, w, offs=[1, 2, 3])


def test_a_headerless_list_broadcast_in_some_problems_only_says_so():
    """A headerless list kernel broadcasts along an axis where every problem has size 1 (its
    key): a residual of one row in some problems only is refused, and the error says why; an
    error about another size gets no such note."""
    k = compiled("C = A @ B * s + r")
    a, b = [randn(5, 3), randn(1, 3), randn(9, 3)], [randn(3, 6), randn(3, 4), randn(3, 1)]
    with pytest.raises(kgen.CallError, match=re.escape(
            "r[0]: expected M = 5 (from A[0]), got 1 (r's axis 0 has size 1 in some problems only: a list "
            "broadcasts along an axis where every problem has size 1)")):
        k(a, b, 2.0, [randn(1, 6), randn(1, 4), randn(9, 1)])
    with pytest.raises(kgen.CallError, match=re.escape("r[2]: expected N = 1 (from B[2]), got 2") + "$"):
        k(a, b, 2.0, [randn(5, 6), randn(1, 4), randn(9, 2)])
    r = [randn(1, 6), randn(1, 4), randn(1, 1)]     # one row in every problem: broadcast
    assert_group_close(k(a, b, 2.0, r), [(x.double() @ y.double()) * 2 + z.double() for x, y, z in zip(a, b, r)],
                       a, b, factor=2.0)


def test_headerless_moe_takes_its_rows_from_the_matmul_operand():
    """The MoE form reads T from the matmul's left operand, wherever it comes in the inputs
    (here after a [G, N] bias that is also 2-D)."""
    k = compiled("Y = b + X @ W")
    b, x, w = randn(3, 6), randn(10, 8), torch.randn(3, 8, 6, device=DEVICE)
    offs = [3, 7, 10]
    want = moe_reference(x, w, offs, lambda y, g: y + b[g].double())
    assert_close(k.moe(b, x, w, offs=offs), want, moe_bound(x, w, offs))


def test_headerless_moe_says_how_it_read_a_tensor_that_does_not_fit():
    """A [K, N] weight where the MoE form takes [G, K, N]: its rows are not the problems' rows, so
    it is one [N] per problem, which '@' cannot take; the error says how each tensor was read."""
    k = compiled("Y = X @ W")
    with pytest.raises(kgen.CallError, match=re.escape(
            "'@' needs 2-D or 3-D operands, got f32[K] (the MoE form read X (10, 8) as the problems' rows; "
            "W (8, 6) as one (6,) per problem)")):
        k.moe(randn(10, 8), randn(8, 6), offs=[10])
    # a residual of one row too many is read as one row per problem: its shape is wrong as read
    r = compiled("C = A @ B * s + r")
    with pytest.raises(kgen.CallError, match=re.escape(
            "r: expected f32[G, N] = [3, 4] (sizes from B), got shape (13, 4) (the MoE form read A (12, 5) as "
            "the problems' rows; B (3, 5, 4) as one (5, 4) per problem; r (13, 4) as one (4,) per problem)")):
        r.moe(randn(12, 5), torch.randn(3, 5, 4, device=DEVICE), 2.0, randn(13, 4), offs=[3, 3, 12])
    w = randn(8, 6)
    for listed in ([w], (w,)):   # the list form's lists: the MoE form takes one tensor a parameter
        with pytest.raises(kgen.CallError, match=f"^y: moe: W: expected a tensor \\(the MoE form stacks the problems "
                                                 f"in one\\), got {type(listed).__name__}$"):
            k.moe(randn(10, 8), listed, offs=[10])


def test_grouped_inputs_that_are_not_lists():
    k = kgen.compile("specs/grouped_gemm.k")
    a, b = randn(4, 8, dtype=torch.float16), randn(8, 4, dtype=torch.float16)
    for bad in (a, a.cpu().numpy()):
        with pytest.raises(kgen.CallError, match="A: expected a list of tensors"):
            k(bad, [b])


def test_out_lists_that_overlap_are_refused(watch):
    """out= lists are checked like single outputs: no output over an input (the problems'
    tiles would read what others wrote), no two outputs over one element."""
    k = kgen.compile("specs/grouped_gemm.k")
    a = [randn(16, 16, dtype=torch.float16) for _ in range(2)]
    b = [randn(16, 16, dtype=torch.float16) for _ in range(2)]
    shared = torch.empty(16, 16, device=DEVICE, dtype=torch.float16)
    cases = {
        "C\\[0\\]\\): overlaps A\\[0\\]": [a[0], torch.empty_like(a[0])],
        "C\\[1\\]\\): overlaps B\\[0\\]": [torch.empty_like(a[0]), b[0][:, :16]],
        "overlaps C\\[0\\] \\(out\\)": [shared, shared],
        "C\\[1\\]\\): several of its elements share memory": [shared, shared[:1].expand(16, 16)],
    }
    launches = watch(k.module)
    for words, out in cases.items():
        with pytest.raises(kgen.CallError, match=words):
            k(a, b, out=out)
    assert launches.count == 0
    out = [torch.empty_like(a[0]), torch.empty_like(a[1])]
    got = k(a, b, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    for g, x, y in zip(got, a, b):
        assert_close(g, x.double() @ y.double(), bound(x, y))


def test_no_moe_form_for_a_plain_gemm():
    with pytest.raises(kgen.CallError, match="no MoE form: it is a GEMM kernel, not a grouped GEMM"):
        kgen.compile("specs/linear_gelu.k").moe(randn(4, 4), randn(1, 4, 4), randn(1, 4), offs=[4])
    with pytest.raises(kgen.CallError, match="no MoE form: it is an elementwise kernel, not a grouped GEMM"):
        kgen.compile("specs/vector_add.k").moe(randn(4), randn(4), offs=[4])


@pytest.mark.parametrize("dim", ["W_shapes", "X_shapes", "b_shapes", "shared", "launch"])
def test_dimensions_named_like_the_host_functions_locals(dim):
    """The list form's host function binds X_shapes, W_shapes, shared, launch, ...: a dimension
    (a host local too) may not take one of those names."""
    text = f"kernel f(X: [f16[M, K]], W: [f16[K, {dim}]], b: [f16[{dim}]]) -> Y {{\n    Y = X @ W + b\n}}\n"
    with pytest.raises(kgen.UnsupportedError, match=f"'{dim}' is a name the generated (grouped )?GEMM (kernel )?"
                                                    f"uses itself; rename the dimension"):
        kgen.compile(text)


def test_list_kernels_need_a_matmul():
    with pytest.raises(kgen.UnsupportedError, match="need[s]? a matmul"):
        kgen.compile("kernel k(X: [f32[N]]) -> Y: [f32[N]] {\n    Y = X * 2.0\n}\n")


# --- tuning ----------------------------------------------------------------------------------------------

def test_group_key_is_a_signature_not_exact_sizes():
    names = ["A", "B"]
    key = lambda a, b: grouped_gemm.group_key((a, b), {}, names, "A", "B")  # noqa: E731
    a = [torch.empty(m, 64) for m in (100, 120)]
    b = [torch.empty(64, 96) for _ in a]
    assert key(a, b) == key([torch.empty(m, 64) for m in (110, 118)], b)   # same buckets
    assert key(a, b) != key(a + a[:1], b + b[:1])                           # G
    assert key(a, b) != key([t.half() for t in a], [t.half() for t in b])   # dtype
    assert key(a, b) != key(a, [t.t().contiguous().t() for t in b])         # layout
    assert key(a, b) != key([torch.empty(m, 64) for m in (1000, 1200)], b)  # sizes
    # problems that share N and K (which may flatten the kernel's loops) and problems that do not
    assert key(a, b) != key(a, [b[0], torch.empty(64, 90)])
    assert key([], []) is None and key(a, b[:1]) is None


def test_moe_key_is_a_signature_remembered_per_shapes_and_names():
    key = lambda a, b, lhs="A", rhs="B": grouped_gemm.moe_key((a, b), {}, [lhs, rhs], lhs, rhs)  # noqa: E731
    a, b = torch.empty(300, 64), torch.empty(4, 64, 96)
    first = key(a, b)
    assert first == key(a, b) == key(torch.empty(500, 64), b)               # T in the same bucket
    assert first != key(torch.empty(600, 64), b)                             # T
    assert first != key(a, torch.empty(5, 64, 96))                           # G
    assert first != key(a.half(), b.half())                                  # dtype
    assert first != key(a, b.transpose(1, 2).contiguous().transpose(1, 2))   # layout
    # the remembered signature is each kernel's own: another's parameter names are not reused
    assert key(a, b, "X", "W") == first.replace("A:", "X:").replace("B:", "W:") != first
    assert key([a], b) is None and key(a, b[0]) is None


def test_the_remembered_group_keys_are_bounded_by_the_shapes_they_hold(monkeypatch):
    """Groups whose rows change at every call (as an MoE's token counts do) each leave their
    shapes and strides in the memo: it is cleared before it holds more than its bound of them,
    and still answers as before."""
    monkeypatch.setattr(grouped_gemm, "_GROUP_KEYS", {})
    monkeypatch.setattr(grouped_gemm, "_group_keys_held", 0)
    monkeypatch.setattr(grouped_gemm, "_GROUP_KEYS_MAX", (4096, 200))
    b = [torch.empty(16, 8)] * 10
    for m in range(1, 40):
        a = [torch.empty(m + i, 16) for i in range(10)]
        assert grouped_gemm.group_key((a, b), {}, ["A", "B"], "A", "B") == \
            grouped_gemm._group_signature(a, b, "A", "B")
        assert sum(map(len, grouped_gemm._GROUP_KEYS)) == grouped_gemm._group_keys_held <= 200


def test_prune_keeps_tiles_that_fit_the_largest_problem():
    configs = [dict(zip(grouped_gemm.CONFIG_KEYS, c)) for c in grouped_gemm.CANDIDATES_16]
    small = grouped_gemm.prune(configs, {"A": [torch.empty(20, 64)] * 3, "B": [torch.empty(64, 40)] * 3}, "A", "B")
    assert small and all(c["BLOCK_M"] <= 32 and c["BLOCK_N"] <= 64 for c in small)
    big = {"A": [torch.empty(4096, 4096)], "B": [torch.empty(4096, 4096)]}
    assert len(grouped_gemm.prune(configs, big, "A", "B")) == len(configs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9, reason="Hopper")
def test_prune_times_tma_only_for_big_groups():
    """Below TMA_MIN_FLOP (MOE_TMA_MIN_FLOP in the MoE form) the TMA variants' host work costs
    more than they save: not timed."""
    configs = [dict(zip(grouped_gemm.CONFIG_KEYS, c), TMA=tma) for c in grouped_gemm.CANDIDATES_16[:3]
               for tma in (False, True)]
    group = lambda n, g: {"A": [torch.empty(n, n, device="cuda")] * g, "B": [torch.empty(n, n, device="cuda")] * g}
    small, big = group(1024, 4), group(2048, 4)
    assert 2 * 4 * 1024**3 < gemm.TMA_MIN_FLOP <= 2 * 4 * 2048**3
    assert not any(c["TMA"] for c in grouped_gemm.prune(configs, small, "A", "B"))
    assert sum(c["TMA"] for c in grouped_gemm.prune(configs, big, "A", "B")) == 3
    moe = lambda t: {"A": torch.empty(t, 1024, device="cuda"),  # noqa: E731
                     "B": torch.empty(8, 1024, 1024, device="cuda")}
    assert 2 * 2048 * 1024**2 < grouped_gemm.MOE_TMA_MIN_FLOP <= 2 * 4096 * 1024**2 < gemm.TMA_MIN_FLOP
    assert not any(c["TMA"] for c in grouped_gemm.prune_moe(configs, moe(2048), "A", "B"))
    assert sum(c["TMA"] for c in grouped_gemm.prune_moe(configs, moe(4096), "A", "B")) == 3


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KGEN_AUTOTUNE", raising=False)
    return tmp_path


CONFIGS = tuple({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 1,
                 "programs_per_sm": 1} for m, n in [(32, 32), (16, 32), (32, 16)])


@pytest.mark.parametrize("form", ["lists", "moe"])
def test_tuner_times_group_configs_and_keeps_them_on_disk(cache, form):
    k = compiled("C = relu(A @ B)")
    k([randn(3, 4)], [randn(4, 5)])
    kernel = k._last
    times = {(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0}
    calls = []

    def bench(run, config):
        run()
        calls.append(config)
        return times[(config["BLOCK_M"], config["BLOCK_N"])]

    if form == "lists":
        host, tuning = kernel._host, kernel._tuner.tuning
        args, kwargs = ([randn(40, 20), randn(7, 33)], [randn(20, 30), randn(33, 64)]), {}
    else:
        host, tuning = kernel._moe_host, kernel._moe_tuner.tuning
        args, kwargs = (randn(50, 20), torch.randn(2, 20, 30, device=DEVICE)), {"offs": [20, 50]}
    tuning = autotune.Tuning(CONFIGS, tuning.prune, tuning.key)
    make = lambda: autotune.Tuner(host, tuning, kernel.source, kernel.name + form, bench=bench,  # noqa: E731
                                  device_name="fake-gpu", force=True)
    tuner = make()
    config = tuner.choose(args, kwargs)
    assert config == CONFIGS[1] and len(calls) == 3
    assert len(list((cache / "autotune" / "fake-gpu").rglob("*.json"))) == 1
    assert make().choose(args, kwargs) == CONFIGS[1] and len(calls) == 3      # from disk
    got = host(*args, **kwargs, config=config)
    if form == "lists":
        assert_group_close(got, [torch.relu(x.double() @ y.double()) for x, y in zip(*args)], *args)
    else:
        assert_close(got, torch.relu(moe_reference(args[0], args[1], [20, 50])), moe_bound(args[0], args[1], [20, 50]))


@pytest.mark.parametrize("form", ["declared", "headerless"])
def test_config_none_asks_the_moe_forms_tuner_too(monkeypatch, form):
    """config=None is no config in the MoE form as in the list form: the tuner is asked, not passed over."""
    kernel = kgen.compile("specs/grouped_gemm.k")
    if form == "headerless":
        k = compiled("C = A @ B")
        k([randn(3, 4).half()], [randn(4, 5).half()])
        kernel = k._last
    asked = []
    monkeypatch.setattr(kernel._moe_tuner, "choose", lambda args, kwargs: asked.append(sorted(kwargs)) or None)
    A, B, offs = randn(8, 8).half(), torch.randn(2, 8, 4, device=DEVICE).half(), [3, 8]
    got = kernel.moe(A, B, offs=torch.tensor(offs, dtype=torch.int32, device=DEVICE), config=None)
    assert asked == [["offs"]]
    assert_close(got, moe_reference(A, B, offs), moe_bound(A, B, offs))


# --- generated source -----------------------------------------------------------------------------------

def test_generated_source_reads_like_tutorial_08_done_right():
    source = kgen.compile("specs/grouped_gemm.k").source
    assert "for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN):" in source
    assert "g = tl.sum(past.to(tl.int32))" in source       # each tile's problem, from the tile ends
    assert ".to(tl.pointer_type(tl.float16))" in source
    assert "tl.multiple_of(A_ptr, 16)" in source and "offs_bn = offs_n % N" in source
    assert "def grouped_gemm_moe(A, B, *, offs, out=None, config=None):" in source
    imports = {line for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports == {"import torch", "import triton", "import triton.language as tl"}
    with open("generated/grouped_gemm.py") as f:
        assert f.read() == source



def test_tile_and_k_loops_are_flattened_only_where_shared_memory_holds_both(monkeypatch):
    """The flattened loop keeps the K loop's buffers and the epilogue's f32 tile in shared
    memory at once: 128 x 256 tiles with 3 stages of f16 need 278552 bytes on an H100
    (OutOfResources against its 232448 with gelu(A @ W + b)), 64 x 128 with 4 stages fit."""
    import types
    module = kgen.compile("specs/grouped_linear_gelu.k").module
    h100 = types.SimpleNamespace(shared_memory_per_block_optin=232448)
    monkeypatch.setattr(module, "_properties", lambda device: h100)
    cuda = torch.device("cuda")
    launch = lambda bm, bn, bk, stages: module._group_launch(
        dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=stages, programs_per_sm=1,
             TMA=True),
        cuda, 2)
    assert launch(128, 256, 64, 3)["FLATTEN"] is False
    assert launch(64, 128, 64, 4)["FLATTEN"] is True
    assert launch(128, 128, 64, 4)["FLATTEN"] is True
    # a config by hand without num_stages gets Triton's default, 3: 128 x 128 x 128 does not fit then
    assert module._group_launch(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128), cuda, 2)["FLATTEN"] is False
    assert launch(128, 128, 128, 1)["FLATTEN"] is True
    assert "programs_per_sm" not in launch(64, 128, 64, 4) and "TMA" not in launch(64, 128, 64, 4)
    assert module._group_launch(dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16), torch.device("cpu"), 2)["FLATTEN"] is False
    # a config that says: the tuner times 128 x 256 tiles flattened too (the epilogue decides whether they fit)
    said = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, FLATTEN=True)
    assert module._group_launch(said, cuda, 2) == dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3,
                                                       FLATTEN=True)
    assert module._group_launch(dict(said, BLOCK_M=16, BLOCK_N=16, FLATTEN=False), cuda, 2)["FLATTEN"] is False


@pytest.mark.parametrize("dtype, out, body, offered", [
    ("f16", "f16", "C = A @ B", True),
    ("bf16", "bf16", "C = leaky_relu(A @ B, alpha)", True),
    ("f32", "f32", "C = A @ B", False),               # f32 operands: no 128 x 256 tiles
    ("f16", "f32", "C = A @ B", False),               # an f32 result: its tile would not fit
    ("f16", "f16", "C = gelu(A @ B + b)", False),     # the epilogue reads a tensor
])
def test_default_candidates_time_the_biggest_tiles_flattened_where_the_epilogue_is_lean(dtype, out, body, offered):
    kernel = kgen.compile(f"kernel g(A: [{dtype}[M, K]], B: [{dtype}[K, N]], b: [{dtype}[N]], alpha: f32 = 0.1) "
                          f"-> C: [{out}[M, N]] {{\n  {body}\n}}\n")
    configs = kernel._tuner.tuning.configs
    assert kernel._moe_tuner.tuning.configs == configs
    flattened = [c for c in configs if c.get("FLATTEN")]
    if not offered:
        assert not flattened and "FLATTEN=True)" not in kernel.source
        return
    tiles = {(c["BLOCK_M"], c["BLOCK_N"], bool(c.get("TMA"))) for c in flattened}
    assert tiles == {(128, 256, False), (128, 256, True), (64, 256, True)}   # the last: TMA's alone
    for c in flattened:   # each just before its twin left to the host's estimate, so that ties go to it
        assert configs[configs.index(c) + 1] == {k: v for k, v in c.items() if k != "FLATTEN"}
    assert "FLATTEN=True)" in kernel.source
    # for lists, where the problems share N and K: elsewhere the list kernel does not flatten
    big = {"A": [torch.empty(2048, 2048)] * 4, "B": [torch.empty(2048, 2048)] * 4}
    assert [c for c in grouped_gemm.prune(configs, big, "A", "B") if c.get("FLATTEN")] == flattened
    mixed = {"A": [torch.empty(2048, 2048), torch.empty(2048, 1024)],
             "B": [torch.empty(2048, 2048), torch.empty(1024, 2048)]}
    assert not any(c.get("FLATTEN") for c in grouped_gemm.prune(configs, mixed, "A", "B"))
    moe = {"A": torch.empty(8192, 2048), "B": torch.empty(4, 2048, 2048)}
    assert [c for c in grouped_gemm.prune_moe(configs, moe, "A", "B") if c.get("FLATTEN")] == flattened

# --- GPU ------------------------------------------------------------------------------------------------

@pytest.fixture
def untuned(monkeypatch):
    monkeypatch.setenv("KGEN_AUTOTUNE", "0")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("layout", ["rows", "b cols", "sliced"])
def test_gpu_group_of_mixed_sizes(untuned, dtype, layout):
    rng = random.Random(1)
    problems = [(1, 1, 1), (257, 131, 1000), (1024, 512, 256), (0, 64, 64), (16, 4096, 512), (300, 8, 8)]
    a, b = make_group(problems, layout, DTYPES[dtype], rng)
    got = compiled("C = leaky_relu(A @ B)")(a, b)
    assert_group_close(got, [F.leaky_relu(x.double() @ y.double(), 0.01) for x, y in zip(a, b)], a, b, 1.0, "tf32")


# An epilogue that reads a tensor, and a lean one (its candidates add 128 x 256 tiles flattened).
CONFIG_EPILOGUES = {"C = gelu(A @ W + b)": lambda y, bias: F.gelu(y + bias.double()),
             "C = leaky_relu(A @ W)": lambda y, bias: F.leaky_relu(y, 0.01)}


# Problems of mixed sizes, and ones that share N and K with enough tiles for a second tile a
# program, where the list kernels flatten their loops.
CONFIG_GROUPS = {"mixed": [(304, 200, 136), (64, 48, 64), (1, 1000, 72)],
                 "shared": [(2048, 2048, 136), (1500, 2048, 136), (0, 2048, 136), (33, 2048, 136)]}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("text", list(CONFIG_EPILOGUES))
@pytest.mark.parametrize("group", list(CONFIG_GROUPS))
def test_gpu_every_candidate_config(untuned, dtype, text, group):
    problems = CONFIG_GROUPS[group]
    a, b = make_group(problems, "rows", DTYPES[dtype], random.Random(2))
    bias = [randn(n, dtype=DTYPES[dtype]) for _, n, _ in problems]
    args = (a, b, bias) if "+ b" in text else (a, b)
    k = compiled(text)
    k(*args)
    module = k._last.module
    want = [CONFIG_EPILOGUES[text](x.double() @ y.double(), z) for x, y, z in zip(a, b, bias)]
    configs = getattr(module, f"{k._last.name}_configs")
    assert any(c.get("FLATTEN") for c in configs) == (len(args) == 2)
    flattened = []
    for config in configs:
        with watching(module, f"{k._last.name}_kernel") as pointer, \
                watching(module, f"{k._last.name}_tma_kernel") as tma:
            got = getattr(module, k._last.name)(*args, config=config)
        flattened += pointer.flatten + tma.flatten
        assert_group_close(got, want, a, b, 1.2, "tf32")
    assert any(flattened) == (group == "shared")


@pytest.mark.gpu
def test_gpu_graph_timing_flushes_l2_before_each_captured_call(monkeypatch):
    """The tuner's graphs: (flush, call) pairs, then the flushes alone, whose time is taken off;
    each flush writes twice the GPU's L2."""
    seen, flush = [], autotune.flush
    monkeypatch.setattr(autotune, "flush", lambda lines: (seen.append(("flush", lines.numel())), flush(lines)))
    x = randn(1 << 20)
    y = torch.empty_like(x)
    ms = autotune.graph_ms(lambda: (seen.append("call"), torch.exp(x, out=y)), calls=3, replays=2)
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    assert seen == ["call"] + [("flush", 2 * l2), "call"] * 3 + [("flush", 2 * l2)] * 3
    assert 0 < ms < 1 and torch.equal(y, torch.exp(x))


@pytest.mark.gpu
def test_gpu_grouped_configs_are_timed_from_cuda_graphs_and_a_refused_capture_falls_back(monkeypatch):
    """The grouped tuners time GPU work alone (a CUDA graph); a call that cannot be captured
    (offs as a Python list: a copy to the GPU) is timed call by call, and CUDA still works."""
    from kgen import autotune
    rows = [64, 200, 0, 333]
    offs = [sum(rows[:i + 1]) for i in range(len(rows))]
    a, w = randn(offs[-1], 128, dtype=torch.float16), torch.randn(4, 128, 96, device="cuda", dtype=torch.float16)
    out = torch.empty(offs[-1], 96, device="cuda", dtype=torch.float16)
    headerless = compiled("C = A @ B")
    headerless.moe(a, w, offs=offs)
    k = headerless._last
    assert k._tuner.tuning.graphs and k._moe_tuner.tuning.graphs
    import triton.testing
    offs_gpu = torch.tensor(offs, device="cuda")
    with monkeypatch.context() as m:     # the graph's timing, not the fallback's
        m.setattr(triton.testing, "do_bench", lambda *a, **k: pytest.fail("captured calls were timed one by one"))
        graphed = autotune.do_bench(lambda: k._moe_host(a, w, offs=offs_gpu, out=out), True)
    refused = autotune.do_bench(lambda: k._moe_host(a, w, offs=offs, out=out), True)
    assert 0 < graphed < 10 and 0 < refused < 10
    assert_close(k.moe(a, w, offs=offs), moe_reference(a, w, offs, lambda y, g: y), moe_bound(a, w, offs), 1.0, "tf32")


def test_grouped_kernels_inside_torch_compile():
    """Both calling forms inside code that torch.compile traces (on a GPU with its default
    backend; on Triton's interpreter the calls run as they are), row ends as a list and as a
    tensor, called twice: the second time from what was compiled."""
    k = compiled("C = leaky_relu(A @ B)")
    a = [randn(m, 24, dtype=torch.float16) for m in (5, 40)]
    b = [randn(24, n, dtype=torch.float16) / 4 for n in (8, 33)]
    rows = [3, 0, 30]
    ends = [sum(rows[:i + 1]) for i in range(len(rows))]
    x, w = randn(ends[-1], 24, dtype=torch.float16), torch.randn(3, 24, 16, device=DEVICE, dtype=torch.float16) / 4
    model = torch.compile(lambda a, b, x, w, offs: (k(a, b), k.moe(x, w, offs=ends), k.moe(x, w, offs=offs)),
                          backend="inductor" if HAS_CUDA else "aot_eager")
    if HAS_CUDA:   # run as they are, not traced into a graph: tracing them took a first compile 40 s
        graphs = torch._dynamo.explain(lambda a, b: k(a, b) + [a[0] * 2])(a, b).graphs
        assert graphs and not any("triton_kernel_wrapper" in g.code for g in graphs), [g.code for g in graphs]
    for _ in range(2):
        c, y, y_t = model(a, b, x, w, torch.tensor(ends, device=DEVICE, dtype=torch.int32))
        assert_group_close(c, [F.leaky_relu(p.double() @ q.double(), 0.01) for p, q in zip(a, b)], a, b)
        want = moe_reference(x, w, ends, lambda v, g: F.leaky_relu(v, 0.01))
        assert_close(y, want, moe_bound(x, w, ends))
        assert_close(y_t, want, moe_bound(x, w, ends))


@pytest.mark.gpu
def test_gpu_grouped_calls_first_made_in_a_cuda_graph_capture_replay_right():
    """A grouped call whose problem table (or MoE row ends given as a list) is first made
    inside a CUDA graph capture copies it from pinned host memory at every replay: that memory
    must outlive the call, and the device table, empty until a replay, must not serve a call
    outside the graph; a table made before the capture must outlive the cache's clearing."""
    torch.manual_seed(0)
    k = compiled("C = leaky_relu(A @ B)")
    empty = lambda m, n: torch.empty(m, n, device="cuda", dtype=torch.float16)   # noqa: E731
    problems = [(64, 96, 48), (33, 17, 80), (128, 40, 64)]
    a = [randn(m, kk, dtype=torch.float16) for m, _, kk in problems]
    b = [randn(kk, n, dtype=torch.float16) / 8 for _, n, kk in problems]
    c = [empty(m, n) for m, n, _ in problems]
    early = [randn(8, 16, dtype=torch.float16), randn(16, 8, dtype=torch.float16)]
    old = [empty(8, 8) for _ in range(3)]
    rows = [50, 0, 150]
    ends = [sum(rows[:i + 1]) for i in range(len(rows))]
    x, w = randn(ends[-1], 64, dtype=torch.float16), torch.randn(3, 64, 32, device="cuda", dtype=torch.float16) / 8
    k([early[0]] * 3, [early[1]] * 3, out=old)   # loaded, and a table that the capture finds cached
    k.moe(x[:10], w, offs=[3, 6, 10])
    module = k._last.module
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k(a, b, out=c)
        y = k.moe(x, w, offs=ends)
        k([early[0]] * 3, [early[1]] * 3, out=old)

    def want():
        return ([F.leaky_relu(p.double() @ q.double(), 0.01) for p, q in zip(a, b)],
                moe_reference(x, w, ends, lambda v, g: F.leaky_relu(v, 0.01)),
                [F.leaky_relu(early[0].double() @ early[1].double(), 0.01)] * 3)

    # outside the graph, the same tensors: right at once, from tables of their own
    want_c, want_y, _ = want()
    assert_group_close(k(a, b, out=c), want_c, a, b)
    assert_close(k.moe(x, w, offs=ends), want_y, moe_bound(x, w, ends))
    module._GROUP_TABLES.clear()                 # as when it fills: the graph's tables live on
    for i in range(16):                          # memory reused by calls of other contents
        k([t[:1 + i] for t in a], b)
        k.moe(x, w, offs=[i, 2 * i, ends[-1]])
    for t in (*a, *b, *c, *old, x, w, *early):
        t.copy_(torch.randn_like(t) / 8)
    graph.replay()
    want_c, want_y, want_old = want()
    assert_group_close(c, want_c, a, b)
    assert_close(y, want_y, moe_bound(x, w, ends))
    assert_group_close(old, want_old, [early[0]] * 3, [early[1]] * 3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("text", list(CONFIG_EPILOGUES))
def test_gpu_moe_every_candidate_config(untuned, dtype, text):
    dt = DTYPES[dtype]
    rows = [0, 200, 1, 64, 333]
    offs = [sum(rows[:i + 1]) for i in range(len(rows))]
    a, w, bias = randn(offs[-1], 136, dtype=dt), torch.randn(5, 136, 200, device="cuda", dtype=dt), randn(5, 200)
    args = (a, w, bias) if "+ b" in text else (a, w)
    k = compiled(text)
    want = moe_reference(a, w, offs, lambda y, g: CONFIG_EPILOGUES[text](y, bias[g]))
    k.moe(*args, offs=offs)
    module = k._last.module
    for config in getattr(module, f"{k._last.name}_configs"):
        got = getattr(module, f"{k._last.name}_moe")(*args, offs=torch.tensor(offs, device="cuda"), config=config)
        assert_close(got, want, moe_bound(a, w, offs), 1.2, "tf32")


@pytest.mark.parametrize("form", ["lists", "moe"])
def test_a_refused_call_leaves_no_decision_for_a_good_one(cache, form):
    """The group key holds neither the keywords nor the devices: a call the host refuses (a
    misspelt keyword here; on a GPU, a list on another device) must not leave its decision
    (None, the heuristic) in the tuner's memory, where the corrected call would find it and
    never be tuned."""
    k = kgen.compile("specs/grouped_gemm.k")
    if form == "lists":
        args, kwargs, host, tuning = ([randn(40, 16)], [randn(16, 32)]), {}, k._host, k._tuner.tuning
        call = k
    else:
        args, kwargs = (randn(40, 16), randn(1, 16, 32)), {"offs": [40]}
        host, tuning, call = k._moe_host, k._moe_tuner.tuning, k.moe
    args = tuple(a.half() if isinstance(a, torch.Tensor) else [t.half() for t in a] for a in args)
    tuner = autotune.Tuner(host, autotune.Tuning(CONFIGS, tuning.prune, tuning.key), k.source, k.name + form,
                           bench=fake_clock({(32, 32): 3.0, (16, 32): 1.0, (32, 16): 2.0}),
                           device_name="fake-gpu", force=True)
    k._tuner = k._moe_tuner = tuner
    with pytest.raises(kgen.CallError, match="unexpected keyword argument 'otu'"):
        call(*args, **kwargs, otu=None)
    assert tuner.tuned == 0
    got = call(*args, **kwargs)
    assert tuner.tuned == 1 and tuner.last == CONFIGS[1]     # the fastest on the fake clock
    a, b = (args[0][0], args[1][0]) if form == "lists" else (args[0], args[1][0])
    torch.testing.assert_close((got[0] if form == "lists" else got).float(), a.float() @ b.float(),
                               atol=2e-2, rtol=1e-2)


def fake_clock(times):
    """A bench that runs each candidate once (on the interpreter) and reports a made-up time."""
    return lambda run, config: (run(), times[(config["BLOCK_M"], config["BLOCK_N"])])[1]
