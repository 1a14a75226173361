"""Bad specs: each gives a KgenError (never a Lark exception or a Python traceback) with
``path:line:col: message``, the source line and a caret under the offending column."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgen
import kgen.dtypes as D
from kgen.check import Arg, headerless_inputs
from kgen.errors import CallError, KgenError, SpecError, UnsupportedError
from kgen.parse import parse
from kgen.pipeline import generate

from conftest import DEVICE, examples

PATH = "specs/bad.k"


def build(text: str):
    """The whole pipeline up to Triton source; a headerless spec gets f16 inputs of rank 2."""
    module = parse(text, PATH)
    args = None
    if module.kernels and module.kernels[0].headerless:
        inputs, _ = headerless_inputs(module.kernels[0])
        args = {"kernel": tuple(Arg(D.F16, (False, False)) for _ in inputs)}
    return generate(text, PATH, args)


def K(body: str, params: str = "X: f16[M, N]", out: str = "Y: f16[M, N]", tail: str = "") -> str:
    """A one-kernel module; the body starts on line 2, column 5."""
    return f"kernel f({params}) -> {out} {{\n    {body}\n}}\n{tail}"


def scheduled(*settings: str, kind: str = "gemm", dtype: str = "f16", body: str = "") -> str:
    """A kernel of one pattern whose schedule sets ``settings``, the first on line 5, column 5."""
    tail = "schedule f {\n" + "".join(f"    {s}\n" for s in settings) + "}\n"
    t = f"{dtype}[M, K]", f"{dtype}[K, N]", f"{dtype}[M, N]"
    return {"gemm": lambda: K(body or "C = A @ B", f"A: {t[0]}, B: {t[1]}", f"C: {t[2]}", tail),
            "grouped": lambda: K(body or "C = A @ B", f"A: [{t[0]}], B: [{t[1]}]", f"C: [{t[2]}]", tail),
            "elementwise": lambda: K(body or "Y = X * 2", tail=tail),
            "rows": lambda: K(body or "Y = sum(X, axis=-1)", out="Y: f16[M, 1]", tail=tail)}[kind]()


CASES = [
    # --- syntax ---------------------------------------------------------------------
    ("unexpected token", K("Y = X + )"), 2, 13, "unexpected ')'", SpecError),
    ("unexpected end of line", K("Y = X +"), 2, 12, "unexpected end of line", SpecError),
    ("unexpected end of input", "kernel f(X: f16[M, N]) -> Y: f16[M, N] {\n    Y = X\n", 2, 10,
     "unexpected end of input; expected '}'", SpecError),
    ("unclosed parenthesis", "Y = (X + 1", 1, 11, "unexpected end of input; expected ')'", SpecError),
    ("end of input after blank lines", "Y = X\n\n\nZ = (X +  \n\n  \n", 4, 9, "unexpected end of input", SpecError),
    # what the parser takes there, not what other states LALR merged with its own would
    ("closing a bracket never opened", "Y = X)", 1, 6, "unexpected ')'; expected the end of the input", SpecError),
    ("a float schedule value", K("Y = X", tail="schedule f {\n    num_warps = 4.0\n}\n"), 5, 18,
     "unexpected '.0'; expected '}'", SpecError),
    ("unexpected character", "Y = X $ 2", 1, 7, "unexpected character '$'", SpecError),
    ("indented with a tab", "kernel f(X: f16[M, N]) -> Y: f16[M, N] {\n\tY = sigmod(X)\n}\n", 2, 6,
     "unknown function 'sigmod'", SpecError),
    ("non-ascii character", "Y = é + 1", 1, 5, "unexpected character 'é'", SpecError),
    ("chained comparison", K("Y = X < 1 < 2"), 2, 15, "unexpected '<'", SpecError),
    ("indexing", K("Y = X[0]"), 2, 10, "unexpected '['; expected '(', '*', '/' or '@', '**', '+' or '-', '}'",
     SpecError),
    ("positional after keyword", K("Y = leaky_relu(alpha=0.1, X)"), 2, 31,
     "positional argument after a keyword argument", SpecError),
    ("huge literal", K("Y = X * 1e999"), 2, 13, "number 1e999 is too large for a float", SpecError),
    ("huge default", K("Y = X * a", "X: f16[M, N], a: f32 = 1e999"), 1, 33, "too large", SpecError),
    # --- names ----------------------------------------------------------------------
    ("unknown name", K("Y = Xs + 1"), 2, 9, "unknown name 'Xs' (did you mean 'X'?)", SpecError),
    ("unknown name, no close match", K("Y = X + qqq"), 2, 13, "unknown name 'qqq'", SpecError),
    ("unknown function", K("Y = sigmod(X)"), 2, 9, "unknown function 'sigmod' (did you mean 'sigmoid'?)",
     SpecError),
    ("unknown function, headerless", "t = X * 2\nY = gleu(t)", 2, 5,
     "unknown function 'gleu' (did you mean 'gelu'?)", SpecError),
    ("unknown dtype", K("Y = X", "X: f61[M, N]"), 1, 13, "unknown dtype 'f61' (did you mean 'f16'?)", SpecError),
    ("unknown output dtype", K("Y = X", out="Y: flaot[M, N]"), 1, 30, "unknown dtype 'flaot'", SpecError),
    ("reserved name tl", K("Y = tl", "tl: f16[M, N]"), 1, 10, "'tl' cannot name a parameter", SpecError),
    ("reserved name def", K("def = X\n    Y = X"), 2, 5, "'def' cannot name a value", SpecError),
    ("reserved name os", K("os = X\n    Y = os"), 2, 5, "'os' cannot name a value", SpecError),
    ("reserved name X_ptr", K("Y = X_ptr", "X_ptr: f16[M, N]"), 1, 10, "'X_ptr' cannot name a parameter",
     SpecError),
    ("reserved host local", K("Y = device", "device: f16[M, N]"), 1, 10, "'device' cannot name", SpecError),
    ("reserved kernel name", "kernel torch(X: f16[N]) -> Y {\n    Y = X\n}\n", 1, 8, "'torch' cannot name a kernel",
     SpecError),
    ("reserved output name", K("out = X", out="out"), 2, 5, "'out' cannot name a value", SpecError),
    ("reserved function name", K("exp = X\n    Y = exp"), 2, 5, "'exp' cannot name a value", SpecError),
    ("reserved headerless name", "Y = X_stride0 * 2", 1, 5, "'X_stride0' cannot name a parameter", SpecError),
    # --- definitions ----------------------------------------------------------------
    ("duplicate assignment", K("Z = X\n    Z = X + 1\n    Y = Z"), 3, 5, "'Z' is already assigned", SpecError),
    ("duplicate headerless assignment", "Y = X\nY = X + 1", 2, 1, "'Y' is assigned twice", SpecError),
    ("headerless input assigned", "Y = X + 1\nX = Y", 2, 1, "'X' is read before it is assigned", SpecError),
    ("number cast past int32", "Y = X + i32(1e10)", 1, 9, "i32(10000000000.0) is outside int32", SpecError),
    ("number past a declared i32 output", K("Y = 1e10", out="Y: i32"), 1, 30,
     "output 'Y' is declared i32, which cannot hold 10000000000.0", SpecError),
    ("assigning a parameter", K("X = X + 1\n    Y = X"), 2, 5, "'X' is a parameter", SpecError),
    ("output never assigned", K("Z = X"), 1, 27, "output 'Y' is never assigned", SpecError),
    ("empty body", "kernel f(X: f16[N]) -> Y {\n}\n", 1, 24, "output 'Y' is never assigned", SpecError),
    ("default before none", K("Y = X * a", "a: f32 = 1.0, X: f16[M, N]"), 1, 24,
     "parameter 'X' has no default but follows 'a', which has one; put the parameters with defaults last",
     SpecError),
    ("parameter twice", K("Y = X", "X: f16[M, N], X: f16[M, N]"), 1, 24, "parameter 'X' is declared twice",
     SpecError),
    ("kernel twice", K("Y = X") + K("Y = X"), 4, 8, "kernel 'f' is defined twice", SpecError),
    ("dimension as value", K("N = X\n    Y = N"), 2, 5, "'N' names both a dimension and a value", SpecError),
    ("tensor default", K("Y = X", "X: f16[M, N] = 1"), 1, 25, "only scalar parameters can have a default",
     SpecError),
    ("int default", K("Y = X * n", "X: f16[M, N], n: i32 = 1.5"), 1, 33, "default 1.5 is not a valid i32",
     SpecError),
    ("rank 5", K("Y = X", "X: f16[M, N, K, L, P]", "Y"), 1, 13, "tensors of rank 5 are not supported", SpecError),
    ("declared shape differs", K("Y = X", out="Y: f16[N, M]"), 1, 30,
     "output 'Y' is declared f16[N, M] but the body computes f16[M, N]", SpecError),
    # --- calls ----------------------------------------------------------------------
    ("wrong arity", K("Y = exp(X, X)"), 2, 9, "exp takes at most 1 arguments (x), got 2", SpecError),
    ("missing argument", K("Y = where(X > 0, X)"), 2, 9, "where needs 'b'", SpecError),
    ("unknown keyword", K("Y = leaky_relu(X, alpah=0.1)"), 2, 23,
     "leaky_relu has no argument 'alpah' (did you mean 'alpha'?)", SpecError),
    ("keyword twice", K("Y = exp(X, x=X)"), 2, 16, "exp got 'x' twice", SpecError),
    ("max of two tensors", K("Y = max(X, X, 1)"), 2, 9, "use maximum(a, b)", SpecError),
    ("read before assigned", K("Y = Z + X; Z = X"), 2, 9, "'Z' is read before it is assigned; assign it first",
     SpecError),
    ("min of two tensors", K("Y = min(X, W)", "X: f16[M, N], W: f16[M, N]"), 2, 16,
     "axis must be an integer literal (for the elementwise minimum use minimum(a, b))", SpecError),
    ("clamp without bounds", K("Y = clamp(X)"), 2, 9, "clamp needs lo, hi or both", SpecError),
    ("where's condition", K("Y = where(X, X, X)"), 2, 15, "where's condition must be bool", SpecError),
    ("bool arithmetic", K("Y = (X > 0) * X"), 2, 10, "'*' does not take bool values", SpecError),
    ("integer power", K("Y = X ** 2", "X: i32[M, N]", "Y"), 2, 9, "integer powers are not supported", SpecError),
    # --- shapes ---------------------------------------------------------------------
    ("broadcast mismatch", K("Y = X + b", "X: f16[M, N], b: f16[K]"), 2, 9,
     "cannot broadcast f16[M, N] with f16[K]", SpecError),
    ("bad axis", K("Y = sum(X, axis=2)", out="Y"), 2, 21, "axis 2 is out of range for f16[M, N] (rank 2)",
     SpecError),
    ("bad axis, headerless", "Y = sum(X, axis=-3)", 1, 17, "axis -3 is out of range for f16[M, N] (rank 2)",
     SpecError),
    ("axis not a literal", "Y = sum(X, axis=N)", 1, 17, "axis must be an integer literal", SpecError),
    ("reduction of a scalar", K("Y = sum(s)", "s: f32", "Y"), 2, 13, "needs a tensor with at least one axis",
     SpecError),
    ("matmul inner dims", K("Y = X @ X", out="Y"), 2, 9, "inner dimensions differ: f16[M, N] @ f16[M, N]",
     SpecError),
    ("matmul dtypes", K("Y = X @ W", "X: f16[M, K], W: f32[K, N]", "Y"), 2, 9, "'@' needs operands of one dtype",
     SpecError),
    ("outputs of two shapes", K("Y = A + 1\n    Z = B * 2", "A: f16[M, N], B: f16[K]", "(Y: f16[M, N], Z: f16[K])"),
     3, 5, "must share one shape", UnsupportedError),
    # --- schedules ------------------------------------------------------------------
    ("schedule for unknown kernel", K("Y = X", tail="schedule g {\n    BLOCK_SIZE = 64\n}\n"), 4, 10,
     "schedule for unknown kernel 'g'", SpecError),
    ("schedule did-you-mean", "kernel softmax(X: f16[N]) -> Y {\n    Y = X\n}\nschedule sofmax {\n}\n", 4, 10,
     "schedule for unknown kernel 'sofmax' (did you mean 'softmax'?)", SpecError),
    ("schedule key twice", K("Y = X", tail="schedule f {\n    BLOCK_SIZE = 64\n    BLOCK_SIZE = 128\n}\n"), 6, 5,
     "'BLOCK_SIZE' is set twice", SpecError),
    ("two schedules", K("Y = X", tail="schedule f {\n}\nschedule f {\n}\n"), 6, 10, "has two schedule sections",
     SpecError),
    ("schedule value twice", K("Y = X", tail="schedule f {\n    BLOCK_SIZE = [64, 128, 64]\n}\n"), 5, 28,
     "64 is listed twice for 'BLOCK_SIZE'", SpecError),
    # a pattern's schedule checks: at the value, or at the entry when it is about the whole entry
    ("schedule key unknown to the pattern", K("Y = X", tail="schedule f {\n    BLOK_SIZE = 64\n}\n"), 5, 5,
     "not 'BLOK_SIZE'", SpecError),
    ("schedule value not a power of two", K("Y = X", tail="schedule f {\n    BLOCK_SIZE = [64, 96]\n}\n"), 5, 23,
     "BLOCK_SIZE must be a power of two, got 96", SpecError),
    ("elementwise num_warps", scheduled("num_warps = 3", kind="elementwise"), 5, 17,
     "num_warps must be a power of two, got 3", SpecError),
    ("GEMM SPLIT_K of 0", scheduled("BLOCK_M = [64, 128]", "SPLIT_K = 0"), 6, 15,
     "SPLIT_K takes positive integers, got 0", SpecError),
    ("GEMM SPLIT_K past CUDA's grid", scheduled("SPLIT_K = [2, 65536]"), 5, 19,
     "SPLIT_K takes at most 65535 (CUDA's programs along a grid's second axis), got 65536", SpecError),
    ("GEMM tile too small", scheduled("BLOCK_M = 8"), 5, 15,
     "BLOCK_M must be a power of two of at least 16 (tl.dot's smallest tile), got 8", SpecError),
    ("GEMM num_warps", scheduled("num_warps = [4, 6]"), 5, 21, "num_warps must be a power of two, got 6",
     SpecError),
    ("GEMM key unknown", scheduled("BLOCK_Q = 64"), 5, 5, "in their schedule, not 'BLOCK_Q'", SpecError),
    ("GEMM input_precision", scheduled("input_precision = bf16", dtype="f32"), 5, 23,
     "input_precision takes one of tf32, tf32x3, ieee, got bf16", SpecError),
    ("GEMM TMA not a flag", scheduled("TMA = [0, 2]"), 5, 15, "TMA takes 0 or 1, got 0, 2", SpecError),
    ("GEMM TMA of f32", scheduled("TMA = 1", dtype="f32"), 5, 11,
     "TMA = 1 needs 2-D 16-bit operands read as they are", SpecError),
    ("GEMM WS without TMA", scheduled("WS = 1"), 5, 10, "they need TMA = 1", SpecError),
    ("GEMM WS tiles that hang", scheduled("TMA = 1", "WS = 1"), 6, 10, "needs num_warps = 8", SpecError),
    ("GEMM SPLIT_K with TMA", scheduled("SPLIT_K = [1, 4]", "TMA = 1"), 5, 19,
     "SPLIT_K is an option of the tiled kernel: it needs TMA = 0", SpecError),
    ("grouped GEMM TMA not a flag", scheduled("TMA = 2", kind="grouped"), 5, 11, "TMA takes 0 or 1, got 2",
     SpecError),
    ("grouped GEMM TMA with a prologue", scheduled("TMA = 1", kind="grouped", body="C = relu(A) @ B"), 5, 11,
     "TMA = 1 needs 16-bit operands read as they are (no prologue)", SpecError),
    ("grouped GEMM tile too small", scheduled("BLOCK_K = [32, 8]", kind="grouped"), 5, 20,
     "BLOCK_K must be a power of two of at least 16", SpecError),
    ("grouped GEMM programs_per_sm", scheduled("programs_per_sm = 0", kind="grouped"), 5, 23,
     "programs_per_sm takes positive integers, got 0", SpecError),
    ("grouped GEMM key unknown", scheduled("SPLIT_K = 2", kind="grouped"), 5, 5, "in their schedule, not 'SPLIT_K'",
     SpecError),
    ("row-reduction tile", scheduled("BLOCK_N = 96", kind="rows"), 5, 15, "BLOCK_N must be a power of two, got 96",
     SpecError),
    ("row-reduction list", scheduled("num_warps = 4", "BLOCK_N = [64, 128]", kind="rows"), 6, 5,
     "BLOCK_N: a row-reduction kernel takes one value per schedule key", SpecError),
    ("row-reduction key unknown", scheduled("BLOCK_SIZE = 64", kind="rows"), 5, 5,
     "row-reduction kernels take BLOCK_N, BLOCK_ROWS, num_warps, num_stages in their schedule, not 'BLOCK_SIZE'",
     SpecError),
    ("16-bit scalar parameter", K("Y = X * s", "X: f16[M, N], s: f16 = 70000"), 1, 27,
     "a scalar parameter is f32, i32 or bool, not f16", SpecError),
    # an output is a list exactly where the kernel has list parameters (one per problem)
    ("output a list without list parameters", K("Y = X * 2", out="Y: [f16[M, N]]"), 1, 30,
     "output 'Y' is declared a list, but the kernel has no list parameters", SpecError),
    ("output one tensor of a grouped kernel", K("C = A @ B", "A: [f16[M, K]], B: [f16[K, N]]", "C: f16[M, N]"), 1, 48,
     "output 'C' is declared one tensor, but the kernel computes one per problem of its list parameters: "
     "declare it [f16[M, N]]", SpecError),
    ("output list of another shape", K("C = A @ B", "A: [f16[M, K]], B: [f16[K, N]]", "C: [f16[M, K]]"), 1, 48,
     "output 'C' is declared [f16[M, K]] but the body computes [f16[M, N]]", SpecError),
    # a ';' in a comment ends nothing; one outside does, where it stands
    ("semicolon inside brackets", "Y = exp(X +  # then; more\n   ; 1)\n", 2, 4, "unexpected ';'", SpecError),
    ("schedule alone", "# tuning only\nschedule f {\n    num_warps = 4\n}\n", 2, 10,
     "schedule for unknown kernel 'f'", SpecError),
]


@pytest.mark.parametrize("text, line, col, fragment, kind", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_spec(text, line, col, fragment, kind):
    with pytest.raises(KgenError) as info:
        build(text)
    err = info.value
    assert type(err) is kind, f"{type(err).__name__}: {err}"
    assert fragment in err.message
    assert (err.span.line, err.span.col) == (line, col), str(err)
    rendered = str(err).splitlines()
    assert rendered[0] == f"{PATH}:{line}:{col}: {err.message}"
    source_line = text.splitlines()[line - 1].replace("\t", " ")   # a tab shows as one space
    assert rendered[1] == "    " + source_line
    caret = rendered[2]
    assert caret.strip() and set(caret.strip()) == {"^"}
    assert caret.index("^") == 4 + col - 1, "the caret sits under the column"


def test_every_case_is_distinct():
    assert len({c[0] for c in CASES}) == len(CASES)
    assert len({c[1] for c in CASES}) == len(CASES)


def test_error_through_compile_and_call_names_the_file(tmp_path):
    spec = tmp_path / "oops.k"
    spec.write_text(K("Y = sigmod(X)"))
    with pytest.raises(SpecError) as info:
        kgen.compile(spec)
    assert str(info.value).startswith(f"{spec.as_posix()}:2:9: unknown function 'sigmod'")
    # a headerless spec's types come at its first call; its functions and their arguments, at compile
    with pytest.raises(SpecError, match=r"<string>:1:9: unknown function 'gleu' \(did you mean 'gelu'\?\)"):
        kgen.compile("Y = X + gleu(X)")
    for text, col, message in [("Y = exp(X, X)", 5, "exp takes at most 1 arguments"),
                               ("Y = X * leaky_relu(X, alpah=0.1)", 23, "leaky_relu has no argument 'alpah'"),
                               ("Y = where(X > 0, 1 + clamp(X), x=X)", 32, "where has no argument 'x'")]:
        with pytest.raises(SpecError, match=f"<string>:1:{col}: {message}"):
            kgen.compile(text)


def test_a_file_name_with_control_characters_stays_on_the_error_line(tmp_path):
    """file:line:col is one line whatever the file's name: a newline or a tab in it prints as
    Python escapes it, the source line and the caret below as ever."""
    spec = tmp_path / "a\nb\t.k"
    spec.write_text(K("Y = sigmod(X)"))
    with pytest.raises(SpecError) as info:
        kgen.compile(spec)
    head, line, caret = str(info.value).split("\n")
    assert head == f"{tmp_path.as_posix()}/a\\nb\\t.k:2:9: unknown function 'sigmod' (did you mean 'sigmoid'?)"
    assert line.strip() == "Y = sigmod(X)" and caret.strip() == "^^^^^^"


def test_missing_spec_file_and_empty_spec():
    with pytest.raises(KgenError, match="no such spec file"):
        kgen.compile("specs/does_not_exist.k")
    with pytest.raises(SpecError, match="no statements"):
        build("# nothing\n")
    with pytest.raises(KgenError, match="no such spec file"):
        kgen.compile("specs/run=3/nothing.k")          # a .k path, though it holds an '='
    for text in ("", "   ", "# only a comment"):       # text, not a path to look for
        with pytest.raises(SpecError, match="<string>:1:1: the spec has no statements"):
            kgen.compile(text)


@pytest.mark.parametrize("given", [b"y = x * 2", None, 3, ["y = x * 2"]])
def test_compile_takes_text_or_a_path_and_nothing_printed_as_one(given):
    """str(None) is a spec that reads None, str(b"y = x") one that starts with b': neither is
    what the caller meant."""
    with pytest.raises(CallError, match=f"expected spec text \\(a str\\) or a path to a .k file, "
                                        f"got {type(given).__name__}"):
        kgen.compile(given)


def test_a_statement_may_assign_a_name_like_a_keyword_of_the_language():
    """Only `kernel NAME` or `schedule NAME` starts a module: `schedule = X * 2` is a statement."""
    module = parse("schedule = X * 2\nY = schedule + 1", PATH)
    assert module.kernels[0].headerless and [s.target.id for s in module.kernels[0].body] == ["schedule", "Y"]


def test_kinds_are_kgen_errors():
    assert issubclass(SpecError, KgenError) and issubclass(CallError, KgenError)
    assert issubclass(UnsupportedError, SpecError)


@pytest.mark.parametrize("statement", ["Y = " + "exp(" * 1500 + "X" + ")" * 1500, "Y = X" + " + X" * 5000])
def test_deep_nesting_is_a_spec_error_at_its_statement(statement):
    """Past what the syntax tree's builder could recurse into: still at the statement, in a
    headerless spec and in a declared kernel."""
    with pytest.raises(SpecError, match="nests expressions more than") as info:
        build("t = X * 2\n" + statement)
    assert (info.value.span.line, info.value.span.col) == (2, 1)
    with pytest.raises(SpecError, match="nests expressions more than") as info:
        generate(K("t = X * 2\n    " + statement), PATH)
    assert (info.value.span.line, info.value.span.col) == (3, 5)


@pytest.mark.parametrize("nest, levels", [(lambda s: f"X - ({s})", 1), (lambda s: f"sin({s})", 1),
                                          (lambda s: f"X ** {s}", 1), (lambda s: f"X / ({s} + 2.0)", 2),
                                          (lambda s: f"where(X > 0, {s}, X)", 1)])
def test_statements_nested_past_the_limit_fail_at_their_line(nest, levels):
    """A statement deeper than MAX_DEPTH is a SpecError at the statement, never a SyntaxError
    or RecursionError from inside; one level less compiles."""
    from kgen.parse import MAX_DEPTH
    def spec(depth):
        text = "X"
        for _ in range(depth):
            text = nest(text)
        return K(f"t = X + 1.0\n    Y = {text}")
    generate(spec((MAX_DEPTH - 2) // levels), PATH)
    for depth in (MAX_DEPTH // levels + 1, 3 * MAX_DEPTH):
        with pytest.raises(SpecError) as info:
            generate(spec(depth), PATH)
        assert "deep" in info.value.message and info.value.span.line in (1, 3), str(info.value)


# chains that print deeper than one level each: a clamp with both bounds is two calls, a cast to
# f16 `.to(tl.float16).to(tl.float32)`, an integer to bf16 three `.to(...)`s
CHAINS = {"clamp": (1, lambda s: f"clamp({s}, -40.0, 40.0)", lambda x: x.clamp(-40, 40)),
          "f16": (1, lambda s: f"f16({s})", lambda x: x.half().float()),
          "bf16 of i32": (2, lambda s: f"bf16(i32({s}))", lambda x: x.int().bfloat16().float())}


@pytest.mark.parametrize("pattern", ["elementwise", "row reduction", "gemm prologue", "gemm epilogue",
                                     "grouped epilogue"])
@pytest.mark.parametrize("chain", CHAINS)
def test_statements_nested_to_the_limit_run_in_every_pattern(chain, pattern):
    """Code nested deeper than Triton's compiler and interpreter recurse or Python's parser
    takes is printed in named parts (ir.in_parts): a statement as deep as the limit allows
    runs and computes what torch computes, in every pattern (values are small integers, so
    every chain is exact)."""
    from kgen.parse import MAX_DEPTH
    levels, nest, ref = CHAINS[chain]

    def deep(s):
        for _ in range((MAX_DEPTH - 3) // levels):
            s = nest(s)
        return s

    def ints(*shape, dtype=torch.float32):
        return torch.randint(-60, 60, shape, device=DEVICE).to(dtype)
    x, a, b = ints(4, 24), ints(16, 8), ints(8, 16, dtype=torch.float16)
    small_a, small_b = a.half() / 8, b.clamp(-2, 2)   # products' sums below 256: exact
    product = ref(small_a.float() @ small_b.float())
    body, params, args, want = {
        "elementwise": (f"Y = {deep('X')}", "X: f32[M, N]", (x,), ref(x)),
        "row reduction": (f"Y = X - max({deep('X')})", "X: f32[M, N]", (x,), x - ref(x).amax(-1, keepdim=True)),
        "gemm prologue": (f"Y = f16({deep('A')}) @ B", "A: f32[M, K], B: f16[K, N]", (a, b),
                          ref(a).half().float() @ b.float()),
        "gemm epilogue": (f"Y = {deep('A @ B')}", "A: f16[M, K], B: f16[K, N]", (small_a, small_b), product),
        "grouped epilogue": (f"Y = {deep('A @ B')}", "A: [f16[M, K]], B: [f16[K, N]]", ([small_a], [small_b]),
                             [product]),
    }[pattern]
    k = kgen.compile(K(body, params, "Y: [f32[M, N]]" if pattern.startswith("grouped") else "Y: f32[M, N]"))
    assert "_part1 = " in k.source
    torch.testing.assert_close(k(*args), want, atol=0, rtol=0)


@pytest.mark.parametrize("where", ["expression", "dimension", "default", "schedule"])
def test_integer_literals_past_any_size_are_spec_errors(where):
    big = "9" * 5000
    text = {"expression": K(f"Y = X * {big}"), "dimension": K("Y = X", params=f"X: f16[M, {big}]"),
            "default": K("Y = X * a", params=f"X: f16[M, N], a: f32 = {big}"),
            "schedule": K("Y = X", tail=f"schedule f {{\n    BLOCK_SIZE = {big}\n}}\n")}[where]
    with pytest.raises(SpecError) as info:
        generate(text, PATH)
    assert len(str(info.value).splitlines()[0]) < 200, "the message shows the number shortened"


@pytest.mark.parametrize("setting, words, col", [("num_warps = 64", "num_warps takes integers from 1 to 32", 17),
                                                 ("BLOCK_SIZE = [1024, 4194304]", "BLOCK_SIZE takes integers", 25),
                                                 ("num_stages = 0", "num_stages takes integers from 1", 18)])
def test_schedule_values_past_tritons_limits_point_at_the_value(setting, words, col):
    with pytest.raises(SpecError) as info:
        generate(K("Y = X", tail=f"schedule f {{\n    {setting}\n}}\n"), PATH)
    assert words in info.value.message
    assert (info.value.span.line, info.value.span.col) == (5, col), str(info.value)


@pytest.mark.parametrize("separator", ["\u2028", "\x0c", "\r", "\x85"])
def test_carets_quote_the_line_the_parser_counted(separator):
    """Only \\n ends a line for the parser: a form feed, a lone carriage return or a Unicode
    line separator inside a line must not shift the quoted source line."""
    with pytest.raises(SpecError) as info:
        build(f"t = X # a{separator}b\nY = sigmod(t)")
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{PATH}:2:5:") and lines[1].strip() == "Y = sigmod(t)", lines


SEEDS = [
    K("t = leaky_relu(X * 2.5, alpha=0.2)\n    Y = where(t > 0, exp(t), -t) ** 2 + sum(X, axis=-1)",
      tail="schedule f {\n    BLOCK_SIZE = [64, 128]\n}\n"),
    "t = X * sigmoid(X) + B; Y = clamp(t, lo=-1, hi=1)\nZ = f16(t) @ W",
    "kernel g(A: [f16[M, K]], B: f32[4, N], s: f32 = -1) -> (C: f16[M, N], D) {\n    C = A\n    D = s\n}\n",
]
TOKENS = ["(", ")", ",", "=", "**", "@", "exp", "X", "1e999", "99999999999", "\n", ";", "[", "]", "{", "}",
          "kernel", "schedule", "->", ":", "f16", "#", "-", "axis=", "\\", "\t", "é", "i32", "bool", "0", ".",
          "out", "Y", "sum(", "max(X)", "[f16[N]]", "where(", "X > 0", " ", "N", "1.5", "bf16(X)"]


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        how = draw(st.integers(0, 2))
        if how == 0:
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif how == 1:
            text = text[:i] + text[i + draw(st.integers(1, 6)):]
        else:
            j = draw(st.integers(0, len(text)))
            text = text[:i] + text[min(i, j):max(i, j)] + text[i:]
    return text


@settings(deadline=None, max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_specs_fail_only_with_kgen_errors(text):
    """Whatever the text, the pipeline either generates source or raises a KgenError whose
    span (if any) points into the text."""
    try:
        build(text)
    except KgenError as e:
        assert type(e) in (SpecError, UnsupportedError)
        if e.span is not None:
            lines = text.splitlines() or [""]
            assert 1 <= e.span.line <= max(len(lines), 1)
            assert str(e).startswith(f"{PATH}:{e.span.line}:{e.span.col}: ")
