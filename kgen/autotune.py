"""Autotuning with a disk cache, kept outside the generated modules.

The design: a generated host function takes an optional ``config`` (a dict of
meta-parameters and launch options) and otherwise picks one with a heuristic
printed in the module, so a generated module runs on its own, without kgen and
without tuning.  kgen's runtime ``Kernel`` puts a ``Tuner`` in front of it: on the
first call for a problem key, the tuner times each candidate config (the plan's
``Tuning.configs``, pruned for the problem) with ``triton.testing.do_bench`` (or, for
plans whose configs cost the host the same, as every tuned pattern's do, replayed from
CUDA graphs: ``graph_ms``), keeps the fastest in memory and on disk, and passes it as
``config=`` (as the module's ``_Checked``, which the host's config check passes as it is: the
candidates are the plan's own).  A call whose outputs are all empty launches nothing: it is
not tuned.

Why not ``@triton.autotune`` in the generated source: its cache lives in one
process (its disk cache varies across Triton versions), it reports no progress,
and a module copied out of kgen would compile and time every candidate on its
first call wherever it runs.

- **Key**: every tensor argument's dtype, shape and stride layout (which axes are
  unit-stride or broadcast); shapes carry M, N, K and the batch.  ``out=`` is not
  part of it.  The axes a plan names in ``Tuning.buckets`` (a GEMM's M, wherever
  it appears) are keyed by the power of two at or above their size, so a model
  whose batch of rows varies tunes once per doubling, not once per size.
- **Disk**: ``<kgen cache>/autotune/<GPU name>/triton-<version>/<kernel>-<source hash>.json``.
  The file repeats GPU, Triton version and source hash; a file whose fields do not
  match, that does not parse, or an entry whose config is not a current candidate
  is ignored (and overwritten on the next tuning).  Writes are atomic.
- **Off**: ``KGEN_AUTOTUNE=0``, or tensors not on a CUDA device (Triton's
  interpreter), or a single candidate: the host function's heuristic runs.
- **Progress**: on stderr, once tuning has taken more than a second.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .errors import CallError, KgenError, notice
from .files import read_regular

try:
    import fcntl
except ImportError:   # not on this platform: concurrent tuners may each keep only their own entry
    fcntl = None

FORMAT = 1
CACHE_LIMIT = 1 << 26    # bytes of one kernel's tuning file: a larger one is not kgen's, and is ignored
_PROGRESS_AFTER_S = 1.0
_MISSING = object()
_Tensor = torch.Tensor    # looked up once: call_key runs at every call


@dataclass(frozen=True)
class Tuning:
    """What a plan offers to tune: candidate configs (empty: nothing to tune) and a
    ``prune(configs, bound_arguments)`` that keeps those worth timing for one call."""

    configs: tuple[dict, ...]
    prune: Callable | None = None
    # key(args, kwargs) -> str or None: the problem key, for calls whose arguments
    # ``problem_key`` cannot describe (a grouped GEMM's lists of tensors); it is the
    # in-memory key too, so it must be cheap.  None: a call the host function rejects.
    key: Callable | None = None
    # (argument, axis) pairs whose size ``problem_key`` rounds up to a power of two
    buckets: tuple[tuple[str, int], ...] = ()
    # time the configs' GPU work alone, replayed from a CUDA graph: for plans whose configs
    # cost the host the same per call, which do_bench would time instead of the GPU when the
    # host is the slower (short kernels, a slow CPU)
    graphs: bool = False


# A later candidate replaces the best so far only when it is faster by more than this:
# near-equal configs trade places from run to run, and the earlier candidates are the
# simpler ones (the TMA variants come last, and their host-side descriptors cost the host
# ~20 us a call that timing from CUDA graphs does not see).
MARGIN = 0.02


_SWITCH = {"": True, "1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False,
           "no": False}


def enabled() -> bool:
    """KGEN_AUTOTUNE, in any case; a value that is neither on nor off (a typo) is an error, not a guess."""
    value = os.environ.get("KGEN_AUTOTUNE", "1")
    switch = _SWITCH.get(value.strip().lower())
    if switch is None:
        raise KgenError(f"KGEN_AUTOTUNE: expected 1 or 0 (or true/false, on/off, yes/no), got {value!r}")
    return switch


def problem_key(arguments: dict, buckets=()) -> str:
    """``A:float16:<=128x4096:s1 B:float16:4096x4096:1s``: dtype, shape and layout of each tensor;
    per axis ``1`` unit stride, ``0`` broadcast, ``s`` strided, ``-`` size one.  The sizes of
    the (name, axis) pairs in ``buckets`` print as ``<=`` the power of two at or above them."""
    parts = []
    for name, value in arguments.items():
        if name in ("out", "config") or not isinstance(value, torch.Tensor):
            continue
        layout = "".join("-" if size == 1 else "1" if stride == 1 else "0" if stride == 0 else "s"
                         for size, stride in zip(value.shape, value.stride()))
        dtype = str(value.dtype).removeprefix("torch.")
        sizes = [f"<={1 << max(0, size - 1).bit_length()}" if (name, axis) in buckets else str(size)
                 for axis, size in enumerate(value.shape)]
        parts.append(f"{name}:{dtype}:{'x'.join(sizes) or '()'}:{layout}")
    return " ".join(parts)


def cache_path(kernel: str, source: str, device_name: str, triton_version: str) -> Path:
    from .runtime import cache_dir
    return (cache_dir() / "autotune" / _safe(device_name) / f"triton-{_safe(triton_version)}"
            / f"{kernel[:100]}-{source_hash(source)[:20]}.json")   # the hash tells long names apart


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "unknown"


@contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``'s sibling ``.lock`` file (none where fcntl is missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # (not through a link someone left in a shared folder: that would create the file it names)
    fd = os.open(path.parent / f"{path.name}.lock", os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing releases the lock


class DiskCache:
    """One JSON file of best configs per problem key, for one kernel source on one GPU."""

    def __init__(self, path: Path, meta: dict, candidates):
        self.path, self.meta = path, meta
        self.candidates = [dict(c) for c in candidates]
        # by their JSON text: 16.0 == 16 and True == 1 in Python, never in a launch
        self._by_text = {json.dumps(c, sort_keys=True): c for c in self.candidates}

    def entries(self) -> dict[str, dict]:
        """The file's valid entries (key -> {"config": ..., "ms": ...}); {} for a file to ignore."""
        try:   # a FIFO in the cache (a KgenError, not a read that blocks) is a file to ignore too
            text = read_regular(self.path, limit=CACHE_LIMIT + 1)
            data = json.loads(text.decode("utf-8")) if len(text) <= CACHE_LIMIT else None
        except (OSError, KgenError, ValueError, RecursionError):   # unreadable, not JSON, nested past the parser
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or \
                any(data.get(k) != v for k, v in self.meta.items()) or not isinstance(data.get("entries"), dict):
            return {}           # corrupt, or another GPU's, Triton's or source's
        valid = {}
        for key, entry in data["entries"].items():
            config = self._by_text.get(json.dumps(entry.get("config"), sort_keys=True)) \
                if isinstance(entry, dict) else None
            if config is not None:      # the candidate itself, never the file's copy
                valid[key] = {**entry, "config": config}
        return valid

    def load(self) -> dict[str, dict]:
        return {key: entry["config"] for key, entry in self.entries().items()}

    def store(self, key: str, config: dict, ms: float) -> None:
        from .runtime import write_atomic
        try:
            with _locked(self.path):   # processes tuning other keys at once: each adds its own
                entries = {**self.entries(), key: {"config": config, "ms": round(ms, 6)}}
                data = {"format": FORMAT, **self.meta, "entries": dict(sorted(entries.items()))}
                write_atomic(self.path, json.dumps(data, indent=1) + "\n")
        except OSError as e:   # a read-only cache costs a re-tune, never a failure
            notice(f"kgen: cannot write the autotune cache {self.path}: {e}")


def do_bench(fn, graphs: bool = False) -> float:
    """Milliseconds per call of ``fn``, L2 flushed before each call as ``triton.testing.do_bench``
    flushes it; with ``graphs``, of its GPU work, replayed from CUDA graphs (a call that cannot
    be captured, e.g. one that copies a Python list to the GPU, is timed call by call)."""
    from triton.testing import do_bench as bench
    if graphs:
        try:
            return graph_ms(fn)
        except Exception:   # capture refused: time the calls instead
            torch.cuda.synchronize()
    return bench(fn, warmup=25, rep=100, return_mode="median")


def graph_ms(fn, calls: int = 16, replays: int = 12) -> float:
    """Milliseconds per call of ``fn``'s GPU work with L2 flushed before each call: one CUDA
    graph of ``calls`` (flush, call) pairs and one of the flushes alone, replayed in turn; the
    median difference over ``calls``.  (Replayed back to back without flushes, a kernel finds
    its operands in L2: on an H100, 4 x 2048^3 grouped GEMM configs timed that way ranked
    otherwise than do_bench and CUPTI rank them, by up to 5%.)"""
    fn()
    torch.cuda.synchronize()
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    lines = torch.empty(2 * (getattr(properties, "L2_cache_size", 0) or 2**26), dtype=torch.int8, device="cuda")
    # a capture stream of the current GPU's: torch's default one belongs to the GPU current
    # when it was first made, and a capture there records nothing launched on another
    stream = torch.cuda.Stream()
    graphs = []
    for with_calls in (True, False):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                flush(lines)
                if with_calls:
                    fn()
        graphs.append(graph)
    differences = []
    for _ in range(replays):
        spans = []
        for graph in graphs:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            spans.append(start.elapsed_time(end))
        differences.append((spans[0] - spans[1]) / calls)
    return max(sorted(differences)[len(differences) // 2], 1e-6)


def flush(lines) -> None:
    """Evict L2 by writing a buffer twice its size."""
    lines.zero_()


class Tuner:
    """Chooses ``config=`` for calls of one generated host function.

    ``bench(run, config) -> ms`` and ``device_name`` can be replaced (tests time
    configs with a fake clock on the interpreter); ``force`` tunes on any device.
    """

    def __init__(self, host, tuning: Tuning, source: str, name: str, *, bench=None,
                 device_name: str | None = None, force: bool = False, checked: Callable[[dict], dict] | None = None):
        self.host, self.tuning, self.source, self.name = host, tuning, source, name
        # the generated module's _Checked: the tuner's configs are the plan's own candidates,
        # which its host function would pass unchanged, so they skip that check at each call
        self.checked = checked
        self.signature = inspect.signature(host)
        self.bench = bench or (lambda run, config: do_bench(run, tuning.graphs))
        self.device_name, self.force = device_name, force
        self.memory: dict[tuple, dict | None] = {}
        self.cache: DiskCache | None = None
        self.tuned = 0                   # problems timed in this process (tests read it)
        self.last: dict | None = None    # the config of the last tuned call (None: the heuristic)
        self._fresh = threading.local()  # .key: what this thread's last call added to memory, if anything
        self._lock = threading.Lock()
        # KGEN_AUTOTUNE is read once, when the kernel is compiled: the per-call path stays short
        # (and without CUDA, where nothing is tuned, takes no key either)
        self.active = len(tuning.configs) >= 2 and (force or enabled() and torch.cuda.is_available())

    def choose(self, args, kwargs) -> dict | None:
        """The config for this call, or None for the host function's own heuristic."""
        self._fresh.key = None
        if not self.active or "config" in kwargs:
            return None
        # The per-call path: one dict lookup on the arguments' dtypes, shapes and strides.
        if self.tuning.key is not None:
            fast = self.tuning.key(args, kwargs)
            if fast is None:
                return None              # the host function reports it
        else:
            try:
                fast = call_key(args, kwargs)
            except RuntimeError:   # a tensor torch has no sizes for (a nested one)
                return None              # the host function reports it
        config = self.memory.get(fast, _MISSING)
        if config is _MISSING:
            config = self._choose(args, kwargs, fast if self.tuning.key is not None else None)
            if config is not None and self.checked is not None:
                config = self.checked(config)
            self.memory[fast] = config
            self._fresh.key = fast
        self.last = config
        return config

    def forget(self) -> None:
        """Drop what the last call added to memory: the host refused that call.  Its decision
        may be None for the call's fault alone (arguments that do not bind, tensors on mixed
        devices), and a key need not tell that call from a good one (a grouped GEMM's key
        holds neither the keywords nor the devices), which would then never be tuned.  Per
        thread: another thread's call between this one's choice and its refusal keeps its own."""
        key = getattr(self._fresh, "key", None)
        if key is not None:
            self.memory.pop(key, None)
            self._fresh.key = None

    def _choose(self, args, kwargs, key: str | None = None) -> dict | None:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None                  # the host function reports it
        tensors = [t for name, v in bound.arguments.items() if name not in ("out", "config") for t in _tensors(v)]
        if not tensors or not (self.force or all(t.is_cuda for t in tensors)):
            return None                  # Triton's interpreter: nothing to time
        key = key or problem_key(bound.arguments, self.tuning.buckets)
        with self._lock:
            cache = self._disk(tensors[0])
            config = cache.load().get(key)
            if config is None:
                if tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():   # timing would break it
                    raise CallError(f"{self.name}: these shapes are tuned at their first call, which a CUDA "
                                    f"graph capture cannot hold; call the kernel once before capturing it")
                config, ms = self._tune(args, kwargs, bound.arguments, key)
                if config is not None:
                    cache.store(key, config, ms)
            return config

    def _disk(self, tensor: torch.Tensor) -> DiskCache:
        if self.cache is None:
            import triton
            device = self.device_name or (torch.cuda.get_device_name(tensor.device) if tensor.is_cuda
                                          else str(tensor.device))
            meta = {"device": device, "triton": triton.__version__, "source": source_hash(self.source),
                    "kernel": self.name}
            path = cache_path(self.name, self.source, device, triton.__version__)
            self.cache = DiskCache(path, meta, self.tuning.configs)
        return self.cache

    def _tune(self, args, kwargs, arguments: dict, key: str) -> tuple[dict | None, float]:
        # The heuristic run checks the arguments (a bad call fails here, as it would
        # untuned) and gives the scratch outputs that every timed run writes, so that
        # the caller's out= (which may alias an input) is written once, at the end.
        plain = {k: v for k, v in kwargs.items() if k != "out"}
        scratch = self.host(*args, **plain)
        if not any(t.numel() for t in _tensors(scratch)):
            return None, 0.0   # nothing is launched: the heuristic, kept for these shapes in memory only
        candidates = list(self.tuning.prune(self.tuning.configs, arguments) if self.tuning.prune
                          else self.tuning.configs)
        start = time.perf_counter()
        shown = False
        best, best_ms, failures = None, math.inf, []
        for i, config in enumerate(candidates):
            try:
                ms = self.bench(lambda c=config: self.host(*args, **plain, out=scratch, config=c), config)
            except Exception as e:   # a config that does not compile or fit: skip it
                failures.append(e)
                ms = math.inf
            if ms < best_ms * (1 - MARGIN):
                best, best_ms = config, ms
            elapsed = time.perf_counter() - start
            if elapsed > _PROGRESS_AFTER_S:
                if not shown:
                    notice(f"kgen: autotuning {self.name} for {key}")
                    shown = True
                notice(f"kgen:   {i + 1}/{len(candidates)} {_brief(config)}: "
                       f"{'failed' if ms == math.inf else f'{ms:.4f} ms'} ({elapsed:.1f} s)")
        if best is None:   # e.g. every candidate past the GPU's shared memory
            first = failures[0]
            why = (str(first).strip().splitlines() or [""])[0][:200]
            raise KgenError(f"{self.name}: none of the {len(candidates)} candidate configs ran for {key} "
                            f"({type(first).__name__}: {why})") from first
        self.tuned += 1
        if shown:
            notice(f"kgen: {self.name}: chose {_brief(best)} ({best_ms:.4f} ms) of {len(candidates)} configs in "
                   f"{time.perf_counter() - start:.1f} s")
        return best, best_ms


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in an argument or a host function's result: one, or lists and tuples of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def call_key(args, kwargs) -> tuple:
    """A call's in-memory key: each tensor's dtype, sizes, strides and device, each other value's
    type, and the keywords' names (``out=`` aside).  Flat and built in one loop, as it runs at every
    call (a tuple of tuples from a function per argument took twice as long): a tensor's four
    entries start with a torch.dtype, which no other entry is, so calls that differ keep apart."""
    key: tuple = ()
    for value in args:
        key += (value.dtype, value.shape, value.stride(), value.get_device()) \
            if isinstance(value, _Tensor) else (type(value),)
    if kwargs:
        for name, value in kwargs.items():
            if name != "out":
                key += (name, value.dtype, value.shape, value.stride(), value.get_device()) \
                    if isinstance(value, _Tensor) else (name, type(value))
    return key


def _brief(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())
