"""Test-session setup shared by every test file.

* ``KGEN_CACHE_DIR`` points at a fresh folder for the session, so tests never read
  or write the user's ``~/.cache/kgen`` and start from an empty module cache.
* Without CUDA, ``TRITON_INTERPRET=1`` is set before anything imports a generated
  module, so ``@triton.jit`` functions are built for Triton's interpreter.
* On a GPU, ``KGEN_AUTOTUNE=0``: no test times candidate configs for real.
* ``KGEN_TEST_SCALE=N`` multiplies every property test's example count by N, for a long
  hunt (``examples`` below); the default keeps the suite within CI's minutes.
* Tests marked ``gpu`` (declared in pyproject.toml) are skipped where there is no
  CUDA device: bf16 arithmetic and tensors past 2**31 elements live there.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"

if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
else:
    # Tests check results, not speed: kernels run their heuristic configs, and the tuner's
    # own tests drive it with fake clocks (force=True).
    os.environ["KGEN_AUTOTUNE"] = "0"
_SCALE = int(os.environ.get("KGEN_TEST_SCALE") or 1)


def examples(count: int) -> int:
    """A property test's number of Hypothesis examples: ``count``, times ``KGEN_TEST_SCALE``."""
    return count * _SCALE


_CACHE = tempfile.mkdtemp(prefix="kgen-test-cache-")
os.environ["KGEN_CACHE_DIR"] = _CACHE


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (bf16 arithmetic, large tensors)")
    config.addinivalue_line("markers", "slow: long runs, only with pytest -m slow")
    # the interpreter computes masked-off lanes too (and NaN/inf cases on purpose): numpy's
    # warnings about them are noise; results are checked against the reference
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


def pytest_collection_modifyitems(config, items):
    slow_asked = "slow" in (config.getoption("-m") or "")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "slow" in item.keywords and not slow_asked:
            item.add_marker(pytest.mark.skip(reason="long run: pytest -m slow"))


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def fifo_released_after():
    """``make(path)`` makes a named pipe (FIFO) at ``path``.  A process or thread that opens one
    to read blocks until a writer comes, which is the hang the tests using this look for: after
    the test, each FIFO's other end is opened without blocking and closed, so a reader stuck on it
    gets end-of-file and ends rather than outliving the test."""
    fifos: list[Path] = []

    def make(path) -> Path:
        os.mkfifo(path)
        fifos.append(Path(path))
        return Path(path)
    yield make
    for fifo in fifos:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:   # no reader waiting (ENXIO), or the FIFO is gone: nothing to release
            continue
        os.close(fd)


@pytest.fixture
def cache_dir():
    """The session's kgen module cache (a ``pathlib.Path``)."""
    from kgen.runtime import cache_dir as current
    return current()


class Launches:
    """Counts the launches of a generated module's ``@triton.jit`` kernels."""

    def __init__(self):
        self.count = 0
        self.kwargs: list[dict] = []      # the keyword arguments of each launch (INT64, BLOCK_SIZE, ...)
        self.kernels: list = []           # ... and the @triton.jit function each launched


class _Counting:
    def __init__(self, fn, launches: Launches, run: bool):
        self.fn, self.launches, self.run = fn, launches, run

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.count += 1
            self.launches.kwargs.append(kwargs)
            self.launches.kernels.append(self.fn)
            if self.run:
                return self.fn[grid](*args, **kwargs)
        return launch


@pytest.fixture
def watch(monkeypatch):
    """``launches = watch(module, run=True)``: count launches of every ``*_kernel`` of a
    generated module; with ``run=False`` they are recorded but not run."""
    from triton.runtime.jit import KernelInterface

    def install(module, run: bool = True) -> Launches:
        launches, wrapped = Launches(), 0
        for name, value in list(vars(module).items()):
            if name.endswith("_kernel") and isinstance(value, KernelInterface):
                monkeypatch.setattr(module, name, _Counting(value, launches, run))
                wrapped += 1
        assert wrapped, f"no *_kernel in {module.__name__}"
        return launches
    return install
