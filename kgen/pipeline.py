"""The whole compiler in one function: text → Triton source."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from .check import Arg, check
from .parse import parse, too_deep
from .patterns import classify
from .render import defined_once, render, shadows_nothing


@dataclass(frozen=True)
class Generated:
    source: str
    plans: tuple          # one plan per kernel, in spec order
    kernels: tuple        # their typed IR


# One piece of work that parses Python at a time: CPython 3.11's ast.parse fails ("AST constructor
# recursion depth mismatch") in threads at once.  Generation holds it (render parses the module:
# Python alone, which the GIL runs one at a time anyway), and so does each launch on Triton's
# interpreter, which parses a kernel at its first call and keeps a launch's state in globals.
python_lock = threading.RLock()


def _fresh_lock() -> None:
    global python_lock
    python_lock = threading.RLock()


if hasattr(os, "register_at_fork"):   # a child forked while another thread generated
    os.register_at_fork(after_in_child=_fresh_lock)


def generate(text: str, path: str = "<string>", args: dict[str, tuple[Arg, ...]] | None = None,
             out: str | None = None) -> Generated:
    """``text`` (from ``path``) as Triton source; ``args`` types a headerless kernel from its
    call, ``out`` is the folder a build writes the module into."""
    with python_lock:
        tree = parse(text, path)
        try:
            kernels = check(tree, args)
            plans = tuple(classify(k) for k in kernels)
            source = render(plans, path, text, out)
            defined_once(source, kernels)
            shadows_nothing(source, kernels)
            return Generated(source, plans, kernels)
        except RecursionError:  # a statement nested deeper than Python's stack
            raise too_deep(text, path) from None
