"""Row reduction: softmax, log-softmax, layernorm, rmsnorm, and any spec whose
reductions (``sum max min mean``) run along the last axis, with pointwise code
before, between and after them.

The row space.  Every reduction reduces the last axis of one row shape
``[L0, ..., N]``; the leading axes are flattened into ``n_rows`` rows (row ``r``
is split back into coordinates, so a strided or permuted tensor needs no copy,
and each operand brings its own strides, the column stride included).  A value
varies along the row (last dim ``N``: ``X``, ``W: [N]``) or is one per row (last
dim 1: a reduction's result, ``eps``, an input of shape ``[M, 1]``).  Outputs
have the rows' shape: ``[M, N]`` or ``[M, 1]`` (layernorm's ``mu`` and ``rstd``).

Two or three kernels per spec; the host picks one per call from ``n_cols``:

* **rows on chip** (``<name>_kernel``): ``BLOCK_N = next_pow2(N)`` up to
  ``MAX_BLOCK_N`` columns, whatever the element, with 32 warps from 16385 columns
  (f16 at N = 32768 on an H100, softmax 2320 -> 2570 GB/s, log-softmax 2100 -> 2640,
  layernorm 1730 -> 2740, rmsnorm 2470 -> 2790, where the looped kernel ran them;
  f32 rows gained as much: see MAX_BLOCK_N).  A tile is ``[BLOCK_ROWS, BLOCK_N]``:
  one row for wide rows, several for narrow ones (``TILE_BYTES // (BLOCK_N * element
  size)``), so that a program always has a useful amount of work.  The host launches
  one program per tile: on an H200 that beat every persistent program count we
  measured (2, 4 or 8 per SM, or as many as fit) by 3-10% (the seed's
  occupancy-sized grid is what the looped kernel uses).  Rows up to
  ``STRAIGHT_MAX_BLOCK_N`` columns run straight-line code; wider ones keep the tile
  in a grid-stride loop (``TILE_LOOP``), which runs once on a GPU and ran 1-5%
  faster there than straight-line code (slower on the narrow rows), but for rows that
  do not move in whole 16-byte vectors (``ROW_VEC``), which it slowed by up to 2.2x
  up to ``UNALIGNED_STRAIGHT_MAX_BLOCK_N`` columns; the tile's code
  is one function, ``_<name>_tile``, that both call.  Each operand is loaded under
  the first statement that reads it, so a weight or bias used after the reductions
  is not held in registers through them (layernorm at N = 8192: 2700 -> 3350 GB/s),
  with ``evict_last``, as every tile reads it, and ``EVEN_N`` (the row is exactly
  ``BLOCK_N`` wide) drops the column mask.  Where 16 warps would leave an SM's
  registers to one program (more than 64 a thread, counted on the compiled kernel),
  the host launches ``NARROWER`` warps capped at 128 registers instead (layernorm at
  10240 to 16384 columns: 1.5x).  Reductions are ``tl.sum``/``tl.reduce`` over axis 1
  with ``keep_dims``, so per-row values are ``[BLOCK_ROWS, 1]`` and broadcast as in
  the spec.
* **looped** (``<name>_looped_kernel``), for wider rows: each tile of rows is
  swept in chunks of ``CHUNK_N`` columns, once per *level* of reductions (a
  reduction's level is one more than the deepest reduction it depends on) and
  once more for the row outputs; each sweep re-reads its inputs and recomputes
  the pointwise code it needs.  Sweeps alternate direction, so that each starts
  on the chunks the one before read last, which L2 still holds (f32 softmax at N
  = 65536 2675 -> 2787 GB/s on an H200, 0-3% on the other wide rows), ending
  with a forward output sweep where it reads operands no sweep before it did
  (layernorm's ``W`` and ``B``, rmsnorm's ``W``).  Sums keep a
  ``[BLOCK_ROWS, BLOCK_N]`` accumulator reduced once after the loop.  Two
  one-pass special cases share a sweep between a reduction and the one it
  depends on.  **Online softmax**: a ``sum`` (or ``mean``) of
  ``exp(a - m)`` with ``m = max(a)`` is found in the IR and computed in the same
  sweep as ``m``, keeping a running max and rescaling the running sum whenever
  the max grows; softmax and log-softmax then read the row twice, not three
  times.  **Variance with its mean**: ``mean((a - m) ** 2)`` (or ``sum``, or ``d * d``)
  with ``m = mean(a)`` runs in ``m``'s sweep: the chunks inside the row keep
  Welford lanes (each lane's sum and squared deviations from its running mean),
  merged once they are read; the chunks at the row's ends merge one by one (their
  sum, and their squared deviations from their own mean), each merge by Chan's
  update, which stays exact where the one-pass ``E[x^2] - E[x]^2`` cancels;
  layernorm reads the row twice, not three times (on an H200, f16 rows of 50176
  to 128256 columns 0-28% faster than three sweeps, f32 rows 10-23%).
  ``SHIFT`` (see ``_row_starts``): rows Triton cannot
  prove 16-byte aligned (odd N) start their chunks on the boundary below the row, so
  that memory moves in whole vectors (f32 softmax at N = 50257 on an H100: 810 -> 1910
  GB/s; f16 layernorm at 65537: 845 -> 1080).  Each sweep runs two loops: one over the
  chunks that lie inside the row, with no column masks (pipelined), and one over the
  one to three chunks that hold its ends (chunk 0 under SHIFT, and the last), masked
  as above; ``EVEN_N`` (a whole number of chunks) leaves the second loop empty.
  Masking every chunk cost the selects and, under SHIFT, the registers of its edge
  code (98-128 a thread, one 16-warp program per SM): with masks at the ends only,
  ``NARROW_CHUNK_N`` on rows under ``WIDE_ROW`` and ``LOOPED_MAXNREG``, f16 softmax at
  N = 50257 went from 1360 to 2380 GB/s on an H200 (eager 2070), layernorm f16 from
  1040 to 1410, f32 rmsnorm at 32001 from 1950 to 2330.  ``LOOPED_PER_SM`` programs an SM
  walk the rows, but for rows that loop only because they are shifted (up to ``MAX_BLOCK_N``
  columns: 16-bit ones from ``SHIFTED_MAX_BLOCK_N``, f32 ones where the block on chip would be
  part empty, ``SHIFTED_F32_FILL``): a program a row, no pipeline, no cap (HELD_SHIFTED_STAGES);
  16-bit rows of an odd width in the norms (sums scaled by a weight) loop from ``ODD_FROM``
  columns, two rows a program in short chunks (``ODD_*``).
* **split rows** (``<name>_split_kernel``), for f32 rows wider than 32768
  when the reductions take one sweep (softmax, log-softmax, rmsnorm; not
  layernorm, whose one-pass variance ran faster looped) and the rows are not
  shifted (the looped kernel ran shifted rows 1.5-2.3x as fast): a group of
  ``SPLIT = cdiv(N, CHUNK_N)`` programs shares a row, one chunk each.  A program
  computes its chunk's partials as the looped kernel's sweep would for one chunk
  (an online max and sum for softmax), stores them and
  raises a flag (release), polls its peers' flags, then combines every partial
  in the same order, so that all programs of the group see the same row values
  (while every peer publishes in time: see below),
  and computes its chunk's outputs from the operands it still holds in registers
  (loading only those the reduction did not read, rmsnorm's W).  Each element is
  read from DRAM once: f32 softmax, log-softmax and rmsnorm from N = 40000 to
  262144 on an H100, 2476-2841 GB/s, 1.15-1.33x the same kernel reading its
  chunk again from L2.  Programs wait for each other, so the host launches only
  as many groups as fit on the GPU at once (their registers capped to fit) and
  picks the looped kernel when one group would not fit; a peer not seen within
  ``SPLIT_SPIN`` polls has its partials computed by the waiting program from
  memory (the same code on the same chunk, so the same values up to rounding:
  within a chunk the pieces sum in another order) in pieces of
  ``SPLIT_PEER_N`` columns, which leaves the registers to the chunk it holds (a
  whole chunk there cost the kernel 10-20% though it never ran), and lets
  Triton's interpreter, running programs one by one, run this kernel.  One
  exchange per level (layernorm) measured slower, and f16 rows gained 5% at
  best: those take the looped kernel.

Numerics: 16-bit inputs are computed in f32 and rounded on store.  Masked lanes
never reach a reduction: each reduction's operand goes through
``tl.where(mask, x, identity)`` (so pointwise code on padding, ``-X`` or
``log(X)``, cannot leak), max and min propagate NaN as torch does
(``max_combine``), and online softmax shifts by 0 while the running max is still
``-inf``, so an all ``-inf`` prefix adds 0 instead of NaN (an all ``-inf`` row
gives NaN, as torch does).  A reduction over an axis of size 1 is its input: it
is dropped, and a kernel left without reductions is elementwise.

Knobs (the thresholds are ``row_tiling``'s constants, measured on GPUs):

* schedule ``BLOCK_N = b``: the widest row kept on chip and the chunk of the
  looped kernel (rows wider than ``b`` loop in chunks of ``b``); ``BLOCK_ROWS``,
  ``num_warps`` and ``num_stages`` fix those choices.  One value per key.
* environment ``KGEN_FORCE_CHUNK=b`` at generation time: as ``BLOCK_N = b`` for
  every row-reduction kernel (it changes the generated source, so ``kgen build
  --check`` reports files built without it as stale).
"""
from __future__ import annotations

import re

from dataclasses import dataclass, replace
from typing import NamedTuple

from .. import dtypes as D
from ..check import _source
from ..errors import UnsupportedError
from ..ir import REDUCTIONS, Dim, KernelIR, Node, Op, Shape, topo_order, type_str
from ..lower import HELPERS, Line, Printer, helpers_for, live_nodes, statement_lines, store_cast
from . import elementwise
from .host import Host, check_locals, host
from .row_tiling import UNALIGNED_FROM, Tiling, row_bytes, tiling

NEG_INF, POS_INF, NAN = 'float("-inf")', 'float("inf")', 'float("nan")'
I32_MIN, I32_MAX = "-2147483648", "2147483647"
# Names the kernels and host function define themselves: a spec's may not take them, and
# reductions' and accumulators' names avoid them.
_LOCALS = frozenset({"row", "col", "row0", "col0", "rem", "mask", "row_mask", "col_mask", "n_rows", "n_cols",
                     "tl", "triton", "BLOCK_ROWS", "BLOCK_N", "NUM_STAGES", "INT64", "EVEN_N", "PER_SM",
                     # the on-chip kernels' constexprs
                     "TILE_LOOP", "ROW_VEC",
                     # the split kernel's
                     "part", "peer", "peers", "slot", "own_partials", "peer_partials", "flags", "polls", "chunk",
                     "partials", "partials_ptr", "flags_ptr", "SPLIT", "SPLIT_BLOCK", "SPIN", "SPLIT_SPIN",
                     "NUM_WARPS", "PEER_N", "CHUNK_N", "chunk_lane0", "piece",
                     # the looped kernels' lanes (SHIFT)
                     "lane", "lane0", "shift", "n_lanes", "lane_end", "lane_lo", "lane_hi", "window", "inner", "edges",
                     "SHIFT", "VEC",
                     # ... and their chunks
                     "n_chunks", "whole_lo", "whole_hi", "n_ends", "end", "chunk_cols"})
# The host function's own locals: a spec's dimensions, parameters and outputs (host locals too)
# may not take them.
_HOST_LOCALS = frozenset({"n_rows", "n_cols", "BLOCK_N", "BLOCK_ROWS", "SHIFT", "SPLIT", "NUM_WARPS", "PER_SM",
                          "ROW_VEC", "ODD", "WIDE", "kernel", "options", "device"})

# A looped kernel's chunk: its lanes (columns from the row's start, shifted under SHIFT) ...
_LANES = (
    "lane = lane0 + tl.arange(0, BLOCK_N)[None, :]",
    "col = lane - shift  # the row's columns",
    "if INT64:",
    "    lane = lane.to(tl.int64)",
    "    col = col.to(tl.int64)",
)
# ... and masks.  Chunks whole_lo to whole_hi - 1 lie inside every row, whatever its shift:
# no column masks, and none at all in a tile of one row (the masks' selects and the
# registers they take, on every element) ...
INNER_LANES = _LANES + (
    "col_mask = True  # every column in the row",
    "mask = row_mask | (BLOCK_ROWS == 1)  # a one-row tile's row exists: no mask at all",
    "window = mask",
    "inner = mask",
)
# ... while the chunks before whole_lo and from whole_hi on hold the row's ends
END_LANES = _LANES + (
    "col_mask = col < n_cols",
    "mask = row_mask & col_mask",
    "window = mask",
    "inner = mask",
    "if SHIFT:",
    "    # whole 16-byte vectors: loads read every one the row touches, stores write those it fills",
    "    col_mask = (col >= 0) & (col < n_cols)",
    "    mask = row_mask & col_mask",
    "    window = tl.max_constancy(row_mask & (lane < lane_end), [1, VEC])",
    "    inner = tl.max_constancy(row_mask & (lane >= lane_lo) & (lane < lane_hi), [1, VEC])",
    "    edges = mask & ((lane < lane_lo) | (lane >= lane_hi))",
)
# The split kernel's chunk, whose rows are never shifted: lanes are the row's columns, and
# EVEN_N (a whole number of chunks) drops their mask
SPLIT_LANES = (
    "lane = lane0 + tl.arange(0, BLOCK_N)[None, :]",
    "if INT64:",
    "    lane = lane.to(tl.int64)",
    "col = lane  # the row's columns",
    "col_mask = (col < n_cols) | EVEN_N",
    "mask = row_mask & col_mask",
    "window = mask",
    "inner = mask",
)
# A sweep that merges the chunks at a row's ends by their means and squared deviations (see
# _Planner.centered) counts the columns of each that lie in the row, from the chunk's first
# column lane0 - shift (a sum over the mask would cost a reduction, and Triton gave it a
# layout that ran every lane in every thread)
END_COUNT = ("chunk_cols = tl.maximum(tl.minimum(lane0 - shift + BLOCK_N, n_cols) - tl.maximum(lane0 - shift, 0), 0)",
             "chunk_cols = chunk_cols.to(tl.float32)")


_ASSIGNS = re.compile(r"\s*([A-Za-z_]\w*) = ")


def _code(items) -> str:
    """The code of ``items`` (strings and Lines) on one line, comments cut."""
    return " ".join(code.split("#")[0] for item in items for code in (item.code if isinstance(item, Line) else (item,)))


def _reads(text: str, name: str) -> bool:
    """Whether ``text`` reads ``name``: a keyword argument (``mask=row_mask``) or an assignment
    to it does not."""
    return re.search(rf"(?<![\w.]){name}\b(?!\s*=(?!=))", text) is not None


def read_lanes(lanes: tuple[str, ...], rest: list) -> tuple[str, ...]:
    """The lane lines that the chunk's other code (``rest``: strings and Lines) reads: the
    assignments of a name that nothing else reads go, then ``if`` blocks left with no code,
    until none changes, so that a chunk prints only the masks it uses (one whose body
    reads no column prints no ``col``).  Reads are whole words outside comments."""
    others = _code(rest)
    lines = list(lanes)
    while True:
        assigned = [m.group(1) if (m := _ASSIGNS.match(line)) else None for line in lines]
        reads = [line.split("#")[0].split(" = ", 1)[-1] for line in lines]   # a line's right side

        def read(name: str) -> bool:
            return _reads(" ".join([others] + [r for r, a in zip(reads, assigned) if a != name]), name)
        kept = [line for line, name in zip(lines, assigned) if name is None or read(name)]
        kept = [line for i, line in enumerate(kept)
                if not line.lstrip().startswith(("if ", "#")) or _block_has_code(kept, i)]
        if kept == lines:
            return tuple(lines)
        lines = kept


def _read_finals(sweeps: list[Sweep]) -> list[Sweep]:
    """The sweeps with each final value after a sweep kept only where later code reads it: a
    mean whose only use is in its variance (``d = X - mean(X)``, then ``mean(d * d)``) is
    merged chunk by chunk and never needed whole."""
    later = ""
    kept: list[Sweep] = []
    for sweep in reversed(sweeps):
        after: list[Line] = []
        for line in reversed(sweep.after):
            code = tuple(c for c in line.code if not (m := _ASSIGNS.match(c)) or _reads(later, m.group(1)))
            later += " " + _code(code)
            if code:
                after.insert(0, Line(line.comment, code))
        later += " " + _code([*sweep.before, *sweep.loads, *sweep.body, *sweep.stores, *sweep.edge_stores,
                              *(sweep.whole_body or ()), *sweep.whole_after])
        kept.insert(0, replace(sweep, after=tuple(after)))
    return kept


def _block_has_code(lines: list[str], i: int) -> bool:
    """Whether the ``if`` (or comment) at ``lines[i]`` heads or sits in a block with code: a
    header needs a deeper line of code after it, a comment a line of code at its own depth."""
    depth = len(lines[i]) - len(lines[i].lstrip())
    header = not lines[i].lstrip().startswith("#")
    for line in lines[i + 1:]:
        level = len(line) - len(line.lstrip())
        if level < depth or (header and level == depth):
            return False
        if not line.lstrip().startswith("#"):
            return True
    return False


@dataclass(frozen=True)
class Operand:
    """A tensor the kernel loads or stores, and how it is addressed."""

    name: str
    rows: tuple[tuple[str, int], ...]   # (row coordinate, operand axis) for each leading axis it varies along
    col: int | None                     # its axis along the row, None when constant along the row
    cast: str                           # ".to(tl.float32)" on load, ".to(tl.float16)" on store, or ""
    other: str                          # a masked lane's value on load
    start: str | None = None            # looped kernels: its row's start, per tile (operands of [rows, N]) ...
    at: str | None = None               # ... and its chunk's addresses

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(axis for _, axis in self.rows) + (() if self.col is None else (self.col,))

    @property
    def mask(self) -> str:
        return {(True, True): "mask", (True, False): "row_mask", (False, True): "col_mask"}.get(
            (bool(self.rows), self.col is not None), "")

    def offsets(self, store: bool = False) -> str:
        terms = [f"{coord} * {self.name}_stride{axis}" for coord, axis in self.rows]
        if store and not self.rows:
            # an output with no leading axis to vary along has one row (row 0): `row` keeps
            # the pointer a [BLOCK_ROWS, 1] block, as the stored value is
            terms.append("row")
        if self.col is not None:
            terms.append(f"col * {self.name}_stride{self.col}")
        if self.rows and self.col is not None:
            # whole rows on chip, each starting at a multiple of ROW_VEC (the hint is on the
            # [rows, columns] offsets: on a row's start alone, Triton 3.6 failed to compile a
            # tile of one row, whose start it had made a scalar)
            return f"tl.multiple_of({' + '.join(terms)}, [1, ROW_VEC])"
        return " + ".join(terms)

    def load(self) -> str:
        offsets = self.offsets()
        if not offsets:
            return f"{self.name} = tl.load({self.name}_ptr){self.cast}"
        # an operand the same for every row (a weight, a bias: [N]) stays in L2 for the tiles to come
        # (on an H100, rmsnorm f16 at N = 1024: 7.37 -> 6.85 us)
        shared = ', eviction_policy="evict_last"' if self.col is not None and not self.rows else ""
        return (f"{self.name} = tl.load({self.name}_ptr + {offsets}, mask={self.mask}, other={self.other}{shared})"
                f"{self.cast}")

    def store(self) -> str:
        mask = "mask" if self.col is not None else "row_mask"
        return f"tl.store({self.name}_ptr + {self.offsets(store=True)}, {self.name}{self.cast}, mask={mask})"

    def row_offsets(self) -> str:
        return " + ".join(f"{coord} * {self.name}_stride{axis}" for coord, axis in self.rows)

    def chunk_address(self) -> tuple[str, ...]:
        """A looped kernel's chunk of this operand: from the row's start, lane by lane (lanes
        are columns, shifted under SHIFT to start on a 16-byte boundary, which the hint says)."""
        return (f"{self.at} = {self.name}_ptr + {self.start} + lane * {self.name}_stride{self.col}",
                "if SHIFT:",
                f"    {self.at} = tl.multiple_of({self.at}, [1, 16])")

    def chunk_load(self) -> tuple[str, ...]:
        if self.start is None:
            return (self.load(),)
        return (*self.chunk_address(),
                f"{self.name} = tl.load({self.at}, mask=window, other={self.other}){self.cast}")

    def chunk_store(self, mask: str) -> tuple[str, ...]:
        if self.start is None:
            return (self.store(),)
        return (*self.chunk_address(), f"tl.store({self.at}, {self.name}{self.cast}, mask={mask})")


@dataclass(frozen=True)
class ChunkLoop:
    """A loop over some of a tile's column chunks: the chunk's first lane, its lanes and
    masks, its body and stores (the sweep's loads before the body), and what runs once
    after the loop."""

    header: str
    columns: tuple[str, ...]
    lanes: tuple[str, ...]
    body: tuple[Line, ...]
    stores: tuple[str, ...]
    after: tuple[Line, ...] = ()


@dataclass(frozen=True)
class Sweep:
    """One pass of the looped kernel over a tile's column chunks."""

    before: tuple[Line, ...]    # per-row statements and accumulators, once per tile
    loaded: tuple[tuple[str, tuple[str, ...]], ...]     # (operand, its chunk load's lines), in the column loops
    body: tuple[Line, ...]
    stores: tuple[str, ...]     # whole vectors ...
    edge_stores: tuple[str, ...]    # ... and, in the chunks at the row's ends, the partial ones
    after: tuple[Line, ...]     # reductions' final values, per-row stores
    backward: bool = False      # chunks from the last to the first
    # the chunks inside the row, where they differ (a variance with its mean: Welford lanes):
    # their body (None: the body above), and what merges their lanes into the row's values
    whole_body: tuple[Line, ...] | None = None
    whole_after: tuple[Line, ...] = ()

    @property
    def loads(self) -> tuple[str, ...]:
        """The chunk loads' lines, operand after operand."""
        return tuple(line for _, lines in self.loaded for line in lines)

    @property
    def counted(self) -> bool:
        """The body (at the row's ends) reads chunk_cols, the chunk's columns in the row: it
        merges a variance with its mean chunk by chunk, where the whole chunks keep lanes."""
        return self.whole_body is not None

    @property
    def loops(self) -> tuple[ChunkLoop, ...]:
        """The chunks inside the row (pipelined), then those at its ends (one to three, not
        pipelined: on an H200 that was 2-30% faster than a pipeline of them, which costs even
        when empty); a backward sweep runs both in reverse, ends first, so that the forward
        sweep after it starts on what it read last, which L2 still holds."""
        if not (self.loads or self.body or self.stores):
            return ()
        inner = "for col0 in tl.range(whole_lo * BLOCK_N, whole_hi * BLOCK_N, BLOCK_N, num_stages=NUM_STAGES):"
        ends = "for end in tl.range(0, n_ends, num_stages=1):"
        stores = self.stores + self.edge_stores
        whole = self.body if self.whole_body is None else self.whole_body
        after = [*self.after, *self.whole_after]
        inner_lanes = read_lanes(self.lanes[0], [*self.loads, *whole, *self.stores, *after])
        end_lanes = read_lanes(self.lanes[1], [*self.loads, *self.body, *stores, *after])
        if not self.backward:
            return (ChunkLoop(inner, ("lane0 = col0",), inner_lanes, whole, self.stores, self.whole_after),
                    ChunkLoop(ends, ("# the chunks before whole_lo (chunk 0 under SHIFT), then those from whole_hi on",
                                     "lane0 = tl.where(end < whole_lo, end, whole_hi - whole_lo + end) * BLOCK_N"),
                          end_lanes, self.body, stores))
        return (ChunkLoop(ends, ("# backward, against the sweep beside it: the chunks one reads last the other "
                                 "reads first, from L2",
                                 "lane0 = tl.where(end >= n_ends - whole_lo, n_ends - 1 - end, n_chunks - 1 - end) "
                                 "* BLOCK_N"), end_lanes, self.body, stores),
                ChunkLoop(inner, ("lane0 = (whole_lo + whole_hi - 1) * BLOCK_N - col0",), inner_lanes, whole,
                          self.stores, self.whole_after))

    @property
    def code(self) -> list:
        """Every line the looped kernel prints for this sweep (strings and Lines)."""
        return [*self.before, *(c for part in self.loops for c in (part.header, *part.columns, *part.lanes, *self.loads,
                                                                    *part.body, *part.stores, *part.after)),
                *self.after]

    @property
    def lanes(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The lane lines of the chunks inside the row and of those at its ends."""
        return INNER_LANES, END_LANES + (END_COUNT if self.counted else ())

    @property
    def single(self) -> ChunkLoop:
        """One chunk of a row never shifted, which may hold its end (the split kernel's)."""
        stores = self.stores + self.edge_stores
        return ChunkLoop("", (), read_lanes(SPLIT_LANES, [*self.loads, *self.body, *stores, *self.after]), self.body,
                         stores)

    def unshifted(self) -> Sweep:
        """This sweep where rows are never shifted: no ``if SHIFT:`` blocks, no stores at a
        shifted row's ends."""
        return replace(self, loaded=tuple((name, _unshifted(lines)) for name, lines in self.loaded),
                       stores=_unshifted(self.stores), edge_stores=())


@dataclass(frozen=True)
class Exchange:
    """A level of reductions as the split kernel exchanges it between the programs of a row."""

    chunk_finals: tuple[Line, ...]      # plain reductions' finals: a chunk's partials, as published
    published: tuple[tuple[str, str, str], ...]   # (value, its peers' vector, identity) per exchanged value
    combine: tuple[Line, ...]           # the peers' vectors -> the reductions' row values


class Centered(NamedTuple):
    """The code of a mean and its variances in one sweep (see _Planner.centered)."""

    init: tuple[str, ...]           # per tile, before the sweep
    update: tuple[str, ...]         # a chunk at the row's ends, merged into the row's values
    lane_update: tuple[str, ...]    # a chunk inside the row, lane by lane
    fold: tuple[str, ...]           # after the chunks inside the row: their lanes merged
    final: tuple[str, ...]          # after the sweep


@dataclass(frozen=True)
class Split:
    """The split-row kernel: one chunk of BLOCK_N columns per program, SPLIT programs to a
    row; the single level of reductions is computed per chunk, exchanged, combined."""

    reduce: Sweep                       # the level's sweep, for one chunk: partials in the reductions' names
    published: tuple[tuple[str, str, str], ...]   # (value, its peers' vector, identity) per exchanged value
    combine: tuple[Line, ...]           # the peers' vectors -> the reductions' row values
    output: Sweep                       # the outputs' sweep, for one chunk; per-row stores by part 0
    starts: tuple[str, ...]             # where the row starts in each [rows, N] operand ...
    peer_starts: tuple[str, ...]        # ... and in those a peer's partials read

    @property
    def values(self) -> str:
        """The published values, as a peer's partials computed in its place return them."""
        return ", ".join(name for name, _, _ in self.published)


@dataclass(frozen=True)
class RowReducePlan:
    name: str
    host: Host
    helpers: tuple[str, ...]
    pointers: tuple[str, ...]           # input pointers, scalars, output pointers
    pointer_values: tuple[str, ...]     # ... and what the host passes for them
    sizes: tuple[str, ...]              # kernel size arguments: n_rows, n_cols, size1, ...
    size_values: tuple[str, ...]        # ... and their host expressions
    strides: tuple[str, ...]            # kernel stride arguments
    stride_values: tuple[str, ...]      # ... and their host expressions
    tensors: tuple[str, ...]            # every tensor operand, for the int64 test
    rows: str                           # host expressions: the number of rows ...
    cols: str                           # ... and their length
    coordinates: tuple[str, ...]        # row -> idx0, idx1, ... (rank > 2)
    body: tuple[Line, ...]              # rows on chip: loads and statements
    stores: tuple[str, ...]
    looped_hoisted: tuple[str, ...]     # looped: before the row loop (the chunks, uniform loads)
    looped_tile_loads: tuple[str, ...]  # ... per tile (per-row operands)
    row_starts: tuple[str, ...]         # ... per tile: where the row starts in each [rows, N] operand
    shifted: tuple[str, ...]            # those operands (the host's SHIFT test reads them) ...
    vec: int                            # ... and the elements of a 16-byte vector of the narrowest one
    uniform_loads: tuple[str, ...]      # split: before the row loop
    sweeps: tuple[Sweep, ...]
    split: Split | None                 # None: the spec's rows do not split (several levels, f16 rows)
    tiling: Tiling
    pattern: str = "row_reduce"

    @property
    def _peer_reduce(self) -> list:
        """The split kernel's chunk reduction, as its peer helper prints it."""
        reduce = self.split.reduce
        return [*reduce.before, *reduce.single.columns, *reduce.single.lanes, *reduce.loads, *reduce.single.body,
                *reduce.single.stores, *reduce.after]

    @property
    def peer_tile_loads(self) -> tuple[str, ...]:
        """The per-tile loads that the chunk's reduction reads (a per-row operand that only the
        outputs read is not loaded in the split kernel's peer helper)."""
        code = _code(self._peer_reduce)
        return tuple(line for line in self.looped_tile_loads if _reads(code, _ASSIGNS.match(line).group(1)))

    @property
    def peer_parameters(self) -> tuple[str, ...]:
        """The pointers, sizes and strides that the split kernel's peer helper reads: the operands
        of the chunk's reduction (none of the outputs)."""
        code = _code([*self.uniform_loads, *self.coordinates, *self.peer_tile_loads, *self.split.peer_starts,
                      *self._peer_reduce])
        return tuple(p for p in (*self.pointers, *self.sizes, *self.strides) if p == "n_rows" or _reads(code, p))

    @property
    def tile_sizes(self) -> tuple[str, ...]:
        """The sizes the on-chip tile reads: n_rows, and each other one its code names (a mean's n_cols)."""
        code = "\n".join([*self.coordinates, *(c for line in self.body for c in line.code), *self.stores])
        return tuple(s for s in self.sizes if s == "n_rows" or re.search(rf"\b{s}\b", code))
    template: str = "row_reduce.jinja"

    @property
    def row_vec(self) -> str:
        """The host's ROW_VEC, from the row length and the strides of the operands of [rows, N]."""
        return f"_row_vec({', '.join(('n_cols',) + self.shifted)})"

    @property
    def shift_when(self) -> str:
        """The host's widths to shift rows at: too wide to hold, or past ``shift_from`` columns where
        they would not move in whole vectors on chip."""
        wide = f"BLOCK_N > {self.tiling.max_block}"
        if self.tiling.shift_from < self.tiling.max_block:
            fill = ""
            if self.tiling.shift_fill:
                part, whole = self.tiling.shift_fill
                fill = f" and {whole} * n_cols <= {part} * BLOCK_N"
            odd = ""
            if self.tiling.odd is not None:
                start, end = self.tiling.odd
                upto = f" and n_cols <= {end}" if end < self.tiling.shift_from else ""
                odd = f" or BLOCK_N > {start} and ROW_VEC == 1{upto}"
            return f"({wide} or BLOCK_N > {self.tiling.shift_from} and ROW_VEC < {self.vec}{fill}{odd})"
        return wide

    @property
    def shift(self) -> tuple[str, ...]:
        """The host's SHIFT: the widths, then the operands' test (two lines where the widths
        test the block's fill or odd widths too, which makes them long)."""
        if self.tiling.shift_fill is None and self.tiling.odd is None:
            return (f"SHIFT = {self.shift_when} and {self.shift_test}",)
        return (f"SHIFT = {self.shift_when}", f"SHIFT = SHIFT and {self.shift_test}")

    @property
    def tile_loop(self) -> str:
        """The host's TILE_LOOP, on chip."""
        t = self.tiling
        return f"BLOCK_N > {t.straight} and (ROW_VEC >= {self.vec} or BLOCK_N > {t.unaligned_straight})"

    @property
    def unaligned(self) -> tuple[str, ...]:
        """Host lines after NUM_WARPS on chip, for rows not in whole vectors."""
        if not self.tiling.unaligned_warps:
            return ()
        return (f"if ROW_VEC < {self.vec} and BLOCK_N > {UNALIGNED_FROM}:",
                f"    NUM_WARPS = {self.tiling.unaligned_warps}  # narrower loads: more of them in flight")

    @property
    def shift_test(self) -> str:
        """The host's SHIFT test, on the operands of [rows, N] (none: rows of one operand only;
        nor where a chunk is narrower than a vector, as its chunks would not start on one)."""
        if not self.shifted or self.tiling.chunk < self.vec:
            return "False"
        return f"_shift_rows({self.vec}, n_cols, {', '.join(self.shifted)})"


def match(kir: KernelIR):
    nodes = topo_order(o.node for o in kir.outputs)
    if (not any(n.op in REDUCTIONS for n in nodes) or any(n.op is Op.MATMUL for n in nodes)
            or any(p.is_list for p in kir.params)):
        return None
    kir = _drop_unit_reductions(kir)
    nodes = topo_order(o.node for o in kir.outputs)
    reductions = [n for n in nodes if n.op in REDUCTIONS]
    if not reductions:
        return elementwise.match(kir)
    check_locals(kir, _LOCALS, "row reduction", dims=_HOST_LOCALS)
    for r in reductions:
        x = r.inputs[0]
        if r.arg != len(x.shape) - 1:
            raise UnsupportedError(f"{r.op.value} over axis {r.arg} of {type_str(x.dtype, x.shape)}: only reductions "
                                   f"over the last axis (axis=-1) are supported; pass a transposed view instead",
                                   r.span)
    lead, width = _row_space(kir, nodes, reductions)
    return _Planner(kir, nodes, reductions, lead, width).plan()


def _drop_unit_reductions(kir: KernelIR) -> KernelIR:
    """A reduction over an axis of size 1 is its input (a headerless call specializes
    size-1 axes to 1), a float sum or mean its input plus 0 (torch's sum of -0.0 is +0.0):
    rebuild the graph without them."""
    new: dict[int, Node] = {}

    def get(n: Node) -> Node:
        return new.get(id(n), n)

    roots = [s.node for s in kir.stmts] + [o.node for o in kir.outputs]
    for n in topo_order(roots):
        if n.op in REDUCTIONS and n.inputs[0].shape[n.arg] == 1:
            x = get(n.inputs[0])
            new[id(n)] = Node(Op.ADD, n.dtype, x.shape, (x, Node(Op.CONST, D.F32, (), (), 0.0)), None, n.span) \
                if n.op in (Op.SUM, Op.MEAN) and n.dtype.is_float else x
        elif any(id(i) in new for i in n.inputs):
            new[id(n)] = Node(n.op, n.dtype, n.shape, tuple(get(i) for i in n.inputs), n.arg, n.span)
    if not new:
        return kir
    return replace(kir, stmts=tuple(replace(s, node=get(s.node)) for s in kir.stmts),
                   outputs=tuple(replace(o, node=get(o.node)) for o in kir.outputs))


def _row_space(kir: KernelIR, nodes: list[Node], reductions: list[Node]) -> tuple[Shape, Dim]:
    """(leading dims, row length N): every value must fit [leading..., N] by broadcasting,
    and every output must be [leading..., N] or [leading..., 1]."""
    width = reductions[0].inputs[0].shape[-1]
    for r in reductions[1:]:
        if r.inputs[0].shape[-1] != width:
            raise UnsupportedError(f"this reduces rows of length {r.inputs[0].shape[-1]}, another reduction rows of "
                                   f"length {width}: one kernel reduces rows of one length", r.span)
    rank = max(len(n.shape) for n in nodes)
    lead: list[Dim] = [1] * (rank - 1)
    for n in nodes:
        if not n.shape:
            continue
        if n.shape[-1] not in (1, width):
            raise UnsupportedError(f"this value is {type_str(n.dtype, n.shape)}, but the rows being reduced have "
                                   f"{width} columns", n.span)
        padded = (1,) * (rank - len(n.shape)) + tuple(n.shape)
        for axis, d in enumerate(padded[:-1]):
            if d != 1 and lead[axis] == 1:
                lead[axis] = d
            elif d != 1 and d != lead[axis]:
                raise UnsupportedError(f"this value is {type_str(n.dtype, n.shape)}, but the rows being reduced are "
                                       f"indexed by [{', '.join(map(str, lead))}]", n.span)
    for o in kir.outputs:
        shape = tuple(o.node.shape)
        if len(shape) != rank or list(shape[:-1]) != lead:
            rows = ", ".join(map(str, lead))
            raise UnsupportedError(f"output '{o.name}' is {type_str(o.node.dtype, shape)}: the outputs of a row "
                                   f"reduction are [{rows}{', ' if rows else ''}{width}] or "
                                   f"[{rows}{', ' if rows else ''}1]", o.span)
    return tuple(lead), width


def _same(a: Node, b: Node) -> bool:
    """The same value: one node, or the same op on the same operands."""
    if a is b:
        return True
    return (a.op is b.op and a.arg == b.arg and a.dtype is b.dtype and a.shape == b.shape
            and a.op not in (Op.INPUT, Op.SCALAR) and len(a.inputs) == len(b.inputs)
            and all(_same(x, y) for x, y in zip(a.inputs, b.inputs)))


def online_partner(r: Node) -> Node | None:
    """For ``sum(exp(a - m))`` or ``mean(...)`` with ``m = max(a)``: ``m``.  Such a sum can
    run in the same sweep as its max (online softmax)."""
    if r.op not in (Op.SUM, Op.MEAN) or r.inputs[0].op is not Op.EXP:
        return None
    shifted = r.inputs[0].inputs[0]
    if shifted.op is not Op.SUB:
        return None
    a, m = shifted.inputs
    if m.op is Op.MAX and a.dtype.is_float and _same(m.inputs[0], a):
        return m
    return None


def centered_partner(r: Node) -> Node | None:
    """For ``mean(d * d)`` or ``sum(d ** 2)`` with ``d = a - m`` and ``m = mean(a)`` (a
    variance): ``m``.  Such a sum can run in the same sweep as its mean (see
    _Planner.centered)."""
    if r.op not in (Op.SUM, Op.MEAN) or not r.dtype.is_float:
        return None
    sq = r.inputs[0]
    if sq.op is Op.MUL and _same(*sq.inputs):
        d = sq.inputs[0]
    elif sq.op is Op.POW and sq.inputs[1].op is Op.CONST and sq.inputs[1].arg == 2:
        d = sq.inputs[0]
    else:
        return None
    if d.op is not Op.SUB:
        return None
    a, m = d.inputs
    if m.op is Op.MEAN and a.dtype.is_float and _same(m.inputs[0], a):
        return m
    return None


def partner(r: Node) -> Node | None:
    """The reduction whose sweep ``r`` shares: a softmax's max, a variance's mean."""
    return online_partner(r) or centered_partner(r)


class _Planner:
    def __init__(self, kir: KernelIR, nodes: list[Node], reductions: list[Node], lead: Shape, width: Dim):
        self.kir, self.nodes, self.reductions = kir, nodes, reductions
        self.lead, self.width = lead, width
        self.stmt_of: dict[int, str] = {}
        for s in kir.stmts:
            self.stmt_of.setdefault(id(s.node), s.name)
        self.source_of = {s.name: s.source for s in kir.stmts}
        self.taken = set(_LOCALS) | set(HELPERS) | {p.name for p in kir.params} | {s.name for s in kir.stmts}
        self.taken |= {f"idx{a}" for a in range(len(lead))} | {f"size{a}" for a in range(len(lead))}
        self.computed = {s.name: s.node for s in kir.stmts}

    # --- names --------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}{k}", k + 1
        self.taken.add(name)
        return name

    def coordinate(self, axis: int) -> str:
        return "row" if len(self.lead) == 1 else f"idx{axis}"

    def varies(self, n: Node) -> bool:
        """Varies along the row (as opposed to one value per row, or per kernel)."""
        return bool(n.shape) and n.shape[-1] == self.width

    # --- the plan -------------------------------------------------------------------
    def plan(self) -> RowReducePlan:
        kir = self.kir
        used = {id(n) for n in self.nodes}
        inputs = [self.operand(p.name, p.shape, _load_cast(p.dtype), "0.0" if p.dtype.is_float else "0")
                  for p in kir.params if not p.is_scalar and id(kir.nodes[p.name]) in used]
        scalars = [p.name for p in kir.params if p.is_scalar and id(kir.nodes[p.name]) in used]
        outputs = [self.operand(o.name, o.node.shape, store_cast(self.computed[o.name].dtype, o.node.dtype), "")
                   for o in kir.outputs]
        names = {id(kir.nodes[p.name]): p.name for p in kir.params if id(kir.nodes[p.name]) in used}
        for r in self.reductions:
            names[id(r)] = self.stmt_of.get(id(r)) or self.fresh(self.reduction_name(r))
        operands = inputs + outputs
        dtypes = {p.name: p.dtype for p in kir.params} | {o.name: o.node.dtype for o in kir.outputs}
        lead_sizes = [f"size{a}" for a in range(1, len(self.lead))]
        nodes_of = {o.name: kir.nodes[o.name] for o in inputs}
        row_loaded = [o for o in inputs if o.rows and o.col is None]
        uniform = [o for o in inputs if not o.rows and o.col is None]
        body = self.on_chip_body(dict(names), {id(nodes_of[o.name]): o.load() for o in inputs})
        sweeps, exchanges = self.sweeps(dict(names), {id(nodes_of[o.name]): o for o in inputs if o.col is not None},
                                        outputs)
        split = self.split(sweeps, exchanges, [o for o in operands if o.start])
        helpers = list(helpers_for(self.nodes))
        if any(r.op is Op.MAX and r.dtype.is_float for r in self.reductions):
            helpers.append("max_combine")
        if any(r.op is Op.MIN and r.dtype.is_float for r in self.reductions):
            helpers.append("min_combine")
        helpers += ["vec", "num_sms", "launch_rows"] + (["launch_split"] if split else [])
        vec = 16 // min([dtypes[o.name].bytes for o in operands if o.start], default=16)
        return RowReducePlan(
            name=kir.name, host=host(kir), helpers=tuple(helpers),
            pointers=tuple(f"{o.name}_ptr" for o in inputs) + tuple(scalars) + tuple(f"{o.name}_ptr" for o in outputs),
            pointer_values=tuple(o.name for o in inputs) + tuple(scalars) + tuple(o.name for o in outputs),
            sizes=("n_rows", "n_cols", *lead_sizes),
            size_values=("n_rows", "n_cols", *(str(self.lead[a]) for a in range(1, len(self.lead)))),
            strides=tuple(f"{o.name}_stride{axis}" for o in operands for axis in o.strides),
            stride_values=tuple(f"{o.name}.stride({axis})" for o in operands for axis in o.strides),
            tensors=tuple(o.name for o in operands),
            rows=" * ".join(str(d) for d in self.lead) or "1", cols=str(self.width),
            # a 2-D operand's row coordinate is `row` itself
            coordinates=elementwise.coordinates(len(self.lead), "row") if len(self.lead) > 1 else (),
            body=tuple(body),
            stores=tuple(o.store() for o in outputs),
            looped_hoisted=("n_lanes = n_cols",
                            "if SHIFT:",
                            "    n_lanes = n_cols + VEC - 1  # lanes start up to VEC - 1 columns before the row",
                            "n_chunks = (n_lanes + BLOCK_N - 1) // BLOCK_N",
                            "# chunks whole_lo to whole_hi - 1 lie inside the row (chunk 0 does, unless shifted)",
                            "whole_lo = 1 if SHIFT else 0",
                            "whole_hi = tl.maximum(n_cols // BLOCK_N, whole_lo)",
                            "n_ends = whole_lo + n_chunks - whole_hi  # the others hold the row's ends",
                            *(o.load() for o in uniform)),
            looped_tile_loads=tuple(o.load() for o in row_loaded),
            row_starts=read_lanes(_row_starts([o for o in operands if o.start]), [c for s in sweeps for c in s.code]),
            shifted=tuple(o.name for o in operands if o.start),
            vec=vec,
            uniform_loads=tuple(o.load() for o in uniform),
            sweeps=tuple(sweeps),
            split=split,
            tiling=tiling(kir, vec, lanes=any(s.counted for s in sweeps),
                          sums=all(r.op in (Op.SUM, Op.MEAN) for r in self.reductions)),
        )

    def operand(self, name: str, shape: Shape, cast: str, other: str) -> Operand:
        offset = len(self.lead) + 1 - len(shape)
        rows = tuple((self.coordinate(offset + axis), axis) for axis, d in enumerate(shape[:-1]) if d != 1)
        col = len(shape) - 1 if shape and shape[-1] == self.width else None
        if rows and col is not None:
            return Operand(name, rows, col, cast, other, self.fresh(f"{name}_row"), self.fresh(f"{name}_at"))
        return Operand(name, rows, col, cast, other)

    def reduction_name(self, r: Node) -> str:
        x = r.inputs[0]
        named = self.stmt_of.get(id(x)) or (x.arg if x.op is Op.INPUT else None)
        return f"{r.op.value}_{named}" if named else f"row_{r.op.value}"

    def comment(self, r: Node) -> str:
        name = self.stmt_of.get(id(r))
        return self.source_of[name] if name else _source(self.kir.text, r.span)

    # --- rows on chip ---------------------------------------------------------------
    def on_chip_body(self, names: dict[int, str], loads: dict[int, str]) -> list[Line]:
        """Statements in spec order, each reduction computed just before its first use and
        each operand loaded under the first statement that reads it: a weight used after
        the reductions is not held in registers through them."""
        pending = dict(loads)
        lines: list[Line] = []
        for r in self.reductions:
            lines += self.statements([r.inputs[0]], names, pending)
            wanted = _take(pending, [r.inputs[0]], names)
            x = Printer(names).expr(r.inputs[0])[0]
            lines += _loaded(wanted, [Line(self.comment(r), (f"{names[id(r)]} = {_reduce(r, x)}",))])
        lines += self.statements([self.computed[o.name] for o in self.kir.outputs], names, pending)
        return lines

    def statements(self, roots, names: dict[int, str], pending: dict[int, str]) -> list[Line]:
        """The statements ``roots`` need, in spec order, with the loads in ``pending`` that
        each one reads first."""
        needed = {id(n) for n in live_nodes(roots, names)}
        lines: list[Line] = []
        for stmt in self.kir.stmts:
            if id(stmt.node) in needed:
                wanted = _take(pending, [stmt.node], names)
                lines += _loaded(wanted, statement_lines(self.kir, [stmt.node], names))
        return lines

    # --- looped -----------------------------------------------------------------------
    def levels(self) -> dict[int, int]:
        """Sweep of each reduction: 1 + the deepest reduction it needs; an online sum
        shares its max's sweep, a variance its mean's."""
        level: dict[int, int] = {}
        for n in self.nodes:
            base = max((level[id(i)] for i in n.inputs), default=0)
            shared = partner(n)
            level[id(n)] = level[id(shared)] if shared is not None else base + (n.op in REDUCTIONS)
        return level

    def sweeps(self, names: dict[int, str], chunked: dict[int, Operand],
               outputs: list[Operand]) -> tuple[list[Sweep], list[Exchange]]:
        """One sweep per level of reductions, then one for the outputs; ``names`` holds
        what every sweep can read (per-row values), each loop adds its own locals."""
        level = self.levels()
        sweeps, exchanges = [], []
        for k in sorted({level[id(r)] for r in self.reductions}):
            group = [r for r in self.reductions if level[id(r)] == k]
            online = {id(r): m for r in group if (m := online_partner(r)) is not None}
            maxes = [m for m in group if any(p is m for p in online.values())]
            centered = {id(r): m for r in group if (m := centered_partner(r)) is not None}
            means = [m for m in group if any(p is m for p in centered.values())]
            shared = [*maxes, *means]
            roots = [r.inputs[0] for r in group if id(r) not in online and id(r) not in centered and r not in shared]
            roots += [m.inputs[0] for m in shared]
            before = self.per_row_lines(roots, names)
            loaded = self.loaded(roots, names, chunked)
            inner = dict(names)
            body = statement_lines(self.kir, roots, inner)
            printer = Printer(inner)
            after: list[Line] = []
            # the split kernel's exchange: each value a chunk publishes, and how peers' combine
            chunk_finals: list[Line] = []
            published: list[tuple[str, str, str]] = []
            combine: list[Line] = []
            for r in group:
                if id(r) in online or id(r) in centered or r in shared:
                    continue
                name = names[id(r)]
                init, update, total = self.accumulate(r, name, printer.expr(r.inputs[0])[0])
                partials = "partial sums" if r.op in (Op.SUM, Op.MEAN) else f"partial {r.op.value}ima"
                before.append(Line(f"{self.comment(r)}: {partials} per lane, a chunk at a time", (init,)))
                body.append(Line(self.comment(r), (update,)))
                final = _mean(total) if r.op is Op.MEAN else total
                after.append(Line(f"{self.comment(r)}: the lanes' {partials} combined", (f"{name} = {final}",)))
                # a split row's chunk publishes its sum (a mean divides once, by the row's length)
                chunk_finals.append(Line(after[-1].comment, (f"{name} = {total}",)))
                peers = self.fresh(f"{name}_peers")
                identity = {Op.MAX: NEG_INF, Op.MIN: POS_INF}.get(r.op, "0.0")
                published.append((name, peers, identity))
                combined = _reduce_peers(r, peers)
                combine.append(Line(f"{self.comment(r)}: the chunks' combined",
                                    (f"{name} = {_mean(combined) if r.op is Op.MEAN else combined}",)))
            for m in maxes:
                sums = [r for r in group if online.get(id(r)) is m]
                init, update, final = self.online(m, sums, names, printer.expr(m.inputs[0])[0])
                what = f"{self.comment(m)}; {'; '.join(self.comment(s) for s in sums)}"
                before.append(Line(f"{what} -- online, in one sweep", init))
                body.append(Line("the running max, and the sums rescaled to it (shifted by 0 while it is -inf)",
                                 update))
                if final:
                    after.append(Line(f"{what}: a row of -inf only sums to NaN, as torch's does", final))
                values = [(names[id(x)], self.fresh(f"{names[id(x)]}_peers")) for x in (m, *sums)]
                published += [(name, peers, NEG_INF if i == 0 else "0.0") for i, (name, peers) in enumerate(values)]
                combine.append(Line(f"{what}: the chunks' maxima, and their sums rescaled to the largest",
                                    self.online_peers(values) + final))
            whole_body, whole_after = list(body), []
            for m in means:
                squares = [r for r in group if centered.get(id(r)) is m]
                count = self.fresh(f"{names[id(m)]}_count")
                c = self.centered(m, squares, count, names, printer.expr(m.inputs[0])[0])
                what = f"{self.comment(m)}; {'; '.join(self.comment(s) for s in squares)}"
                before.append(Line(f"{what} -- in one sweep", c.init))
                body.append(Line("the chunk's sum, and its squared deviations from its own mean, merged into the "
                                 "row's", c.update))
                whole_body.append(Line("Welford lane by lane: each lane's sum, and its squared deviations from its "
                                       "running mean", c.lane_update))
                whole_after.append(Line("the lanes merged into the row's: their sums, and their squared deviations "
                                        "within and between lanes", c.fold))
                after.append(Line(what, c.final))
            sweeps.append(Sweep(tuple(before), loaded, tuple(body), (), (), tuple(after),
                                whole_body=tuple(whole_body) if means else None, whole_after=tuple(whole_after)))
            exchanges.append(Exchange(tuple(chunk_finals), tuple(published), tuple(combine)))
        row_out = [o for o in outputs if o.col is not None]
        per_row_out = [o for o in outputs if o.col is None]
        roots = [self.computed[o.name] for o in row_out]
        before = self.per_row_lines([self.computed[o.name] for o in per_row_out] + roots, names,
                                    also=[self.computed[o.name] for o in per_row_out])
        loaded = self.loaded(roots, names, chunked)
        body = statement_lines(self.kir, roots, dict(names)) if roots else []
        after = [Line(f"store {o.name}: one value per row", (o.store(),)) for o in per_row_out]
        sweeps.append(Sweep(tuple(before), loaded, tuple(body), *_chunk_stores(row_out), tuple(after)))
        # Directions alternate, back from the outputs' sweep: forward where it reads operands
        # that no sweep before it did (layernorm's W and B, rmsnorm's W; backward, shifted f16
        # rows ran 5-28% slower on an H200), else backward (softmax f16 at N = 65536: 2% faster).
        # (A lone looping sweep, as a row's sums alone take, runs forward.)
        looping = [i for i, s in enumerate(sweeps) if s.loops]
        earlier = {line for i in looping[:-1] for line in sweeps[i].loads}
        last_backward = len(looping) > 1 and set(sweeps[looping[-1]].loads) <= earlier
        for turn, i in enumerate(reversed(looping)):
            sweeps[i] = replace(sweeps[i], backward=(turn % 2 == 0) == last_backward)
        return _read_finals(sweeps), exchanges

    def split(self, sweeps: list[Sweep], exchanges: list[Exchange], operands: list[Operand]) -> Split | None:
        """The split-row kernel, for a spec whose reductions take one sweep (softmax,
        log-softmax, rmsnorm; not a variance with its mean, as layernorm's: split, f32 rows of
        32768 to 262144 ran 3-38% slower than looped on an H200, as did an exchange per level
        when the variance took a sweep of its own) over rows of 4-byte elements (f32:
        2250-2520 GB/s where the looped kernel reaches 1970-2160 on an H100; f16 rows gained
        5% at best, and lost with some chunk sizes).  Every reduction is over floats (the
        partials travel as f32)."""
        if len(sweeps) != 2 or row_bytes(self.kir) != 4 or not all(r.dtype.is_float for r in self.reductions) \
                or sweeps[0].counted:
            return None
        (exchange,) = exchanges
        output = replace(sweeps[1], backward=False)
        # per-row outputs (``total = sum(X)``): the group's programs hold the same values, one stores them
        stores = tuple(code for line in output.after for code in line.code)
        row_stores = (Line("per-row outputs: one program of the group stores them",
                           ("if part == 0:", *(f"    {code}" for code in stores))),) if stores else ()
        # the operands the chunk's reduction loaded stay in registers through the exchange: the
        # outputs' sweep loads only the others (rmsnorm's W)
        held = {name for name, _ in sweeps[0].loaded}
        output = replace(output, loaded=tuple((name, lines) for name, lines in output.loaded if name not in held),
                         after=row_stores)
        starts = {o.name: f"{o.start} = {o.row_offsets()}" for o in operands}
        return Split(replace(sweeps[0], after=exchange.chunk_finals, backward=False).unshifted(), exchange.published,
                     exchange.combine, output.unshifted(), tuple(starts.values()),
                     tuple(starts[name] for name, _ in sweeps[0].loaded if name in starts))

    def per_row_lines(self, roots, names: dict[int, str], also=()) -> list[Line]:
        """Statements of one value per row that ``roots`` need (and ``also``): computed once
        per tile, before the sweep's loop, and readable in every later sweep."""
        wanted = [n for n in live_nodes(roots, names)
                  if id(n) in self.stmt_of and not self.varies(n) and id(n) not in names]
        return statement_lines(self.kir, wanted + list(also), names)

    def loaded(self, roots, names: dict[int, str],
               chunked: dict[int, Operand]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(operand, its chunk load's lines) for each operand ``roots`` read along the row."""
        return tuple((chunked[id(n)].name, chunked[id(n)].chunk_load()) for n in live_nodes(roots, names)
                     if id(n) in chunked and n.op is Op.INPUT)

    def accumulate(self, r: Node, name: str, x: str) -> tuple[str, str, str]:
        """(init, update, total) of a reduction over chunks: lane-wise partials in a
        [BLOCK_ROWS, BLOCK_N] accumulator, reduced across lanes once after the loop (total:
        that reduction, a mean's sum not yet divided)."""
        acc = self.fresh(f"{name}_acc")
        dtype = r.dtype.compute.triton
        tile = "[BLOCK_ROWS, BLOCK_N]"
        if r.op in (Op.SUM, Op.MEAN):
            total = f"tl.sum({acc}, axis=1, keep_dims=True)"
            return f"{acc} = tl.zeros({tile}, {dtype})", f"{acc} = {acc} + tl.where(mask, {x}, 0.0)", total
        fn = "maximum" if r.op is Op.MAX else "minimum"
        if r.dtype.is_float:
            identity = NEG_INF if r.op is Op.MAX else POS_INF
            combine = f"tl.reduce({acc}, 1, {r.op.value}_combine, keep_dims=True)"
            update = f"tl.{fn}({acc}, tl.where(mask, {x}, {identity}), propagate_nan=tl.PropagateNan.ALL)"
        else:
            identity = I32_MIN if r.op is Op.MAX else I32_MAX
            combine = f"tl.{r.op.value}({acc}, axis=1, keep_dims=True)"
            update = f"tl.{fn}({acc}, tl.where(mask, {x}, {identity}))"
        return f"{acc} = tl.full({tile}, {identity}, {dtype})", f"{acc} = {update}", combine

    def online(self, m: Node, sums: list[Node], names: dict[int, str], a: str):
        """Online softmax: ``m`` is the running max of ``a``; each sum of ``exp(a - m)`` is
        kept relative to it and rescaled by ``exp(m_old - m_new)`` when it grows.  While
        ``m`` is still -inf the shift is 0, so exp never sees -inf - (-inf); a row that ends
        with ``m`` -inf (every entry -inf) gets the NaN sums that torch computes."""
        mn = names[id(m)]
        chunk, grown, shift = self.fresh(f"{mn}_chunk"), self.fresh(f"{mn}_new"), self.fresh(f"{mn}_shift")
        init = [f"{mn} = tl.full([BLOCK_ROWS, 1], {NEG_INF}, tl.float32)"]
        init += [f"{names[id(s)]} = tl.zeros([BLOCK_ROWS, 1], tl.float32)" for s in sums]
        update = [f"{chunk} = tl.reduce(tl.where(mask, {a}, {NEG_INF}), 1, max_combine, keep_dims=True)",
                  f"{grown} = tl.maximum({mn}, {chunk}, propagate_nan=tl.PropagateNan.ALL)",
                  f"{shift} = tl.where({grown} == {NEG_INF}, 0.0, {grown})"]
        update += [f"{names[id(s)]} = {names[id(s)]} * tl.exp({mn} - {shift}) + "
                   f"tl.sum(tl.where(mask, tl.exp({a} - {shift}), 0.0), axis=1, keep_dims=True)" for s in sums]
        update.append(f"{mn} = {grown}")
        # a row of -inf only: each exp(a - m) is exp(-inf - -inf), NaN as torch computes it
        final = [f"{names[id(s)]} = tl.where({mn} == {NEG_INF}, {NAN}, {names[id(s)]})" for s in sums]
        final += [f"{names[id(s)]} = {_mean(names[id(s)])}" for s in sums if s.op is Op.MEAN]
        return tuple(init), tuple(update), tuple(final)

    def centered(self, m: Node, squares: list[Node], count: str, names: dict[int, str], a: str) -> Centered:
        """One-pass mean and variance: the running sum of ``a`` over the ``count`` columns seen
        so far (``m`` is that sum over n_cols, as the mean in its own sweep would be: -inf
        where the row holds -inf), and for each of ``squares`` (``sum`` or ``mean`` of
        ``(a - m) ** 2``) the running sum of squared deviations from the running mean, so
        that large means do not cancel as in ``E[a^2] - E[a]^2``.

        The chunks inside the row keep both lane by lane, a running mean and squared
        deviations: each lane has seen as many whole chunks as the others, so Welford's update,
        ``dev = a - mean``, ``dev ** 2 * seen / (seen + 1)`` and ``mean + dev / (seen + 1)``, takes
        scalar weights per chunk and no reduction (a row of one value deviates by exactly 0,
        where ``a - sum / seen`` deviated by its rounding).  Once they are read, the
        lanes merge into the row's values; the chunks at the row's ends (partial, masked)
        merge one by one.  Each merge (Chan, Golub and LeVeque) adds the part's squared
        deviations from its own mean and ``step ** 2 * count * cols / (count + cols)`` for
        the step between its mean and the running one.  (Per-chunk merges in every chunk,
        two reductions each, ran 5-22% slower on an H200 at 32001 to 262144 columns.)"""
        mn = names[id(m)]
        total, chunk, chunk_mean, running, dev, step, weight, between, lanes, seen, x, whole, cols = (
            self.fresh(f"{mn}_{part}") for part in ("sum", "chunk_sum", "chunk_mean", "running", "dev", "step",
                                                     "weight", "between", "lanes", "seen", "x", "whole", "cols"))
        square_lanes = [self.fresh(f"{names[id(s)]}_lanes") for s in squares]
        init = [f"{total} = tl.zeros([BLOCK_ROWS, 1], tl.float32)", f"{count} = tl.zeros([BLOCK_ROWS, 1], tl.float32)"]
        init += [f"{names[id(s)]} = tl.zeros([BLOCK_ROWS, 1], tl.float32)" for s in squares]
        init += [f"{acc} = tl.zeros([BLOCK_ROWS, BLOCK_N], tl.float32)" for acc in (lanes, *square_lanes)]

        def merge(part_sum: str, part_cols: str, deviations: str, part_squares: list[str]) -> list[str]:
            """A part of the row (its sum, its columns, its deviations from its mean ``dev``,
            and its sum of squared deviations for each of ``squares``) merged into the row's."""
            return [f"{chunk_mean} = {_mean(part_sum, f'tl.maximum({part_cols}, 1.0)')}",
                    f"{dev} = {deviations}",
                    f"{running} = {_mean(total, f'tl.maximum({count}, 1.0)')}",
                    # (equal means step by 0: two at inf, where a row's sum overflowed, would give NaN)
                    f"{step} = tl.where({chunk_mean} == {running}, 0.0, {chunk_mean} - {running})",
                    f"{weight} = {count} * {part_cols} / tl.maximum({count} + {part_cols}, 1.0)",
                    # (none for the first part: a step past 1.8e19 squares to inf, and inf * 0 is NaN)
                    f"{between} = tl.where({weight} > 0, {step} * {step} * {weight}, 0.0)",
                    *(f"{names[id(s)]} = {names[id(s)]} + {part} + {between}"
                      for s, part in zip(squares, part_squares)),
                    f"{total} = {total} + {part_sum}", f"{count} = {count} + {part_cols}"]

        update = [f"{chunk} = tl.sum(tl.where(mask, {a}, 0.0), axis=1, keep_dims=True)",
                  *merge(chunk, "chunk_cols", f"tl.where(mask, {a} - {chunk_mean}, 0.0)",
                         [f"tl.sum({dev} * {dev}, axis=1, keep_dims=True)"] * len(squares))]
        lane_update = [f"{seen} = (col0 // BLOCK_N - whole_lo).to(tl.float32)  # whole chunks before this one",
                       f"{x} = tl.where(mask, {a}, 0.0)",
                       f"{dev} = {x} - {lanes}"]
        # (weighted before it is squared: in the first chunk, weight 0, a deviation past 1.8e19 gives
        # 0, not inf * 0 = NaN)
        lane_update += [f"{sq} = {sq} + {dev} * ({dev} * ({seen} / ({seen} + 1.0)))" for sq in square_lanes]
        # (a lane at ±inf stays there, as a sum would: inf + dev * w, dev = x - inf, would be NaN)
        lane_update.append(f"{lanes} = tl.where(tl.abs({lanes}) == {POS_INF}, {lanes} + {x}, "
                           f"{lanes} + {dev} * (1.0 / ({seen} + 1.0)))")
        fold = [f"{whole} = (whole_hi - whole_lo).to(tl.float32)  # the values each lane holds",
                f"{cols} = {whole} * BLOCK_N",
                f"{chunk} = tl.sum({lanes}, axis=1, keep_dims=True) * {whole}",
                *merge(chunk, cols, f"{lanes} - {chunk_mean}",
                       [f"tl.sum({sq} + {whole} * {dev} * {dev}, axis=1, keep_dims=True)" for sq in square_lanes])]
        final = [f"{mn} = {_mean(total)}"]
        final += [f"{names[id(s)]} = {_mean(names[id(s)])}" for s in squares if s.op is Op.MEAN]
        return Centered(tuple(init), tuple(update), tuple(lane_update), tuple(fold), tuple(final))

    def online_peers(self, values: list[tuple[str, str]]) -> tuple[str, ...]:
        """The split kernel's online combine: ``values`` are (name, peers' vector) of a max and
        its sums, each chunk's sums relative to its own max (0 for a padding peer, -inf max)."""
        (m, m_peers), sums = values[0], values[1:]
        shift = self.fresh(f"{m}_shift")
        lines = [f"{m} = tl.reduce({m_peers}, 1, max_combine, keep_dims=True)",
                 f"{shift} = tl.where({m} == {NEG_INF}, 0.0, {m})"]
        lines += [f"{s} = tl.sum({peers} * tl.exp({m_peers} - {shift}), axis=1, keep_dims=True)" for s, peers in sums]
        return tuple(lines)


def _row_starts(operands: list[Operand]) -> tuple[str, ...]:
    """The looped kernels' per-tile row starts.  Under SHIFT (the host's ``_shift_rows``:
    rows not 16-byte aligned, or not provably so, as with N = 50257) each start moves down
    to the 16-byte boundary at or below it, ``shift`` elements, the same in every operand;
    chunks then run over lanes from there, ``col = lane - shift``, so that Triton loads
    whole vectors (the lanes the row touches: ``window``) and stores them (the ones it
    fills: ``inner``), and the row's partial vectors at its two ends are stored lane by
    lane in the chunks that hold them."""
    if not operands:
        return ("shift = 0",)
    lines = [f"{o.start} = {o.row_offsets()}" for o in operands] + ["shift = 0", "if SHIFT:"]
    lines.append(f"    shift = {operands[0].start} % VEC")
    lines += [f"    {o.start} -= shift" for o in operands]
    lines += ["    # the lanes of the row's vectors, and of its whole ones",
              "    lane_end = (shift + n_cols + VEC - 1) // VEC * VEC",
              "    lane_lo = (shift + VEC - 1) // VEC * VEC",
              "    lane_hi = (shift + n_cols) // VEC * VEC"]
    return tuple(lines)


def _mean(total: str, count: str = "n_cols * 1.0") -> str:
    """``total / count`` rounded correctly, as torch divides (Triton's f32 ``/`` is within 2 ulp):
    a row of one value has exactly that mean, so it deviates by 0 (layernorm's rstd is
    1/sqrt(eps)).  Once a row: the division's cost does not show.  (``n_cols * 1.0``: an f32
    divisor, which ``tl.div_rn`` takes, whether n_cols is a tensor or specialized to 1.)"""
    return f"tl.div_rn({total}, {count})"


def _unshifted(lines: tuple[str, ...]) -> tuple[str, ...]:
    """``lines`` without their ``if SHIFT:`` blocks, for a kernel whose rows are never shifted."""
    kept, skip = [], None
    for line in lines:
        depth = len(line) - len(line.lstrip())
        if skip is not None and depth > skip:
            continue
        skip = depth if line.strip() == "if SHIFT:" else None
        if skip is None:
            kept.append(line)
    return tuple(kept)


def _chunk_stores(outputs: list[Operand]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A chunk's stores of the row outputs: whole vectors, and (under SHIFT, in the chunks
    at the row's ends, the only ones that print these) the partial ones lane by lane."""
    stores = tuple(line for o in outputs for line in o.chunk_store("inner"))
    ends = [f"tl.store({o.at}, {o.name}{o.cast}, mask=edges)" for o in outputs if o.start]
    if not ends:
        return stores, ()
    return stores, ("if SHIFT:", *(f"    {line}" for line in ends))


def _take(pending: dict[int, str], roots, names: dict[int, str]) -> list[str]:
    """The loads in ``pending`` that computing ``roots`` reads, taken out of it."""
    return [pending.pop(id(n)) for n in live_nodes(roots, names) if id(n) in pending]


def _loaded(loads: list[str], lines: list[Line]) -> list[Line]:
    """``lines`` with ``loads`` put under the first one's comment."""
    if not lines:
        return [Line("operands", tuple(loads))] if loads else []
    return [Line(lines[0].comment, (*loads, *lines[0].code)), *lines[1:]]


def _reduce(r: Node, x: str) -> str:
    """A whole-row reduction of ``x`` ([BLOCK_ROWS, BLOCK_N]) to [BLOCK_ROWS, 1]."""
    if r.op in (Op.SUM, Op.MEAN):
        total = f"tl.sum(tl.where(mask, {x}, 0.0), axis=1, keep_dims=True)"
        return _mean(total) if r.op is Op.MEAN else total
    if r.dtype.is_float:
        identity = NEG_INF if r.op is Op.MAX else POS_INF
        return f"tl.reduce(tl.where(mask, {x}, {identity}), 1, {r.op.value}_combine, keep_dims=True)"
    identity = I32_MIN if r.op is Op.MAX else I32_MAX
    return f"tl.{r.op.value}(tl.where(mask, {x}, {identity}), axis=1, keep_dims=True)"


def _reduce_peers(r: Node, peers: str) -> str:
    """The split kernel's combine of the chunks' partials of ``r`` ([BLOCK_ROWS, SPLIT_BLOCK],
    padding peers hold the identity; a mean's partials are sums, divided once after)."""
    if r.op in (Op.SUM, Op.MEAN):
        return f"tl.sum({peers}, axis=1, keep_dims=True)"
    return f"tl.reduce({peers}, 1, {r.op.value}_combine, keep_dims=True)"


def _load_cast(dtype) -> str:
    return f".to({dtype.compute.triton})" if dtype.compute is not dtype else ""
