"""What kgen guarantees about hostile specs: every outcome of the front end is a
kernel or a KgenError, and nothing from a spec reaches generated Python except
validated names and re-printed numbers."""
from __future__ import annotations

import ast
import os
import re
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kgen
from conftest import DEVICE, examples
from kgen import dtypes as D
from kgen.check import Arg
from kgen.parse import parse
from kgen.pipeline import generate
from kgen.render import hidden_calls

VALID = [
    "kernel softmax(X: f16[M, N]) -> Y: f16[M, N] {\n    m = max(X, axis=-1)\n    e = exp(X - m)\n"
    "    Y = e / sum(e, axis=-1)\n}\n",
    "kernel f(x: f32[N], y: f32[N], alpha: f32 = 0.5) -> z: f32[N] {\n    z = leaky_relu(x * y, alpha)  # c\n}\n"
    "schedule f {\n    BLOCK_SIZE = [256, 512]\n    num_warps = 4\n}\n",
    "kernel g(x: f16[M, N], b: f16[N]) -> (y: f16[M, N], z: f32[M, N]) {\n    y = gelu(x + b)\n"
    "    z = where(x > 0, f32(x) ** 2, clamp(x, lo=-1, hi=1))\n}\n",
    "Y = X * sigmoid(X) + B; Z = Y > 0",
    "h = relu(x)\ny = h * w + b\n",
]
TOKENS = ["kernel", "schedule", "X", "Y", "x", "f16", "f32", "[", "]", "(", ")", "{", "}", ",", ":", "->",
          "=", "+", "-", "*", "/", "@", "**", "<", "==", ";", "\n", "# note\n", "1", "2.5", "1e5", "axis",
          "sum", "max", "exp", "where", "M", "N", "-1", "\t", " "]


def outcome(text: str):
    """Generate every kernel of ``text`` (headerless ones with f32 matrices)."""
    module = parse(text, "fuzz.k")
    args = None
    if module.kernels and module.kernels[0].headerless:
        from kgen.check import headerless_inputs
        inputs, _ = headerless_inputs(module.kernels[0])
        args = {module.kernels[0].name.id: tuple(Arg(D.F32, (False, False)) for _ in inputs)}
    return generate(text, "fuzz.k", args)


def assert_kernel_or_kgen_error(text: str) -> None:
    try:
        generated = outcome(text)
    except kgen.KgenError as e:
        # a malformed spec's error is at its place: file:line:col, the line, a caret under it
        assert e.span is not None, str(e)
        lines = str(e).split("\n")
        assert re.match(r"fuzz\.k:\d+:\d+: ", lines[0]) and len(lines) >= 3 and "^" in lines[2], str(e)
        return
    assert_clean(generated.source)


# Only these may appear as names at module level in generated code.
ALLOWED_IMPORTS = {"torch", "triton", "triton.language", "math"}


def assert_clean(source: str) -> None:
    """The generated module parses, imports only what it may, and calls nothing dangerous."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= ALLOWED_IMPORTS, ast.dump(node)
        assert not isinstance(node, ast.ImportFrom), ast.dump(node)
        if isinstance(node, ast.Name):
            assert node.id not in {"exec", "eval", "__import__", "os", "sys", "open", "compile", "globals"}, node.id
        if isinstance(node, ast.Attribute):
            assert node.attr in ("__name__", "__module__") or not node.attr.startswith("__"), node.attr


# About 500 examples over the three fuzz tests in CI; KGEN_TEST_SCALE=25 for a long run.
FUZZ = settings(max_examples=examples(170), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=40))
def test_random_tokens(tokens):
    assert_kernel_or_kgen_error(" ".join(tokens))


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_mutated_specs(text, data):
    chars = list(text)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(chars)))
        action = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        c = data.draw(st.sampled_from(list("()[]{},:;=+-*/@<>#\n\t xX0.9e_") + ["\r", "\x00", "é", "\u2028"]))
        if action == "insert" or not chars:
            chars.insert(i, c)
        elif i < len(chars):
            chars[i] = c if action == "replace" else ""
    assert_kernel_or_kgen_error("".join(chars))


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_truncated_specs(text, data):
    assert_kernel_or_kgen_error(text[:data.draw(st.integers(0, len(text)))])


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(VALID), st.data())
def test_long_fuzz(text, data):
    """``pytest -m slow``: ten thousand mutated and truncated specs."""
    chars = list(text)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(chars)))
        chars.insert(i, data.draw(st.sampled_from(TOKENS + list("()[]{}#;\r\x00é"))))
    assert_kernel_or_kgen_error("".join(chars)[:data.draw(st.integers(0, len(chars)))])


@pytest.mark.parametrize("text", [
    "", "\n\n", "# only a comment", "Y = " + "(" * 5000 + "X" + ")" * 5000, "Y = " + " + ".join(["X"] * 3000),
    "Y = " + "-" * 3000 + "X", "Y = " + "9" * 400, "Y = 1e999 * X", "Y = X ** 1e308 ** 2",
    "kernel k(X: f32[" + ", ".join(["N"] * 50) + "]) -> Y { Y = X }",
])
def test_edge_inputs(text):
    assert_kernel_or_kgen_error(text)


def test_non_utf8_file(tmp_path):
    """At the first byte that is not UTF-8, its line shown with a caret (after a BOM and é)."""
    spec = tmp_path / "bad.k"
    spec.write_bytes(b"\xef\xbb\xbf# caf\xc3\xa9\nkernel f(x: f32[N]) -> y: f32[N] { y = x \xff\xfe }")
    with pytest.raises(kgen.SpecError) as info:
        kgen.compile(spec)
    lines = str(info.value).splitlines()
    assert lines[0].endswith("bad.k:2:42: byte 0xff is not UTF-8: save the spec as UTF-8"), lines
    assert lines[2].index("^") - 4 == 41, lines


# --- no code injection ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["os", "sys", "__import__", "exec", "eval", "def", "import", "lambda", "tl",
                                  "triton", "torch", "math", "pid", "offs", "mask", "X_ptr", "print", "None",
                                  "True", "_private", "BLOCK_SIZE", "kernel", "out", "gelu", "powf", "grid",
                                  "options", "params", "backend"])
def test_reserved_names_are_rejected(name):
    with pytest.raises(kgen.SpecError, match=f"'{re.escape(name)}'"):
        outcome(f"kernel f(x: f32[N]) -> y: f32[N] {{\n    {name} = x * 2\n    y = {name} + 1\n}}")


def test_kernel_may_not_be_named_after_generated_code():
    with pytest.raises(kgen.SpecError, match="'torch'"):
        outcome("kernel torch(x: f32[N]) -> y: f32[N] { y = x }")


def _template_names() -> list[str]:
    """Every identifier that the templates print themselves (outside Jinja tags, Python
    comments and strings), and the names Triton's launcher binds beside a kernel's
    arguments, that check.py does not reserve for every pattern."""
    from kgen.check import is_reserved
    from kgen.render import template_dir
    words = set()
    for path in sorted(template_dir().glob("*.jinja")):
        text = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", " ", path.read_text(), flags=re.S)
        text = re.sub(r'"""[\s\S]*?"""|#[^\n]*|"[^"\n]*"', " ", text)
        words |= set(re.findall(r"\b[A-Za-z_][A-Za-z_0-9]*\b", text))
    words |= {"options", "backend", "specialize_impl", "JITCallable", "params", "specialization", "warmup"}
    return sorted(w for w in words if not is_reserved(w))


# (less the names of the specs below)
TEMPLATE_NAMES = [n for n in _template_names() if n not in {"A", "B", "C", "X", "Y", "Z", "b", "w", "f", "P", "Q"}]
F = torch.nn.functional


def _run_named(pattern: str, name: str, device: str):
    """(kernel's result, torch's) for a spec of `pattern` with one value called `name`."""
    x, w = torch.randn(3, 37, device=device), torch.randn(37, device=device)
    if pattern == "elementwise":
        return kgen.compile(f"Y = X * {name} + Z")(x, 1.5, x.T.contiguous().T), x * 1.5 + x
    if pattern == "row_reduce":
        got = kgen.compile(f"Y = exp({name} - max({name})) / sum(exp({name} - max({name}))) * w")(x, w)
        return got, torch.softmax(x, -1) * w
    if pattern == "row_reduce_dim":
        spec = f"kernel f(X: f32[Q, {name}]) -> Y: f32[Q, {name}] {{ Y = X - max(X) }}"
        return kgen.compile(spec)(x), x - x.amax(-1, keepdim=True)
    b = torch.randn(37, 5, device=device)
    if pattern == "gemm":
        return kgen.compile(f"{name} = X @ B\nY = leaky_relu({name}) + b")(x, b, w[:5]), F.leaky_relu(x @ b) + w[:5]
    if pattern == "gemm_dim":
        spec = f"kernel f(A: f32[{name}, Q], B: f32[Q, P]) -> C: f32[{name}, P] {{ C = relu(A @ B) }}"
        return kgen.compile(spec)(x, b), torch.relu(x @ b)
    xs, bs = [x, x[:2, :7]], [b, b[:7, :3]]
    spec = f"kernel f(A: [f32[{name}, Q]], B: [f32[Q, P]]) -> C: [f32[{name}, P]] {{ C = relu(A @ B) }}"
    got = kgen.compile(spec if pattern == "grouped_dim" else f"C = relu(A @ {name})")(xs, bs)
    return torch.cat([g.flatten() for g in got]), torch.cat([torch.relu(a @ c).flatten() for a, c in zip(xs, bs)])


NAMED_PATTERNS = ["elementwise", "row_reduce", "row_reduce_dim", "gemm", "gemm_dim", "grouped_gemm", "grouped_dim"]


def _check_named(name: str, pattern: str) -> None:
    """A spec that names a value or a dimension as the generated code names one of its own
    (a local, a constexpr, a host variable) is refused at that name, or computes what it says."""
    try:
        got, want = _run_named(pattern, name, DEVICE)
    except kgen.KgenError as e:
        assert f"'{name}'" in str(e)
        return
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@FUZZ
@given(st.sampled_from(TEMPLATE_NAMES), st.sampled_from(NAMED_PATTERNS))
@example("FLATTEN", "grouped_gemm")   # a constexpr of the grouped kernels: Triton refused the clash on a GPU
@example("ROW_VEC", "row_reduce")      # ... and one of the on-chip row kernels
@example("ROW_VEC", "row_reduce_dim")  # ... a host local of the row kernels
@example("N_VEC", "gemm_dim")          # names the GEMM plan prints (not the templates): a constexpr ...
@example("X_VEC0", "gemm")             # ... and one derived from an operand's name
def test_names_the_templates_print_never_shadow_a_spec_name(name, pattern):
    _check_named(name, pattern)


@pytest.mark.slow
def test_every_name_the_templates_print_in_every_pattern():
    """The test above for every name and pattern (about 2,000 kernels: minutes)."""
    for name in TEMPLATE_NAMES:
        for pattern in NAMED_PATTERNS:
            _check_named(name, pattern)


# a value named {name} in a spec of each pattern
VALUE_SPECS = {
    "elementwise": "kernel f(X: f32[N], {name}: f32) -> Y: f32[N] {{ Y = X * {name} }}",
    "row_reduce": "kernel f({name}: f32[M, N]) -> Y: f32[M, N] {{ Y = {name} - max({name}) }}",
    "gemm": "kernel f(A: f32[M, K], {name}: f32[K, N]) -> C: f32[M, N] {{ C = relu(A @ {name}) }}",
    "grouped_gemm": "kernel f(A: [f32[M, K]], {name}: [f32[K, N]]) -> C: [f32[M, N]] {{ C = relu(A @ {name}) }}",
}
TEMPLATE_PATTERNS = {"elementwise.jinja": "elementwise", "row_reduce.jinja": "row_reduce", "gemm.jinja": "gemm",
                     "gemm_tma.jinja": "gemm", "grouped_gemm.jinja": "grouped_gemm"}


@pytest.mark.parametrize("template", sorted(TEMPLATE_PATTERNS))
def test_every_constexpr_of_a_patterns_kernels_is_refused_as_a_value_name(template):
    """Each constexpr parameter that a pattern's kernels declare (``NAME: tl.constexpr``) is
    refused as the name of a value in a spec of that pattern, at the name, where it would
    shadow the constexpr in the kernel's body (Hypothesis above draws among every name the
    templates print; this takes each constexpr, for the pattern whose kernels declare it)."""
    from kgen.render import template_dir
    names = sorted(set(re.findall(r"\b(\w+): tl\.constexpr", (template_dir() / template).read_text())))
    assert names
    for name in names:
        with pytest.raises(kgen.KgenError, match=f"'{name}'"):
            generate(VALUE_SPECS[TEMPLATE_PATTERNS[template]].format(name=name))


_SCOPES = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)


def _host_binds(source: str) -> set[str]:
    """The names that kernel f's host functions (f, f_moe: not jitted) assign, but for those that
    comprehensions bind in their own scope."""
    found = set()
    for fn in ast.parse(source).body:
        if not isinstance(fn, ast.FunctionDef) or fn.decorator_list or not re.fullmatch(r"f(_\w+)?", fn.name):
            continue
        todo = list(fn.body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            todo += [] if isinstance(node, _SCOPES) else ast.iter_child_nodes(node)
    return found


@pytest.mark.parametrize("dtype", ["f32", "f16"])   # f16 GEMMs print a TMA branch besides
@pytest.mark.parametrize("pattern", sorted(VALUE_SPECS))
def test_no_value_takes_a_name_its_host_function_binds(pattern, dtype):
    """A host function takes the spec's inputs as its arguments: each name it assigns for
    itself is refused as a value's name, or no longer assigned there (a GEMM's host once set
    its own ``tiles`` over an input of that name)."""
    spec = VALUE_SPECS[pattern].replace("f32[", f"{dtype}[")
    first = generate(spec.format(name="V"))
    kernel, = first.kernels
    own = {p.name for p in kernel.params} | {s.name for s in kernel.stmts}
    own |= {d for p in kernel.params for d in p.shape or () if isinstance(d, str)}
    names = sorted(_host_binds(first.source) - own)
    assert names
    for name in names:
        try:
            source = generate(spec.format(name=name)).source
        except kgen.KgenError as e:
            assert f"'{name}'" in str(e), str(e)
            continue
        assert name not in _host_binds(source), name


@contextmanager
def forced_chunk(columns: int):
    """KGEN_FORCE_CHUNK set while kernels are generated (a context, not a fixture: Hypothesis
    runs many examples per test call)."""
    before = os.environ.get("KGEN_FORCE_CHUNK")
    os.environ["KGEN_FORCE_CHUNK"] = str(columns)
    try:
        yield
    finally:
        if before is None:
            del os.environ["KGEN_FORCE_CHUNK"]
        else:
            os.environ["KGEN_FORCE_CHUNK"] = before


def _derived_suffixes() -> list[str]:
    """What the templates append to a kernel's name (``_looped_kernel``, ``_moe``, ...), and
    the same less a final ``_kernel``: second kernels that could meet the first's names."""
    from kgen.render import template_dir
    found = {m for path in template_dir().glob("*.jinja")
             for m in re.findall(r"\{\{ plan\.name \}\}(_\w+)", path.read_text())}
    return sorted(found | {s.removesuffix("_kernel") for s in found} - {""})


# a body per pattern, and what torch computes for it on the inputs below
KERNEL_BODIES = {
    "elementwise": ("(X: f32[M, N]) -> Y: f32[M, N] { Y = X * 2.0 }", lambda x, b, xs, bs: x * 2),
    "row_reduce": ("(X: f32[M, N]) -> Y: f32[M, N] { Y = X - max(X) }",
                   lambda x, b, xs, bs: x - x.max(-1, keepdim=True).values),
    "gemm": ("(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C = relu(A @ B) }",
             lambda x, b, xs, bs: torch.relu(x @ b)),
    "grouped_gemm": ("(A: [f32[M, K]], B: [f32[K, N]]) -> C: [f32[M, N]] { C = relu(A @ B) }",
                     lambda x, b, xs, bs: [torch.relu(p @ q) for p, q in zip(xs, bs)]),
}


@settings(max_examples=examples(85), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_derived_suffixes()), st.sampled_from(sorted(KERNEL_BODIES)),
       st.sampled_from(sorted(KERNEL_BODIES)))
def test_a_kernel_named_like_anothers_generated_code(suffix, first, second):
    """In one file, kernel f and kernel f<suffix> (f_looped, f_moe, ...): refused at the
    second when their generated names meet, else both compute what they say (rows 40
    wide with 16-column chunks, so the row reductions take their looped kernels)."""
    text = f"kernel f{KERNEL_BODIES[first][0]}\nkernel f{suffix}{KERNEL_BODIES[second][0]}\n"
    try:
        with forced_chunk(16):
            kernels = kgen.compile(text)
    except kgen.KgenError as e:
        assert f"'f{suffix}'" in str(e) and str(e).startswith("<string>:2:")
        return
    x, b = torch.randn(3, 40, device=DEVICE), torch.randn(40, 5, device=DEVICE)
    xs, bs = [x, x[:2, :7]], [b, b[:7, :3]]
    for name, kind in (("f", first), (f"f{suffix}", second)):
        args = (xs, bs) if kind == "grouped_gemm" else (x, b) if kind == "gemm" else (x,)
        got, want = kernels[name](*args), KERNEL_BODIES[kind][1](x, b, xs, bs)
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("suffix", ["", *_derived_suffixes()])
@pytest.mark.parametrize("pattern", sorted(VALUE_SPECS))
def test_a_value_named_like_its_kernels_generated_code(pattern, suffix):
    """A value of kernel f named as the module names f's code (f, f_configs, f_moe, ...) is
    refused at its name, or hides from no function of the module a function the module calls:
    a persistent GEMM kernel with a local f_tile once called its helper f_tile through it."""
    name = f"f{suffix}"
    try:
        source = generate(VALUE_SPECS[pattern].format(name=name)).source
    except kgen.KgenError as e:
        assert f"'{name}'" in str(e), str(e)
        return
    assert not hidden_calls(source)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parent.parent / "generated").glob("*.py")),
                         ids=lambda p: p.stem)
def test_generated_functions_hide_no_module_name(path):
    assert not hidden_calls(path.read_text())


@pytest.mark.parametrize("comment", ["\rimport os", "\x0cimport os", "\x0bimport os", "\u2028import os",
                                     "\x1cimport os", "\x85import os"])
def test_comments_never_become_code(comment, device):
    text = f"kernel f(x: f32[N]) -> y: f32[N] {{\n    y = (x +  # {comment}\n         1)\n}}"
    source = outcome(text).source
    assert_clean(source)
    assert "import os" not in source
    k = kgen.compile(text)
    x = torch.arange(5, dtype=torch.float32, device=device)
    torch.testing.assert_close(k(x), x + 1)


@pytest.mark.parametrize("space", ["\x0c", "\x0b", "\x1c", "\r", "\u2028"])
def test_operand_text_in_gemm_comments_never_becomes_code(space):
    """A GEMM prologue's own text is echoed in a comment ("relu(A), on each tile of A"):
    whitespace that Python would take as a line end (a form feed in the spec, which the
    grammar skips) must not carry the rest of it out of the comment."""
    text = f"kernel f(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {{\n    C = relu({space}A) @ B\n}}"
    try:
        source = outcome(text).source
    except kgen.SpecError as e:        # not whitespace to the grammar: refused where it stands
        assert str(e).startswith("fuzz.k:2:14: unexpected character"), str(e)
        return
    assert_clean(source)
    prologue = [line for line in source.split("\n") if "on each tile of A" in line]
    assert prologue and all(line.lstrip().startswith("#") for line in prologue), prologue
    a, b = torch.randn(5, 3, device=DEVICE), torch.randn(3, 4, device=DEVICE)
    torch.testing.assert_close(kgen.compile(text)(a, b), a.relu() @ b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("literal, error", [("1e309", "too large"), ("0x10", "unexpected"), ("1_000", "unexpected"),
                                            ("nan", "'nan' is no number"), ("inf", "'inf' is no number")])
def test_literals_are_handled_deliberately(literal, error):
    """Refused in both forms, at compile time (a headerless kernel read nan as an input before)."""
    with pytest.raises(kgen.SpecError, match=error):
        outcome(f"kernel f(x: f32[N]) -> y: f32[N] {{ y = x * {literal} }}")
    with pytest.raises(kgen.SpecError, match=error):
        kgen.compile(f"y = x * {literal}")


def test_literals_are_reprinted_not_pasted(device):
    text = "kernel f(x: f32[N]) -> y: f32[N] { y = x * 0001.2500000 + 1.e0 + 3e-2 }"
    source = outcome(text).source
    code = [line for line in source.splitlines() if line.strip().startswith("y =")]
    assert code == ["    y = x * 1.25 + 1.0 + 0.03"]
    x = torch.arange(4, dtype=torch.float32, device=device)
    torch.testing.assert_close(kgen.compile(text)(x), x * 1.25 + 1.0 + 0.03)


def test_spec_path_cannot_break_the_header(tmp_path):
    from kgen.pipeline import generate
    source = generate("kernel f(x: f32[N]) -> y: f32[N] { y = x }", "evil\nimport os\r.k").source
    assert_clean(source)
    assert "\nimport os" not in source


# --- calls that must fail before any launch -----------------------------------------

SOFTMAX = "kernel softmax(X: f32[M, N]) -> Y: f32[M, N] { Y = exp(X - max(X)) / sum(exp(X - max(X))) }"
ADD = "kernel add(x: f32[M, N], y: f32[M, N]) -> z: f32[M, N] { z = x + y }"


@pytest.mark.parametrize("spec", [SOFTMAX, "kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C = A @ B }"])
def test_out_may_not_overlap_an_input(spec, device):
    k = kgen.compile(spec)
    x = torch.randn(6, 6, device=device)
    args = [x] * len(k.inputs)
    with pytest.raises(kgen.CallError, match=r"out \(.\): overlaps"):
        k(*args, out=x)
    with pytest.raises(kgen.CallError, match="overlaps"):
        big = torch.randn(12, 6, device=device)
        k(*[big[:6]] * len(k.inputs), out=big[3:9])


def test_elementwise_out_may_be_an_input_exactly(device):
    k = kgen.compile(ADD)
    x, y = torch.randn(5, 7, device=device), torch.randn(5, 7, device=device)
    want = x + y
    assert k(x, y, out=x) is x
    torch.testing.assert_close(x, want)
    big = torch.randn(6, 7, device=device)
    with pytest.raises(kgen.CallError, match="overlaps x"):
        k(big[:5], y, out=big[1:])


def test_several_outs_may_not_overlap_each_other(device):
    k = kgen.compile("kernel two(x: f32[N]) -> (a: f32[N], b: f32[N]) { a = x + 1; b = x * 2 }")
    x = torch.randn(8, device=device)
    buf = torch.empty(12, device=device)
    with pytest.raises(kgen.CallError, match=r"out \(b\): overlaps a"):
        k(x, out=(buf[:8], buf[4:]))


# --- files and caches -----------------------------------------------------------------

def test_two_processes_compile_one_spec_at_once(tmp_path):
    import subprocess
    import sys
    script = ("import kgen, torch; k = kgen.compile('Y = X * 3 + 1'); x = torch.arange(6.); "
              "assert torch.equal(k(x), x * 3 + 1); print('ok')")
    env = {**os.environ, "KGEN_CACHE_DIR": str(tmp_path), "TRITON_INTERPRET": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == "ok", err
    modules = list(tmp_path.glob("kgen_*.py"))
    assert len(modules) == 1
    assert not list(tmp_path.glob(".*.tmp"))
    source = modules[0].read_text()
    assert_clean(source)


def _cached(text: str, tmp_path, monkeypatch):
    """(source, its file in a fresh module cache under tmp_path) for spec ``text``, loaded
    once; the in-process module table is emptied, so the next load reads the file."""
    from kgen import runtime
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    source = generate(text, "<string>").source
    monkeypatch.setattr(runtime, "_modules", {})
    runtime.load(source)
    (cached,) = tmp_path.glob("kgen_*.py")
    monkeypatch.setattr(runtime, "_modules", {})
    return source, cached


def test_a_corrupt_cached_module_is_rewritten(tmp_path, monkeypatch, device):
    from kgen import runtime
    source, cached = _cached("kernel corrupt_probe(x: f32[N]) -> y: f32[N] { y = x - 7 }", tmp_path, monkeypatch)
    cached.write_text("raise SystemExit('tampered')\n")
    module = runtime.load(source)
    assert cached.read_text() == source
    x = torch.arange(4.0, device=device)
    torch.testing.assert_close(module.corrupt_probe(x), x - 7)


def test_cached_bytecode_is_never_trusted(tmp_path, monkeypatch, device):
    """A module is compiled from the source kgen checked, so a __pycache__ file beside it
    (tampered, or of other code with the right timestamp) is never run; files are written
    readable as the umask allows now (set after kgen was imported), not mkstemp's 0600."""
    import importlib.util
    import py_compile
    from kgen import runtime
    before = os.umask(0o027)
    try:
        source, cached = _cached("kernel pyc_probe(x: f32[N]) -> y: f32[N] { y = x * 3 }", tmp_path, monkeypatch)
    finally:
        os.umask(before)
    assert cached.stat().st_mode & 0o777 == 0o640
    stat = cached.stat()
    tampered = "raise SystemExit('bytecode ran')\n#"
    cached.write_text(tampered + "#" * (len(source.encode()) - len(tampered)))   # same size: the pyc matches
    py_compile.compile(str(cached), cfile=importlib.util.cache_from_source(str(cached)))
    cached.write_text(source)
    os.utime(cached, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    module = runtime.load(source)
    x = torch.arange(4.0, device=device)
    torch.testing.assert_close(module.pyc_probe(x), x * 3)


def test_a_cached_module_changed_after_its_load_is_never_read_back(tmp_path, monkeypatch, device):
    """Triton reads a kernel's source back through inspect, at @triton.jit and (the interpreter) at
    the kernel's first call: it reads the text kgen checked, not the file, which another process
    may have changed since the load."""
    from kgen import runtime
    source, cached = _cached("kernel reread_probe(x: f32[N]) -> y: f32[N] { y = x + 2 }", tmp_path, monkeypatch)
    module = runtime.load(source)
    planted = tmp_path / "planted"
    cached.write_text(source.replace("    pid = tl.program_id(0)\n",
                                     f"    pid = tl.program_id(0); open({str(planted)!r}, 'w').close()\n", 1))
    assert "open(" in cached.read_text()
    x = torch.arange(4.0, device=device)
    torch.testing.assert_close(module.reread_probe(x), x + 2)
    assert not planted.exists()


def test_a_changed_cached_module_is_never_read_back_after_the_line_cache_is_cleared(tmp_path, monkeypatch,
                                                                                    device):
    """The same where something clears Python's line cache between the load and the kernel's
    first call (torch's inductor calls linecache.clearcache()): a kernel's call puts the checked
    text back first."""
    import linecache
    text = "kernel reread_cleared(x: f32[N]) -> y: f32[N] { y = x + 3 }"
    _, cached = _cached(text, tmp_path, monkeypatch)
    kernel = kgen.compile(text)
    planted = tmp_path / "planted"
    cached.write_text(cached.read_text().replace(
        "    pid = tl.program_id(0)\n", f"    pid = tl.program_id(0); open({str(planted)!r}, 'w').close()\n", 1))
    linecache.clearcache()
    x = torch.arange(4.0, device=device)
    torch.testing.assert_close(kernel(x), x + 3)
    assert not planted.exists()


def test_files_larger_than_memory_are_never_read_whole(tmp_path, monkeypatch, capsys, device):
    """A cached module, a built target or a spec of a terabyte (sparse: no disk used) is read only
    as far as kgen's own text would go: the module is rewritten, the target stale, the spec a
    KgenError, never a MemoryError."""
    from kgen import runtime
    from kgen.cli import main
    text = "kernel huge_probe(x: f32[N]) -> y: f32[N] { y = x * 5 }"
    source, cached = _cached(text, tmp_path / "cache", monkeypatch)
    os.truncate(cached, 1 << 40)
    module = runtime.load(source)
    assert cached.read_text() == source
    x = torch.arange(4.0, device=device)
    torch.testing.assert_close(module.huge_probe(x), x * 5)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "huge_probe.k").write_text(text + "\n")
    assert main(["build", "huge_probe.k", "-o", "out"]) == 0
    os.truncate(tmp_path / "out" / "huge_probe.py", 1 << 40)
    capsys.readouterr()
    assert main(["build", "huge_probe.k", "-o", "out", "--check"]) == 1
    assert "out/huge_probe.py: stale" in capsys.readouterr().out
    os.truncate(tmp_path / "huge_probe.k", 1 << 40)
    with pytest.raises(kgen.KgenError, match="huge_probe.k: cannot read the spec: it is longer than"):
        kgen.compile(tmp_path / "huge_probe.k")


def test_a_home_folder_that_cannot_be_found_is_a_kgen_error(monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", "~no_such_user_kgen_probe/cache")
    from kgen import runtime
    monkeypatch.setattr(runtime, "_modules", {})
    with pytest.raises(kgen.KgenError, match="cannot find the module cache's folder"):
        kgen.compile("kernel home_probe(x: f32[N]) -> y: f32[N] { y = x + 6 }")


@pytest.mark.parametrize("folder, why", [
    ("not_a_folder", "not_a_folder is a file, not a folder to write into"),
    ("not_a_folder/cache", "not_a_folder is a file, not a folder to write into"),
    ("dangling", "dangling is a symbolic link (gone) that leads to no folder to write into"),
])
def test_an_unusable_cache_folder_is_a_kgen_error_saying_why(tmp_path, monkeypatch, folder, why):
    from kgen import runtime
    (tmp_path / "not_a_folder").write_text("")
    (tmp_path / "dangling").symlink_to("gone")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / folder))
    monkeypatch.setattr(runtime, "_modules", {})
    with pytest.raises(kgen.KgenError, match=f"cannot write the module cache in .*: {re.escape(why)}$"):
        kgen.compile("kernel cache_probe(x: f32[N]) -> y: f32[N] { y = x + 5 }")


def test_a_folder_at_a_module_cache_entry_is_named_and_left(tmp_path, monkeypatch):
    """A folder where a cached module goes is no entry kgen wrote: never removed, and the error
    names it rather than calling the cache folder unwritable."""
    from kgen import runtime
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_modules", {})
    text = "kernel entry_probe(x: f32[N]) -> y: f32[N] { y = x + 7 }"
    kgen.compile(text)
    (entry,) = tmp_path.glob("kgen_*.py")
    entry.unlink()
    entry.mkdir()
    (entry / "mine").write_text("kept")
    monkeypatch.setattr(runtime, "_modules", {})
    with pytest.raises(kgen.KgenError, match=f"the module cache entry .*{re.escape(entry.name)} is a folder: "):
        kgen.compile(text)
    assert (entry / "mine").read_text() == "kept"


def test_a_cache_folder_with_control_characters_or_a_long_name_stays_one_short_line(tmp_path, monkeypatch):
    from kgen import runtime
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "a_file" / ("new\nline\x1b[31m" + "z" * 200)))
    monkeypatch.setattr(runtime, "_modules", {})
    with pytest.raises(kgen.KgenError) as info:
        kgen.compile("kernel odd_cache_probe(x: f32[N]) -> y: f32[N] { y = x + 8 }")
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message and len(message) < 400, repr(message)
    assert message.startswith("cannot write the module cache in ") and "a_file is a file" in message
