"""parse: text → syntax tree with spans (kgen.parse, kgen.syntax)."""
from __future__ import annotations

import pytest

from kgen import syntax as S
from kgen.errors import SpecError
from kgen.parse import parse

MODULE = """\
# two kernels and a schedule
kernel softmax(X: f16[M, N]) -> Y: f16[M, N] {
    m = max(X, axis=-1)   # row max
    e = exp(X - m)
    Y = e / sum(e, axis=-1)
}

kernel mm(A: f16[M, K], B: f16[K, N], alpha: f32 = 0.01, bias: f32[N],) -> (C: f16[M, N], D) {
    C = leaky_relu(A @ B, alpha)
    D = C
}
schedule mm {
    BLOCK_M = [64, 128]
    BLOCK_K = 64
    num_warps = [4, 8,]
}
"""


def test_module_with_several_kernels_and_a_schedule():
    m = parse(MODULE, "specs/two.k")
    assert [k.name.id for k in m.kernels] == ["softmax", "mm"]
    assert m.path == "specs/two.k" and m.text == MODULE
    softmax, mm = m.kernels
    assert not softmax.headerless
    (x,) = softmax.params
    assert x.name.id == "X" and x.type.dtype.id == "f16" and not x.type.is_list
    assert [d.id for d in x.type.shape] == ["M", "N"]
    assert [o.name.id for o in softmax.outputs] == ["Y"]
    assert [s.target.id for s in softmax.body] == ["m", "e", "Y"]

    assert [p.name.id for p in mm.params] == ["A", "B", "alpha", "bias"]
    alpha = mm.params[2]
    assert alpha.type.shape is None and alpha.default.value == 0.01 and alpha.default.text == "0.01"
    assert [o.name.id for o in mm.outputs] == ["C", "D"]
    assert mm.outputs[1].type is None                      # an output without a declared type
    c = mm.body[0].value
    assert isinstance(c, S.Call) and c.func.id == "leaky_relu"
    assert isinstance(c.args[0], S.BinOp) and c.args[0].op == "@"


def test_schedule_lists_are_candidates_and_scalars_are_not():
    (sched,) = parse(MODULE).schedules
    assert sched.kernel.id == "mm"
    choices = {c.key.id: c for c in sched.choices}
    assert choices["BLOCK_M"].is_list and [v.value for v in choices["BLOCK_M"].values] == [64, 128]
    assert not choices["BLOCK_K"].is_list and [v.value for v in choices["BLOCK_K"].values] == [64]
    assert choices["num_warps"].is_list and [v.value for v in choices["num_warps"].values] == [4, 8]
    one = parse("kernel k(X: f32[N]) -> Y {\n Y = X\n}\nschedule k { BLOCK_SIZE = [256] }\n").schedules[0]
    assert one.choices[0].is_list and [v.value for v in one.choices[0].values] == [256]


@pytest.mark.parametrize("text", [
    "t = X * 2; Y = t + B",
    "t = X * 2\nY = t + B",
    "t = X * 2;\n\nY = t + B\n",
    "# comment first\nt = X * 2   # trailing comment\n\n# between\nY = t + B  # last",
    "\n\n   t = X * 2 ;   Y = t + B ;",
    "t = X * 2\r\nY = t + B\r\n",
])
def test_headerless_separators_and_comments(text):
    m = parse(text)
    (k,) = m.kernels
    assert k.headerless and m.schedules == ()
    assert [s.target.id for s in k.body] == ["t", "Y"]
    assert isinstance(k.body[1].value, S.BinOp) and k.body[1].value.op == "+"


def test_a_schedule_after_headerless_statements_says_it_needs_a_header():
    with pytest.raises(SpecError, match=r"a schedule section belongs to a kernel with a header") as info:
        parse("Y = X * 2\nschedule y { BLOCK_SIZE = 64 }")
    assert (info.value.span.line, info.value.span.col) == (2, 10)
    with pytest.raises(SpecError) as info:   # a header in the file: the plain syntax error
        parse("kernel y(X: f32[N]) -> Y: f32[N] { Y = X * 2 }\nschedule y { BLOCK_SIZE = 64 ")
    assert "belongs to a kernel" not in str(info.value)


@pytest.mark.parametrize("text, line, col, hint", [
    ("kernel 2f(X: f32[N]) -> Y { Y = X }", 1, 8, "a kernel's name starts with a letter"),
    ("# a comment\nkernel 2f(X: f32[N]) -> Y { Y = X }", 2, 8, "a kernel's name starts with a letter"),
    ("Y = X * 2\nkernel f(X: f32[N]) -> Y { Y = X }", 2, 8,
     "statements without a header cannot sit beside a kernel definition: put them in its body"),
    ("kernel = X +", 1, 13, None),   # a value named kernel: the plain syntax error
])
def test_a_kernel_line_read_as_statements_says_why(text, line, col, hint):
    """Text whose first word is not a well-formed header is statements: a kernel line among
    them says why it could not start a kernel, not only which token the statement expected."""
    with pytest.raises(SpecError) as info:
        parse(text)
    assert (info.value.span.line, info.value.span.col) == (line, col)
    message = str(info.value).splitlines()[0]
    assert (hint in message) if hint else not any(h in message for h in ("kernel's name", "header"))


def test_multi_line_calls_and_continuations():
    text = ("Y = where(X > 0,\n          X,\n          leaky_relu(X,\n                     alpha=0.2))\n"
            "Z = X + \\\n    1")
    (k,) = parse(text).kernels
    y, z = k.body
    assert y.value.func.id == "where" and len(y.value.args) == 3
    inner = y.value.args[2]
    assert inner.func.id == "leaky_relu" and inner.kwargs[0][0].id == "alpha"
    assert (y.span.line, y.span.end_line) == (1, 4)
    assert z.span.line == 5 and isinstance(z.value, S.BinOp)


def test_a_newline_in_brackets_does_not_end_a_statement_but_a_semicolon_does():
    with pytest.raises(SpecError):
        parse("Y = exp(X;\n)")
    # nor does a ';' inside a comment there: a comment per parameter may say anything
    (k,) = parse("Y = (X +   # add one; then done\n     1)").kernels
    assert [s.target.id for s in k.body] == ["Y"]
    m = parse("kernel scale(x: f32[N],   # the input; any length\n             s: f32) -> y: f32[N] {\n"
              "    y = x * s\n}\n")
    assert [p.name.id for p in m.kernels[0].params] == ["x", "s"]


def test_spans_are_one_based_lines_and_columns():
    text = "kernel f(X: f32[N]) -> Y {\n    t = exp(X)\n    Y = t *   sigmoid(X)\n}\n"
    (k,) = parse(text, "a.k").kernels
    assert (k.name.span.line, k.name.span.col, k.name.span.end_col) == (1, 8, 9)
    x = k.params[0]
    assert (x.name.span.line, x.name.span.col) == (1, 10)
    assert (x.type.span.col, x.type.span.end_col) == (13, 19)     # f32[N]
    t, y = k.body
    assert (t.span.line, t.span.col, t.span.end_col) == (2, 5, 15)
    assert (y.target.span.line, y.target.span.col) == (3, 5)
    call = y.value.right
    assert isinstance(call, S.Call)
    assert (call.span.line, call.span.col, call.span.end_col) == (3, 15, 25)
    assert (call.func.span.col, call.func.span.end_col) == (15, 22)
    assert str(call.span) == "a.k:3:15"
    for node in (k.span, t.span, call.span):
        assert node.text == text and node.path == "a.k"


def test_precedence_and_associativity():
    (k,) = parse("Y = A + B * C ** -D - E / F\nZ = -A ** 2\nW = A - B - C < A * B").kernels
    y, z, w = (s.value for s in k.body)
    # ((A + (B * (C ** (-D)))) - (E / F))
    assert y.op == "-" and y.right.op == "/"
    assert y.left.op == "+" and y.left.right.op == "*"
    power = y.left.right.right
    assert power.op == "**" and isinstance(power.right, S.Neg)
    # -(A ** 2), as in Python
    assert isinstance(z, S.Neg) and z.operand.op == "**"
    # comparisons bind loosest; - is left-associative
    assert w.op == "<" and w.left.op == "-" and w.left.left.op == "-"


def test_numbers():
    (k,) = parse("Y = X * 2 + 2.5 + .5 + 1e-3 + 3E2 + -4 + 5.").kernels
    values = []
    e = k.body[0].value
    while isinstance(e, S.BinOp) and e.op == "+":
        values.append(e.right)
        e = e.left
    assert [(n.value, type(n.value)) for n in reversed(values)] == [
        (2.5, float), (0.5, float), (0.001, float), (300.0, float), (-4, int), (5.0, float)]
    assert e.right.value == 2 and isinstance(e.right.value, int)
    assert values[1].text == "-4"


def test_integers_past_int32_become_floats():
    (k,) = parse("Y = X * 4294967296").kernels
    n = k.body[0].value.right
    assert isinstance(n.value, float) and n.value == 4294967296.0


def test_keyword_arguments_are_kept_apart():
    (k,) = parse("Y = clamp(X, lo=-1, hi=1.5)").kernels
    call = k.body[0].value
    assert len(call.args) == 1
    assert [(key.id, v.value) for key, v in call.kwargs] == [("lo", -1), ("hi", 1.5)]


def test_list_types_and_integer_dims():
    text = "kernel g(A: [f16[M, K]], B: f32[4, N]) -> C {\n    C = A\n}\n"
    (k,) = parse(text).kernels
    a, b = k.params
    assert a.type.is_list and [d.id for d in a.type.shape] == ["M", "K"]
    assert b.type.shape[0].value == 4 and b.type.shape[1].id == "N"


def test_empty_text_is_an_empty_headerless_body():
    (k,) = parse("").kernels
    assert k.headerless and k.body == ()
    (k,) = parse("# nothing here\n\n").kernels
    assert k.body == ()


def test_a_module_is_recognised_after_comments():
    m = parse("# header\n\n  # more\nkernel k(X: f32[N]) -> Y {\n    Y = X\n}\n")
    assert not m.kernels[0].headerless
    # a name that merely starts with "kernel" is a headerless statement
    m = parse("kernels = X + 1")
    assert m.kernels[0].headerless and m.kernels[0].body[0].target.id == "kernels"
    # after separators too, as the grammar takes them before a kernel
    m = parse(";\n; # x\nkernel k(X: f32[N]) -> Y {\n    Y = X\n}\n")
    assert not m.kernels[0].headerless and m.kernels[0].name.id == "k"


def test_syntax_tree_is_frozen():
    (k,) = parse("Y = X + 1").kernels
    with pytest.raises(AttributeError):
        k.body[0].target.id = "Z"  # type: ignore[misc]


@pytest.mark.parametrize("text, value", [("-0.5", -0.5), ("-5", -5), ("-2147483648", -2**31), ("2147483647", 2**31 - 1),
                                         ("2147483648", 2.0**31), ("- 3", -3)])
def test_defaults_keep_their_sign(text, value):
    """A default's "-" is part of its value (int32 runs from -2**31; larger ints are floats)."""
    (kernel,) = parse(f"kernel f(X: f32[N], a: f32 = {text}) -> Y: f32[N] {{ Y = X * a }}", "t.k").kernels
    default = kernel.params[1].default
    assert default.value == value and type(default.value) is type(value)
    assert default.text == text.replace(" ", "")
