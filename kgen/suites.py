"""``kgen bench --suite NAME``: kgen's specs against PyTorch's own library calls, side by
side in one run (the README's Performance tables).  ``kgen bench PATH`` compares a spec
with its own math run by torch; a suite compares with what a user would call instead:
``torch.softmax``, ``F.layer_norm``, cuBLAS through ``torch.matmul``, ``torch._grouped_mm``,
and ``torch.compile`` of the same calls.

Each case checks kgen's result against the first baseline, then times kgen and every
baseline in turn (``bench.interleaved``) and prints the medians as rates, with each
baseline's time over kgen's (above 1: kgen is faster).
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from .errors import KgenError

SPECS = Path(__file__).resolve().parent.parent / "specs"


@dataclass
class Case:
    label: str
    kgen: Callable
    baselines: dict[str, Callable]   # name -> the same result computed by torch
    work: float                      # bytes moved (GB/s) or flops (TFLOP/s)
    unit: str                        # "GB/s", "TFLOP/s", or "us": times only


def _spec(name: str, dtype: str = "f16"):
    from .bench import retyped
    from .dtypes import BY_NAME
    from .runtime import compile_text, read_spec
    path = SPECS / f"{name}.k"
    if not path.exists():
        raise KgenError(f"{path}: no such spec (suites time the specs of a kgen checkout)")
    text, _ = read_spec(path)   # a regular file, read as kgen reads any spec
    return compile_text(retyped(text, BY_NAME[dtype], str(path)), str(path))


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def softmax() -> list[Case]:
    cases = []
    for dtype in ("f16", "f32"):
        kernel = _spec("softmax", dtype)
        for m, n in [(4096, n) for n in (256, 1024, 4096, 16384)] + [(1024, 65536), (1024, 262144)]:
            x = torch.randn(m, n, device="cuda", dtype=_torch(dtype))
            ref = _compiled(lambda x: torch.softmax(x, -1))
            cases.append(Case(f"softmax {dtype} M={m} N={n}", lambda x=x, kernel=kernel: kernel(x),
                              {"torch": lambda x=x: torch.softmax(x, -1), "compile": lambda x=x, ref=ref: ref(x)},
                              2 * x.numel() * x.element_size(), "GB/s"))
    return cases


def norms() -> list[Case]:
    layernorm, rmsnorm = _spec("layernorm"), _spec("rmsnorm")
    cases = []
    for n in (1024, 4096, 8192):
        x = torch.randn(4096, n, device="cuda", dtype=torch.float16)
        w, b = torch.randn(n, device="cuda", dtype=torch.float16), torch.randn(n, device="cuda", dtype=torch.float16)
        ln = lambda x=x, w=w, b=b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)  # noqa: E731
        rn = lambda x=x, w=w: F.rms_norm(x, (x.shape[-1],), w, 1e-6)           # noqa: E731
        cln, crn = _compiled(F.layer_norm), _compiled(F.rms_norm)
        moved = 2 * x.numel() * x.element_size()   # X read, Y written
        cases.append(Case(f"layernorm f16 M=4096 N={n}", lambda x=x, w=w, b=b: layernorm(x, w, b, 1e-5)[0],
                          {"torch": ln, "compile": lambda x=x, w=w, b=b, f=cln: f(x, (x.shape[-1],), w, b, 1e-5)},
                          moved, "GB/s"))
        cases.append(Case(f"rmsnorm f16 M=4096 N={n}", lambda x=x, w=w: rmsnorm(x, w, 1e-6),
                          {"torch": rn, "compile": lambda x=x, w=w, f=crn: f(x, (x.shape[-1],), w, 1e-6)},
                          moved, "GB/s"))
    return cases


def gemm() -> list[Case]:
    import kgen
    kernel = kgen.compile("C = leaky_relu(A @ B)")
    cases = []
    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in [(s, s, s) for s in (512, 1024, 2048, 4096, 8192)] + [(m, 4096, 4096) for m in (16, 128)]:
            a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
            eager = lambda a=a, b=b: F.leaky_relu(a @ b, 0.01)  # noqa: E731
            compiled = _compiled(lambda a, b: F.leaky_relu(a @ b, 0.01))
            cases.append(Case(f"leaky_relu(A @ B) {_name(dtype)} {m}x{n}x{k}", lambda a=a, b=b: kernel(a, b),
                              {"eager": eager, "compile": lambda a=a, b=b, f=compiled: f(a, b),
                               "cuBLAS alone": lambda a=a, b=b: a @ b},
                              2 * m * n * k, "TFLOP/s"))
    return cases


def linear() -> list[Case]:
    kernel = _spec("linear_gelu")
    cases = []
    for m in (16, 128, 4096):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.float16)
        w = torch.randn(4096, 11008, device="cuda", dtype=torch.float16) / 64
        bias = torch.randn(11008, device="cuda", dtype=torch.float16)
        compiled = _compiled(lambda x, w, bias: F.gelu(x @ w + bias))
        cases.append(Case(f"linear_gelu f16 {m}x11008x4096", lambda x=x, w=w, bias=bias: kernel(x, w, bias),
                          {"eager": lambda x=x, w=w, bias=bias: F.gelu(x @ w + bias),
                           "compile": lambda x=x, w=w, bias=bias, f=compiled: f(x, w, bias),
                           "cuBLAS alone": lambda x=x, w=w: x @ w},
                          2 * m * 11008 * 4096, "TFLOP/s"))
    return cases


def grouped() -> list[Case]:
    """4 square problems (list form and MoE form), and the MoE shape: 32 problems with M_g
    from {64, ..., 512} (seed 0), K = N = 1024; times in microseconds."""
    f16, bf16 = _spec("grouped_gemm"), _spec("grouped_gemm", "bf16")
    shapes = [(f"4 x {n}^3", [n] * 4, n) for n in (128, 256, 512, 1024, 2048)]
    rng = random.Random(0)
    shapes.append(("MoE 32 problems", [rng.choice((64, 128, 192, 256, 384, 512)) for _ in range(32)], 1024))
    cases = []
    for label, ms, n in shapes:
        a = [torch.randn(m, n, device="cuda", dtype=torch.float16) for m in ms]
        b = [torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in ms]
        a_cat, b_stack = torch.cat(a), torch.stack(b)
        offs = torch.tensor(ms, device="cuda").cumsum(0).to(torch.int32)
        a16, b16 = a_cat.to(torch.bfloat16), b_stack.to(torch.bfloat16)
        baselines = {"torch.matmul loop": lambda a=a, b=b: [x @ y for x, y in zip(a, b)]}
        if hasattr(torch, "_grouped_mm"):
            baselines["torch._grouped_mm bf16"] = lambda a16=a16, b16=b16, offs=offs: torch._grouped_mm(a16, b16,
                                                                                                         offs=offs)
        work = sum(2 * m * n * n for m in ms)
        cases.append(Case(f"grouped list {label}", lambda a=a, b=b: f16(a, b), baselines, work, "us"))
        cases.append(Case(f"grouped moe {label}", lambda a=a_cat, b=b_stack, offs=offs: f16.moe(a, b, offs=offs),
                          baselines, work, "us"))
        cases.append(Case(f"grouped moe bf16 {label}",
                          lambda offs=offs, a16=a16, b16=b16: bf16.moe(a16, b16, offs=offs), baselines, work, "us"))
    return cases


SUITES: dict[str, Callable[[], list[Case]]] = {
    "softmax": softmax, "norms": norms, "gemm": gemm, "linear": linear, "grouped": grouped}


def _torch(dtype: str) -> torch.dtype:
    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run(name: str, rounds: int, time_it) -> list[dict]:
    """Times every case of a suite; prints a line per case and returns the rows."""
    from .bench import interleaved
    rows = []
    for case in SUITES[name]():
        error = _relative_error(case.kgen(), next(iter(case.baselines.values()))())
        if not error < 2e-2:
            print(f"{case.label}: kgen differs from {next(iter(case.baselines))} (relative error {error:.2e}); "
                  f"not timed", file=sys.stderr)
            continue
        torch._dynamo.reset()   # one case's shapes at a time: under dynamo's recompile limit
        for fn in case.baselines.values():
            fn()                # torch.compile's baseline compiles before the clock starts
        times = interleaved({"kgen": case.kgen, **case.baselines}, rounds, time_it)
        rows.append({"case": case.label, "unit": case.unit, "us": times,
                     "rate": {k: _rate(case, t) for k, t in times.items()}, "error": error})
        _print(rows[-1])
    return rows


def _relative_error(got, want) -> float:
    got, want = (torch.cat(x) if isinstance(x, (list, tuple)) else x for x in (got, want))
    scale = want.float().abs().max().clamp_min(1e-30)
    return ((got.float() - want.float()).abs().max() / scale).item()


def _rate(case: Case, us: float) -> float | None:
    if case.unit == "us":
        return None
    return case.work / (us * 1e-6) / (1e12 if case.unit == "TFLOP/s" else 1e9)


def _print(row: dict) -> None:
    us, unit = row["us"], row["unit"]
    show = (lambda k: f"{us[k]:8.1f} us") if unit == "us" else (lambda k: f"{row['rate'][k]:8.1f} {unit}")
    others = " | ".join(f"{k} {show(k)} (x{us[k] / us['kgen']:.2f})" for k in us if k != "kgen")
    print(f"{row['case']:>36}  kgen {show('kgen')} | {others}", flush=True)
