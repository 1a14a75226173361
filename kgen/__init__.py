"""kgen: a few lines of math in, a fast and readable Triton kernel out."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import CallError, KgenError, SpecError, UnsupportedError  # noqa: E402
from .runtime import Kernel, build, compile  # noqa: E402

__all__ = ["compile", "build", "Kernel", "KgenError", "SpecError", "CallError", "UnsupportedError",
           "__version__"]
