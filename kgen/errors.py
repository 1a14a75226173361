"""Source spans, the errors kgen raises and the notices it prints.

Every error a user can provoke is a ``KgenError``.  Errors about a spec carry a
``Span`` and render as ``path:line:col: message`` followed by the source line and a
caret under the offending columns; errors about a call name the argument, what was
expected and what was given.
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """A region of a spec: 1-based line and column, end exclusive."""

    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    text: str = field(default="", compare=False, repr=False)

    def __str__(self) -> str:
        return f"{printable(self.path)}:{self.line}:{self.col}"

    def caret(self) -> str:
        """The source line and a caret under this span (first line only)."""
        lines = self.text.split("\n")     # as the parser counts lines: \r, \f or \u2028 end none
        if not 1 <= self.line <= len(lines):
            return ""
        src = "".join(" " if c < " " or c in "\x7f\x85\u2028\u2029" else c for c in lines[self.line - 1])
        end = self.end_col if self.end_line == self.line else len(src) + 1
        start = max(0, self.col - 1 - 60)          # long lines: a window around the column
        shown = src[start:start + 120]
        width = max(1, min(end - self.col, len(shown) - (self.col - 1 - start)))
        prefix = "..." if start else ""
        return f"    {prefix}{shown}\n    {' ' * (len(prefix) + self.col - 1 - start)}{'^' * width}"


def printable(path: str) -> str:
    """A path on one line: control characters (a newline in a file name) as Python escapes them."""
    return "".join(repr(c)[1:-1] if c < " " or c in "\x7f\x85\u2028\u2029" else c for c in path)


class KgenError(Exception):
    """Any error kgen reports to a user: bad spec, bad call, unsupported pattern."""

    def __init__(self, message: str, span: Span | None = None):
        self.message = message
        self.span = span
        super().__init__(self._render())

    def _render(self) -> str:
        if self.span is None:
            return self.message
        caret = self.span.caret()
        head = f"{self.span}: {self.message}"
        return f"{head}\n{caret}" if caret else head


class SpecError(KgenError):
    """The spec is malformed or ill-typed."""


class UnsupportedError(SpecError):
    """The spec is well-formed but outside the patterns kgen can generate."""


class CallError(KgenError):
    """A kernel was called with arguments that do not fit its signature."""


def did_you_mean(name: str, candidates) -> str:
    """`` (did you mean 'exp'?)`` when a close candidate exists, else ``''``."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def notice(text: str) -> None:
    """``text`` on stderr, as news: where stderr cannot take it (a full disk, a closed pipe)
    the work it tells of goes on."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):   # ValueError: a closed file
        pass
