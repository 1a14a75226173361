"""The row reductions' tiles, warps and launches: the thresholds, measured on GPUs, from which
the host of each row-reduction kernel picks its kernel (on chip, looped or split), BLOCK_N,
BLOCK_ROWS, the warps, the pipeline's stages and the programs per SM for each call
(``row_reduce`` plans the kernels; this module says how they run).  A spec's schedule
(``BLOCK_N``, ``BLOCK_ROWS``, ``num_warps``, ``num_stages``: one value each) and the
environment's ``KGEN_FORCE_CHUNK`` fix some of these choices.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import KgenError, SpecError
from ..ir import KernelIR

# Tuning, measured on an H200 (sweeps over tile rows, warps, stages and program counts:
# softmax in f16 and f32 at N = 256 ... 262144, layernorm and rmsnorm in f16 at N = 1024,
# 4096 and 8192; see README: Performance).
# widest row kept on chip, in columns whatever the element: registers hold each column as f32
# (32 a thread with 32 warps), so f32 rows fit as 16-bit ones do (on an H200, f32 at N = 32768:
# softmax 2515 -> 3630 GB/s, log-softmax 2620 -> 3620, layernorm 2600-2730 -> 3210-3280, rmsnorm
# 2670 -> 3710, against the looped or split kernels; N = 20000: 1.05-1.68x; shifted rows of
# 32001, which the looped kernel moves in whole vectors: 0.98x to 1.13x); wider rows loop (or split)
MAX_BLOCK_N = 32768
# ... but rows whose length or strides are not a multiple of a 16-byte vector (the host's ROW_VEC)
# load an element at a time on chip: 16-bit ones past SHIFTED_MAX_BLOCK_N columns, where the host
# can shift them, loop, shifted, in whole vectors (on an H200, f16 softmax at N = 20001, 30522 and
# 32001: 1420-1800 GB/s on chip, 2225-2425 looped; layernorm 970-1210 and 1645-1710; from 8193 to
# 16383 columns the four specs gained 8-140%, e.g. log-softmax at 8193 1070 -> 2290; on an H100,
# from 5003 to 8191 columns, against the on-chip kernel with 8 warps and no tile loop: layernorm
# 1060-1410 -> 1500-1630, softmax 1400-1630 -> 1780-1860 to 6001, 1830-2070 -> 1830-1930 above)
SHIFTED_MAX_BLOCK_N = 4096
# ... and f32 ones past it where the block on chip would be SHIFTED_F32_FILL full at most, or
# SHIFTED_F32_FILL_NORMS where a looped sweep keeps Welford lanes or a weight scales the row (on
# an H100, kernel time, the looped kernel a program a row against the on-chip one, M = 4096: at
# 4097, 5003 and 20001 columns (half to 61% of the block) softmax, log-softmax and rmsnorm -2% to
# +16%, layernorm +22-29%; at 6143, 12001 and 24001 (73-75%) layernorm +3-22%, the others -15% to
# +13%; at 8191 softmax 2890 GB/s on chip, 2310-2500 looped) ...
SHIFTED_F32_FILL = (2, 3)
SHIFTED_F32_FILL_NORMS = (3, 4)
# (... the weighted ones: f32 rmsnorm at 6001, 12001 and 24001 columns, 73-75% of the block,
# 2229 -> 2617, 2175 -> 2627 and 2064 -> 2471 GB/s, H100, 2026-11-27, its chunks as below)
# Those rows, a program each, run in at most HELD_WARPS warps: f32 chunks of 4096 columns in 16
# warps took 64 registers a thread and spilled (rmsnorm 10, softmax 6; H100, 2026-11-27, kernel
# time, M = 4096, from 9001 to 20001 columns: rmsnorm +12-41%, 1720 -> 2429 GB/s at 9001,
# softmax +6-12%, but log-softmax, with 2 spilled, -2-7%)
HELD_WARPS = 8
TILE_BYTES = 4096           # narrow rows: BLOCK_ROWS = TILE_BYTES // (BLOCK_N * widest row element)
# (BLOCK_N up to, num_warps), on chip; the last row that applies stops at the widest row kept
WARPS = ((256, 8), (1024, 2), (8192, 4), (16384, 16), (None, 32))
STAGES = "1 if BLOCK_N <= 1024 or BLOCK_N >= 16384 else 2"  # the tile loop's num_stages, on chip
# rows up to so many columns run straight-line code on chip, wider ones a tile loop that runs once
# (on an H100, f16 at M = 4096, straight against the loop: softmax at N = 256 and 1024 1.03x,
# layernorm and rmsnorm at 1024 1.02-1.06x; from 4096 to 16384 columns 0.95-1.01x) where the rows
# move in whole 16-byte vectors; rows loaded an element at a time run straight up to
# UNALIGNED_STRAIGHT_MAX_BLOCK_N columns (on an H100, f32 from 2047 to 8191 columns against the
# loop: layernorm 890-1410 -> 1950-2450 GB/s, rmsnorm 1330-1990 -> 2210-2480, softmax 1870-2490
# -> 2380-2880), and loop past it as the others do (f32 from 12001 to 30001: layernorm 1610-1830
# GB/s looped, 1060-1380 straight; rmsnorm 2-8% faster looped; softmax 10-20% slower) ...
STRAIGHT_MAX_BLOCK_N = 1024
UNALIGNED_STRAIGHT_MAX_BLOCK_N = 8192
# ... and, wider than UNALIGNED_FROM columns, with at least UNALIGNED_WARPS[0] warps, or [1] past
# UNALIGNED_WIDE, more loads in flight (on an H100, at 1001 columns 4 warps against 2: +0-10%
# but f32 log-softmax -1%; at 2047 8 against 4 lost up to 5%; from 5003 to 8191 columns 8
# against 4: softmax f16 1080-1440 -> 1400-2070 GB/s, f32 1940-2720 -> 2440-2880, layernorm f32
# 1820-2380 -> 2010-2490; at 3001 +2-12%, but layernorm 2-5% slower)
UNALIGNED_FROM = 512
UNALIGNED_WIDE = 2048
UNALIGNED_WARPS = (4, 8)
# 16 warps on chip leave 64 registers a thread to two programs an SM (a program alone waits on
# each reduction with nothing to overlap); where the compiled kernel takes more, it runs with
# NARROWER warps capped at so many registers, two programs an SM again (on an H200, f16 at 10240
# to 16384 columns, layernorm takes 74-84 registers: 1790-2440 -> 2760-3710 GB/s, 1.52-1.58x;
# f32 layernorm and rmsnorm 1.05-1.27x; softmax within 64 registers would lose up to 19% so)
NARROWER = (16, 8, 128)     # (num_warps asked, num_warps instead, maxnreg)
CHUNK_N = 8192              # columns per chunk of the looped kernel, with 16 warps ...
LOOPED_WARPS = 16
# ... on rows of WIDE_ROW columns or more; narrower ones take chunks of NARROW_CHUNK_N with
# 32 bytes of the row a thread (8 warps for 16-bit rows, 16 for f32), more programs to an SM
# and less of the last chunk idle (on an H200, softmax f16 at N = 50176: 2250 -> 2570 GB/s,
# f32 at 32001: 2210 -> 2510, layernorm f16 at 65537: 1260 -> 1450 with the cap below;
# f16 rows of 65536 and wider were level or faster with CHUNK_N; on an H100 shifted f16
# rows gained 3-37% but f32 softmax rows lost 3-9% against the kernel that masked every chunk)
WIDE_ROW = 65536
NARROW_CHUNK_N = 4096
# ... and the shifted 16-bit rows of SHORT_ROW columns or fewer (those past SHIFTED_MAX_BLOCK_N)
# take chunks of SHORT_CHUNK_N, 32 bytes a thread, or LANES_SHORT_BYTES of the row with 4
# warps where a sweep keeps Welford lanes (on an H200, f16 from 8193 to 16383 columns: softmax,
# log-softmax and rmsnorm 1970-2610 GB/s with 2048 columns and 4 warps, 1440-2230 with 4096 and
# 8; layernorm 1710-1870 with 1024 and 4 warps, 1520-1780 with 2048, 1080-1480 with 4096 and 8)
SHORT_ROW = 16384
SHORT_CHUNK_N = 2048
# ... and those up to SHORTEST_ROW columns chunks of SHORTEST_CHUNK_N with 4 warps (on an H100,
# f16 softmax from 5003 to 8191 columns: 1780-1930 GB/s, 1580-1860 with 2048 columns)
SHORTEST_ROW = 8192
SHORTEST_CHUNK_N = 1024
LANES_SHORT_BYTES = 2048
# looped registers per thread, at most: 32 warps resident per SM whatever ptxas would take
# (shifted rows' edge code took 98-128; f16 softmax at N = 50257: 2220 -> 2390 GB/s, rmsnorm
# 1660 -> 1960; aligned rows within 2%)
LOOPED_MAXNREG = 64
# a sweep that keeps Welford lanes (layernorm's mean and variance: two f32 accumulators a
# column) takes chunks of LANES_CHUNK_N with LANES_WARPS, and LANES_NARROW_BYTES of the
# widest element under WIDE_ROW (on an H200, layernorm f32 at 32001 to 50257 columns, 4096
# columns and 8 or 16 warps: 1440-2650 GB/s, 2048 and 8: 1675-2713; f32 from 65536 columns
# and f16 from 50176, 4096 and 8 were the fastest or within 3% but at f16 128256 (2310,
# where 2048 columns reached 2535); f16 at 65536, 8192 columns and 16 warps: 2360 vs 2690)
LANES_CHUNK_N = 4096
LANES_WARPS = 8
LANES_NARROW_BYTES = 8192
LOOPED_STAGES = 4           # the column loops' num_stages, within ...
# ... this much shared memory (under an A100's 164 KB; an H100 has 227): each stage past the
# first buffers a chunk of every operand that varies along the row.  Where LOOPED_STAGES do
# not fit, the chunk halves (layernorm f32, X, W and B: 96 KB a stage at 8192 columns, where 4
# stages did not compile on an H100; at N = 65536, 4096 columns and 4 stages 1856 GB/s, 8192
# and 2 stages 1635)
LOOPED_SMEM = 160 * 1024
LOOPED_PER_SM = 8           # looped programs per SM: the fastest of 1, 2, 4 and 8 on wide softmax rows
# ... but shifted rows that would fit on chip (up to MAX_BLOCK_N columns: see SHIFTED_MAX_BLOCK_N
# and SHIFTED_F32_FILL) run a program a row, with no pipeline and no register cap (on an H100,
# f16 from 4097 to 30522 columns against 8 programs an SM, 4 stages and 64 registers: softmax
# +2-21%, log-softmax -2-+13%, layernorm -2-+9%, rmsnorm +2-19%; f16 at 50257 and f32 from 40001
# columns moved by -11% to +8%, rows in whole vectors (f16 at 50176) lost 3-15%)
HELD_SHIFTED_STAGES = 1
# Kernels whose reductions are plain sums (rmsnorm; not Welford lanes) sweep 16-bit rows in whole
# vectors from WIDE_ROW columns in longer chunks, in fewer warps, fewer programs an SM and no
# register cap (on an H100, kernel time, f16 rmsnorm from 65536 to 524288 columns, M = 64 to 4096:
# 1624-2252 -> 1782-2582 GB/s, +1-15%, e.g. 2236 -> 2484 at M = 1024, N = 65536; without a weight
# -1% to +8%; capped at 128 registers 4-10% slower at 100000 columns; the same launch lost softmax
# 2-7% and log-softmax up to 5%, layernorm in chunks of 8192 moved by -2% to +3%; shifted rows lost
# 3-25%; on an H200 rmsnorm -1% to +10%, without a weight -3% to +5%)
WIDE_SUMS = (16384, 8, 3, 2)   # (BLOCK_N, num_warps, num_stages, programs per SM)
# 16-bit rows of an odd width (ROW_VEC 1: an element at a time on chip) in kernels that only sum
# and scale by a weight along the row (an operand of [N]) loop, shifted, past ODD_FROM
# columns, ODD_ROWS rows a program in chunks of ODD_CHUNK_N columns with ODD_WARPS warps,
# LOOPED_PER_SM programs an SM (a program's rows reading the weight's cache lines together): up
# to ODD_LANES_TO columns where the sweeps keep Welford lanes (layernorm), up to ODD_SUMS_TO where they keep plain
# sums (rmsnorm).  On an H100, kernel time, M = 4096, against the rows on chip to 4096 columns and
# looped a program a row in chunks of 1024 past it: f16 layernorm at 2049, 2301, 3001, 4095, 4097,
# 5003 and 6001 columns +39%, +27%, +24%, +5%, +17%, +4% and +1%, e.g. 1206 -> 1495 GB/s at 3001,
# bf16 there +25%, at 7001 and 8191 -3%; f16 and bf16 rmsnorm +10-19% from 2049 to 3001, +2% at
# 3583, but up to -16% from 4001.  Without a weight (``X / sum(X * X)``, layernorm without W and B)
# they gained 12-13% at 2049 but lost 3-12% from 3001, softmax (its running max) 6% at 3001
ODD_FROM = 2048
ODD_LANES_TO = 6144
ODD_SUMS_TO = 3584
ODD_CHUNK_N = 256
ODD_ROWS = 2
ODD_WARPS = 4
# split rows (f32 rows wider than kept on chip, in chunks of CHUNK_N held through the exchange):
# 4 warps a program (on an H100, 2026-11-27, kernel time, f32 softmax, M = 1024, 4 warps and 4
# programs an SM, 128 registers a thread: 2636 GB/s at N = 65536, 2617 at 262144, M = 4096 and
# N = 40000 2567; 4096 columns in 4 warps, 8 an SM, 64 registers: 2511, 2377, 2292, spilling;
# the chunk read again from L2, as before, with 8 warps 2 an SM, 2277, 2238, 2169) ...
SPLIT_WARPS = "4"
SPLIT_WARPS_PER_SM = 16     # ... and programs per SM: 16 warps' worth (all resident: each waits for its group)
SCHEDULE_KEYS = ("BLOCK_N", "BLOCK_ROWS", "num_warps", "num_stages")
FORCE_CHUNK = "KGEN_FORCE_CHUNK"


@dataclass(frozen=True)
class Tiling:
    """Host expressions that choose the kernel and its tile per call."""

    max_block: int          # widest BLOCK_N kept on chip ...
    shift_from: int         # ... and widest where the rows could be shifted (they loop, shifted, past it) ...
    shift_fill: tuple[int, int] | None  # ... where the block on chip would be so full at most (None: however full)
    chunk: int              # BLOCK_N of the looped kernel
    split_chunk: int        # ... and of the split one (no pipeline: CHUNK_N whatever the operands)
    rows: str               # BLOCK_ROWS, rows on chip
    looped_rows: str        # BLOCK_ROWS, looped
    stages: str             # host expression of NUM_STAGES, on chip (the tile loop's)
    straight: int           # widest BLOCK_N whose on-chip tile runs straight-line code, in whole vectors ...
    unaligned_straight: int     # ... and not
    unaligned_warps: str    # host expression of NUM_WARPS for rows not in whole vectors, or "" (warps fixed)
    warps: str
    narrower: str           # host expression of launch_rows's narrower for the on-chip kernel, or ""
    looped: tuple[str, ...]     # host lines that set BLOCK_N, NUM_WARPS, PER_SM and the options, looped
    split_warps: str        # host expression of SPLIT
    split_warps_per_sm: int
    odd: tuple[int, int] | None = None  # 16-bit rows of an odd width shift past odd[0], to odd[1] (ODD_FROM)

    @property
    def on_chip(self) -> str:
        """The host's test for the on-chip kernel."""
        if self.shift_from < self.max_block:
            return f"BLOCK_N <= {self.max_block} and not SHIFT"
        return f"BLOCK_N <= {self.max_block}"

    @property
    def shift_note(self) -> tuple[str, ...]:
        """What the host's SHIFT comment adds for shifted rows that would fit on chip."""
        if self.shift_from >= self.max_block:
            return ()
        if self.shift_fill is None and self.odd is not None:
            start, end = self.odd
            upto = f" to {end}" if end < self.shift_from else ""
            return (f"(16-bit rows from {self.shift_from + 1} columns too, and of an odd width from "
                    f"{start + 1}{upto}, where on chip", "they would load an element at a time)")
        if self.shift_fill is None:
            return (f"(16-bit rows from {self.shift_from + 1} columns too, where on chip they would load an "
                    "element at a time)",)
        part, whole = self.shift_fill
        return (f"(rows from {self.shift_from + 1} columns too, where on chip they would load an element at a "
                "time", f"in a block at most {part}/{whole} full)")


def along_row(kir: KernelIR):
    """The dtypes of the inputs that vary along the row (``X``, ``W: [N]``), one per input."""
    return [p.dtype for p in kir.params if p.shape and p.shape[-1] != 1]


def weighted(kir: KernelIR) -> bool:
    """Whether an input is a weight along the row, the same for every row (``W: [N]``)."""
    return any(p.shape and p.shape[-1] != 1 and all(d == 1 for d in p.shape[:-1]) for p in kir.params)


def row_bytes(kir: KernelIR) -> int:
    """The widest element of a tensor that varies along the row (f32 rows: half the rows
    of f16 ones in a tile of TILE_BYTES)."""
    along = along_row(kir) + [o.node.dtype for o in kir.outputs if o.node.shape and o.node.shape[-1] != 1]
    return max((dtype.bytes for dtype in along), default=4)


def tiling(kir: KernelIR, vec: int, lanes: bool, sums: bool) -> Tiling:
    """The tiles and warps of each kernel; ``vec``: the elements of a 16-byte vector of the
    shifted rows; ``lanes``: a looped sweep keeps Welford lanes (see row_reduce._Planner.centered);
    ``sums``: every reduction is a sum or a mean."""
    values: dict[str, int] = {}
    for key, candidates in kir.schedule.items():
        if key not in SCHEDULE_KEYS:
            raise SpecError(f"row-reduction kernels take {', '.join(SCHEDULE_KEYS)} in their schedule, not '{key}'",
                            kir.schedule_span(key))
        if len(candidates) != 1:
            raise SpecError(f"{key}: a row-reduction kernel takes one value per schedule key (the host picks "
                            f"the tile per call from the row length), got {len(candidates)}", kir.schedule_span(key))
        v = candidates[0]
        if not isinstance(v, int) or v <= 0 or (key != "num_stages" and v & (v - 1)):
            raise SpecError(f"{key} must be a {'positive integer' if key == 'num_stages' else 'power of two'}, "
                            f"got {v}", kir.schedule_span(key, v))
        values[key] = v
    forced = os.environ.get(FORCE_CHUNK, "").strip()
    if forced:
        if not (forced.isascii() and forced.isdigit()) or len(forced) > 7 or not 0 < int(forced) <= 2**20 \
                or int(forced) & (int(forced) - 1):   # (7 digits: int() of thousands is refused)
            # (2**20 elements: Triton's largest tensor, as a schedule's BLOCK_N)
            shown = forced if len(forced) <= 20 else forced[:20] + "..."
            raise KgenError(f"{FORCE_CHUNK}={shown!r}: expected a power of two from 1 to 1048576 (the "
                            f"column chunk of row reductions)")
        values["BLOCK_N"] = int(forced)
    block = values.get("BLOCK_N")
    rows = values.get("BLOCK_ROWS")
    fit = "_next_pow2(n_rows)"
    warps = values.get("num_warps")
    widest = block or MAX_BLOCK_N
    if warps is None:
        # the first (BLOCK_N up to, num_warps) that BLOCK_N fits, the last up to the widest row:
        # next(w for n, w in ((256, 8), (1024, 2), (16384, 16)) if BLOCK_N <= n)
        steps = []
        for limit, w in WARPS:
            steps.append((widest if limit is None or limit >= widest else limit, w))
            if steps[-1][0] == widest:
                break
        text = f"next(w for n, w in {tuple(steps)} if BLOCK_N <= n)"
    else:
        text = str(warps)
    asked, instead, maxnreg = NARROWER
    narrower = ""
    if warps is None and any(w == asked for _, w in steps):
        narrower = f"({instead}, {maxnreg}) if NUM_WARPS == {asked} else None"
    stages = values.get("num_stages")
    # bytes of one column of every operand along the row: times the chunk, the pipeline's buffer per stage
    column_bytes = max(1, (rows or 1) * sum(dtype.bytes for dtype in along_row(kir)))
    chunk = block or CHUNK_N
    while block is None and stages is None and chunk > 1024 \
            and not _buffers_fit(LOOPED_STAGES, chunk, column_bytes):
        chunk //= 2
    looped_stages = stages or max(1, min(LOOPED_STAGES, 1 + LOOPED_SMEM // (chunk * column_bytes)))
    shift_from = min(widest, SHIFTED_MAX_BLOCK_N)
    weight = weighted(kir)
    fill = None if row_bytes(kir) < 4 else SHIFTED_F32_FILL_NORMS if lanes or weight else SHIFTED_F32_FILL
    odd_to = ODD_LANES_TO if lanes else ODD_SUMS_TO if sums else None
    odd = odd_to is not None and weight and row_bytes(kir) < 4 and not values and shift_from < widest
    held = widest if shift_from < widest and stages is None else None
    wide_chunk, _, wide_stages, _ = WIDE_SUMS
    wide_sums = sums and not lanes and not values and row_bytes(kir) < 4 \
        and _buffers_fit(wide_stages, wide_chunk, column_bytes)
    looped = _looped_block(block, warps, chunk, kir, lanes, held, odd_to if odd else None, wide_sums) + \
        _looped_launch(looped_stages, vec, held, odd, wide_sums)
    # a schedule's BLOCK_ROWS, within Triton's largest tile (2**20 elements) at each call's BLOCK_N
    scheduled_rows = f"min({rows}, {fit}, max(2**20 // BLOCK_N, 1))"
    return Tiling(
        max_block=widest, shift_from=shift_from, shift_fill=fill,
        chunk=chunk, split_chunk=block or CHUNK_N,
        rows=scheduled_rows if rows else f"min(max({TILE_BYTES // row_bytes(kir)} // BLOCK_N, 1), {fit})",
        looped_rows=scheduled_rows if rows else "1",
        stages=STAGES if stages is None else str(stages), straight=STRAIGHT_MAX_BLOCK_N,
        unaligned_straight=UNALIGNED_STRAIGHT_MAX_BLOCK_N,
        unaligned_warps="" if warps is not None else
        f"max(NUM_WARPS, {UNALIGNED_WARPS[0]} if BLOCK_N <= {UNALIGNED_WIDE} else {UNALIGNED_WARPS[1]})",
        warps=text, narrower=narrower, looped=looped,
        split_warps=str(warps) if warps else SPLIT_WARPS, split_warps_per_sm=SPLIT_WARPS_PER_SM,
        odd=(ODD_FROM, odd_to) if odd else None)


def _buffers_fit(stages: int, chunk: int, column_bytes: int) -> bool:
    """Whether a column loop's pipeline (each stage past the first buffers a chunk of every
    operand along the row) fits LOOPED_SMEM."""
    return (stages - 1) * chunk * column_bytes <= LOOPED_SMEM


def _looped_launch(stages: int, vec: int, held: int | None, odd: bool, wide_sums: bool) -> tuple[str, ...]:
    """The host lines that set PER_SM and the looped kernel's options (SHIFT, VEC and the
    stages); ``held``: the widest row on chip, where shifted rows up to it launch a program a row
    (but rows of an odd width, ``ODD``, whose programs walk the tiles); ``wide_sums``: WIDE rows
    take WIDE_SUMS."""
    persistent = (f"PER_SM = {LOOPED_PER_SM}",
                  f"# at most {LOOPED_MAXNREG} registers a thread: 32 warps fit an SM",
                  f"options = dict(NUM_STAGES={stages}, SHIFT=SHIFT, VEC={vec}, maxnreg={LOOPED_MAXNREG})")
    branches = []
    if held is not None:
        branches.append((f"n_cols <= {held}{' and not ODD' if odd else ''}",
                         ("# shifted, though narrow enough to hold: a program a row, all of it in flight",
                          f"PER_SM, options = None, dict(NUM_STAGES={HELD_SHIFTED_STAGES}, SHIFT=SHIFT, VEC={vec})")))
    if wide_sums:
        _, _, stages_wide, per_sm = WIDE_SUMS
        branches.append(("WIDE", (f"PER_SM, options = {per_sm}, dict(NUM_STAGES={stages_wide}, SHIFT=SHIFT, "
                                  f"VEC={vec})",)))
    if not branches:
        return persistent
    lines = []
    for test, body in branches:
        lines += [f"{'elif' if lines else 'if'} {test}:", *(f"    {line}" for line in body)]
    return (*lines, "else:", *(f"    {line}" for line in persistent))


def _looped_block(block: int | None, warps: int | None, chunk: int, kir: KernelIR,
                  lanes: bool, held: int | None, odd_to: int | None, wide_sums: bool) -> tuple[str, ...]:
    """The host lines that set BLOCK_N and NUM_WARPS of the looped kernel: narrower chunks on
    rows under WIDE_ROW, unless the schedule fixes the chunk or the warps; first, where
    ``odd_to`` is given, the tile of rows of an odd width up to it (see ODD_FROM); where
    ``wide_sums``, WIDE_SUMS's chunk on rows in whole vectors from WIDE_ROW."""
    if block is not None or warps is not None:
        return (f"BLOCK_N, NUM_WARPS = {chunk}, {warps or LOOPED_WARPS}",)
    def thirty_two_bytes(n: int) -> tuple[int, int]:
        return n, max(4, min(16, n * row_bytes(kir) // (32 * 32)))
    if lanes:
        wide = (min(chunk, LANES_CHUNK_N), LANES_WARPS)
        narrow = (min(chunk, LANES_NARROW_BYTES // row_bytes(kir)), LANES_WARPS)
        short = (min(chunk, LANES_SHORT_BYTES // row_bytes(kir)), 4)
        shortest = short
    else:
        wide = (chunk, LOOPED_WARPS)
        narrow = thirty_two_bytes(min(NARROW_CHUNK_N, chunk))
        short = thirty_two_bytes(min(SHORT_CHUNK_N, chunk))
        shortest = (min(SHORTEST_CHUNK_N, chunk), 4)
    # (tests, narrowest first; a tier that takes the next one's block is left out)
    tiers = [(f"n_cols < {WIDE_ROW}", narrow)] if narrow != wide else []
    if row_bytes(kir) < 4:   # shifted 16-bit rows loop from SHIFTED_MAX_BLOCK_N columns, whatever their width
        if short != narrow:
            tiers.insert(0, (f"n_cols <= {SHORT_ROW}", short))
        if shortest != short:
            tiers.insert(0, (f"n_cols <= {SHORTEST_ROW}", shortest))
    else:
        if held is not None and narrow[1] > HELD_WARPS:
            tiers.insert(0, (f"n_cols <= {held}", (narrow[0], HELD_WARPS)))
        if short != narrow:     # ... f32 ones at some widths only: short chunks up to SHORTEST_ROW
            tiers.insert(0, (f"n_cols <= {SHORTEST_ROW}", short))
    lines, branches = [], []
    if odd_to is not None:
        lines += [f"# an odd width: {ODD_ROWS} rows a program (reading the weight's cache lines together), "
                  f"short chunks",
                  f"ODD = SHIFT and ROW_VEC == 1 and n_cols <= {odd_to}"]
        branches.append(("ODD", f"BLOCK_ROWS, BLOCK_N, NUM_WARPS = min({ODD_ROWS}, _next_pow2(n_rows)), "
                                f"{ODD_CHUNK_N}, {ODD_WARPS}"))
    branches += [(test, f"BLOCK_N, NUM_WARPS = {n}, {w}") for test, (n, w) in tiers]
    if wide_sums:
        lines += [f"# sums alone, over rows of {WIDE_ROW} columns or more, not shifted: longer chunks, "
                  f"{WIDE_SUMS[3]} programs an SM",
                  f"WIDE = n_cols >= {WIDE_ROW} and not SHIFT"]
        branches.append(("WIDE", "BLOCK_N, NUM_WARPS = {}, {}".format(*WIDE_SUMS[:2])))
    setting = f"BLOCK_N, NUM_WARPS = {wide[0]}, {wide[1]}"
    if not branches:
        return (setting,)
    for i, (test, line) in enumerate(branches):
        lines += [f"{'elif' if i else 'if'} {test}:", f"    {line}"]
    return (*lines, "else:", f"    {setting}")
