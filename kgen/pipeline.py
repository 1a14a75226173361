"""The whole compiler in one function: text → Triton source."""
from __future__ import annotations

from dataclasses import dataclass

from .check import Arg, check
from .parse import parse, too_deep
from .patterns import classify
from .render import defined_once, render


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
        source = render(plans, path, text)
        defined_once(source, kernels)
        return Generated(source, plans, kernels)
    except RecursionError:  # a statement nested deeper than Python's stack
        raise too_deep(text, path) from None
