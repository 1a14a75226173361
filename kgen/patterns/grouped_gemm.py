"""Grouped GEMM: one persistent launch for a list of GEMMs of different sizes (Triton
tutorial 08, generalized), with the GEMM pattern's epilogues.

A kernel whose tensor parameters are lists (``A: [f16[M, K]]``) computes one problem
per list element; its dims are free per problem.  The body is a GEMM kernel's body
(one matmul of 2-D operands, a pointwise epilogue, an optional pointwise prologue), so
the operand tiles, the dot and the epilogue come from ``gemm.lower`` and are printed
by the same template pieces (``templates/gemm_parts.jinja``).

**The schedule.**  ``NUM_SMS * programs_per_sm`` persistent programs (at most one per
tile) walk the tiles of all problems: program ``p`` takes tiles ``p, p + P, p + 2P, ...``
of the concatenated tile space, where a problem's tiles are consecutive (in GROUP_M
order within the problem, as in the tiled GEMM).  Each program loads the problems' tile
ends (the running sum of tile counts) once, as a vector of ``G_BLOCK`` (a power of two
at or above G, at least 32), and finds a tile's problem with a comparison and two reductions: no
serial scan over problems, no data-dependent loop.  Problems without tiles (M = 0 or
N = 0) take no tiles and are skipped.  Unlike tutorial 08, partial tiles are masked
(rows and columns wrap around in the K loop and are masked at the store; K is masked
unless every K is a multiple of BLOCK_K), each problem has its own strides (row-major,
transposed or any), the K loop is pipelined (``num_stages``), and loads are vectorized
where the layout allows (below).  Where shared memory holds the K loop's buffers and the
epilogue's f32 tile at once (the host's ``FLATTEN``, from the config and the GPU's limit)
the tile loop is flattened with the K loop, so that the next tile's loads start during
this tile's last steps and its store.  With 128 x 256 tiles they do not fit together
unless the epilogue reads no other tensor and writes one 16-bit result, whose layout Triton
converts in place of the f32 tile's: for such kernels the tuner also times those tiles
flattened (``"FLATTEN": True``), where they gained 4-8% in the MoE form and 1-2% in lists.
Triton flattens only a K loop whose bounds are the same at every tile, so the list kernel
flattens only groups whose problems (those with tiles) share N, K and every tensor's
strides, with at most ``_SHARED_MAX_G`` problems, and only where some program takes two
tiles: it reads N, K and the strides once, and holds each problem's M and addresses in
vectors, so that a tile finds its problem's values without a load (on an H100, the MoE
shape as a list: 45.6-45.9 us against 49.2-49.7 with a row of the table loaded per tile).

**The metadata** (list form): one int64 table, the G tile ends, then a row per problem:
``[M, N, K, address of each tensor, each tensor's strides]``.  The host builds it from
Python ints (sizes, strides and ``data_ptr()`` need no device sync), copies it to the
device in one transfer from pinned memory (``non_blocking``), and keeps it in a small
cache keyed by its content, so a call with the same tensors (or others at the same
addresses with the same shapes) copies nothing.  Strides and addresses loaded from
memory are unknown to the compiler, so the host also passes constexprs that say what
holds in every problem: ``X_UNIT``, the axis of ``X`` whose stride is 1 (-1: none), and
``ALIGNED``: addresses are 16-byte aligned and the other strides, N and K multiples of
16 bytes; the kernel then gives ``tl.multiple_of`` hints, the facts Triton's argument
specialization gives the tiled GEMM (checked in the PTX for sm_90: 16-byte ``cp.async``
copies, pipelined, and ``wgmma``; without the hints, loads are element by element and
nothing is pipelined, which is tutorial 08's state: its ``tl.multiple_of`` calls discard
their result).

**TMA** (configs with ``"TMA": True``, 16-bit operands read as they are; Hopper): the
list kernel makes the operands' descriptors on the device per tile
(``tl.make_tensor_descriptor``, scratch memory from Triton's allocator: the host sets a
torch one when none is set), the MoE kernel takes host descriptors over ``A [T, K]`` and
``B [G, K, N]`` (3-D: zeros past each problem's K).  Where TMA cannot read the operands
(no contiguous axis, unaligned, a column-major MoE ``A`` whose row offsets would start
loads off 16-byte boundaries, a GPU before Hopper) the host runs the pointer kernel
with the same tiles.  The autotuner times TMA configs only for groups of at least
``gemm.TMA_MIN_FLOP`` (``MOE_TMA_MIN_FLOP`` in the MoE form, whose two host descriptors cost
less than the list kernel's scratch memory): below that, their extra host work per call costs
more than they save.

**The MoE form**.  ``kernel.moe(A, B, offs=offs)``: the problems' rows of
``A`` are stacked in one ``[T, K]`` tensor, problem ``g`` owning rows ``offs[g - 1]``
(0 for the first) to ``offs[g]``, and ``B`` is one ``[G, K, N]`` tensor, as
``torch._grouped_mm(A, B, offs=offs)`` takes them; the result is one ``[T, N]`` tensor.
It is a second calling form of any grouped kernel rather than a spec form, so one spec
serves both layouts: each list parameter is *ragged* (its per-problem shape starts with
the matmul's M: its problems' rows are stacked, ``[T, ...]``) or *stacked* (no M: one
``[G, ...]`` tensor), and outputs are ragged.  So ``gelu(X @ W + b)`` with ``b:
[f16[N]]`` takes ``b`` as ``[G, N]``, a per-row scale ``[f32[M, 1]]`` as ``[T, 1]``.
``offs`` stays on the device (int32 or int64, or a Python list): each program reads it
and computes the same schedule (tile counts summed with ``tl.cumsum``), so no sync;
ends are clamped to ``[previous end, T]`` (out-of-range offsets cannot reach outside A
or C), and rows past ``offs[-1]`` are not written.  The generated module's
``<name>_moe`` is that host function.  A headerless kernel decides per argument: rank-3
tensors are stacked; a rank-2 tensor is ragged when it has as many rows as the first
2-D input, else stacked (an error when T == G); rank 0 or 1, stacked.

**Tuning**: configs add ``programs_per_sm`` to the GEMM keys.  The key is the group's
signature, not its exact sizes (a MoE layer's sizes change every step): the dtype, G,
the powers of two above the largest M, N and K and above the mean output tile area, the
power of two nearest the total M*N*K, the operands' layouts, and whether the problems share N
and K (where the list kernel may flatten its loops); cached on disk by
``kgen/autotune.py`` as for the GEMM.  Configs are timed from CUDA graphs (GPU work
alone, L2 flushed before each call as ``do_bench`` flushes it: ``autotune.graph_ms``):
the host's time per call is the same for each, and timed call by call a short
group runs at the host's pace on a slow CPU, which leaves the choice to noise.  Without
tuning (the interpreter, ``KGEN_AUTOTUNE=0``) a heuristic picks tiles from the output
elements per SM (never TMA).

Limits: per-problem operands are 2-D (no batch axis inside a problem); every tensor
parameter of a grouped kernel is a list (one problem each), scalars are shared; G is
bounded by what a ``G_BLOCK`` vector holds in registers (thousands); the metadata cache
is keyed by addresses, so it is not meant for CUDA graph capture.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from functools import partial

import torch

from ..autotune import Tuning
from ..errors import SpecError, UnsupportedError
from ..ir import KernelIR, Node, Op, Param, Stmt, type_str
from ..lower import Line, config_check, config_text, helpers_for
from . import gemm
from .host import Host, check_locals, host, scalar_kind, torch_dtype

CONFIG_KEYS = gemm.CONFIG_KEYS + ("programs_per_sm",)
SCHEDULE_KEYS = CONFIG_KEYS + ("TMA", "input_precision")

# Autotuning candidates (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages,
# programs_per_sm).  Big tiles for big problems, small tiles with several programs per
# SM for small ones.  The autotuner picks per group signature; on an H200 the 4 x n^3 groups
# took 64 x 64 (n <= 256), 64 x 128 (512) and 128 x 256 tiles (1024, 2048): README, Performance.
CANDIDATES_16 = (
    (128, 256, 64, 8, 8, 3, 1),
    (256, 128, 64, 8, 8, 3, 1),
    (128, 128, 64, 8, 8, 4, 1),
    (128, 128, 64, 8, 4, 4, 1),
    (128, 128, 32, 8, 4, 4, 2),
    (128, 64, 64, 8, 4, 4, 2),
    (64, 128, 64, 8, 4, 4, 2),
    (64, 64, 64, 8, 4, 4, 2),
    (64, 64, 64, 8, 4, 3, 4),
    (32, 64, 64, 8, 4, 4, 4),
)
# The TMA variants ("TMA": True; 16-bit operands read as they are): the operands through
# TMA descriptors, made on the device per problem (lists) or on the host (MoE layout).
# The host falls back to the pointer kernels, same tiles, where TMA cannot read them.
TMA_CANDIDATES_16 = (
    (128, 256, 64, 8, 8, 3, 1),
    (128, 128, 64, 8, 8, 4, 1),
    (128, 128, 64, 8, 4, 4, 1),
    (64, 128, 64, 8, 4, 4, 2),
    (64, 256, 64, 8, 4, 5, 1),
)
# Also timed with the tile loop flattened though the host's estimate says it does not fit,
# for one 16-bit output whose epilogue reads no other tensor: Triton then lays out the 16-bit
# result for the store, not the f32 tile, and it fits.  On an H100, the MoE form at 4 x 2048^3:
# 99.3 us flattened against 108.3 (TMA loads: 97.7 against 101.5); gelu(X @ W + b) took 177
# against 137 where it compiled, and with K = 136 Triton refused it (OutOfResources).  The MoE
# shape (README, Performance) with TMA, 64 x 256 tiles in one warpgroup, 5 stages: 44.5 us
# flattened against 49.2, where 64 x 128 tiles, two programs an SM, took 45.5 (kernel time).
FLATTENED_16 = (
    (128, 256, 64, 8, 8, 3, 1),
    (64, 256, 64, 8, 4, 5, 1),
)
CANDIDATES_32 = (
    (128, 128, 32, 8, 8, 3, 1),
    (128, 64, 32, 8, 4, 4, 1),
    (64, 128, 32, 8, 4, 4, 1),
    (64, 64, 32, 8, 4, 4, 2),
    (32, 64, 64, 8, 4, 4, 4),
)
# TMA configs are timed only for groups of at least gemm.TMA_MIN_FLOP: below it their extra
# host work per call (descriptors, scratch memory) costs more than they save on the GPU.  The
# MoE form makes two descriptors on the host, which with their launch cost about 30 us a call
# more than the pointer kernel (on an H100's host, 77-86 us a call against 48-52), and its TMA
# tiles gain from MOE_TMA_MIN_FLOP: the MoE shape (2^34 flops) takes 44.3 us on the GPU with
# TMA against 46.1 without, and 47.0-47.9 call by call against 49.7-50.1, where do_bench clears
# L2 between calls (about 85 us for 256 MB) while the host prepares the next.
MOE_TMA_MIN_FLOP = 2**33
# Without tuning: the first row whose limit on output elements per SM holds (None: the last).
HEURISTIC_16 = (
    (64 * 64, (64, 64, 64, 8, 4, 4, 2)),
    (128 * 128, (128, 64, 64, 8, 4, 4, 2)),
    (2 * 128 * 256, (128, 128, 64, 8, 8, 4, 1)),
    (None, (128, 256, 64, 8, 8, 3, 1)),
)
HEURISTIC_32 = (
    (64 * 64, (64, 64, 32, 8, 4, 4, 2)),
    (128 * 128, (128, 64, 32, 8, 4, 4, 1)),
    (None, (128, 128, 32, 8, 8, 3, 1)),
)
# Triton's interpreter: mid-sized tiles; GROUP_M = 2 keeps the grouped order exercised.
INTERPRETER_CONFIG = (32, 32, 32, 2, 4, 1, 1)
SCHEDULE_DEFAULTS = {**gemm.SCHEDULE_DEFAULTS, "programs_per_sm": 1}

# Names the grouped kernels and host functions define for themselves: a spec's values
# may not take the kernels', and its dimensions, parameters and outputs not the host's.
KERNEL_LOCALS = gemm.KERNEL_LOCALS | frozenset({
    "g", "G", "T", "tile_start", "tile_ends", "num_tiles", "row_start", "row_starts", "row_ends", "row_counts",
    "past", "table", "layout", "ALIGNED", "G_BLOCK", "programs_per_sm", "FLATTEN", "rows", "M_column"})
HOST_LOCALS = gemm.HOST_LOCALS | frozenset({"G", "T", "table", "layout", "shared", "launch", "offs"})


@dataclass(frozen=True)
class TableTensor:
    """One tensor of each problem, as the list kernel reads it from its metadata row."""

    name: str
    pointer: str                  # "tl.load(row + 4).to(tl.pointer_type(tl.float16))"
    strides: tuple[str, ...]      # "A_stride0 = 1 if A_UNIT == 0 else _group_int(row + 7, 8 * ALIGNED, INT64)"
    held: str                     # "B_addresses = tl.load(rows + 4, mask=idx < G, other=0)"
    picked: str                   # "_group_pick(B_addresses, idx, g).to(tl.pointer_type(tl.float16))"


@dataclass(frozen=True)
class GroupedPlan:
    name: str
    summary: str
    # the GEMM parts (gemm_parts.jinja reads these names)
    a: gemm.Tile
    b: gemm.Tile
    dot: str
    loads: tuple[str, ...]
    body: tuple[Line, ...]
    stores: tuple[str, ...]
    helpers: tuple[str, ...]
    operands: tuple[str, str]
    # the list form
    docstring: str
    signature: str
    checks: tuple[str, ...]       # host lines: argument checks, per-problem sizes
    allocate: str
    returns: str
    sizes: str                    # "M, N, K": the host's per-problem lists
    table_unread: str             # ', unread=(("s", 1),)': strides the kernel never reads, or ""
    output_sizes: str             # "M, N": those the default config reads
    table_tensors: str            # '("A", A), ("B", B), ("C", C)'
    vector: int                   # elements of the operands in 16 bytes
    operand_bytes: int            # bytes of the widest input element (the operands' tiles as loaded)
    scalars: tuple[str, ...]
    units: tuple[str, ...]        # the kernel's X_UNIT constexprs
    width: int                    # int64 per problem row
    columns: tuple[str, ...]      # the row's layout, for a comment
    table: tuple[TableTensor, ...]
    # the MoE form ("" / () when the spec has none)
    moe: bool
    moe_why: str                  # why not, when it has none
    moe_host: Host | None
    moe_signature: str
    moe_doc: str
    moe_offs: str                 # the host line that checks offs
    moe_pointers: tuple[str, ...]
    moe_strides: tuple[str, ...]
    moe_stacked: str              # "B_stride apart in B": where stacked tensors hold each problem
    moe_bases: tuple[str, ...]    # per problem: "A_ptr = A_base + row_start.to(tl.int64) * A_stride0"
    moe_launch: tuple[str, ...]
    moe_sizes: tuple[str, str, str, str]   # host expressions: G, T, N, K
    moe_tensors: str
    # the TMA variants (16-bit operands read as they are)
    tma: bool
    moe_tma_pointers: tuple[str, ...]
    moe_tma_strides: tuple[str, ...]
    moe_tma_bases: tuple[str, ...]
    moe_tma_launch: tuple[str, ...]
    # what divides N, K and the strides, told to the MoE pointer kernel as the tiled GEMM is told (gemm.py's
    # hints; the TMA kernels, whose calls the host's descriptors bound, showed no gain told: README)
    moe_hints: tuple[tuple[tuple[str, str, str], ...], ...]
    # tuning
    configs: tuple[str, ...]
    heuristic: tuple[tuple[str, str], ...]
    interpreter: str
    config_check: str             # the host line for a config= given by the call
    scheduled: bool
    tuning: Tuning
    moe_tuning: Tuning | None
    pattern: str = "grouped_gemm"
    template: str = "grouped_gemm.jinja"

    @property
    def moe_hint_params(self) -> tuple[str, ...]:
        return gemm.hint_params(self.moe_hints)

    @property
    def moe_hint_lines(self) -> tuple[str, ...]:
        return gemm.hint_lines(self.moe_hints)

    @property
    def moe_hint_launch(self) -> tuple[str, ...]:
        return gemm.hint_launch(self.moe_hints)

    # torch.compile runs its calls as they are (a graph break): tracing its host code had taken
    # a first compile 41-47 s on an H100 host
    traced: bool = False


def match(kir: KernelIR) -> GroupedPlan | None:
    lists = [p for p in kir.params if p.is_list]
    if not lists:
        return None
    low = gemm.lower(kir)
    if low is None:
        raise UnsupportedError("list parameters make a grouped GEMM: the kernel needs a matmul", lists[0].span)
    mm = low.mm
    lhs, rhs = mm.inputs
    for side, x in (("left", lhs), ("right", rhs)):
        if len(x.shape) != 2:
            raise UnsupportedError(f"a grouped GEMM multiplies 2-D matrices per problem; the {side} operand is "
                                   f"{type_str(x.dtype, x.shape)}", x.span)
    if len(low.out_shape) != 2:
        raise UnsupportedError(f"a grouped GEMM's outputs are 2-D per problem, got "
                               f"{type_str(kir.outputs[0].node.dtype, low.out_shape)}",
                               kir.outputs[0].span)
    for p in kir.params:
        if not p.is_scalar and not p.is_list:
            raise UnsupportedError(f"'{p.name}' is one tensor in a grouped GEMM whose other inputs are lists; "
                                   f"make it a list ([{type_str(p.dtype, p.shape)}]), one per problem", p.span)
    check_locals(kir, KERNEL_LOCALS, "grouped GEMM", dims=HOST_LOCALS)

    params = {p.name: p for p in kir.params}
    outputs = list(low.outputs)
    names = list(low.tensors) + outputs
    shapes = {t: params[t].shape for t in low.tensors} | {o: low.out_shape for o in outputs}
    dtypes = {t: params[t].dtype for t in low.tensors} | {o.name: o.node.dtype for o in kir.outputs}
    operand_dtype = lhs.dtype
    vector = 16 // operand_dtype.bytes

    # The metadata row: tile_end, M, N, K, the addresses, the strides (every axis of every tensor).
    columns = ["M", "N", "K"] + [f"&{t}" for t in names]
    table = []
    stride_col = len(columns)
    pointer_cols = {t: 3 + i for i, t in enumerate(names)}
    stride_cols = {}
    for t in names:
        stride_cols[t] = stride_col
        columns += [f"{t}.stride({ax})" for ax in range(len(shapes[t]))]
        stride_col += len(shapes[t])
    for t in names:
        dtype = dtypes[t]
        hint = 16 // dtype.bytes
        pointer = f"tl.load(row + {pointer_cols[t]}).to(tl.pointer_type({dtype.triton}))"
        strides = tuple(f"{t}_stride{ax} = 1 if {t}_UNIT == {ax} else "
                        f"_group_int(row + {stride_cols[t] + ax}, {hint} * ALIGNED, INT64)"
                        for ax in sorted(low.strides[t]))
        held = f"{t}_addresses = tl.load(rows + {pointer_cols[t]}, mask=idx < G, other=0)"
        picked = f"_group_pick({t}_addresses, idx, g).to(tl.pointer_type({dtype.triton}))"
        table.append(TableTensor(t, pointer, strides, held, picked))
    units = tuple(f"{t}_UNIT" for t in names)
    unread = [f'("{t}", {ax})' for t in names for ax in range(len(shapes[t])) if ax not in low.strides[t]]
    gemm._check_derived(kir, list(units) + [f"{t}_shapes" for t in names] + [f"{t}_addresses" for t in names])

    checks, sizes = _list_host(kir, low, params)
    checks += gemm.bf16_check(low)
    h = host(kir)
    outs = ", ".join(f'("{o}", list(zip({sizes[0]}, {sizes[1]})), {torch_dtype(dtypes[o])}, '
                     f'"{type_str(dtypes[o], low.out_shape)}")' for o in outputs)
    inputs = [f'("{params[t].name}", {params[t].name})' for t in low.tensors]
    allocate = (f"{', '.join(outputs)}{',' if len(outputs) == 1 else ''} = _group_outputs(out, device, G, "
                f"({', '.join(inputs)}{',' if len(inputs) == 1 else ''}), {outs})")
    docstring = _list_doc(kir, low)

    # The TMA variants: operands read as they are (no prologue), two tensors, 16-bit.
    tma = (lhs is kir.nodes[low.a_name] and rhs is kir.nodes[low.b_name] and not low.same
           and operand_dtype.bits == 16)
    if tma:
        gemm._check_derived(kir, [f"{low.a_name}_desc", f"{low.b_name}_desc"])
    # 128 x 256 tiles flattened too where shared memory may hold them: one 16-bit output whose
    # epilogue reads no other tensor (FLATTENED_16)
    lean = len(low.tensors) == 2 and len(outputs) == 1 and dtypes[outputs[0]].bits == 16
    candidates, rows, tunable = _schedule(kir, operand_dtype, tma, lean)
    a_name, b_name = low.a_name, low.b_name
    moe = _moe(kir, low, params, shapes, dtypes)
    summary = (f"{a_name}{gemm._shape(lhs.shape)} @ {b_name}{gemm._shape(rhs.shape)} -> "
               f"{', '.join(outputs)}{gemm._shape(low.out_shape)}")
    list_params = [p.name for p in kir.params]
    plan_tma = tma and any(c.get("TMA") for c in candidates)
    return GroupedPlan(
        name=kir.name, summary=summary, a=low.a, b=low.b, dot=low.dot, loads=low.loads, body=low.body,
        stores=low.stores,
        helpers=helpers_for(low.nodes) + ("check_config", "check_tile_config")
        + ("bf16_dot",) * bool(gemm.bf16_check(low))
        + ("num_sms", "tma_host", "group_host") + ("vec",) * bool(moe.get("moe")),
        operands=(a_name, b_name),
        docstring=docstring, signature=h.signature + ", config=None", checks=checks, allocate=allocate,
        returns=h.returns, sizes=", ".join(sizes), output_sizes=", ".join(sizes[:2]),
        table_tensors=", ".join(f'("{t}", {t})' for t in names),
        table_unread=f", unread=({', '.join(unread)},)" if unread else "",
        vector=vector, operand_bytes=max(params[t].dtype.bytes for t in low.tensors), scalars=low.scalars,
        units=units, width=len(columns),
        columns=_packed([f"{i}: {c}" for i, c in enumerate(columns)], 84),
        table=tuple(table), **moe, tma=plan_tma,
        configs=tuple(config_text(c) for c in candidates),
        heuristic=tuple(("" if limit is None else f"work <= {limit}", config_text(_config(c)))
                        for limit, c in rows),
        interpreter=config_text(_config(INTERPRETER_CONFIG)),
        config_check=config_check(gemm.CONFIG_KEYS, ("programs_per_sm", "FLATTEN") + ("TMA",) * plan_tma,
                                  tiles=True),
        scheduled=any(k in CONFIG_KEYS for k in kir.schedule),
        # timed on the GPU alone (graphs): every config costs the host the same per call but
        # TMA's, which is timed only for groups large enough to hide it (TMA_MIN_FLOP)
        tuning=Tuning(candidates if tunable else (), partial(prune, lhs=a_name, rhs=b_name),
                      partial(group_key, names=list_params, lhs=a_name, rhs=b_name), graphs=True),
        moe_tuning=(Tuning(candidates if tunable else (), partial(prune_moe, lhs=a_name, rhs=b_name),
                           partial(moe_key, names=list_params, lhs=a_name, rhs=b_name), graphs=True)
                    if moe["moe"] else None))


# --- the list form's host ----------------------------------------------------------

def _list_host(kir: KernelIR, low: gemm.Lowered, params: dict) -> tuple[tuple[str, ...], tuple[str, str, str]]:
    """Host lines that check the lists (those the kernel never reads too, as a GEMM checks its
    tensors) and bind each symbol to its per-problem sizes."""
    tensors = [p for p in kir.params if p.is_list]
    named = ", ".join(f'("{p.name}", {p.name})' for p in tensors)
    lines = [f"G = _group_len({named})"]
    for p in tensors:
        declared = type_str(p.dtype, p.shape)
        lines.append(f'{p.name}_shapes = _group_check("{p.name}", {p.name}, {torch_dtype(p.dtype)}, {len(p.shape)}, '
                     f'"{declared}")')
    bound: dict[str, str] = {}
    for p in kir.params:
        if p.is_scalar:
            lines.append(f'{p.name} = _check_scalar("{p.name}", {p.name}, {scalar_kind(p.dtype)})')
    lines.append(f"device = _group_device({named})")
    for p in tensors:
        for axis, d in enumerate(p.shape):
            if isinstance(d, int):
                lines.append(f'_group_dims("{p.name}", {p.name}_shapes, {axis}, {d}, None, None)')
            elif d in bound:
                lines.append(f'_group_dims("{p.name}", {p.name}_shapes, {axis}, {d}, "{d}", "{bound[d]}")')
            else:
                lines.append(f"{d} = [s[{axis}] for s in {p.name}_shapes]")
                bound[d] = p.name
    mm = low.mm
    sizes = tuple(d if isinstance(d, str) else f"[{d}] * G" for d in (mm.shape[0], mm.shape[1], mm.inputs[0].shape[1]))
    return tuple(lines), sizes


def _list_doc(kir: KernelIR, low: gemm.Lowered) -> str:
    params = ", ".join(f"{p.name}: [{type_str(p.dtype, p.shape)}]" if p.is_list else f"{p.name}: {p.dtype.name}"
                       for p in kir.params)
    outs = ", ".join(f"{o.name}: [{type_str(o.node.dtype, o.node.shape)}]" for o in kir.outputs)
    return f"{params} -> {outs}; lists of tensors, one GEMM per element"


# --- the MoE form ---------------------------------------------------------------------

def _fresh(taken: set, *candidates: str) -> str:
    for c in candidates:
        if c not in taken:
            return c
    raise AssertionError("no fresh name")


def _moe(kir: KernelIR, low: gemm.Lowered, params: dict, shapes: dict, dtypes: dict) -> dict:
    none = dict(moe=False, moe_host=None, moe_signature="", moe_doc="", moe_offs="", moe_pointers=(), moe_strides=(),
                moe_stacked="", moe_bases=(), moe_launch=(), moe_sizes=("", "", "", ""), moe_tensors="",
                moe_tma_pointers=(), moe_tma_strides=(), moe_tma_bases=(), moe_tma_launch=(), moe_hints=())
    m = low.mm.shape[0]
    if not isinstance(m, str):
        return {**none, "moe_why": f"its M is a literal ({m}), so the problems cannot differ in rows"}
    ragged = {}   # every list (those never read too, checked as they would be read) and output
    for t in [p.name for p in kir.params if p.is_list] + list(low.outputs):
        shape, dtype = (shapes[t], dtypes[t]) if t in shapes else (params[t].shape, params[t].dtype)
        if m not in shape:
            ragged[t] = False
        elif shape[0] == m and m not in shape[1:]:
            ragged[t] = True
        else:
            return {**none, "moe_why": f"'{t}' has M on an axis other than its first ({type_str(dtype, shape)})"}
    dims = [*shapes.values(), *(p.shape for p in kir.params if p.shape)]   # lists never read too
    taken = {d for s in dims for d in s if isinstance(d, str)} | set(params) | set(low.outputs)
    T = _fresh(taken, "T", "T_rows", "total_rows")
    G = "G"   # never a spec's dimension (HOST_LOCALS)
    # The host checks the stacked tensors as one tensor each: its own shape with T or G in front.
    moe_params = []
    for p in kir.params:
        if p.is_scalar or p.name not in ragged:
            moe_params.append(p)
            continue
        shape = (T,) + tuple(p.shape[1:]) if ragged[p.name] else (G,) + tuple(p.shape)
        moe_params.append(Param(p.name, p.dtype, shape, False, None, p.span))
    outs = tuple(Stmt(o.name, Node(Op.INPUT, o.node.dtype, (T,) + tuple(o.node.shape[1:])), o.source, o.span)
                 for o in kir.outputs)
    mkir = replace(kir, params=tuple(moe_params), outputs=outs)
    h = host(mkir, extra=("offs",))
    h = replace(h, checks=h.checks + gemm.bf16_check(low))
    signature = h.signature.replace("*, out=None", "*, offs, out=None") + ", config=None"
    first = next(t for t in low.tensors if not ragged[t])
    rows = next(t for t in low.tensors if ragged[t])
    offs = f'offs = _group_offs(offs, {G}, device, "{first}", {T}, "{rows}")'
    pointers, strides, bases, launch_strides, hints = {}, {}, {}, {}, {}
    for t in list(low.tensors) + list(low.outputs):
        axes = sorted(low.strides[t] | ({0} if ragged[t] else set()))
        pointers[t] = f"{t}_base"
        names = ([] if ragged[t] else [f"{t}_stride"]) + [f"{t}_stride{ax}" for ax in axes]
        strides[t] = ", ".join(names)
        shift = 0 if ragged[t] else 1
        hosts = ([] if ragged[t] else [f"{t}.stride(0)"]) + [f"{t}.stride({ax + shift})" for ax in axes]
        launch_strides[t] = ", ".join(hosts)
        hints[t] = tuple((name, name.replace("_stride", "_VEC"), host) for name, host in zip(names, hosts))
        bases[t] = (f"{t}_ptr = {t}_base + row_start.to(tl.int64) * {t}_stride0" if ragged[t]
                    else f"{t}_ptr = {t}_base + g.to(tl.int64) * {t}_stride")
    mm = low.mm
    n, k = mm.shape[1], mm.inputs[0].shape[1]
    sizes = (G, T, str(n), str(k))
    names = list(low.tensors) + list(low.outputs)
    launch = (", ".join(names + ["offs"] + list(low.scalars)), ", ".join(sizes)) + tuple(launch_strides.values())
    # The TMA kernel reads the operands through descriptors, the rest as the pointer kernel does.
    direct = list(low.epilogue_tensors) + list(low.outputs)
    descriptors = [f"{low.a_name}_desc", f"{low.b_name}_desc"]
    tma_launch = (", ".join(descriptors + direct + ["offs"] + list(low.scalars)), ", ".join(sizes)) + \
        tuple(launch_strides[t] for t in direct)
    moe_hints = ((("N", "N_VEC", str(n)), ("K", "K_VEC", str(k))),) + tuple(hints[t] for t in names if hints[t])
    gemm._check_derived(kir, [f"{t}_base" for t in names] + descriptors +
                        [vec for group in moe_hints[1:] for _, vec, _ in group])
    doc = h.docstring.replace(" -> ", f", offs: int32[{G}] (or int64) -> ", 1)
    return dict(moe=True, moe_why="", moe_host=h, moe_signature=signature, moe_doc=doc, moe_offs=offs,
                moe_pointers=tuple(pointers.values()), moe_strides=tuple(strides.values()),
                moe_stacked=", ".join(f"{t}_stride apart in {t}" for t in names if not ragged[t]),
                moe_bases=tuple(bases.values()), moe_launch=launch, moe_sizes=sizes, moe_tensors=", ".join(names),
                moe_tma_pointers=tuple(descriptors + [pointers[t] for t in direct]),
                moe_tma_strides=tuple(strides[t] for t in direct), moe_tma_bases=tuple(bases[t] for t in direct),
                moe_tma_launch=tma_launch, moe_hints=moe_hints)


# --- schedule and tuning --------------------------------------------------------------

def _config(values, tma=False, flatten=False) -> dict:
    config = dict(zip(CONFIG_KEYS, values))
    return {**config, **({"TMA": True} if tma else {}), **({"FLATTEN": True} if flatten else {})}


def _schedule(kir: KernelIR, dtype, tma: bool, lean: bool):
    """(candidates, heuristic rows, tunable): the spec's schedule, or kgen's defaults (lean: with
    the FLATTENED_16 tiles)."""
    unknown = sorted(set(kir.schedule) - set(SCHEDULE_KEYS))
    if unknown:
        raise SpecError(f"grouped GEMM kernels take {', '.join(SCHEDULE_KEYS)} in their schedule, not "
                        f"'{unknown[0]}'", kir.schedule_span(unknown[0]))
    wide = dtype.bits == 32
    rows = HEURISTIC_32 if wide else HEURISTIC_16
    given = {k: v for k, v in kir.schedule.items() if k in CONFIG_KEYS}
    variants = kir.schedule.get("TMA", (0, 1) if tma and not given else (0,))
    if any(v not in (0, 1) for v in variants):
        raise SpecError(f"TMA takes 0 or 1, got {', '.join(map(str, variants))}",
                        kir.schedule_span("TMA", next(v for v in variants if v not in (0, 1))))
    if 1 in variants and not tma:
        if 0 not in variants:
            raise SpecError("TMA = 1 needs 16-bit operands read as they are (no prologue)", kir.schedule_span("TMA", 1))
        variants = (0,)   # TMA = [0, 1] where the plan cannot read through TMA (f32, a prologue): the tiled ones
    if not given:
        flattened = FLATTENED_16 if lean and not wide else ()

        def twins(c, tma):   # a flattened tile just before its twin, which then wins only by the tuner's margin
            return ([_config(c, tma, flatten=True)] if c in flattened else []) + [_config(c, tma)]
        tiles = {0: CANDIDATES_32 if wide else CANDIDATES_16, 1: TMA_CANDIDATES_16}
        candidates = [config for v in (0, 1) if v in variants for c in tiles[v] for config in twins(c, bool(v))]
        return tuple(candidates), rows, True
    gemm.check_schedule_values(given, kir)
    lists = [given.get(k, (SCHEDULE_DEFAULTS[k] if not (wide and k == "BLOCK_K") else 32,)) for k in CONFIG_KEYS]
    gemm.check_tile_products(lists, kir)
    candidates = tuple(_config(c, bool(v)) for v in variants for c in itertools.product(*lists))
    constrained = []
    for limit, config in rows:
        config = tuple(gemm._closest(v, lists[i]) for i, v in enumerate(config))
        if constrained and constrained[-1][1] == config:
            constrained[-1] = (None if limit is None else limit, config)
        else:
            constrained.append((limit, config))
    return candidates, tuple(constrained), len(candidates) > 1


def _p2(n: int) -> int:
    """The power of two at or above n (1 for 0)."""
    return 1 << max(0, int(n) - 1).bit_length()


def _layout(tensors) -> str:
    """r: rows contiguous in every tensor, c: columns, s: neither."""
    if all(t.stride(-1) == 1 or t.shape[-1] <= 1 for t in tensors):
        return "r"
    if all(t.stride(-2) == 1 or t.shape[-2] <= 1 for t in tensors):
        return "c"
    return "s"


def _operands(args, kwargs, names, lhs, rhs) -> tuple:
    """The call's values of parameters lhs and rhs (None where not given): by position, or by
    name (a name given twice is the host's to report)."""
    i, j = names.index(lhs), names.index(rhs)
    return (args[i] if i < len(args) else kwargs.get(lhs)), (args[j] if j < len(args) else kwargs.get(rhs))


_GROUP_KEYS: dict[tuple, str | None] = {}
# The memo's bound: so many entries, or so many shapes and strides in all (a group of G problems
# shows 4G; groups of 1024 problems whose rows change at every call would otherwise keep 1.3 GB)
_GROUP_KEYS_MAX = (4096, 2**18)
_group_keys_held = 0
_MISSING = object()


def group_key(args, kwargs, names, lhs, rhs) -> str | None:
    """The list form's tuning key: the group's signature (see the module docstring); None
    for a call the host function will reject.  Called on every call: the signature is
    remembered per tuple of shapes and strides, which is all that is read each time."""
    a, b = _operands(args, kwargs, names, lhs, rhs)
    if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)) or not a or len(a) != len(b):
        return None
    try:
        seen = (lhs, rhs, a[0].dtype, *[t.shape for t in a], *[t.shape for t in b],
                *[t.stride() for t in a], *[t.stride() for t in b])
    except (TypeError, AttributeError, IndexError, RuntimeError):   # RuntimeError: a nested tensor's .shape
        return None
    return _remembered(seen, lambda: _group_signature(a, b, lhs, rhs))


def _remembered(seen: tuple, make) -> str | None:
    """The key remembered for what a call showed (``seen``), made once."""
    global _group_keys_held
    key = _GROUP_KEYS.get(seen, _MISSING)
    if key is _MISSING:
        entries, items = _GROUP_KEYS_MAX
        if len(_GROUP_KEYS) >= entries or _group_keys_held + len(seen) > items:
            _GROUP_KEYS.clear()
            _group_keys_held = 0
        key = _GROUP_KEYS[seen] = make()
        _group_keys_held += len(seen)
    return key


def _group_signature(a, b, lhs, rhs) -> str | None:
    try:
        ms, ks = zip(*(t.shape for t in a))
        ns = [t.shape[1] for t in b]
        work = sum(m * n * k for m, n, k in zip(ms, ns, ks))
        area = sum(m * n for m, n in zip(ms, ns)) // len(a)
        dtype = str(a[0].dtype).removeprefix("torch.")
        shared = " NK:shared" if _share_n_and_k(a, b) else ""
        return (f"grouped {dtype} G={len(a)} M<={_p2(max(ms))} N<={_p2(max(ns))} K<={_p2(max(ks))} "
                f"MN<={_p2(area)} MNK~2^{round(math.log2(work)) if work else 0} "
                f"{lhs}:{_layout(a)} {rhs}:{_layout(b)}{shared}")
    except (TypeError, ValueError, AttributeError, IndexError):
        return None


def _share_n_and_k(a, b) -> bool:
    """Whether every problem of lists a ([M, K] each) and b ([K, N] each) has the same N and K:
    only such groups may flatten the list kernel's loops (its FLATTEN)."""
    return len({t.shape[1] for t in a}) <= 1 and len({t.shape[1] for t in b}) <= 1


def moe_key(args, kwargs, names, lhs, rhs) -> str | None:
    """The MoE form's tuning key: dtype, G, the power of two above T, N and K, layouts;
    remembered per dtype, shapes and strides, as the list form's."""
    a, b = _operands(args, kwargs, names, lhs, rhs)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 2 or b.dim() != 3 \
            or a.is_nested or b.is_nested:   # (torch raises on a nested tensor's .shape)
        return None
    seen = ("moe", lhs, rhs, a.dtype, a.shape, b.shape, a.stride(), b.stride())
    return _remembered(seen, lambda: _moe_signature(a, b, lhs, rhs))


def _moe_signature(a, b, lhs, rhs) -> str:
    dtype = str(a.dtype).removeprefix("torch.")
    return (f"moe {dtype} G={b.shape[0]} T<={_p2(a.shape[0])} N={b.shape[2]} K={a.shape[1]} "
            f"{lhs}:{_layout([a])} {rhs}:{_layout([b])}")


def _fit(configs, m: int, n: int, k: int, tensor, flop: int, least: int = gemm.TMA_MIN_FLOP):
    """Tiles no larger than the problem (rounded up to a power of two, at least 16) on each
    axis; TMA configs only on a GPU with TMA (elsewhere they would time the fallback twice)
    and for groups of at least ``least`` flops."""
    cap = lambda size: max(16, _p2(size))  # noqa: E731
    tma = gemm.times_tma(tensor, flop, least=least)
    kept = [c for c in configs if c["BLOCK_M"] <= cap(m) and c["BLOCK_N"] <= cap(n) and c["BLOCK_K"] <= cap(k)
            and (tma or not c.get("TMA"))]
    return kept or [min(configs, key=lambda c: (bool(c.get("TMA")), c["BLOCK_M"] * c["BLOCK_N"], c["BLOCK_K"]))]


def prune(configs, bound: dict, lhs: str, rhs: str):
    """The candidates worth timing: tiles no larger than the largest problem on each axis, and
    FLATTENED_16's twins only where the problems share N and K: elsewhere the list kernel does
    not flatten its loops, and a twin would time the same kernel again."""
    a, b = bound[lhs], bound[rhs]
    if not _share_n_and_k(a, b):
        configs = [c for c in configs if not c.get("FLATTEN")]
    flop = sum(2 * x.shape[0] * x.shape[1] * y.shape[1] for x, y in zip(a, b))
    return _fit(configs, max(t.shape[0] for t in a), max(t.shape[1] for t in b), max(t.shape[1] for t in a), a[0],
                flop)


def prune_moe(configs, bound: dict, lhs: str, rhs: str):
    a, b = bound[lhs], bound[rhs]
    return _fit(configs, a.shape[0] // max(1, b.shape[0]), b.shape[2], a.shape[1], a,
                2 * a.shape[0] * a.shape[1] * b.shape[2], MOE_TMA_MIN_FLOP)


def _packed(items: list[str], width: int) -> tuple[str, ...]:
    """``items`` joined by ", " into lines of at most ``width`` characters, never breaking an item."""
    lines = [items[0]]
    for item in items[1:]:
        if len(lines[-1]) + len(item) + 2 > width:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] += ", " + item
    return tuple(lines)
