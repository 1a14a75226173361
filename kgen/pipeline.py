"""The whole compiler in one function: text → Triton source."""
from __future__ import annotations

from dataclasses import dataclass

from .check import Arg, check
from .parse import parse, too_deep
from .patterns import classify
from .render import render


@dataclass(frozen=True)
class Generated:
    source: str
    plans: tuple          # one plan per kernel, in spec order
    kernels: tuple        # their typed IR


def generate(text: str, path: str = "<string>", args: dict[str, tuple[Arg, ...]] | None = None) -> Generated:
    tree = parse(text, path)
    try:
        kernels = check(tree, args)
        plans = tuple(classify(k) for k in kernels)
        return Generated(render(plans, path, text), plans, kernels)
    except RecursionError:  # a statement nested deeper than Python's stack
        raise too_deep(text, path) from None
