"""Tiled GEMM with a fused epilogue: Triton tutorial 03, generalized.

One matmul ``A @ B`` (2-D, or 3-D with torch's batch broadcasting) whose result
feeds any pointwise DAG: the epilogue runs on the f32 accumulator, reads scalars
and extra tensors that broadcast to the output (bias ``[N]``, row scale ``[M, 1]``,
residual ``[M, N]``), and each output is stored once.

Two kernels (three with split-K), one epilogue:

- **tiled** (every GPU, the interpreter): one ``BLOCK_M x BLOCK_N`` tile per program;
  programs ordered in groups of ``GROUP_M`` tile rows so that programs running together
  reuse rows of A and columns of B from L2.  Rows of A and columns of B past the edge
  wrap around (``% M``, ``% N``) so the K loop masks only K (and nothing when
  ``EVEN_K``); the store masks M and N.  Strides are runtime arguments, so transposed,
  sliced or broadcast operands need no copy (Triton specializes unit strides).  A
  batch index comes from the program id; offsets turn int64 past 2**31 elements.
  With ``SPLIT_K`` > 1 (where the output has too few tiles to fill the GPU: LLM
  decode and prefill) a tile takes SPLIT_K programs, each summing the K slices
  ``pid_k, pid_k + SPLIT_K, ...`` into an f32 workspace; ``<kernel>_split_k_kernel``
  adds the slices and runs the epilogue (which need not be linear: no atomics).
- **persistent + TMA** (config ``"TMA": True``; 2-D, 16-bit operands read as they
  are): ``NUM_SMS`` programs walk the tiles in the same grouped order (tutorial 09)
  and load A and B through TMA descriptors (row- or column-major, zero-padded at the
  edges).  The host falls back to the tiled kernel, same tiles, where TMA cannot
  address the operands (unaligned rows, no contiguous axis, K = 0) or the GPU has
  none (before Hopper).  It joins the autotuning candidates; it never is the default.
  Its options: ``WS`` (``WARP_SPECIALIZE``: ``tl.range(..., warp_specialize=True)``,
  the loop not flattened, as Hopper's warp specialization needs; offered only where
  Triton's ``tl.range`` takes the argument) and ``SUBTILE`` (``EPILOGUE_SUBTILE``:
  the epilogue on two ``BLOCK_M x BLOCK_N / 2`` halves, tutorial 09).  A module's
  kernels take only the options its candidates use.

A pointwise *prologue* on an operand (``f16(A) @ B``, ``relu(A) @ B``) runs on each
tile inside the K loop when it reads one tensor of the operand's shape (plus
scalars); a 16-bit operand is rounded after it, and past K the tile is zeroed again.
Anything else around the matmul is an ``UnsupportedError`` at its span.

f32 operands use TF32 tensor cores by default (``input_precision="tf32"``, as with
``torch.backends.cuda.matmul.allow_tf32 = True``); a schedule's ``input_precision =
ieee`` asks for exact f32 products, ``tf32x3`` for the middle ground.  16-bit
operands always accumulate in f32.

Tuning (see ``kgen/autotune.py``): the generated host function takes an optional
``config`` (``BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages`` and
optionally ``SPLIT_K``, ``TMA``, ``WS``, ``SUBTILE``) and otherwise picks one with a
heuristic printed in the module, so the module stays standalone.  kgen's ``Kernel``
times the candidates (``<kernel>_configs`` in the module: the schedule's product, or
the ``*_CANDIDATES_*`` lists below, pruned per problem by ``prune``) on the first call
per problem key and keeps the winner on disk.
"""
from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import dataclass, replace
from functools import cache, partial

import torch

from ..autotune import Tuning
from .. import dtypes as D
from ..errors import SpecError, UnsupportedError
from ..ir import LEAVES, POINTWISE, Dim, KernelIR, Node, Op, is_part, topo_order, type_str
from ..lower import CALL, Line, Printer, config_check, config_text, helpers_for, statement_lines, store_cast
from ..render import comment_safe
from .host import Host, check_locals, host

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
# Flags a config may add (absent: off): SPLIT_K (the tiled kernel splits K), TMA (the
# persistent kernel), WS and SUBTILE (its warp specialization and halved epilogue).
FLAG_KEYS = ("SPLIT_K", "TMA", "WS", "SUBTILE")
SCHEDULE_KEYS = CONFIG_KEYS + FLAG_KEYS + ("input_precision",)
PRECISIONS = ("tf32", "tf32x3", "ieee")

# Autotuning candidates, (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages).
# 16-bit operands: tutorial 03's CUDA list plus the larger tiles that Hopper's 227 KB
# of shared memory holds (128 x 256 x 64 at 4 stages: 192 KB), and for small and mid M
# (LLM decode and prefill) narrow tiles that still give 132 SMs work.  ``prune`` keeps
# the tiles that fit the problem and fill the GPU: about 20 per problem.
CANDIDATES_16 = (
    (128, 256, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 4),
    (256, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 8, 4),
    (128, 128, 64, 8, 4, 4),
    (64, 256, 32, 8, 4, 4),
    (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
    (128, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 5),
    (64, 64, 64, 8, 4, 4),
    (64, 64, 128, 8, 4, 4),
    (64, 64, 128, 8, 4, 5),
    (64, 64, 128, 8, 4, 6),     # M = 128, N = K = 4096: 221 TFLOP/s on an H200 (s4: 199)
    (32, 64, 128, 8, 4, 4),
    (32, 128, 64, 8, 4, 5),
    (16, 64, 128, 8, 4, 4),
    (16, 64, 256, 8, 4, 3),
    (16, 32, 128, 8, 4, 4),
    (16, 128, 128, 8, 4, 3),
)
# Split-K (the tiled kernel, last column SPLIT_K): where the output has fewer tiles than the
# GPU has SMs (M = 16 or 128 against N = 4096), SPLIT_K programs per tile each sum a
# slice of K into an f32 workspace and a second kernel adds the slices and runs the epilogue.
SPLIT_K_CANDIDATES_16 = (
    (128, 128, 64, 8, 8, 4, 4),
    (128, 64, 64, 8, 4, 4, 2),
    (64, 128, 64, 8, 4, 4, 2),
    (64, 64, 128, 8, 4, 4, 2),
    (16, 64, 128, 8, 4, 4, 4),
    (16, 128, 128, 8, 4, 3, 4),
)
# The Hopper variant (``"TMA": True``; 16-bit 2-D operands without a prologue): NUM_SMS
# persistent programs walk the tiles, TMA loads the operands.  Elsewhere (no TMA on the
# GPU, operands TMA cannot address) the host runs the tiled kernel with the same tiles.
TMA_CANDIDATES_16 = (
    (128, 256, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 4),
    (128, 128, 64, 8, 8, 4),
    (128, 128, 64, 8, 4, 4),
    (128, 128, 128, 8, 8, 3),
    (64, 64, 128, 8, 4, 5),
)
# Warp-specialized persistent kernels (``"WS": True``: producer warps issue the TMA loads
# while the others run the dots and the epilogue; Triton tutorial 09) are no default
# candidates: measured on an H200 with Triton 3.6 (fp16, 4096^3 and 8192^3), 64 x 128 tiles
# in 4 warps reached 296-337 TFLOP/s where the plain TMA kernel reaches 670-680.  A schedule
# can ask for them, but not for 128-row tiles under 8 warps: on an H100 with Triton 3.6 those
# compile and then never finish (Triton 3.9 without a GPU fails to compile them).
# f32 operands (TF32 or IEEE): 4-byte elements, half the K per stage.
CANDIDATES_32 = (
    (128, 128, 32, 8, 8, 3),
    (128, 64, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4),
    (64, 64, 32, 8, 4, 4),
    (32, 64, 64, 8, 4, 4),
    (16, 64, 64, 8, 4, 4),
)
SPLIT_K_CANDIDATES_32 = (
    (64, 64, 32, 8, 4, 4, 4),
    (16, 64, 64, 8, 4, 4, 4),
)
# The config without tuning: the first row whose limit holds, (max M, max M * N, config)
# (one limit per row; a row with neither is the last).  Small M (decode) gets skinny
# tiles; otherwise the tiles grow with the output while the grid keeps one to two
# programs per SM (132 on an H100).  Guesses until measured on the H100.
HEURISTIC_16 = (
    (16, None, (16, 32, 128, 8, 4, 4)),
    (32, None, (32, 64, 128, 8, 4, 4)),
    (64, None, (64, 64, 64, 8, 4, 4)),
    (None, 1 << 19, (64, 64, 64, 8, 4, 4)),
    (None, 1 << 21, (64, 128, 64, 8, 4, 4)),
    (None, 1 << 22, (128, 128, 64, 8, 8, 4)),
    (None, None, (128, 256, 64, 8, 8, 3)),
)
HEURISTIC_32 = (
    (16, None, (16, 64, 64, 8, 4, 4)),
    (32, None, (32, 64, 64, 8, 4, 4)),
    (64, None, (64, 64, 32, 8, 4, 4)),
    (None, 1 << 21, (64, 128, 32, 8, 4, 4)),
    (None, None, (128, 128, 32, 8, 8, 3)),
)
# Triton's interpreter (no GPU) runs programs one after another in NumPy: a few
# mid-sized tiles are fastest there.  GROUP_M = 2 keeps the grouped order exercised.
INTERPRETER_CONFIG = (32, 32, 32, 2, 4, 1)
# Keys a schedule leaves out take these values.
SCHEDULE_DEFAULTS = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}

# Names the kernel defines for itself; a spec's names must differ.
KERNEL_LOCALS = frozenset({
    "M", "N", "K", "k", "pid_b", "num_pid_m", "num_pid_n", "num_pid_in_group", "group_id", "first_pid_m",
    "group_size_m", "pid_m", "pid_n", "offs_m", "offs_n", "offs_k", "offs_am", "offs_bn", "config", "EVEN_K",
    "start_pid", "num_tiles", "tile_id", "tile_id_c", "A_T", "B_T", "NUM_SMS", "TMA", "num_sms", "pid_k", "SPLIT_K",
    "split_k", "partials", "int64", "persistent", "WARP_SPECIALIZE", "EPILOGUE_SUBTILE", "acc_lo", "acc_hi", "half",
    "N_VEC", "K_VEC"})
# The host function's own locals: a spec's dimensions, parameters and outputs (host locals
# too) may not take them.
HOST_LOCALS = frozenset({"config", "persistent", "A_T", "B_T", "num_sms", "num_tiles", "split_k", "partials",
                         "tiles"})


@dataclass(frozen=True)
class Tile:
    """One operand of the matmul, read tile by tile in the K loop."""

    tile: str                     # the variable holding a tile: "A"
    ptrs: str                     # its pointer block: "A_ptrs"
    base: str                     # "A_ptr + offs_am[:, None] * A_stride0 + offs_k[None, :] * A_stride1"
    k_mask: str                   # "offs_k[None, :] < K - k * BLOCK_K"
    step: str                     # "A_stride1": the stride along K
    prologue: tuple[Line, ...]    # code on each tile before the dot (a pointwise prologue)
    zero_fill: bool               # the prologue may turn the zeros past K into something else


@dataclass(frozen=True)
class GemmPlan:
    name: str
    host: Host
    signature: str                # the host function's parameters (the shared ones and config=None)
    summary: str                  # "A[M, K] @ B[K, N] -> C[M, N]"
    pointers: tuple[str, ...]     # kernel arguments: input pointers, scalars, output pointers
    strides: tuple[str, ...]      # kernel arguments: one line of strides per tensor
    batched: bool
    a: Tile
    b: Tile
    dot: str                      # "acc = tl.dot(A, B, acc)"
    int64_casts: tuple[str, ...]  # lines under `if INT64:`, beside the sizes' casts
    loads: tuple[str, ...]        # the epilogue's tensor loads
    body: tuple[Line, ...]        # the epilogue, spec statement by statement
    stores: tuple[str, ...]
    helpers: tuple[str, ...]
    sizes: tuple[str, str, str]   # host expressions for M, N, K
    batch: str                    # host expression for the batch count ("" when not batched)
    launch: tuple[str, ...]       # lines of launch arguments before the constexprs
    tensors: tuple[str, ...]      # every tensor the kernel touches (for the int64 test)
    configs: tuple[str, ...]      # candidate configs, printed as dict literals
    heuristic: tuple[tuple[str, str], ...]   # (condition or "", config) rows; the last has no condition
    split_k: bool                 # the tiled kernel can split K (the module has the second kernel)
    tma: bool                     # the module has the Hopper variant (persistent, TMA loads)
    ws: bool                      # ... with WARP_SPECIALIZE
    subtile: bool                 # ... with EPILOGUE_SUBTILE
    # the tiled kernel's (size or stride, its VEC, host value), grouped: N and K, then a tensor's strides
    hints: tuple[tuple[tuple[str, str, str], ...], ...]
    tma_pointers: tuple[str, ...] # its arguments: descriptors, then the epilogue's
    tma_launch: tuple[str, ...]
    epilogue_pointers: tuple[str, ...]  # what the epilogue reads and writes: scalars, tensors, outputs
    epilogue_strides: tuple[str, ...]
    epilogue_launch: tuple[str, ...]
    operands: tuple[str, str]     # the tensors A and B are read from
    interpreter: str              # the config on Triton's interpreter
    config_check: str             # the host line for a config= given by the call
    scheduled: bool               # the candidates come from the spec's schedule
    tuning: Tuning
    pattern: str = "gemm"
    template: str = "gemm.jinja"

    @property
    def hint_params(self) -> tuple[str, ...]:
        """The tiled kernel's constexprs that say what divides N, K and each stride, a line a group."""
        return hint_params(self.hints)

    @property
    def hint_lines(self) -> tuple[str, ...]:
        """... written back into the values they divide (exactly: the host's _vec divides them)."""
        return hint_lines(self.hints)

    @property
    def hint_launch(self) -> tuple[str, ...]:
        """... and what the host passes for them, a line a group."""
        return hint_launch(self.hints)

    @property
    def kernel_choices(self) -> tuple[str, ...]:
        """The config keys that choose the persistent kernel and its options, which no kernel takes by name."""
        return ("TMA",) + ("WS",) * self.ws + ("SUBTILE",) * self.subtile

    @property
    def kernel_choices_note(self) -> str:
        options = " and ".join(self.kernel_choices[1:])
        if not options:
            return "TMA picks the kernel; no kernel takes it by name"
        return f"TMA picks the kernel, {options} its options; no kernel takes them by name"

    @property
    def kernel_choices_tuple(self) -> str:
        """``("TMA",)``, ``("TMA", "WS")``: ``kernel_choices`` as Python source."""
        keys = self.kernel_choices
        return "(" + ", ".join(f'"{k}"' for k in keys) + "," * (len(keys) == 1) + ")"

    @property
    def tma_flags(self) -> str:
        """The persistent launch's optional flags, read from the config ("" when neither exists)."""
        return " ".join(flag for flag, on in (('WARP_SPECIALIZE=config.get("WS", False),', self.ws),
                                               ('EPILOGUE_SUBTILE=config.get("SUBTILE", False),', self.subtile)) if on)


@dataclass(frozen=True)
class Lowered:
    """A GEMM kernel's parts that do not depend on how its programs walk the tiles:
    the operand tiles (with any prologue), the dot, the epilogue's loads, body and
    stores.  The tiled and persistent kernels here and the grouped GEMM print them."""

    mm: Node
    nodes: tuple[Node, ...]         # every node the outputs need
    tensors: tuple[str, ...]        # input tensors the kernel reads, in spec order
    scalars: tuple[str, ...]
    outputs: tuple[str, ...]
    epilogue_tensors: tuple[str, ...]   # the inputs the epilogue reads
    strides: dict                   # tensor -> the axes whose strides the kernel takes
    out_shape: tuple
    a: Tile
    b: Tile
    a_name: str                     # the tensors the operands are read from
    b_name: str
    same: bool                      # A @ A: one tensor, two tiles
    dot: str
    int64_casts: tuple[str, ...]
    loads: tuple[str, ...]
    body: tuple[Line, ...]
    stores: tuple[str, ...]


def match(kir: KernelIR) -> GemmPlan | None:
    if any(p.is_list for p in kir.params):
        return None       # a grouped GEMM (list parameters)
    low = lower(kir)
    if low is None:
        return None       # not a GEMM
    mm, out_shape, strides = low.mm, low.out_shape, low.strides
    lhs, rhs = mm.inputs
    tensors, scalars, outputs = list(low.tensors), list(low.scalars), list(low.outputs)
    a_name, b_name, same = low.a_name, low.b_name, low.same
    batched = len(out_shape) == 3
    a_input, b_input = kir.nodes[a_name], kir.nodes[b_name]
    stride_lines = tuple(", ".join(f"{t}_stride{ax}" for ax in sorted(strides[t])) for t in tensors + outputs
                         if strides[t])
    sizes = (str(mm.shape[-2]), str(mm.shape[-1]), str(lhs.shape[-1]))
    launch = (", ".join(tensors + scalars + outputs), ", ".join(sizes)) + tuple(
        ", ".join(f"{t}.stride({ax})" for ax in sorted(strides[t])) for t in tensors + outputs if strides[t])
    # What divides N, K and each stride, told to the tiled kernel (Triton sees multiples of 16 only)
    hints = (((("N", "N_VEC", sizes[1]), ("K", "K_VEC", sizes[2])),) + tuple(
        tuple((f"{t}_stride{ax}", f"{t}_VEC{ax}", f"{t}.stride({ax})") for ax in sorted(strides[t]))
        for t in tensors + outputs if strides[t]))
    _check_derived(kir, [vec for group in hints[1:] for _, vec, _ in group])
    # The Hopper variant reads A and B through TMA descriptors; the epilogue is the same.
    tma = (not batched and lhs is a_input and rhs is b_input and not same and lhs.dtype.bits == 16)
    # The persistent kernel and split-K's second kernel take what the epilogue reads and writes.
    epilogue_tensors = list(low.epilogue_tensors) + outputs
    epilogue_pointers = tuple(scalars) + tuple(f"{t}_ptr" for t in epilogue_tensors)
    epilogue_strides = tuple(", ".join(f"{t}_stride{ax}" for ax in sorted(strides[t])) for t in epilogue_tensors
                             if strides[t])
    epilogue_launch = (", ".join(scalars + epilogue_tensors), ", ".join(sizes[:2])) + \
        tuple(", ".join(f"{t}.stride({ax})" for ax in sorted(strides[t])) for t in epilogue_tensors if strides[t])
    descriptors = [f"{a_name}_desc", f"{b_name}_desc"]
    tma_launch = (", ".join(descriptors + scalars + epilogue_tensors), ", ".join(sizes)) + epilogue_launch[2:]
    if tma:
        _check_derived(kir, descriptors)
    candidates, rows, tunable, fixed = _schedule(kir, lhs.dtype, tma)
    split_k = any(c.get("SPLIT_K", 1) > 1 for c in candidates)
    h = host(kir)
    h = replace(h, checks=h.checks + bf16_check(low))
    summary = (f"{a_name}{_shape(lhs.shape)} @ {b_name}{_shape(rhs.shape)} -> "
               f"{', '.join(outputs)}{_shape(out_shape)}")
    tma = any(c.get("TMA") for c in candidates)
    ws, subtile = any(c.get("WS") for c in candidates), any(c.get("SUBTILE") for c in candidates)
    flags = ("SPLIT_K",) * split_k + ("TMA",) * tma + ("WS",) * ws + ("SUBTILE",) * subtile
    return GemmPlan(
        name=kir.name, host=h, signature=h.signature + ", config=None", summary=summary,
        pointers=tuple(f"{t}_ptr" for t in tensors) + tuple(scalars) + tuple(f"{o}_ptr" for o in outputs)
        + (("partials_ptr",) if split_k else ()),
        strides=stride_lines, batched=batched, a=low.a, b=low.b, dot=low.dot,
        int64_casts=low.int64_casts, loads=low.loads, body=low.body, stores=low.stores,
        helpers=helpers_for(low.nodes) + ("check_config", "check_tile_config") + ("bf16_dot",) * bool(bf16_check(low))
        + ("vec",) + (("num_sms", "tma_host") if tma else ()),
        sizes=sizes, batch=str(out_shape[0]) if batched else "",
        launch=(launch[0] + (", partials" if split_k else ""),) + launch[1:], tensors=tuple(tensors + outputs),
        configs=tuple(config_text(c) for c in candidates),
        heuristic=_merged([(_condition(m, mn), config_text(_config(c, **fixed))) for m, mn, c in rows]),
        split_k=split_k, tma=tma, ws=ws, subtile=subtile, hints=hints,
        tma_pointers=tuple(descriptors) + epilogue_pointers,
        tma_launch=tma_launch, epilogue_pointers=epilogue_pointers, epilogue_strides=epilogue_strides,
        epilogue_launch=epilogue_launch,
        operands=(a_name, b_name), interpreter=config_text(_config(INTERPRETER_CONFIG)),
        config_check=config_check(CONFIG_KEYS, flags, tiles=True),
        scheduled=any(k in SCHEDULE_KEYS and k not in ("TMA", "input_precision") for k in kir.schedule),
        # timed on the GPU alone (graphs), as the grouped GEMM's: TMA's extra host work aside
        # (timed only from TMA_MIN_FLOP, where the GPU's time hides it), every config costs the
        # host the same, and timed call by call a short GEMM runs at the host's pace wherever the
        # CPU is busy (an H100's, tuning bf16 128 x 4096 x 4096: 0.08-0.2 ms a candidate, for
        # kernels of about 20 us, and kept tiles that ran at 163 TFLOP/s where 221 run)
        tuning=Tuning(candidates if tunable else (), partial(prune, lhs=a_name, rhs=b_name),
                      buckets=_buckets(kir, mm.shape[-2]), graphs=True))


def lower(kir: KernelIR) -> Lowered | None:
    """The parts of a GEMM kernel (see ``Lowered``), or None when the kernel has no matmul.
    What is outside the pattern (a second matmul, a reduction after it) is an error."""
    nodes = topo_order(o.node for o in kir.outputs)
    matmuls = [n for n in nodes if n.op is Op.MATMUL]
    if not matmuls:
        return None
    if len(matmuls) > 1:   # the second to end in the spec's text (the graph's order follows operands)
        first, second = sorted(matmuls, key=lambda n: (n.span.end_line, n.span.end_col) if n.span else (0, 0))[:2]
        same = all(x is y for x, y in zip(first.inputs, second.inputs))
        hint = ("name it once (P = A @ B) and use P twice" if same else "split the spec into two kernels")
        raise UnsupportedError(f"a GEMM kernel computes one matmul; this is a second one ({hint})", second.span)
    mm = matmuls[0]
    lhs, rhs = mm.inputs
    under = {id(n) for n in topo_order([mm])}
    for n in nodes:
        if id(n) not in under and n.op not in POINTWISE and n.op not in LEAVES:
            raise UnsupportedError(f"{n.op.value} after a matmul is outside the GEMM pattern: its epilogue "
                                   f"must be pointwise", n.span)
        if id(n) not in under:
            for i in n.inputs:
                if id(i) in under and i is not mm and i.op not in LEAVES:
                    raise UnsupportedError("a value computed for the matmul's operand cannot be used "
                                           "after the matmul", i.span)
    for o in kir.outputs:   # the operands' values live in the K loop, a tile of K at a time
        if id(o.node) in under and o.node is not mm and o.node.op not in LEAVES:
            raise UnsupportedError(f"{o.name}, a value computed for the matmul's operand, cannot be an output "
                                   f"of the GEMM kernel (compute it in a kernel of its own)", o.node.span)
    out_shape = kir.outputs[0].node.shape
    first = kir.outputs[0]
    out_type = type_str(first.node.dtype, out_shape)
    for o in kir.outputs:
        if o.node.shape != out_shape:
            raise UnsupportedError(f"the outputs of a GEMM kernel must share one shape: {first.name} is {out_type}, "
                                   f"{o.name} is {type_str(o.node.dtype, o.node.shape)}", o.span)
    if len(out_shape) > 3:
        raise UnsupportedError(f"GEMM outputs have at most one batch dimension, got {out_type}", first.span)
    if tuple(out_shape[-2:]) != tuple(mm.shape[-2:]):
        raise UnsupportedError(f"the epilogue broadcasts the matmul's {type_str(mm.dtype, mm.shape)} result to "
                               f"{out_type}; only a batch dimension may be added", mm.span)
    a_input = _operand_input(lhs, "left")
    b_input = _operand_input(rhs, "right")
    check_locals(kir, KERNEL_LOCALS, "GEMM kernel", dims=HOST_LOCALS)
    batched = len(out_shape) == 3
    rank = len(out_shape)

    # The tensors the kernel reads, and along which of their axes.
    epilogue_reads = {id(i) for n in nodes if id(n) not in under for i in n.inputs} | \
                     {id(o.node) for o in kir.outputs}
    used = {id(n) for n in nodes}
    names: dict[int, str] = {id(mm): "acc"}
    strides: dict[str, set[int]] = {}       # tensor -> axes whose strides the kernel takes
    tensors, scalars, loads = [], [], []
    for p in kir.params:
        node = kir.nodes[p.name]
        if id(node) not in used:
            continue
        if p.is_scalar:
            scalars.append(p.name)
            names[id(node)] = p.name
            continue
        tensors.append(p.name)
        axes = strides.setdefault(p.name, set())
        if node is a_input or node is b_input:
            axes |= _operand_axes(p.shape, batched)
        if id(node) in epilogue_reads:
            load, load_axes = _epilogue_load(p.name, p.shape, rank, p.dtype)
            loads.append(load)
            axes |= load_axes
            names[id(node)] = p.name

    a_name, b_name = a_input.arg, b_input.arg
    same = a_input is b_input
    a_tile = Tile(
        tile=f"{a_name}_lhs" if same else a_name, ptrs=f"{a_name}_lhs_ptrs" if same else f"{a_name}_ptrs",
        base=_operand_base(a_name, a_input.shape, batched, "offs_am[:, None]", "offs_k[None, :]"),
        k_mask="offs_k[None, :] < K - k * BLOCK_K", step=f"{a_name}_stride{len(a_input.shape) - 1}",
        prologue=(), zero_fill=False)
    b_tile = Tile(
        tile=f"{b_name}_rhs" if same else b_name, ptrs=f"{b_name}_rhs_ptrs" if same else f"{b_name}_ptrs",
        base=_operand_base(b_name, b_input.shape, batched, "offs_k[:, None]", "offs_bn[None, :]"),
        k_mask="offs_k[:, None] < K - k * BLOCK_K", step=f"{b_name}_stride{len(b_input.shape) - 2}",
        prologue=(), zero_fill=False)
    a_tile = _with_prologue(a_tile, lhs, a_input, names, kir)
    b_tile = _with_prologue(b_tile, rhs, b_input, names, kir)
    _check_derived(kir, [a_tile.ptrs, b_tile.ptrs] + [t for t in (a_tile.tile, b_tile.tile) if t not in tensors])

    # The epilogue: spec statements after the matmul, on the accumulator.  Statements
    # that only feed an operand (a prologue) were printed in the K loop.
    for s in kir.stmts:
        if id(s.node) in under and s.node is not mm and id(s.node) not in names:
            names[id(s.node)] = s.name
    computed = {s.name: s.node for s in kir.stmts}
    body = statement_lines(kir, [computed[o.name] for o in kir.outputs], names)
    stores = []
    for o in kir.outputs:
        offsets = " + ".join(([f"pid_b * {o.name}_stride0"] if batched else [])
                             + [f"offs_m[:, None] * {o.name}_stride{rank - 2}",
                                f"offs_n[None, :] * {o.name}_stride{rank - 1}"])
        cast = store_cast(computed[o.name].dtype, o.node.dtype)
        stores.append(f"tl.store({o.name}_ptr + {offsets}, {o.name}{cast}, mask=mask)")
        strides[o.name] = set(range(rank))

    precision = _precision(kir, lhs.dtype)
    dot_args = f"{a_tile.tile}, {b_tile.tile}, acc" + (f', input_precision="{precision}"' if precision else "")
    # under INT64 the sizes are int64, and with them the tiles' offsets: the steps along K too
    int64 = [f"{step} = tl.cast({step}, tl.int64)" for step in dict.fromkeys((a_tile.step, b_tile.step))]

    epilogue_tensors = tuple(t for t in tensors if id(kir.nodes[t]) in epilogue_reads)
    return Lowered(mm=mm, nodes=tuple(nodes), tensors=tuple(tensors), scalars=tuple(scalars),
                   outputs=tuple(o.name for o in kir.outputs), epilogue_tensors=epilogue_tensors,
                   strides=strides, out_shape=tuple(out_shape), a=a_tile, b=b_tile, a_name=a_name, b_name=b_name,
                   same=same, dot=f"acc = tl.dot({dot_args})", int64_casts=tuple(int64), loads=tuple(loads),
                   body=tuple(body), stores=tuple(stores))


# --- operands -------------------------------------------------------------------

def _operand_input(operand: Node, side: str) -> Node:
    """The tensor input an operand reads: the operand itself, or the one input of its prologue."""
    if operand.op is Op.INPUT:
        return operand
    sub = topo_order([operand])
    inputs = [n for n in sub if n.op is Op.INPUT]
    other = [n for n in sub if n.op not in POINTWISE and n.op not in LEAVES]
    if other or len(inputs) != 1 or inputs[0].shape != operand.shape:
        raise UnsupportedError(f"the matmul's {side} operand must be a tensor input or a pointwise function of "
                               f"one input of its shape, such as f16(A) or relu(A)", operand.span)
    return inputs[0]


def _operand_axes(shape, batched: bool) -> set[int]:
    rank = len(shape)
    axes = {rank - 2, rank - 1}
    if batched and rank == 3 and shape[0] != 1:
        axes.add(0)
    return axes


def _operand_base(name: str, shape, batched: bool, rows: str, cols: str) -> str:
    rank = len(shape)
    terms = [f"{rows} * {name}_stride{rank - 2}", f"{cols} * {name}_stride{rank - 1}"]
    if batched and rank == 3 and shape[0] != 1:
        terms.insert(0, f"pid_b * {name}_stride0")
    return f"{name}_ptr + " + " + ".join(terms)


def _with_prologue(tile: Tile, operand: Node, source: Node, names: dict, kir: KernelIR) -> Tile:
    if operand is source:
        return tile
    loaded = tile.tile + _load_cast(source.dtype)
    printer = Printer({**names, id(source): loaded})
    parts = []   # a prologue nested too deep to print whole (ir.in_parts), in its parts
    inside = {id(n) for n in topo_order([operand])}
    for stmt in kir.stmts:
        if is_part(stmt) and id(stmt.node) in inside:
            parts.append(f"{stmt.name} = {printer.expr(stmt.node)[0]}")
            printer.names[id(stmt.node)] = stmt.name
    if operand.op is Op.CAST and operand.arg.bits < 32:   # f16(relu(A)): round once, on the result
        text, prec = printer.expr(operand.inputs[0])
        text = f"({text})" if prec < CALL else text
        text += f".to({operand.arg.triton})"
    else:
        text, prec = printer.expr(operand)
        if operand.dtype.compute is not operand.dtype:
            text = (f"({text})" if prec < CALL else text) + f".to({operand.dtype.triton})"
    sub = topo_order([operand])
    zero_fill = any(n.op not in (Op.CAST, Op.INPUT) for n in sub)
    comment = _span_text(kir, operand) + f", on each tile of {source.arg}"
    return Tile(tile.tile, tile.ptrs, tile.base, tile.k_mask, tile.step,
                (Line(comment, (*parts, f"{tile.tile} = {text}")),), zero_fill)


def _epilogue_load(name: str, shape, rank: int, dtype) -> tuple[str, set[int]]:
    """``b = tl.load(b_ptr + offs_n * b_stride0, mask=offs_n < N)``: a tensor the epilogue reads,
    broadcast to the tile.  Only the axes it varies along are addressed."""
    offset = rank - len(shape)
    roles = {}
    for axis, d in enumerate(shape):
        if d != 1:
            roles[("b", "m", "n")[offset + axis + (3 - rank)]] = axis
    terms = []
    if "b" in roles:
        terms.append(f"pid_b * {name}_stride{roles['b']}")
    both = "m" in roles and "n" in roles
    if "m" in roles:
        terms.append(f"offs_m{'[:, None]' if both else ''} * {name}_stride{roles['m']}")
    if "n" in roles:
        terms.append(f"offs_n{'[None, :]' if both else ''} * {name}_stride{roles['n']}")
    mask = "mask" if both else "offs_m < M" if "m" in roles else "offs_n < N" if "n" in roles else ""
    address = " + ".join([f"{name}_ptr"] + terms)
    text = f"tl.load({address}{', mask=' + mask if mask else ''}){_load_cast(dtype)}"
    if "m" in roles and not both:
        text += "[:, None]"
    return f"{name} = {text}", set(roles.values())


def _load_cast(dtype) -> str:
    return f".to({dtype.compute.triton})" if dtype.compute is not dtype else ""



def _shape(shape) -> str:
    return f"[{', '.join(str(d) for d in shape)}]"


def _span_text(kir: KernelIR, node: Node) -> str:
    span = node.span
    lines = kir.text.split("\n")
    if span is None or span.line != span.end_line or not 1 <= span.line <= len(lines):
        return node.op.value
    # printed in a comment: whitespace collapsed (a form feed would end the line) and escaped
    return comment_safe(" ".join(lines[span.line - 1][span.col - 1:span.end_col - 1].split()))


def _check_derived(kir: KernelIR, derived) -> None:
    """Names the generated code derives from the spec's (A_ptrs, A_shapes, A_desc) must not
    be the spec's own, dimensions included (they are host locals)."""
    dims = {d: p.span for p in kir.params for d in p.shape or () if isinstance(d, str)}
    spec = dims | {p.name: p.span for p in kir.params} | {s.name: s.span for s in kir.stmts}
    for name in derived:
        if name in spec:
            what = "the dimension" if name in dims and name not in {p.name for p in kir.params} else "it"
            raise UnsupportedError(f"'{name}' is a name the generated GEMM kernel uses itself; rename {what}",
                                   spec[name])


# --- schedule -------------------------------------------------------------------

def _precision(kir: KernelIR, dtype) -> str:
    values = kir.schedule.get("input_precision", ("tf32",))
    if len(values) != 1 or values[0] not in PRECISIONS:
        raise SpecError(f"input_precision takes one of {', '.join(PRECISIONS)}, got "
                        f"{', '.join(map(str, values))}",   # at a value it does not take, else at the list
                        kir.schedule_span("input_precision", next((v for v in values if v not in PRECISIONS), None)))
    return values[0] if dtype.bits == 32 else ""


def bf16_check(low: Lowered) -> tuple[str, ...]:
    """The host line that refuses Triton's interpreter where a dot operand is bf16: numpy has
    no bf16, and the interpreter's tl.dot on it returns garbage rather than failing."""
    lhs, rhs = low.mm.inputs
    if D.BF16 not in (lhs.dtype, rhs.dtype):
        return ()
    return (f'_check_bf16_dot("{low.a_name if lhs.dtype == D.BF16 else low.b_name}", device)',)


def _config(values, SPLIT_K=1, TMA=False, WS=False, SUBTILE=False) -> dict:
    """A config as the host takes it: the six ``CONFIG_KEYS``, then the flags that are on."""
    config = dict(zip(CONFIG_KEYS, values))
    if SPLIT_K > 1:
        config["SPLIT_K"] = SPLIT_K
    for key, on in (("TMA", TMA), ("WS", WS), ("SUBTILE", SUBTILE)):
        if on:
            config[key] = True
    return config


@cache
def has_warp_specialize() -> bool:
    """Whether the installed Triton's ``tl.range`` takes ``warp_specialize`` (on Hopper:
    Triton 3.5 and later).  Without it, no candidate asks for WS and the persistent kernel
    does not mention it."""
    import triton.language as tl
    try:
        return "warp_specialize" in inspect.signature(tl.range).parameters
    except (TypeError, ValueError):
        return False


def _schedule(kir: KernelIR, dtype, tma: bool):
    """(candidates, heuristic rows, tunable, fixed flags): the spec's schedule, or kgen's
    defaults.  The heuristic's configs take the flags that the schedule fixes to one value."""
    unknown = sorted(set(kir.schedule) - set(SCHEDULE_KEYS))
    if unknown:
        raise SpecError(f"GEMM kernels take {', '.join(SCHEDULE_KEYS)} in their schedule, not '{unknown[0]}'",
                        kir.schedule_span(unknown[0]))
    wide = dtype.bits == 32
    rows = HEURISTIC_32 if wide else HEURISTIC_16
    given = {k: v for k, v in kir.schedule.items() if k in CONFIG_KEYS}
    flags = {k: v for k, v in kir.schedule.items() if k in FLAG_KEYS}
    defaults = not given and set(flags) <= {"TMA"}
    variants = flags.get("TMA", (0, 1) if tma and defaults else (0,))
    splits, ws, subtiles = flags.get("SPLIT_K", (1,)), flags.get("WS", (0,)), flags.get("SUBTILE", (0,))
    for key, values in (("TMA", variants), ("WS", ws), ("SUBTILE", subtiles)):
        if any(v not in (0, 1) for v in values):
            bad = next(v for v in values if v not in (0, 1))
            raise SpecError(f"{key} takes 0 or 1, got {', '.join(map(str, values))}", kir.schedule_span(key, bad))
    if 1 in variants and not tma:
        if 0 not in variants:
            raise SpecError("TMA = 1 needs 2-D 16-bit operands read as they are (no batch, no prologue)",
                            kir.schedule_span("TMA", 1))
        # TMA = [0, 1] where the plan cannot read through TMA (f32, a batch, a prologue): the tiled
        # kernel's candidates alone, and the persistent kernel's options (WS, SUBTILE) go with TMA's
        variants, ws, subtiles = (0,), (0,), (0,)
    if (1 in ws or 1 in subtiles) and 1 not in variants:
        raise SpecError("WS and SUBTILE are options of the persistent kernel: they need TMA = 1",
                        kir.schedule_span("WS", 1) if 1 in ws else kir.schedule_span("SUBTILE", 1))
    if 1 in ws and not has_warp_specialize():
        raise SpecError("WS = 1 needs a Triton whose tl.range takes warp_specialize (3.5 or later)",
                        kir.schedule_span("WS", 1))
    if any(v != 1 for v in splits) and 0 not in variants:
        raise SpecError("SPLIT_K is an option of the tiled kernel: it needs TMA = 0",
                        kir.schedule_span("SPLIT_K", next(v for v in splits if v != 1)))
    fixed = {key: bool(values[0]) if key != "SPLIT_K" else values[0] for key, values in
             (("SPLIT_K", splits), ("TMA", variants), ("WS", ws), ("SUBTILE", subtiles)) if len(values) == 1}
    if defaults:
        candidates = []
        if 0 in variants:
            candidates += [_config(c) for c in (CANDIDATES_32 if wide else CANDIDATES_16)]
            candidates += [_config(c[:6], SPLIT_K=c[6]) for c in (SPLIT_K_CANDIDATES_32 if wide
                                                                   else SPLIT_K_CANDIDATES_16)]
        if 1 in variants:
            candidates += [_config(c, TMA=True) for c in TMA_CANDIDATES_16]
        return tuple(candidates), rows, True, fixed
    check_schedule_values({**given, "SPLIT_K": splits}, kir)
    lists = [given.get(k, (SCHEDULE_DEFAULTS[k] if not (wide and k == "BLOCK_K") else 32,)) for k in CONFIG_KEYS]
    check_tile_products(lists, kir)
    candidates = []
    for variant in variants:
        for c in itertools.product(*lists):
            candidates += ([_config(c, SPLIT_K=s) for s in splits] if not variant else
                           [_config(c, TMA=True, WS=w, SUBTILE=u) for w in ws for u in subtiles])
    hangs = [c for c in candidates if c.get("WS") and _ws_hangs(c["BLOCK_M"], c["num_warps"])]
    if hangs and len(hangs) == len(candidates):
        raise SpecError("WS = 1 with a BLOCK_M of 128 or more needs num_warps = 8: in fewer warps the "
                        "warp-specialized kernel never finishes (an H100, Triton 3.6); list BLOCK_M = 64 "
                        "or num_warps = 8", kir.schedule_span("WS", 1))
    candidates = [c for c in candidates if c not in hangs]
    constrained = []
    for m, mn, config in rows:
        config = tuple(_closest(v, lists[i]) for i, v in enumerate(config))
        if constrained and constrained[-1][2] == config:   # one row: either condition picks it
            pm, pmn, _ = constrained[-1]
            unconditional = (m is None and mn is None) or (pm is None and pmn is None)
            m = None if unconditional else max(filter(None, (m, pm)), default=None)
            mn = None if unconditional else max(filter(None, (mn, pmn)), default=None)
            constrained[-1] = (m, mn, config)
        else:
            constrained.append((m, mn, config))
    if fixed.get("WS"):   # the untuned config too: a tile that would hang takes the first candidate's
        safe = tuple(candidates[0][k] for k in CONFIG_KEYS)
        constrained = [(m, mn, safe if _ws_hangs(c[0], c[4]) else c) for m, mn, c in constrained]
    return tuple(candidates), tuple(constrained), len(candidates) > 1, fixed


def _ws_hangs(block_m: int, num_warps: int) -> bool:
    """Warp-specialized tiles that compile and never finish (an H100, Triton 3.6)."""
    return block_m >= 128 and num_warps < 8


# The most SPLIT_K the host's _check_tile_config takes (a tuned candidate passes that check too):
# CUDA's programs along a grid's second axis
MAX_SPLIT_K = 65535


def check_schedule_values(given: dict, kir: KernelIR) -> None:
    """A schedule's tile and launch values (GEMM and grouped GEMM): positive integers;
    tiles powers of two of at least 16, GROUP_M and num_warps powers of two.  Errors
    point at the value."""
    for key, values in given.items():
        for v in values:
            if not isinstance(v, int) or v <= 0:
                raise SpecError(f"{key} takes positive integers, got {v}", kir.schedule_span(key, v))
            if key.startswith("BLOCK") and (v < 16 or v & (v - 1)):
                raise SpecError(f"{key} must be a power of two of at least 16 (tl.dot's smallest tile), got {v}",
                                kir.schedule_span(key, v))
            if key in ("GROUP_M", "num_warps") and v & (v - 1):
                raise SpecError(f"{key} must be a power of two, got {v}", kir.schedule_span(key, v))
            if key == "SPLIT_K" and v > MAX_SPLIT_K:
                raise SpecError(f"SPLIT_K takes at most {MAX_SPLIT_K} (CUDA's programs along a grid's second axis), "
                                f"got {v}", kir.schedule_span(key, v))


def hint_params(hints) -> tuple[str, ...]:
    """A kernel's hint constexprs, a line a group of ``hints`` ((value, its VEC, host value), ...)."""
    return tuple(" ".join(f"{vec}: tl.constexpr," for _, vec, _ in group) for group in hints)


def hint_lines(hints) -> tuple[str, ...]:
    return tuple(f"{value} = {value} // {vec} * {vec}" for group in hints for value, vec, _ in group)


def hint_launch(hints) -> tuple[str, ...]:
    return tuple(" ".join(f"{vec}=_vec({host})," for _, vec, host in group) for group in hints)


def check_tile_products(lists, kir: KernelIR) -> None:
    """Each pair of a schedule's tiles (``lists``: CONFIG_KEYS' values, the defaults' where it
    gives none) is a tensor of the kernel: at most 2**20 elements, Triton's largest, as the
    host's config check asks of every candidate.  The error at the larger value it gives."""
    tiles = dict(zip(CONFIG_KEYS, lists))
    for a, b in (("BLOCK_M", "BLOCK_N"), ("BLOCK_M", "BLOCK_K"), ("BLOCK_K", "BLOCK_N")):
        if max(tiles[a]) * max(tiles[b]) > 2**20:
            key = max((k for k in (a, b) if k in kir.schedule), key=lambda k: max(tiles[k]))
            raise SpecError(f"{a} * {b} must be at most 2**20 (Triton's largest tensor), got "
                            f"{max(tiles[a])} * {max(tiles[b])}", kir.schedule_span(key, max(tiles[key])))


def _closest(value: int, allowed) -> int:
    return min(allowed, key=lambda v: (abs(math.log2(v) - math.log2(value)), v))


def _buckets(kir: KernelIR, m: Dim) -> tuple[tuple[str, int], ...]:
    """The tuning key's rounded axes: every tensor axis of the symbolic M (the output's
    rows), so that one config serves each doubling of a varying batch of rows."""
    if not isinstance(m, str):
        return ()
    return tuple((p.name, axis) for p in kir.params if not p.is_scalar
                 for axis, d in enumerate(p.shape) if d == m)


def _merged(rows: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Heuristic rows with neighbours of one config as one row (``M <= 64 or M * N <= 524288``;
    one before the unconditional last row of its config: that row alone)."""
    merged: list[tuple[str, str]] = []
    for condition, config in rows:
        if merged and merged[-1][1] == config:
            before = merged[-1][0]
            merged[-1] = (f"{before} or {condition}" if condition else "", config)
        else:
            merged.append((condition, config))
    return tuple(merged)


def _condition(max_m, max_mn) -> str:
    parts = ([f"M <= {max_m}"] if max_m is not None else []) + \
            ([f"M * N <= {max_mn}"] if max_mn is not None else [])
    return " or ".join(parts)


# SMs when the operands are not on a GPU (the tests' CPU tensors): an H100's.
DEFAULT_SMS = 132
# TMA configs are timed only for problems of at least this many flops (2 M N K), whose GPU
# time (50 us and more) hides the host's extra work per call for the descriptors: f16
# 2048^3 (2^34) on an H100, 128 x 128 tiles with TMA were the fastest on the GPU but ran
# at 527 TFLOP/s call by call, where 128 x 256 tiles without reached 580.
TMA_MIN_FLOP = 2**35
# ... or half as many where an operand's rows (or columns) lie 16 bytes past a multiple of 32
# apart, so that every other one starts mid-sector: there the tiled kernel's 16-byte copies run
# 24-40% slower, TMA's 0-10% (on an H100, f16 4096 x 1000 x 4096: 75 us tiled, 63 with TMA,
# cuBLAS 53; README, "GEMM sizes and strides that are not multiples of 16"), whatever the waves


def times_tma(tensor: torch.Tensor, flop: int, half_sector: bool = False, least: int = TMA_MIN_FLOP) -> bool:
    """Whether TMA candidates are timed for a problem of ``flop`` on ``tensor``'s device: on
    a GPU with TMA from ``least`` (half as many where an operand's rows start mid-sector); off
    the GPU always (they run the fallback, which the tests exercise)."""
    least = least // 2 if half_sector else least
    return not tensor.is_cuda or (torch.cuda.get_device_capability(tensor.device)[0] >= 9 and flop >= least)


def prune(configs, bound: dict, lhs: str, rhs: str):
    """The candidates worth timing for one problem:

    - tiles no larger than the problem (rounded up to a power of two, at least 16) on each axis;
    - TMA configs only where the GPU has TMA and the operands are ones it can address, the
      problem has at least TMA_MIN_FLOP, and the output has more tiles than the GPU has SMs
      (with one wave or less the persistent loop gains nothing; building the descriptors
      costs the host about 20 us a call on an H200's host, enough to show in a GEMM of less
      than 50 us); where an operand's rows start mid-sector (``_half_sector``), from
      half TMA_MIN_FLOP and with any number of tiles: TMA's loads are what gain there;
    - split-K only where the output has fewer tiles than the GPU has SMs, and each slice
      of K keeps at least 4 steps of BLOCK_K;
    - of those, the ones whose programs keep a quarter of the SMs busy (or as many as any
      candidate can), and tiles smaller than 64 x 128 only where they make at most 4
      programs per SM (larger problems have larger tiles that fill the GPU).
    """
    a, b = bound[lhs], bound[rhs]
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = math.prod(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    cap = lambda size: max(16, 1 << max(0, size - 1).bit_length())  # noqa: E731
    addressable = all(_tma_addressable(t) for t in (a, b))
    half = addressable and any(_half_sector(t) for t in (a, b))
    tma = addressable and times_tma(a, 2 * m * n * k * batch, half)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else DEFAULT_SMS
    tiles = lambda c: -(-m // c["BLOCK_M"]) * -(-n // c["BLOCK_N"]) * batch  # noqa: E731
    programs = lambda c: tiles(c) * c.get("SPLIT_K", 1)  # noqa: E731
    kept = [c for c in configs
            if c["BLOCK_M"] <= cap(m) and c["BLOCK_N"] <= cap(n) and c["BLOCK_K"] <= cap(k)
            and (not c.get("TMA") or (tma and (half or tiles(c) > sms)))
            and (c.get("SPLIT_K", 1) == 1 or (tiles(c) < sms and k >= 4 * c["SPLIT_K"] * c["BLOCK_K"]))]
    if kept:
        enough = min(sms // 4, max(map(programs, kept)))
        kept = [c for c in kept if programs(c) >= enough
                and (programs(c) <= 4 * sms or c["BLOCK_M"] * c["BLOCK_N"] >= 64 * 128)]
    return kept or [min(configs, key=lambda c: (bool(c.get("TMA")), c.get("SPLIT_K", 1),
                                                c["BLOCK_M"] * c["BLOCK_N"], c["BLOCK_K"]))]


def _half_sector(t) -> bool:
    """Whether a TMA-addressable operand's rows (or columns, where those are contiguous) lie 16
    bytes past a multiple of 32 apart: every other one starts in the middle of a 32-byte sector."""
    unit = 1 if t.stride(1) == 1 else 0
    return t.stride(1 - unit) * t.element_size() % 32 == 16


def _tma_addressable(t) -> bool:
    """What the generated ``_tma_descriptor`` accepts: 2-D, rows or columns contiguous, 16-byte aligned."""
    if t.dim() != 2 or 0 in t.shape:
        return False
    for rows, cols in ((0, 1), (1, 0)):
        if t.stride(cols) == 1:
            return t.data_ptr() % 16 == 0 and t.stride(rows) * t.element_size() % 16 == 0
    return False
