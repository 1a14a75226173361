"""The host side every pattern shares: the generated function's signature, the
checks that turn a bad call into a clear error before any launch, the binding of
symbolic dims to sizes, and the outputs' allocation."""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..errors import UnsupportedError
from ..ir import KernelIR, Param, Shape, type_str
from ..lower import literal


# The widest the _outputs(...) call is printed on one line (indented by 4 in the host function).
ALLOCATE_WIDTH = 100


@dataclass(frozen=True)
class Host:
    signature: str               # "X, B, alpha=0.01, *, out=None"
    checks: tuple[str, ...]      # lines that validate arguments and bind dims
    outputs: tuple[str, ...]     # output variable names
    allocate: str                # "(Y,) = _outputs(out, device, ...)"
    returns: str                 # "Y" or "(Y, Z)"
    docstring: str

    @property
    def nothing_to_write(self) -> str:
        """``Y.numel() == 0 and Z.numel() == 0``: every output empty, so no launch."""
        return " and ".join(f"{o}.numel() == 0" for o in self.outputs)


def torch_dtype(dtype: DType) -> str:
    return f"torch.{str(dtype.torch).removeprefix('torch.')}"


def shape_expr(shape: Shape) -> str:
    """A host expression for a symbolic shape: ``(M, N)``; dims are host locals."""
    dims = [str(d) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def scalar_kind(dtype) -> str:
    """The Python type a scalar parameter takes: ``float``, ``int`` or ``bool`` (by torch's category)."""
    return ("bool", "int", "float")[dtype.category]


def check_locals(kir: KernelIR, taken: frozenset[str], what: str, dims: frozenset[str] = frozenset()) -> None:
    """A spec's parameters and statements may not take a name that the generated kernel or
    host function (``what``) defines for itself, nor its parameters, outputs and dimensions
    (the host function's own arguments and locals) one of ``dims``, the host's locals."""
    host_values = {p.name for p in kir.params} | {s.name for s in kir.outputs}
    for name, span in [(p.name, p.span) for p in kir.params] + [(s.name, s.span) for s in kir.stmts]:
        if name in taken or (name in dims and name in host_values):
            raise UnsupportedError(f"'{name}' is a name the generated {what} uses itself; rename it", span)
    for p in kir.params:
        for d in p.shape or ():
            if isinstance(d, str) and d in dims:
                raise UnsupportedError(f"'{d}' is a name the generated {what} uses itself; rename the dimension",
                                       p.span)


def host(kir: KernelIR, inplace: bool = False, extra: tuple[str, ...] = ()) -> Host:
    """``inplace``: an ``out=`` tensor may be one of the inputs, exactly (elementwise
    kernels read each element before writing it); any other overlap is refused. ``extra``:
    tensors the host takes besides the spec's (the MoE form's ``offs``), that ``out=`` must
    not overlap either."""
    sig = []
    for p in kir.params:
        sig.append(p.name if p.default is None else f"{p.name}={literal(p.default)}")
    sig.append("*")
    sig.append("out=None")
    checks: list[str] = []
    bound: dict[str, str] = {}      # symbol -> name of the tensor it was read from
    tensors = [p for p in kir.params if not p.is_scalar]
    for p in tensors:
        declared = type_str(p.dtype, p.shape)
        checks.append(f'_check_tensor("{p.name}", {p.name}, {torch_dtype(p.dtype)}, {len(p.shape)}, "{declared}")')
        binding: dict[int, str] = {}          # axis -> a symbol this tensor is first to give
        for axis, d in enumerate(p.shape):
            if isinstance(d, str) and d not in bound and d not in binding.values():
                binding[axis] = d
        if binding and len(binding) == len(p.shape):
            checks.append(f"{', '.join(p.shape)}{',' if len(p.shape) == 1 else ''} = {p.name}.shape")
        else:
            checks.extend(f"{d} = {p.name}.shape[{axis}]" for axis, d in binding.items())
        bound.update({d: p.name for d in binding.values()})
        # an axis that gives a symbol is free, unless the symbol comes again (f32[N, N]: [3, 3])
        expected = [None if axis in binding and p.shape.count(d) == 1 else d for axis, d in enumerate(p.shape)]
        if any(e is not None for e in expected):
            sources = ", ".join(sorted({bound[d] for d in expected if isinstance(d, str)}))
            sizes = ", ".join(str(e) for e in expected)
            sizes = f"({sizes},)" if len(expected) == 1 else f"({sizes})"
            checks.append(f'_check_shape("{p.name}", {p.name}, {sizes}, "{declared}", "{sources}")')
    for p in kir.params:
        if p.is_scalar:
            checks.append(f'{p.name} = _check_scalar("{p.name}", {p.name}, {scalar_kind(p.dtype)})')
    devices = ", ".join(f'("{p.name}", {p.name})' for p in tensors)
    checks.append(f"device = _device({devices})")
    outs = tuple(o.name for o in kir.outputs)
    specs = [f'("{o.name}", {shape_expr(o.node.shape) if o.node.shape else "()"}, {torch_dtype(o.node.dtype)}, '
             f'"{type_str(o.node.dtype, o.node.shape)}")' for o in kir.outputs] + (["inplace=True"] if inplace else [])
    read = [p.name for p in tensors] + list(extra)
    inputs = ", ".join(f'("{t}", {t})' for t in read) + ("," if len(read) == 1 else "")
    call = f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = _outputs("
    allocate = f"{call}out, device, ({inputs}), {', '.join(specs)})"
    if len(allocate) > ALLOCATE_WIDTH:   # an output per line, under the first argument
        allocate = f",\n{' ' * (4 + len(call))}".join([f"{call}out, device, ({inputs})", *specs]) + ")"
    returns = outs[0] if len(outs) == 1 else f"({', '.join(outs)})"
    doc = (f"{', '.join(_param_str(p) for p in kir.params)} -> "
           f"{', '.join(f'{o.name}: {type_str(o.node.dtype, o.node.shape)}' for o in kir.outputs)}")
    return Host(", ".join(sig), tuple(checks), outs, allocate, returns, doc)


def _param_str(p: Param) -> str:
    t = type_str(p.dtype, p.shape)
    return f"{p.name}: [{t}]" if p.is_list else f"{p.name}: {t}"
