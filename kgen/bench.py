"""``kgen run`` and ``kgen bench``.

``run`` builds a spec, runs it on random data (GPU, or Triton's interpreter) and
compares every output with the float64 reference.  ``bench`` times the kernel with
``triton.testing.do_bench`` (or, with ``--graph``, replayed from CUDA graphs: GPU time
alone; with ``--kernel-time``, its kernels' own durations as CUPTI records them) against
the same math in eager PyTorch and under ``torch.compile`` (both built from the reference
evaluator, in the same run), over a size sweep chosen by the kernel's pattern, and reports
time, GB/s or TFLOP/s and the ratio to each baseline.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import dtypes as D
from .errors import KgenError
from .files import check_name, display_path, existing_kind, new_temp
from .ir import REDUCTIONS, KernelIR, Op, topo_order
from .reference import compare, evaluate

# Sweeps by pattern: each point maps symbols to sizes ("rows" and "cols" are
# resolved against the spec's own dims by ``sizes_for``).
SWEEPS = {
    "elementwise": [{"numel": 2**20}, {"numel": 2**24}, {"numel": 2**28}],
    "row_reduce": [{"rows": 4096, "cols": n} for n in (256, 1024, 4096, 16384)]
                  + [{"rows": 1024, "cols": n} for n in (65536, 262144)],
    "gemm": [{"square": n} for n in (512, 1024, 2048, 4096, 8192)],
    # lists of 4 problems of n x n x n (`kgen bench --suite grouped` adds the MoE shape)
    "grouped_gemm": [{"square": n, "groups": 4} for n in (128, 256, 512, 1024, 2048)],
}


GROUPS = "groups"     # --shape groups=N: the number of problems of a kernel with list parameters
MAX_GROUPS = 4096     # a list of that many problems per parameter, each its own tensor; more is a typo
SEED_RANGE = 2**64    # torch.manual_seed takes 0 to 2**64 - 1 (negatives alias these)


@dataclass
class Row:
    kernel: str
    point: str
    dtype: str
    kgen_us: float
    eager_us: float | None
    compile_us: float | None
    unit: str            # GB/s or TFLOP/s
    kgen_rate: float
    eager_rate: float | None
    compile_rate: float | None

    @property
    def vs_eager(self) -> float | None:
        return self.eager_us / self.kgen_us if self.eager_us else None

    @property
    def vs_compile(self) -> float | None:
        return self.compile_us / self.kgen_us if self.compile_us else None


def parse_shape(text: str) -> dict[str, int]:
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        try:
            if not name.isidentifier():
                raise ValueError(name)
            size = eval_size(value)
        except ValueError:
            raise KgenError(f"--shape: expected NAME=SIZE such as M=64 or N=2**20 (0 <= SIZE < 2**40), "
                            f"got {part!r}") from None
        if name in sizes:
            raise KgenError(f"--shape: {name} is given twice")
        sizes[name] = size
    if not sizes:
        raise KgenError(f"--shape: expected NAME=SIZE such as M=64 or N=2**20, got {text!r}")
    return sizes


def eval_size(text: str) -> int:
    """``4096`` or ``2**20``: sizes are integers or powers, nothing else, from 0 to below 2**40
    (an exponent is bounded before it is raised)."""
    base, power, exp = text.strip().partition("**")
    if not _digits(base) or power and not _digits(exp):
        raise ValueError(text)     # int() would take 1_0 and other scripts' digits; 2** has no exponent
    size = int(base)
    if exp:
        if not 0 <= int(exp) < 64 or not 0 <= size < 2**40:
            raise ValueError(text)
        size **= int(exp)
    if not 0 <= size < 2**40:
        raise ValueError(text)
    return size


def _digits(text: str) -> bool:
    return text.strip().isascii() and text.strip().isdigit()


def symbols(kir: KernelIR) -> list[str]:
    seen = []
    for p in kir.params:
        for d in p.shape or ():
            if isinstance(d, str) and d not in seen:
                seen.append(d)
    return seen


def sizes_for(kir: KernelIR, point: dict, sweep: bool = False, known: set[str] = frozenset()) -> dict[str, int]:
    """Concrete sizes for a point of SWEEPS (``sweep``), or for a NAME=SIZE mapping from
    --shape: the kernel's own dimensions, 64 where not given; names that another kernel of
    the file has (``known``) are left to it."""
    syms = symbols(kir)
    if has_lists(kir) and GROUPS in syms:
        raise KgenError(f"{kir.name} has a dimension named {GROUPS}, the name --shape gives the number of problems "
                        f"of a kernel with lists: rename the dimension to run or time it here")
    if not sweep:
        own = syms + ([GROUPS] if has_lists(kir) else [])
        unknown = [k for k in point if k not in own and k not in known]
        if unknown:
            what = "is not a dimension" if len(unknown) == 1 else "are not dimensions"
            whose = f"of {kir.name} (its dimensions: {', '.join(syms) or 'none'})" if set(known) <= set(own) else \
                f"of any of the file's kernels (theirs: {', '.join(sorted(set(known) | set(own)))})"
            raise KgenError(f"--shape: {', '.join(unknown)} {what} {whose}" + _groups_hint(unknown))
        given = {k: v for k, v in point.items() if k in own}
        if GROUPS in given and not 1 <= given[GROUPS] <= MAX_GROUPS:
            raise KgenError(f"--shape: {GROUPS}= is the number of problems of {kir.name}'s lists, "
                            f"expected 1 to {MAX_GROUPS}, got {given[GROUPS]}")
        return {**{s: given.get(s, 64) for s in syms}, **given}   # in the kernel's order, groups= last
    out_shape = [d for d in kir.outputs[0].node.shape if isinstance(d, str)]
    if "square" in point:   # n x n x n matrices; a batch of 4 of them (B = n would fill no GPU's memory)
        return {s: 4 if s in out_shape[:-2] else point["square"] for s in syms}
    if "rows" in point:   # the reduced axis (the last of a reduction's input) takes "cols"
        reduced = next((n for n in topo_order(o.node for o in kir.outputs) if n.op in REDUCTIONS), None)
        row = list((reduced.inputs[0] if reduced else kir.outputs[0].node).shape)
        cols = row[-1] if row and isinstance(row[-1], str) else None
        first = next((d for d in row if isinstance(d, str) and d != cols), None)
        return {s: point["cols"] if s == cols else (point["rows"] if s == first else 1) for s in syms}
    n = point["numel"]
    if len(out_shape) <= 1:
        return {s: n if s in out_shape or not out_shape else 1 for s in syms}
    last = out_shape[-1]
    return {s: 4096 if s == last else (n // 4096 if s == out_shape[0] else 1) for s in syms}


def has_lists(kir: KernelIR) -> bool:
    """Whether a kernel takes lists of tensors (a grouped GEMM): then --shape groups=N says how many."""
    return any(p.is_list for p in kir.params)


def known_names(kernels: list[KernelIR]) -> set[str]:
    """The --shape names some kernel of a file takes: its dimensions, and groups= where one has lists."""
    return {s for kir in kernels for s in symbols(kir)} | ({GROUPS} if any(map(has_lists, kernels)) else set())


def _groups_hint(unknown: list[str]) -> str:
    return f"; {GROUPS}= sets the number of problems of a kernel with list parameters" if GROUPS in unknown else ""


def make_inputs(kir: KernelIR, sizes: dict[str, int], device, dtype: D.DType | None, seed: int = 0) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    args = {}
    for p in kir.params:
        if p.is_scalar:
            args[p.name] = p.default if p.default is not None else (0.5, 3, True)[2 - p.dtype.category]
            continue
        shape = tuple(d if isinstance(d, int) else sizes[d] for d in p.shape)
        want = dtype if dtype is not None and p.dtype.is_float else p.dtype
        made = [_random(shape, want, gen, device) for _ in range(sizes.get("groups", 4) if p.is_list else 1)]
        args[p.name] = made if p.is_list else made[0]   # a list parameter: one tensor per problem
    return args


def _random(shape, want: D.DType, gen, device) -> torch.Tensor:
    if want.is_float:
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
    elif want is D.BOOL:
        t = torch.rand(shape, generator=gen) > 0.5
    else:
        t = torch.randint(-8, 8, shape, generator=gen, dtype=torch.int32)
    return t.to(device=device, dtype=want.torch)


def retyped(text: str, dtype: D.DType | None, path: str = "<string>") -> str:
    """The spec with the floating dtype of every tensor parameter and output replaced by
    ``dtype`` (for --dtype); scalar parameters (``eps: f32``), comments and bodies keep theirs."""
    if dtype is None:
        return text
    from .parse import parse
    spans = [p.type.dtype.span for k in parse(text, path).kernels for p in (*k.params, *k.outputs)
             if p.type is not None and (p.type.shape is not None or p in k.outputs)
             and D.BY_NAME.get(p.type.dtype.id, D.I32).is_float]
    lines = text.split("\n")
    for span in sorted(spans, key=lambda s: (s.line, s.col), reverse=True):   # a line's later ones first
        line = lines[span.line - 1]
        lines[span.line - 1] = line[:span.col - 1] + dtype.name + line[span.end_col - 1:]
    return "\n".join(lines)


def _dtype_arg(name: str | None) -> D.DType | None:
    if name is None:
        return None
    if name not in D.BY_NAME or not D.BY_NAME[name].is_float:
        raise KgenError(f"--dtype: expected f16, bf16 or f32, got {name!r}")
    return D.BY_NAME[name]


def _single_kernel(path: Path, dtype: D.DType | None):
    from .runtime import read_spec
    return _compiled_kernels(*read_spec(path), dtype)


def _compiled_kernels(text: str, shown: str, dtype: D.DType | None) -> list:
    """The kernels of a spec's text (as retyped by --dtype), compiled and loaded."""
    from .runtime import Kernel, Kernels, compile_text
    compiled = compile_text(retyped(text, dtype, shown), shown)
    if isinstance(compiled, Kernels):
        return list(dict.values(compiled))
    if not isinstance(compiled, Kernel):
        raise KgenError(f"{shown}: run and bench need a spec with a kernel header (types and shapes)")
    return [compiled]


def _checked_kernels(text: str, shown: str, dtype: D.DType | None) -> list[KernelIR]:
    """The kernels of a spec's text, checked and generated but not loaded (nothing touches a device),
    with ``_compiled_kernels``'s errors."""
    from .parse import parse
    from .pipeline import generate
    text = retyped(text, dtype, shown)
    module = parse(text, shown)
    if not module.kernels:   # schedules alone: an error at the first one's kernel name
        generate(text, shown)
    if module.kernels[0].headerless:
        raise KgenError(f"{shown}: run and bench need a spec with a kernel header (types and shapes)")
    return list(generate(text, shown).kernels)


def _outputs_tuple(result):
    return result if isinstance(result, tuple) else (result,)   # a grouped kernel's output is a list


def _problem_shapes(outputs: list, shown: int = 8) -> str:
    """``[(16, 16), (16, 16)]``; of more problems than ``shown``, the first few and how many more
    (``groups`` may be 4096: one line, not 40 KB of it)."""
    shapes = [str(tuple(t.shape)) for t in outputs]
    if len(shapes) > shown:
        shapes = shapes[:shown - 1] + [f"... {len(shapes) - shown + 1} more"]
    return f"[{', '.join(shapes)}]"


def run_once(args) -> int:
    """``kgen run``: random inputs, the kernel, the reference, the max error and the inf/NaN
    mismatches (a KgenError where there are any)."""
    from .runtime import use_interpreter_if_no_gpu
    dtype = _dtype_arg(args.dtype)
    if not 0 <= args.seed < SEED_RANGE:
        raise KgenError(f"--seed: expected an integer from 0 to 2**64 - 1 (as torch.manual_seed takes it), "
                        f"got {args.seed}")
    if len(args.shape) > 1:   # bench takes several points; one run checks one
        raise KgenError(f"--shape: kgen run takes one point (--shape M=64,N=128), got {len(args.shape)}: "
                        f"{' '.join(args.shape)} (kgen bench times several)")
    point = parse_shape(args.shape[0]) if args.shape else {}
    kernels = _single_kernel(args.path, dtype)     # a bad path is said before the interpreter's notice
    interpreted = use_interpreter_if_no_gpu()
    device = "cpu" if interpreted else "cuda"
    known = known_names([kernel.ir for kernel in kernels])
    sized = [(kernel, sizes_for(kernel.ir, point, known=known)) for kernel in kernels]   # every name checked first
    mismatched = []
    for kernel, sizes in sized:
        mismatched += _run_kernel(kernel, sizes, device, interpreted, args.seed)
    if mismatched:
        raise KgenError(f"inf/NaN mismatches against the reference in {', '.join(mismatched)}: an inf or NaN "
                        f"where the reference has another value, or a number where it has inf or NaN")
    return 0


def _run_kernel(kernel, sizes: dict[str, int], device: str, interpreted: bool, seed: int) -> list[str]:
    """One kernel of ``kgen run``: its outputs' errors printed; the outputs with inf/NaN mismatches returned."""
    shape_text = _shape_text(sizes)
    if interpreted and _bf16_matmul(kernel.ir):   # the kernel refuses it too, but only once it is called
        raise KgenError(f"{kernel.name}: bf16 matmuls need a CUDA device; Triton's interpreter cannot compute them")
    inputs = _allocating(f"make inputs of {shape_text}", make_inputs, kernel.ir, sizes, device, None, seed)
    ordered = [inputs[n] for n in kernel.inputs]
    start = time.perf_counter()
    got = _outputs_tuple(_allocating(f"make outputs of {shape_text}", kernel, *ordered))
    if not interpreted:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    want = _allocating(f"evaluate the reference of {shape_text}", evaluate, kernel.ir, inputs)
    print(f"{kernel.name} ({kernel.pattern}) on {'the interpreter' if interpreted else torch.cuda.get_device_name()}"
          f" with {shape_text or 'the sizes it declares'}:")
    mismatched = []
    for name, g, w in zip(kernel.outputs, got, want):
        shown = f"{g.dtype} {tuple(g.shape)}" if not isinstance(g, list) else \
            f"{len(g)} x {g[0].dtype if g else ''} {_problem_shapes(g)}"
        max_err, wrong = compare(g, w)
        print(f"  {name}: {shown}  max abs error {max_err:.3g}" + (f", {wrong} inf/NaN mismatch(es)" if wrong else ""))
        if wrong:
            mismatched.append(f"{kernel.name}.{name} ({wrong})")
    if interpreted:
        print(f"  time: {elapsed * 1e3:.1f} ms (first call, interpreter)")
    else:
        from triton.testing import do_bench
        ms = do_bench(lambda: kernel(*ordered), warmup=25, rep=100, return_mode="median")
        print(f"  time: {ms * 1e3:.1f} us")
    return mismatched


def _bf16_matmul(kir: KernelIR) -> bool:
    return any(node.op is Op.MATMUL and D.BF16 in (i.dtype for i in node.inputs)
               for node in topo_order(s.node for s in kir.outputs))


def _shape_text(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def _allocating(what: str, fn, *args):
    """``fn(*args)``, where the sizes came from --shape: torch's "can't allocate memory" (or a
    size past what it can count, or CUDA out of memory) is a KgenError saying what could not be
    made.  Launch failures are KgenErrors already: a RuntimeError here comes from torch."""
    try:
        return fn(*args)
    except (RuntimeError, MemoryError) as e:
        line = (str(e).splitlines() or [type(e).__name__])[0]
        raise KgenError(f"cannot {what}: {line if len(line) <= 300 else line[:300] + '...'}") from None


def _bytes(tensors) -> int:
    tensors = [t for x in tensors for t in (x if isinstance(x, list) else [x])]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _flops(kir: KernelIR, inputs: dict) -> int:
    total = 0
    for node in topo_order(o.node for o in kir.outputs):
        if node.op is Op.MATMUL:
            a, b = node.inputs
            m_k = [_concrete(d, inputs, kir) for d in a.shape]
            n = _concrete(b.shape[-1], inputs, kir)
            batch = math.prod(_concrete(d, inputs, kir) for d in node.shape[:-2])
            total += 2 * batch * m_k[-2] * m_k[-1] * n
    groups = [len(v) for v in inputs.values() if isinstance(v, list)]
    return total * (groups[0] if groups else 1)   # a grouped kernel's problems are alike here


def _concrete(d, inputs, kir: KernelIR) -> int:
    if isinstance(d, int):
        return d
    for p in kir.params:
        if p.shape and d in p.shape:
            x = inputs[p.name]
            return (x[0] if isinstance(x, list) else x).shape[p.shape.index(d)]
    raise KeyError(d)


def bench(args) -> int:
    spec = _checked_bench_args(args)    # every argument, before the GPU is asked for
    if not torch.cuda.is_available():
        raise KgenError("kgen bench needs a CUDA GPU (use kgen run to check results on the interpreter)")
    time_it = _graph_time if args.graph else _kernel_time if args.kernel_time else _call_time
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}"
          + (", GPU time per call replayed from CUDA graphs" if args.graph else "")
          + (", kernel time per call from CUPTI, L2 flushed" if args.kernel_time else ""))
    if spec is None:
        from .suites import run
        table = run(args.suite, args.rounds, time_it)
        if args.json:
            _write_rows(args.json, table)
        return 0
    text, shown, dtype, shape_points = spec
    kernels = _compiled_kernels(text, shown, dtype)
    rows: list[Row] = []
    known = known_names([kernel.ir for kernel in kernels])
    for kernel in kernels:
        sweep = not shape_points
        points = shape_points or SWEEPS.get(kernel.pattern, [{}])
        eager = _baseline(kernel.ir)
        compiled = None if args.no_compile else _compiled(eager)
        timed_sizes = []
        for point in points:
            sizes = sizes_for(kernel.ir, point, sweep, known)
            if "groups" in point:
                sizes["groups"] = point["groups"]
            if sizes in timed_sizes:   # a sweep over a kernel of fixed sizes: timed once
                continue
            timed_sizes.append(sizes)
            shape_text = _shape_text(sizes)
            inputs = _allocating(f"make inputs of {shape_text}", make_inputs, kernel.ir, sizes, "cuda", None)
            ordered = [inputs[n] for n in kernel.inputs]
            outs = _outputs_tuple(_allocating(f"make outputs of {shape_text}", kernel, *ordered))
            _allocating(f"run the eager baseline on {shape_text}", eager, *ordered)
            flops = _flops(kernel.ir, inputs)
            moved = _bytes(inputs.values()) + _bytes(outs)
            timed = {"kgen": lambda args=ordered: kernel(*args), "eager": lambda args=ordered: eager(*args)}
            if compiled is not None:
                try:
                    compiled(*ordered)
                    timed["compile"] = lambda args=ordered: compiled(*args)
                except Exception as e:  # a baseline that fails to compile is reported, not fatal
                    print(f"  torch.compile failed: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr)
            times = interleaved(timed, args.rounds, time_it)
            t_kgen, t_eager, t_comp = times["kgen"], times["eager"], times.get("compile")
            unit, work = ("TFLOP/s", flops / 1e12) if flops else ("GB/s", moved / 1e9)
            rate = lambda us: work / (us * 1e-6) if us else None  # noqa: E731
            label = ",".join(f"{k}={v}" for k, v in sizes.items())
            rows.append(Row(kernel.name, label, str(kernel.ir.params[0].dtype) if kernel.ir.params else "",
                            t_kgen, t_eager, t_comp, unit, rate(t_kgen), rate(t_eager), rate(t_comp)))
            _print_row(rows[-1])
            del inputs, ordered, outs
            torch.cuda.empty_cache()
        dispatch = _dispatch_cost(kernel)
        if dispatch:
            print(f"  dispatch on 1-element inputs: Kernel {dispatch[0]:.2f} us, host function {dispatch[1]:.2f} us, "
                  f"ratio {dispatch[0] / dispatch[1]:.3f}")
    if args.json:   # before the plot: a plot that fails keeps the rows
        _write_rows(args.json, [{**asdict(r), "vs_eager": r.vs_eager, "vs_compile": r.vs_compile} for r in rows])
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _checked_bench_args(args) -> tuple[str, str, D.DType | None, list[dict]] | None:
    """What ``kgen bench`` would otherwise find wrong only after timing, or on a machine without a
    GPU: the options, where --json and --plot write, the spec and --shape's names.  The spec's
    (text, path, --dtype, --shape points), or None for --suite."""
    from .runtime import read_spec
    if args.rounds < 1:
        raise KgenError(f"--rounds: expected at least 1 round, got {args.rounds}")
    _check_destination(args.json, "--json")
    _check_destination(args.plot, "--plot")
    _check_not_overwritten(args)
    if args.suite is not None:
        _check_suite_options(args)
        return None
    if args.plot is not None:
        _check_image_name(args.plot)
    if args.path is None:
        raise KgenError("kgen bench: give a spec to time, or --suite NAME")
    dtype = _dtype_arg(args.dtype)
    points = [parse_shape(text) for text in args.shape]
    text, shown = read_spec(args.path)
    kernels = _checked_kernels(text, shown, dtype)
    known = known_names(kernels)
    for kir in kernels:
        for point in points:
            sizes_for(kir, point, known=known)
    return text, shown, dtype, points


def _check_suite_options(args) -> None:
    """A suite times its own specs, shapes and dtypes, against torch.compile but for the grouped
    suite, and draws no plot: an option it would ignore is refused rather than dropped."""
    suite = f"--suite {args.suite}"
    if args.path is not None:
        raise KgenError(f"kgen bench: give a spec ({args.path}) or {suite}, not both: a suite times the "
                        f"repository's specs")
    ignored = [("--shape", args.shape, "times its own shapes"), ("--dtype", args.dtype, "times its own dtypes"),
               ("--plot", args.plot, "draws no plot (--json writes its rows)"),
               ("--no-compile", args.no_compile, "times no torch.compile baseline" if args.suite == "grouped"
                else "always times torch.compile")]
    for option, given, why in ignored:
        if given:
            raise KgenError(f"{option}: {suite} {why}; it takes no {option}")


def _check_not_overwritten(args) -> None:
    """--json and --plot never replace the spec being timed or any spec (a slip such as ``--json
    specs/softmax.k`` would lose it at the run's end), nor each other."""
    if args.json is not None and args.plot is not None and _same_file(args.json, args.plot):
        raise KgenError(f"--plot: {args.plot} is --json's file too; give each its own")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is None:
            continue
        if path.suffix == ".k" or args.path is not None and _same_file(path, args.path):
            raise KgenError(f"{option}: {path} is a spec; expected a new file for the "
                            f"{'rows' if option == '--json' else 'plot'}")


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (a link or another spelling of it included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:   # one is not there yet: the same file by name, its folder's links followed
        return os.path.realpath(a) == os.path.realpath(b)


def _check_destination(path: Path | None, option: str) -> None:
    """Refuse, before any timing, a file that could not be written at the end: a name the file
    system does not take, a folder or FIFO in its place, or a folder that is missing or read-only."""
    if path is None:
        return
    check_name(path, option)
    kind = existing_kind(path)
    if kind not in (None, "a regular file"):
        raise KgenError(f"{option}: {display_path(path)} is {kind}; expected a file to write")
    folder = path.parent
    folder_kind = existing_kind(folder)
    if folder_kind != "a folder":
        raise KgenError(f"{option}: {display_path(folder)} is {folder_kind or 'missing'}; expected the folder "
                        f"to write {path.name} into")
    try:   # as the write will: a temporary file beside the target (access() says yes to root on a read-only mount)
        fd, probe = new_temp(os.path.realpath(folder), ".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise KgenError(f"{option}: cannot write into {display_path(folder)} ({e.strerror or e})") from None


# The formats matplotlib 3 writes (FigureCanvasBase.get_supported_filetypes()): --plot's name is
# checked against them where matplotlib is missing, so that its error names the file first.
IMAGE_FORMATS = frozenset({"avif", "eps", "gif", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg",
                           "svgz", "tif", "tiff", "webp"})


def _check_image_name(path: Path) -> None:
    """--plot's file ends in an image format matplotlib writes, and matplotlib is there."""
    formats = _image_formats()
    if path.suffix[1:].lower() not in (formats or IMAGE_FORMATS):
        raise KgenError(f"--plot: {path.name}: expected a name ending in an image format matplotlib writes "
                        f"({', '.join('.' + f for f in sorted(formats or IMAGE_FORMATS))}), "
                        f"got {path.suffix or 'no suffix'}")
    if formats is None:
        raise KgenError("--plot needs matplotlib (pip install matplotlib)")


def _image_formats() -> set[str] | None:
    """The formats the installed matplotlib writes; None without matplotlib."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return None
    return set(FigureCanvasBase.get_supported_filetypes())


def _write_rows(path: Path, rows: list) -> None:
    """The rows as JSON, whole or not at all; a failed write is a KgenError (the rows were printed)."""
    from .runtime import write_atomic
    try:
        write_atomic(path, json.dumps(rows, indent=1) + "\n")
    except OSError as e:
        raise KgenError(f"--json: cannot write {display_path(path)}: {e.strerror or e} (the rows are printed above)")


def _call_time(fn) -> float:
    """Microseconds per call, as triton.testing.do_bench times them: calls back to back with
    L2 flushed in between, so the host's time per call when it is the longer."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def _graph_time(fn) -> float:
    """Microseconds of GPU work per call: calls captured in a CUDA graph and replayed, as a
    model run under CUDA graphs calls them (no host time, no L2 flush).  A call that cannot
    be captured is timed as _call_time does, and says so."""
    from triton.testing import do_bench_cudagraph
    try:
        return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    except Exception as e:
        print(f"  not capturable in a CUDA graph ({type(e).__name__}): timed call by call", file=sys.stderr)
        return _call_time(fn)


def _kernel_time(fn, calls: int = 40) -> float:
    """Microseconds per call that the call's kernels run, from their start and end as CUPTI
    records them (torch.profiler): L2 flushed before each call as do_bench flushes it, the
    flush's own kernels left out, and neither the host's time nor the gaps between a call's
    kernels counted.  A call that launches no kernel is timed as _call_time does, and says so."""
    spans = _kernel_spans(fn, calls)
    if not spans:
        print("  no kernel recorded: timed call by call", file=sys.stderr)
        return _call_time(fn)
    return sum(us for _, us in spans) / calls


def _kernel_spans(fn, calls: int) -> list[tuple[str, float]]:
    """(name, microseconds) of each kernel that ``calls`` calls of ``fn`` ran, each call after an
    L2 flush whose kernels are left out."""
    from torch.profiler import ProfilerActivity, profile
    from triton.runtime import driver
    cache = driver.active.get_empty_cache_for_benchmark()

    def kernels(call) -> list:
        with warnings.catch_warnings():   # torch.profiler's note that each session starts afresh
            warnings.simplefilter("ignore", UserWarning)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    driver.active.clear_cache(cache)
                    call()
                torch.cuda.synchronize()
            return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    fn()
    torch.cuda.synchronize()
    # the flush's kernels, by name and their shortest time: a kernel of fn's with the same name
    # (a split row's flags zeroed by torch.zeros is torch's int fill, as the flush is) is fn's
    # where it is much shorter (kilobytes, where the flush writes the whole L2's worth)
    flush: dict[str, float] = {}
    for e in kernels(lambda: None):
        flush[e.name] = min(flush.get(e.name, math.inf), e.time_range.elapsed_us())
    return [(e.name, e.time_range.elapsed_us()) for e in kernels(fn)
            if e.time_range.elapsed_us() < flush.get(e.name, math.inf) / 2]


def interleaved(fns: dict, rounds: int, time_it) -> dict[str, float]:
    """Each function's median time over ``rounds`` rounds that time every function once in
    turn: a clock or temperature drift during the run moves all of them alike instead of
    favouring whichever ran first."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            times[name].append(time_it(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def _baseline(kir: KernelIR):
    names = [p.name for p in kir.params]

    def eager(*values):
        return evaluate(kir, dict(zip(names, values)), exact=False)
    return eager


def _compiled(fn):
    try:
        return torch.compile(fn)
    except Exception as e:
        print(f"torch.compile unavailable: {e}", file=sys.stderr)
        return None


def _dispatch_cost(kernel) -> tuple[float, float] | None:
    """CPU cost per call of ``Kernel.__call__`` and of the generated host function."""
    ir = kernel.ir
    inputs = make_inputs(ir, {s: 1 for s in symbols(ir)}, "cuda", None)
    ordered = [inputs[n] for n in kernel.inputs]
    host = getattr(kernel.module, ir.name)

    def per_call(fn, calls=2000):
        best = math.inf
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn(*ordered)
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
        return best
    per_call(host, 200)
    return per_call(kernel), per_call(host)


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def _print_row(r: Row) -> None:
    print(f"{r.kernel:>20} {r.point:>28} {r.dtype:>5}  kgen {r.kgen_us:9.1f} us {_fmt(r.kgen_rate):>8} {r.unit}"
          f" | eager {_fmt(r.eager_rate):>8} (x{_fmt(r.vs_eager, '.2f')})"
          f" | compile {_fmt(r.compile_rate):>8} (x{_fmt(r.vs_compile, '.2f')})", flush=True)


def _plot(rows: list[Row], path: Path) -> None:
    """A bar chart of the rows' rates, written whole (a temporary file renamed) or not at all."""
    _image_formats()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.2), 4))
    x = range(len(rows))
    for offset, (label, key) in enumerate((("kgen", "kgen_rate"), ("torch eager", "eager_rate"),
                                            ("torch.compile", "compile_rate"))):
        ax.bar([i + (offset - 1) * 0.27 for i in x], [getattr(r, key) or 0 for r in rows], width=0.27, label=label)
    units = list(dict.fromkeys(r.unit for r in rows))   # a file's GEMMs and row kernels: both, each bar says which
    ax.set_xticks(list(x), [f"{r.kernel}\n{r.point}" + (f"\n{r.unit}" if len(units) > 1 else "") for r in rows],
                  fontsize=7)
    ax.set_ylabel(" or ".join(units))
    ax.legend()
    fig.tight_layout()
    tmp = None
    try:
        folder = os.path.realpath(path.parent)   # as write_atomic takes it
        fd, tmp = new_temp(folder, path.suffix)
        os.close(fd)
        fig.savefig(tmp, dpi=120, format=path.suffix[1:].lower())
        os.replace(tmp, os.path.join(folder, path.name))
    except Exception as e:   # a format's writer missing (pgf needs LaTeX), a full disk
        raise KgenError(f"--plot: cannot write {display_path(path)}: {e}") from None
    finally:
        plt.close(fig)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
