/******************************************************************************
 * wgmma-tma: FlashAttention-3-style forward for Hopper (sm_90a): a producer
 * warp feeds K/V tiles through the tensor memory accelerator into a ring of
 * shared-memory slots; consumer warpgroups multiply on the tensor cores with
 * wgmma.mma_async and keep the online softmax in registers.
 *
 * Head dims 64, 128, 96 (Phi-3's prefill; "Head dim 96" below) and 256 (Gemma 2/3's;
 * "Head dim 256" below says which knob points run there). One CTA per (query tile of BLOCK_M = 64 * CONSUMERS rows,
 * b * HQ + h), with CONSUMERS + 1 warpgroups of 128 threads:
 *   warpgroup 0 (producer) gives its registers away (setmaxnreg.dec), its
 *             warps 1-3 exit, and one thread of warp 0 issues every load:
 *             each work tile's Q (into Q slot i % Q_STAGES), then K and V
 *             of each key tile t into ring slot t % STAGES, each box a
 *             cp.async.bulk.tensor completing on that slot's full mbarrier
 *             (k_full / v_full), after waiting for the slot's empty mbarrier
 *             (k_empty / v_empty) that the consumers arrive on when done.
 *   warpgroups 1..CONSUMERS take the registers (setmaxnreg.inc); warpgroup c
 *             owns query rows 64 (c - 1) .. + 63 of the tile. Per key tile:
 *     1. S = Q K^T: D / 16 wgmma m64nBLOCK_Nk16, A (Q) and B (K) read from
 *        shared memory through 128-byte-swizzle descriptors (K-major);
 *     2. masking, only on tiles that need it: keys >= SK and, causal, keys
 *        above the row's diagonal, bottom-right (row i sees keys
 *        <= i + SK - SQ; tiles wholly above every row of the warpgroup are
 *        not computed; tiles above every row of the CTA are not even loaded),
 *        and with a sliding window keys left of the row's window ("Window:"
 *        below); common/mask.cuh's KeyMask;
 *     3. online softmax (common/online_softmax.cuh, on the m16n8 layout of
 *        common/quad_softmax.cuh): a thread holds rows g and g + 8 of its
 *        warp's 16, max and sum reduced across the quad;
 *        p = exp2(s * c - m * c), c = softmax_scale * log2(e); O rescaled by
 *        exp2((m_old - m_new) c);
 *     4. O += P V: P rounded to f16x2 / bf16x2 in registers is wgmma's
 *        register A operand (BLOCK_N / 16 wgmma m64nDk16), V read from shared
 *        memory as the MN-major ("transposed") B operand.
 *   epilogue  O / l, rows < SQ only. EPI_TMA = 0: stored from registers
 *             through O's strides (4-byte stores: a quad writes 16 contiguous
 *             bytes per n8 block). EPI_TMA = 1 (FA3 / FA4's epilogue, but per
 *             warpgroup, not one barrier over the CTA): each warpgroup writes its
 *             64 x D rows into its own O buffer in the TMA's 128-byte-swizzled
 *             layout, fences (async proxy), syncs its 128 threads (named barrier
 *             CONSUMERS + 2 + c) and one thread issues a TMA store of the box (the
 *             o map: rows past SQ are not written); the buffer is rewritten only
 *             after that store has read it (cp.async.bulk.wait_group.read), and
 *             the CTA ends after the last store has completed.
 *
 * Heads: work tile bh = b * HQ + h; query head h reads K/V head h / (HQ / HKV)
 * (grouped-query attention). The query heads of one K/V head are adjacent in
 * bh, and every schedule below walks heads in bh order, so CTAs running at
 * once share that head's K/V in L2. PACK_GQA (packed, P = G): bh = b * HKV +
 * K/V head, and a work tile holds 64 CONSUMERS / P query positions of each of
 * the P heads; unpacked P = 1.
 *
 *   OVERLAP = 1 (FA3's intra-warpgroup pipelining): iteration t issues
 *             S_t = Q K_t^T and then O += P_{t-1} V_{t-1} before waiting, so
 *             the softmax of tile t runs while the tensor cores do the PV of
 *             tile t - 1 (P_{t-1} must stay untouched in its registers until
 *             that wgmma completes: tile t's probabilities wait in the fp32 S
 *             registers, packed only after wgmma.wait_group 0). PV_WAIT (below)
 *             says where that wait sits: right after the row max, as FA4 does (1),
 *             or after the whole softmax (0), in both arms of the O-rescale branch:
 *             written straight after the softmax, ptxas lifted it above the
 *             exponentials (docs/HOPPER.md, "The softmax under the P V";
 *             python/kernel_tests/test_sass_overlap.py reads the SASS).
 *   PINGPONG = 1: the consumer warpgroups take turns issuing their GEMMs
 *             (named barriers 1..CONSUMERS, round robin), so one warpgroup's
 *             softmax overlaps another's GEMMs.
 *
 * Shared memory (1024-byte aligned tiles, every tile a set of 128-byte-swizzled
 * panels of 64 columns, as the TMA writes them; at D 96 64-byte-swizzled panels of
 * 32 columns, "Head dim 96"; the counts below say D / 64 for D / panel columns):
 *   Q     Q slots x CONSUMERS x [D / 64][64 rows][128 B], Q slots =
 *         Q_STAGES when persistent (WT_PERSISTENT), else 1
 *   K, V  STAGES x [D / 64][BLOCK_N rows][128 B] each
 *   O     EPI_TMA x CONSUMERS x [D / 64][64 rows][128 B]
 *   dynamic bytes = 1024 (alignment) + 2 D (Q slots x 64 CONSUMERS
 *                   + 2 STAGES BLOCK_N + EPI_TMA 64 CONSUMERS)
 *   (WtSmem; OPTD_CHECK_SMEM fails the build if the spec's formula differs);
 *   mbarriers static (8 (2 Q slots + 4 STAGES) bytes).
 *   D 128, BLOCK_N 128, 2 consumers, 2 stages: 161 KiB; 3 stages: 225 KiB.
 *   D 256, 2 consumers, 2 stages, one Q slot, no EPI_TMA: BLOCK_N 80 225 KiB
 *   (Q 64 + K/V 160 + 1), BLOCK_N 64 193 KiB; anything more is over 227 KiB.
 *   D 256, 3 consumers: refused by the spec's [[refuse]] (registers below), and
 *   the kernel is a stub (WtSmem::RUNS).
 * Scratch: STREAM_K only (else n_splits 1, untouched): o_partial holds 2 pieces
 *          per CTA, (4 + D / 2) x 128 floats per consumer each (a thread's m, l
 *          and O, thread-major), so the spec's splits is the fewest whole
 *          B*HQ*SQ*D blocks of floats that hold 2 SMS CONSUMERS 128 (4 + D / 2);
 *          lse_partial's semaphore words (from n_splits*B*HQ*SQ) count the
 *          pieces in per (tail tile, consumer), reset by the last. The kernel
 *          checks the room and runs whole tiles where it is short.
 * CTAs:    cdiv(SQ, 64 CONSUMERS / P) x (B * HQ / P) x 1, 128 (CONSUMERS + 1)
 *          threads, P = the spec's `pack` (PACK_GQA; else 1)
 *          (PERSISTENT: min(that product, SMs) x 1; with STREAM_K SMs x 1;
 *          CLUSTER_SPLIT: the product with twice as many along x, clusters
 *          of 2, whatever PERSISTENT says);
 *          the producer and the consumers walk the same work tiles through
 *          common/tile_scheduler.cuh;
 *          causal, PERSISTENT = 0: CTAs start in linear-id order, and the id
 *          maps to (query tile, head) longest first across a group of heads
 *          whose K/V fit in LPT_MIB MiB (L2 reuse; K/V counted
 *          once per K/V head, a group holding whole GQA groups of query
 *          heads), so the last wave holds only light tiles. H100 (MHA), vs one
 *          head after another:
 *          (4,16,4096,64) 356 -> 351 us, (2,16,8192,128) BLOCK_N 192
 *          1052 -> 1013 us (docs/device-runs/2026-11-23-h100-causal-lpt.txt).
 * Registers (setmaxnreg, per thread): producer 24 (2 consumers) or 32 (3);
 *          consumers 240 or 160 (the launch allocation, 168 or 128 each, moved
 *          from the producer to the consumers). A consumer holds BLOCK_N / 2 (S) + D / 2 (O)
 *          + BLOCK_N / 4 (P) values: D 128, BLOCK_N 128: 160. D 256: 128 (O) + 40 + 20 at
 *          BLOCK_N 80 (FA3's hdim-256 tile, 128 x 80), 128 + 32 + 16 at BLOCK_N 64: within 2
 *          consumers' 240 (ptxas, sm_90a: no spill in the key-tile loops; 36 / 116 bytes of
 *          spill stores / loads at BLOCK_N 80 and 20 / 44 at 64 in the per-work-tile code, as
 *          D 128's 12 / 28 at the default point); 3 consumers' 160 cannot hold O and S.
 * Window:  (ABI v3's `window` W > 0, causal only: row i sees keys > i + SK - SQ - W too)
 *          Range: a work tile's key tiles start at the tile holding its first query
 *          position's first key (KeyTiles::first in common/tile_scheduler.cuh; packed tiles
 *          by position, as the causal mask), so a query tile reads about W + TP keys, not up
 *          to SK; TileScheduler::keys() is the one range the producer loads and every
 *          consumer waits for and releases (ring and ping-pong turns stay in step). A
 *          consumer whose rows start later only waits for and releases the tiles left of
 *          its first row's first key (computed, they would cost the third of 3 consumers
 *          a tile more per work tile: 1 in 3 at W 128, BLOCK_N 128).
 *          Masking: tiles before the one holding the first key of the warpgroup's last row
 *          cross some row's left edge and are masked per element (m16n8_mask_left, beside
 *          the right edge's m16n8_mask; with a small W, W = 1 at the extreme, one tile
 *          crosses both). The unmasked (steady-state) loops carry none of it. OVERLAP: the
 *          first tile tests for it, and the masked loop runs twice, over the left edge's
 *          tiles and then the right's, its left mask behind a warp-uniform test. Without
 *          OVERLAP (and in split tiles): a third peeled copy of the loop, for the left edge,
 *          runs first. Each form is the one of those tried whose plain loops at W = 0 came
 *          out of ptxas closest to before (sass_loop_stats.py, the plan's start points: D 64
 *          419 instructions for 423, D 128 499 for 500 and without OVERLAP 612 for 608, D 256
 *          470 for 526 and 590 for 594; no spill in any loop). A build without the window's
 *          code (OPTD_BUILD_WINDOW 0, common/optd.cuh: optd_window() is 0 and kWin false)
 *          compiles the kernels of before windows: the same SASS but optd_window's trap test.
 *          Schedulers: the causal orders (one CTA per tile's and DYNAMIC's longest first,
 *          the static snake's heaviest first) are kept: windowed lengths,
 *          min(causal, ~(W + TP) / BLOCK_N) key tiles, still do not shrink as the query
 *          tile grows, give or take one key tile of rounding and a lighter ragged last tile.
 *          STREAM_K is not engaged with a window (whole tiles; the spec's sk_can, so the
 *          knob is inert there): its tail pieces, lengths and sums stay the unwindowed
 *          ones (windowed, they cost the STREAM_K kernels 4400 instructions and 84 bytes
 *          of spill stores at W = 0; TileScheduler::keys). Engaged with the pieces as
 *          offsets into each tile's own range (session 30, e4b025d) it was correct and 2x
 *          slower on Gemma 3's local chunk (docs/HOPPER.md). Every knob combination runs
 *          windowed: no [[refuse]] for it.
 * Tensor maps: q and o (box 64 rows x D; packed, 64 / P rows x one panel, a box
 *          per panel: box_panels), k and v (box BLOCK_N rows x D: D / 64 = 1, 2 or 4
 *          panels of 64 columns), 128-byte swizzle,
 *          rank 5 over the tensors' real strides (the daemon's convention:
 *          dims {64, rows, D / 64, heads, B}, a box at (0, row, panel, head, b));
 *          rows past SQ (Q) or SK (K, V) are zero-filled by the TMA, per head;
 *          a store (O, EPI_TMA) skips rows past SQ.
 *
 * Knobs:   BLOCK_N    keys per K/V tile (wgmma N of S = Q K^T)   192, 128, 176,
 *                     (80 and 64: for D 256, where no larger tile fits;  80, 64
 *                     they run at D 64 and 128 too)
 *          STAGES     K/V slots in the TMA ring                 2, 3
 *          CONSUMERS  consumer warpgroups (64 query rows each)  2, 3
 *          PINGPONG   consumer warpgroups take turns on the GEMMs 1, 0
 *          OVERLAP    softmax of tile t under the PV of t - 1   1, 0
 *          PERSISTENT one CTA per SM looping over work tiles     1, 0
 *                     (grid min(tiles, SMs) x 1; 0: one CTA per tile)
 *          LAZY_RESCALE  the softmax max moves only when it grows by   1, 0
 *                     more than 2^8; warps skip the O rescale otherwise
 *                     (in the OVERLAP loop with PV_WAIT at D 128 too, by
 *                     a warp-uniform branch; no effect there at D 64:
 *                     Consumer::kLazy)
 *          TAIL_SPLIT a work tile with at most 64 query rows (the      1, 0
 *                     ragged tail of SQ, or SQ <= 64) splits its key
 *                     tiles across the consumers instead of leaving all
 *                     but consumer 0 idle; merged through shared memory
 *          EPI_TMA    O through shared memory and a TMA store per   0, 1
 *                     warpgroup (FA4: 25% fewer L2 write sectors than
 *                     4-byte stores from registers, ncu at (4,16,4096,64))
 *          PACK_GQA   G = HQ / HKV in {2, 4, 8} (else no effect):     0, 1
 *                     the G query heads of one K/V head share
 *                     a work tile, each consumer's 64 rows = G heads x
 *                     64 / G query positions (FA3 / FA4's pack_gqa), so
 *                     a causal tile's diagonal spans 64 CONSUMERS / G
 *                     positions instead of 64 CONSUMERS: computed over
 *                     useful (query, key) pairs 1.09 instead of 1.18 at
 *                     S 2048, G 4. Q and O move as G boxes of 64 / G rows
 *                     per consumer and 64-column panel (box_panels 1: a
 *                     box spanning D 128's two panels would interleave
 *                     them per head, where the wgmma descriptors want
 *                     each panel's 64 rows together). No TAIL_SPLIT in
 *                     packed tiles. Timed (H200, 2026-11-26): slower than
 *                     unpacked at every shape, 2-8% with DYNAMIC.
 *          STREAM_K   persistent (else no effect): the grid is every  0, 1
 *                     SM, and the last round's work tiles (tiles mod grid
 *                     of them; causal: only when that is every tile, as
 *                     chunked prefill's 128 tiles of 29-32 key tiles)
 *                     are cut into key-range pieces spread evenly over
 *                     every CTA (common/tile_scheduler.cuh), each piece's
 *                     (m, l, O) goes to o_partial and the last piece of
 *                     a tile to finish merges them and stores O
 *                     (stream_k_merge). Whole tiles leave the last round
 *                     to a few SMs: (2,16,8192,128) at 192-row tiles is
 *                     1376 tiles on 132 SMs, 10.4 rounds of work in 11
 *                     rounds of time. Timed (H200): 3-4% faster there,
 *                     10-13% slower on small-tile medium shapes; causal
 *                     (H100, sustained): 4% faster at (1,32/8,576 of
 *                     16384,64), 33% slower at (1,32/8,512 of 4096,128).
 *          LPT_MIB    causal, one CTA per tile (or DYNAMIC): the K/V   8, 32
 *                     bytes (MiB) of the group of heads scheduled longest
 *                     first together (8: tiles of fewer heads share L2;
 *                     FA3 uses 32 MB, FA4 50: a longer list for the last
 *                     wave to balance). 32 timed neutral on the H200
 *                     (2026-11-26, within the rounds' spread).
 *          Q_STAGES   persistent (else no effect): Q slots, one     1, 2
 *                     work tile's rows each. 1: the next tile's Q loads
 *                     after every consumer's last Q K^T of this one (a
 *                     causal tile's consumers end at different key tiles;
 *                     the first to finish waits for the last, then for
 *                     the load: ncu 2026-11-27, 6.8% of the warp-stall
 *                     samples of (4,16/4,2048,64) causal on that wait).
 *                     2: it loads into the other slot as soon as the
 *                     producer takes it, under this tile's last key tiles.
 *          DYNAMIC    persistent, causal (else no effect): CTAs take   1, 0
 *                     work tiles longest first (LPT_MIB's groups) from a
 *                     global counter as they finish (1), instead of
 *                     static snake rounds of head-major tiles (0), which
 *                     balance only when a round holds whole heads
 *                     (modelled busiest CTA 1.29x the mean at
 *                     (2,16,8192,128) with 192-row tiles, 1.73x for packed
 *                     GQA (4,16/4,2048,64); dynamic 1.00-1.07x). The
 *                     counter lives in the split semaphore words (ABI:
 *                     zero at launch, left zero). Timed on the H200
 *                     (2026-11-26): faster than the static rounds on 11 of
 *                     12 causal (shape, point) pairs, 4-14% (GQA D 64
 *                     (4,16/4,2048,64) 97.6 -> 88.7 us), and than one CTA
 *                     per tile on all 12 (docs/HOPPER.md).
 *          PV_WAIT    OVERLAP (else no effect): where a key tile's    1, 0
 *                     loop waits for the previous tile's P V. 1: after
 *                     the row max (FA4's order, read in its SASS): O
 *                     rescaled always, the multiplies and the packing of
 *                     P interleaved with the exponentials. 0: after the
 *                     whole softmax (every exponential under the P V),
 *                     then the lazy O rescale and the packing in a tail
 *                     of their own. H100, 15 paired rounds (2026-11-27,
 *                     docs/HOPPER.md "PV_WAIT"): 1 is 1-5% faster at
 *                     every D 64 point but one (parity); mixed at D 128
 *                     (-2% to +4%).
 *          CLUSTER_SPLIT 1: each work tile is a cluster of    0, 1
 *                     two CTAs (one cluster per tile, PERSISTENT inert:
 *                     WT_PERSISTENT), rank r computing the r-th half of its key
 *                     tiles (TileScheduler::keys); rank 1's (m, l, O) go
 *                     to rank 0 through distributed shared memory
 *                     (st.async into its Q slot and K/V ring, free by
 *                     then) and rank 0 merges and stores (cluster_merge).
 *                     For grids of fewer tiles than half the SMs, where
 *                     whole tiles idle the rest and stream-K's pieces
 *                     cost global traffic (docs/HOPPER.md, session 30:
 *                     Gemma 3's local chunk, 64 tiles on 132 SMs).
 *                     H200, 2026-11-30 (HOPPER.md "CLUSTER_SPLIT"): that
 *                     chunk 25.5 us against 29.5, 8 D 64 heads of 1024
 *                     rows 12.6 against 15.1, Mistral's 256-row windowed
 *                     chunk 34.2 against 49.4; a grid of 128 tiles 1.13x
 *                     slower (the search decides per shape).
 *
 * Head dim 96 (Phi-3-mini / 3.5: 32 heads, MHA). 96 is no multiple of a 128-byte swizzle's
 *          64 columns, so every tile at D 96 is three panels of 32 columns (64-byte rows) with
 *          the 64-byte swizzle (WtPanel<96>; the spec's maps: swizzle "64 if D == 96 else 128",
 *          box_panels 3): smem descriptors of layout type 2 whose 8-row atoms are 512 bytes
 *          (stride byte offset 8 x 64), Q K^T's 6 k-steps 2 per panel, V's MN-major panels
 *          BLOCK_N x 64 bytes apart (P V: m64n96k16), EPI_TMA's O buffer written through the
 *          same swizzle (chunk q of row r at q ^ ((r / 2) % 4)). Byte counts are D's (the smem
 *          formula holds; three quarters of D 128's layout, so what fits there fits here), every
 *          knob point builds, and O is 48 registers per thread (D 64's 32, D 128's 64). Checked on the GPU
 *          (H200, the pairwise covering set against fp32: docs/BENCHMARKS.md (28), again in (31)); compiled at
 *          every knob value by CI.
 *
 * Head dim 256 (Gemma 2/3: 16 query heads on 8 K/V heads, or 8 on 4). Every loop over D
 *          is written for D / 64 panels and D / 16 k-steps (4 and 16 here): S = Q K^T is 16
 *          wgmma m64nBLOCK_Nk16 over Q's and K's 4 panels, O += P V BLOCK_N / 16 wgmma
 *          m64n256k16 (V's 4 panels BLOCK_N * 128 bytes apart: the MN-major descriptor's
 *          leading byte offset), the TMA boxes span 4 panels (box_panels D / 64). The knob
 *          points that run there, the only ones within 227 KiB and 240 registers:
 *            CONSUMERS 2, STAGES 2, BLOCK_N 80 or 64, EPI_TMA 0, and Q_STAGES 1 where
 *            PERSISTENT (one CTA per tile allocates one Q slot whatever Q_STAGES says);
 *          every value of PINGPONG, OVERLAP, PERSISTENT, LAZY_RESCALE, TAIL_SPLIT (the merge
 *          through the Q slots: 2 x 64 x 256 x 2 bytes = one consumer's fp32 O), PACK_GQA
 *          (a Q / O box per panel, 4 per head and consumer), STREAM_K (the scratch formula
 *          is D's), LPT_MIB, DYNAMIC and PV_WAIT. E.g. the first knob values with BLOCK_N 80.
 *          The gate refuses the others by their shared memory: 3 STAGES, BLOCK_N 128 and up,
 *          Q_STAGES 2 (persistent) and EPI_TMA (a 32 KiB O buffer per consumer) exceed 227
 *          KiB; 3 consumers are refused by the spec ([[refuse]]). Their D 256 kernel is a stub (__trap) so a
 *          build for a run with D 256 shapes does not compile spilling kernels for nothing.
 *          FA3 runs hdim 256 the same way: 2 consumer warpgroups, 128 x 80 tiles, 2 stages.
 *
 * Ragged tails. (32,16,577,64) with 192-row tiles took 167 us against 131 at
 *          S 576 (4 query tiles per head instead of 3, the fourth of one row);
 *          three things, measured on the H100 (docs/HOPPER.md, "Ragged tails";
 *          docs/device-runs/2026-11-26-h100-ragged-tail.txt):
 *          1. the persistent schedule (common/tile_scheduler.cuh) gave every
 *             light tail tile to the same quarter of the CTAs (132 = 33 x 4):
 *             the tail tiles doing no work at all still took 168 us. Non-causal
 *             persistent rounds are now rotated: 167 -> 157 us;
 *          2. TAIL_SPLIT = 1: a work tile with at most 64 query rows (the
 *             ragged tail of SQ, or SQ <= 64) would leave all but consumer 0
 *             idle while it walks every key tile alone. Instead every consumer
 *             takes those 64 rows (Q slot 0) and key tiles t = c, c + CONSUMERS,
 *             ... (the producer is unchanged; each consumer still waits for and
 *             releases every tile, in order, without ping-pong turns: turns in
 *             key order chained each consumer's tile behind the previous one's
 *             and the split bought nothing), and at the end the consumers
 *             exchange their rows' max and sum, scale their O to the common max
 *             and add them up in consumer 0 through the Q slots (free once every
 *             consumer's last Q K^T is done): CONSUMERS x 64 D 2 bytes >= one
 *             consumer's fp32 O (64 D 4 bytes), the max/sum exchange
 *             (CONSUMERS x 2 KiB) first. A thread holds the same rows and columns
 *             in every consumer, so the merge is element-wise. Named barrier
 *             CONSUMERS + 1 (ping-pong uses 1 .. CONSUMERS), over the consumers'
 *             128 CONSUMERS threads; the Q slots go back to the producer after
 *             the merge. 153 -> 149 us (with 3.);
 *          3. q_empty is arrived on right after a warpgroup's last Q K^T, not
 *             after its epilogue: the next work tile's Q (and then its K/V)
 *             loads under the last P V and the stores: 157 -> 153 us.
 *          S 577 now 149 us (cuDNN 151), S 512 101 (110), S 640 150 (170); the
 *          large benchmark shapes unchanged (1.000x, geometric mean of 4).
 ******************************************************************************/

/* optimizerd:spec
[template]
name = "wgmma-tma"
description = "FlashAttention-3-style forward for Hopper: TMA producer warp + mbarrier ring, wgmma consumer warpgroups, setmaxnreg, ping-pong and intra-warpgroup overlap"
min_cc = 90
head_dims = [64, 96, 128, 256]
arch_specific = true
windows = true

[knobs]
BLOCK_N = [192, 128, 176, 80, 64]
STAGES = [2, 3]
CONSUMERS = [2, 3]
PINGPONG = [1, 0]
OVERLAP = [1, 0]
PERSISTENT = [1, 0]
LAZY_RESCALE = [1, 0]
TAIL_SPLIT = [1, 0]
EPI_TMA = [0, 1]
PACK_GQA = [0, 1]
STREAM_K = [0, 1]
LPT_MIB = [8, 32]
DYNAMIC = [1, 0]
Q_STAGES = [1, 2]
PV_WAIT = [1, 0]
# 1: two CTAs per work tile in a cluster, each half its key tiles, merged through distributed
# shared memory (one cluster per tile whatever PERSISTENT says). For grids of fewer work tiles
# than SMs: H200, 2026-11-30, 0.69-0.87x the time of whole tiles on eight such points, 1.13x on
# a grid of 128 tiles (docs/HOPPER.md "CLUSTER_SPLIT").
CLUSTER_SPLIT = [0, 1]

[derived]
pack = "G if PACK_GQA and G >= 2 and 8 % G == 0 else 1"
# One CTA per SM looping over work tiles (the kernel's WT_PERSISTENT): CLUSTER_SPLIT runs one
# cluster per tile whatever PERSISTENT says.
persistent = "1 if PERSISTENT and not CLUSTER_SPLIT else 0"
block_m = "64 * CONSUMERS"
# Q slots: one work tile per CTA needs one whatever Q_STAGES says (so the knob is inert there).
q_slots = "Q_STAGES if persistent else 1"
m_blocks = "cdiv(SQ, block_m // pack)"
# Work tiles, and the last persistent round's on every SM (STREAM_K's tail).
tiles = "m_blocks * B * HQ // pack"
sk_tail = "tiles % SMS"
# Whether STREAM_K may cut the tail (the kernel's own test, less its causal length check):
# a tail of at least one key tile per SM; causal, only a grid of one partial round; no
# sliding window (whole tiles there: TileScheduler::keys says why).
sk_can = "1 if persistent and WINDOW == 0 and sk_tail > 0 and ((CAUSAL and tiles < SMS) or (not CAUSAL and sk_tail * cdiv(SK, BLOCK_N) >= SMS)) else 0"
sk_on = "sk_can if STREAM_K else 0"
# STREAM_K's grid is every SM, even with fewer tiles (the tail is then every tile).
grid_x = "SMS if sk_on else min(tiles, SMS)"
# STREAM_K: scratch for 2 pieces per CTA, (4 + D / 2) x 128 floats per consumer each.
sk_floats = "2 * SMS * CONSUMERS * 128 * (4 + D // 2)"
splits = "max(1, cdiv(sk_floats, B * HQ * SQ * D)) if sk_on else 1"

# Knobs that run the same kernel on a shape whatever their value (the searches try one).
[inert]
PACK_GQA = "pack == 1"
# No work tile of at most 64 query rows: only SQ's last tile can be one (packed tiles never split).
TAIL_SPLIT = "pack > 1 or SQ - (m_blocks - 1) * (block_m // pack) > 64"
# One CTA per tile, no tail, a tail of fewer key tiles than SMs, causal rounds, or a window:
# whole tiles.
STREAM_K = "not sk_can"
# The longest-first groups order only causal grids of one CTA per tile, or DYNAMIC's tiles.
LPT_MIB = "not CAUSAL or (persistent and not DYNAMIC)"
# A cluster per work tile (CLUSTER_SPLIT) is never persistent.
PERSISTENT = "CLUSTER_SPLIT == 1"
# Only persistent causal grids take tiles from the counter.
DYNAMIC = "not CAUSAL or not persistent"
# One work tile per CTA: there is no next tile's Q to load early.
Q_STAGES = "not persistent"
# Where the OVERLAP loop waits for the previous tile's P V: no such wait without OVERLAP.
PV_WAIT = "not OVERLAP"
# The D 64 and 96 OVERLAP loop with PV_WAIT rescales O on every key tile: no lazy threshold there.
LAZY_RESCALE = "OVERLAP and PV_WAIT and D < 128"

# D 256 with 3 consumers: the kernel there is a stub (WtSmem::RUNS).
[[refuse]]
when = "D == 256 and CONSUMERS == 3"
why = "3 consumer warpgroups' 160 registers per thread cannot hold D 256's O (128 floats) with S and P; D 256 runs 2 consumers"

# Where 3 consumers' 160 registers cannot hold S (BLOCK_N / 2), O (D / 2), P and, with OVERLAP,
# the next tile's S, ptxas serializes every wgmma (C7512, "insufficient register resources")
# and spills 0.2-5 KB: H100, D 128, (2,16,8192,128): 3317 us against 1805 without OVERLAP.
# The boundaries are ptxas 13.0's (python/kernel_tests/test_wgmma_registers.py compiles both
# sides of each); D 256 is refused above.
[[refuse]]
when = "CONSUMERS == 3 and D < 256 and BLOCK_N >= (176 if D == 64 else 128) and OVERLAP"
why = "3 consumer warpgroups with OVERLAP at this BLOCK_N and D: ptxas serializes the wgmma for want of registers (C7512); 2 consumers, a smaller BLOCK_N or OVERLAP 0 run"

[[refuse]]
when = "CONSUMERS == 3 and (D == 96 or D == 128) and BLOCK_N > 128"
why = "3 consumer warpgroups at this BLOCK_N and D: ptxas serializes the wgmma for want of registers (C7512); 2 consumers or BLOCK_N <= 128 run"

[[launch]]
kernel = "fwd"
grid = ["grid_x if persistent else m_blocks * (1 + CLUSTER_SPLIT)", "1 if persistent else B * HQ // pack", "1"]
block = ["128 * (CONSUMERS + 1)", "1", "1"]
smem = "1024 + ELEM_BYTES * D * (q_slots * block_m + 2 * STAGES * BLOCK_N + EPI_TMA * block_m)"

[[tensor_map]]
tensor = "q"
box_rows = "64 // pack"
box_panels = "1 if pack > 1 else D // (32 if D == 96 else 64)"
swizzle = "64 if D == 96 else 128"

[[tensor_map]]
tensor = "k"
box_rows = "BLOCK_N"
swizzle = "64 if D == 96 else 128"

[[tensor_map]]
tensor = "v"
box_rows = "BLOCK_N"
swizzle = "64 if D == 96 else 128"

[[tensor_map]]
tensor = "o"
box_rows = "64 // pack"
box_panels = "1 if pack > 1 else D // (32 if D == 96 else 64)"
swizzle = "64 if D == 96 else 128"
*/

#include "common/optd.cuh"
#include "common/quad_softmax.cuh"
#include "common/tile_scheduler.cuh"
#include "common/hopper.cuh"
#include "common/wgmma_ops.cuh"
#include "common/cluster.cuh"

#ifndef BLOCK_N
#error "BLOCK_N must be defined"
#endif
#ifndef STAGES
#error "STAGES must be defined"
#endif
#ifndef CONSUMERS
#error "CONSUMERS must be defined"
#endif
#ifndef PINGPONG
#error "PINGPONG must be defined"
#endif
#ifndef OVERLAP
#error "OVERLAP must be defined"
#endif
#ifndef PERSISTENT
#error "PERSISTENT must be defined"
#endif
#ifndef LAZY_RESCALE
#error "LAZY_RESCALE must be defined"
#endif
#ifndef TAIL_SPLIT
#error "TAIL_SPLIT must be defined"
#endif
#ifndef EPI_TMA
#error "EPI_TMA must be defined"
#endif
#ifndef PACK_GQA
#error "PACK_GQA must be defined"
#endif
#ifndef STREAM_K
#error "STREAM_K must be defined"
#endif
#ifndef LPT_MIB
#error "LPT_MIB must be defined"
#endif
#ifndef DYNAMIC
#error "DYNAMIC must be defined"
#endif
#ifndef Q_STAGES
#error "Q_STAGES must be defined"
#endif
#ifndef PV_WAIT
#error "PV_WAIT must be defined"
#endif
#ifndef CLUSTER_SPLIT
#error "CLUSTER_SPLIT must be defined"
#endif
#if CLUSTER_SPLIT != 0 && CLUSTER_SPLIT != 1
#error "CLUSTER_SPLIT must be 0 or 1"
#endif
// One CTA per SM looping over work tiles. CLUSTER_SPLIT runs one cluster of two CTAs per work
// tile whatever PERSISTENT says (the spec's `persistent`; PERSISTENT is inert there), so that a
// search reaches it by turning one knob from a persistent point.
#define WT_PERSISTENT (PERSISTENT != 0 && CLUSTER_SPLIT == 0)
#if PV_WAIT != 0 && PV_WAIT != 1
#error "PV_WAIT must be 0 or 1"
#endif
// LAZY_RESCALE's threshold: a warp skips O's rescale when none of its rows moved its max
// (Consumer::kLazy). In the OVERLAP loop with PV_WAIT (FA4's order) O was rescaled on every
// key tile, the multiplies filling issue slots the exponentials leave free, and the threshold
// there only added compares (H100, 2026-11-27: 1-3% slower at the D 64 OVERLAP points). Under
// sustained load the board sits at its power cap, where an issued multiply costs energy whether
// or not its slot was free (an FFMA thread-op ~12 pJ above idle against ~0.7 pJ per tensor-core
// FLOP: scripts/alu_energy.py, wgmma_energy.py, 2026-11-28). So at D 128, where the rescale is
// one multiply per score element, a warp-uniform branch now skips it on every tile where no
// row of the warp moved (sustained, paired: 0.981 at (2,16,8192,128) causal, 0.982 on the
// chunked prefill); at D 64 (half a multiply per element, three consumers) the same was 2.8-3.5%
// slower, so that loop keeps rescaling every tile and the knob is inert there (the spec says so).
#if Q_STAGES != 1 && Q_STAGES != 2
#error "Q_STAGES must be 1 or 2 (Q slots of a work tile's rows)"
#endif
// The Q slots allocated: one CTA per work tile never has a next tile's Q to load early.
#define WT_Q_SLOTS (WT_PERSISTENT ? Q_STAGES : 1)
#if BLOCK_N % 16 != 0 || BLOCK_N < 16 || BLOCK_N > 256
#error "BLOCK_N must be a multiple of 16 in 16..256 (wgmma N; TMA box rows)"
#endif
#if STAGES < 2
#error "STAGES must be at least 2"
#endif
#if CONSUMERS != 2 && CONSUMERS != 3
#error "CONSUMERS must be 2 or 3 (the setmaxnreg budgets are set for those)"
#endif
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma-tma needs the arch-specific target sm_90a (wgmma, setmaxnreg): compile with --gpu-architecture=sm_90a"
#endif
// Planted fault for the check scripts: the consumers wait on the wrong parity
// of the K barriers, i.e. they do not wait for the TMA at all.
#ifndef OPTD_FAULT_MBAR_PHASE
#define OPTD_FAULT_MBAR_PHASE 0
#endif

#define WT_THREADS (128 * (CONSUMERS + 1))
// PACK_GQA: query heads per work tile for G = HQ / HKV (the spec's `pack`): G where
// 64 / G rows per head are whole 8-row swizzle atoms of a panel, else 1.
__device__ __forceinline__ int wt_pack(int g) {
    return (PACK_GQA && g >= 2 && 8 % g == 0) ? g : 1;
}
// The panels of a tile at head dim D: 128-byte-swizzled rows of 64 columns, or at D 96
// (no multiple of 64) 64-byte-swizzled rows of 32 columns, three panels (the spec's maps
// take the same swizzle). BYTES is one panel row, and the swizzle's width.
template <int D>
struct WtPanel {
    static constexpr int BYTES = D % 64 == 0 ? 128 : 64;
    static constexpr int COLS = BYTES / 2;
    static constexpr int COUNT = D / COLS;
    static constexpr int KSTEPS = COLS / 16;  // wgmma k-steps (16 columns) per panel
    static_assert(D % COLS == 0, "D must be a multiple of 64, or 96 (three panels of 32 columns)");
    // Byte offset of 16-byte chunk q (columns 8q .. 8q + 7 of a panel) in row r of a panel
    // whose rows start at a 1024-byte-aligned address: the swizzle XORs address bits 4.. with
    // bits 7.. (r % 8 at 128 bytes per row, (r / 2) % 4 at 64).
    static __device__ __forceinline__ unsigned chunk_at(int r, int q) {
        return r * BYTES + ((q ^ ((r * BYTES >> 7) & (BYTES / 16 - 1))) << 4);
    }
};
// TMA loads (and stores) of Q (O) per head and consumer: unpacked, one box of 64 rows
// spans every panel (box_panels: all of D's); packed, one box of R rows per panel
// (box_panels 1), so that each panel keeps its 64 rows together.
#define WT_PANEL_BOXES(D, P) ((P) > 1 ? WtPanel<D>::COUNT : 1)
#define WT_CONSUMER_REGS (CONSUMERS == 2 ? 240 : 160)
// Hopper's (sm_90a: H100, H200, GH200) opt-in shared memory per block, 227 KiB: a D 256 point
// whose layout exceeds it is refused by the gate, and its kernel is compiled as a stub.
#define WT_SMEM_OPTIN_SM90 232448
#define WT_PRODUCER_REGS (CONSUMERS == 2 ? 24 : 32)
// Causal, one CTA per tile: K/V bytes of the group of heads scheduled together.
#define WT_LPT_GROUP_BYTES ((long long)LPT_MIB << 20)

// Shared-memory barriers (static): per Q slot q_full, q_empty, then per stage k_full, v_full,
// k_empty, v_empty.
struct WtBarriers {
    unsigned long long q_full[WT_Q_SLOTS], q_empty[WT_Q_SLOTS];
    unsigned long long k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
    int tile[WT_Q_SLOTS];  // DYNAMIC: the work tile whose Q q_full announces (-1: none left)
#if CLUSTER_SPLIT
    // Rank 0's shared memory is free for rank 1's state (arrived on from rank 0, in rank 1),
    // and rank 1's state has landed (its st.async bytes, in rank 0).
    unsigned long long cs_free, cs_data;
#endif
};

// The CTA's i-th work tile uses Q slot i % WT_Q_SLOTS, whose barriers are in their
// (i / WT_Q_SLOTS)-th phase.
struct QSlot {
    int slot;
    unsigned phase;
    __device__ __forceinline__ explicit QSlot(int i) : slot(i % WT_Q_SLOTS), phase((unsigned)(i / WT_Q_SLOTS) & 1u) {}
};

// Dynamic shared memory: offsets from the base rounded up to 1024 bytes (the
// 128-byte swizzle is a function of address bits 4-9), every tile a set of
// 128-byte-swizzled panels of 64 columns. BYTES is what the launch must give:
// the tiles plus 1024 bytes of slack for the rounding (the spec's smem formula).
template <int D>
struct WtSmem {
    static constexpr int Q_WG = 64 * D * 2;     // one consumer's 64 rows of Q
    static constexpr int KV = BLOCK_N * D * 2;  // one K or V tile
    static constexpr int Q_SLOT = CONSUMERS * Q_WG;  // one work tile's Q
    static constexpr int Q = 0;                        // WT_Q_SLOTS x Q_SLOT
    static constexpr int K = Q + WT_Q_SLOTS * Q_SLOT;  // STAGES x KV
    static constexpr int V = K + STAGES * KV;       // STAGES x KV
    static constexpr int O = V + STAGES * KV;       // EPI_TMA: CONSUMERS x Q_WG
    static constexpr int END = O + EPI_TMA * CONSUMERS * Q_WG;
    // D 256: O alone is 128 fp32 registers per consumer thread; 3 consumers' 160 cannot hold it
    // with S and P (the spec's [[refuse]]: the gate never plans such a point there).
    static constexpr bool REGS_FIT = D < 256 || CONSUMERS == 2;
    static constexpr int BYTES = 1024 + END;
    // Whether the kernel is built at all: at D 256 only the points the gate can admit on a
    // Hopper GPU (at most 227 KiB: 2 consumers, 2 stages of BLOCK_N 64 or 80, no second Q slot,
    // no EPI_TMA buffers); the others compile to a stub that is never launched (a build of a
    // run with D 256 shapes holds every candidate's D 256 kernel, planned there or not).
    // D 64 and 128 build every point, as before.
    static constexpr bool RUNS = D < 256 || (REGS_FIT && BYTES <= WT_SMEM_OPTIN_SM90);
    static_assert(Q_WG % 1024 == 0 && KV % 1024 == 0, "tiles must stay 1024-byte aligned (swizzle atoms)");
    static_assert(Q_WG % (64 * WtPanel<D>::BYTES) == 0, "a consumer's Q is whole panels of 64 rows");
};

// The layout ends at the bytes the spec's smem formula gives the launch.
template <int D>
__device__ __forceinline__ void wt_check_smem() {
    OPTD_CHECK_SMEM(FWD, D, WtSmem<D>::BYTES);
}

// A position in the K/V ring: its slot and the parity of the slot's current fill
// (the mbarrier phase to wait for), advanced once per key tile.
struct RingPos {
    int slot = 0;
    unsigned phase = 0;
    __device__ __forceinline__ void next() {
        if (++slot == STAGES) {
            slot = 0;
            phase ^= 1u;
        }
    }
};

// ---------------------------------------------------------------------------
// Consumer: one warpgroup, 64 query rows.
// ---------------------------------------------------------------------------
template <int D>
struct Consumer {
    static constexpr int NT = BLOCK_N / 8;     // n8 column blocks of S
    static constexpr int PK = BLOCK_N / 16;    // k-steps of O += P V
    float o[D / 2];
    float s[BLOCK_N / 2];
    unsigned p[PK][4];
    using Pan = WtPanel<D>;
    static constexpr bool kLazy = LAZY_RESCALE != 0 && (D >= 128 || !(OVERLAP && PV_WAIT));
    OnlineSoftmax<2, kLazy, Exp2Approx> sm;  // rows g and g + 8
    bool rescale;  // some row of this warp moved its max in the last softmax

    // S and O as m16n8 accumulators (one m-tile): value e of n8 block j.
    __device__ __forceinline__ auto s_at() {
        return [this](int, int j, int e) -> float& { return s[4 * j + e]; };
    }
    __device__ __forceinline__ auto o_at() {
        return [this](int, int j, int e) -> float& { return o[4 * j + e]; };
    }

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
        sm.init();
    }

    // O's element j, with `other` the same element of another partial state, after
    // sm.merge_row gave each row h its factors: o[4 n + e] is row g for e < 2, g + 8 after.
    __device__ __forceinline__ void merge_o(int j, float other, const float (&fs)[2], const float (&fo)[2]) {
        const int h = (j >> 1) & 1;
        o[j] = o[j] * fs[h] + other * fo[h];
    }

    // S = Q K^T (issue only).
    __device__ __forceinline__ void issue_qk(unsigned q_tile, unsigned k_tile) {
        issue_qk_desc(smem_desc_kmajor<Pan::BYTES>(q_tile), smem_desc_kmajor<Pan::BYTES>(k_tile));
    }
    // The same from descriptors the caller built earlier: the OVERLAP loop builds them
    // before its ping-pong turn, so that only the GEMMs follow the turn (FA4's loop has
    // 5 instructions between its turn and its first HGMMA; ours had 19, a dependent
    // chain of descriptor arithmetic, SASS 2026-11-27).
    __device__ __forceinline__ void issue_qk_desc(unsigned long long dq, unsigned long long dk) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const unsigned off_q = (kk / Pan::KSTEPS) * 64 * Pan::BYTES + (kk % Pan::KSTEPS) * 32;
            const unsigned off_k = (kk / Pan::KSTEPS) * BLOCK_N * Pan::BYTES + (kk % Pan::KSTEPS) * 32;
            wgmma_ss<BLOCK_N>(s, desc_advance(dq, off_q), desc_advance(dk, off_k), kk > 0);
        }
        wgmma_commit();
    }

    // O += P V (issue only). V's N (= D) spans Pan::COUNT panels BLOCK_N * Pan::BYTES bytes apart.
    __device__ __forceinline__ void issue_pv(unsigned v_tile) { issue_pv_desc(v_desc(v_tile)); }
    static __device__ __forceinline__ unsigned long long v_desc(unsigned v_tile) {
        return smem_desc_mnmajor<Pan::BYTES>(v_tile, BLOCK_N * Pan::BYTES);
    }
    __device__ __forceinline__ void issue_pv_desc(unsigned long long dv) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < PK; ++kk)
            wgmma_rs<D>(o, p[kk], desc_advance(dv, kk * 16 * Pan::BYTES));
        wgmma_commit();
    }

    // Mask (when the tile needs it) and turn S into probabilities in place;
    // returns the O correction factors of rows g, g + 8 in corr. masked = false:
    // the caller knows no key of the tile is masked for any row of this warpgroup,
    // and the loop calling it carries no mask code (see the loops' peel).
    // row_step: the query position of the thread's second row (g + 8) minus its first's (8;
    // PACK_GQA with 8 positions per head: 0, the rows are two heads at one position).
    // left: the tile crosses the left edge of some row's window (mask it per element there;
    // a separate test so that the loops without a window carry none of its code).
    __device__ __forceinline__ void softmax(int kv0, int row_g, const KeyMask& mask, float sl2, float (&corr)[2],
                                            bool masked = true, int row_step = 8, bool left = false) {
        float bias[2];
        const bool moved = row_max(kv0, row_g, mask, sl2, corr, bias, masked, row_step, left);
        // Warp-uniform: the O rescale is skipped when no row of the warp moved.
        rescale = __any_sync(0xffffffffu, moved);
        m16n8_exp2<1, NT>(s_at(), sm, sl2, bias);
    }

    // The softmax up to the exponentials: mask, row max, O's correction factors and the
    // exponent bias (corr is 1 for a row whose max did not move); whether a row moved.
    __device__ __forceinline__ bool row_max(int kv0, int row_g, const KeyMask& mask, float sl2, float (&corr)[2],
                                            float (&bias)[2], bool masked, int row_step, bool left = false) {
        if (masked && mask.partial(kv0, BLOCK_N, row_g))
            m16n8_mask<1, NT, true>(s_at(), mask, row_g, kv0, 2 * (threadIdx.x & 3), row_step);
        if (left) m16n8_mask_left<1, NT>(s_at(), mask, row_g, kv0, 2 * (threadIdx.x & 3), row_step);
        float mx[2];
        m16n8_row_max<1, NT>(s_at(), sm.m, mx);
        return sm.rescale(mx, sl2, bias, corr);
    }

    // PV_WAIT 1 (FA4's order), after row_max and the wait for the previous tile's P V: O
    // rescaled where rescale_o (warp-uniform: some row of the warp moved, or no kLazy;
    // a row whose max did not move has corr 1), then the exponentials and the packing of P,
    // which ptxas interleaves with the multiplies when they run.
    __device__ __forceinline__ void finish_after_pv(const float (&corr)[2], const float (&bias)[2], float sl2,
                                                    bool rescale_o) {
        if (rescale_o) m16n8_scale_rows<1, D / 8>(o_at(), corr);
        m16n8_exp2<1, NT>(s_at(), sm, sl2, bias);
        pack();
    }

    __device__ __forceinline__ void rescale_and_pack(const float (&corr)[2]) {
        if (rescale) m16n8_scale_rows<1, D / 8>(o_at(), corr);
        pack();
    }

    // OVERLAP: wait for the previous tile's O += P V (issued before this tile's
    // softmax) and rescale O. The wait is in both arms of the rescale branch on
    // purpose. Written once after the softmax, ptxas hoisted the wait to the top of
    // the straight-line block it shared with the softmax, above the exponentials:
    // the softmax ran after the P V instead of under it, in every OVERLAP point
    // (SASS of 12 points: 0 of 66 MUFU.EX2 between wait_group 1 and wait_group 0).
    // A block boundary after the softmax keeps it there: 66 of 66, the same
    // instructions and registers (scripts/sass_loop_stats.py prints the count).
    __device__ __forceinline__ void wait_pv_and_rescale(const float (&corr)[2]) {
        if (rescale) {
            wgmma_wait<0>();
            reg_fence(o);
            m16n8_scale_rows<1, D / 8>(o_at(), corr);
        } else {
            wgmma_wait<0>();
            reg_fence(o);
        }
    }

    __device__ __forceinline__ void pack() {
        // P's A fragment of k-step kk: n8 blocks 2 kk (a0: row g, a1: row g + 8)
        // and 2 kk + 1 (a2, a3), exactly the mma.sync m16n8k16 A layout.
#pragma unroll
        for (int kk = 0; kk < PK; ++kk) {
            p[kk][0] = pack2(s[8 * kk], s[8 * kk + 1]);
            p[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
            p[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
            p[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
        }
    }
};

// A split work tile's end (TAIL_SPLIT): consumer c's (m, l, O) for the shared 64 rows
// merged into consumer 0's. buf: the Q slots, generic address, CONSUMERS x 64 D 2
// bytes, free once every consumer is past its last Q K^T (the first barrier). A thread
// (tw: its index in the warpgroup) holds the same rows and columns in every consumer.
template <int D>
__device__ __forceinline__ void merge_split_tile(Consumer<D>& cs, int c, int tw, unsigned char* buf, float sl2) {
    constexpr int BAR = CONSUMERS + 1;
    constexpr int N = 128 * CONSUMERS;
    float* f = reinterpret_cast<float*>(buf);
    static_assert(CONSUMERS * 64 * D * 2 >= 64 * D * 4, "the Q slots must hold one consumer's fp32 O");
    named_bar_sync(BAR, N);  // every consumer done with Q (and its tiles)
    f[(4 * c + 0) * 128 + tw] = cs.sm.m[0];
    f[(4 * c + 1) * 128 + tw] = cs.sm.m[1];
    f[(4 * c + 2) * 128 + tw] = cs.sm.l[0];
    f[(4 * c + 3) * 128 + tw] = cs.sm.l[1];
    named_bar_sync(BAR, N);
    float own[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = OPTD_NEG_INF;
#pragma unroll
        for (int k = 0; k < CONSUMERS; ++k) mx = fmaxf(mx, f[(4 * k + h) * 128 + tw]);
        float l = 0.f;
#pragma unroll
        for (int k = 0; k < CONSUMERS; ++k) {
            const float mk = f[(4 * k + h) * 128 + tw];
            // A consumer that saw no unmasked key of the row (max -inf) adds nothing.
            const float fk = mk == OPTD_NEG_INF ? 0.f : fast_exp2((mk - mx) * sl2);
            l += f[(4 * k + 2 + h) * 128 + tw] * fk;
            if (k == c) own[h] = fk;
        }
        cs.sm.l[h] = l;
        cs.sm.m[h] = mx;  // (m, l, O) stay one consistent state: STREAM_K merges it again
    }
    m16n8_scale_rows<1, D / 8>(cs.o_at(), own);
    named_bar_sync(BAR, N);  // the max/sum reads done before O overwrites them
#pragma unroll 1
    for (int src = 1; src < CONSUMERS; ++src) {
        if (c == src) {
#pragma unroll
            for (int j = 0; j < D / 2; ++j) f[j * 128 + tw] = cs.o[j];
        }
        named_bar_sync(BAR, N);
        if (c == 0) {
#pragma unroll
            for (int j = 0; j < D / 2; ++j) cs.o[j] += f[j * 128 + tw];
        }
        named_bar_sync(BAR, N);
    }
    // The producer's TMA writes the next work tile's Q here once the consumers arrive
    // on q_empty: order these generic accesses before it.
    fence_proxy_async_smem();
}

// STREAM_K: the end of a stream-K piece (consumer c's rows of tail tile `piece`, some of
// its key tiles). Every piece stores its threads' (m, l, O), unnormalized as the online
// softmax holds them, at its slot, thread-major: a thread holds the same rows and columns
// in every CTA, so no layout changes hands (merge_split_tile's idea, through global
// memory). Then it counts itself in on the (tail tile, consumer) semaphore; the piece that
// brings the count to last - first + 1 resets it and merges the others into its registers
// (OnlineSoftmax::merge_row, Consumer::merge_o), and only it stores O. Returns whether this warpgroup
// stores. Ordering as decode.cu's dec_arrive_last (checked on the H100): the warpgroup's
// named barrier orders its stores before tw 0's atom.acq_rel.gpu, whose release is
// cumulative; tw 0's acquire and the second barrier order the merge's loads after every
// arrival, and the loads go through L2 (ld.global.cg), never a stale L1 line.
template <int D, int kFloats, class Sched>
__device__ __forceinline__ bool stream_k_merge(Consumer<D>& cs, const Sched& sched, int piece, int slot, int first,
                                               int last, int c, int tw, float* part, unsigned* sem, int* flag,
                                               float sl2) {
    constexpr int BAR = CONSUMERS + 2;  // + c: the epilogue's per-warpgroup barrier, free until then
    auto at = [&](int sl) { return part + (long long)(sl * CONSUMERS + c) * kFloats * 128 + tw; };
    float* mine = at(slot);
    mine[0] = cs.sm.m[0];
    mine[128] = cs.sm.m[1];
    mine[256] = cs.sm.l[0];
    mine[384] = cs.sm.l[1];
#pragma unroll
    for (int j = 0; j < D / 2; ++j) mine[(4 + j) * 128] = cs.o[j];
    named_bar_sync(BAR + c, 128);
    if (tw == 0) {
        unsigned prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(prev) : "l"(sem) : "memory");
        const int is_last = prev == (unsigned)(last - first);
        // Nobody else touches it in this launch now: every piece is in.
        if (is_last) asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(sem) : "memory");
        *reinterpret_cast<volatile int*>(flag) = is_last;
    }
    named_bar_sync(BAR + c, 128);
    if (!*reinterpret_cast<volatile int*>(flag)) return false;
    const int self = (int)blockIdx.x;
#pragma unroll 1
    for (int j = first; j <= last; ++j) {
        if (j == self) continue;
        const float* other = at(sched.slot_of(j, piece));
        float fs[2], fo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float mo = __ldcg(other + 128 * h), lo = __ldcg(other + 128 * (2 + h));
            cs.sm.merge_row(h, mo, lo, sl2, fs[h], fo[h]);
        }
#pragma unroll
        for (int j2 = 0; j2 < D / 2; ++j2) cs.merge_o(j2, __ldcg(other + (4 + j2) * 128), fs, fo);
    }
    return true;
}

#if CLUSTER_SPLIT
// CLUSTER_SPLIT: the end of a work tile computed by a cluster of two CTAs, each half of its
// key tiles (TileScheduler::keys). Rank 1's warpgroups send their threads' (m, l, O) into
// rank 0's shared memory, where rank 0's warpgroups merge them into their registers
// (OnlineSoftmax::merge_row, Consumer::merge_o, as stream_k_merge) and store O; rank 1 stores nothing. Returns whether this
// warpgroup stores. `buf`: rank 0's Q slot and K/V ring, free once every consumer of rank 0
// is done with the tile (non-persistent: the producer loads nothing after it); thread-major
// 16-byte chunks, chunk q of thread tw of warpgroup c at ((c J4 + q) 128 + tw) 16, so a
// warp's accesses are 512 contiguous bytes. In a split tile (TAIL_SPLIT) only consumer 0
// holds a state. Ordering: rank 0's consumers meet on named barrier CS_BAR once done with
// the smem, then one thread sets the expected bytes on cs_data and arrives on rank 1's
// cs_free (release, cluster scope); rank 1 waits for it (acquire) before its st.async,
// whose bytes complete cs_data. Neither CTA's shared memory is touched after its owner
// could have exited: rank 1 waits for cs_free before rank 0 can be done, and rank 0 waits
// for cs_data, which only rank 1's stores complete (senders may exit with st.async in
// flight, as decode-cluster's COMBINE 2 does).
template <int D>
__device__ __forceinline__ bool cluster_merge(Consumer<D>& cs, int c, int tw, bool split_tile, bool stores,
                                              WtBarriers& bars, unsigned buf, float sl2) {
    constexpr int J4 = (4 + D / 2) / 4;  // 16-byte chunks per thread: (m, l) and O's D / 2
    constexpr int CS_BAR = 2 * CONSUMERS + 3;  // after the CTA's final barrier's 2 CONSUMERS + 2
    static_assert((4 + D / 2) % 4 == 0, "a thread's state is whole 16-byte chunks");
    static_assert(CONSUMERS * J4 * 128 * 16 <= WtSmem<D>::O, "rank 0's Q slot and K/V ring hold rank 1's states");
    const bool holds = !split_tile || c == 0;
    const unsigned chunk0 = buf + (unsigned)((c * J4 * 128 + tw) * 16);
    if (cluster_ctarank() != 0) {
        if (!holds) return false;
        cluster_mbar_wait(smem_addr(&bars.cs_free), 0);
        const unsigned dst = dsmem_map(chunk0, 0), bar = dsmem_map(smem_addr(&bars.cs_data), 0);
        dsmem_st_async_f32x4(dst, make_float4(cs.sm.m[0], cs.sm.m[1], cs.sm.l[0], cs.sm.l[1]), bar);
#pragma unroll
        for (int q = 1; q < J4; ++q)
            dsmem_st_async_f32x4(dst + q * 128 * 16, make_float4(cs.o[4 * q - 4], cs.o[4 * q - 3], cs.o[4 * q - 2], cs.o[4 * q - 1]),
                                 bar);
        return false;
    }
    named_bar_sync(CS_BAR, 128 * CONSUMERS);  // every consumer of rank 0 is done with Q, K and V
    if (c == 0 && tw == 0) {
        mbar_arrive_expect_tx(smem_addr(&bars.cs_data), (split_tile ? 1 : CONSUMERS) * J4 * 128 * 16);
        dsmem_mbar_arrive(dsmem_map(smem_addr(&bars.cs_free), 1));
    }
    if (!holds) return stores;
    cluster_mbar_wait(smem_addr(&bars.cs_data), 0);
    float4 ml;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(ml.x), "=f"(ml.y), "=f"(ml.z), "=f"(ml.w) : "r"(chunk0));
    float fs[2], fo[2];
    cs.sm.merge_row(0, ml.x, ml.z, sl2, fs[0], fo[0]);
    cs.sm.merge_row(1, ml.y, ml.w, sl2, fs[1], fo[1]);
#pragma unroll
    for (int q = 1; q < J4; ++q) {
        float4 x;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                     : "r"(chunk0 + q * 128 * 16));
        cs.merge_o(4 * q - 4, x.x, fs, fo);
        cs.merge_o(4 * q - 3, x.y, fs, fo);
        cs.merge_o(4 * q - 2, x.z, fs, fo);
        cs.merge_o(4 * q - 1, x.w, fs, fo);
    }
    return stores;
}
#endif

// Ping-pong turns: consumer c waits on barrier 1 + c; after issuing its GEMMs
// it lets consumer c + 1 (round robin) go. 256 = the waiting warpgroup's 128
// threads + the arriving one's.
__device__ __forceinline__ void turn_wait(int c) {
    if (PINGPONG) named_bar_sync(1 + c, 256);
}
__device__ __forceinline__ void turn_pass(int c) {
    if (PINGPONG) named_bar_arrive(1 + (c + 1) % CONSUMERS, 256);
}

template <int D>
__device__ __forceinline__ void wgmma_tma_fwd(OPTD_ARGS, const optd_tensor_map* tm_q, const optd_tensor_map* tm_k,
                                              const optd_tensor_map* tm_v, const optd_tensor_map* tm_o) {
    using L = WtSmem<D>;
    using Pan = WtPanel<D>;
    wt_check_smem<D>();
    constexpr int Q_WG_BYTES = L::Q_WG;  // one consumer's 64 rows
    constexpr int KV_BYTES = L::KV;      // one K or V tile
    (void)n_splits;  // STREAM_K only
    (void)o_partial;
    (void)lse_partial;
    (void)q;
    (void)k;
    (void)v;
    (void)tm_o;  // EPI_TMA = 0: O stored from registers

    extern __shared__ unsigned char wt_smem[];
    __shared__ WtBarriers bars;
    __shared__ int sk_last[CONSUMERS];  // STREAM_K: whether the warpgroup's piece came in last
    const unsigned base = (smem_addr(wt_smem) + 1023u) & ~1023u;
    const unsigned s_q = base + L::Q;
    const unsigned s_k = base + L::K;
    const unsigned s_v = base + L::V;
    const unsigned s_o = base + L::O;  // EPI_TMA only

    const int tid = threadIdx.x;
    // Broadcast from lane 0: ptxas then knows the warpgroup index (and all that
    // derives from it) is warp-uniform; a wgmma under a branch it thinks
    // divergent is serialized (C7518).
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    // PACK_GQA: P query heads share a work tile (1 unpacked), R query positions of each
    // per consumer, TP per work tile; the scheduler's heads are b * heads_t + (query head,
    // or K/V head when packed).
    const int P = wt_pack(heads_q / heads_kv);
    const int R = 64 / P, TP = CONSUMERS * R;
    const int heads_t = heads_q / P;
    const int n_mb = (seq_q + TP - 1) / TP;
    // The work tiles of this CTA, in the same order for the producer and every
    // consumer (common/tile_scheduler.cuh). Persistent: rounds in a snake
    // order (a plain grid stride gave some CTAs only the heaviest causal tiles
    // when the grid is a multiple of the tiles per head: 0.56x at
    // (4,16,4096,64)), head-major so that the CTAs running at once share a
    // head's K/V in L2 (tiles ordered by weight across heads streamed every
    // head's K/V from DRAM: 13% slower at (2,16,8192,128) causal). One CTA per
    // tile, causal: longest first across groups of heads whose K/V fit
    // WT_LPT_GROUP_BYTES (K/V counted per K/V head: the heads_q / heads_kv
    // query heads of one K/V head share it).
    TileScheduler<WT_PERSISTENT, STREAM_K != 0, 1 + CLUSTER_SPLIT> sched(n_mb, batch * heads_t, heads_q / heads_kv / P, causal != 0,
                                                        2ll * seq_k * D * (long long)sizeof(elem_t), WT_LPT_GROUP_BYTES);
    // STREAM_K: the last round's work tiles in key-range pieces over every CTA (causal: only
    // a grid of one partial round; the scheduler decides, the same in every role), each
    // piece's (m, l, O) through
    // o_partial: 2 pieces per CTA of SK_THREAD_FLOATS x 128 floats per consumer, a
    // semaphore per (tail tile, consumer) in lse_partial's words from n_splits rows.
    constexpr int SK_THREAD_FLOATS = 4 + D / 2;
    const long long rows_total = (long long)batch * heads_q * seq_q;
    // Bottom-right causal: row i sees keys <= i + seq_k - seq_q (and, windowed,
    // > i + seq_k - seq_q - window).
    // optd_window(): 0, and every window test folded away, in a build without the window's
    // code (OPTD_BUILD_WINDOW 0: the kernels of before windows, instruction for instruction).
    const KeyMask mask(seq_k, causal != 0, optd_causal_offset(seq_q, seq_k), optd_window(window));
    // Key tiles any row of query tile m sees, [kv.first(m), kv.end(m)): from the window's
    // start for its first query position to the causal end for its last (packed: the
    // positions, TP per tile, that the masks use). The producer and the consumers take a
    // work tile's range from sched.keys(w, kv) alone.
    const KeyTiles kv(mask, TP, BLOCK_N);
    // Not with a window (whole tiles, as where the scratch is short; the spec's sk_can):
    // the scheduler's piece arithmetic stays the unwindowed one (TileScheduler::keys).
    // Tested on an opaque copy of `window`: on `window` itself the compiler specialized the
    // consumers' per-tile code for window 0 under stream-K (D 64: 180 / 420 bytes of spill
    // stores / loads, against 176 / 360 this way, as before windows).
    if (STREAM_K) {
        int no_window = 1;
        if constexpr (OPTD_BUILD_WINDOW != 0) asm("mov.b32 %0, %1;" : "=r"(no_window) : "r"((int)(window == 0)));
        const bool room = 2ll * gridDim.x * CONSUMERS * 128 * SK_THREAD_FLOATS <= (long long)n_splits * rows_total * D &&
                          (long long)((n_mb * batch * heads_t) % gridDim.x) * CONSUMERS <= rows_total && no_window;
        sched.enable_stream_k(KvTiles{TP, BLOCK_N, seq_k, optd_causal_offset(seq_q, seq_k), causal != 0}, room);
    }
    // DYNAMIC (persistent, causal): work tiles longest first from a global counter
    // (common/tile_scheduler.cuh), kept in the first two split semaphore words
    // (lse_partial from word n_splits * rows: zero at launch, left zero).
    const bool dynamic = DYNAMIC && WT_PERSISTENT && causal != 0 && !sched.stream_k();
    unsigned* const dyn_words = reinterpret_cast<unsigned*>(lse_partial + n_splits * rows_total);
    (void)dyn_words;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < WT_Q_SLOTS; ++s) {
            mbar_init(smem_addr(&bars.q_full[s]), 1);
            mbar_init(smem_addr(&bars.q_empty[s]), 4 * CONSUMERS);
        }
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(smem_addr(&bars.k_full[s]), 1);
            mbar_init(smem_addr(&bars.v_full[s]), 1);
            mbar_init(smem_addr(&bars.k_empty[s]), 4 * CONSUMERS);  // one arrival per consumer warp
            mbar_init(smem_addr(&bars.v_empty[s]), 4 * CONSUMERS);
        }
#if CLUSTER_SPLIT
        mbar_init(smem_addr(&bars.cs_free), 1);
        mbar_init(smem_addr(&bars.cs_data), 1);
#endif
        mbar_fence_init();
    }
    __syncthreads();
#if CLUSTER_SPLIT
    // Every thread of both CTAs (before the producer's idle warps exit): each one's
    // barriers are initialized before the other can arrive on them (cluster_merge).
    cluster_sync();
#endif

    if (wg == 0) {
        // ---- producer ------------------------------------------------------
        reg_dealloc<WT_PRODUCER_REGS>();
        // Warps 1-3 have nothing to do: they exit (FA4's producer does the same), so the
        // schedulers hold only warps that issue (ncu, 2026-11-27: 4.00 active warps per
        // scheduler against FA4's 3.25). The CTA's end is a named barrier over the rest.
        if (tid >= 32) return;
        if (tid == 0) {
            tma_prefetch_map(tm_q);
            tma_prefetch_map(tm_k);
            tma_prefetch_map(tm_v);
            if (EPI_TMA) tma_prefetch_map(tm_o);
            int it = 0;  // K/V tiles loaded so far: ring slot it % STAGES
            // Work tile w (the CTA's i-th): Q, then its key tiles. Dynamic: its index idx
            // goes to the consumers through bars.tile, under the Q barriers.
            auto load_tile = [&](const WorkTile& w, int i, int idx) {
                const int m_block = w.m_block;
                const int m0 = m_block * TP;
                const int b = w.bh / heads_t, ht = w.bh - b * heads_t;
                const int kvh = P > 1 ? ht : optd_kv_head(ht, heads_q, heads_kv);
                // Q: the consumers of the work tile that used this slot before must be
                // done with it (Q_STAGES 2: the one before the previous, long done).
                const QSlot qs(i);
                const unsigned qf = smem_addr(&bars.q_full[qs.slot]);
                const unsigned q_dst = s_q + qs.slot * L::Q_SLOT;
                mbar_wait(smem_addr(&bars.q_empty[qs.slot]), qs.phase ^ 1);
                if (dynamic) bars.tile[qs.slot] = idx;  // published by the arrive below (release)
                mbar_arrive_expect_tx(qf, CONSUMERS * Q_WG_BYTES);
#pragma unroll
                for (int c = 0; c < CONSUMERS; ++c)  // packed: head ht P + j's R rows at row j R of each panel
                    for (int j = 0; j < P; ++j)
                        for (int pn = 0; pn < WT_PANEL_BOXES(D, P); ++pn)
                            tma_load_5d(q_dst + c * Q_WG_BYTES + pn * 64 * Pan::BYTES + j * R * Pan::BYTES, tm_q, qf, 0, m0 + R * c, pn,
                                        ht * P + j, b);
                // Key tiles [kr.lo, kr.hi): the whole tile's (a window's first to the causal
                // end), or a stream-K piece's; the consumers walk the same ones.
                const KeyRange kr = sched.keys(w, kv);
                // Not unrolled: one thread issuing TMA has time to spare, and
                // ptxas unrolled this loop 4x into the producer's 24 or 32
                // registers, spilling the K/V coordinates (b, K/V head) around
                // every copy.
#pragma unroll 1
                for (int t = kr.lo; t < kr.hi; ++t, ++it) {
                    const int s = it % STAGES;
                    const unsigned ph = (it / STAGES) & 1;
                    mbar_wait(smem_addr(&bars.k_empty[s]), ph ^ 1);
                    mbar_arrive_expect_tx(smem_addr(&bars.k_full[s]), KV_BYTES);
                    tma_load_5d(s_k + s * KV_BYTES, tm_k, smem_addr(&bars.k_full[s]), 0, t * BLOCK_N, 0, kvh, b);
                    mbar_wait(smem_addr(&bars.v_empty[s]), ph ^ 1);
                    mbar_arrive_expect_tx(smem_addr(&bars.v_full[s]), KV_BYTES);
                    tma_load_5d(s_v + s * KV_BYTES, tm_v, smem_addr(&bars.v_full[s]), 0, t * BLOCK_N, 0, kvh, b);
                }
            };
            if (dynamic) {
                // The next tile is taken once this one's last K/V load is issued (taken
                // earlier, a CTA would hold it while others run out). Q_STAGES 1: its Q
                // then waits for the consumers' last Q K^T of this one; 2: it loads at
                // once, into the other slot, under this tile's last key tiles.
                int idx = (int)blockIdx.x;
                for (int i = 0;; ++i) {
                    if (idx >= sched.total()) {
                        // None left: the consumers read -1 and stop.
                        const QSlot qs(i);
                        mbar_wait(smem_addr(&bars.q_empty[qs.slot]), qs.phase ^ 1);
                        bars.tile[qs.slot] = -1;
                        mbar_arrive(smem_addr(&bars.q_full[qs.slot]));
                        break;
                    }
                    load_tile(sched.lpt_tile(idx), i, idx);
                    idx = sched.next_dynamic(dyn_words);
                }
            } else {
                for (int r = 0, n = 0; r < sched.rounds(); ++r) {
                    if (!sched.has(r)) continue;
                    const int i = n++;  // work tiles this CTA has taken: Q slot phase
                    load_tile(sched.tile(r), i, 0);
                }
            }
        }
    } else {
        // ---- consumers -----------------------------------------------------
        reg_alloc<WT_CONSUMER_REGS>();
        const int c = wg - 1;
        const int lane = tid & 31;
        const int w = (tid / 32) & 3;
        if (PINGPONG && c == CONSUMERS - 1) named_bar_arrive(1, 256);  // consumer 0 goes first
        RingPos ring;  // K/V ring position of the work tile's first key tile
        // Work tile wt, the CTA's i-th.
        auto run_tile = [&](const WorkTile& wt, int i) {
            const int bh = wt.bh;
            const int m0 = wt.m_block * TP;
            // Key tiles [kt0, n_tiles) of the work tile, those the producer loads: all of
            // them, or a stream-K piece's.
            const bool piece = STREAM_K && wt.piece >= 0;
            // Part of the tile's key tiles: a stream-K piece's, or this CTA's share of a
            // CLUSTER_SPLIT tile.
            const bool partial = piece || CLUSTER_SPLIT;
            const KeyRange kr = sched.keys(wt, kv);
            const int kt0 = kr.lo, n_tiles = kr.hi;
            // A tile of at most 64 rows: every consumer takes them, a share of the keys each
            // (not in packed tiles).
            const bool split = TAIL_SPLIT && P == 1 && seq_q - m0 <= 64;
            const int row0 = split ? m0 : m0 + R * c;  // the warpgroup's first query position
            // This thread's rows r_g and r_g + 8 of the warpgroup's 64 are query positions
            // row_g and row_g + row_step (packed: row r is position r % R of head r / R).
            const int r_g = 16 * w + (lane >> 2);
            const int row_g = row0 + r_g % R;
            const int row_step = R >= 16 ? 8 : 0;
            // Key tiles this warpgroup computes: those up to its last row (causal);
            // none when all its rows are past SQ. The rest it only waits for and releases.
            const int n_wg_all = row0 >= seq_q ? 0 : max(mask.keys_before(row0 + R) + BLOCK_N - 1, 0) / BLOCK_N;
            const int n_wg = partial ? min(n_tiles, n_wg_all) : n_wg_all;
            const QSlot qs(i);
            const unsigned q_tile = s_q + qs.slot * L::Q_SLOT + (split ? 0 : c) * Q_WG_BYTES;
            const float sl2 = softmax_scale * OPTD_LOG2E;

            Consumer<D> cs;
            cs.init();
            mbar_wait(smem_addr(&bars.q_full[qs.slot]), qs.phase);

            // Every wgmma is issued and waited for in one straight-line stretch:
            // ptxas serializes wgmma whose wait it cannot pair up across branches
            // (C7514/C7517/C7518). Hence separate loops for the tiles this
            // warpgroup computes and the ones it only releases (skip_tile).
            // Ring positions are RingPos cursors advanced once per key tile, in key
            // order (ring: this work tile's first), as FA4 advances an (index, phase)
            // pair, instead of recomputing (it0 + t) % STAGES and its phase at every
            // access (ncu had counted 1.8x FA4's uniform-datapath instructions). Timed
            // against the recomputing version: neutral (best points 0.999, medium set
            // 0.991, inside the rounds' spreads; docs/HOPPER.md).
            auto k_full = [&](const RingPos& p) { return smem_addr(&bars.k_full[p.slot]); };
            auto v_full = [&](const RingPos& p) { return smem_addr(&bars.v_full[p.slot]); };
            auto release = [&](unsigned long long* bar_array, const RingPos& p) {
                __syncwarp();
                if (lane == 0) mbar_arrive(smem_addr(&bar_array[p.slot]));
            };
            auto k_tile = [&](const RingPos& p) { return s_k + p.slot * KV_BYTES; };
            auto v_tile = [&](const RingPos& p) { return s_v + p.slot * KV_BYTES; };
            const bool split_tile = TAIL_SPLIT && split;
            // Ping-pong turns, one per key tile, except in a split tile: there every
            // consumer computes different key tiles, and turns taken in key order
            // would chain consumer c's tile t behind consumer c - 1's whole tile
            // t - 1 (measured: no faster than one consumer walking them all).
            // split_tile is the same for every consumer, so the turns stay in step.
            auto turn_in = [&]() {
                if (!split_tile) turn_wait(c);
            };
            auto turn_out = [&]() {
                if (!split_tile) turn_pass(c);
            };
            // A tile this warpgroup does not compute: waited for and released, its
            // ping-pong turn kept in step; p moves on to the next tile.
            auto skip_tile = [&](RingPos& p) {
                mbar_wait(k_full(p), p.phase);
                mbar_wait(v_full(p), p.phase);
                turn_in();
                turn_out();
                release(bars.k_empty, p);
                release(bars.v_empty, p);
                p.next();
            };
            // Q is no longer read: the producer may load the next work tile's Q and
            // go on to its K/V while this one's last P V and epilogue run. Once per
            // work tile per warp, right after the warpgroup's last Q K^T (a split
            // tile: after the merge, which uses the Q slots).
            auto q_done = [&]() {
                __syncwarp();
                if (lane == 0) mbar_arrive(smem_addr(&bars.q_empty[qs.slot]));
            };
            // `cur`: the first key tile not yet released; `next` its index.
            RingPos cur = ring;
            int next = kt0;
            // Window: the first tile the warpgroup computes holds its first row's first key
            // (a later consumer's rows start further right than the work tile's first row;
            // the tiles before it are only waited for and released), and tiles before
            // n_left cross the left edge of some row's window (its last row's is the
            // rightmost): they are masked on the left per element, outside the plain loops
            // (below). kWin false, a build without the window's code: the loops of before,
            // as written.
            constexpr bool kWin = OPTD_BUILD_WINDOW != 0;
            const int wg0 = kWin ? max(kt0, mask.keys_from(row0) / BLOCK_N) : kt0;
            const int n_left = kWin ? min(n_wg, (mask.first_key(row0 + R - 1) + BLOCK_N - 1) / BLOCK_N) : 0;
            if (OVERLAP && !split_tile && n_wg > wg0) {
                if constexpr (kWin) {
                    for (; next < wg0; ++next) skip_tile(cur);  // left of this warpgroup's rows
                }
                RingPos kp = cur;  // K of tile t; cur follows V of tile t - 1
                const unsigned long long dq = smem_desc_kmajor<Pan::BYTES>(q_tile);
                // Tile wg0: S only.
                mbar_wait(k_full(kp), kp.phase ^ OPTD_FAULT_MBAR_PHASE);
                turn_wait(c);
                cs.issue_qk(q_tile, k_tile(kp));
                turn_pass(c);
                wgmma_wait<0>();
                reg_fence(cs.s);
                release(bars.k_empty, kp);
                kp.next();
                float corr[2];
                cs.softmax(wg0 * BLOCK_N, row_g, mask, sl2, corr, true, row_step, kWin && wg0 < n_left);
                cs.rescale_and_pack(corr);
                // Tile t: S_t, then the PV of t - 1; softmax of t under that PV. masked: the
                // right edge's test and masking (SK, the causal diagonal); left: the window's
                // left edge, unconditionally (only tiles before n_left get it).
                auto step = [&](int t, bool masked, bool left) {
                    unsigned long long dk = smem_desc_kmajor<Pan::BYTES>(k_tile(kp)), dv = cs.v_desc(v_tile(cur));
                    // Materialized here: without the fence the compiler sinks the arithmetic
                    // back after the turn (the same SASS as issue_qk(q_tile, k_tile)).
                    asm volatile("" : "+l"(dk), "+l"(dv));
                    mbar_wait(k_full(kp), kp.phase ^ OPTD_FAULT_MBAR_PHASE);
                    turn_wait(c);
                    cs.issue_qk_desc(dq, dk);
                    // V of t - 1 after S_t is issued (FA4's order): the Q K^T needs only K.
                    mbar_wait(v_full(cur), cur.phase);
                    cs.issue_pv_desc(dv);
                    turn_pass(c);
                    wgmma_wait<1>();
                    reg_fence(cs.s);
                    release(bars.k_empty, kp);
                    kp.next();
                    if constexpr (PV_WAIT) {
                        float bias[2];
                        const bool moved = cs.row_max(t * BLOCK_N, row_g, mask, sl2, corr, bias, masked, row_step, left);
                        // Warp-uniform: without kLazy every row moves (corr may still be 1).
                        const bool rescale_o = !cs.kLazy || __any_sync(0xffffffffu, moved);
                        wgmma_wait<0>();
                        reg_fence(cs.o);
                        release(bars.v_empty, cur);
                        cur.next();
                        cs.finish_after_pv(corr, bias, sl2, rescale_o);
                    } else {
                        cs.softmax(t * BLOCK_N, row_g, mask, sl2, corr, masked, row_step, left);
                        cs.wait_pv_and_rescale(corr);
                        release(bars.v_empty, cur);
                        cur.next();
                        cs.pack();
                    }
                };
                // The loop peeled: tiles no row of this warpgroup masks (every key < SK,
                // and causal: at or below the diagonal of its first row, row0) run in a
                // loop without the mask code, the rest (the ragged last tile, the causal
                // diagonal) in a second one. One loop with the mask check inside held
                // ~230 instructions of per-key compares and selects in the steady state's
                // text and a branch between the Q K^T wait and the row max; the plain
                // loop has 442 instructions against 692 (D 64, BLOCK_N 128, 3 consumers;
                // 620 against 877 at D 128 without OVERLAP), the same registers and the
                // softmax still under the P V (scripts/sass_loop_stats.py). FA4 splits
                // its loop the same way. (The one-loop form, a knob PEEL 0 for a while, was
                // slower at every point timed: 0.1-4% on the H200, 2026-11-26.)
                // Window: the tiles before n_left cross the left edge of some row's window.
                // They run in the masked loop too, before the plain tiles: an outer loop takes
                // the masked loop twice, left edge then right (with a small W one tile crosses
                // both edges, and W = 1 has no plain tile), the left mask behind a
                // warp-uniform test (never true without a window), so the plain loop is the
                // only one in between. A third peeled copy for the left edge instead moved
                // ptxas's allocation of the plain loop without a window: 431 instructions
                // against 423 at D 64 (3 consumers, BLOCK_N 128), 419 this way.
                const int n_plain = max(wg0 + 1, min(n_wg, mask.keys_before(row0 + 1) / BLOCK_N));
                if constexpr (kWin) {
                    int t = wg0 + 1;
                    for (;;) {
                        for (; t < n_wg && (t < n_left || t >= n_plain); ++t) step(t, true, t < n_left);
                        if (t >= n_wg) break;
                        for (; t < n_plain; ++t) step(t, false, false);
                    }
                } else {
                    for (int t = wg0 + 1; t < n_plain; ++t) step(t, false, false);
                    for (int t = n_plain; t < n_wg; ++t) step(t, true, false);
                }
                q_done();
                mbar_wait(v_full(cur), cur.phase);
                cs.issue_pv(v_tile(cur));
                wgmma_wait<0>();
                reg_fence(cs.o);
                release(bars.v_empty, cur);
                cur.next();
                next = n_wg;
            } else if (!OVERLAP || split_tile) {
                // Without OVERLAP (and in a split tile): the tiles this warpgroup computes,
                // one GEMM pair each, waited for before the next. A split tile's consumer c
                // takes tiles c, c + CONSUMERS, ... and waits for and releases the others
                // in key order (a pipelined schedule would deadlock there: tile t's V would
                // be released only after waiting for K of t + CONSUMERS, which the producer
                // loads after V of t + CONSUMERS - 1). (A single loop over every tile with a
                // computed/released branch cost the 160-register consumers of D 128 a spill
                // and serialized wgmma, C7512, even for unsplit tiles.)
                const int step = split_tile ? CONSUMERS : 1;
                auto tile = [&](int t, bool masked, bool left) {
                    for (; next < t; ++next) skip_tile(cur);
                    unsigned long long dq = smem_desc_kmajor<Pan::BYTES>(q_tile), dk = smem_desc_kmajor<Pan::BYTES>(k_tile(cur));
                    asm volatile("" : "+l"(dq), "+l"(dk));  // built before the turn, as in the OVERLAP loop
                    mbar_wait(k_full(cur), cur.phase ^ OPTD_FAULT_MBAR_PHASE);
                    turn_in();
                    cs.issue_qk_desc(dq, dk);
                    turn_out();
                    wgmma_wait<0>();
                    reg_fence(cs.s);
                    release(bars.k_empty, cur);
                    float corr[2];
                    cs.softmax(t * BLOCK_N, row_g, mask, sl2, corr, masked, row_step, left);
                    cs.rescale_and_pack(corr);
                    mbar_wait(v_full(cur), cur.phase);
                    cs.issue_pv(v_tile(cur));
                    wgmma_wait<0>();
                    reg_fence(cs.o);
                    release(bars.v_empty, cur);
                    cur.next();
                    next = t + 1;
                };
                // Peeled as the OVERLAP loop above: unmasked tiles without mask code, the
                // right edge masked; ahead of them the window's left-edge tiles (none without
                // one) in a third copy with both edges' masks (here the OVERLAP loop's
                // outer-loop form cost the plain loop 10-28 instructions at D 128 and 256
                // without a window, the third copy -5 to +4). tile() waits for and releases
                // the tiles before wg0 (and a split tile's other consumers').
                const int n_plain = min(n_wg, mask.keys_before(row0 + 1) / BLOCK_N);
                int t = wg0 + (split_tile ? c : 0);
                if constexpr (kWin) {
                    for (; t < n_left; t += step) tile(t, true, true);
                }
                for (; t < n_plain; t += step) tile(t, false, false);
                for (; t < n_wg; t += step) tile(t, true, false);
                if (!split_tile) q_done();
            } else {
                q_done();  // OVERLAP, no rows of this warpgroup: Q never read
            }
            // Tiles above this warpgroup's rows (causal), with all its rows past SQ, or
            // a split tile's last ones of other consumers: wait for them (a slot is
            // reused only after every consumer is done) and release them.
            for (; next < n_tiles; ++next) skip_tile(cur);
            if (split_tile) {
                merge_split_tile<D>(cs, c, tid & 127, wt_smem + (base - smem_addr(wt_smem)) + L::Q + qs.slot * L::Q_SLOT, sl2);
                q_done();
            }
            ring = cur;
            // Split tile: consumer 0 holds the merged rows, the others store nothing.
            bool stores = !(split_tile && c != 0);
#if CLUSTER_SPLIT
            // The cluster's other half of the key tiles merged in (rank 0 stores, rank 1 not).
            stores = cluster_merge<D>(cs, c, tid & 127, split_tile, stores, bars, s_q, sl2);
#endif
            // A stream-K piece: the warpgroup's (m, l, O) out, and the last piece of the
            // tail tile to finish merges them all and stores.
            if (STREAM_K && piece && stores && row0 < seq_q) {
                const int first = sched.first_piece(wt.piece), last = sched.last_piece(wt.piece);
                if (first < last) {
                    float* part = o_partial;
                    unsigned* sem = reinterpret_cast<unsigned*>(lse_partial + n_splits * rows_total) + wt.piece * CONSUMERS + c;
                    stores = stream_k_merge<D, SK_THREAD_FLOATS>(cs, sched, wt.piece, wt.slot, first, last, c, tid & 127, part,
                                                                 sem, &sk_last[c], sl2);
                }
            }

            // ---- epilogue: O / l, rows < SQ -----------------------------------
            const int tq = lane & 3;
            const int b = bh / heads_t, ht = bh - b * heads_t;
            if (EPI_TMA) {
                // Through this warpgroup's O buffer and one TMA store of its 64 x D box
                // (rows past SQ are not written: the map's bounds). tw 0 issues the
                // stores; its previous one must have read the buffer before it is
                // written again. The 16-byte chunk q of row r of a 64-column panel sits
                // at chunk q ^ (r % 8) (the map's 128-byte swizzle; WtPanel::chunk_at): for
                // one n8 block the quad's four 4-byte stores and the warp's eight rows land
                // in 32 different banks (at D 96's 64-byte swizzle too: rows 2i and 2i + 1
                // share an XOR pattern but sit 16 banks apart).
                const int tw = tid & 127;
                const unsigned buf = s_o + c * Q_WG_BYTES;
                constexpr int EPI_BAR = CONSUMERS + 2;  // + c: ping-pong 1..C, merge C + 1
                if (tw == 0) bulk_wait_read<0>();
                named_bar_sync(EPI_BAR + c, 128);
                if (stores) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = 16 * w + (lane >> 2) + 8 * h;  // row in the warpgroup's 64
                        const float l = quad_sum(cs.sm.l[h]);
                        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
                        for (int j = 0; j < D / 8; ++j) {
                            constexpr int CH = Pan::COLS / 8;  // n8 blocks (16-byte chunks) per panel row
                            const unsigned at = buf + (j / CH) * 64 * Pan::BYTES + Pan::chunk_at(r, j % CH) + 4 * tq;
                            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at),
                                         "r"(pack2(cs.o[4 * j + 2 * h] * inv, cs.o[4 * j + 2 * h + 1] * inv))
                                         : "memory");
                        }
                    }
                }
                fence_proxy_async_smem();
                named_bar_sync(EPI_BAR + c, 128);
                if (tw == 0 && stores && row0 < seq_q) {
                    for (int j = 0; j < P; ++j)  // packed: head ht P + j's R rows, a box per panel
                        for (int pn = 0; pn < WT_PANEL_BOXES(D, P); ++pn)
                            tma_store_5d(tm_o, buf + pn * 64 * Pan::BYTES + j * R * Pan::BYTES, 0, row0, pn, ht * P + j, b);
                    bulk_commit();
                }
            } else {
                // From registers through O's strides.
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = row_g + row_step * h;         // query position
                    const int head = ht * P + (r_g + 8 * h) / R;  // packed: the row's head
                    const float l = quad_sum(cs.sm.l[h]);
                    const float inv = l > 0.f ? 1.f / l : 0.f;
                    if (row < seq_q && stores) {
                        elem_t* orow = o + optd_head_off(strides.o_b, strides.o_h, b, head) + 2 * tq + (long long)row * strides.o_s;
#pragma unroll
                        for (int j = 0; j < D / 8; ++j)
                            *reinterpret_cast<unsigned*>(orow + 8 * j) =
                                pack2(cs.o[4 * j + 2 * h] * inv, cs.o[4 * j + 2 * h + 1] * inv);
                    }
                }
            }
        };  // run_tile
        // One loop (one inlined copy of run_tile) for both schedules.
        for (int r = 0, n = 0;; ++r) {
            WorkTile wt;
            if (dynamic) {
                // The producer's choice, read once Q's barrier completes (its arrive
                // released the write); a Q slot goes back only after every consumer's
                // last Q K^T of its tile, so a later choice for the same slot cannot
                // overwrite it before all have read it (each slot has its own word).
                const QSlot qs(n);
                mbar_wait(smem_addr(&bars.q_full[qs.slot]), qs.phase);
                const int idx = *reinterpret_cast<volatile int*>(&bars.tile[qs.slot]);
                if (idx < 0) break;
                wt = sched.lpt_tile(idx);
            } else {
                if (r >= sched.rounds()) break;
                if (!sched.has(r)) continue;
                wt = sched.tile(r);
            }
            run_tile(wt, n++);
        }
        // EPI_TMA: the last TMA store has written O before the CTA counts as done.
        if (EPI_TMA && (tid & 127) == 0) bulk_wait<0>();
        if (PINGPONG && c == 0) named_bar_sync(1, 256);  // the last consumer's final pass
    }
    // Every remaining warp done (the producer's warp 0 and the consumers; warps 1-3 exited):
    // the CTA counts as complete only now. Named barrier 2 CONSUMERS + 2, after ping-pong's
    // 1..CONSUMERS, the merge's CONSUMERS + 1 and the epilogues' CONSUMERS + 2 + c.
    named_bar_sync(2 * CONSUMERS + 2, 32 + 128 * CONSUMERS);
}

// CLUSTER_SPLIT: clusters of two CTAs along x (a compile-time attribute: a plain launch).
#if CLUSTER_SPLIT
#define WT_CLUSTER __cluster_dims__(2, 1, 1)
#else
#define WT_CLUSTER
#endif
#define WT_KERNEL(DIM)                                                                                         \
    extern "C" __global__ void __launch_bounds__(WT_THREADS, 1) WT_CLUSTER                                     \
        optd_fwd_d##DIM(OPTD_ARGS, const __grid_constant__ optd_tensor_map tm_q,                               \
                        const __grid_constant__ optd_tensor_map tm_k, const __grid_constant__ optd_tensor_map tm_v, \
                        const __grid_constant__ optd_tensor_map tm_o) {                                        \
        if constexpr (WtSmem<DIM>::RUNS) {                                                                     \
            wgmma_tma_fwd<DIM>(OPTD_ARG_NAMES, &tm_q, &tm_k, &tm_v, &tm_o);                                    \
        } else { /* refused by the gate (WtSmem::RUNS): never launched */                                      \
            wt_check_smem<DIM>();                                                                              \
            __trap();                                                                                          \
        }                                                                                                      \
        OPTD_CTA_DONE();                                                                                       \
    }
#if OPTD_BUILD_D64
WT_KERNEL(64)
#endif
#if OPTD_BUILD_D96
WT_KERNEL(96)
#endif
#if OPTD_BUILD_D128
WT_KERNEL(128)
#endif
#if OPTD_BUILD_D256
WT_KERNEL(256)
#endif
