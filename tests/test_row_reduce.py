"""The row-reduction pattern, end to end: softmax, log-softmax, layernorm and rmsnorm
from specs/ against the float64 reference (``kgen.reference.evaluate``) and against
torch's own functions (``torch.softmax``, ``torch.log_softmax``,
``torch.nn.functional.layer_norm`` / ``torch.native_layer_norm``, ``rms_norm``).

Hypothesis draws the strategy (rows on chip, several rows per tile, or the looped
kernel through a forced small column chunk), M (including 1), N (1, primes, powers of
two, sizes past the chunk), the dtype, the layout (contiguous, transposed, sliced
rows and columns) and the values (large magnitudes, -inf entries, all -inf rows,
NaN).  Without a GPU the kernels run on Triton's interpreter, so sizes stay small;
bf16 runs only where CUDA is.
"""
from __future__ import annotations

import ast
import functools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgen
from kgen.errors import CallError, KgenError, SpecError, UnsupportedError
from kgen.patterns.row_tiling import (HELD_SHIFTED_STAGES, HELD_WARPS, LANES_SHORT_BYTES, LOOPED_MAXNREG, LOOPED_PER_SM,
                                      SHIFTED_F32_FILL, SHIFTED_F32_FILL_NORMS,
                                      LOOPED_STAGES, MAX_BLOCK_N, SHIFTED_MAX_BLOCK_N, SHORT_CHUNK_N,
                                      SHORT_ROW, SHORTEST_CHUNK_N, SHORTEST_ROW, STRAIGHT_MAX_BLOCK_N,
                                      UNALIGNED_FROM, UNALIGNED_STRAIGHT_MAX_BLOCK_N, UNALIGNED_WARPS,
                                      UNALIGNED_WIDE, ODD_CHUNK_N, ODD_FROM, ODD_ROWS, ODD_LANES_TO,
                                      ODD_SUMS_TO, ODD_WARPS, WIDE_ROW, WIDE_SUMS)
from kgen.lower import Line
from kgen.patterns.row_reduce import read_lanes
from kgen.reference import evaluate

from conftest import DEVICE, examples

# Padding lanes and the -inf / NaN data make numpy (the interpreter) warn; torch agrees.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

SETTINGS = settings(deadline=None, max_examples=examples(30), print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECS = Path(__file__).resolve().parent.parent / "specs"

# (atol, rtol) by output dtype; atol is scaled by the largest finite magnitude of the
# expected tensor and by sqrt(N) (f32 sums of N terms).  The kernel computes in f32 and
# rounds once on store; the reference is rounded to the output dtype before comparing,
# so a 16-bit output may differ by one unit in the last place.
TOL = {torch.float32: (2e-6, 2e-5), torch.float16: (1e-5, 2e-3), torch.bfloat16: (1e-4, 1.6e-2)}


# --------------------------------------------------------------------------- helpers

@functools.lru_cache(maxsize=None)
def spec_kernel(name: str, chunk: int | None = None, rows: int | None = None, dtype: str = "f16"):
    """A spec from specs/, optionally retyped and with a schedule forcing the column
    chunk (``BLOCK_N``) and the rows per tile (``BLOCK_ROWS``)."""
    text = (SPECS / f"{name}.k").read_text().replace("f16", dtype)
    keys = ([f"BLOCK_N = {chunk}"] if chunk else []) + ([f"BLOCK_ROWS = {rows}"] if rows else [])
    if keys:
        text += f"\nschedule {name} {{\n    " + "\n    ".join(keys) + "\n}\n"
    return kgen.compile(text)


def assert_matches(got: torch.Tensor, want: torch.Tensor, n: int, what: str = "", cond: float = 1.0,
                   scale: float | None = None) -> None:
    """``got`` (the kernel's output) equals ``want`` (float64) rounded to got's dtype.
    ``cond`` widens the tolerance where the math itself amplifies f32 rounding; ``scale`` is
    the magnitude the f32 sums behind ``got`` round at, where that is not ``want``'s own."""
    assert tuple(got.shape) == tuple(want.shape), (what, got.shape, want.shape)
    want = want.to(device=got.device, dtype=got.dtype).double()
    atol, rtol = TOL[got.dtype]
    scale = largest(want) if scale is None else scale
    torch.testing.assert_close(got.double(), want, atol=atol * scale * math.sqrt(max(n, 1)) * cond + 1e-30,
                               rtol=rtol * cond, equal_nan=True, msg=lambda m: f"{what}: {m}")


def largest(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def place(values: torch.Tensor, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """``values`` as a tensor of ``dtype`` on the device, laid out as asked, with no copy
    left for the kernel to make: transposed, or every other row and column of a larger
    buffer."""
    values = values.to(device=DEVICE, dtype=dtype)
    if layout == "transposed":
        return values.t().contiguous().t()
    if layout == "sliced":
        m, n = values.shape
        base = torch.full((2 * m + 1, 2 * n + 1), float("nan"), dtype=dtype, device=DEVICE)
        base[1::2, 1::2] = values
        return base[1::2, 1::2]
    return values.contiguous()


def row_values(m: int, n: int, seed: int, scale: float, special: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g, dtype=torch.float64) * scale
    if special == "neg_inf" and n > 1:
        x[torch.rand(m, n, generator=g) < 0.3] = float("-inf")
    elif special == "neg_inf_row":
        x[m // 2] = float("-inf")
    elif special == "neg_inf_prefix":   # the looped kernel's first chunks see only -inf
        x[:, : (n + 1) // 2] = float("-inf")
    elif special == "nan":
        x[m // 2, n // 2] = float("nan")
    return x


class Launches:
    """Records which kernel each call of the generated host function launched."""

    def __init__(self, module, monkeypatch):
        self.kernels = []
        self.options = []
        self.per_sm = []    # launch_rows's programs per SM (None: one per tile of rows)
        real = module.launch_rows

        def spy(kernel, n_tiles, per_sm, device, args, **options):
            self.kernels.append(kernel)
            self.options.append(options)
            self.per_sm.append(per_sm)
            return real(kernel, n_tiles, per_sm, device, args, **options)
        monkeypatch.setattr(module, "launch_rows", spy)
        if hasattr(module, "launch_split"):
            real_split = module.launch_split

            def spy_split(kernel, n_rows, split, values, per_sm, device, args, **options):
                self.kernels.append(kernel)
                self.options.append({**options, "SPLIT": split})
                return real_split(kernel, n_rows, split, values, per_sm, device, args, **options)
            monkeypatch.setattr(module, "launch_split", spy_split)


# A case is (column chunk, rows per tile, M, N) for one of three strategies: one row per
# tile on chip, several rows per tile (the default for narrow rows, or 4), and the looped
# kernel, forced by a chunk of 8 or 16 columns (rows no wider than the chunk stay on chip).
@st.composite
def cases(draw):
    strategy = draw(st.sampled_from(["on_chip", "tiles", "looped"]))
    if strategy == "looped":
        chunk = draw(st.sampled_from([8, 16]))
        m = draw(st.sampled_from([1, 2, 3, 5]))
        n = draw(st.sampled_from([1, 7, 16, 17, 31, 40, 64, 67]))
        rows = draw(st.sampled_from([None, 2]))
    else:
        chunk = None
        m = draw(st.sampled_from([1, 2, 3, 5, 8, 13, 33]))
        n = draw(st.sampled_from([1, 2, 3, 7, 16, 17, 31, 64, 100, 127, 256]))
        rows = 1 if strategy == "on_chip" else draw(st.sampled_from([None, 4]))
    return chunk, rows, m, n


VALUES = st.tuples(st.integers(0, 2**16), st.sampled_from([1.0, 30.0, 1e4]),
                   st.sampled_from(["none", "none", "neg_inf", "neg_inf_row", "neg_inf_prefix", "nan"]))
DTYPES = st.sampled_from([torch.float16, torch.float32])
LAYOUTS = st.sampled_from(["contiguous", "transposed", "sliced"])


def run_spec(name, case, dtype, layout, values, extra=()):
    chunk, rows, m, n = case
    kernel = spec_kernel(name, chunk, rows, {torch.float16: "f16", torch.float32: "f32"}[dtype])
    X = place(row_values(m, n, *values), dtype, layout)
    args = {"X": X}
    g = torch.Generator().manual_seed(values[0] + 1)
    for p in extra:   # weight, bias: along the row
        args[p] = place(torch.randn(1, n, generator=g, dtype=torch.float64), dtype, layout)[0]
    outputs = as_tuple(kernel(**args))
    expected = evaluate(kernel.ir, {**args, **{p.name: p.default for p in kernel.ir.params if p.is_scalar}})
    return kernel, args, outputs, expected


def check_reference(kernel, outputs, expected, n, cond=1.0):
    for o, got, want in zip(kernel.outputs, outputs, expected):
        assert_matches(got, want, n, f"{kernel.name}.{o} vs reference", cond)


# --------------------------------------------------------------------------- the four specs

@SETTINGS
@given(cases(), DTYPES, LAYOUTS, VALUES)
def test_softmax(case, dtype, layout, values):
    kernel, args, (Y,), expected = run_spec("softmax", case, dtype, layout, values)
    check_reference(kernel, (Y,), expected, case[3])
    assert_matches(Y, torch.softmax(args["X"].double(), dim=-1), case[3], "softmax vs torch.softmax")


@SETTINGS
@given(cases(), DTYPES, LAYOUTS, VALUES)
def test_log_softmax(case, dtype, layout, values):
    kernel, args, (Y,), expected = run_spec("log_softmax", case, dtype, layout, values)
    check_reference(kernel, (Y,), expected, case[3])
    assert_matches(Y, torch.log_softmax(args["X"].double(), dim=-1), case[3], "log_softmax vs torch.log_softmax")


@SETTINGS
@given(cases(), DTYPES, LAYOUTS, VALUES)
def test_layernorm(case, dtype, layout, values):
    kernel, args, (Y, mu, rstd), expected = run_spec("layernorm", case, dtype, layout, values, extra=("W", "B"))
    n = case[3]
    eps = next(p.default for p in kernel.ir.params if p.name == "eps")
    X, W, B = (args[k].double() for k in "XWB")
    # X - mean(X) cancels where a row's spread is small next to its values: f32 rounding
    # of X is amplified by max|X| * rstd there (in torch's f32 layer_norm too)
    cond = max(1.0, largest(X) * largest(expected[2]))
    # mu's f32 sum rounds at the magnitude of X's values, not of the mean, which can cancel to
    # near 0 (in every row, where M = 1): its error is at most (N - 1) * 2**-24 * max|X|, which
    # atol * sqrt(N) * max|X| covers up to N = 1000
    assert_matches(Y, expected[0], n, "layernorm.Y vs reference", cond)
    assert_matches(mu, expected[1], n, "layernorm.mu vs reference", scale=largest(X))
    assert_matches(rstd, expected[2], n, "layernorm.rstd vs reference", cond)
    assert_matches(Y, F.layer_norm(X, (n,), W, B, eps), n, "layernorm vs F.layer_norm", cond)
    if torch.isfinite(X).all():   # torch's Welford gives NaN where the mean is -inf
        _, torch_mean, torch_rstd = torch.native_layer_norm(X, (n,), W, B, eps)
        assert_matches(mu, torch_mean, n, "mu vs native_layer_norm", scale=largest(X))
        assert_matches(rstd, torch_rstd, n, "rstd vs native_layer_norm", cond)


@SETTINGS
@given(cases(), DTYPES, LAYOUTS, VALUES)
def test_rmsnorm(case, dtype, layout, values):
    kernel, args, (Y,), expected = run_spec("rmsnorm", case, dtype, layout, values, extra=("W",))
    check_reference(kernel, (Y,), expected, case[3])
    eps = next(p.default for p in kernel.ir.params if p.name == "eps")
    # torch's CPU kernel: its CUDA kernel differs from the formula (and from CPU) on inf rows
    X, W = args["X"].double().cpu(), args["W"].double().cpu()
    assert_matches(Y, F.rms_norm(X, (case[3],), W, eps).to(Y.device), case[3], "rmsnorm vs F.rms_norm")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("chunk", [None, 64])
def test_bf16(name, chunk):
    kernel = spec_kernel(name, chunk, None, "bf16")
    g = torch.Generator().manual_seed(0)
    args = {"X": (torch.randn(37, 1000, generator=g) * 3).to(DEVICE, torch.bfloat16)}
    for p in kernel.inputs[1:]:
        if p != "eps":   # the weight and bias
            args[p] = torch.randn(1000, generator=g).to(DEVICE, torch.bfloat16)
    outputs = as_tuple(kernel(**args))
    defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
    for got, want in zip(outputs, evaluate(kernel.ir, {**args, **defaults})):
        assert_matches(got, want, 1000)


@pytest.mark.gpu
def test_wide_rows_on_gpu():
    """N = 65536 (tutorial 02 fails with OutOfResources there) takes the looped kernel."""
    kernel = spec_kernel("softmax")
    X = torch.randn(64, 65536, device=DEVICE, dtype=torch.float16)
    assert_matches(kernel(X), torch.softmax(X.double(), -1), 65536)


# --------------------------------------------------------------------------- strategies

@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rmsnorm"])
def test_each_strategy_is_reachable(name, monkeypatch):
    """The host picks the on-chip kernel (several rows per tile for narrow rows) or the
    looped one from N and the schedule; each runs and is right."""
    for chunk, n, looped, rows in ((None, 8, False, 8), (None, 40, False, None), (16, 40, True, 1)):
        kernel = spec_kernel(name, chunk)
        launches = Launches(kernel.module, monkeypatch)
        args = {p: torch.randn(8, n, device=DEVICE, dtype=torch.float16) if p == "X"
                else torch.randn(n, device=DEVICE, dtype=torch.float16) for p in kernel.inputs if p != "eps"}
        outputs = as_tuple(kernel(**args))
        want = getattr(kernel.module, f"{name}_looped_kernel" if looped else f"{name}_kernel")
        assert launches.kernels == [want]
        if rows is not None:
            assert launches.options[0]["BLOCK_ROWS"] == rows
        if looped:
            assert launches.options[0]["BLOCK_N"] == chunk
        defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
        for got, expected in zip(outputs, evaluate(kernel.ir, {**args, **defaults})):
            assert_matches(got, expected, n)


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_widest_row_on_chip_is_the_same_for_every_element(name, monkeypatch):
    """Rows are kept on chip up to the same columns whatever their element (registers hold
    each as f32): up to 32768 (32 warps past 16384); wider, the looped or split kernel runs.
    16-bit rows that would not move in whole 16-byte vectors on chip (odd N here) loop, shifted,
    past SHIFTED_MAX_BLOCK_N columns (f32 ones where the block would be SHIFTED_F32_FILL full at
    most, SHIFTED_F32_FILL_NORMS for the norms), in short chunks up to SHORT_ROW (shortest up to
    SHORTEST_ROW), a program a row
    with no pipeline and no register cap up to MAX_BLOCK_N (wider, LOOPED_PER_SM programs an SM
    capped at LOOPED_MAXNREG registers walk the rows); those that would (N a multiple of 8) stay
    on chip.
    Rows not in whole vectors run straight-line code, with at least UNALIGNED_WARPS warps past
    UNALIGNED_FROM columns, up to UNALIGNED_STRAIGHT_MAX_BLOCK_N; the others, and wider ones, a
    tile loop past STRAIGHT_MAX_BLOCK_N.  The norms' 16-bit rows of an odd width loop from
    ODD_FROM columns."""
    f16, f32 = torch.float16, torch.float32
    part, whole = SHIFTED_F32_FILL_NORMS if name in ("layernorm", "rmsnorm") else SHIFTED_F32_FILL
    fill = 2 * SHIFTED_MAX_BLOCK_N * part // whole   # the widest row that fills a block of 8192 so far
    fill -= 1 - fill % 2                             # ... that is odd (not in whole vectors)
    for dtype, n, warps in ((f16, 20000, 32), (f16, MAX_BLOCK_N + 1, None), (f16, 10008, 16), (f16, 3000, 4),
                            (f16, SHIFTED_MAX_BLOCK_N - 1, UNALIGNED_WARPS[1]), (f16, SHIFTED_MAX_BLOCK_N + 1, None),
                            (f16, 2 * SHIFTED_MAX_BLOCK_N + 1, None), (f16, 16383, None), (f16, 16384, 16),
                            (f16, 20001, None), (f16, UNALIGNED_WIDE - 1, UNALIGNED_WARPS[0]), (f16, 1000, 2),
                            (f16, UNALIGNED_FROM + 1, UNALIGNED_WARPS[0]), (f16, UNALIGNED_FROM - 1, 2),
                            (f32, 3001, UNALIGNED_WARPS[1]), (f32, 3004, 4), (f32, 5003, None), (f32, fill, None),
                            (f32, fill + 2, UNALIGNED_WARPS[1]), (f32, 8191, UNALIGNED_WARPS[1]),
                            (f32, 1001, UNALIGNED_WARPS[0]), (f32, 16384, 16), (f32, 20000, 32),
                            (f32, 20001, None), (f32, 24001, 32 if name == "softmax" else None),
                            (f32, 30001, 32), (f32, MAX_BLOCK_N + 1, None)):
        odd_to = {"layernorm": ODD_LANES_TO, "rmsnorm": ODD_SUMS_TO}.get(name, 0)
        odd = dtype == f16 and n % 2 and ODD_FROM < n <= odd_to
        if odd:
            warps = None   # odd tiles: test_odd_width_norm_rows_loop_two_a_program
        kernel = spec_kernel(name, None, None, {torch.float32: "f32", torch.float16: "f16"}[dtype])
        launches = Launches(kernel.module, monkeypatch)
        g = torch.Generator().manual_seed(n)
        args = {p: torch.randn(2, n, generator=g).to(DEVICE, dtype) if p == "X"
                else torch.randn(n, generator=g).to(DEVICE, dtype) for p in kernel.inputs if p != "eps"}
        outputs = as_tuple(kernel(**args))
        on_chip = launches.kernels == [getattr(kernel.module, f"{name}_kernel")]
        assert on_chip == (warps is not None), (dtype, n)
        options = launches.options[0]
        if on_chip:
            block = 1 << (n - 1).bit_length()
            assert (options["num_warps"], options["BLOCK_N"]) == (warps, block), (dtype, n)
            whole = n % (16 // dtype.itemsize) == 0     # the rows (contiguous) move in 16-byte vectors
            loop = block > STRAIGHT_MAX_BLOCK_N and (whole or block > UNALIGNED_STRAIGHT_MAX_BLOCK_N)
            assert options["TILE_LOOP"] == loop, (dtype, n)
        elif odd:
            assert (options["SHIFT"], options["BLOCK_ROWS"], options["BLOCK_N"]) == (True, 2, ODD_CHUNK_N), n
        else:   # every row here that does not stay on chip is odd: shifted
            assert options["SHIFT"], (dtype, n)
            if dtype == torch.float16 and n <= SHORT_ROW:
                short = SHORTEST_CHUNK_N if n <= SHORTEST_ROW else SHORT_CHUNK_N
                short = LANES_SHORT_BYTES // 2 if name == "layernorm" else short
                assert (options["BLOCK_N"], options["num_warps"]) == (short, 4), n
            if dtype == torch.float32 and n <= SHORTEST_ROW:
                short = (LANES_SHORT_BYTES // 4, 4) if name == "layernorm" else (SHORT_CHUNK_N, 8)
                assert (options["BLOCK_N"], options["num_warps"]) == short, n
            held = n <= MAX_BLOCK_N
            launch = launches.per_sm[0], options["NUM_STAGES"], options.get("maxnreg")
            assert launch == ((None, HELD_SHIFTED_STAGES, None) if held else
                              (LOOPED_PER_SM, LOOPED_STAGES, LOOPED_MAXNREG)), (dtype, n, launch)
        defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
        for got, expected in zip(outputs, evaluate(kernel.ir, {**args, **defaults})):
            assert_matches(got, expected, n, f"{name} {dtype} N={n}")


class _Compiled:
    def __init__(self, n_regs):
        self.n_regs = n_regs

    def _init_handles(self):
        pass


class _RegisterKernel:
    """A stand-in for a @triton.jit kernel that compiles to n_regs registers a thread and
    records each compile (warmup) and launch."""

    def __init__(self, n_regs):
        self.n_regs, self.warmups, self.launches = n_regs, [], []

    def warmup(self, *args, grid, **options):
        self.warmups.append(options)
        return _Compiled(self.n_regs)

    def __getitem__(self, grid):
        return lambda *args, **options: self.launches.append(options)


@pytest.mark.parametrize("n_regs, warps", [(64, 16), (84, 8)])
def test_on_chip_kernel_narrows_where_one_program_fills_an_sm(n_regs, warps, monkeypatch):
    """16 warps on chip: where the compiled kernel takes more than 64 registers a thread (one
    program to an SM's 65536), launch_rows launches 8 warps capped at 128 registers instead;
    a kernel is compiled to count its registers once per options."""
    module = spec_kernel("layernorm").module
    props = type("Props", (), {"regs_per_multiprocessor": 65536, "multi_processor_count": 132})()
    monkeypatch.setattr(module, "_properties", lambda device: props)
    monkeypatch.setattr(module, "_TWO_PER_SM", {})
    kernel, device = _RegisterKernel(n_regs), torch.device("cuda")
    for _ in range(2):
        module.launch_rows(kernel, 10, None, device, (), narrower=(8, 128), num_warps=16, BLOCK_N=16384)
    module.launch_rows(kernel, 10, None, device, (), narrower=None, num_warps=16, BLOCK_N=16384)
    assert kernel.warmups == [{"num_warps": 16, "BLOCK_N": 16384}]
    narrowed = {"num_warps": 8, "maxnreg": 128, "BLOCK_N": 16384}
    assert kernel.launches[:2] == [narrowed if warps == 8 else {"num_warps": 16, "BLOCK_N": 16384}] * 2
    assert kernel.launches[2] == {"num_warps": 16, "BLOCK_N": 16384}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "layernorm"])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_on_chip_warps_follow_the_compiled_registers(name, dtype):
    """On a GPU, rows of 12288 columns (BLOCK_N = 16384, 16 warps): the launch keeps 16 warps
    where the kernel compiled so fits two programs an SM, else 8 warps capped at 128 registers;
    either way the result matches the reference."""
    kernel = spec_kernel(name, None, None, dtype)
    module = kernel.module
    real = getattr(module, f"{name}_kernel")
    launched = []

    class Spy:
        def warmup(self, *args, **options):
            return real.warmup(*args, **options)

        def __getitem__(self, grid):
            def launch(*args, **options):
                launched.append((args, options))
                return real[grid](*args, **options)
            return launch
    g = torch.Generator().manual_seed(1)
    torch_dtype = {"f16": torch.float16, "f32": torch.float32}[dtype]
    args = {p: torch.randn(64 if p == "X" else 1, 12288, generator=g).to(DEVICE, torch_dtype).squeeze(0)
            for p in kernel.inputs if p != "eps"}
    setattr(module, f"{name}_kernel", Spy())
    try:
        outputs = as_tuple(kernel(**args))
    finally:
        setattr(module, f"{name}_kernel", real)
    (launch_args, options), = launched
    asked = {k: v for k, v in options.items() if k not in ("num_warps", "maxnreg")}
    compiled = real.warmup(*launch_args, grid=(1,), **asked, num_warps=16)
    compiled._init_handles()
    fits = 2 * compiled.n_regs * 32 * 16 <= torch.cuda.get_device_properties(DEVICE).regs_per_multiprocessor
    assert (options["num_warps"], options.get("maxnreg")) == ((16, None) if fits else (8, 128)), compiled.n_regs
    defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
    for got, want in zip(outputs, evaluate(kernel.ir, {**args, **defaults})):
        assert_matches(got, want, 12288)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rmsnorm"])
def test_split_rows_strategy(name, monkeypatch):
    """f32 rows past the widest kept on chip are split across a group of programs, one
    chunk each, when the spec's reductions take one sweep and the group fits the GPU (at
    most 4 programs per SM, 4 "SMs" on Triton's interpreter) and the rows are not shifted
    (here: a row of 29 that starts off a 16-byte boundary, which SHIFT cannot align);
    otherwise, and for layernorm (a variance with its mean, faster looped) and f16 rows,
    the looped kernel runs (shifted: 29 contiguous columns)."""
    split = name != "layernorm"
    too_many = 4 * (4 * spec_kernel(name).module._num_sms(torch.device(DEVICE)) + 1)   # columns in chunks of 4
    for dtype, n, offset, want in ((torch.float32, 29, 1, "split" if split else "looped"),
                                   (torch.float32, 29, 0, "looped"), (torch.float32, too_many, 1, "looped"),
                                   (torch.float16, 29, 0, "looped")):
        kernel = spec_kernel(name, 4, None, {torch.float32: "f32", torch.float16: "f16"}[dtype])
        assert hasattr(kernel.module, f"{name}_split_kernel") == (split and dtype == torch.float32)
        launches = Launches(kernel.module, monkeypatch)
        g = torch.Generator().manual_seed(n)
        X = torch.randn(5, n + offset, generator=g, dtype=torch.float64) * 20
        X[1] = float("-inf") if name.endswith("softmax") else X[1]
        X[2, :13 + offset] = float("-inf") if name.endswith("softmax") else 0.0   # chunks of -inf beside others
        args = {p: (X if p == "X" else torch.randn(n, generator=g, dtype=torch.float64)).to(DEVICE, dtype)
                for p in kernel.inputs if p != "eps"}
        args["X"] = args["X"][:, offset:]
        outputs = as_tuple(kernel(**args))
        assert launches.kernels == [getattr(kernel.module, f"{name}_{want}_kernel")], (dtype, n, offset)
        # (f16 chunks of 4 columns are narrower than a 16-byte vector: they do not shift)
        shifted = want == "looped" and offset == 0 and dtype == torch.float32
        assert launches.options[0].get("SHIFT", False) == shifted, (dtype, n, offset)
        assert launches.options[0]["BLOCK_N"] == 4
        if want == "split":
            assert launches.options[0]["SPLIT"] == -(-n // 4)
        defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
        for got, expected in zip(outputs, evaluate(kernel.ir, {**args, **defaults})):
            assert_matches(got, expected, n, f"{name} {dtype} N={n}")


SPLIT_SPECS = [
    """kernel stats(X: f32[M, N]) -> (Y: f32[M, N], total: f32[M, 1]) {
        m = max(X, axis=-1)
        Y = exp(X - m) / sum(exp(X - m), axis=-1)
        total = sum(X, axis=-1)
    }""",
    """kernel span(X: f32[M, N], S: f32[M, 1]) -> (Y: f32[M, N], width: f32[M, 1]) {
        lo = min(X * S, axis=-1)
        Y = X - lo
        width = max(X, axis=-1) - lo
    }""",
]


@pytest.mark.parametrize("text", SPLIT_SPECS)
def test_split_rows_store_per_row_outputs_once(text, monkeypatch):
    """Per-row outputs of a split row (``total``, ``width``) come from one program of the
    group; a per-row operand (``S: [M, 1]``) is read by each."""
    monkeypatch.setenv("KGEN_FORCE_CHUNK", "8")
    kernel = kgen.compile(text)
    launches = Launches(kernel.module, monkeypatch)
    g = torch.Generator().manual_seed(3)
    values = {"X": torch.randn(6, 38, generator=g) * 5, "S": torch.randn(6, 1, generator=g)}
    args = {k: v.to(DEVICE) for k, v in values.items() if k in kernel.inputs}
    args["X"] = args["X"][:, 1:]   # rows off 16-byte boundaries, which SHIFT cannot align: split
    outputs = as_tuple(kernel(**args))
    assert launches.kernels == [getattr(kernel.module, f"{kernel.name}_split_kernel")]
    assert "if part == 0:" in kernel.source
    for name, got, want in zip(kernel.outputs, outputs, evaluate(kernel.ir, args)):
        assert_matches(got, want, 37, name)


def test_a_split_rows_mean_divides_once(monkeypatch):
    """The chunks of a split row publish their sums and the row's mean divides once, by its
    length: where the row's f32 sum overflows, inf, as torch's mean and the on-chip kernel give
    (the chunks' means would add up to a finite number)."""
    monkeypatch.setenv("KGEN_FORCE_CHUNK", "8")
    kernel = kgen.compile("kernel m(X: f32[M, N]) -> Y: f32[M, 1] { Y = mean(X) }")
    launches = Launches(kernel.module, monkeypatch)
    x = torch.randn(4, 42, device=DEVICE)
    x[1, 1] = x[1, 41] = 3e38
    x = x[:, 1:]   # rows off 16-byte boundaries, which SHIFT cannot align: split
    got = kernel(x)
    assert launches.kernels == [kernel.module.m_split_kernel]
    assert torch.isinf(got[1]).all()
    torch.testing.assert_close(got, x.mean(-1, keepdim=True))


def _split_kernel_source(kernel) -> str:
    """The split kernel's own source, from its def to the host function."""
    source = kernel.source
    start = source.index(f"def {kernel.name}_split_kernel(")
    return source[start:source.index(f"\ndef {kernel.name}(", start)]


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "rmsnorm"])
def test_split_rows_hold_their_chunk_through_the_exchange(name):
    """A split row's program loads each operand's chunk once: the outputs come from the
    chunk its reduction loaded (held in registers), and only operands the reduction did
    not read (rmsnorm's W) are loaded for them."""
    kernel = spec_kernel(name, None, None, "f32")
    source = _split_kernel_source(kernel)
    loaded = [p for p in kernel.inputs if f"{p} = tl.load(" in source]
    assert loaded == (["X", "W"] if name == "rmsnorm" else ["X"])
    for p in loaded:
        assert source.count(f"{p} = tl.load(") == 1, p


@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
def test_a_missing_peers_partials_read_only_the_reductions_operands(name):
    """The helper that computes a peer's partials takes the operands its chunk's reduction reads
    (rmsnorm: X, not W), their sizes and strides, and none of the outputs'."""
    source = spec_kernel(name, None, None, "f32").source
    start = source.index(f"def _{name}_peer_partials(")
    params = source[start:source.index("):", start)]
    assert "X_ptr" in params and "X_stride0" in params
    assert not any(word in params for word in ("Y_ptr", "Y_stride", "W_ptr", "W_stride"))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "rmsnorm", "stats", "span"])
def test_split_rows_compute_missing_peers_in_pieces(name, monkeypatch):
    """On Triton's interpreter no peer has published when a program looks (programs run one
    by one), so every program computes the partials of the chunks after its own, here in
    pieces of 2 columns of a chunk of 8: the row values, and so the outputs, are those of
    the whole row."""
    monkeypatch.setenv("KGEN_FORCE_CHUNK", "8")
    specs = {"stats": SPLIT_SPECS[0], "span": SPLIT_SPECS[1]}
    kernel = kgen.compile(specs[name]) if name in specs else spec_kernel(name, 8, None, "f32")
    monkeypatch.setattr(kernel.module, "SPLIT_PEER_N", 2)
    launches = Launches(kernel.module, monkeypatch)
    g = torch.Generator().manual_seed(11)
    X = torch.randn(5, 46, generator=g) * 8
    X[2, 9:30] = float("-inf") if "softmax" in name else X[2, 9:30]   # whole chunks of -inf
    values = {"X": X, "S": torch.randn(5, 1, generator=g), "W": torch.randn(45, generator=g)}
    args = {p: values[p].to(DEVICE) for p in kernel.inputs if p in values}
    args["X"] = args["X"][:, 1:]   # off 16-byte boundaries, which SHIFT cannot align: split
    outputs = as_tuple(kernel(**args))
    assert launches.kernels == [getattr(kernel.module, f"{kernel.name}_split_kernel")]
    assert launches.options[0]["SPLIT"] == 6
    defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
    for o, got, want in zip(kernel.outputs, outputs, evaluate(kernel.ir, {**args, **defaults})):
        assert_matches(got, want, 45, f"{name} {o}")


def test_shift_rows_decides_by_alignment():
    """The host's SHIFT test: rows that Triton cannot prove 16-byte aligned shift, when every
    [rows, N] operand starts aligned and their rows start at the same offset modulo a vector;
    otherwise (and for rows Triton already sees aligned) the kernels address rows as given."""
    shift = spec_kernel("softmax").module._shift_rows
    full = torch.empty(4, 80, dtype=torch.float16)
    x = torch.empty(4, 37, dtype=torch.float16)
    assert shift(8, 37, x, torch.empty_like(x))                       # odd N, contiguous
    assert shift(8, 40, full[:, :40], torch.empty(4, 40, dtype=torch.float16))  # strides 80 and 40: not 16s
    assert shift(8, 37, x, full[:, :37]) is False                     # strides 37 and 80 differ mod 8
    assert shift(8, 37, x, torch.empty(4, 45, dtype=torch.float16)[:, :37])  # 37 and 45 agree mod 8
    assert shift(8, 36, full[:, 1:37], torch.empty(4, 36, dtype=torch.float16)) is False  # X off a boundary
    assert shift(8, 32, full[:, :32], torch.empty(4, 32, dtype=torch.float16)) is False  # aligned, Triton sees it
    assert shift(8, 37, x.t().contiguous().t(), torch.empty_like(x)) is False   # columns not contiguous


def test_row_vec_is_what_divides_the_rows_starts_and_length():
    """The on-chip kernels' ROW_VEC: the largest power of two up to 16 dividing the row length
    and every row stride of the [rows, N] operands (axes of one row count for nothing), and
    1 where their columns are not contiguous; the hint says no more than is true."""
    row_vec = spec_kernel("softmax").module._row_vec
    f16 = lambda *shape: torch.empty(*shape, dtype=torch.float16)  # noqa: E731
    assert row_vec(1000, f16(4, 1000), f16(4, 1000)) == 8
    assert row_vec(1024, f16(4, 1024), f16(4, 1024)) == 16
    assert row_vec(3000, f16(4, 3000), f16(4, 3000)) == 8
    assert row_vec(1000, f16(4, 1003)[:, :1000], f16(4, 1000)) == 1     # a row stride of 1003
    assert row_vec(1000, f16(4, 1004)[:, :1000], f16(4, 1000)) == 4     # ... of 1004
    assert row_vec(1003, f16(1, 1003), f16(1, 1003)) == 1               # the length alone
    assert row_vec(1000, f16(1, 1, 1000)[:, :, :1000], f16(1, 1000)) == 8   # one row: no stride to divide
    assert row_vec(1000, f16(2, 3, 1000), f16(6, 1000)) == 8
    assert row_vec(1000, f16(2, 3, 1000).transpose(0, 1), f16(6, 1000)) == 8    # strides 1000 and 3000
    assert row_vec(1000, f16(1000, 4).t(), f16(4, 1000)) == 1              # columns strided


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("n, width, vec", [(40, 40, 8), (24, 24, 8), (44, 52, 4), (40, 42, 2)])
def test_rows_on_chip_in_whole_vectors_match_torch(name, dtype, n, width, vec, monkeypatch):
    """Rows on chip whose length and stride are multiples of 8 or 4 but not 16 (40 and 24
    columns, rows of 44 in a buffer of 52), which the kernels move in whole vectors, and rows
    of 40 in a buffer of 42 (ROW_VEC 2): the result is the float64 reference's."""
    kernel = spec_kernel(name, None, None, dtype)
    launches = Launches(kernel.module, monkeypatch)
    tdt = {"f16": torch.float16, "f32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(n + width)
    x = (torch.randn(9, width, generator=g, dtype=torch.float64) * 3).to(DEVICE, tdt)[:, :n]
    args = row_arguments(kernel, x, g)
    got = as_tuple(kernel(**args))
    assert launches.kernels == [getattr(kernel.module, f"{name}_kernel")] and launches.options[0]["ROW_VEC"] == vec
    check_against_reference(kernel, got, args, n, f"{name} {dtype} N={n} in {width}")


def row_arguments(kernel, x: torch.Tensor, g: torch.Generator) -> dict:
    """X, and the weight and bias [N] of x's dtype that the spec reads, from ``g``."""
    n = x.shape[-1]
    args = {"X": x, "W": torch.randn(n, generator=g).to(DEVICE, x.dtype),
            "B": torch.randn(n, generator=g).to(DEVICE, x.dtype)}
    return {p: args[p] for p in kernel.inputs if p != "eps"}


def check_against_reference(kernel, got, args: dict, n: int, what: str) -> None:
    defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
    for o, g_, want in zip(kernel.outputs, got, evaluate(kernel.ir, {**args, **defaults})):
        assert_matches(g_, want, n, f"{what} {o}")


def run_half_masked_rows(kernel, name: str, tdt, m: int, n: int, masked: int, out: str) -> tuple[dict, tuple]:
    """Calls ``kernel`` on m rows of n columns, row ``masked`` -inf (softmaxes) or 0 over its
    first half, writing to new outputs or (``out="strided"``) to rows 8 elements wider; returns
    (args, outputs)."""
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(m, n, generator=g, dtype=torch.float64) * 4).to(DEVICE, tdt)
    x[masked, : n // 2] = float("-inf") if name.endswith("softmax") else 0.0
    args = row_arguments(kernel, x, g)
    outs = None
    if out == "strided":
        shapes = [(n + 8, tdt)] + [(1, torch.float32)] * (len(kernel.outputs) - 1)
        outs = tuple(torch.full((m, w), float("nan"), dtype=t, device=DEVICE)[:, : n if w > 1 else 1]
                     for w, t in shapes)
    return args, as_tuple(kernel(**args, out=outs if outs is None or len(outs) > 1 else outs[0]))


SHIFT_CASES = [("softmax", "f16", 37), ("softmax", "f32", 50), ("log_softmax", "f16", 61),
               ("layernorm", "f16", 45), ("layernorm", "f32", 29), ("rmsnorm", "f32", 23), ("rmsnorm", "f16", 40)]


@pytest.mark.parametrize("name, dtype, n", SHIFT_CASES)
@pytest.mark.parametrize("out", ["new", "strided"])
def test_shifted_rows_match_torch(name, dtype, n, out, monkeypatch):
    """Looped rows that do not start on 16-byte boundaries (an odd N, rows of 40 f16 in a
    buffer of 40 columns, out= rows 8 elements wider) run shifted: chunks of lanes from the
    boundary below each row, partial vectors at both ends stored lane by lane, a chunk (8)
    narrower than the row's columns past it; the result is torch's."""
    kernel = spec_kernel(name, 8, None, dtype)
    tdt = {"f16": torch.float16, "f32": torch.float32}[dtype]
    launches = Launches(kernel.module, monkeypatch)
    args, got = run_half_masked_rows(kernel, name, tdt, 7, n, 2, out)
    assert launches.kernels == [getattr(kernel.module, f"{name}_looped_kernel")]
    assert launches.options[0]["SHIFT"] is True
    check_against_reference(kernel, got, args, n, f"{name} {dtype} N={n}")


@pytest.mark.parametrize("name, n, strided, odd", [
    ("layernorm", ODD_FROM + 1, False, True), ("layernorm", 3001, True, True),
    ("layernorm", ODD_LANES_TO - 1, False, True), ("layernorm", ODD_FROM - 1, False, False),
    ("layernorm", 3000, False, False), ("layernorm", 3002, False, False), ("layernorm", ODD_LANES_TO + 1, False, False),
    ("rmsnorm", ODD_FROM + 1, True, True), ("rmsnorm", ODD_SUMS_TO - 1, False, True),
    ("rmsnorm", ODD_SUMS_TO + 1, False, False), ("rmsnorm", 3002, False, False), ("softmax", 3001, False, False)])
def test_odd_width_norm_rows_loop_two_a_program(name, n, strided, odd, monkeypatch):
    """The norms' 16-bit rows of an odd width (loaded an element at a time on chip) from
    ODD_FROM columns, to ODD_LANES_TO for layernorm and ODD_SUMS_TO for rmsnorm, loop, shifted,
    ODD_ROWS rows a program in chunks of ODD_CHUNK_N with ODD_WARPS warps, LOOPED_PER_SM programs
    an SM; narrower rows, rows in vectors of 4 or 8 bytes, wider ones, softmax (its running max)
    and a schedule keep their tiles; each matches the float64 reference, rows with -inf or zeros
    over half their columns too."""
    kernel = spec_kernel(name, None, None, "f16")
    launches = Launches(kernel.module, monkeypatch)
    args, got = run_half_masked_rows(kernel, name, torch.float16, 5, n, 1, "strided" if strided else "new")
    options = launches.options[0]
    tiles = (launches.per_sm[0], options["BLOCK_ROWS"], options["BLOCK_N"], options["num_warps"])
    assert (tiles == (LOOPED_PER_SM, ODD_ROWS, ODD_CHUNK_N, ODD_WARPS)) == odd, tiles
    if odd:
        assert launches.kernels == [getattr(kernel.module, f"{name}_looped_kernel")] and options["SHIFT"]
        scheduled = kgen.compile((SPECS / f"{name}.k").read_text() + f"\nschedule {name} {{\n    num_warps = 8\n}}\n")
        launches = Launches(scheduled.module, monkeypatch)
        scheduled(**args)
        assert (launches.options[0]["BLOCK_ROWS"], launches.options[0]["num_warps"]) == (1, 8)
    check_against_reference(kernel, got, args, n, f"{name} f16 N={n}")


def _f16_kernel(params: str, body: str) -> str:
    return f"kernel k({params}) -> Y: f16[M, N] {{\n    {body}\n}}\n"


@pytest.mark.parametrize("text, odd", [
    ("specs/layernorm.k", True), ("specs/rmsnorm.k", True),
    (_f16_kernel("X: f16[M, N], W: f16[N]", "Y = X * W / sum(X * X)"), True),
    (_f16_kernel("X: f16[M, N]", "Y = (X - mean(X)) * rsqrt(mean((X - mean(X)) * (X - mean(X))) + 1e-5)"), False),
    (_f16_kernel("X: f16[M, N]", "Y = X / sum(X * X)"), False), ("specs/softmax.k", False),
    (_f16_kernel("X: f16[M, N], Z: f16[M, N]", "Y = X * Z / sum(X * X)"), False),
    (_f16_kernel("X: f16[M, N], W: f16[1, N]", "Y = X * W / sum(X * X)"), True),
    (_f16_kernel("X: f16[M, N], W: f16[N]", "Y = X * W - max(X)"), False)])
def test_odd_width_tiles_only_where_rows_share_a_weight(text, odd):
    """The odd-width tiles (two rows a program) are for 16-bit norms, sums scaled by a weight
    along the row that a program's rows load once: without a weight, or with a max, the rows
    keep the tiles of the other widths."""
    kernel = kgen.compile(text)
    assert ("# an odd width: " in kernel.source) == odd


@pytest.mark.parametrize("text, n, wide", [
    ("specs/rmsnorm.k", WIDE_ROW, True), ("specs/rmsnorm.k", WIDE_ROW + 16, True),
    ("specs/rmsnorm.k", WIDE_ROW + 8, False), ("specs/rmsnorm.k", WIDE_ROW + 1, False),
    ("specs/rmsnorm.k", WIDE_ROW - 16, False),
    (_f16_kernel("X: f16[M, N]", "Y = X * rsqrt(mean(X * X) + 1e-6)"), WIDE_ROW, True),
    ("specs/softmax.k", WIDE_ROW, False), ("specs/log_softmax.k", WIDE_ROW, False),
    ("specs/layernorm.k", WIDE_ROW, False),
    (_f16_kernel("X: f16[M, N]", "Y = (X - mean(X)) * rsqrt(mean((X - mean(X)) * (X - mean(X))) + 1e-5)"),
     WIDE_ROW, False),
    (_f16_kernel("X: f16[M, N], R: f16[M, N], W: f16[N]", "Y = (X + R) * W * rsqrt(mean(X * X) + 1e-6)"),
     WIDE_ROW, False),
    ((SPECS / "rmsnorm.k").read_text() + "\nschedule rmsnorm {\n    num_stages = 3\n}\n", WIDE_ROW, False),
    ((SPECS / "rmsnorm.k").read_text().replace("f16", "f32"), WIDE_ROW, False)])
def test_wide_rows_of_sums_take_longer_chunks(text, n, wide, monkeypatch):
    """16-bit rows in whole vectors from WIDE_ROW columns, in kernels whose reductions are plain
    sums (rmsnorm, with a weight or without) and whose pipeline fits LOOPED_SMEM, loop with
    WIDE_SUMS's chunk, warps, stages and programs an SM and no register cap, the last chunk
    masked where it does not fill; rows that are shifted (not 16-byte aligned, or not provably:
    widths that are not a multiple of 16) or narrower, a running max (softmax, log-softmax),
    Welford lanes (layernorm), a third 16-bit operand along the row, a schedule and f32 rows
    launch otherwise; each matches the float64 reference."""
    kernel = kgen.compile(text)
    if "WIDE = " not in kernel.source:     # no such launch in the host function
        assert not wide
        return
    launches = Launches(kernel.module, monkeypatch)
    g = torch.Generator().manual_seed(n)
    dtype = torch.float32 if "f32[" in text else torch.float16
    args = {p: (torch.randn(3, n, generator=g) * 4 if p in ("X", "R") else torch.randn(n, generator=g))
            .to(DEVICE, dtype) for p in kernel.inputs if p != "eps"}
    got = as_tuple(kernel(**args))
    options = launches.options[0]
    launch = (options["BLOCK_N"], options["num_warps"], options.get("NUM_STAGES"), (launches.per_sm or [None])[0])
    assert (launch == WIDE_SUMS and "maxnreg" not in options) == wide, (launch, options.get("maxnreg"))
    if wide:
        looped = kernel.module.k_looped_kernel if "kernel k(" in text else kernel.module.rmsnorm_looped_kernel
        assert launches.kernels == [looped] and options["SHIFT"] is False
    check_against_reference(kernel, got, args, n, f"N={n}")


@pytest.mark.parametrize("name, n, held", [("rmsnorm", 6001, True), ("softmax", 6001, False), ("rmsnorm", 9001, True),
                                           ("softmax", 17001, True), ("rmsnorm", 7001, False)])
def test_f32_rows_held_in_at_most_held_warps(name, n, held, monkeypatch):
    """f32 rows that loop only because they are shifted run a program a row in at most HELD_WARPS
    warps (16 spilled); a weighted spec's rows (rmsnorm) loop so to 3/4 of the block on chip,
    softmax's to 2/3; each matches the float64 reference."""
    kernel = spec_kernel(name, None, None, "f32")
    launches = Launches(kernel.module, monkeypatch)
    args, got = run_half_masked_rows(kernel, name, torch.float32, 3, n, 1, "new")
    looped = launches.kernels == [getattr(kernel.module, f"{name}_looped_kernel")]
    assert looped == held, launches.kernels
    if held:
        warps = launches.options[0]["num_warps"]
        assert launches.per_sm[0] is None and (warps == HELD_WARPS if n > SHORTEST_ROW else warps <= HELD_WARPS), warps
    check_against_reference(kernel, got, args, n, f"{name} f32 N={n}")


HELD_CASES = [("softmax", "f16", SHIFTED_MAX_BLOCK_N + 1), ("log_softmax", "f16", 2 * SHIFTED_MAX_BLOCK_N + 1),
              ("layernorm", "f16", 5002), ("rmsnorm", "f32", SHIFTED_MAX_BLOCK_N + 3), ("layernorm", "f32", 4099),
              ("softmax", "f32", 5001)]


@pytest.mark.parametrize("name, dtype, n", HELD_CASES)
@pytest.mark.parametrize("out", ["new", "strided"])
def test_shifted_rows_narrow_enough_to_hold_take_a_program_each_and_match_torch(name, dtype, n, out, monkeypatch):
    """Rows that would fit on chip but loop, shifted, with the pattern's own tiling (16-bit
    rows past SHIFTED_MAX_BLOCK_N columns but layernorm's of an odd width, f32 ones in a block part
    empty): one program a row,
    no pipeline, chunks of the short tiers; rows with -inf or zeros over half their columns and
    out= rows 8 elements wider give the float64 reference's result."""
    kernel = spec_kernel(name, None, None, dtype)
    tdt = {"f16": torch.float16, "f32": torch.float32}[dtype]
    launches = Launches(kernel.module, monkeypatch)
    args, got = run_half_masked_rows(kernel, name, tdt, 3, n, 1, out)
    assert launches.kernels == [getattr(kernel.module, f"{name}_looped_kernel")]
    options = launches.options[0]
    assert (launches.per_sm[0], options["SHIFT"], options["NUM_STAGES"]) == (None, True, HELD_SHIFTED_STAGES)
    assert "maxnreg" not in options
    check_against_reference(kernel, got, args, n, f"{name} {dtype} N={n}")


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
@pytest.mark.parametrize("chunk, n", [(8, 9), (8, 16), (8, 23), (8, 33), (8, 48), (32, 48), (32, 80), (32, 100)])
def test_looped_chunks_cover_the_row_once(name, chunk, n, monkeypatch):
    """The looped kernel's two loops per sweep (chunks inside the row, unmasked; the one to
    three at its ends, masked) visit every chunk once, in sweeps that alternate direction:
    rows shifted or not, a whole number of chunks or not, none inside (N < 2 chunks); every
    column of an out= filled with NaN is written, and each row's sums count it once (f16:
    f32 rows this wide split instead)."""
    kernel = spec_kernel(name, chunk, None, "f16")
    launches = Launches(kernel.module, monkeypatch)
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(5, n, generator=g, dtype=torch.float64) * 3 + 1).to(DEVICE, torch.float16)
    args = {"X": x, "W": torch.randn(n, generator=g).to(DEVICE, torch.float16),
            "B": torch.randn(n, generator=g).to(DEVICE, torch.float16)}
    args = {p: args[p] for p in kernel.inputs if p != "eps"}
    outs = tuple(torch.full((5, n if i == 0 else 1), float("nan"), device=DEVICE, dtype=torch.float16 if i == 0 else
                            torch.float32) for i in range(len(kernel.outputs)))
    got = as_tuple(kernel(**args, out=outs if len(outs) > 1 else outs[0]))
    assert launches.kernels == [getattr(kernel.module, f"{name}_looped_kernel")]
    assert launches.options[0]["SHIFT"] is (n % 16 != 0)
    defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
    for o, g_, want in zip(kernel.outputs, got, evaluate(kernel.ir, {**args, **defaults})):
        assert not g_.isnan().any(), f"{name} N={n}: {o} has columns no chunk wrote"
        assert_matches(g_, want, n, f"{name} chunk {chunk} N={n} {o}")


@pytest.mark.parametrize("n, offset, want", [(100, 1, "looped_kernel"), (101, 0, "looped_kernel"),
                                                (7, 0, "kernel")])
def test_one_pass_variance_keeps_large_means(n, offset, want, monkeypatch):
    """Layernorm's mean and variance in one sweep (looped rows, shifted or not, chunks of 8) merge
    each chunk's squared deviations from its own mean: rows of mean 3e4 and spread 1, where
    E[X^2] - E[X]^2 in f32 would lose every digit of the variance, give rstd as the
    float64 reference does, as the two-pass rows on chip (N = 7) do."""
    kernel = spec_kernel("layernorm", 8, None, "f32")
    launches = Launches(kernel.module, monkeypatch)
    g = torch.Generator().manual_seed(n)
    X = (3e4 + torch.randn(6, n + offset, generator=g, dtype=torch.float64)).to(DEVICE, torch.float32)[:, offset:]
    W, B = (torch.randn(n, generator=g).to(DEVICE) for _ in range(2))
    Y, mu, rstd = kernel(X, W, B)
    assert launches.kernels == [getattr(kernel.module, f"layernorm_{want}")]
    _, want_mu, want_rstd = evaluate(kernel.ir, {"X": X, "W": W, "B": B, "eps": 1e-5})
    torch.testing.assert_close(rstd.double(), want_rstd.to(rstd.device), rtol=1e-3, atol=0)
    torch.testing.assert_close(mu.double(), want_mu.to(mu.device), rtol=1e-6, atol=0)


@pytest.mark.parametrize("chunk, n", [(8, 7), (8, 100), (8, 101), (None, 40000)])
def test_one_pass_variance_of_values_past_the_square_root_of_f32_max(chunk, n):
    """A value past 1.8e19 squares to inf in f32: the row's variance is inf, rstd 0 and Y = B, as
    the same math in torch's f32 gives, wherever the value sits, also in the looped kernel's first
    chunk, where Welford's weight is 0 (inf * 0 had made the whole row NaN); N = 40000 loops by
    default."""
    kernel = spec_kernel("layernorm", chunk, None, "f32")
    X = torch.zeros(5, n, device=DEVICE)
    for row, col in enumerate((0, n // 2, n - 1, 1 % n)):
        X[row, col] = 2e19 if row % 2 else -1e30
    X[4] = torch.arange(n, device=DEVICE) / n   # a row of ordinary values beside them
    W, B = (torch.randn(n, generator=torch.Generator().manual_seed(n)).to(DEVICE) for _ in range(2))
    mu = X.mean(-1, keepdim=True)
    rstd = torch.rsqrt(((X - mu) * (X - mu)).mean(-1, keepdim=True) + 1e-5)
    want = ((X - mu) * rstd * W + B, mu, rstd)
    assert torch.isinf(rstd[:4].reciprocal()).all()   # torch's variance of the spiked rows: inf
    for got, w, name in zip(kernel(X, W, B), want, ("Y", "mu", "rstd")):
        assert not got.isnan().any(), name
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-5, msg=lambda m: f"N={n} {name}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("name, dtype", [("softmax", "f16"), ("log_softmax", "f32"), ("layernorm", "f16"),
                                         ("rmsnorm", "f32")])
def test_shifted_wide_rows_on_gpu(name, dtype, monkeypatch):
    """GPT-2's vocabulary, 50257 columns: wide rows that are not 16-byte aligned loop
    shifted (16-byte vectors, which the kernel's hints promise the GPU) and match torch."""
    n = 50257
    kernel = spec_kernel(name, None, None, dtype)
    tdt = {"f16": torch.float16, "f32": torch.float32}[dtype]
    launches = Launches(kernel.module, monkeypatch)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(33, n, generator=g, dtype=torch.float64) * 4).to(DEVICE, tdt)
    args = {"X": x, "W": torch.randn(n, generator=g).to(DEVICE, tdt), "B": torch.randn(n, generator=g).to(DEVICE, tdt)}
    args = {p: args[p] for p in kernel.inputs if p != "eps"}
    got = as_tuple(kernel(**args))
    assert launches.kernels == [getattr(kernel.module, f"{name}_looped_kernel")]
    assert launches.options[0]["SHIFT"] is True
    defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
    for o, g_, want in zip(kernel.outputs, got, evaluate(kernel.ir, {**args, **defaults})):
        assert_matches(g_, want, n, f"{name} {dtype} {o}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [65536, 262144 + 4096])
def test_split_rows_on_gpu(n, monkeypatch):
    """Wide f32 rows (16-byte aligned) take the split kernel on a GPU, where its programs
    wait for each other's partials; a row of -inf and a NaN give what torch gives."""
    kernel = spec_kernel("softmax", None, None, "f32")
    launches = Launches(kernel.module, monkeypatch)
    X = torch.randn(300, n, device=DEVICE) * 10
    X[7] = float("-inf")
    X[9, 5] = float("nan")
    got = kernel(X)
    assert launches.kernels == [kernel.module.softmax_split_kernel]
    assert_matches(got, torch.softmax(X.double(), -1), n)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
def test_split_rows_on_gpu_without_waiting(name, monkeypatch):
    """With no polls at all (SPLIT_SPIN 0) a GPU's programs compute whichever peers' partials
    they do not see yet while holding their own chunk: the outputs are still the row's."""
    kernel = spec_kernel(name, None, None, "f32")
    monkeypatch.setattr(kernel.module, "SPLIT_SPIN", 0)
    launches = Launches(kernel.module, monkeypatch)
    g = torch.Generator().manual_seed(5)
    values = {"X": torch.randn(200, 70000, generator=g) * 10, "W": torch.randn(70000, generator=g)}
    values["X"][3, :20000] = float("-inf") if name == "softmax" else 0.0
    args = {p: values[p].to(DEVICE) for p in kernel.inputs if p in values}
    got = kernel(**args)
    assert launches.kernels == [getattr(kernel.module, f"{name}_split_kernel")]
    defaults = {p.name: p.default for p in kernel.ir.params if p.is_scalar}
    assert_matches(got, evaluate(kernel.ir, {**args, **defaults})[0], 70000)


def test_force_chunk_environment_knob(monkeypatch):
    text = (SPECS / "softmax.k").read_text()
    monkeypatch.setenv("KGEN_FORCE_CHUNK", "8")
    kernel = kgen.compile(text)
    launches = Launches(kernel.module, monkeypatch)
    X = torch.randn(3, 20, device=DEVICE, dtype=torch.float16)
    assert_matches(kernel(X), torch.softmax(X.double(), -1), 20)
    assert launches.kernels == [kernel.module.softmax_looped_kernel]
    assert launches.options[0]["BLOCK_N"] == 8
    monkeypatch.setenv("KGEN_FORCE_CHUNK", "12")
    with pytest.raises(KgenError, match="KGEN_FORCE_CHUNK"):
        kgen.compile(text + "\n")


@pytest.mark.parametrize("value", ["\u00b2", "\u0663\u0662", "8.0", "-8", "0", "2097152", "1" * 5000])
def test_a_forced_chunk_that_is_not_ascii_digits_is_a_kgen_error(monkeypatch, value):
    """'²' passes str.isdigit() but not int(): a KgenError naming the knob, not a ValueError; so is
    a chunk past Triton's largest tensor (2**20 elements), as a schedule's BLOCK_N would be, and
    one of more digits than int() takes (shown cut short)."""
    monkeypatch.setenv("KGEN_FORCE_CHUNK", value)
    shown = value if len(value) <= 20 else value[:20] + "..."
    with pytest.raises(KgenError, match=f"KGEN_FORCE_CHUNK={shown!r}: expected a power of two"):
        kgen.compile((SPECS / "softmax.k").read_text() + f"\n# {value!r}\n")


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm"])
def test_online_softmax_and_variance_take_one_sweep(name):
    """The looped kernel finds exp(X - max(X)) / sum(...) and mean((X - mean(X)) ** 2) and
    sweeps the row twice (the max and the sum together, or the mean and the variance, then
    the output), not three times."""
    source = spec_kernel(name).source
    body = source.split(f"def {name}_looped_kernel")[1].split("\ndef ")[0]
    assert body.count("for col0 in") == 2


def test_read_lanes_keeps_what_the_chunk_reads():
    """A lane line whose name nothing reads goes, and with it an ``if`` block left without
    code (its comment too); a name that a kept line reads stays, however it is spelled
    around it; names in comments are not reads."""
    lanes = ("lane = lane0 + tl.arange(0, BLOCK_N)[None, :]",
             "col = lane - shift  # the row's columns",
             "if INT64:",
             "    lane = lane.to(tl.int64)",
             "    col = col.to(tl.int64)",
             "col_mask = (col < n_cols) | EVEN_N",
             "mask = row_mask & col_mask",
             "inner = mask",
             "if SHIFT:",
             "    # inner and window: mask",
             "    inner = tl.max_constancy(mask, [1, VEC])")
    reads_mask = read_lanes(lanes, ["X = tl.load(X_ptr + lane, mask=mask)  # not inner"])
    assert reads_mask == lanes[:7]
    assert read_lanes(lanes, ["Y = tl.load(lane)"]) == (lanes[0], "if INT64:", lanes[3])
    assert read_lanes(lanes, [Line("Y = X", ("tl.store(Y_ptr + lane, Y, mask=inner)",))]) == lanes


def _loop_assignments_unread(source: str, kernel: str) -> dict[int, set[str]]:
    """Per chunk loop of ``kernel`` (by line): the names it assigns that neither the loop nor
    the code after it reads."""
    tree = ast.parse(source)
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == kernel)
    loads = [(n.lineno, n.id) for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    loops = [node for node in ast.walk(fn) if isinstance(node, ast.For) and isinstance(node.target, ast.Name)
             and node.target.id in ("col0", "end")]
    unread = {}
    for loop in loops:
        stored = {n.id for node in loop.body for n in ast.walk(node)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        # read in the loop, or after it outside the other chunk loops (which assign their own)
        read = {name for line, name in loads if loop.lineno <= line <= loop.end_lineno or line > loop.end_lineno
                and not any(other.lineno <= line <= other.end_lineno for other in loops)}
        unread[loop.lineno] = stored - read
    return unread


@pytest.mark.parametrize("text", [*(f"specs/{n}.k" for n in ("softmax", "log_softmax", "layernorm", "rmsnorm")),
                                  "Y = X * W - max(X * W) + B", "s = sum(X); Y = X / s"])
def test_chunk_loops_assign_only_what_they_read(text):
    """The looped kernel's chunk loops print only the lane names and masks that their loads,
    body and stores read (``read_lanes``): no ``col``, ``inner`` or ``edges`` left unused."""
    kernel = kgen.compile(text)
    unread = _loop_assignments_unread(kernel.source, f"{kernel.name}_looped_kernel")
    assert unread and not any(unread.values()), unread


@pytest.mark.parametrize("text", [*(f"specs/{n}.k" for n in ("softmax", "log_softmax", "layernorm", "rmsnorm")),
                                  "d = X - mean(X); Y = X * rsqrt(mean(d * d) + 1e-5)",
                                  "s = sum(X); Y = X - mean(X) + s", "Y = sum(X)",
                                  "kernel k(X: f32[M, N], Q: f32[M, 1]) -> Y: f32[M, N] { s = sum(X); Y = X / s * Q }",
                                  "kernel k(R: f16[M, 1], W: f16[N]) -> Y: f16[M, N] { t = R * W; Y = t - max(t) }"])
def test_looped_kernel_reads_every_name_it_assigns(text):
    """No value after a sweep goes unread (``_read_finals``): a mean whose only use is in its
    variance is merged chunk by chunk, and no ``mean = total / n_cols`` follows; a shifted
    row's lane bounds are computed where a chunk reads them.  The split kernel's peer helper
    loads and takes only what its chunk's reduction reads (Q only in the outputs' sweep)."""
    kernel = kgen.compile(text)
    tree = ast.parse(kernel.source)
    for name in (f"{kernel.name}_looped_kernel", f"_{kernel.name}_peer_partials"):
        fn = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)
        if fn is None:
            assert "peer" in name and "Q" not in text, "a spec that splits has a peer helper"
            continue
        names = [n for n in ast.walk(fn) if isinstance(n, ast.Name)]
        read = {n.id for n in names if isinstance(n.ctx, ast.Load)}
        stored = {n.id for n in names if isinstance(n.ctx, ast.Store)}
        assert stored and stored <= read, (name, stored - read)
        params = {a.arg for a in fn.args.args if not isinstance(a.annotation, ast.Attribute)}
        assert params <= read, (name, params - read)


def test_a_lone_looped_sweep_runs_forward():
    """Sweeps alternate direction so that one starts on the chunks the one before read last;
    a row's sums alone take one sweep, which has no sweep beside it to follow."""
    source = kgen.compile("Y = sum(X)").source
    looped = source.split("_looped_kernel(")[1].split("\ndef ")[0]
    assert "lane0 = col0" in looped and "backward" not in looped
    softmax = spec_kernel("softmax").source.split("_looped_kernel(")[1].split("\ndef ")[0]
    assert "lane0 = col0" in softmax and "backward" in softmax


@pytest.mark.parametrize("make", [lambda: spec_kernel("layernorm"),
                                  lambda: kgen.compile("var = sum((X - mean(X)) ** 2); Y = X * var")],
                         ids=["layernorm", "sum_of_squares"])
def test_variance_keeps_lanes_in_the_chunks_inside_the_row(make):
    """In the mean's sweep the chunks inside the row (the pipelined loop) keep Welford lanes
    and reduce nothing across the program; the lanes merge once, after that loop."""
    kernel = make()
    body = kernel.source.split("_looped_kernel(")[1].split("\ndef ")[0]
    first_sweep = body.split("        for col0 in")[1]
    inner, after = first_sweep.split("\n        # ", 1)
    assert "tl.sum(" not in inner and "tl.reduce(" not in inner
    assert "_lanes" in inner and "tl.sum(" in after.split("for col0 in")[0]


def test_rows_on_chip_load_each_operand_where_it_is_first_read():
    """Layernorm's weight and bias are loaded under the output statement, after both
    reductions, not held in registers through them; X under the first reduction."""
    source = spec_kernel("layernorm").source
    body = source.split("def _layernorm_tile")[1].split("\ndef ")[0]
    lines = [line.strip() for line in body.splitlines()]
    where = lambda prefix: next(i for i, line in enumerate(lines) if line.startswith(prefix))  # noqa: E731
    assert where("X = tl.load") == where("# mu = mean(X, axis=-1)") + 1
    assert where("var = ") < where("rstd = ") < where("# Y = xc * rstd * W + B") < where("W = tl.load") \
        < where("B = tl.load") < where("Y = ")
    assert sum(line.startswith(("W = tl.load", "B = tl.load", "X = tl.load")) for line in lines) == 3


@pytest.mark.parametrize("n", [1000, 1500])
def test_rows_on_chip_run_straight_or_in_a_tile_loop_by_width_and_keep_what_every_row_reads_in_l2(n):
    """Rows up to STRAIGHT_MAX_BLOCK_N columns take the on-chip kernel's straight-line branch
    (one program per tile), wider ones its tile loop (run once); both call one tile function and
    compute layernorm as torch does.  The weight and bias, read by every tile, load with
    evict_last, the rows' X without a hint."""
    kernel = spec_kernel("layernorm")
    body = kernel.source.split("def layernorm_kernel")[1].split("\ndef ")[0]
    loop, straight = body.split("    if TILE_LOOP:\n")[1].split("\n    else:\n")
    assert "for row0 in tl.range(" in loop and "_layernorm_tile(row0, " in loop
    assert "_layernorm_tile(tl.program_id(0) * BLOCK_ROWS, " in straight and "for " not in straight
    assert f"TILE_LOOP=BLOCK_N > {STRAIGHT_MAX_BLOCK_N}" in kernel.source
    tile = kernel.source.split("def _layernorm_tile")[1].split("\ndef ")[0]
    loads = {line.split(" = ")[0].strip(): line for line in tile.splitlines() if "tl.load(" in line}
    assert set(loads) == {"X", "W", "B"}
    assert all('eviction_policy="evict_last"' in loads[name] for name in "WB")
    assert "eviction_policy" not in loads["X"]
    g = torch.Generator().manual_seed(n)
    x, w, b = (torch.randn(*shape, generator=g).half().to(DEVICE) for shape in ((9, n), (n,), (n,)))
    y, mu, rstd = kernel(x, w, b)
    _, want_mu, want_rstd = evaluate(kernel.ir, {"X": x.double(), "W": w.double(), "B": b.double(), "eps": 1e-5})
    assert_matches(y, F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5), n, "Y")
    assert_matches(mu, want_mu, n, "mu")
    assert_matches(rstd, want_rstd, n, "rstd")


@pytest.mark.parametrize("chunk", [None, 4])
def test_rank3_leading_axes_are_flattened_without_copies(chunk):
    """[B, M, N] reduces over N with B*M rows; a permuted input (not viewable as 2-D)
    is read through its own strides; a per-row input [B, M, 1] and a weight [N] broadcast."""
    schedule = f"\nschedule scaled {{ BLOCK_N = {chunk} }}\n" if chunk else ""
    kernel = kgen.compile("kernel scaled(X: f32[B, M, N], S: f32[B, M, 1], W: f32[N]) -> (Y: f32[B, M, N], "
                          "total: f32[B, M, 1]) {\n  total = sum(X * W, axis=-1)\n  Y = X * S / total\n}" + schedule)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(5, 3, 11, generator=g).to(DEVICE).permute(1, 0, 2)     # [3, 5, 11], strides (11, 33, 1)
    S = torch.randn(3, 5, 1, generator=g).to(DEVICE)
    W = torch.randn(11, generator=g).to(DEVICE)
    Y, total = kernel(X, S, W)
    want = evaluate(kernel.ir, {"X": X, "S": S, "W": W})
    assert_matches(Y, want[0], 11)
    assert_matches(total, want[1], 11)
    assert_matches(total, (X.double() * W.double()).sum(-1, keepdim=True), 11)


@pytest.mark.parametrize("chunk", [None, 4])
def test_max_min_propagate_nan_and_ints(chunk):
    schedule = f"\nschedule extremes {{ BLOCK_N = {chunk} }}\n" if chunk else ""
    kernel = kgen.compile("kernel extremes(X: f32[M, N], I: i32[M, N]) -> (hi: f32[M, 1], lo: f32[M, 1], "
                          "top: i32[M, 1]) {\n  hi = max(-X, axis=-1)\n  lo = min(X, axis=-1)\n"
                          "  top = max(I, axis=-1)\n}" + schedule)
    X = torch.randn(4, 13, device=DEVICE)
    X[1, 5] = float("nan")
    X[2] = float("inf")
    I = torch.randint(-2**31, 2**31 - 1, (4, 13), dtype=torch.int32, device=DEVICE)
    hi, lo, top = kernel(X, I)
    assert_matches(hi, (-X.double()).amax(-1, keepdim=True), 13)
    assert_matches(lo, X.double().amin(-1, keepdim=True), 13)
    assert torch.equal(top, I.amax(-1, keepdim=True))


# Headerless specs: chains of reductions, pointwise code before, between and after them,
# per-row and along-the-row operands, Python-number scalars, several outputs.
GENERAL = [
    "m = max(X)\nY = exp(X - m) / sum(exp(X - m))\ntotal = sum(X)",
    "mu = mean(X)\nspread = max(abs(X - mu))\nY = (X - mu) / (spread + 1.0)",
    "z = X * S + B\nY = z - max(z) - log(sum(exp(z - max(z))))",
    "Y = X * alpha / (mean(X * X) + 2.0)",
    "lo = min(X)\nhi = max(X)\nY = (X - lo) / (hi - lo)",
    "m = max(X)\nY = mean(exp(X - m))",
    "Y = sum(where(X > 0.0, X, 0.0 - X)) + min(X * S)",
    # variances found with their mean (one sweep when looped): named, inline, squared by **
    "mu = mean(X * S)\nd = X * S - mu\nY = d / (sum(d * d) + 1.0)\nv = mean(d ** 2)",
    "Y = mean((X - mean(X)) * (X - mean(X))) + max(X)",
]


@pytest.mark.parametrize("chunk", [None, "4"])
@pytest.mark.parametrize("text", GENERAL)
def test_general_row_reductions(text, chunk, monkeypatch):
    if chunk:
        monkeypatch.setenv("KGEN_FORCE_CHUNK", chunk)
    kernel = kgen.compile(text)
    g = torch.Generator().manual_seed(7)
    m, n = 5, 11
    values = {"X": torch.randn(m, n, generator=g) * 3, "S": torch.randn(m, 1, generator=g),
              "B": torch.randn(n, generator=g), "alpha": 0.5}
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in values.items() if k in kernel.inputs}
    outputs = as_tuple(kernel(**args))
    assert kernel.pattern == "row_reduce"
    for name, got, want in zip(kernel.outputs, outputs, evaluate(kernel.ir, args)):
        assert_matches(got, want, n, name)


@pytest.mark.parametrize("dtype, value", [("f16", 60000.0), ("f32", 1e6), ("f32", -3.5e4)])
@pytest.mark.parametrize("chunk", [None, 16, 64])
def test_rows_of_one_value_have_no_variance(dtype, value, chunk):
    """A row whose values are all one large number has variance 0, so rstd is exactly
    1/sqrt(eps), on chip and looped (chunks inside the row kept lane by lane, a row's ends
    merged): a deviation from a mean recovered by rounding, ulp(value) ** 2, would be near eps.
    Rows of 257 and 1000 columns cross the chunks (shifted) and fill whole ones."""
    kernel = spec_kernel("layernorm", chunk, None, dtype)
    for n in (257, 1000):
        X = torch.full((3, n), value, device=DEVICE, dtype={"f16": torch.float16, "f32": torch.float32}[dtype])
        W, B = torch.ones_like(X[0]), torch.zeros_like(X[0])
        Y, mu, rstd = kernel(X, W, B)
        _, torch_mu, torch_rstd = torch.native_layer_norm(X.double(), (n,), W.double(), B.double(), 1e-5)
        assert_matches(rstd, torch_rstd, 1, f"rstd, n = {n}")
        assert_matches(mu, torch_mu, 1, f"mu, n = {n}")
        assert torch.equal(Y, torch.zeros_like(Y)), f"Y, n = {n}"


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("chunk", [None, 16])
def test_a_variance_whose_mean_overflows_is_inf_as_torchs(chunk, offset):
    """Rows whose f32 sum overflows have mean inf and, as torch computes them, variance inf
    (every deviation is -inf), on chip and looped, in whole chunks' lanes (offset 0) and
    shifted (offset 1): two chunks' means at inf step by 0, not inf - inf = NaN."""
    schedule = f"schedule v {{ BLOCK_N = {chunk} }}\n" if chunk else ""
    kernel = kgen.compile("kernel v(X: f32[M, N]) -> (mu: f32[M, 1], var: f32[M, 1]) {\n"
                          "    mu = mean(X)\n    var = mean((X - mu) * (X - mu))\n}\n" + schedule)
    X = torch.full((2, 40 + offset), 3e38, device=DEVICE)[:, offset:]
    X[1] = torch.randn(40 + offset, device=DEVICE)[offset:]
    mu, var = kernel(X)
    want_mu = X.mean(-1, keepdim=True)
    want_var = ((X - want_mu) ** 2).mean(-1, keepdim=True)
    assert torch.isinf(mu[0]).all() and torch.isinf(var[0]).all() and torch.isinf(want_var[0]).all()
    torch.testing.assert_close(var[1], want_var[1])


@pytest.mark.parametrize("chunk", [None, 8])
def test_infinities_reach_a_looped_mean_as_a_sum_carries_them(chunk):
    """A row holding -inf has mean -inf (+inf and -inf: NaN) however its chunks fall: the
    looped kernel's lanes keep running means, which must stay at ±inf rather than turn NaN
    on the finite values after it (x - -inf is +inf)."""
    kernel = spec_kernel("layernorm", chunk, None, "f32")
    n = 40
    X = torch.ones(5, n, device=DEVICE)
    X[0, 0] = float("-inf")                        # in the first chunk, finite ones after it
    X[1, 20] = float("inf")                        # inside the row
    X[2, 39] = float("-inf")                       # at its end
    X[3, 3], X[3, 30] = float("inf"), float("-inf")
    W, B = torch.ones(n, device=DEVICE), torch.zeros(n, device=DEVICE)
    got = kernel(X, W, B, 1e-5)
    want = evaluate(kernel.ir, {"X": X, "W": W, "B": B, "eps": 1e-5})
    assert want[1][:3].flatten().tolist() == [float("-inf"), float("inf"), float("-inf")] and want[1][3].isnan()
    for name, g, w in zip(kernel.outputs, got, want):
        assert_matches(g, w, n, f"{name}, chunk {chunk}")


def test_all_neg_inf_rows_give_what_torch_gives():
    for chunk in (None, 4):
        for name in ("softmax", "log_softmax"):
            kernel = spec_kernel(name, chunk, None, "f32")
            X = torch.randn(4, 10, device=DEVICE)
            X[0] = float("-inf")
            X[1, :7] = float("-inf")       # a -inf prefix longer than the chunk
            X[2, 3] = float("inf")
            want = getattr(torch, name)(X.double(), -1)
            assert torch.isnan(want[0]).all()
            assert_matches(kernel(X), want, 10, f"{name}, chunk {chunk}")


@pytest.mark.parametrize("chunk", [None, "4"])
def test_online_sums_of_an_all_neg_inf_row_are_nan_as_in_torch(chunk, monkeypatch):
    """sum(exp(X - max(X))) of a row of -inf is NaN in torch (exp(-inf - -inf)); the looped
    kernel's online sum, which shifts by 0 while the max is -inf, must agree."""
    if chunk:
        monkeypatch.setenv("KGEN_FORCE_CHUNK", chunk)
    X = torch.randn(3, 10, device=DEVICE)
    X[1] = float("-inf")
    for text in ("S = sum(exp(X - max(X)))", "L = log(sum(exp(X - max(X)))) + max(X)", "A = mean(exp(X - max(X)))"):
        kernel = kgen.compile(text)
        got = kernel(X)
        want = evaluate(kernel.ir, {"X": X})[0]
        assert torch.isnan(want[1]).all() and torch.isnan(got[1]).all(), text
        assert_matches(got, want, 10, text)


@pytest.mark.parametrize("text, shapes", [("Y = Z - mean(X)", [(4, 9), (4, 9)]),
                                          ("Y = mean(X) + mean(Z)", [(4, 9), (4, 9)]),
                                          ("Y = sum(X) + W", [(4, 9), (9,)]),
                                          ("Y = X - max(X) + sum(W)", [(4, 9), (9,)]),
                                          ("Y = X - max(X) + max(W - relu(S))", [(4, 9), (9,), (4, 1)])])
def test_headerless_values_beside_a_reduction_share_its_rows(text, shapes):
    """In the headerless form every value's axes, aligned from the right, take the reduced
    rows' (the row kernel computes one row space: a vector reduced beside the rows is as long
    as they are, a column [M, 1] has their M); a call whose widths differ is a CallError."""
    kernel = kgen.compile(text)
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(*s, generator=g).to(DEVICE) for s in shapes]
    got = kernel(*args)
    want = evaluate(kernel._last.ir, dict(zip(kernel.inputs, args)))[0]
    assert kernel.pattern == "row_reduce"
    assert_matches(got, want, 9, text)
    wider = [torch.randn(*s[:-1], 10, device=DEVICE) if i else a for i, (s, a) in enumerate(zip(shapes, args))]
    with pytest.raises(kgen.CallError, match="expected"):
        kernel(*wider)


def test_headerless_reductions_and_unit_rows():
    """Headerless specs specialize size-1 axes: N = 1 makes every reduction its input
    (an elementwise kernel); other N take the row-reduction kernel."""
    sm = kgen.compile("m = max(X)\ne = exp(X - m)\nY = e / sum(e)")
    for shape in ((6, 1), (6, 9), (1, 9), (9,)):
        X = torch.randn(*shape, device=DEVICE)
        assert_matches(sm(X), torch.softmax(X.double(), -1), shape[-1], str(shape))
        assert sm.pattern == ("elementwise" if shape[-1] == 1 else "row_reduce")
    # a sum of one element is that element plus 0, as torch sums it: -0.0 gives +0.0
    x = torch.tensor([[-0.0], [-1.0], [0.0]], device=DEVICE)
    for text, want in (("y = 1 / sum(x)", 1 / x.sum(-1, keepdim=True)),
                       ("y = 1 / mean(x)", 1 / x.mean(-1, keepdim=True)),
                       ("y = 1 / max(x)", 1 / x.amax(-1, keepdim=True)),
                       ("y = 1 / min(x)", 1 / x.amin(-1, keepdim=True))):
        for k in (kgen.compile(text), kgen.compile(f"kernel f(x: f32[M, 1]) -> y {{ {text} }}")):
            assert torch.equal(k(x), want), text


def test_zero_sizes(watch):
    """No rows: empty outputs and no launch."""
    kernel = spec_kernel("softmax", None, None, "f32")
    layernorm = spec_kernel("layernorm", None, None, "f32")
    launches = watch(kernel.module), watch(layernorm.module)
    assert kernel(torch.empty(0, 5, device=DEVICE)).shape == (0, 5)
    Y, mu, rstd = layernorm(torch.empty(0, 5, device=DEVICE), torch.ones(5, device=DEVICE),
                            torch.zeros(5, device=DEVICE))
    assert Y.shape == (0, 5) and mu.shape == (0, 1) and rstd.shape == (0, 1)
    assert launches[0].count == launches[1].count == 0
    assert kernel(torch.empty(3, 0, device=DEVICE)).shape == (3, 0)
    assert launches[0].count == 0, "rows of no columns and no per-row output: nothing to write"
    Y, mu, rstd = layernorm(torch.empty(3, 0, device=DEVICE), torch.ones(0, device=DEVICE),
                            torch.zeros(0, device=DEVICE))
    assert Y.shape == (3, 0) and mu.isnan().all() and launches[1].count == 1   # per-row outputs: NaN, as torch


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_reductions_over_rows_of_no_columns():
    """sum and mean as torch gives them; max and min their identities (torch's amax raises)."""
    x = torch.empty(3, 0, device=DEVICE)
    assert torch.equal(kgen.compile("m = sum(X)")(x), x.sum(-1, keepdim=True))
    assert kgen.compile("m = mean(X)")(x).isnan().all() and x.mean(-1).isnan().all()
    assert torch.equal(kgen.compile("m = max(X)")(x), torch.full((3, 1), -math.inf, device=DEVICE))
    assert torch.equal(kgen.compile("m = min(X)")(x), torch.full((3, 1), math.inf, device=DEVICE))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("text", [
    "kernel extremes(X: f32[M, N], I: i32[M, N]) -> (hi: f32[M, 1], lo: f16[M, 1], top: i32[M, 1], "
    "bottom: i32[M, 1]) {\n  hi = max(X)\n  lo = f16(min(X))\n  top = max(I)\n  bottom = min(I)\n}",
    "kernel shifted(X: f32[M, N]) -> (Y: f32[M, N], m: f32[M, 1]) {\n  m = max(X)\n  Y = exp(X - m)\n}",
    (SPECS / "softmax.k").read_text(), (SPECS / "log_softmax.k").read_text(),
], ids=["extremes", "shifted", "softmax", "log_softmax"])
def test_the_reference_over_rows_of_no_columns_gives_what_the_kernels_give(text):
    """kgen run compares a kernel with ``evaluate``: over rows of 0 columns its max and min
    are the kernels' identities (-inf, +inf, the int32 extremes), not torch's IndexError."""
    kernel = kgen.compile(text)
    args = {p.name: torch.empty(3, 0, device=DEVICE, dtype=p.dtype.torch) for p in kernel.ir.params}
    got = kernel(**args)
    got = got if isinstance(got, tuple) else (got,)
    want = evaluate(kernel.ir, args)
    for name, g, w in zip(kernel.outputs, got, want):
        assert tuple(w.shape) == tuple(g.shape), name
        assert torch.equal(w.to(g.dtype), g), (name, w, g)


def test_out_with_strides():
    kernel = spec_kernel("softmax", None, None, "f32")
    X = torch.randn(5, 7, device=DEVICE)
    out = torch.empty(7, 5, device=DEVICE).t()
    assert kernel(X, out=out) is out
    assert_matches(out, torch.softmax(X.double(), -1), 7)


# --------------------------------------------------------------------------- errors

def test_reduction_over_another_axis_is_an_error_at_its_position():
    with pytest.raises(UnsupportedError) as e:
        kgen.compile("kernel colsum(X: f32[M, N]) -> Y: f32[1, N] {\n    Y = sum(X, axis=0)\n}")
    assert (e.value.span.line, e.value.span.col) == (2, 9)
    assert "last axis" in e.value.message and ":2:9:" in str(e.value)


@pytest.mark.parametrize("dim", ["SPLIT", "SHIFT", "PER_SM", "ODD"])
def test_dimensions_named_like_the_host_functions_locals(dim):
    """The host function binds a rank-3 input's dims, then SHIFT, SPLIT, PER_SM, ... for
    itself, and passes the dims on by name: a dimension may not take one of those names
    (it had split rows at the wrong size, or raised inside Triton)."""
    text = f"kernel k(X: f32[B, {dim}, N]) -> Y: f32[B, {dim}, N] {{\n    Y = X - max(X)\n}}\n"
    with pytest.raises(UnsupportedError, match=f"'{dim}' is a name the generated row reduction uses itself; "
                                               f"rename the dimension") as e:
        kgen.compile(text)
    assert (e.value.span.line, e.value.span.col) == (1, 10)


def test_reduction_over_a_missing_axis_is_an_error():
    with pytest.raises(SpecError) as e:
        kgen.compile("kernel bad(X: f32[M, N]) -> Y: f32[M, 1] {\n    Y = sum(X, axis=2)\n}")
    assert (e.value.span.line, e.value.span.col) == (2, 21)


def test_outputs_must_have_the_rows_shape():
    with pytest.raises(UnsupportedError, match="output 'Z'"):
        kgen.compile("kernel two(X: f32[M, N], W: f32[N]) -> (Y: f32[M, N], Z: f32[N]) {\n"
                     "    Y = X / sum(X, axis=-1)\n    Z = W * 2.0\n}")


def test_bad_calls_name_the_argument_before_any_launch(monkeypatch):
    layernorm = spec_kernel("layernorm", None, None, "f32")
    launches = Launches(layernorm.module, monkeypatch)
    X, W, B = (torch.randn(*shape, device=DEVICE) for shape in ((3, 8), (8,), (8,)))
    with pytest.raises(CallError, match="W"):
        layernorm(X, torch.randn(7, device=DEVICE), B)
    with pytest.raises(CallError, match="W"):
        layernorm(X, torch.randn(3, 8, device=DEVICE), B)
    with pytest.raises(CallError, match="eps"):
        layernorm(X, W, B, torch.tensor(1e-5))
    assert launches.kernels == []


@pytest.mark.parametrize("schedule, message", [
    ("BLOCK_N = [16, 32]", "one value"),
    ("BLOCK_N = 24", "power of two"),
    ("GROUP_M = 8", "GROUP_M"),
])
def test_schedule_errors(schedule, message):
    text = (SPECS / "softmax.k").read_text() + f"\nschedule softmax {{ {schedule} }}\n"
    with pytest.raises(SpecError, match=message):
        kgen.compile(text)


@pytest.mark.parametrize("cols, chunk", [(20000, None), (2048, None), (3000, "1024")])
def test_a_scheduled_block_rows_stays_within_tritons_largest_tile(cols, chunk, monkeypatch):
    """A schedule's BLOCK_ROWS is taken up to Triton's largest tile, 2**20 elements, at the
    BLOCK_N of each call (64 rows of 32768 columns had Triton refuse the kernel)."""
    if chunk:
        monkeypatch.setenv("KGEN_FORCE_CHUNK", chunk)
    text = (SPECS / "softmax.k").read_text().replace("f16", "f32") + "\nschedule softmax { BLOCK_ROWS = 1024 }\n"
    kernel = kgen.compile(text)
    launched = []
    monkeypatch.setattr(kernel.module, "launch_rows", lambda *args, **options: launched.append(options))
    kernel(torch.empty(4096, cols, device=DEVICE))   # (recorded, not run: the interpreter takes minutes)
    rows, block = launched[0]["BLOCK_ROWS"], launched[0]["BLOCK_N"]
    assert block == (int(chunk) if chunk else triton.next_power_of_2(cols))
    assert rows * block <= 2**20 and (chunk or rows * block == 2**20)   # (on chip: as many as fit)


def test_a_weight_that_does_not_broadcast_along_the_row_is_an_error():
    with pytest.raises(SpecError) as e:
        kgen.compile("kernel bad(X: f32[M, N], W: f32[M]) -> Y: f32[M, N] {\n    Y = X * W / sum(X)\n}")
    assert (e.value.span.line, e.value.span.col) == (2, 9)
    headerless = kgen.compile("Y = X * W / sum(X)")
    with pytest.raises(CallError, match="W"):
        headerless(torch.randn(3, 5, device=DEVICE), torch.randn(4, device=DEVICE))


def test_reductions_over_rows_of_different_lengths_are_an_error():
    with pytest.raises(UnsupportedError, match="rows of one length") as e:
        kgen.compile("kernel two(X: f32[M, N], Z: f32[M, K]) -> Y: f32[M, 1] {\n"
                     "    Y = sum(X, axis=-1) + sum(Z, axis=-1)\n}")
    assert e.value.span.line == 2


@pytest.mark.parametrize("chunk, cut", [(None, 0), ("8", 0), ("8", 1)], ids=["on-chip", "looped", "split"])
def test_each_row_kernel_under_int64(chunk, cut, monkeypatch):
    """INT64 (offsets past 2**31 elements, or a size within reach of 2**31: the host's
    _needs_int64) takes every row kernel's sizes, rows and columns into int64, to the
    same values."""
    if chunk:
        monkeypatch.setenv("KGEN_FORCE_CHUNK", chunk)
    kernel = kgen.compile("kernel s(X: f32[M, N]) -> Y: f32[M, N] { Y = exp(X - max(X)) / sum(exp(X - max(X))) }")
    launches = Launches(kernel.module, monkeypatch)
    needs = []
    monkeypatch.setattr(kernel.module, "_needs_int64", lambda *ts, sizes=(): needs.append(sizes) or True)
    x = torch.randn(5, 41, device=DEVICE)[:, cut:]   # (off 16-byte boundaries: split)
    torch.testing.assert_close(kernel(x), torch.softmax(x, -1))
    name = {None: "s_kernel", "8": "s_split_kernel" if cut else "s_looped_kernel"}[chunk]
    assert launches.kernels == [getattr(kernel.module, name)] and needs == [(5, 41 - cut)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols, offset", [(1, 2**31 - 1000, 0), (1, 2**31 - 1000, 1), (2**31 - 1000, 1, 0)],
                         ids=["wide", "wide-shifted", "tall"])
def test_sizes_within_reach_of_2_31(rows, cols, offset):
    """A row (or a row count) under 2**31 but within a chunk (a grid step) of it: the kernels'
    arithmetic on the sizes goes int64, so that the last chunk is neither skipped nor wrapped
    (rows of 2**31 - 1000 columns had their last 15384 left unwritten)."""
    kernel = kgen.compile("kernel d(X: f16[M, N]) -> Y: f16[M, N] { Y = X - max(X) }")
    x = torch.zeros(rows * cols + offset, dtype=torch.float16, device="cuda")[offset:].view(rows, cols)
    x.view(-1)[-1] = 1.0
    y = torch.full_like(x, float("nan"))
    kernel(x, out=y)
    m, axis = x.amax(-1, keepdim=True).expand(rows, cols), 1 if rows == 1 else 0
    for got, xs, ms in zip(y.split(2**28, axis), x.split(2**28, axis), m.split(2**28, axis)):   # (torch's temporaries)
        assert not got.isnan().any() and torch.equal(got, xs - ms)
    del x, y, m
    torch.cuda.empty_cache()
