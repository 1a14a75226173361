"""``kgen build | show | run | bench``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import KgenError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kgen", description="Write fast Triton kernels from a few lines of math.")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="generate <out>/<stem>.py from .k files or folders")
    b.add_argument("paths", nargs="+", type=Path)
    b.add_argument("-o", "--out", type=Path, default=Path("generated"), help="output folder (default: generated)")
    b.add_argument("--check", action="store_true", help="write nothing; fail if a generated file is stale or missing")

    s = sub.add_parser("show", help="print a stage of the pipeline")
    s.add_argument("path", type=Path)
    s.add_argument("--emit", choices=("ast", "ir", "triton"), default="triton")

    r = sub.add_parser("run", help="run on random data and compare with the float64 reference")
    r.add_argument("path", type=Path)
    r.add_argument("--shape", default="", help="sizes of symbolic dims, e.g. M=64,N=128")
    r.add_argument("--dtype", default=None, help="override every floating input's dtype (f16, bf16, f32)")
    r.add_argument("--seed", type=int, default=0)

    n = sub.add_parser("bench", help="time against torch eager and torch.compile on the GPU")
    n.add_argument("path", type=Path)
    n.add_argument("--shape", action="append", default=[], help="a point to time, e.g. M=4096,N=1024 (repeatable)")
    n.add_argument("--dtype", default=None)
    n.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    n.add_argument("--plot", type=Path, default=None, help="draw the rows (needs matplotlib)")
    n.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")

    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KgenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def spec_files(paths: list[Path]) -> list[Path]:
    files = []
    for p in paths:
        if p.is_dir():
            files += sorted(p.rglob("*.k"))
        elif p.is_file():
            files.append(p)
        else:
            raise KgenError(f"{p}: no such file or folder")
    return files


def cmd_build(args) -> int:
    from .pipeline import generate
    from .runtime import display_path, read_spec, write_atomic

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
    if failed:
        print(f"{failed} spec(s) failed; nothing was written", file=sys.stderr)
        return 1
    stale = 0
    for f, gen in results:
        target = args.out / (f.stem + ".py")
        patterns = ", ".join(f"{k.name}: {p.pattern}" for k, p in zip(gen.kernels, gen.plans))
        if args.check:
            try:
                current = target.read_text(encoding="utf-8")
            except OSError:
                current = None
            if current != gen.source:
                print(f"{display_path(target)}: {'missing' if current is None else 'stale'} "
                      f"(run kgen build {display_path(f)})")
                stale += 1
        else:
            write_atomic(target, gen.source)
            print(f"wrote {display_path(target)} ({patterns})")
    if args.check:
        if stale:
            return 1
        print(f"{len(results)} generated file(s) up to date")
    return 0


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
