"""Plans → Python source, through the Jinja templates in ``templates/``.

Templates only print: they receive finished plans (StrictUndefined catches a
missing field), and the output is deterministic byte for byte.
"""
from __future__ import annotations

import ast
import collections
import hashlib
import io
import os
import re
import shlex
import tokenize
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import jinja2

from . import __version__
from .errors import SpecError


def template_dir() -> Path:
    here = Path(__file__).parent
    for candidate in (here / "templates", here.parent / "templates"):  # installed, source tree
        if (candidate / "module.jinja").is_file():
            return candidate
    raise FileNotFoundError("kgen's templates/ folder is missing from the installation")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              trim_blocks=False, lstrip_blocks=False, autoescape=False)


def comment_safe(text: str) -> str:
    """Text for a ``#`` comment: printable ASCII only, so it can never end the line; other
    characters as Python escapes them (``\\xe9``, ``\\u2028``, ``\\U0001f600``), and a
    backslash doubled (a path's ``\\x41`` is no ``A``), which ``comment_text`` undoes."""
    return "".join("\\\\" if c == "\\" else c if " " <= c <= "~" else f"\\x{ord(c):02x}" if ord(c) < 0x100 else
                   f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}" for c in text)


_ESCAPE = re.compile(r"\\(?:(\\)|x([0-9a-f]{2})|u([0-9a-f]{4})|U([0-9a-f]{8}))")


def comment_text(text: str) -> str:
    """The text ``comment_safe`` printed (a spec path in a module's header: a non-UTF-8 file
    name's bytes come back as the surrogates Python names them by)."""
    def char(m: re.Match) -> str:
        if m.group(1):
            return "\\"
        code = int(next(g for g in m.groups() if g), 16)
        return chr(code) if code <= 0x10FFFF else m.group(0)
    return _ESCAPE.sub(char, text)


def shell_word(path: str) -> str:
    """A path as a shell command line takes it back, on one line of printable ASCII (a comment's,
    a terminal's): quoted, never read as an option; a name with other characters (``café``, a
    newline, a non-UTF-8 byte) as bash's ``$'...'`` of its bytes (``$'caf\\xc3\\xa9.k'``)."""
    word = f"./{path}" if path.startswith("-") else path
    if all(" " <= c <= "~" for c in word):
        return shlex.quote(word)
    return "$'" + "".join(_ANSI_C[b] for b in os.fsencode(word)) + "'"


# a byte inside $'...': printable ASCII as itself but for the two escaped there, any other as \xHH
_ANSI_C = [f"\\{chr(b)}" if chr(b) in "\\'" else chr(b) if 0x20 <= b <= 0x7e else f"\\x{b:02x}" for b in range(256)]


def _relative(folder: str) -> str:
    """A folder relative to the working one (``../out``), however it was spelled (``/abs/out``,
    ``a/../out/``), so that one folder gives one header; absolute where no relative path leads.
    '..' is taken as the file system takes it, out of a symlinked folder (as the build writes)."""
    if ".." in Path(folder).parts:
        folder = os.path.realpath(folder)
    try:
        return Path(os.path.relpath(folder)).as_posix()
    except ValueError:   # another drive
        return Path(os.path.abspath(folder)).as_posix()


def spec_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def render(plans, path: str, text: str, out: str | None = None) -> str:
    """The module of ``plans``; ``out`` is the folder a build writes it into, which the
    header's rebuild command names (unless it is the default, ``generated``)."""
    helpers = []
    for plan in plans:
        helpers += [h for h in plan.helpers if h not in helpers]
    from .lower import HELPERS
    helpers.sort(key=HELPERS.index)
    command = shell_word(path)
    folder = None if out is None else _relative(out)
    if folder not in (None, "generated"):
        command += f" -o {shell_word(folder)}"
    # a spec given as text (kgen.compile("C = A @ B")) has no file to build from
    rebuild = "compile it again" if path == "<string>" else f"run `kgen build {command}`"
    source = environment().get_template("module.jinja").render(
        version=__version__, path=comment_safe(path), rebuild=rebuild, sha=spec_hash(text),   # printable ASCII
        plans=plans, helpers=helpers)
    return _wrap(_drop_unread(_tidy(source)))


_DEFINES = re.compile(r"(?:#[^\n]*\n|@[^\n]*\n)*(?:def (_\w+)\(|(_\w+) = )")   # a top-level item's name
_STATEMENT = re.compile(r"^(?:def |class |[A-Za-z_]\w* = )", re.M)     # ... and each statement it starts
_PRIVATE = re.compile(r"\b_\w+")


def _drop_unread(source: str) -> str:
    """Every module prints the host helpers the patterns share; those of its own (top-level
    ``_name`` functions and constants, each an item between two blank lines) whose name
    nothing else in it mentions go, with the comment lines right above them, until each left
    is read (a helper read only by one that went, goes).  Names are matched as words, comments
    included: a helper is kept on a doubt, never dropped on one, and the module is never
    parsed (that tripled the time to generate one)."""
    items = source.split("\n\n\n")
    named = {}
    for i, item in enumerate(items):
        m = _DEFINES.match(item)
        if m and not (m.group(1) or m.group(2)).startswith("__") and len(_STATEMENT.findall(item)) == 1:
            named[i] = m.group(1) or m.group(2)
    if not named:
        return source
    mentions = collections.Counter(_PRIVATE.findall(source))
    own = {i: collections.Counter(_PRIVATE.findall(items[i])) for i in named}
    dropped: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, name in named.items():
            if i not in dropped and mentions[name] == own[i][name]:   # mentioned only where it is defined
                dropped.add(i)
                mentions.subtract(own[i])
                changed = True
    return "\n\n\n".join(item for i, item in enumerate(items) if i not in dropped)


def defined_once(source: str, kernels) -> None:
    """Each kernel's generated names are its own.  In a file of several kernels, one named
    like another's generated code (``f`` and ``f_looped``: ``f``'s looped kernel is
    ``f_looped_kernel``) would redefine it: an error at the kernel with the longer name."""
    seen = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        else:
            names = [t.id for t in getattr(node, "targets", ()) if isinstance(t, ast.Name)]
        for name in names:
            if name not in seen:
                seen.add(name)
                continue
            owners = sorted((k for k in kernels if name == k.name or name.startswith((f"{k.name}_", f"_{k.name}_"))),
                            key=lambda k: len(k.name))
            culprit = owners[-1] if owners else kernels[-1]
            other = f"kernel '{owners[0].name}'" if len(owners) > 1 else "another kernel"
            raise SpecError(f"kernel '{culprit.name}': its generated {name} is also generated for {other}; "
                            f"rename one of them", culprit.span)


_TOP_DEFS = re.compile(r"^def (\w+)\(", re.M)


def shadows_nothing(source: str, kernels) -> None:
    """No function of the module binds a name of a function that the module defines and calls
    (``_f_tile``, which kernel f's persistent kernel calls): a spec's value of that name would be
    a parameter or local there, in the way of the call.  An error at the value."""
    written = {}    # a value's name -> (where the spec writes it, its kernel); a dimension: no span
    for k in kernels:
        for p in k.params:
            written.setdefault(p.name, (p.span, k))
            written.update({d: (None, k) for d in p.shape or () if isinstance(d, str) and d not in written})
        written.update({st.name: (st.span, k) for st in k.stmts if st.name not in written})
    named = written.keys() & set(_TOP_DEFS.findall(source))
    if not named:   # most specs: no parse of the module needed
        return
    for name in sorted(named & hidden_calls(source)):
        span, k = written[name]
        # (a statement's or parameter's span starts at its name: the caret takes the name)
        at = replace(span, end_line=span.line, end_col=span.col + len(name)) if span else k.span
        raise SpecError(f"'{name}' cannot name a value: the generated module calls its own {name} for "
                        f"kernel '{k.name}'; choose another name", at)


def hidden_calls(source: str) -> set[str]:
    """The names of the module's own functions that it calls (``f(...)``, ``f[grid](...)``)
    and that one of its functions binds as a parameter or local, where it hides them."""
    tree = ast.parse(source)
    callees = (n.func.value if isinstance(n.func, ast.Subscript) else n.func for n in ast.walk(tree)
               if isinstance(n, ast.Call))
    called = {callee.id for callee in callees if isinstance(callee, ast.Name)}
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} & called
    found = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        found |= bound & defined
    return found


def _tidy(source: str) -> str:
    """Whitespace policy in one place: no trailing spaces, at most two blank lines, one final newline."""
    out, blank = [], 0
    for line in source.split("\n"):   # not splitlines(): a form feed is no line end to Python
        line = line.rstrip()
        blank = blank + 1 if not line else 0
        if blank <= 2:
            out.append(line)
    return "\n".join(out).strip("\n") + "\n"


WIDTH = 120   # code lines longer than this are broken after a comma, as a person would


def _wrap(source: str) -> str:
    """Breaks each code line longer than WIDTH after commas inside brackets, the next part
    lined up under the bracket's first character; a line with no such comma stays whole
    (comments never break).  Commas inside strings, f-strings included, are not candidates,
    so the choice is the same on every Python version."""
    lines = source.split("\n")
    long = {i + 1 for i, line in enumerate(lines) if len(line) > WIDTH}
    if not long:
        return source
    commas: dict[int, list[tuple[int, int]]] = {row: [] for row in long}
    opened, in_fstring = [], 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        name = tokenize.tok_name[tok.type]
        if name == "FSTRING_START":
            in_fstring += 1
        elif name == "FSTRING_END":
            in_fstring -= 1
        elif tok.type == tokenize.OP and not in_fstring:
            if tok.string in "([{":
                opened.append(tok.start)
            elif tok.string in ")]}":
                opened.pop()
            elif tok.string == "," and tok.start[0] in long and opened and opened[-1][0] == tok.start[0]:
                commas[tok.start[0]].append((tok.end[1], opened[-1][1]))
    out = []
    for row, line in enumerate(lines, 1):
        out += _broken(line, commas[row]) if row in long else [line]
    return "\n".join(out)


def _broken(line: str, commas: list[tuple[int, int]]) -> list[str]:
    """``line`` in pieces, each ending at one of ``commas`` (column after the comma, column
    of its open bracket), the longest that fit in WIDTH."""
    pieces, start, indent, placed = [], 0, 0, {}
    while indent + len(line) - start > WIDTH:
        fits = [(end, bracket) for end, bracket in commas if start < end and indent + end - start <= WIDTH]
        if not fits:
            break
        end, bracket = fits[-1]
        for column in range(start, end):
            placed.setdefault(column, indent + column - start)
        pieces.append(" " * indent + line[start:end] if pieces else line[:end])
        start = end + len(line[end:]) - len(line[end:].lstrip(" "))
        indent = placed[bracket] + 1
    pieces.append(" " * indent + line[start:] if pieces else line)
    return pieces
