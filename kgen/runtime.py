"""Load generated modules and call them: the module cache, the ``Kernel`` object,
headerless specialization and the interpreter fallback.

Generated source is written to ``$KGEN_CACHE_DIR`` (default ``~/.cache/kgen``)
under its content hash and imported with importlib (``triton.jit`` reads kernel
source from files).  A ``Kernel`` call goes straight to the generated host
function (on the tensors' GPU; through ``kgen.grad`` where autograd records); errors
it raises about arguments come back as ``CallError``.
"""
from __future__ import annotations

import builtins
import hashlib
import importlib.machinery
import importlib.util
import inspect
import linecache
import os
import re
import signal
import sys
import threading
from pathlib import Path

import torch

from . import dtypes as D
from . import syntax as S
from .check import Arg, check_headerless_names, headerless_inputs, headerless_name, matmul_lhs_inputs
from .errors import CallError, KgenError, Span, SpecError, did_you_mean, notice, printable
from .files import abridged, display_path, folder_problem, held_signals, new_temp, read_regular
from .grad import call_recorded, needing_grad
from .parse import parse
from . import pipeline
from .pipeline import Generated, generate

_modules: dict[str, object] = {}
# each loaded module's path -> its linecache entry, the checked text (see load)
_checked_lines: dict[str, tuple] = {}
_lock = threading.Lock()
_announced = False


def _fresh_locks() -> None:
    """In a forked child, a lock another thread of the parent held stays held: a new one."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):   # POSIX's
    os.register_at_fork(after_in_child=_fresh_locks)


def cache_dir() -> Path:
    """$KGEN_CACHE_DIR, ``~`` expanded as a shell would (the variable may come quoted, from a
    config file) and a relative path taken from the current folder, or ``~/.cache/kgen``."""
    try:
        return Path(os.environ.get("KGEN_CACHE_DIR") or Path.home() / ".cache" / "kgen").expanduser().absolute()
    except RuntimeError as e:   # ~user of no such user, or no home folder to find
        raise KgenError(f"cannot find the module cache's folder (set KGEN_CACHE_DIR to a folder): {e}") from None


def use_interpreter_if_no_gpu() -> bool:
    """Without a CUDA device, run kernels on Triton's interpreter (said once, on stderr)."""
    global _announced
    if torch.cuda.is_available():
        return False
    if os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
    _interpret_triton_library()
    if not _announced:
        _announced = True
        notice("kgen: no CUDA device; kernels run on Triton's interpreter (TRITON_INTERPRET=1)")
    return True


def _interpret_triton_library() -> None:
    """Triton chooses compiled or interpreted functions as it decorates them: where it was
    imported before ``TRITON_INTERPRET`` was set (``import triton`` ahead of kgen), its own
    library (``tl.cdiv``, ``tl.sum``, ``tl.zeros``, ...) holds compiled functions, which an
    interpreted kernel cannot call.  Rewrap those as Triton would have under the
    interpreter; nothing else can run them on a machine without a CUDA device."""
    owners = [module for name, module in list(sys.modules.items())
              if module is not None and (name == "triton.language" or name.startswith("triton.language."))]
    if not owners:
        return   # Triton is not imported yet: it will decorate for the interpreter
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    import triton.language as tl

    wrapped: dict[int, InterpretedFunction] = {}
    for owner in owners + [tl.tensor]:
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                if id(value) not in wrapped:
                    wrapped[id(value)] = InterpretedFunction(value.fn)
                setattr(owner, name, wrapped[id(value)])


def _shown(path: Path) -> str:
    """A cache path in a message: one line (a newline or an escape in KGEN_CACHE_DIR escaped), its ends if long."""
    return printable(abridged(str(path), 120))


def load(source: str):
    """Import generated source through the on-disk cache; one module per content hash."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    with _lock:
        if digest in _modules:
            return _modules[digest]
        use_interpreter_if_no_gpu()
        directory = cache_dir()
        path = directory / f"kgen_{digest[:24]}.py"
        try:   # not a regular file (a FIFO would block the read) is not intact either: replaced
            expected = source.encode("utf-8")
            intact = read_regular(path, limit=len(expected) + 1) == expected
        except (OSError, KgenError):
            intact = False
        try:
            if not intact:
                directory.mkdir(parents=True, exist_ok=True)
                write_atomic(path, source)
        except IsADirectoryError:   # never removed: a folder is no entry kgen wrote
            raise KgenError(f"the module cache entry {_shown(path)} is a folder: remove it, or set KGEN_CACHE_DIR "
                            f"to another folder") from None
        except OSError as e:
            why = folder_problem(directory) or e.strerror or e
            raise KgenError(f"cannot write the module cache in {_shown(directory)} (set KGEN_CACHE_DIR to a "
                            f"writable folder): {why}") from None
        name = f"kgen_generated_{digest[:24]}"
        # Triton reads a kernel's source back through inspect (at @triton.jit, and the interpreter
        # at its first call): from linecache, seeded with the checked text for good (mtime None:
        # never checked against the file), never from the file, which may have changed since
        linecache.cache[str(path)] = _checked_lines[str(path)] = (len(source), None, source.splitlines(True),
                                                                  str(path))
        # compiled from the source just checked, never from a __pycache__ file beside it
        spec = importlib.util.spec_from_file_location(name, path, loader=_SourceLoader(name, str(path), source))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[digest] = module
        return module


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """Loads a cached module from the text kgen generated (the file holds the same text,
    for inspect and Triton to read back)."""

    def __init__(self, name: str, path: str, source: str):
        super().__init__(name, path)
        self.source = source

    def get_code(self, fullname):
        return builtins.compile(self.source, self.path, "exec", dont_inherit=True)   # kgen.compile is ours


def write_atomic(path: Path, text: str) -> None:
    """Write by temp file and rename: readers see the old file or the new one, never half.
    Ctrl-C or SIGTERM during the write comes once it is over (``held_signals``): no temp file
    is left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the folder the system reached: '..' after a symlinked folder leads out of the folder linked to
    folder = os.path.realpath(path.parent)
    with held_signals(signal.SIGINT, signal.SIGTERM):
        fd, tmp = new_temp(folder, ".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            os.replace(tmp, os.path.join(folder, path.name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


# Each pattern as messages name its kernels ("it is an elementwise kernel")
KINDS = {"elementwise": "an elementwise", "row_reduce": "a row-reduction", "gemm": "a GEMM",
         "grouped_gemm": "a grouped GEMM"}


class Kernel:
    """A compiled spec kernel.  Call it with tensors (positionally, in order of first
    appearance, or by name) and ``out=`` optionally; ``.source`` is the Triton it runs."""

    def __init__(self, generated: Generated, index: int, origin: tuple):
        plan, kir = generated.plans[index], generated.kernels[index]
        self._origin = origin     # (function, arguments) that make it again: how it copies and pickles
        self.name = kir.name
        self.ir = kir
        self.pattern = plan.pattern
        self.source = generated.source
        self.module = load(generated.source)
        self.inputs = tuple(p.name for p in kir.params)
        self.outputs = tuple(o.name for o in kir.outputs)
        self._host = getattr(self.module, kir.name)
        self._signature = f"{kir.name}({', '.join(self.inputs)})"
        self._argument_error = self.module.ArgumentError
        self._not_current = self.module.NotCurrentDevice
        tuning = getattr(plan, "tuning", None)     # patterns with configs to time (gemm)
        self._tuner = None
        if tuning is not None and tuning.configs:
            from .autotune import Tuner
            self._tuner = Tuner(self._host, tuning, self.source, kir.name, checked=self.module._Checked)
        # a grouped GEMM's second calling form (see kgen/patterns/grouped_gemm.py)
        self._moe_host = getattr(self.module, f"{kir.name}_moe") if getattr(plan, "moe", False) else None
        self._moe_why = getattr(plan, "moe_why", "") or f"it is {KINDS[plan.pattern]} kernel, not a grouped GEMM"
        self._moe_label, self._moe_signature = f"{kir.name}.moe", f"{kir.name}.moe({', '.join(self.inputs)}, *, offs)"
        if use_interpreter_if_no_gpu():
            self._run = _untraced(_one_at_a_time(self._run, self.module.__file__))
        elif not getattr(plan, "traced", True):
            # torch.compile runs these calls as they are (a graph break): it cannot trace Triton's
            # interpreter, nor a grouped GEMM's host code in good time
            self._run = _untraced(self._run)
        self._moe_tuner = None
        moe_tuning = getattr(plan, "moe_tuning", None)
        if moe_tuning is not None and moe_tuning.configs:
            from .autotune import Tuner
            self._moe_tuner = Tuner(self._moe_host, moe_tuning, self.source, f"{kir.name}_moe",
                                    checked=self.module._Checked)

    def __call__(self, *args, **kwargs):
        if kwargs and kwargs.get("config", 0) is None:   # no config, as every kernel takes it (row ones too)
            del kwargs["config"]
        return self._run(self._host, self._tuner, self.name, self._signature, args, kwargs)

    def _run(self, host, tuner, label: str, signature: str, args, kwargs):
        out = kwargs.get("out")
        if out is not None:
            _check_writable(label, out)
        needing = needing_grad(label, args, kwargs)
        if needing:
            return call_recorded(label, lambda: self._call(host, tuner, label, signature, args, kwargs), needing, out)
        result = self._call(host, tuner, label, signature, args, kwargs)
        if out is not None and not torch.compiler.is_compiling():
            _written(out)
        return result

    def _call(self, host, tuner, label: str, signature: str, args, kwargs):
        """Call a generated host function with the tuner's config; its argument errors
        (and a call that does not bind) come back as CallError; tensors on a GPU other than the
        current one run there, as torch's operations do (Triton launches on the current one)."""
        try:
            config = None if tuner is None else tuner.choose(args, kwargs)
            if config is None:
                return host(*args, **kwargs)
            return host(*args, config=config, **kwargs)
        except self._not_current as e:
            if tuner is not None:
                tuner.forget()
            if e.device.index == torch.cuda.current_device():   # under torch.cuda.device(e.device) already
                raise CallError(f"{label}: {e}") from None
            device = e.device
        except self._argument_error as e:
            if tuner is not None:
                tuner.forget()   # the tuner's decision for a refused call must not stand for a good one
            raise CallError(f"{label}: {e}") from None
        except Exception as e:
            if tuner is not None:
                tuner.forget()
            if isinstance(e, TypeError) and e.__traceback__.tb_next is None:  # raised binding the arguments
                if "config" in kwargs and "config" not in inspect.signature(host).parameters:   # row reductions
                    raise CallError(f"{label}: config: {KINDS[self.pattern]} kernel takes no config (its host "
                                    f"picks the launch per call)") from None
                raise CallError(f"{signature}: {e}") from None
            if "config" in kwargs and not isinstance(e, torch.OutOfMemoryError):   # a config the host or Triton refused
                raise CallError(f"{label}: config={kwargs['config']!r} does not fit this kernel "
                                f"({type(e).__name__}: {_reason(e)})") from None
            raise
        with torch.cuda.device(device):
            return self._call(host, tuner, label, signature, args, kwargs)

    def moe(self, *args, offs=None, **kwargs):
        """A grouped GEMM in the MoE layout (as ``torch._grouped_mm(A, B, offs=offs)``): each
        list parameter is one tensor, its problems' rows stacked (``[T, ...]``, problem g
        owning rows ``offs[g - 1]`` to ``offs[g]``) when its per-problem shape starts with M,
        else its problems stacked (``[G, ...]``); returns the outputs' ``[T, N]`` tensors."""
        if self._moe_host is None:
            raise CallError(f"{self.name}: no MoE form: {self._moe_why}")
        if offs is None:
            raise CallError(f"{self.name}.moe: missing offs=, where each problem's rows end"
                            f"{_offs_hint(args, self.inputs)}")
        if kwargs.get("config", 0) is None:   # no config, as __call__ takes it
            del kwargs["config"]
        kwargs["offs"] = offs
        return self._run(self._moe_host, self._moe_tuner, self._moe_label, self._moe_signature, args, kwargs)

    def __repr__(self) -> str:
        return f"<kgen.Kernel {self.name}({', '.join(self.inputs)}) -> {', '.join(self.outputs)}: {self.pattern}>"

    def __reduce__(self):
        return self._origin


def _offs_hint(args, inputs) -> str:
    """Where offs came as one more positional argument: that it is keyword-only."""
    return f" (offs is keyword-only; {len(args)} arguments came for {len(inputs)} inputs)" \
        if len(args) > len(inputs) else ""


class HeaderlessKernel:
    """A kernel from bare statements: types come from each call.  Each combination of
    input dtypes, ranks and size-1 axes is generated once; sizes stay runtime values."""

    def __init__(self, text: str, path: str):
        self.text, self.path = text, path
        module = parse(text, path)
        self._syntax = module.kernels[0]
        self.inputs, self.outputs = headerless_inputs(self._syntax)
        check_headerless_names(self._syntax)
        self.name = headerless_name(self.outputs)
        self._lhs = matmul_lhs_inputs(self._syntax)
        self._kernels: dict[tuple, Kernel] = {}
        self._last: Kernel | None = None
        if use_interpreter_if_no_gpu():   # nor the setting up of the interpreter as it generates one
            self._specialize = _untraced(self._specialize)

    def __call__(self, *args, out=None, config=None, **kwargs):
        try:
            kernel, args = self._kernel_for(args, kwargs)
        except CallError as e:   # named as the generated kernel's own errors are
            raise CallError(f"{self.name}: {e}") from None
        self._last = kernel
        try:
            return kernel(*args, out=out, **_given(config))
        except CallError as e:   # a list whose problems broadcast differently: what its kernel took
            mixed = _mixed_ones(self.inputs, args, str(e))
            if mixed is None:
                raise
            raise CallError(f"{e} ({mixed})") from None

    def _kernel_for(self, args, kwargs) -> tuple[Kernel, tuple]:
        """The kernel for these arguments (generated at the first call of its key), and the
        arguments in input order."""
        args = self._bind(args, kwargs)
        if len(args) != len(self.inputs):
            raise CallError(f"expected {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(args)}")
        try:
            key = tuple((a.dtype, tuple(s == 1 for s in a.shape)) if isinstance(a, torch.Tensor) else
                        _list_key(a) if isinstance(a, (list, tuple)) else _number_key(a) for a in args)
        except RuntimeError:   # torch has no sizes for it: a nested tensor
            raise CallError(_nested_input(self.inputs, args)) from None
        kernel = self._kernels.get(key)
        if kernel is None:
            grouped = any(isinstance(a, (list, tuple)) for a in args)
            kernel = (_untraced(self._specialize) if grouped else self._specialize)(key, args)
        return kernel, args

    def moe(self, *args, offs=None, out=None, config=None, **kwargs):
        """The grouped GEMM of these statements in the MoE layout (see ``Kernel.moe``).  The
        call decides what each tensor is: rank 3, problems stacked ``[G, ...]``; rank 2,
        rows stacked ``[T, ...]`` when it has as many rows as the matmul's left operand
        (the first 2-D input it reads), else problems stacked; rank 0 or 1, problems stacked."""
        try:
            kernel, args, key = self._moe_kernel_for(args, kwargs, offs)
        except CallError as e:
            raise CallError(f"{self.name}: {e}") from None
        self._last = kernel
        try:
            return kernel.moe(*args, offs=offs, out=out, **_given(config))
        except CallError as e:   # a tensor of the wrong shape as read: how the call's tensors were read
            if ", got shape (" not in str(e):
                raise
            raise CallError(f"{e} (the MoE form read {self._moe_reading(args, key)})") from None

    def _moe_kernel_for(self, args, kwargs, offs) -> tuple[Kernel, tuple, tuple]:
        """``moe``'s kernel for these arguments, the arguments in input order, and its key."""
        if offs is None:
            raise CallError(f"moe: missing offs=, where each problem's rows end{_offs_hint(args, self.inputs)}")
        args = self._bind(args, kwargs)
        if len(args) != len(self.inputs):
            raise CallError(f"expected {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(args)}")
        if _has_nested(args):
            raise CallError(_nested_input(self.inputs, args))
        named = [(name, a) for name, a in zip(self.inputs, args) if isinstance(a, torch.Tensor) and a.dim() == 2]
        first = next((a for name, a in named if name in self._lhs), named[0][1] if named else None)
        if first is None:
            raise CallError("moe: expected a 2-D tensor whose rows are the problems' rows (A: [T, K])")
        groups = len(offs) if isinstance(offs, (list, tuple)) else \
            offs.shape[0] if isinstance(offs, torch.Tensor) and offs.dim() == 1 and not offs.is_nested else None
        rows = first.shape[0]
        key = []
        for name, a in zip(self.inputs, args):
            if isinstance(a, (list, tuple)):
                raise CallError(f"moe: {name}: expected a tensor (the MoE form stacks the problems in one), "
                                f"got {type(a).__name__}")
            if not isinstance(a, torch.Tensor):
                key.append(_number_key(a))
                continue
            ragged = a.dim() == 2 and a.shape[0] == rows
            if ragged and a is not first and rows == groups:
                raise CallError(f"moe: {name} has as many rows as problems ({rows}): it could be stacked rows "
                                f"or one row per problem; declare the kernel with list types")
            ones = (False,) + tuple(s == 1 for s in a.shape[1:]) if ragged else tuple(s == 1 for s in a.shape[1:])
            key.append((a.dtype, ones, True))
        key = tuple(key)
        kernel = self._kernels.get(key)
        if kernel is None:
            try:
                kernel = _untraced(self._specialize)(key, args, explain=False)
            except SpecError as e:   # say how the call's tensors were read, which the spec cannot show
                where = f"{e.span}: " if e.span is not None else ""
                raise CallError(f"moe: {where}{e.message} (the MoE form read {self._moe_reading(args, key)})") \
                    from None
        return kernel, args, key

    def __reduce__(self):
        return HeaderlessKernel, (self.text, self.path)

    def _moe_reading(self, args, key) -> str:
        """How ``moe`` read each tensor: ragged (its key keeps every axis) or stacked (one per problem)."""
        return "; ".join(f"{name} {tuple(a.shape)} as " + ("the problems' rows" if len(k[1]) == a.dim() else
                                                          f"one {tuple(a.shape[1:])} per problem")
                         for name, a, k in zip(self.inputs, args, key) if isinstance(a, torch.Tensor))

    def _bind(self, args, kwargs):
        if not kwargs:
            return args
        bound = list(args) + [_MISSING] * (len(self.inputs) - len(args))   # (None given is a bad value)
        for name, value in kwargs.items():
            if name not in self.inputs:
                raise CallError(f"unknown input '{name}'; the inputs are {', '.join(self.inputs)}")
            i = self.inputs.index(name)
            if i < len(args):
                raise CallError(f"input '{name}' given twice")
            bound[i] = value
        missing = [n for n, v in zip(self.inputs, bound) if v is _MISSING]
        if missing:
            raise CallError(f"missing input(s): {', '.join(missing)}")
        return tuple(bound)

    def _specialize(self, key, args, explain: bool = True) -> Kernel:
        """The kernel for the types of ``key``, which the call's ``args`` gave; ``explain``: a
        SpecError names those types (moe says how it read the tensors instead)."""
        types = []
        for name, k, a in zip(self.inputs, key, args):
            if k is _EMPTY_LIST:
                raise CallError(f"{name}: expected a list of tensors (one per problem), got an empty list")
            if isinstance(k, tuple):
                if k[0] not in D.BY_TORCH:
                    raise CallError(f"{name}: dtype {k[0]} is not supported "
                                    f"(use {', '.join(d.name for d in D.BY_NAME.values())})")
                if len(k[1]) > 4:
                    raise CallError(f"{name}: tensors of rank {len(k[1])} are not supported (at most 4)")
                types.append(Arg(D.BY_TORCH[k[0]], k[1], is_list=len(k) > 2))
            elif k in (bool, int, float):
                types.append(Arg({bool: D.BOOL, int: D.I32, float: D.F32}[k], None))
            elif isinstance(a, (list, tuple)):   # a list whose first problem is not a tensor
                raise CallError(f"{name}[0]: expected a tensor (one per problem), got {_type_name(type(a[0]))}")
            else:
                raise CallError(f"{name}: expected a tensor or a Python number, got {_type_name(k)}")
        try:
            generated = generate(self.text, self.path, {self._syntax.name.id: tuple(types)})
        except SpecError as e:
            if not explain or all(a is None for a in args):   # an example's or a pickled kernel's types
                raise
            # the spec is fine, the types this call gave it are not: say which they were
            given = ", ".join(f"{name}: {_call_type(t, a)}" for name, t, a in zip(self.inputs, types, args))
            raise type(e)(f"{e.message} (types from this call: {given})", e.span) from None
        kernel = Kernel(generated, 0, (_specialized, (self.text, self.path, key)))
        self._kernels[key] = kernel
        return kernel

    def _example(self) -> Kernel:
        """Before any call: the kernel for f32 inputs of rank 2 (or 1, or 3), bool where an input
        is a ``where``'s condition as it is."""
        conditions = {e.args[0].id for stmt in self._syntax.body for e, _ in S.walk(stmt.value)
                      if isinstance(e, S.Call) and e.func.id == "where" and e.args and isinstance(e.args[0], S.Name)}
        errors = []
        for rank in (2, 1, 3):
            key = tuple((torch.bool if name in conditions else torch.float32, (False,) * rank) for name in self.inputs)
            try:
                return self._kernels.get(key) or self._specialize(key, [None] * len(self.inputs))
            except KgenError as e:
                errors.append(e)
        raise errors[0]

    @property
    def source(self) -> str:
        """The Triton source of the last call's kernel (or of an f32 example before any call)."""
        return (self._last or self._example()).source

    @property
    def pattern(self) -> str:
        return (self._last or self._example()).pattern

    @property
    def ir(self):
        """The typed IR of the last call's kernel (or of an f32 example before any call)."""
        return (self._last or self._example()).ir

    def __repr__(self) -> str:
        return f"<kgen.Kernel ({', '.join(self.inputs)}) -> {', '.join(self.outputs)}: {self.text!r}>"


_EMPTY_LIST = ("empty list",)


def _one_at_a_time(fn, path: str):
    """``fn`` holding ``pipeline.python_lock`` (Triton's interpreter: one launch at a time), with
    numpy's floating-point warnings off: the interpreter computes masked lanes too (the log of a
    padding 0), whose warnings say nothing of the call's values, as a GPU would not.  The
    interpreter reads a kernel's source at its first call: the module's checked text is put back
    in linecache first where something cleared it (``linecache.clearcache()``, as torch's
    inductor calls), so that the file, which may have changed since, is never read."""
    import numpy   # the interpreter's own arrays

    def serialized(*args, **kwargs):
        with pipeline.python_lock, numpy.errstate(all="ignore"):
            if path not in linecache.cache and path in _checked_lines:
                linecache.cache[path] = _checked_lines[path]
            return fn(*args, **kwargs)
    return serialized


def _tensors(value):
    """The tensors of an ``out=`` (a tensor, or tuples and lists of them, as grouped outputs are)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _check_writable(label: str, out) -> None:
    """An inference tensor takes writes only in inference mode, as torch's out= operations say."""
    if not torch.is_inference_mode_enabled() and any(t.is_inference() for t in _tensors(out)):
        raise CallError(f"{label}: out: expected a tensor that may be written here, got an inference tensor "
                        f"(made under torch.inference_mode()), which takes writes only inside it")


def _written(out) -> None:
    """Each ``out=`` tensor's version moves on, as torch's out= operations move it: a backward pass
    that saved one before it was written refuses, rather than using the new values."""
    for t in _tensors(out):
        if not t.is_inference():
            torch.autograd.graph.increment_version(t)


def _untraced(fn):
    """``fn`` as torch.compile runs it: as it is (a graph break), not traced (see Kernel)."""
    return torch.compiler.disable(fn)


def _given(config) -> dict:
    """config= as the generated host function takes it: passed on only when the call gives one
    (a row reduction's host has none to take)."""
    return {} if config is None else {"config": config}


def _number_key(value):
    """A Python number's kind (bool, int or float), subclasses included as the host function
    takes them (numpy's float64 is a float); any other value's own type, for the error."""
    return bool if isinstance(value, bool) else int if isinstance(value, int) else \
        float if isinstance(value, float) else type(value)


def _has_nested(values) -> bool:
    """Whether a value (or a problem of a list) is a nested tensor, which has no sizes to key by."""
    return any(isinstance(v, torch.Tensor) and v.is_nested or
               isinstance(v, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.is_nested for t in v)
               for v in values)


def _nested_input(names, args) -> str:
    """The message for a call with a nested tensor: the first one's name (and index, in a list)."""
    for name, a in zip(names, args):
        for label, t in [(name, a)] if isinstance(a, torch.Tensor) else \
                [(f"{name}[{i}]", t) for i, t in enumerate(a)] if isinstance(a, (list, tuple)) else []:
            if isinstance(t, torch.Tensor) and t.is_nested:
                return f"{label}: expected a dense tensor, got a nested one"
    return "expected dense tensors, got one without sizes"


def _mixed_ones(inputs, args, message: str) -> str | None:
    """Where ``message`` refuses a size of 1 in an element of a list whose tensors have size 1 on
    an axis in some problems only: that the kernel for these lists broadcasts along an axis only
    where every problem has size 1 (``_list_key``)."""
    for name, values in zip(inputs, args):
        if isinstance(values, (list, tuple)) and re.search(rf"(^|: ){re.escape(name)}\[\d+\]: expected .*, got 1$",
                                                           message) and \
                all(isinstance(t, torch.Tensor) for t in values):
            for axis in range(min(t.dim() for t in values)):
                ones = [t.shape[axis] == 1 for t in values]
                if any(ones) and not all(ones):
                    return (f"{name}'s axis {axis} has size 1 in some problems only: a list broadcasts along an "
                            f"axis where every problem has size 1")
    return None


def _list_key(values):
    """A list of tensors (a grouped GEMM's problems): dtype of the first, the axes of size 1
    in every one, and a mark that it is a list.  Mixed dtypes are the host's to report."""
    if not values:
        return _EMPTY_LIST
    first = values[0]
    if not isinstance(first, torch.Tensor):
        return type(values)
    ones = tuple(all(isinstance(t, torch.Tensor) and t.dim() > ax and t.shape[ax] == 1 for t in values)
                 for ax in range(first.dim()))
    return first.dtype, ones, True


class NoSuchKernel(CallError, AttributeError, KeyError):
    """A name that is no kernel of the spec: a CallError, and the error a lookup raises (so
    ``hasattr``, ``getattr(ks, name, None)`` and ``ks.get(name)`` keep working)."""

    __str__ = Exception.__str__   # KeyError's would print the message quoted


class Kernels(dict):
    """The kernels of a spec file with several, by name (``ks.softmax`` or ``ks["softmax"]``).
    A kernel named like a dict method (``get``, ``values``) is what ``ks.get`` gives, so that
    ``ks.get(x)`` runs it rather than looking ``x`` up."""

    def __getattribute__(self, name):
        if name in _DICT_METHODS and dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        return super().__getattribute__(name)

    def __getattr__(self, name):
        if name.startswith("__"):   # copy, pickle and friends look for dunders that are not there
            raise AttributeError(name)
        return self[name]

    def __missing__(self, name):
        raise NoSuchKernel(f"no kernel {name!r} in this spec; it defines {', '.join(self)}"
                           + (did_you_mean(name, self) if isinstance(name, str) else ""))

    def __call__(self, *args, **kwargs):
        raise CallError(f"this spec defines several kernels ({', '.join(self)}): call one of them, "
                        f"e.g. ks.{next(iter(self))}(...) or ks[{next(iter(self))!r}](...)")

    def __reduce__(self):   # the spec once, not once per kernel
        text, path, _ = next(iter(dict.values(self)))._origin[1]
        return compile_text, (text, path)


_DICT_METHODS = frozenset(name for name in dir(dict) if not name.startswith("_"))


SPEC_LIMIT = 1 << 24     # characters of a spec file: more is no spec, and could be more than memory holds


def path_argument(value, name: str) -> Path:
    """A path argument as a Path, else a CallError: a PathLike of bytes, an empty path (Path("")
    is the working folder), or a NUL in the name (which no file system takes: Python's os calls
    raise ValueError on it)."""
    path = os.fspath(value)
    if not isinstance(path, str):
        raise CallError(f"{name}: expected a str or os.PathLike path of str, got a path of {type(path).__name__}")
    if not path:
        raise CallError(f"{name}: expected a path, got an empty string")
    if "\0" in path:
        raise CallError(f"{name}: a path cannot hold a NUL character, got {path!r}")
    return Path(path)


def read_spec(text_or_path: str | os.PathLike) -> tuple[str, str]:
    """(text, path) for a spec given as a path or as text."""
    if isinstance(text_or_path, os.PathLike) or isinstance(text_or_path, str) and _names_a_file(text_or_path):
        path = path_argument(text_or_path, "path")
        try:
            raw = read_regular(path, "a spec file", limit=SPEC_LIMIT + 1)
        except FileNotFoundError:
            raise KgenError(f"{display_path(path)}: no such spec file") from None
        except OSError as e:   # a name too long is shown by its ends
            raise KgenError(f"{abridged(display_path(path))}: cannot read the spec ({e.strerror or e})") from None
        if len(raw) > SPEC_LIMIT:
            raise KgenError(f"{display_path(path)}: cannot read the spec: it is longer than {SPEC_LIMIT} bytes")
        # a byte-order mark, as Windows editors save one, is no character of the spec
        raw = raw.removeprefix(b"\xef\xbb\xbf")
        try:
            return raw.decode("utf-8"), display_path(path)
        except UnicodeDecodeError as e:
            raise _not_utf8(raw, e, display_path(path)) from None
    if not isinstance(text_or_path, str):   # str(None) would be a spec that reads None
        raise CallError(f"expected spec text (a str) or a path to a .k file, got {type(text_or_path).__name__}")
    return text_or_path, "<string>"


def _not_utf8(raw: bytes, error: UnicodeDecodeError, path: str) -> SpecError:
    """The error for a spec file that is not UTF-8, at the first byte that is not."""
    start = raw.rfind(b"\n", 0, error.start) + 1
    line = raw.count(b"\n", 0, error.start) + 1
    col = len(raw[start:error.start].decode("utf-8", "replace")) + 1
    text = raw.decode("utf-8", "replace")
    return SpecError(f"byte {raw[error.start]:#04x} is not UTF-8: save the spec as UTF-8",
                     Span(path, line, col, line, col + 1, text))


def _names_a_file(text: str) -> bool:
    """One line, not empty and not a comment, that ends in .k or holds no statement (= or ;)."""
    if "\n" in text or not text.strip() or text.lstrip().startswith("#"):
        return False
    return text.endswith(".k") or ("=" not in text and ";" not in text)


def compile(text_or_path):  # noqa: A001 - the public name
    """Compile a spec (text or a path to a ``.k`` file) into a callable kernel."""
    return compile_text(*read_spec(text_or_path))


def compile_text(text: str, path: str):
    """``compile`` for spec text whose path (for messages) is known."""
    from .autotune import enabled
    enabled()   # KGEN_AUTOTUNE, read as a kernel is compiled: a typo is an error for every kernel, tuned or not
    module = parse(text, path)
    if len(module.kernels) == 1 and module.kernels[0].headerless:
        if not module.kernels[0].body:
            raise SpecError("the spec has no statements: write one such as Y = X * 2", module.kernels[0].span)
        return HeaderlessKernel(text, path)
    generated = generate(text, path)   # schedules alone: an error at the first one's kernel name
    kernels = [Kernel(generated, i, (_declared, (text, path, i))) for i in range(len(generated.plans))]
    return kernels[0] if len(kernels) == 1 else Kernels((k.name, k) for k in kernels)


# Kernels copy and pickle as their specs (a model holding them is deep-copied for an EMA, saved
# whole, sent to a spawned worker): these make them again, from the module cache where it holds them.

def _declared(text: str, path: str, index: int) -> Kernel:
    generated = generate(text, path)
    return Kernel(generated, index, (_declared, (text, path, index)))


_MISSING = object()   # an input no argument gave


def _type_name(kind: type) -> str:
    """A type as a message names it: numpy's float32 is "numpy.float32", not a torch dtype's name."""
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _call_type(arg: Arg, value) -> str:
    """What a call gave a headerless kernel's input, as its types came from it."""
    if arg.ones is None:
        return f"a Python {type(value).__name__} ({arg.dtype.name})"
    tensor = f"{'an' if arg.dtype.name[0] in 'fi' else 'a'} {arg.dtype.name} tensor of rank {len(arg.ones)}"
    return f"a list whose first is {tensor}" if arg.is_list else tensor


def _specialized(text: str, path: str, key: tuple) -> Kernel:
    """A headerless kernel's specialization for ``key``, a key its calls made (so it is valid)."""
    return HeaderlessKernel(text, path)._specialize(key, (None,) * len(key))


def build(path: str | os.PathLike, out_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Generate ``<out_dir>/<stem>.py`` (default ``generated/``) from a ``.k`` file, atomically,
    with ``kgen build``'s checks: a file kgen did not generate is overwritten only with
    ``force=True``; an ``out_dir`` that is a file or a module's path, or a target that is a
    folder, is a KgenError, as is a failed write."""
    from .targets import check_out_name, write_problems, write_target   # here: kgen.targets imports this module
    for name, value in (("path", path), ("out_dir", out_dir)):
        if not isinstance(value, (str, os.PathLike)) and not (name == "out_dir" and value is None):
            raise CallError(f"{name}: expected a str or os.PathLike path, got {type(value).__name__}")
    path = path_argument(path, "path")
    out = Path("generated") if out_dir is None else path_argument(out_dir, "out_dir")
    check_out_name(out, "out_dir")
    text, shown = read_spec(path)
    generated = generate(text, shown, out=str(out))
    target = out / (Path(path).stem + ".py")
    problems = write_problems(out, [target], force, "pass force=True", [Path(path)])
    if problems:
        raise KgenError("; ".join(problems))
    write_target(target, generated.source)
    return target


def _reason(error: BaseException) -> str:
    """One line saying why a launch failed.  Triton's CompilationError prints where it
    failed first ("at 12:30:" and the source lines) and why last (its ``error_message``), or
    leaves the why to the error it chains (a failure inside a called jit function)."""
    while hasattr(error, "error_message") and not error.error_message and error.__cause__ is not None:
        error = error.__cause__
    why = getattr(error, "error_message", None) or str(error)
    return (str(why).strip().splitlines() or [""])[0][:200]
