"""Calls: a bad call is a CallError that names the argument, what was expected and what
was given, raised before any launch; compile() by text or path; the module cache."""
from __future__ import annotations

import collections
import copy
import itertools
import os
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kgen
from kgen.errors import CallError, KgenError, SpecError
from kgen.files import display_path
from kgen.pipeline import generate
from kgen.reference import evaluate
from kgen.runtime import Kernels

from conftest import DEVICE, examples

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bias_gelu():
    return kgen.compile(ROOT / "specs" / "bias_gelu.k")


@pytest.fixture(scope="module")
def act():
    return kgen.compile("kernel act(X: f16[N], alpha: f32 = 0.2, n: i32 = 2) -> Y: f16[N] {\n"
                        "    Y = leaky_relu(X, alpha) * n\n}\n")


def x16(*shape):
    return torch.randn(*shape, device=DEVICE).half()


BAD_DECLARED = [
    # (args, kwargs, fragments the message must hold)
    ((x16(4, 8),), {}, ["bias_gelu", "missing", "'bias'"]),
    ((x16(4, 8), x16(8), x16(8)), {}, ["takes 2 positional arguments but 3 were given"]),
    ((x16(4, 8).float(), x16(8)), {}, ["x:", "expected f16[M, N]", "torch.float32", "(4, 8)"]),
    ((x16(4, 8), x16(1, 8)), {}, ["bias:", "expected f16[N]", "shape (1, 8)"]),
    ((x16(4, 8, 1), x16(8)), {}, ["x:", "expected f16[M, N]", "shape (4, 8, 1)"]),
    ((x16(4, 8), x16(7)), {}, ["bias:", "f16[N] = [8]", "from x", "got shape (7,)"]),
    ((x16(4, 8), [1.0] * 8), {}, ["bias:", "expected a tensor f16[N]", "got list"]),
    ((x16(4, 8), 1.0), {}, ["bias:", "expected a tensor f16[N]", "got float"]),
    ((x16(4, 8),), {"bias": x16(8), "z": 1}, ["unexpected keyword argument 'z'"]),
    ((x16(4, 8), x16(8)), {"bias": x16(8)}, ["multiple values for argument 'bias'"]),
    ((x16(4, 8), x16(8)), {"out": torch.empty(4, 8, device=DEVICE)}, ["out (y)", "torch.float16", "torch.float32"]),
    ((x16(4, 8), x16(8)), {"out": x16(3, 8)}, ["out (y): expected f16[M, N] = [4, 8], got shape (3, 8)"]),
    ((x16(4, 8), x16(8)), {"out": (x16(4, 8), x16(4, 8))}, ["out: expected 1 tensor(s), got 2"]),
]


@pytest.mark.parametrize("args, kwargs, fragments", BAD_DECLARED)
def test_bad_calls_of_a_declared_kernel(bias_gelu, watch, args, kwargs, fragments):
    launches = watch(bias_gelu.module)
    with pytest.raises(CallError) as info:
        bias_gelu(*args, **kwargs)
    for f in fragments:
        assert f in str(info.value)
    assert launches.count == 0


@pytest.mark.parametrize("args, kwargs, fragments", [
    ((x16(5), torch.tensor(0.5)), {}, ["alpha:", "expected a Python float", "got torch.Tensor"]),
    ((x16(5), True), {}, ["alpha:", "got bool"]),
    ((x16(5), 0.5, 2.5), {}, ["n:", "expected a Python int", "got float"]),
    ((x16(5), "0.5"), {}, ["alpha:", "got str"]),
    ((x16(5),), {"n": torch.tensor(3)}, ["n:", "got torch.Tensor"]),
    ((x16(5), 0.5, 2**31), {}, ["n:", "expected an int32", "outside that range"]),
    ((x16(5), 0.5, -2**31 - 1), {}, ["n:", "expected an int32"]),
    ((x16(5), 10**400), {}, ["alpha:", "expected a Python float", "too large"]),
])
def test_bad_scalar_arguments(act, watch, args, kwargs, fragments):
    launches = watch(act.module)
    with pytest.raises(CallError) as info:
        act(*args, **kwargs)
    for f in fragments:
        assert f in str(info.value)
    assert launches.count == 0


def test_scalar_arguments_accept_python_numbers(act):
    x = x16(5)
    want = torch.where(x > 0, x.double(), x.double() * 0.5) * 3
    torch.testing.assert_close(act(x, 0.5, 3).double(), want.half().double(), atol=1e-3, rtol=2e-3)
    torch.testing.assert_close(act(x, 1, n=3).double(), (torch.where(x > 0, x.double(), x.double()) * 3).half()
                               .double(), atol=1e-3, rtol=2e-3)
    for n in (2**31 - 1, -2**31):     # the ends of int32 (the result overflows f16 to +-inf, as torch's does)
        torch.testing.assert_close(act(x, 0.5, n).double(), (torch.where(x > 0, x.double(), x.double() * 0.5) * n)
                                   .half().double(), atol=1e-3, rtol=2e-3)



def test_number_subclasses_are_python_numbers_in_every_calling_form(act):
    """numpy's float64 is a Python float and an IntEnum a Python int: the headerless form takes
    them as the declared form does (as runtime scalars), for the list and MoE forms too."""
    import enum

    import numpy

    class Three(enum.IntEnum):
        N = 3
    x = x16(5)
    want = act(x, 0.5, 3)
    torch.testing.assert_close(act(x, numpy.float64(0.5), Three.N), want)
    k = kgen.compile("Y = leaky_relu(X, alpha) * n")
    torch.testing.assert_close(k(x, numpy.float64(0.5), Three.N), want)
    torch.testing.assert_close(k(x, alpha=numpy.float64(0.5), n=Three.N), want)
    mm = kgen.compile("C = A @ B * s")
    a, b = torch.randn(4, 16, device=DEVICE), torch.randn(16, 8, device=DEVICE)
    torch.testing.assert_close(mm([a], [b], numpy.float64(2.0))[0], a @ b * 2, atol=1e-2, rtol=1e-2)   # TF32 on GPUs
    torch.testing.assert_close(mm.moe(a, b[None], numpy.float64(2.0), offs=[4]), a @ b * 2, atol=1e-2, rtol=1e-2)


HEADERLESS = "Y = X * sigmoid(X) + B"


@pytest.mark.parametrize("args, kwargs, fragments", [
    ((x16(4, 8),), {}, ["expected 2 inputs (X, B), got 1"]),
    ((x16(4, 8), x16(8), x16(8)), {}, ["expected 2 inputs (X, B), got 3"]),
    ((x16(4, 8), x16(8)), {"C": 1}, ["unknown input 'C'", "X, B"]),
    ((x16(4, 8), x16(8)), {"B": x16(8)}, ["input 'B' given twice"]),
    ((), {"X": x16(4, 8)}, ["missing input(s): B"]),
    ((x16(4, 8).double(), x16(8)), {}, ["X:", "torch.float64 is not supported"]),
    ((x16(4, 8).long(), x16(8)), {}, ["X:", "torch.int64 is not supported"]),
    ((torch.randn(1, 2, 1, 2, 1, device=DEVICE), x16(8)), {}, ["X:", "rank 5"]),
    ((x16(4, 8), "s"), {}, ["B:", "expected a tensor or a Python number, got str"]),
    ((x16(4, 8), None), {}, ["B:", "got NoneType"]),
    ((x16(4, 8),), {"B": None}, ["B:", "got NoneType"]),      # given, as None: not missing
    ((x16(4, 8), np.float32(2)), {}, ["B:", "got numpy.float32"]),   # not torch's float32
    ((x16(4, 8), x16(7)), {}, ["B:", "f16[N] = [8]", "from X", "got shape (7,)"]),
    ((x16(4, 8), x16(5, 8)), {}, ["B:", "got shape (5, 8)"]),
    ((x16(4, 8), x16(8)), {"out": torch.empty(4, 8, device=DEVICE)}, ["out (Y)", "torch.float16", "torch.float32"]),
])
def test_bad_calls_of_a_headerless_kernel(args, kwargs, fragments):
    k = kgen.compile(HEADERLESS)
    with pytest.raises(CallError) as info:
        k(*args, **kwargs)
    for f in fragments:
        assert f in str(info.value)


def test_a_python_bool_is_a_bool_number_of_a_headerless_kernel():
    """As torch takes True where a bool goes (a where's condition); arithmetic on a bool is a
    SpecError at its position, as for a bool tensor."""
    x = x16(4, 8)
    k = kgen.compile("Y = where(c, X, 0.0)")
    torch.testing.assert_close(k(True, x), x)
    torch.testing.assert_close(k(False, x), torch.zeros_like(x))
    with pytest.raises(SpecError, match="does not take bool"):
        kgen.compile(HEADERLESS)(x, True)


def test_headerless_mismatch_raises_before_any_launch(watch):
    k = kgen.compile(HEADERLESS)
    k(x16(4, 8), x16(8))
    launches = watch(k._last.module)
    with pytest.raises(CallError):
        k(x16(4, 8), x16(7))
    with pytest.raises(CallError):
        k(x16(4, 8), x16(8), out=x16(4, 7))
    assert launches.count == 0
    k(x16(4, 8), x16(8))
    assert launches.count == 1


def test_types_a_call_gives_that_the_spec_refuses_are_named(device):
    """A headerless kernel takes its types from the call: where the spec refuses them, the
    error at the spec says what the call gave (a list by its first tensor)."""
    x = torch.randn(3, device=device)
    with pytest.raises(SpecError, match=re.escape("got i32 (types from this call: c: a Python int (i32), "
                                                  "a: an f32 tensor of rank 1, b: an f32 tensor of rank 1)")):
        kgen.compile("y = where(c, a, b)")(1, x, x)
    a, b = torch.randn(5, 7, device=device).half(), torch.randn(7, 4, device=device)
    with pytest.raises(SpecError, match=re.escape("(types from this call: A: a list whose first is an f16 tensor "
                                                  "of rank 2, B: a list whose first is an f32 tensor of rank 2)")):
        kgen.compile("C = leaky_relu(A @ B)")([a, a], [b, b])
    # the call's dims named as a GEMM reads them, [M, K] @ [K, N]
    with pytest.raises(SpecError, match=re.escape("got f16[M, K] and f32[K, N]; cast one of them")):
        kgen.compile("C = A @ B")(a, b)
    with pytest.raises(SpecError, match=re.escape("got f16[L, M, K] and f32[K, N]; cast one of them")):
        kgen.compile("C = A @ B")(a.expand(2, 5, 7), b)


@pytest.mark.gpu
def test_tensors_on_different_devices():
    k = kgen.compile(HEADERLESS)
    with pytest.raises(CallError, match=r"B: expected a tensor on cuda"):
        k(torch.randn(4, 8, device="cuda"), torch.randn(8))
    d = kgen.compile(ROOT / "specs" / "vector_add.k")
    with pytest.raises(CallError, match=r"y:.*cuda"):
        d(torch.randn(8, device="cuda"), torch.randn(8))
    with pytest.raises(CallError, match=r"out \(z\)"):
        d(torch.randn(8, device="cuda"), torch.randn(8, device="cuda"), out=torch.empty(8))


def test_errors_are_kgen_errors():
    with pytest.raises(KgenError):
        kgen.compile(HEADERLESS)(1)
    assert issubclass(CallError, KgenError) and not issubclass(CallError, SpecError)


def test_compile_takes_text_a_path_string_or_a_path(monkeypatch):
    monkeypatch.chdir(ROOT)
    by_str = kgen.compile("specs/vector_add.k")
    by_path = kgen.compile(Path("specs/vector_add.k"))
    by_text = kgen.compile((ROOT / "specs" / "vector_add.k").read_text())
    assert by_str.name == by_path.name == by_text.name == "vector_add"
    assert "from specs/vector_add.k" in by_str.source
    assert "from <string>" in by_text.source
    x, y = torch.randn(7, device=DEVICE), torch.randn(7, device=DEVICE)
    for k in (by_str, by_path, by_text):
        torch.testing.assert_close(k(x, y), x + y)
    assert repr(by_str).startswith("<kgen.Kernel vector_add(x, y) -> z")


def test_a_file_with_several_kernels_gives_them_by_name(tmp_path):
    spec = tmp_path / "two.k"
    spec.write_text("kernel double(X: f32[N]) -> Y {\n    Y = X * 2\n}\n"
                    "kernel shift(X: f32[N], s: f32 = 1.0) -> Y {\n    Y = X + s\n}\n")
    ks = kgen.compile(spec)
    assert set(ks) == {"double", "shift"}
    x = torch.randn(6, device=DEVICE)
    torch.testing.assert_close(ks.double(x), x * 2)
    torch.testing.assert_close(ks["shift"](x), x + 1)
    assert ks.double.module is ks.shift.module          # one module for the file
    # a name that is no kernel: a CallError that says which are, and still a lookup's error
    for lookup in (lambda: ks.triple, lambda: ks["doubel"]):
        with pytest.raises(CallError, match="no kernel '(triple|doubel)' in this spec; it defines double, shift"):
            lookup()
    with pytest.raises(KeyError, match="did you mean 'double'"):
        ks["doubel"]
    assert getattr(ks, "triple", None) is None and ks.get("triple") is None and not hasattr(ks, "triple")
    with pytest.raises(CallError, match=r"several kernels \(double, shift\): call one of them, e.g. ks.double"):
        ks(x)


def test_kernels_named_like_dict_methods_are_what_their_names_give(tmp_path):
    """A file's kernels come as a dict: one named get, values or copy is what ks.get gives
    (ks.get(x) had been dict.get, None; ks.values(x) a TypeError), and ks["get"] too."""
    spec = tmp_path / "methods.k"
    spec.write_text("kernel get(x: f32[N]) -> y: f32[N] {\n    y = x * 2\n}\n"
                    "kernel values(x: f32[N]) -> y: f32[N] {\n    y = x * 3\n}\n")
    ks = kgen.compile(spec)
    x = torch.randn(5, device=DEVICE)
    torch.testing.assert_close(ks.get(x), x * 2)
    torch.testing.assert_close(ks.values(x), x * 3)
    torch.testing.assert_close(ks["get"](x), x * 2)
    assert set(ks) == {"get", "values"} and ks.items is not None
    assert isinstance(copy.deepcopy(ks), Kernels) and set(pickle.loads(pickle.dumps(ks))) == set(ks)


@pytest.mark.parametrize("path, out_dir, name", [("", None, "path"), (ROOT / "specs" / "vector_add.k", "", "out_dir")])
def test_build_refuses_empty_paths(tmp_path, monkeypatch, path, out_dir, name):
    """An empty out_dir is no folder (it had meant generated/), an empty path no spec (the
    working folder), as kgen build refuses them."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CallError, match=f"{name}: expected a path, got an empty string"):
        kgen.build(path, out_dir)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("path, out_dir, name, got", [(None, None, "path", "NoneType"),
                                                      (b"specs/vector_add.k", None, "path", "bytes"),
                                                      (ROOT / "specs" / "vector_add.k", 3, "out_dir", "int")])
def test_build_takes_paths_and_says_which_argument_is_not_one(tmp_path, monkeypatch, path, out_dir, name, got):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CallError, match=f"{name}: expected a str or os.PathLike path, got {got}"):
        kgen.build(path, out_dir)
    assert not any(tmp_path.iterdir())


class BytesPath:
    """An os.PathLike whose path is bytes (os.DirEntry of a bytes scan is one)."""
    def __fspath__(self):
        return b"specs/vector_add.k"


@pytest.mark.parametrize("call, message", [
    (lambda: kgen.compile("spec\0s.k"), "path: a path cannot hold a NUL character"),
    (lambda: kgen.compile(Path("a\0.k")), "path: a path cannot hold a NUL character"),
    (lambda: kgen.build("a\0.k", "out"), "path: a path cannot hold a NUL character"),
    (lambda: kgen.build(ROOT / "specs" / "vector_add.k", "o\0x"), "out_dir: a path cannot hold a NUL character"),
    (lambda: kgen.compile(BytesPath()), "path: expected a str or os.PathLike path of str, got a path of bytes"),
    (lambda: kgen.build(BytesPath()), "path: expected a str or os.PathLike path of str, got a path of bytes"),
    (lambda: kgen.build(ROOT / "specs" / "vector_add.k", BytesPath()), "out_dir: expected a str or os.PathLike"),
])
def test_paths_no_file_system_takes_are_call_errors(tmp_path, monkeypatch, call, message):
    """A NUL in a path, or a PathLike of bytes, would reach Python's os calls (ValueError,
    TypeError): a CallError naming the argument instead, and nothing written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CallError, match=re.escape(message)):
        call()
    assert not any(tmp_path.iterdir())


def test_a_call_on_the_interpreter_raises_no_numpy_warning():
    """Triton's interpreter computes masked lanes too (log of a padding 0) in numpy, whose
    warnings would print on every `kgen run` though they say nothing of the call's values (NaN and
    -inf here are the data's own, as torch.log gives them)."""
    x = torch.tensor([-1.0, 0.0, 2.0, 5.0, 7.0], device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        y = kgen.compile("y = log(x)")(x)
    torch.testing.assert_close(y, torch.log(x), equal_nan=True)


def test_a_spec_file_saved_with_a_byte_order_mark_and_crlf_compiles(tmp_path):
    """Windows editors save UTF-8 with a byte-order mark and CRLF line ends: the mark is no
    character of the spec (it was an 'unexpected character' at 1:1), as it is none of Python's."""
    spec = tmp_path / "bom.k"
    spec.write_bytes("\ufeffkernel twice(X: f32[N]) -> Y {\r\n    Y = X * 2\r\n}\r\n".encode("utf-8"))
    x = torch.randn(6, device=DEVICE)
    torch.testing.assert_close(kgen.compile(spec)(x), x * 2)


def test_headerless_source_before_and_after_a_call():
    k = kgen.compile("Y = exp(X) + B")
    assert k.inputs == ("X", "B") and k.outputs == ("Y",)
    before = k.source                                   # an f32 example
    assert "tl.exp(X)" in before and k.pattern == "elementwise"
    k(x16(3, 4), x16(4))
    assert k.source != before and "torch.float16" in k.source
    assert k.ir.params[0].dtype.name == "f16"
    # an input read as a where's condition is bool in the example, as an f32 one would be refused
    pick = kgen.compile("y = where(c, a, b) * 2")
    assert pick.pattern == "elementwise" and "torch.bool" in pick.source


def test_interpreter_is_announced_once(capfd, monkeypatch):
    import kgen.runtime as rt
    monkeypatch.setattr(rt, "_announced", False)
    assert rt.use_interpreter_if_no_gpu() is (not torch.cuda.is_available())
    rt.use_interpreter_if_no_gpu()
    err = capfd.readouterr().err
    assert err.count("TRITON_INTERPRET=1") == (0 if torch.cuda.is_available() else 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="kgen switches to the interpreter only without a CUDA device")
def test_the_interpreter_runs_kernels_when_triton_was_imported_first(tmp_path):
    # Triton imported before kgen sets TRITON_INTERPRET holds compiled library functions
    # (tl.cdiv, tl.sum, ...), which interpreted kernels call: one kernel per pattern.
    import subprocess
    import sys
    script = """if True:
        import triton, triton.language
        import torch, kgen
        a, b = torch.randn(9, 5), torch.randn(5, 7)
        for text, args, want in (("Y = X * sigmoid(X)", (a,), a * torch.sigmoid(a)),
                                 ("Y = X - max(X)", (a,), a - a.amax(-1, keepdim=True)),
                                 ("C = A @ B", (a, b), a @ b)):
            torch.testing.assert_close(kgen.compile(text)(*args), want)
        print("ok")
    """
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], env={**env, "KGEN_CACHE_DIR": str(tmp_path)},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# one spec per pattern, and dense arguments for it: (list form?, shapes of its inputs)
PATTERN_SPECS = {
    "specs/vector_add.k": (False, [(6,), (6,)]),
    "specs/softmax.k": (False, [(3, 6)]),
    "specs/matmul_leaky_relu.k": (False, [(4, 8), (8, 4)]),
    "specs/grouped_gemm.k": (True, [(4, 8), (8, 4)]),
}


@pytest.mark.parametrize("spec", sorted(PATTERN_SPECS))
@pytest.mark.parametrize("kind, message", [("sparse", "expected a dense tensor"),
                                           ("meta", "expected a C(UDA|PU) tensor"),
                                           ("sparse out", "expected a dense")])
def test_sparse_and_meta_tensors_are_refused_before_any_launch(spec, kind, message, watch):
    """Tensors without strided storage (sparse layouts, the meta device) get a CallError
    naming the argument, never an exception from deep inside torch or Triton."""
    k = kgen.compile(spec)
    listed, shapes = PATTERN_SPECS[spec]
    dtype = torch.float32 if spec.endswith("vector_add.k") else torch.float16
    make = {"sparse": lambda s: torch.randn(s, dtype=dtype).to_sparse().to(DEVICE),
            "meta": lambda s: torch.empty(s, dtype=dtype, device="meta")}.get(kind, lambda s: x16(*s).to(dtype))
    args = [[make(s)] if listed else make(s) for s in shapes]
    out = None
    if kind == "sparse out":
        dense = k(*args)
        out = [o.to_sparse() for o in dense] if listed else dense.to_sparse()
    launches = watch(k.module)
    with pytest.raises(CallError, match=message):
        k(*args, out=out)
    assert launches.count == 0



def _nested(shape, dtype):
    """A nested tensor of `shape`'s rank: its layout reads torch.strided, but torch raises on its .shape."""
    return torch.nested.nested_tensor([torch.ones(shape[1:], dtype=dtype) for _ in range(shape[0])]).to(DEVICE)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("spec", sorted(PATTERN_SPECS))
@pytest.mark.parametrize("where", ["input", "out", "headerless", "moe", "offs", "headerless offs"])
def test_nested_tensors_are_refused_before_any_launch(spec, where, watch):
    """A nested tensor (given as an input, an out=, the MoE form's operands or offs, to a
    declared or a headerless kernel) is a CallError naming it, not torch's RuntimeError from
    its .shape."""
    listed, shapes = PATTERN_SPECS[spec]
    dtype = torch.float32 if spec.endswith("vector_add.k") else torch.float16
    wrap = (lambda t: [t]) if listed else (lambda t: t)
    args = [wrap(x16(*s).to(dtype)) for s in shapes]
    if where.startswith("headerless"):
        k = kgen.compile("C = A @ B" if "gemm" in spec else "y = x - max(x)" if "softmax" in spec else "y = a + b")
    else:
        k = kgen.compile(spec)
    out, call = None, k
    if where in ("moe", "offs", "headerless offs"):
        if not listed:
            pytest.skip("the MoE form is a grouped GEMM's")
        args = [args[0][0], args[1][0][None]]
        offs = _nested((1,), torch.int32) if where.endswith("offs") else \
            torch.tensor([4], dtype=torch.int32, device=DEVICE)
        call = lambda *a, out=None: k.moe(*a, offs=offs, out=out)   # noqa: E731
    if where == "out":
        out = wrap(_nested(tuple(k(*args)[0].shape if listed else k(*args).shape), dtype))
    elif not where.endswith("offs"):
        args[0] = _nested(shapes[0], dtype) if where == "moe" else wrap(_nested(shapes[0], dtype))
    launches = None if where.startswith("headerless") else watch(k.module)
    with pytest.raises(CallError, match=r"(offs|out \(\w+(\[0\])?\)|\w+(\[0\])?): expected .*nested"):
        call(*args, out=out)
    assert launches is None or launches.count == 0


def test_negative_defaults_are_used_as_written():
    k = kgen.compile("kernel f(X: f32[N], a: f32 = -2.5, n: i32 = -2147483648) -> (Y: f32[N], Z: f32[N]) {\n"
                     "    Y = X * a\n    Z = X + n\n}\n")
    x = torch.arange(-3.0, 4.0, device=DEVICE)
    y, z = k(x)
    torch.testing.assert_close(y, x * -2.5)
    torch.testing.assert_close(z, x + torch.tensor(-2**31, dtype=torch.int32, device=DEVICE))


def _negated(shape, dtype):
    """A tensor carrying torch's lazy negation bit: the imaginary part of a conjugate view."""
    complex_dtype = torch.complex64 if dtype == torch.float32 else torch.chalf
    return torch.zeros(shape, dtype=complex_dtype, device=DEVICE).conj().imag


HAZARDS = {
    # what is wrong with the call -> the CallError's words
    "out of another type": r"out( \(C\))?: expected a",
    "out with a stride of 0": "share memory",
    "out aliasing an input's bytes": "overlaps",
    "negated input": "negation bit",
    "negated out": "negation bit",
}


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("spec", sorted(PATTERN_SPECS))
@pytest.mark.parametrize("hazard", sorted(HAZARDS))
def test_unsafe_outputs_and_negated_tensors_are_refused_before_any_launch(spec, hazard, watch):
    """Every pattern refuses, before any launch: an out= that is not a tensor (or list), an
    out whose elements share memory, an out over an input's bytes (through another storage
    too), and tensors whose negation torch applies lazily (the kernel would read the raw
    values and return wrong signs)."""
    k = kgen.compile(spec)
    listed, shapes = PATTERN_SPECS[spec]
    dtype = torch.float32 if spec.endswith("vector_add.k") else torch.float16
    base = torch.randn(1 + torch.Size(shapes[0]).numel(), device=DEVICE).to(dtype)
    args = [base[:-1].view(shapes[0])] + [torch.randn(s, device=DEVICE).to(dtype) for s in shapes[1:]]
    shape = k(*([a] for a in args))[0].shape if listed else k(*args).shape
    # one element past the input's first: another storage over the same bytes where torch can make one
    shifted = torch.frombuffer(base.numpy(), dtype=dtype)[1:] if DEVICE == "cpu" else base[1:]
    out = {"out of another type": lambda: 5,
           "out with a stride of 0": lambda: torch.empty(1, device=DEVICE, dtype=dtype).expand(shape),
           "out aliasing an input's bytes": lambda: shifted[:shape.numel()].view(shape),
           "negated out": lambda: _negated(shape, dtype)}.get(hazard, lambda: None)()
    if hazard == "negated input":
        args[0] = _negated(args[0].shape, dtype)
    if listed:
        args, out = [[a] for a in args], out if out is None or isinstance(out, int) else [out]
    launches = watch(k.module)
    with pytest.raises(CallError, match=HAZARDS[hazard]):
        k(*args, out=out)
    assert launches.count == 0


@settings(deadline=None, max_examples=examples(200))
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_byte_spans_and_distinct_elements_follow_the_element_addresses(shape, data):
    """The out= checks' helpers against every element's address: _span is the bytes from the
    first element to the end of the last (contiguous views in one step, others from their
    strides), and a view that _self_overlapping passes has no two elements at one address."""
    module = kgen.compile(ROOT / "specs" / "vector_add.k").module
    layout = data.draw(st.sampled_from(["strides", "contiguous", "permuted"]))
    if layout == "strides":
        strides = data.draw(st.lists(st.integers(0, 6), min_size=len(shape), max_size=len(shape)))
    else:
        order = list(range(len(shape))) if layout == "contiguous" else data.draw(st.permutations(range(len(shape))))
        strides, reach = [0] * len(shape), 1
        for axis in reversed(order):
            strides[axis], reach = reach, reach * shape[axis]
    offset = data.draw(st.integers(0, 9))
    base = torch.empty(128, dtype=torch.float16)
    t = base.as_strided(shape, strides, offset)
    addresses = [offset + sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, shape))]
    assert module._span(t) == (base.data_ptr() + 2 * min(addresses), base.data_ptr() + 2 * (max(addresses) + 1))
    if not module._self_overlapping(t):
        assert len(set(addresses)) == len(addresses)
    if layout != "strides":
        assert not module._self_overlapping(t)


def test_out_exactly_an_input_must_also_have_its_element_type():
    """out= may be an input itself (each element is read before it is written), but not the
    same bytes read as another type: f16 elements under an f32 output are overwritten
    before later programs read them."""
    k = kgen.compile("y = f32(x)")
    buf = torch.empty(64, device=DEVICE)
    x = buf.view(torch.float16)[:64]
    x.copy_(torch.randn(64, device=DEVICE))
    with pytest.raises(CallError, match="overlaps x"):
        k(x, out=buf)
    inplace = kgen.compile("y = x * 2 + 1")
    z = torch.randn(64, device=DEVICE)
    want = z * 2 + 1
    assert inplace(z, out=z) is z
    torch.testing.assert_close(z, want)


def _config_calls():
    """(kernel, call taking config=, a config it takes) for each pattern with configs."""
    x = torch.randn(8, device=DEVICE)
    add = kgen.compile("kernel add(x: f32[N], y: f32[N]) -> z: f32[N] {\n    z = x + y\n}\n"
                       "schedule add {\n    BLOCK_SIZE = [16, 32]\n    num_warps = [1, 2]\n}\n")
    yield add, lambda config: add(x, x, config=config), {"BLOCK_SIZE": 4, "num_warps": 1}
    small = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1)
    lin = kgen.compile(ROOT / "specs" / "linear_gelu.k")
    X, W, b = (torch.randn(*s, device=DEVICE, dtype=torch.float16) for s in ((20, 24), (24, 16), (16,)))
    yield lin, lambda config: lin(X, W, b, config=config), dict(small, SPLIT_K=2)
    grouped = kgen.compile(ROOT / "specs" / "grouped_gemm.k")
    B = torch.randn(2, 24, 16, device=DEVICE, dtype=torch.float16)
    yield grouped, lambda config: grouped([X[:7], X[7:]], [B[0], B[1]], config=config), dict(small, programs_per_sm=2)
    offs = torch.tensor([7, 20], dtype=torch.int32, device=DEVICE)
    yield grouped, lambda config: grouped.moe(X, B, offs=offs, config=config), small


def test_a_config_given_by_hand_that_does_not_fit_is_a_call_error():
    """A config= by hand is checked before any launch: a zero GROUP_M or SPLIT_K would launch
    nothing or divide by zero on the device, a tile of 24 would not compile, 64 warps or 17
    stages are past what a schedule takes, 65536 SPLIT_K programs past CUDA's grid."""
    for kernel, call, good in _config_calls():
        blocks = [k for k in good if k.startswith("BLOCK")]
        counts = [k for k in good if k in ("GROUP_M", "num_stages", "SPLIT_K", "programs_per_sm")]
        bad = [({}, f".*got no {next(iter(good))}"), (5, "a dict of .* got int"),
               ({**good, "unknown": 1}, "keys among .* got 'unknown'"),
               ({**good, "num_warps": 3}, "num_warps a power of two from 1 to 32, got 3"),
               ({**good, "num_warps": 64}, "num_warps a power of two from 1 to 32, got 64")]
        bad += [({**good, key: 24}, f"{key} a power of two from .* to 1048576, got 24") for key in blocks]
        bad += [({**good, key: 2**21}, f"{key} a power of two from .* to 1048576, got 2097152") for key in blocks]
        bad += [({**good, key: value}, f"{key} an int from 1 to .*, got {value!r}")
                for key in counts for value in (0, -1)]
        bad += [({**good, key: value}, f"{key} an int, got {type(value).__name__}") for key in counts
                for value in (2.0, True, "2", torch.tensor(2))]
        bad += [({**good, key: value}, f"{key} an int from 1 to {most}, got {value}")
                for key, most, value in (("num_stages", 16, 17), ("SPLIT_K", 65535, 65536)) if key in good]
        tiles = (("BLOCK_M", "BLOCK_N"), ("BLOCK_M", "BLOCK_K"), ("BLOCK_K", "BLOCK_N"))
        bad += [({**good, a: 2**11, b: 2**10}, rf"{a} \* {b} at most 2\*\*20 \(Triton's largest tensor\), "
                 r"got 2048 \* 1024") for a, b in tiles if a in good]
        for config, words in bad:
            with pytest.raises(CallError, match=f"config: expected {words}"):
                call(config)
        result, want = call(good), call(None)
        # ints of other types (numpy's, an IntEnum) and a dict's subclasses are configs as well
        numpy_ints = collections.OrderedDict((key, np.int64(value)) for key, value in good.items())
        for r, w in zip(*(x if isinstance(x, list) else [x] for x in (result, want))):
            torch.testing.assert_close(r, w, atol=1e-2, rtol=1e-2)
        for r, w in zip(*(x if isinstance(x, list) else [x] for x in (call(numpy_ints), want))):
            torch.testing.assert_close(r, w, atol=1e-2, rtol=1e-2)


def test_a_config_that_does_not_fit_is_a_call_error_on_empty_problems_too():
    """A call that launches nothing (0 elements, M = 0, T = 0) checks its config= all the same:
    whether a bad config is an error must not depend on the sizes of the call."""
    x = torch.randn(0, device=DEVICE)
    add = kgen.compile("kernel add(x: f32[N], y: f32[N]) -> z: f32[N] {\n    z = x + y\n}\n")
    lin = kgen.compile(ROOT / "specs" / "linear_gelu.k")
    X, W, b = (torch.randn(*s, device=DEVICE, dtype=torch.float16) for s in ((0, 24), (24, 16), (16,)))
    grouped = kgen.compile(ROOT / "specs" / "grouped_gemm.k")
    B = torch.randn(2, 24, 16, device=DEVICE, dtype=torch.float16)
    offs = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    calls = [lambda config: add(x, x, config=config), lambda config: lin(X, W, b, config=config),
             lambda config: grouped([X, X], [B[0], B[1]], config=config),
             lambda config: grouped.moe(X, B, offs=offs, config=config)]
    for call in calls:
        with pytest.raises(CallError, match="config: expected a dict"):
            call(5)
        with pytest.raises(CallError, match="config: expected .*, got no "):
            call({})


def test_every_candidate_config_passes_the_hosts_own_check():
    """The autotuner passes its candidates as config=: each one the host takes."""
    for kernel, call, _ in _config_calls():
        module = kernel.module
        configs = getattr(module, f"{kernel.name}_configs")
        assert configs
        for config in configs:
            launches = []
            with pytest.MonkeyPatch.context() as mp:
                for name in [n for n in vars(module) if n.endswith("_kernel")]:
                    mp.setattr(module, name, _Recording(launches))
                call(config)
            assert launches, config


class _Recording:
    """A kernel that records its launches instead of running them."""

    def __init__(self, launches):
        self.launches = launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, kwargs))


@pytest.mark.parametrize("text", ["Kernel = x + 1", "Y_MASK = x > 0", "TOTAL_SIZE = x * 2", "X_PTR = x + 1",
                                  "X = x + 1; ptr = x * 2", "TL = x + 1"])
def test_headerless_outputs_named_like_generated_code_still_compile(text):
    """A headerless kernel is named after its outputs; where that name is reserved, kgen
    picks another, never an error about a name the user did not write."""
    k = kgen.compile(text)
    x = torch.randn(3, 4, device=DEVICE)
    results = k(x)
    got = results if isinstance(results, tuple) else (results,)
    want = evaluate(k._last.ir, {"x": x})
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.to(g.dtype))


def test_bool_scalar_parameters_take_python_bools():
    k = kgen.compile("kernel f(x: f32[N], flip: bool, shift: bool = 1) -> y: f32[N] {\n"
                     "    y = where(flip, -x, x) + f32(shift)\n}\n")
    x = torch.randn(6, device=DEVICE)
    torch.testing.assert_close(k(x, True), -x + 1)
    torch.testing.assert_close(k(x, False, shift=False), x)
    for bad in (1, 2, 1.0, None):
        with pytest.raises(CallError, match="flip: expected a Python bool"):
            k(x, bad)
    with pytest.raises(CallError, match="flip: expected a Python bool, got numpy.bool"):   # not "got bool"
        k(x, np.bool_(True))
    with pytest.raises(SpecError, match="default 2 is not a valid bool"):
        kgen.compile("kernel f(x: f32[N], b: bool = 2) -> y: f32[N] {\n    y = x * f32(b)\n}\n")


def test_a_triton_compilation_error_is_told_by_its_reason_not_its_position():
    """Triton's CompilationError starts with "at 12:30:" and the source; a config refused
    on a GPU is reported by the reason it gives last, or by the error it chains."""
    import ast
    from triton.compiler.errors import CompilationError
    from kgen.runtime import _reason
    src = "def f(x):\n    return tl.arange(0, 3)\n"
    node = ast.parse(src).body[0].body[0]
    direct = CompilationError(src, node, "arange's range must be a power of 2")
    assert str(direct).startswith("at 2:4:")
    assert _reason(direct) == "arange's range must be a power of 2"
    try:
        try:
            raise ValueError("shape element 0 must be a power of 2\nmore")
        except ValueError as inner:
            raise CompilationError(src, node, None) from inner
    except CompilationError as chained:
        assert _reason(chained) == "shape element 0 must be a power of 2"
    assert _reason(KeyError("BLOCK_SIZE")) == "'BLOCK_SIZE'"



def test_build_does_not_overwrite_a_file_kgen_did_not_write_unless_forced(tmp_path, monkeypatch):
    """kgen.build writes what `kgen build` would, rewrites its own module, and leaves a file
    kgen did not write alone unless force=True."""
    monkeypatch.chdir(tmp_path)
    spec = ROOT / "specs" / "vector_add.k"
    target = kgen.build(spec, "out")
    assert target == Path("out") / "vector_add.py"
    built = generate(spec.read_text(), display_path(spec), out="out").source
    assert target.read_text() == built and "run `kgen build" in built and " -o out`." in built
    assert kgen.build(spec, "out") == target
    target.write_text("print('hand-written')\n")
    with pytest.raises(KgenError, match=r"out/vector_add.py exists and was not generated by kgen "
                                        r"\(pass force=True to overwrite it\)"):
        kgen.build(spec, "out")
    assert target.read_text() == "print('hand-written')\n"
    assert kgen.build(spec, "out", force=True) == target
    assert target.read_text() == built


@pytest.mark.parametrize("out, message", [
    ("file", "file is a file, not a folder to write into"),
    ("file/sub/deeper", "file is a file, not a folder to write into"),    # a file on the way
    ("dangling", "dangling is a symbolic link (nowhere) that leads to no folder to write into"),
    ("loop", "loop is a symbolic link (loop) that leads to no folder to write into"),
    ("gen", "gen/vector_add.py is a folder"),
    ("new/vector_add.py", "new/vector_add.py: out_dir takes a folder"),
])
def test_build_refuses_targets_it_cannot_write(tmp_path, monkeypatch, out, message):
    """What `kgen build` refuses, kgen.build refuses as a KgenError (force=True or not),
    writing nothing: an out_dir that is a file, under one, a link to nothing, or names a
    module; a target that is a folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    os.symlink("nowhere", tmp_path / "dangling")
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "gen" / "vector_add.py").mkdir(parents=True)
    before = sorted(os.listdir(tmp_path))
    for force in (False, True):
        with pytest.raises(KgenError, match=re.escape(message)):
            kgen.build(ROOT / "specs" / "vector_add.k", out, force=force)
    assert sorted(os.listdir(tmp_path)) == before and sorted(os.listdir(tmp_path / "gen")) == ["vector_add.py"]


def test_headerless_kernels_take_a_config_by_hand():
    """config= reaches the generated host function of a headerless kernel, checked as a
    declared kernel's is; a row reduction, which takes none, says so."""
    x = torch.randn(20, 24, device=DEVICE)
    w = torch.randn(24, 16, device=DEVICE)
    mm = kgen.compile("C = relu(A @ B)")
    config = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1)
    torch.testing.assert_close(mm(x, w, config=config), mm(x, w), atol=1e-4, rtol=1e-4)
    with pytest.raises(CallError, match="config: expected BLOCK_M a power of two from 16 to 1048576, got 24"):
        mm(x, w, config={**config, "BLOCK_M": 24})
    offs = torch.tensor([7, 20], dtype=torch.int32, device=DEVICE)
    stacked = torch.stack([w, w])
    torch.testing.assert_close(mm.moe(x, stacked, offs=offs, config=config), mm.moe(x, stacked, offs=offs))
    add = kgen.compile("y = x * 2")
    torch.testing.assert_close(add(x, config={"BLOCK_SIZE": 64, "num_warps": 2}), x * 2)
    with pytest.raises(CallError, match="config: expected BLOCK_SIZE, num_warps, got no num_warps"):
        add(x, config={"BLOCK_SIZE": 64})
    with pytest.raises(CallError, match=r"^y: config: a row-reduction kernel takes no config \(its host picks"):
        kgen.compile("Y = X - max(X)")(x, config={"BLOCK_N": 32})


def test_a_cache_folder_given_with_a_tilde_or_relative_is_where_a_shell_would_put_it(tmp_path, monkeypatch):
    """KGEN_CACHE_DIR='~/kc' (quoted, so no shell expanded it) is $HOME/kc, not a folder named
    '~' under the current one; a relative folder is taken from the current folder."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv("KGEN_CACHE_DIR", "~/kc")
    x = torch.randn(5, device=DEVICE)
    torch.testing.assert_close(kgen.compile("y = x * 3 + 1")(x), x * 3 + 1)
    assert list((home / "kc").glob("*.py")) and not (work / "~").exists()
    monkeypatch.setenv("KGEN_CACHE_DIR", "relative/kc")
    torch.testing.assert_close(kgen.compile("y = x * 5 - 1")(x), x * 5 - 1)
    assert list((work / "relative" / "kc").glob("*.py"))


@pytest.mark.gpu
def test_kernels_run_inside_torch_compile_and_cuda_graphs(monkeypatch):
    """A model compiled with torch.compile (fullgraph too: no graph break) or captured in a CUDA
    graph can call kgen kernels: the graph replays them on the inputs' new values."""
    torch.manual_seed(0)
    x = torch.randn(64, 1000, device="cuda", dtype=torch.float16)
    w = torch.randn(1000, 256, device="cuda", dtype=torch.float16) / 32
    ew, sm = kgen.compile("y = x * sigmoid(x) + 1"), kgen.compile(ROOT / "specs" / "softmax.k")
    mm = kgen.compile("C = leaky_relu(A @ B)")

    def model(x):
        return mm(sm(ew(x)), w) * 2

    def want(x):
        h = torch.softmax(x.float() * torch.sigmoid(x.float()) + 1, -1)
        return torch.nn.functional.leaky_relu(h @ w.float(), 0.01) * 2

    for run in (torch.compile(model), torch.compile(model, fullgraph=True)):
        torch.testing.assert_close(run(x).float(), want(x), atol=2e-3, rtol=2e-2)
    monkeypatch.setenv("KGEN_AUTOTUNE", "1")       # read at compile time: this kernel tunes
    fresh = kgen.compile("C = relu(A @ B) * 3")   # never called: its first call tunes
    with pytest.raises(CallError, match="these shapes are tuned at their first call, which a CUDA graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fresh(x, w)
    torch.testing.assert_close(fresh(x, w).float(), torch.relu(x.float() @ w.float()) * 3, atol=2e-3, rtol=2e-2)
    model(x)   # tuned and compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = model(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(y.float(), want(x), atol=2e-3, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_a_gpu_other_than_the_current_one(monkeypatch):
    """Triton launches on the current GPU: kgen.compile's kernels run where their tensors are
    (under torch.cuda.device, tuning too), as torch's operations do, and leave the current
    GPU as it was; a generated module called directly refuses them by name, never a fault."""
    torch.cuda.set_device(0)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):   # torch's own capture stream is now cuda:0's
        torch.zeros(1, device="cuda:0").add_(1)
    on1 = lambda *shape: torch.randn(*shape, device="cuda:1", dtype=torch.float16)   # noqa: E731
    x, w, bias = on1(300, 500), on1(500, 64) / 16, on1(64)
    monkeypatch.setenv("KGEN_AUTOTUNE", "1")       # read at compile time: the GEMM tunes on cuda:1
    mm = kgen.compile("C = leaky_relu(A @ W + b)")
    sm, ew = kgen.compile(ROOT / "specs" / "softmax.k"), kgen.compile("y = x * sigmoid(x) + 1")
    with warnings.catch_warnings(record=True) as warned:    # the tuner's CUDA graphs capture on cuda:1
        warnings.simplefilter("always")
        got = {"softmax": sm(x), "elementwise": ew(x), "gemm": mm(x, w, bias),
               "grouped": mm([x, x[:7]], [w, w[:, :9]], [bias, bias[:9]]),
               "moe": mm.moe(x, torch.stack([w, w]), torch.stack([bias, bias]), offs=[100, 300])}
    assert not [str(m.message) for m in warned if "CUDA Graph is empty" in str(m.message)]
    h = x.float()
    want = {"softmax": torch.softmax(h, -1), "elementwise": h * torch.sigmoid(h) + 1,
            "gemm": torch.nn.functional.leaky_relu(h @ w.float() + bias.float(), 0.01)}
    want["grouped"] = [want["gemm"], want["gemm"][:7, :9]]
    want["moe"] = want["gemm"]
    assert torch.cuda.current_device() == 0
    for name, value in got.items():
        for g, v in zip(value if isinstance(value, list) else [value], want[name] if isinstance(value, list)
                        else [want[name]]):
            assert g.device == torch.device("cuda:1"), name
            torch.testing.assert_close(g.float(), v, atol=3e-2, rtol=2e-2, msg=name)
    with pytest.raises(sm.module.NotCurrentDevice,
                       match=r"X: expected a tensor on the current device, cuda:0 .*got one on cuda:1: "
                             r"call under torch.cuda.device\(1\)"):
        sm.module.softmax(x)
    with torch.cuda.device(1):
        torch.testing.assert_close(sm.module.softmax(x).float(), want["softmax"], atol=2e-3, rtol=2e-2)
    with pytest.raises(CallError, match=r"A\[1\]: expected a tensor on cuda:1 \(where A\[0\] is\), got cuda:0"):
        mm([x, x.to("cuda:0")], [w, w.to("cuda:0")], [bias, bias.to("cuda:0")])


def test_threads_calling_kernels_at_once_get_what_torch_gives():
    """Threads calling kernels at once, first calls (headerless specializations) among them, get
    torch's results; on Triton's interpreter, which keeps a launch's state in globals, kgen runs
    one launch at a time (before, raw InterpreterErrors and silently wrong rows)."""
    from concurrent.futures import ThreadPoolExecutor
    softmax = kgen.compile("y = exp(x - max(x)) / sum(exp(x - max(x)))")
    scale = kgen.compile("y = x * 2 + 1")
    mm = kgen.compile("C = relu(A @ B)")

    def job(i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16 + i % 3, 24, generator=g).to(DEVICE)
        b = torch.randn(24, 8, generator=g).to(DEVICE)
        v = x[:, :5].half() if i % 2 else x.t()      # a second dtype and a strided layout
        checks = [(softmax(x), torch.softmax(x, -1)), (scale(v), v * 2 + 1), (mm(x, b), (x @ b).relu())]
        return all(got.dtype == want.dtype and torch.allclose(got.float(), want.float(), atol=1e-2, rtol=1e-2)
                   for got, want in checks)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(job, range(24)))


def test_out_writes_move_the_version_on_as_torchs_do():
    """A tensor written through out= has a new version, as torch's out= operations give it: a
    backward pass that saved it before refuses instead of computing with the new values (it had
    returned 10 for a gradient of 1); an inference tensor takes writes only in inference mode."""
    double = kgen.compile("y = x * 2.0")
    w = torch.randn(4, device=DEVICE, requires_grad=True)
    y = torch.ones(4, device=DEVICE)
    z = w * y                                     # autograd saves y
    double(torch.full((4,), 5.0, device=DEVICE), out=y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
    with torch.inference_mode():
        frozen = torch.ones(4, device=DEVICE)
    with pytest.raises(CallError, match="y: out: expected a tensor that may be written here, got an inference"):
        double(torch.ones(4, device=DEVICE), out=frozen)
    assert torch.equal(frozen, torch.ones(4, device=DEVICE))
    with torch.inference_mode():
        double(torch.ones(4, device=DEVICE), out=frozen)
    assert torch.equal(frozen, torch.full((4,), 2.0, device=DEVICE))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX's")
def test_a_child_forked_while_a_thread_compiles_compiles_too():
    """A child forked while another thread held kgen's module lock had that lock held for good and
    hung in its first kgen.compile; the child gets fresh locks."""
    import threading
    from kgen import runtime
    if DEVICE != "cpu":
        pytest.skip("a CUDA context does not survive a fork; the CPU run covers the locks")
    with runtime._lock:      # as a compile in another thread holds it
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                done = threading.Event()
                threading.Timer(60, lambda: os._exit(2) if not done.is_set() else None).start()
                k = kgen.compile("y_forked = x * 3 + 0.5")
                code = 0 if torch.equal(k(torch.ones(2)), torch.full((2,), 3.5)) else 3
                done.set()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_config_none_is_no_config_for_every_kernel():
    """config=None asks for no config: row reductions, which take none, accept it too, as their
    headerless forms did."""
    x = torch.randn(4, 6, device=DEVICE)
    torch.testing.assert_close(kgen.compile(ROOT / "specs" / "softmax.k")(x.half(), config=None).float(),
                               torch.softmax(x, -1), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(kgen.compile("y = x - max(x)")(x, config=None), x - x.amax(-1, keepdim=True))
    with pytest.raises(CallError, match="config"):
        kgen.compile(ROOT / "specs" / "softmax.k")(x.half(), config={"BLOCK_N": 8})


def test_inputs_that_require_grad_get_outputs_whose_backward_refuses():
    """kgen kernels compute no gradient: called where autograd records, a kernel's outputs join
    the graph, and a backward pass that reaches them is a CallError naming the kernel, not an
    input's gradient silently short; under no_grad, inference_mode or on inputs that need no
    grad nothing is recorded; out= is refused there, as torch refuses it."""
    x = torch.randn(8, 3, device=DEVICE, requires_grad=True)
    two = kgen.compile("y = x * 2 + 1; z = x > 0")
    y, z = two(x)
    assert y.requires_grad and not z.requires_grad and z.dtype == torch.bool
    torch.testing.assert_close(y.detach(), x.detach() * 2 + 1)
    assert torch.equal(z, x.detach() > 0)
    with pytest.raises(CallError, match=r"a backward pass reached this kernel's outputs.*torch.no_grad\(\)"):
        (y.sum() + x.sum()).backward()          # x gets a gradient along the other path: this one may not go missing
    model = torch.compile(lambda x: two(x)[0] * 3, backend="aot_eager")    # such calls run as they are
    y = model(x)
    torch.testing.assert_close(y.detach(), (x.detach() * 2 + 1) * 3)
    with pytest.raises(CallError, match=r"a backward pass reached this kernel's outputs"):
        y.sum().backward()
    torch.testing.assert_close(model(x.detach()), (x.detach() * 2 + 1) * 3)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            assert not two(x)[0].requires_grad
    assert not two(x.detach())[0].requires_grad
    with pytest.raises(CallError, match=r"out= cannot be written where autograd records"):
        two(x, out=(torch.empty(8, 3, device=DEVICE), torch.empty(8, 3, device=DEVICE, dtype=torch.bool)))
    with pytest.raises(CallError, match=r"records \(a tensor of the call requires grad"):   # out= itself does
        two(x.detach(), out=(torch.empty(8, 3, device=DEVICE, requires_grad=True),
                             torch.empty(8, 3, device=DEVICE, dtype=torch.bool)))
    mm = kgen.compile("C = A @ B")
    a, b = [torch.randn(5, 4, device=DEVICE)], [torch.randn(4, 6, device=DEVICE, requires_grad=True)]
    for got, label in ((mm(a, b)[0], "c"), (mm.moe(a[0], b[0].unsqueeze(0), offs=[5]), "c.moe")):
        assert got.requires_grad
        torch.testing.assert_close(got.detach(), a[0] @ b[0].detach(), atol=2e-2, rtol=2e-2)   # TF32 on a GPU
        with pytest.raises(CallError, match=f"^{re.escape(label)}: a backward pass reached this kernel's outputs"):
            got.sum().backward()
    # a grouped GEMM's outputs, carved from one buffer, change in place as separate results do
    a, b = [torch.randn(3, 8, device=DEVICE), torch.randn(2, 8, device=DEVICE)], \
        [torch.randn(8, 4, device=DEVICE, requires_grad=True), torch.randn(8, 4, device=DEVICE)]
    c0, c1 = mm(a, b)
    assert c0.requires_grad and c1.requires_grad and c0.untyped_storage().data_ptr() == c1.untyped_storage().data_ptr()
    w = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    kept = c0.detach() * w.detach()
    y = c0 * w                  # saves c0 for w's gradient: a change to c1 must not touch c0's version
    c1.relu_()
    torch.testing.assert_close(c1.detach(), (a[1] @ b[1]).relu(), atol=2e-2, rtol=2e-2)
    (grad_w,) = torch.autograd.grad(y.sum(), w)
    torch.testing.assert_close(grad_w, c0.detach())
    torch.testing.assert_close(y.detach(), kept)
    c0.add_(1)
    torch.testing.assert_close(c0.detach(), a[0] @ b[0].detach() + 1, atol=2e-2, rtol=2e-2)
    with pytest.raises(CallError, match="^c: a backward pass reached this kernel's outputs"):
        c1.sum().backward()


def test_out_lists_that_require_grad_are_refused_as_tensors_are():
    """A grouped GEMM of two list outputs takes out= as a tuple of lists: a tensor in one that
    requires grad is refused as one in a flat tuple is, never overwritten."""
    k = kgen.compile("H = A @ B; C = H * 2; D = relu(H)")
    a = [torch.randn(4, 5, device=DEVICE), torch.randn(3, 5, device=DEVICE)]
    b = [torch.randn(5, 2, device=DEVICE), torch.randn(5, 2, device=DEVICE)]
    c = [torch.zeros(4, 2, device=DEVICE, requires_grad=True), torch.zeros(3, 2, device=DEVICE)]
    d = [torch.zeros(4, 2, device=DEVICE), torch.zeros(3, 2, device=DEVICE)]
    with pytest.raises(CallError, match=r"out= cannot be written where autograd records"):
        k(a, b, out=(c, d))
    assert not c[0].detach().any()
    with torch.no_grad():
        k(a, b, out=(c, d))
    torch.testing.assert_close(c[0].detach(), 2 * (a[0] @ b[0]), atol=2e-2, rtol=2e-2)   # TF32 on a GPU


def test_torch_func_transforms_and_forward_mode_duals_are_refused():
    """kgen kernels compute no derivative and read no batched tensor: under torch.func's grad,
    vmap or jvp, or on a forward-mode dual tensor, a call is a CallError naming the kernel,
    never a tangent silently dropped or an error from inside torch."""
    import torch.autograd.forward_ad as fwAD
    k = kgen.compile("Y = X * sigmoid(X) + B")
    x, b = torch.randn(3, 4, device=DEVICE), torch.randn(4, device=DEVICE)
    transforms = (lambda: torch.func.grad(lambda x: k(x, b).sum())(x),
                  lambda: torch.func.vmap(lambda x: k(x, b))(x),
                  lambda: torch.func.jvp(lambda x: k(x, b), (x,), (torch.ones_like(x),)))
    for run in transforms:
        with pytest.raises(CallError, match=r"^y: kgen kernels do not run under torch.func transforms"):
            run()
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(CallError, match=r"^y: an input carries a forward-mode tangent"):
            k(dual, b)
        torch.testing.assert_close(k(x, b), x * torch.sigmoid(x) + b)     # plain tensors run there
    torch.testing.assert_close(k(x, b), x * torch.sigmoid(x) + b)


def test_a_kernel_first_called_inside_torch_compile():
    """A headerless kernel generated for its first call inside code that torch.compile traces
    (on Triton's interpreter, where the calls run as they are, and on a GPU, traced)."""
    k = kgen.compile("y = exp(x) - 1")
    model = torch.compile(lambda x: k(x) * 2, backend="aot_eager")
    x = torch.randn(33, 5, device=DEVICE)
    torch.testing.assert_close(model(x), (torch.exp(x) - 1) * 2)


class Block(torch.nn.Module):
    """A model that holds a kernel (at module level: pickle finds classes by name)."""

    def __init__(self):
        super().__init__()
        self.act = kgen.compile("y = x * sigmoid(x)")

    def forward(self, x):
        return self.act(x)


def test_kernels_copy_and_pickle_as_their_specs():
    """A model that holds kgen kernels can be deep-copied (an EMA copy) and pickled (saved
    whole, sent to a spawned worker): each kernel is made again from its spec (a headerless
    kernel's specialization from the key of the call that made it) and computes the same."""
    import copy
    import io
    import pickle
    x = torch.randn(6, 10, device=DEVICE)
    several = kgen.compile("kernel a(X: f32[N]) -> Y: f32[N] { Y = X * 2 }\n"
                           "kernel b(X: f32[N]) -> Y: f32[N] { Y = X + 1 }")
    headerless = kgen.compile("y = exp(x) - 1")
    headerless(x)
    cases = [(kgen.compile(ROOT / "specs" / "softmax.k"), lambda k: k(x.half()), torch.softmax(x.half().float(), -1)),
             (several, lambda k: k.b(x[0]), x[0] + 1), (several.a, lambda k: k(x[0]), x[0] * 2),
             (headerless, lambda k: k(x), torch.exp(x) - 1), (headerless._last, lambda k: k(x), torch.exp(x) - 1)]
    for original, call, want in cases:
        for twin in (copy.copy(original), copy.deepcopy(original), pickle.loads(pickle.dumps(original))):
            assert type(twin) is type(original) and twin is not original and repr(twin) == repr(original)
            torch.testing.assert_close(call(twin).float(), want, atol=2e-3, rtol=2e-3)

    saved = io.BytesIO()
    torch.save(Block(), saved)
    saved.seek(0)
    for block in (copy.deepcopy(Block()), torch.load(saved, weights_only=False)):
        torch.testing.assert_close(block(x), x * torch.sigmoid(x))
