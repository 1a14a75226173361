"""Text → syntax tree, with Lark (LALR, positions kept).

``parse`` takes a ``.k`` module (``kernel`` definitions and ``schedule`` sections)
or the headerless form (bare statements), and always returns a ``Module``.
Syntax errors become ``SpecError`` with the line, column and a caret.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

import lark
from lark import Lark, Token, Transformer, v_args

from . import syntax as S
from .errors import Span, SpecError

# a comment is consumed to its line's end, so "# kernel to scale x" does not start a header
_HEADER = re.compile(r"\A(?:\s|;|#[^\n]*(?:\n|\Z))*(kernel|schedule)\s+[^\W\d]")
_OPENERS, _CLOSERS = {"LPAR", "LSQB"}, {"RPAR", "RSQB"}

# What a user calls each terminal in an "expected ..." message.
_TOKEN_NAMES = {
    "NAME": "a name", "NUMBER": "a number", "INT": "an integer", "_SEP": "a newline or ';'",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'",
    "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "MINUS": "'-'",
    "PLUS": "'+'", "ADD_OP": "'+' or '-'", "MUL_OP": "'*', '/' or '@'",
    "COMPARE": "a comparison", "KERNEL": "'kernel'",
    "SCHEDULE": "'schedule'", "$END": "the end of the input",
}


def _semicolon_at(sep: str) -> int | None:
    """Where a separator token (newlines, ';', comments) has its first ';' outside a comment,
    which ends a statement wherever it is; None for newlines and comments alone."""
    in_comment = False
    for i, c in enumerate(sep):
        if c == "#" or c == "\n":
            in_comment = c == "#"
        elif c == ";" and not in_comment:
            return i
    return None


class _DropNewlinesInBrackets:
    """Post-lexer: a newline inside () or [] continues the line (';' still ends it, one inside a
    comment does not)."""

    always_accept = ("_SEP",)

    def process(self, stream):
        depth = 0
        for tok in stream:
            if tok.type in _OPENERS:
                depth += 1
            elif tok.type in _CLOSERS:
                depth = max(0, depth - 1)
            elif tok.type == "_SEP" and depth and _semicolon_at(tok) is None:
                continue
            yield tok


@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "grammar.lark").read_text()
    return Lark(grammar, parser="lalr", start=["module", "body"], propagate_positions=True,
                maybe_placeholders=True, postlex=_DropNewlinesInBrackets())


def parse(text: str, path: str = "<string>") -> S.Module:
    """Parse a spec; headerless text becomes a module with one kernel."""
    start = "module" if _HEADER.match(text) else "body"
    try:
        tree = _parser().parse(text + "\n", start=start)
    except lark.exceptions.UnexpectedInput as e:
        raise _syntax_error(e, text, path) from None
    except lark.exceptions.VisitError as e:  # raised inside the builder below
        raise _unwrapped(e, text, path) from None
    except RecursionError:
        raise too_deep(text, path) from None
    _check_tree_depth(tree, text, path)
    try:
        built = _Builder(text, path).transform(tree)
    except lark.exceptions.VisitError as e:
        raise _unwrapped(e, text, path) from None
    except RecursionError:
        raise too_deep(text, path) from None
    if start == "module":
        module = built
    else:
        span = Span(path, 1, 1, 1, 1, text)
        module = S.Module((S.Kernel(S.Name("kernel", span), (), (), built, span, headerless=True),), (), path, text)
    for kernel in module.kernels:
        for stmt in kernel.body:
            _check_depth(stmt)
    return module


# The checker and the printer recurse through a statement, a few frames a level: deeper
# statements are refused here, at their span.  (Generated code stays shallower than Python's
# parser and Triton's compiler take whatever the depth: ir.in_parts.)
MAX_DEPTH = 150


def _check_tree_depth(tree: lark.Tree, text: str, path: str) -> None:
    """A statement far past the limit, refused at its span before the builder recurses into it
    (``y + y + ... + y`` a thousand times deep would exhaust Python's stack there); the parse
    tree has at most two levels per syntax-tree level, so this never refuses what
    _check_depth would take."""
    depth: dict[int, int] = {}
    for sub in tree.iter_subtrees():   # children before their parents, without recursion
        depth[id(sub)] = 1 + max((depth[id(c)] for c in sub.children if isinstance(c, lark.Tree)), default=0)
        if sub.data == "stmt" and depth[id(sub)] > 2 * MAX_DEPTH:
            raise SpecError(f"this statement nests expressions more than {MAX_DEPTH} levels deep; "
                            f"split it into several statements", _span(sub.meta, path, text))


def _check_depth(stmt: S.Assign) -> None:
    if any(depth > MAX_DEPTH for _, depth in S.walk(stmt.value)):
        raise SpecError(f"this statement nests expressions more than {MAX_DEPTH} levels deep; "
                        f"split it into several statements", stmt.span)


def _unwrapped(e: lark.exceptions.VisitError, text: str, path: str) -> Exception:
    """The error a Lark callback raised: a SpecError as it is, a RecursionError as "too deep"."""
    if isinstance(e.orig_exc, SpecError):
        return e.orig_exc
    if isinstance(e.orig_exc, RecursionError):
        return too_deep(text, path)
    return e


def too_deep(text: str, path: str) -> SpecError:
    return SpecError("the spec nests expressions too deeply; split it into several statements",
                     Span(path, 1, 1, 1, 2, text))


def _syntax_error(e: lark.exceptions.UnexpectedInput, text: str, path: str) -> SpecError:
    line, col = max(1, e.line), max(1, e.column)
    lines = text.split("\n")             # as Lark counts lines (splitlines() would also end them at \f)
    while len(lines) > 1 and not lines[-1].strip():  # blank lines at the end (the final newline's too)
        lines.pop()
    at_end = getattr(e, "token", None) is not None and e.token.type == "$END"
    if line > len(lines) or at_end:  # point just past the last character written
        line, col = len(lines), len(lines[-1].rstrip()) + 1
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        what = f"unexpected character {text[e.pos_in_stream]!r}" if e.pos_in_stream < len(text) \
            else "unexpected end of input"
        width = 1
    else:
        tok = getattr(e, "token", None)
        semicolon = _semicolon_at(tok) if tok is not None and tok.type == "_SEP" else None
        if tok is None or tok.type == "$END" or (tok.type == "_SEP" and "\n" in tok and semicolon is None):
            what = "unexpected end of line" if tok is not None and tok.type == "_SEP" else "unexpected end of input"
            width = 1
        elif semicolon is not None:   # at the ';' itself, not at the comments and blanks before it
            before = tok[:semicolon]
            line, col = line + before.count("\n"), (col + len(before) if "\n" not in before
                                                     else len(before) - before.rindex("\n"))
            what, width = "unexpected ';'", 1
        else:
            what = f"unexpected {str(tok)!r}"
            width = max(1, len(str(tok)))
    # what the parser would take here: its state's own list (``expected``) also names tokens of
    # the states LALR merged into it (a '}' after a headerless statement)
    interactive = getattr(e, "interactive_parser", None)
    tokens = (interactive.accepts() if interactive is not None else None) or getattr(e, "expected", None) or ()
    expected = sorted({_TOKEN_NAMES.get(t) or _literal_token(t) for t in tokens if t != "_SEP"})
    if expected and len(expected) <= 6:
        what += "; expected " + ", ".join(expected)
    if re.match(r"\s*kernel\s+[^\s=]", lines[line - 1]) and not _HEADER.match(text):   # read as statements
        before = re.sub(r"#[^\n]*", "", "\n".join(lines[:line - 1])).strip(" \t\n;")
        what += (" (statements without a header cannot sit beside a kernel definition: put them in its body)"
                 if before else " (a kernel's name starts with a letter)")
    if lines[line - 1].split()[:1] == ["schedule"] and not re.search(r"^\s*kernel\b", text, re.M):
        what += (" (a schedule section belongs to a kernel with a header, kernel NAME(...) -> ... { ... }: "
                 "statements without one take kgen's own choices)")
    return SpecError(what, Span(path, line, col, line, col + width, text))


def _literal_token(name: str) -> str:
    """A token the grammar writes as a literal, as written (Lark names ``"**"`` ``__ANON_1``)."""
    pattern = next((t.pattern for t in _parser().terminals if t.name == name), None)
    return repr(pattern.value) if isinstance(pattern, lark.lexer.PatternStr) else repr(name.lower())


def _span(meta, path: str, text: str) -> Span:
    return Span(path, meta.line, meta.column, meta.end_line, meta.end_column, text)


def _tok_span(tok: Token, path: str, text: str) -> Span:
    return Span(path, tok.line, tok.column, tok.end_line, tok.end_column, text)


@v_args(meta=True)
class _Builder(Transformer):
    """Lark tree → ``kgen.syntax`` dataclasses."""

    def __init__(self, text: str, path: str):
        super().__init__()
        self.text, self.path = text, path

    def _s(self, meta) -> Span:
        return _span(meta, self.path, self.text)

    def _name(self, tok: Token) -> S.Name:
        return S.Name(str(tok), _tok_span(tok, self.path, self.text))

    def _number(self, tok: Token, negative: bool = False) -> S.Number:
        span = _tok_span(tok, self.path, self.text)
        raw = str(tok)
        is_int = raw.isdigit() and len(raw.lstrip("0")) <= 10   # longer: past int32 anyway
        value = int(raw) if is_int else float(raw)
        if is_int and value >= 2**31 + negative:   # past int32 (whose least is -2**31): a float
            value = float(raw)
            is_int = False
        if not is_int and math.isinf(value):
            shown = raw if len(raw) <= 24 else f"{raw[:12]}...{raw[-6:]} ({len(raw)} characters)"
            raise SpecError(f"number {shown} is too large for a float", span)
        if negative:
            value = -value
        return S.Number(value, ("-" if negative else "") + raw, span)

    # --- module structure ---------------------------------------------------
    def module(self, meta, items):
        kernels = tuple(i for i in items if isinstance(i, S.Kernel))
        schedules = tuple(i for i in items if isinstance(i, S.Schedule))
        return S.Module(kernels, schedules, self.path, self.text)

    def empty_module(self, meta, items):
        return S.Module((), (), self.path, self.text)

    def kernel(self, meta, items):
        name, params, outputs, body = items
        return S.Kernel(self._name(name), tuple(params or ()), outputs, body, self._s(meta))

    def params(self, meta, items):
        return tuple(items)

    def param(self, meta, items):
        name, type_, default = items
        return S.Param(self._name(name), type_, default, self._s(meta))

    def outputs(self, meta, items):
        return tuple(items)

    def output(self, meta, items):
        name, type_ = items
        return S.Param(self._name(name), type_, None, self._s(meta))

    def tensor_type(self, meta, items):
        dtype, shape = items
        return S.TensorType(self._name(dtype), shape, False, self._s(meta))

    def list_type(self, meta, items):
        dtype, shape = items
        return S.TensorType(self._name(dtype), shape, True, self._s(meta))

    def shape(self, meta, items):
        return tuple(d for d in items if d is not None)

    def dim(self, meta, items):
        (tok,) = items
        return self._number(tok) if tok.type == "INT" else self._name(tok)

    def positive_number(self, meta, items):
        return self._number(items[0])

    def negative_number(self, meta, items):
        return self._number(items[0], negative=True)

    def schedule(self, meta, items):
        name, *choices = items
        return S.Schedule(self._name(name), tuple(c for c in choices if c is not None), self._s(meta))

    def choice(self, meta, items):
        key, *values = items
        parsed = tuple(self._number(v) if v.type == "INT" else self._name(v) for v in values)
        is_list = self.text[meta.start_pos:meta.end_pos].split("=", 1)[1].lstrip().startswith("[")
        return S.Choice(self._name(key), parsed, is_list, self._s(meta))

    # --- statements and expressions -------------------------------------------
    def body(self, meta, items):
        return tuple(i for i in items if i is not None)

    def stmt(self, meta, items):
        target, value = items
        return S.Assign(self._name(target), value, self._s(meta))

    def number(self, meta, items):
        return self._number(items[0])

    def name(self, meta, items):
        return self._name(items[0])

    def call(self, meta, items):
        func, *rest = items
        args = tuple(a for a in rest if a is not None and not isinstance(a, tuple))
        kwargs = tuple(a for a in rest if isinstance(a, tuple))
        seen_kw = False
        for a in rest:
            if isinstance(a, tuple):
                seen_kw = True
            elif a is not None and seen_kw:
                raise SpecError("positional argument after a keyword argument", a.span)
        return S.Call(self._name(func), args, kwargs, self._s(meta))

    def keyword(self, meta, items):
        key, value = items
        return (self._name(key), value)

    def binary(self, meta, items):
        left, op, right = items
        return S.BinOp(str(op), left, right, self._s(meta))

    def compare(self, meta, items):
        return self.binary(meta, items)

    def pow(self, meta, items):
        left, right = items
        return S.BinOp("**", left, right, self._s(meta))

    def neg(self, meta, items):
        (operand,) = items
        if isinstance(operand, S.Number):
            value = -operand.value
            if operand.text.isdigit() and len(operand.text.lstrip("0")) <= 10 and int(operand.text) == 2**31:
                value = -2**31   # int32's least: an integer, though 2147483648 alone is past int32 (a float)
            elif isinstance(value, int) and value >= 2**31:
                value = float(value)   # --2147483648: past int32, a float as 2147483648 is
            return S.Number(value, "-" + operand.text, self._s(meta))
        return S.Neg(operand, self._s(meta))

    def unary(self, meta, items):  # unary plus
        return items[0]
