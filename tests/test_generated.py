"""The committed generated/ modules of the elementwise specs, imported directly (as a
user who copied one would) and checked against torch; and they are up to date."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgen.pipeline import generate
from kgen.reference import evaluate
from kgen.render import WIDTH, _wrap

from conftest import DEVICE, examples

ROOT = Path(__file__).resolve().parent.parent
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=1e-3, rtol=2e-3)}


def _elementwise_modules() -> list[str]:
    """Stems of generated/*.py built from a spec whose kernels are all elementwise."""
    stems = []
    for path in sorted((ROOT / "generated").glob("*.py")):
        spec = ROOT / "specs" / f"{path.stem}.k"
        if spec.exists() and all(p.pattern == "elementwise" for p in
                                 generate(spec.read_text(), f"specs/{spec.name}").plans):
            stems.append(path.stem)
    return stems


ELEMENTWISE = _elementwise_modules()


def load(stem: str):
    """Import generated/<stem>.py by its path, as a standalone module."""
    name = f"kgen_test_generated_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "generated" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_named_specs_are_there():
    assert {"vector_add", "silu_mul", "bias_gelu"} <= set(ELEMENTWISE)


@pytest.mark.parametrize("stem", ELEMENTWISE)
def test_generated_file_is_up_to_date(stem):
    spec = ROOT / "specs" / f"{stem}.k"
    assert (ROOT / "generated" / f"{stem}.py").read_text() == generate(spec.read_text(), f"specs/{stem}.k").source, \
        f"generated/{stem}.py is stale: run kgen build specs/{stem}.k"


@pytest.mark.parametrize("path", sorted((ROOT / "generated").glob("*.py")), ids=lambda p: p.stem)
def test_generated_code_fits_in_the_width(path):
    long = [f"{path.name}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if len(line) > WIDTH and not line.lstrip().startswith("#")]
    assert not long, f"code lines over {WIDTH} columns: {long}"


@pytest.mark.parametrize("path", sorted((ROOT / "generated").glob("*.py")), ids=lambda p: p.stem)
def test_generated_modules_define_no_helper_they_do_not_read(path):
    """Each module keeps only the shared host helpers its own code reads: every top-level
    ``_name`` function or constant is read somewhere in the module."""
    tree = ast.parse(path.read_text())
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    defined = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    defined += [node.targets[0].id for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)]
    unread = [name for name in defined if name.startswith("_") and not name.startswith("__") and name not in read]
    assert not unread, f"{path.name}: {unread}"


def test_unread_helpers_go_with_their_comments():
    """A helper nothing reads goes with the comment lines right above it, and so does a
    helper read only by one that went; what is read stays, as it was."""
    from kgen.render import _drop_unread
    source = ("import math\n\n\n# why _a is there\ndef _a(x):\n    return _b(x)\n\n\n"
              "def _b(x):\n    return x\n\n\n# the limit\n_LIMIT = 3\n\n\n"
              "def _c(y):\n    return y + _LIMIT\n\n\ndef run(y):\n    return _c(y)\n")
    kept = _drop_unread(source)
    assert kept == ("import math\n\n\n# the limit\n_LIMIT = 3\n\n\n"
                    "def _c(y):\n    return y + _LIMIT\n\n\ndef run(y):\n    return _c(y)\n")
    # a name mentioned elsewhere, if only in a comment, is kept: a doubt never drops a helper
    doubt = "def _d():\n    return 1\n\n\ndef run():\n    return 2  # not _d\n"
    assert _drop_unread(doubt) == doubt


def test_long_lines_are_broken_without_changing_the_code():
    names = ", ".join(f"argument_{i}" for i in range(40))
    source = (f"def f(a, b):\n"
              f"    x = g({names}, h({names}), text=f\"{{a, b}}, {{b}}\")\n"
              f"    y = {' + '.join(['a'] * 70)}\n"
              f"    return x, y\n")
    wrapped = _wrap(source)
    assert ast.dump(ast.parse(wrapped)) == ast.dump(ast.parse(source))
    lines = wrapped.splitlines()
    assert len(lines) > len(source.splitlines())
    assert all(len(line) <= WIDTH for line in lines if "a + a" not in line)
    assert f"    y = {' + '.join(['a'] * 70)}" in lines          # nothing to break after: kept whole
    assert 'text=f"{a, b}, {b}")' in wrapped                    # never inside a string
    inner = next(line for line in lines if "h(" in line)
    assert lines[lines.index(inner) + 1].startswith(" " * (inner.index("h(") + 2) + "argument_")


def close(got, want):
    torch.testing.assert_close(got.double(), want.to(got.dtype).double(), equal_nan=True, **TOL[got.dtype])


@pytest.mark.parametrize("n", [1, 7, 1024, 1025, 3000])
def test_vector_add(n):
    m = load("vector_add")
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    close(m.vector_add(x, y), x.double() + y.double())
    out = torch.empty(n, device=DEVICE)
    assert m.vector_add(x[:n], y, out=out) is out
    close(out, x.double() + y.double())
    strided = torch.randn(2 * n, device=DEVICE)[::2]
    close(m.vector_add(strided, y), strided.double() + y.double())


SIZES = [1, 2, 3, 16, 17, 33, 64]


@settings(deadline=None, max_examples=examples(25), suppress_health_check=[HealthCheck.too_slow])
@given(m=st.sampled_from(SIZES), n=st.sampled_from(SIZES), transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_silu_mul(m, n, transposed, seed):
    mod = load("silu_mul")
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, n, generator=g) * 3).half().to(DEVICE)
    gate = (torch.randn(n, m, generator=g) * 3).half().to(DEVICE).t() if transposed else \
        (torch.randn(m, n, generator=g) * 3).half().to(DEVICE)
    y = mod.silu_mul(x, gate)
    assert y.dtype == torch.float16 and y.shape == (m, n)
    close(y, F.silu(x.double()) * gate.double())


@settings(deadline=None, max_examples=examples(25), suppress_health_check=[HealthCheck.too_slow])
@given(m=st.sampled_from(SIZES), n=st.sampled_from(SIZES), seed=st.integers(0, 2**16))
def test_bias_gelu(m, n, seed):
    mod = load("bias_gelu")
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, n, generator=g) * 3).half().to(DEVICE)
    bias = torch.randn(n, generator=g).half().to(DEVICE)
    y = mod.bias_gelu(x, bias)
    assert y.dtype == torch.float16 and y.shape == (m, n)
    close(y, F.gelu(x.double() + bias.double()))
    close(y, F.gelu(x.float() + bias.float()))              # what torch computes in f32


@settings(deadline=None, max_examples=examples(20), suppress_health_check=[HealthCheck.too_slow])
@given(stem=st.sampled_from(ELEMENTWISE), data=st.data())
def test_every_elementwise_module_matches_the_reference(stem, data):
    """Every elementwise module in generated/, including ones added later, against the
    float64 reference of its spec, with random sizes for its symbolic dims."""
    spec = ROOT / "specs" / f"{stem}.k"
    gen = generate(spec.read_text(), f"specs/{stem}.k")
    mod = load(stem)
    for kir in gen.kernels:
        sizes = {}
        args = {}
        for p in kir.params:
            if p.is_scalar:
                args[p.name] = p.default if p.default is not None else (1.5 if p.dtype.is_float else 3)
                continue
            shape = [d if isinstance(d, int) else sizes.setdefault(d, data.draw(st.sampled_from(SIZES), label=d))
                     for d in p.shape]
            args[p.name] = torch.randn(shape, device=DEVICE).to(p.dtype.torch)
        got = getattr(mod, kir.name)(*args.values())
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, evaluate(kir, args)):
            close(g, w)
