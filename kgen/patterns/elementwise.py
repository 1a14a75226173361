"""Elementwise: any pointwise DAG, one fused pass over the output's elements.

Two addressings in one kernel, picked per call: a flat one when every operand
is contiguous and of the output's shape (the fast path: offsets are the element
index), and a strided N-D one otherwise, which turns the element index into
coordinates and dots them with each operand's strides, so transposed, sliced and
broadcast (expanded) operands need no copy.  Offsets are int64 when an operand
spans 2**31 elements or more.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..autotune import Tuning
from ..errors import SpecError, UnsupportedError
from ..ir import KernelIR, POINTWISE, LEAVES, topo_order, type_str
from ..lower import Line, config_check, config_text, helpers_for, statement_lines, store_cast
from .host import Host, check_locals, host

# (below n_elements, BLOCK_SIZE, num_warps).  Measured on an H200 for x + y and a
# five-op f16 chain at 2**20..2**28 elements: 1024 x 4 warps is at or within noise of
# the best of 1024..16384 x 4..16 everywhere, and larger blocks lose up to 15% on
# compute-heavier chains.  A schedule section overrides it.
DEFAULT_BLOCKS = ((None, 1024, 4),)
# Contiguous calls of at least WIDE_FROM elements take WIDE_WARPS warps and WIDE_BYTES of the
# widest element a thread (f32: 1024 x 16, f16: 2048 x 16): more loads in flight.  On an H100
# (GPU time from graphs), x + y in f32 at 2**25..2**28 elements ran at 3010-3111 GB/s where
# 1024 x 4 ran at 2996-3056 (torch.compile, 512 x 8: 3015-3097), a four-op f16 chain gained
# 0.2-0.4%; at 2**24 neither gained.  Strided calls stay at 1024 x 4: gelu(x + bias) in f16
# lost 15% in 16 warps.
WIDE_FROM, WIDE_WARPS, WIDE_BYTES = 2**25, 16, 8
SCHEDULE_KEYS = ("BLOCK_SIZE", "num_warps")


@dataclass(frozen=True)
class Operand:
    name: str
    strides: tuple[tuple[int, int], ...]   # (output axis, operand axis) for each axis it varies along
    full: bool                             # has the output's shape: can take the flat path
    load: str                              # "" or ".to(tl.float32)"
    store: str                             # "" or ".to(tl.float16)" (outputs)
    scalar: bool                           # varies along no axis: one load, no offsets

    @property
    def strided_offsets(self) -> str:
        return " + ".join(f"idx{out_axis} * {self.name}_stride{axis}" for out_axis, axis in self.strides)


@dataclass(frozen=True)
class ElementwisePlan:
    name: str
    host: Host
    inputs: tuple[Operand, ...]
    scalars: tuple[str, ...]
    outputs: tuple[Operand, ...]
    sizes: tuple[str, ...]                 # host expressions for the output's dims
    body: tuple[Line, ...]
    helpers: tuple[str, ...]
    flat: bool                             # the flat path exists (every operand can be full)
    blocks: tuple[tuple[int | None, int, int], ...]
    wide_block: int | None                 # BLOCK_SIZE of large contiguous calls (None: the blocks alone)
    tuning: Tuning                         # the schedule's candidates, timed by kgen's autotuner
    config_check: str = config_check(SCHEDULE_KEYS, ())   # the host line for a config= given by the call
    pattern: str = "elementwise"
    template: str = "elementwise.jinja"

    @property
    def operands(self) -> tuple[Operand, ...]:
        return self.inputs + self.outputs

    @property
    def rank(self) -> int:
        return len(self.sizes)

    @property
    def live_axes(self) -> tuple[int, ...]:
        """The output's axes whose size is not the literal 1: the coordinates to split offs into
        (an axis of size 1 has coordinate 0, which no operand's offsets read)."""
        return tuple(axis for axis, size in enumerate(self.sizes) if size != "1")

    @property
    def coordinates(self) -> tuple[str, ...]:
        """The strided path's first lines: offs split into the output's coordinates."""
        if not self.live_axes:
            return ()
        shape = ", ".join(self.sizes)
        return (f"# offs -> coordinates in the output's shape [{shape}]",
                *coordinates(self.rank, axes=self.live_axes))

    @property
    def kernel_params(self) -> tuple[str, ...]:
        """The kernel's arguments after the pointers, one line per group: the
        output's sizes, then each operand's strides."""
        return self._params(("n_elements",))

    @property
    def block_params(self) -> tuple[str, ...]:
        """... and its block function's, which takes the mask made from n_elements."""
        return self._params(())

    def _params(self, first: tuple[str, ...]) -> tuple[str, ...]:
        groups = [first + tuple(f"size{axis}" for axis in self.live_axes[1:])]
        groups += [tuple(f"{op.name}_stride{axis}" for _, axis in op.strides) for op in self.operands]
        return tuple(", ".join(g) + "," for g in groups if g)

    @property
    def launch_args(self) -> tuple[str, ...]:
        """Host expressions for the kernel's arguments, grouped as ``kernel_params``."""
        groups = [tuple(op.name for op in self.inputs) + self.scalars + tuple(op.name for op in self.outputs),
                  ("n_elements",) + tuple(self.sizes[axis] for axis in self.live_axes[1:])]
        groups += [tuple(f"{op.name}.stride({axis})" for _, axis in op.strides) for op in self.operands]
        return tuple(", ".join(g) + "," for g in groups if g)

    @property
    def block_arguments(self) -> str:
        """What the kernel passes on to its block function: the pointers, sizes and strides (and
        CONTIGUOUS, which picks the flat path, where there is one)."""
        return " ".join((self.pointers,) + self.block_params + ("CONTIGUOUS",) * self.flat).rstrip(",")

    @property
    def constexprs(self) -> str:
        return "BLOCK_SIZE: tl.constexpr, " + "CONTIGUOUS: tl.constexpr, " * self.flat + "INT64: tl.constexpr,"

    @property
    def launch_constexprs(self) -> str:
        return "BLOCK_SIZE=BLOCK_SIZE, " + "CONTIGUOUS=contiguous, " * self.flat + "INT64=int64,"

    @property
    def pointers(self) -> str:
        return ", ".join(tuple(f"{op.name}_ptr" for op in self.inputs) + self.scalars
                         + tuple(f"{op.name}_ptr" for op in self.outputs)) + ","

    @property
    def config_lines(self) -> tuple[str, ...]:
        return tuple(map(config_text, self.tuning.configs))

    @property
    def block_choice(self) -> str:
        """``BLOCK_SIZE, num_warps = ...`` by element count (and contiguity)."""
        *small, (_, block, warps) = self.blocks
        if not small and not self.wide_block:
            return f"{block}, {warps}"
        text = f"({block}, {warps})"
        for limit, b, w in reversed(small):
            text = f"({b}, {w}) if n_elements < {limit} else {text}"
        if self.wide_block:
            wide_from = f"2**{WIDE_FROM.bit_length() - 1}"
            text = f"({self.wide_block}, {WIDE_WARPS}) if contiguous and n_elements >= {wide_from} else {text}"
        return text

    @property
    def block_note(self) -> tuple[str, ...]:
        """The comment above ``block_choice`` where it picks wide blocks."""
        if not self.wide_block:
            return ()
        return (f"large contiguous calls: {WIDE_WARPS} warps, {WIDE_BYTES} bytes of the widest element a thread, "
                "for more loads in flight",)

    @property
    def contiguous_test(self) -> str:
        return " and ".join(f"{op.name}.is_contiguous()" for op in self.operands if not op.scalar) or "True"

    @property
    def int64_test(self) -> str:
        """When offsets need int64: the flat index past the last block (a hand config's block may
        be 2**20), and on the strided path an operand reaching 2**31 elements or more."""
        strided = f"_needs_int64({', '.join(op.name for op in self.operands)})"
        return "n_elements + BLOCK_SIZE >= 2**31 or " + (f"not contiguous and {strided}" if self.flat else strided)


# Names the kernel and host function define for themselves (besides the ones check.py
# reserves for every pattern); a spec's names must differ.
KERNEL_LOCALS = frozenset({"CONTIGUOUS"})


def match(kir: KernelIR) -> ElementwisePlan | None:
    nodes = topo_order(o.node for o in kir.outputs)
    if any(n.op not in POINTWISE and n.op not in LEAVES for n in nodes):
        return None
    first = kir.outputs[0]
    shape = first.node.shape
    for o in kir.outputs[1:]:
        if o.node.shape != shape:
            raise UnsupportedError(f"the outputs of an elementwise kernel must share one shape: {first.name} is "
                                   f"{type_str(first.node.dtype, shape)}, {o.name} is "
                                   f"{type_str(o.node.dtype, o.node.shape)}", o.span)
    if any(p.is_list for p in kir.params):
        return None
    check_locals(kir, KERNEL_LOCALS, "elementwise kernel")
    rank = len(shape)
    used = {id(n) for n in nodes}
    inputs, scalars, names = [], [], {}
    for p in kir.params:
        node = kir.nodes[p.name]
        if id(node) not in used:
            continue
        names[id(node)] = p.name
        if p.is_scalar:
            scalars.append(p.name)
        else:
            inputs.append(_operand(p.name, p.shape, shape, load=_load_cast(p.dtype)))
    computed = {s.name: s.node for s in kir.stmts}
    outputs = tuple(_operand(o.name, shape, shape, store=store_cast(computed[o.name].dtype, o.node.dtype))
                    for o in kir.outputs)
    body = statement_lines(kir, [computed[o.name] for o in kir.outputs], names)
    blocks, candidates = _schedule(kir)
    # no flat path when every axis has size 1: there are no offsets to take; an operand of one
    # element (a 0-dim tensor) is one load on either path
    flat = rank > 0 and all(op.full or op.scalar for op in inputs) and not outputs[0].scalar
    widest = max([kir.nodes[op.name].dtype.bytes for op in inputs] + [o.node.dtype.bytes for o in kir.outputs])
    wide = flat and not kir.schedule   # a schedule's blocks are the spec's choice, the defaults' values too
    return ElementwisePlan(
        name=kir.name, host=host(kir, inplace=True), inputs=tuple(inputs), scalars=tuple(scalars), outputs=outputs,
        sizes=tuple(str(d) for d in shape), body=tuple(body), helpers=helpers_for(nodes) + ("check_config",),
        flat=flat, wide_block=WIDE_WARPS * 32 * WIDE_BYTES // widest if wide else None,
        # the candidates cost the host the same: timed on the GPU alone (graphs), as the GEMMs'
        blocks=blocks, tuning=Tuning(tuple({"BLOCK_SIZE": b, "num_warps": w} for b, w in candidates),
                                     graphs=True))


def _operand(name, shape, out_shape, load="", store="") -> Operand:
    offset = len(out_shape) - len(shape)
    strides = tuple((offset + axis, axis) for axis, d in enumerate(shape) if d != 1)
    return Operand(name, strides, tuple(shape) == tuple(out_shape), load, store, scalar=not strides)


def _load_cast(dtype) -> str:
    return f".to({dtype.compute.triton})" if dtype.compute is not dtype else ""



def _schedule(kir: KernelIR):
    unknown = set(kir.schedule) - set(SCHEDULE_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        raise SpecError(f"elementwise kernels take {', '.join(SCHEDULE_KEYS)} in their schedule, not '{key}'",
                        kir.schedule_span(key))
    block = kir.schedule.get("BLOCK_SIZE")
    warps = kir.schedule.get("num_warps")
    for key, values in kir.schedule.items():
        for v in values:
            if not isinstance(v, int) or v <= 0 or v & (v - 1):
                raise SpecError(f"{key} must be a power of two, got {v}", kir.schedule_span(key, v))
    if block is None and warps is None:
        return DEFAULT_BLOCKS, ()
    block = block or (1024,)
    warps = warps or (4,)
    candidates = tuple((b, w) for b in block for w in warps)
    # untuned (the interpreter, KGEN_AUTOTUNE=0): the first of the schedule's candidates
    return ((None, *candidates[0]),), candidates if len(candidates) > 1 else ()


def coordinates(rank: int, index: str = "offs", axes: tuple[int, ...] | None = None) -> tuple[str, ...]:
    """Lines that split a flat ``index`` into coordinates ``idx0 ... idx{rank-1}`` of a
    shape whose sizes past the first are ``size1 ...`` (row reductions split ``row``);
    ``axes``: only these (the others have size 1)."""
    axes = tuple(range(rank)) if axes is None else axes
    if len(axes) <= 1:
        return tuple(f"idx{axis} = {index}" for axis in axes)
    lines, rest = [], index
    for i in range(len(axes) - 1, 0, -1):
        lines.append(f"idx{axes[i]} = {rest} % size{axes[i]}")
        nxt = "rem" if i > 1 else f"idx{axes[0]}"
        lines.append(f"{nxt} = {rest} // size{axes[i]}")
        rest = "rem"
    return tuple(lines)

