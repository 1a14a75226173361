"""kgen: a few lines of math in, a fast and readable Triton kernel out."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import CallError, KgenError, SpecError, UnsupportedError  # noqa: E402

__all__ = ["compile", "build", "Kernel", "KgenError", "SpecError", "CallError", "UnsupportedError",
           "__version__"]

# compile, build and Kernel come from kgen.runtime, which imports torch and Triton (seconds): on
# first use, so that the command line answers --help at once and handles Ctrl-C from its start
_RUNTIME = ("compile", "build", "Kernel")


def __getattr__(name: str):
    if name in _RUNTIME:
        from . import runtime
        globals().update({n: getattr(runtime, n) for n in _RUNTIME})
        return globals()[name]
    raise AttributeError(f"module 'kgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_RUNTIME))
