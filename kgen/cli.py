"""``kgen build | show | run | bench``."""
from __future__ import annotations

import argparse
import errno
import io
import os
import signal
import sys
from pathlib import Path

from .errors import KgenError, printable
from .files import NotRegularFile, abridged, display_path, existing_kind, file_kind, held_signals, read_regular

SUITE_NAMES = ("gemm", "grouped", "linear", "norms", "softmax")   # kgen/suites.py (imported on use: torch)
# what every command imports (seconds: torch and Triton), with Ctrl-C held (import_held)
HEAVY = ("torch", "triton", "kgen.runtime")
SIGPIPE_STATUS = 141    # 128 + SIGPIPE: what a shell reports for a writer whose reader went away
# the path arguments of each command and what each must name (checked before a command runs)
PATH_ARGUMENTS = {"paths": ("PATH", "a .k file or a folder"), "path": ("PATH", "a spec file"),
                  "out": ("-o", "a folder"), "json": ("--json", "a file to write"),
                  "plot": ("--plot", "an image to write")}


def main(argv: list[str] | None = None) -> int:
    if sys.stderr is None:   # started with fd 2 closed: print(file=None) would write errors to stdout
        sys.stderr = open(os.devnull, "w")
    stdout = _Stdout(sys.stdout)
    sys.stdout = stdout
    try:
        status = _main(argv)
    finally:
        stdout.flush()             # inside: a reader gone by now is still one we tell apart
        sys.stdout = stdout.stream
    if stdout.failed:
        print(f"error: cannot write to standard output ({stdout.failed})", file=sys.stderr)
        return status or 1
    return SIGPIPE_STATUS if stdout.reader_gone and status == 0 else status


def _main(argv: list[str] | None) -> int:
    try:
        args = _parser().parse_args(argv)
        _paths(args)
        import_held(HEAVY)
        return COMMANDS[args.command](args)
    except KgenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # each file is written whole or not at all; say which were, above
        print("error: interrupted", file=sys.stderr)
        return 130


def import_held(modules: tuple[str, ...]) -> None:
    """Import ``modules`` with Ctrl-C held until they are in.  A KeyboardInterrupt inside torch's
    import can leave it half-loaded (numpy then refuses a second load, or C++ aborts); held (its
    handler only notes it), it comes after the import, as the command's own "error: interrupted"."""
    import importlib
    with held_signals(signal.SIGINT):
        for name in modules:
            importlib.import_module(name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kgen", description="Write fast Triton kernels from a few lines of math.")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="generate <out>/<stem>.py from .k files or folders")
    b.add_argument("paths", nargs="+")
    b.add_argument("-o", "--out", default="generated", help="output folder (default: generated)")
    b.add_argument("--check", action="store_true",
                   help="write nothing; fail if a generated file is stale, missing or orphaned")
    b.add_argument("--force", action="store_true", help="overwrite files that kgen did not generate")

    s = sub.add_parser("show", help="print a stage of the pipeline")
    s.add_argument("path")
    s.add_argument("--emit", choices=("ast", "ir", "triton"), default="triton",
                   help="the syntax tree, the typed IR or the Triton source (default: triton)")

    r = sub.add_parser("run", help="run on random data and compare with the float64 reference")
    r.add_argument("path")
    r.add_argument("--shape", action="append", default=[],
                   help="sizes of symbolic dims, e.g. M=64,N=128 (once: run takes one point)")
    r.add_argument("--dtype", default=None,
                   help="the dtype (f16, bf16, f32) of every floating tensor parameter and output")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs, 0 to 2**64 - 1 (default 0)")

    n = sub.add_parser("bench", help="time against torch eager and torch.compile on the GPU")
    n.add_argument("path", nargs="?", help="a spec (or give --suite)")
    n.add_argument("--suite", choices=SUITE_NAMES, default=None,
                   help="the repository's specs against PyTorch's library calls (README: Performance)")
    n.add_argument("--shape", action="append", default=[], help="a point to time, e.g. M=4096,N=1024 (repeatable)")
    n.add_argument("--dtype", default=None,
                   help="the dtype (f16, bf16, f32) of every floating tensor parameter and output")
    n.add_argument("--json", default=None, help="write the rows as JSON")
    n.add_argument("--plot", default=None, help="draw the rows into an image (.png, .svg, .pdf, ...; needs matplotlib)")
    n.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    clock = n.add_mutually_exclusive_group()
    clock.add_argument("--graph", action="store_true",
                       help="time GPU work alone: every side's calls replayed from a CUDA graph (no host time)")
    clock.add_argument("--kernel-time", action="store_true",
                       help="time each side's kernels alone, as CUPTI records them (L2 flushed, no host time)")
    n.add_argument("--rounds", type=int, default=3, metavar="R",
                   help="time kgen and the baselines in turn R times; report each one's median (default 3)")
    return parser


def _paths(args) -> None:
    """The path arguments as Paths, an empty one refused: ``Path("")`` is the working folder, so
    ``kgen build ""`` would build every spec under it, and ``-o ""`` write there."""
    for name, (option, expected) in PATH_ARGUMENTS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        if any(v == "" for v in values):
            raise KgenError(f"kgen {args.command}: {option}: expected the path of {expected}, got an empty string")
        setattr(args, name, [Path(v) for v in values] if isinstance(value, list) else Path(value))


class _Stdout:
    """``sys.stdout`` while a command runs.  Once the reader of a pipe has gone (``kgen show x.k |
    head -1``), output is dropped instead of raising BrokenPipeError in the middle of the work
    (a build goes on writing whole files), and ``main`` exits with a shell's status for it.
    Output that cannot be written otherwise (stdout closed, a full disk: ``failed``) is dropped
    the same way, and ``main`` says why and exits 1; a character the stream's encoding lacks (a
    file name's undecodable byte) is printed as its escape."""

    def __init__(self, stream):
        self.stream = stream
        self.reader_gone = False
        self.failed: str | None = None

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                try:
                    return self.stream.write(text)
                except UnicodeEncodeError:
                    encoding = getattr(self.stream, "encoding", None) or "utf-8"
                    return self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
            except BrokenPipeError:
                self._gone()
            except (OSError, ValueError, AttributeError) as e:   # closed (None: no descriptor 1 at all)
                self._fail(e)
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._gone()
            except (OSError, ValueError, AttributeError) as e:
                self._fail(e)

    def _fail(self, error: Exception) -> None:
        self.failed = "it is closed" if self.stream is None else getattr(error, "strerror", None) or str(error)
        self._gone()

    def _gone(self) -> None:
        self.reader_gone = True
        try:   # what is still buffered is flushed at exit: into /dev/null, not the closed pipe
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass   # a stream without a descriptor (a test's capture): nothing to flush at exit

    def __getattr__(self, name):
        return getattr(self.stream, name)


def spec_files(paths: list[Path]) -> list[Path]:
    """The .k files named or under the folders named, in order, each once: a spec named twice
    (``specs specs/softmax.k``, ``./specs/softmax.k specs/../specs/softmax.k``) is built once."""
    files, seen = [], set()
    for p in paths:
        if _named_kind(p) == "a folder":
            found = _specs_under(p)
        else:
            found = [p]
        for f in found:
            # the real file and the module it writes: a link of another name builds its own module
            key = (os.path.realpath(f), f.stem)
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files


def _specs_under(folder: Path) -> list[Path]:
    """The .k files under ``folder``, sorted (regular files: not a FIFO or a folder named x.k;
    linked folders not followed).  A folder that cannot be read is an error, not a gap: --check
    would call its specs' modules orphaned, and a build would leave them behind."""
    def refuse(e: OSError):
        raise KgenError(f"{abridged(display_path(Path(e.filename)))}: cannot read the folder ({e.strerror or e})")
    found = []
    for root, _, names in os.walk(folder, onerror=refuse):
        found += [Path(root) / name for name in names if name.endswith(".k")]
    return sorted(f for f in found if os.path.isfile(f))


def _named_kind(path: Path) -> str:
    """What a path named on the command line is: a folder or a regular file, else a KgenError
    saying what it is instead (a FIFO would block the read), or why it cannot be looked at."""
    try:
        kind = file_kind(os.stat(path).st_mode)
    except FileNotFoundError:
        raise KgenError(f"{display_path(path)}: no such file or folder") from None
    except OSError as e:   # a name too long, a folder above it that cannot be searched
        raise KgenError(f"{abridged(display_path(path))}: cannot look at it ({e.strerror or e})") from None
    if kind not in ("a folder", "a regular file"):
        raise KgenError(f"{display_path(path)}: expected a .k file or a folder, got {kind}")
    return kind


def cmd_build(args) -> int:
    from .pipeline import generate
    from .render import comment_safe
    from .runtime import read_spec
    from .targets import check_out_name, write_target

    check_out_name(args.out, "-o")
    files = spec_files(args.paths)
    if not files and args.check and _orphans(args.out, [p for p in args.paths if os.path.isdir(p)], set()):
        return _check(args, [])   # a folder's last spec deleted: its module is still an orphan
    if not files:
        raise KgenError(f"no .k files under {', '.join(printable(display_path(p)) for p in args.paths)}")
    results, failed = [], 0
    for f in files:  # generate every file before writing any: a failure writes nothing
        try:
            text, shown = read_spec(f)   # (one that cannot be read or decoded is a spec that failed)
            results.append((f, generate(text, shown, out=str(args.out))))
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
    if args.check:
        return _check(args, results)
    for f, gen in results:
        target = args.out / (f.stem + ".py")
        previous = _built_from(target)
        write_target(target, gen.source)
        patterns = ", ".join(f"{k.name}: {p.pattern}" for k, p in zip(gen.kernels, gen.plans))
        # a module of another spec of that name (a/x.k, then b/x.k) is replaced, as a moved spec's is: say so
        ours = previous in (None, comment_safe(display_path(f)))
        replaced = "" if ours else f"; it replaced the module of {previous}"
        print(f"wrote {_shown(target)} ({patterns}{replaced})")
    return 0


def _built_from(module: Path) -> str | None:
    """The spec path the header of a module kgen generated names (as the header prints it), else None."""
    from .targets import generated_from
    try:
        return generated_from(module)
    except (OSError, KgenError):
        return None


def _check(args, results: list) -> int:
    """``kgen build --check``: each stale, missing or orphaned module named, and the command that
    regenerates them last; nothing written."""
    from .targets import not_ours
    stale, foreign = 0, False
    for f, gen in results:
        target = args.out / (f.stem + ".py")
        why = _freshness(target, gen.source)
        # a file the build replaces only when forced (a FIFO or a device: never)
        if why and existing_kind(target) in (None, "a regular file") and not_ours(target):
            foreign = True
            if why == "stale":
                why = "stale (not generated by kgen: the build replaces it with --force)"
        if why:
            print(f"{_shown(target)}: {why}")
            stale += 1
    targets = {args.out / (f.stem + ".py") for f, _ in results}
    orphans = _orphans(args.out, [p for p in args.paths if os.path.isdir(p)], targets)
    for module, spec in orphans:
        print(f"{_shown(module)}: orphaned ({spec} is gone: delete the module or restore the spec)")
    if stale:
        command = " ".join(["kgen build", *map(_shell_path, args.paths), "-o", _shell_path(args.out)]
                           + ["--force"] * foreign)
        print(f"{stale} generated file(s) out of date; run: {command}")
    if stale or orphans:
        return 1
    print(f"{len(results)} generated file(s) up to date")
    return 0


def _freshness(target: Path, source: str) -> str | None:
    """None where ``target`` holds ``source`` byte for byte (a CRLF copy is stale), else why not."""
    try:
        current = read_regular(target, "a module", limit=len(source.encode("utf-8")) + 1)
    except FileNotFoundError:
        return "missing"
    except NotRegularFile:   # a FIFO would block the read: never opened for more than a look
        return f"stale ({existing_kind(target) or 'not a file'}, not a module)"
    except OSError as e:   # (a folder that cannot be searched hides whether it is there)
        return "missing" if e.errno == errno.ENOENT else f"stale (cannot read it: {e.strerror or e})"
    return None if current == source.encode("utf-8") else "stale"


def _shown(path: Path) -> str:
    """A path as a line of output names it: control characters (a newline in a file name, a
    terminal's escape) as Python escapes them."""
    return printable(display_path(path))


def _shell_path(path: Path) -> str:
    """A path as a shell command line takes it back: relative where it can be, quoted, and never
    read as an option."""
    from .render import shell_word
    return shell_word(display_path(path))


def _target_problems(specs: list[Path], out: Path, force: bool, check: bool) -> list[str]:
    """Why the modules of ``specs`` cannot be written into ``out``: two specs of one stem, and
    what ``kgen.build`` refuses too (``write_problems``).  ``--check`` calls a file kgen did not
    generate stale (the build replaces it with ``--force``); what no build replaces (a folder, a
    FIFO, a spec being built) is an error there too."""
    from .targets import write_problems

    problems: list[str] = []
    sources: dict[Path, Path] = {}
    for f in specs:   # two specs of one stem (a/k.k, b/k.k) would write one file
        target = out / (f.stem + ".py")
        if target in sources:
            problems.append(f"{display_path(sources[target])} and {display_path(f)} would both write "
                            f"{display_path(target)}; build them into separate folders (-o)")
        sources[target] = f
    return problems + write_problems(out, list(sources), force or check, "use --force", specs)


def _orphans(out: Path, folders: list[Path], targets: set[Path]) -> list[tuple[Path, str]]:
    """Modules in ``out`` that kgen generated from a spec under one of ``folders`` (the
    header names it) that is gone: a deleted or renamed spec's module, which ``--check``
    reports as stale.  Modules of specs that are there (built from a name the folder's walk
    does not take, ``x.txt`` or a linked folder), of specs elsewhere, and files kgen did not
    generate are left alone."""
    from .render import comment_text
    from .targets import generated_from
    roots = tuple(os.path.join(os.path.abspath(f), "") for f in folders)
    found = []
    for module in sorted(out.glob("*.py")) if roots and os.path.isdir(out) else []:
        try:
            shown = generated_from(module)
        except (OSError, KgenError):   # unreadable, or not a regular file (a FIFO is never read)
            continue
        spec = comment_text(shown) if shown else None   # the header prints it in ASCII
        if spec and module not in targets and os.path.abspath(spec).startswith(roots) \
                and existing_kind(spec) != "a regular file":
            found.append((module, shown))
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
