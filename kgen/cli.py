"""``kgen build | show | run | bench``."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import KgenError

SUITE_NAMES = ("gemm", "grouped", "linear", "norms", "softmax")   # kgen/suites.py (imported on use: torch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kgen", description="Write fast Triton kernels from a few lines of math.")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="generate <out>/<stem>.py from .k files or folders")
    b.add_argument("paths", nargs="+", type=Path)
    b.add_argument("-o", "--out", type=Path, default=Path("generated"), help="output folder (default: generated)")
    b.add_argument("--check", action="store_true", help="write nothing; fail if a generated file is stale or missing")
    b.add_argument("--force", action="store_true", help="overwrite files that kgen did not generate")

    s = sub.add_parser("show", help="print a stage of the pipeline")
    s.add_argument("path", type=Path)
    s.add_argument("--emit", choices=("ast", "ir", "triton"), default="triton")

    r = sub.add_parser("run", help="run on random data and compare with the float64 reference")
    r.add_argument("path", type=Path)
    r.add_argument("--shape", default="", help="sizes of symbolic dims, e.g. M=64,N=128")
    r.add_argument("--dtype", default=None, help="override every floating input's dtype (f16, bf16, f32)")
    r.add_argument("--seed", type=int, default=0)

    n = sub.add_parser("bench", help="time against torch eager and torch.compile on the GPU")
    n.add_argument("path", type=Path, nargs="?", help="a spec (or give --suite)")
    n.add_argument("--suite", choices=SUITE_NAMES, default=None,
                   help="the repository's specs against PyTorch's library calls (README: Performance)")
    n.add_argument("--shape", action="append", default=[], help="a point to time, e.g. M=4096,N=1024 (repeatable)")
    n.add_argument("--dtype", default=None)
    n.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    n.add_argument("--plot", type=Path, default=None, help="draw the rows (needs matplotlib)")
    n.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    clock = n.add_mutually_exclusive_group()
    clock.add_argument("--graph", action="store_true",
                       help="time GPU work alone: every side's calls replayed from a CUDA graph (no host time)")
    clock.add_argument("--kernel-time", action="store_true",
                       help="time each side's kernels alone, as CUPTI records them (L2 flushed, no host time)")
    n.add_argument("--rounds", type=int, default=3, metavar="R",
                   help="time kgen and the baselines in turn R times; report each one's median (default 3)")

    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KgenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # each file is written whole or not at all; say which were, above
        print("error: interrupted", file=sys.stderr)
        return 130


def spec_files(paths: list[Path]) -> list[Path]:
    """The .k files named or under the folders named, in order, each once: a spec named twice
    (``specs specs/softmax.k``, ``./specs/softmax.k specs/../specs/softmax.k``) is built once."""
    files, seen = [], set()
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.k") if f.is_file())   # not a FIFO or a folder named x.k
        elif p.is_file():
            found = [p]
        else:
            raise KgenError(f"{p}: no such file or folder")
        for f in found:
            # the real file and the module it writes: a link of another name builds its own module
            key = (os.path.realpath(f), f.stem)
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files


def cmd_build(args) -> int:
    from .pipeline import generate
    from .runtime import display_path, read_spec
    from .targets import check_out_name, write_target

    check_out_name(args.out, "-o")
    files = spec_files(args.paths)
    if not files:
        raise KgenError(f"no .k files under {', '.join(map(str, args.paths))}")
    results, failed = [], 0
    for f in files:  # generate every file before writing any: a failure writes nothing
        text, shown = read_spec(f)
        try:
            results.append((f, generate(text, shown)))
        except KgenError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
    problems = _target_problems([f for f, _ in results], args.out, args.force, args.check)
    for why in problems:
        print(f"error: {why}", file=sys.stderr)
    if failed or problems:   # say which failed: the specs, the targets, or both
        said = [f"{failed} spec(s) failed"] if failed else []
        said += [f"{len(problems)} target(s) cannot be written"] if problems else []
        print(f"{' and '.join(said)}; nothing was written", file=sys.stderr)
        return 1
    stale = 0
    for f, gen in results:
        target = args.out / (f.stem + ".py")
        patterns = ", ".join(f"{k.name}: {p.pattern}" for k, p in zip(gen.kernels, gen.plans))
        if args.check:
            try:
                current = target.read_bytes().decode("utf-8", "replace")   # byte for byte: CRLF is stale
            except OSError:
                current = None
            if current != gen.source:
                print(f"{display_path(target)}: {'missing' if current is None else 'stale'} "
                      f"(run kgen build {display_path(f)})")
                stale += 1
        else:
            write_target(target, gen.source)
            print(f"wrote {display_path(target)} ({patterns})")
    if args.check:
        targets = {args.out / (f.stem + ".py") for f, _ in results}
        for module, spec in _orphans(args.out, [p for p in args.paths if p.is_dir()], targets):
            print(f"{display_path(module)}: orphaned ({spec} is gone: delete the module or restore the spec)")
            stale += 1
        if stale:
            return 1
        print(f"{len(results)} generated file(s) up to date")
    return 0


def _target_problems(specs: list[Path], out: Path, force: bool, check: bool) -> list[str]:
    """Why the modules of ``specs`` cannot be written into ``out``: two specs of one stem, and
    (unless only checking) what ``kgen.build`` refuses too (``write_problems``)."""
    from .runtime import display_path
    from .targets import write_problems

    problems: list[str] = []
    sources: dict[Path, Path] = {}
    for f in specs:   # two specs of one stem (a/k.k, b/k.k) would write one file
        target = out / (f.stem + ".py")
        if target in sources:
            problems.append(f"{display_path(sources[target])} and {display_path(f)} would both write "
                            f"{display_path(target)}; build them into separate folders (-o)")
        sources[target] = f
    return problems if check else problems + write_problems(out, list(sources), force, "use --force")


def _orphans(out: Path, folders: list[Path], targets: set[Path]) -> list[tuple[Path, str]]:
    """Modules in ``out`` that kgen generated from a spec under one of ``folders`` (the
    header names it) that no spec there builds any more: a deleted or renamed spec's
    module, which ``--check`` reports as stale.  Modules from specs elsewhere, and
    files kgen did not generate, are left alone."""
    from .targets import generated_from
    roots = tuple(os.path.join(os.path.abspath(f), "") for f in folders)
    found = []
    for module in sorted(out.glob("*.py")) if roots and out.is_dir() else []:
        try:
            spec = generated_from(module)
        except OSError:
            continue
        if spec and module not in targets and os.path.abspath(spec).startswith(roots):
            found.append((module, spec))
    return found


def cmd_show(args) -> int:
    from .check import check
    from .ir import format_ir
    from .parse import parse
    from .pipeline import generate
    from .runtime import read_spec

    text, shown = read_spec(args.path)
    if args.emit == "ast":
        import pprint
        module = parse(text, shown)
        for item in (*module.kernels, *module.schedules):
            print(pprint.pformat(item, width=110))
    elif args.emit == "ir":
        print("\n\n".join(format_ir(k) for k in check(parse(text, shown))))
    else:
        print(generate(text, shown).source, end="")
    return 0


def cmd_run(args) -> int:
    from .bench import run_once
    return run_once(args)


def cmd_bench(args) -> int:
    from .bench import bench
    return bench(args)


COMMANDS = {"build": cmd_build, "show": cmd_show, "run": cmd_run, "bench": cmd_bench}
