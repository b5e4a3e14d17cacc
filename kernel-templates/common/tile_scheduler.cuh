/******************************************************************************
 * tile_scheduler.cuh: which (query tile, head) work tiles a CTA takes, and in
 * what order. Every role of a warp-specialized CTA (the TMA producer and each
 * consumer warpgroup) walks the same sequence with its own copy of the
 * scheduler, so they agree on it without talking to each other:
 *
 *   const TileScheduler<kPersistent> sched(n_mb, n_bh, q_per_kv, causal, kv_head_bytes, group_bytes);
 *   for (int r = 0, n = 0; r < sched.rounds(); ++r) {
 *       if (!sched.has(r)) continue;  // only the last round can be short
 *       const WorkTile w = sched.tile(r);
 *       const int i = n++;            // the CTA's tiles so far: a per-tile barrier's phase
 *       ... query tile w.m_block of head w.bh (b * HQ + h) ...
 *   }
 * Keep this loop shape (a round bound, a skip, a separate count, the tile
 * recomputed from the round): ptxas compiled wgmma_tma best with it. Looping
 * on has(i) alone, or carrying the tile across iterations, cost the
 * 32-register producer of 3 consumers a spill per work tile and moved the
 * consumers' softmax scale out of the uniform registers (~1% at D 128).
 *
 * kPersistent = false: grid n_mb x n_bh, one work tile per CTA (kSplit > 1:
 *   grid kSplit n_mb x n_bh, clusters of kSplit CTAs along x, each CTA of a
 *   cluster computing the same work tile's key tiles in its share: keys()).
 *   Not causal: tile (blockIdx.x, blockIdx.y).
 *   Causal: CTAs start in linear-id order, and the id maps to tiles longest
 *   first (the last query tiles see the most keys) across a group of heads
 *   whose K/V together fit group_bytes (kept in L2), every head of the group
 *   at each step: the last wave holds only light tiles. K/V is counted per
 *   K/V head (kv_head_bytes): a group is whole GQA groups, the q_per_kv
 *   adjacent query heads (bh = b * HQ + h) that read one K/V head, so with
 *   grouped-query attention it holds q_per_kv times more query heads for the
 *   same L2 footprint.
 * kPersistent = true: grid min(n_mb * n_bh, SMs) x 1 (stream-K: SMs x 1, the
 *   CTAs past the last tile idle when the tail stays whole). Work tile wk is head-major
 *   (head wk / n_mb, so the CTAs running at once share a head's K/V in L2, and
 *   the query heads of one K/V head follow each other;
 *   causal: within a head the heaviest query tile first); rounds of gridDim.x
 *   consecutive tiles.
 *   Causal: CTA j takes entry j of even rounds and gridDim.x - 1 - j of odd
 *   ones (a snake: a CTA with a heavy tile in one round gets a light one in
 *   the next).
 *   Not causal: CTA j takes entry (j + r * shift) % gridDim.x of round r, shift
 *   chosen so that its query tile index m = wk % n_mb advances by one per round
 *   (shift = 1 - gridDim.x mod n_mb). Only a ragged last query tile is lighter
 *   than the others, and with gridDim.x a multiple of n_mb a fixed entry (or
 *   the snake) hands every such tile to the same few CTAs while the rest take
 *   only full ones: (32,16,577,64) with 192-row tiles (n_mb 4, 132 CTAs) took
 *   165 us, and as long with the tail tiles doing no work at all, against 131
 *   at S 576 (docs/HOPPER.md, ragged tails).
 * The measurements behind both orders are in wgmma_tma.cu and docs/HOPPER.md.
 *
 * Dynamic (persistent, causal; the caller's choice, e.g. wgmma_tma.cu's
 *   DYNAMIC): the static rounds above balance causal work only when a round
 *   holds whole heads' worth of query tiles. When it does not, some CTAs
 *   draw several heavy tiles: a model of the key tiles per CTA gives the
 *   busiest 1.29x the mean at (2,16,8192,128) with 192-row tiles and 1.73x
 *   for packed GQA (4,16/4,2048,64). Instead the work tiles are ordered as
 *   the one-CTA-per-tile grid orders them (longest first within L2 groups of
 *   heads, lpt_tile()), CTA j starts with tile j, and each CTA's producer
 *   takes its next one from a global counter (next_dynamic()) as it
 *   finishes loading the last; the same model gives 1.00-1.07x. The counter
 *   and a count of CTAs that ran out live in two words the caller provides,
 *   zero at launch (the ABI's split semaphores); the last CTA to run out
 *   sets both back to zero, so the next launch finds them so.
 *
 * kStreamK (persistent, enable_stream_k() called): the rounds that every CTA
 *   fills run whole tiles as above; the work tiles of the last, partial round
 *   (R = tiles mod gridDim.x of them, the tail) are instead spread evenly over
 *   every CTA by key tile (stream-K, as CUTLASS's data-parallel + stream-K
 *   hybrid): the tail's I key tiles in tile-major order (tail tile p = work
 *   tile n_dp + p, query tile fastest), CTA j taking [j I / G, (j + 1) I / G),
 *   G = gridDim.x. Not causal: every tile has n_kv key tiles, I = R n_kv.
 *   Causal: only when every work tile is in the tail (fewer tiles than CTAs,
 *   e.g. chunked prefill: 128 tiles of 29-32 key tiles on 132 SMs, where whole
 *   tiles leave the critical path at the longest tile and 4 SMs idle; measured
 *   4% faster at D 64 under sustained timing, slower at D 128: HOPPER.md); tile
 *   lengths differ (KvTiles), I is their sum, and the schedule is used only
 *   where the shortest tile is at least ceil(I / G) - 1 long. Either way a
 *   CTA's range is at most one tile long plus one key tile, so it holds the
 *   end of one tail tile and maybe the start of the next: two more rounds,
 *   one segment each. Every tail tile is thus computed in pieces by
 *   consecutive CTAs (first_piece() .. last_piece()) whose partial results the
 *   last one to finish merges (wgmma_tma.cu's STREAM_K). Why: with whole tiles
 *   the last round runs a few tiles on a few SMs and the rest idle, e.g.
 *   (2,16,8192,128) with 192-row tiles: 1376 tiles on 132 SMs, 10.4 rounds'
 *   work in 11 rounds' time.
 *
 * Key ranges (KeyTiles, keys()): a work tile's key tiles run from the tile of
 *   the first key its first row sees to the last its last row sees; with a
 *   sliding window (mask.cuh's KeyMask) the start moves right, so a tile's
 *   length is min(causal, about (W + tp) / bn). The orders above need no
 *   change for it: the lengths still do not shrink as m grows (give or take
 *   one key tile of rounding, and a ragged last tile), so heaviest first is
 *   still the last query tile first. Stream-K, which adds lengths up, is not
 *   enabled with a window (keys() says why): those tails run whole tiles.
 ******************************************************************************/
#ifndef OPTD_TILE_SCHEDULER_CUH
#define OPTD_TILE_SCHEDULER_CUH

#include "common/mask.cuh"

struct WorkTile {
    int m_block;  // query tile
    int bh;       // b * H + h
    // Stream-K tail only: key tiles [k_lo, k_hi) of the work tile; piece >= 0 its
    // index in the tail, slot this CTA's piece of it (2 * blockIdx.x + segment).
    int k_lo = 0;
    int k_hi = 0;
    int piece = -1;
    int slot = 0;
};

// Key tiles of query tile m (stream-K's tile lengths): causal, the keys its last row
// sees (bottom-right: row i sees keys <= i + offset), else all of them. tp: query
// positions per tile, bn: keys per key tile. No window: stream-K is enabled only without
// one (TileScheduler::keys), so its tiles' keys start at 0.
struct KvTiles {
    int tp, bn, key_end, offset;
    bool causal;
    __device__ __forceinline__ int of(int m) const {
        const int keys = causal ? min(key_end, (m + 1) * tp + offset) : key_end;
        return max(keys + bn - 1, 0) / bn;
    }
};

// The key tiles of query tile m, [first(m), end(m)): up to the last key its last row
// sees (causal, bottom-right), else all of them; from the tile holding the first key its
// first row sees (a sliding window: rows see keys > i + offset - W, and the first row's
// bound is the lowest), else from 0. The one definition of a work tile's key range
// (TileScheduler::keys(): the producer loads it, every consumer waits for and releases
// it). Apart from KvTiles, which the scheduler keeps for stream-K: one struct for both,
// holding the window there, cost wgmma_tma's STREAM_K kernels 44 bytes more spill
// stores (D 128) even in a build without the window's code.
struct KeyTiles {
    KeyMask mask;
    int tp, bn;
    __device__ __forceinline__ KeyTiles(const KeyMask& mask_, int tp_, int bn_) : mask(mask_), tp(tp_), bn(bn_) {}
    __device__ __forceinline__ int end(int m) const { return max(mask.keys_before((m + 1) * tp) + bn - 1, 0) / bn; }
    __device__ __forceinline__ int first(int m) const { return mask.keys_from(m * tp) / bn; }
};

// A work tile's key tiles [lo, hi) (TileScheduler::keys).
struct KeyRange {
    int lo, hi;
};

template <bool kPersistent, bool kStreamK = false, int kSplit = 1>
struct TileScheduler {
    static_assert(kSplit == 1 || !kPersistent, "a cluster's CTAs split one work tile: one tile per CTA");
    int n_mb;                  // query tiles per head
    int n_bh;                  // heads, B * H
    int n_rounds;              // rounds of gridDim.x work tiles (the last may be short); 1 if not persistent
    bool causal;
    int group_heads;           // query heads scheduled together (causal: one CTA per tile, or dynamic)
    // Stream-K (enable_stream_k): work tiles run whole (full rounds), key tiles per work
    // tile, key tiles of the tail (0: no stream-K tail).
    int n_dp = 0;
    int n_kv = 0;           // not causal: every tile's key tiles
    long long sk_iters = 0;
    KvTiles kv{};           // causal: each query tile's
    int head_iters = 0;     // causal: key tiles of one head's query tiles

    // q_per_kv: query heads per K/V head (HQ / HKV); kv_head_bytes: K and V of
    // one K/V head; group_bytes: the K/V bytes of a causal group's heads.
    __device__ __forceinline__ TileScheduler(int n_mb_, int n_bh_, int q_per_kv, bool causal_, long long kv_head_bytes,
                                             long long group_bytes)
        : n_mb(n_mb_),
          n_bh(n_bh_),
          n_rounds(kPersistent ? (n_mb_ * n_bh_ + (int)gridDim.x - 1) / (int)gridDim.x : 1),
          causal(causal_),
          group_heads((int)min((long long)n_bh_, max(1ll, group_bytes / max(1ll, kv_head_bytes)) * q_per_kv)) {}

    // Stream-K tail (kStreamK, persistent; every role calls it with the same arguments):
    // kv: the work tiles' key tiles (no window: see keys()); room: whether the caller's
    // scratch holds 2 gridDim.x pieces. Only where the tail is not empty, every CTA gets at least
    // one key tile of it and (causal) every tile is in the tail and no CTA's range
    // spans three tiles; otherwise the schedule stays whole tiles.
    __device__ __forceinline__ void enable_stream_k(const KvTiles& kv_, bool room) {
        if constexpr (kStreamK && kPersistent) {
            const int g = (int)gridDim.x, total = n_mb * n_bh;
            const int tail = total % g;
            if (!room || tail == 0) return;
            long long iters;
            if (causal) {
                if (tail != total) return;  // whole rounds first: DYNAMIC balances those
                int per_head = 0;
                for (int m = 0; m < n_mb; ++m) per_head += kv_.of(m);
                iters = (long long)per_head * n_bh;
                // Tiles grow with m (bottom-right causal, no window: see keys()): tile 0 is
                // the shortest.
                if (kv_.of(0) < (iters + g - 1) / g - 1) return;
                kv = kv_;
                head_iters = per_head;
            } else {
                n_kv = kv_.of(0);
                iters = (long long)tail * n_kv;
            }
            if (iters < g) return;
            n_dp = total - tail;
            sk_iters = iters;
            n_rounds = n_dp / g + 2;
        }
    }
    // Work tile w's key tiles: its query tile's [kt.first, kt.end), or a stream-K piece's
    // [k_lo, k_hi). The producer and every consumer call it with the same kt: they walk
    // the same tiles. Stream-K is enabled only without a window, where every tile's keys
    // start at 0: its pieces, tile lengths (KvTiles) and their sums are the unwindowed
    // ones, and no piece walk reads the window. (Windowed lengths, end - first, in them
    // cost wgmma_tma's STREAM_K kernels 4400 instructions and 84 bytes more spill stores
    // at D 128 without a window: the window's start inlined into every walk.)
    // kSplit > 1: the cluster's CTA of rank r takes the r-th of kSplit near-equal shares of
    // the tile's range, in key order (the last holds a causal tile's diagonal).
    __device__ __forceinline__ KeyRange keys(const WorkTile& w, const KeyTiles& kt) const {
        if (kStreamK && w.piece >= 0) return KeyRange{w.k_lo, w.k_hi};
        if constexpr (kSplit > 1) {
            const int lo = kt.first(w.m_block), n = kt.end(w.m_block) - lo;
            const int r = (int)blockIdx.x % kSplit;
            return KeyRange{lo + r * n / kSplit, lo + (r + 1) * n / kSplit};
        }
        return KeyRange{kt.first(w.m_block), kt.end(w.m_block)};
    }
    // Whether the tail runs in pieces, and which CTAs compute tail tile `piece`.
    __device__ __forceinline__ bool stream_k() const { return kStreamK && sk_iters > 0; }
    __device__ __forceinline__ int first_piece(int piece) const { return sk_owner(piece_begin(piece)); }
    __device__ __forceinline__ int last_piece(int piece) const {
        return sk_owner(piece_begin(piece) + piece_len(piece) - 1);
    }
    // CTA j's slot in tail tile `piece`: its first segment if its range starts there.
    __device__ __forceinline__ int slot_of(int j, int piece) const {
        return 2 * j + (piece_at(sk_begin(j)) == piece ? 0 : 1);
    }

    __device__ __forceinline__ int rounds() const { return n_rounds; }
    // Whether this CTA has a work tile in round r (< rounds()).
    __device__ __forceinline__ bool has(int r) const {
        if constexpr (kPersistent) {
            if (stream_k() && r >= n_dp / (int)gridDim.x) {
                const int j = (int)blockIdx.x;
                const long long b0 = sk_begin(j), b1 = sk_begin(j + 1);
                // Segment 0: the range's start (never empty: sk_iters >= gridDim.x);
                // segment 1: the next tail tile, where the range crosses into it (causal:
                // the two rounds take them in the other order, see tile()).
                return r == n_dp / (int)gridDim.x ? b1 > b0 : b1 > piece_begin(piece_at(b0) + 1);
            }
            return work_index(r) < n_mb * n_bh;
        } else {
            return true;
        }
    }
    // Dynamic: the work tiles in all (n_mb * n_bh of them).
    __device__ __forceinline__ int total() const { return n_mb * n_bh; }
    // Dynamic: the index of this CTA's next work tile (>= total(): none left), from the
    // counter words[0]; words[1] counts the CTAs that ran out, and the last of them
    // leaves both zero. One thread per CTA calls it, once per work tile after the first
    // (blockIdx.x), and no more once it returned >= total().
    __device__ __forceinline__ int next_dynamic(unsigned* words) const {
        const int g = (int)gridDim.x;
        if (total() <= g) return total();  // every tile was a first tile: no counter
        unsigned got;
        asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(got) : "l"(words) : "memory");
        const int idx = g + (int)got;
        if (idx >= total()) {
            // acq_rel: this CTA's counter add is ordered before its count here, and the
            // last one's reset after every count (and so after every counter add).
            unsigned out;
            asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(out) : "l"(words + 1) : "memory");
            // Every CTA has taken its last index: nobody reads the counter again in this launch.
            if (out == (unsigned)(g - 1)) {
                asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(words) : "memory");
                asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(words + 1) : "memory");
            }
        }
        return idx;
    }
    // Causal: the work tile at position lin of the longest-first order (heads in groups
    // of group_heads; within a group the query tiles heaviest first, every head of the
    // group at each step). The one-CTA-per-tile grid's order (lin = its linear id) and
    // the dynamic one's.
    __device__ __forceinline__ WorkTile lpt_tile(int lin) const {
        const int g = group_heads;
        const int g0 = lin / (g * n_mb) * g;  // the group's first head
        const int gh = min(g, n_bh - g0);     // heads in this (maybe last, smaller) group
        const int within = lin - g0 * n_mb;
        return WorkTile{n_mb - 1 - within / gh, g0 + within % gh};
    }

    // This CTA's work tile of round r (has(r)).
    __device__ __forceinline__ WorkTile tile(int r) const {
        if constexpr (kPersistent) {
            if (stream_k() && r >= n_dp / (int)gridDim.x) {
                const int j = (int)blockIdx.x;
                const long long b0 = sk_begin(j), b1 = sk_begin(j + 1);
                // Causal: the start of the next tile (its keys from 0) before the end of
                // this one, so that the CTAs of one K/V head read nearly the same key tile
                // at once, as whole tiles do, and the L2's request coalescer merges more of
                // their loads: 5-11% faster than range order on D 128 chunked prefill (H100,
                // 2026-11-27), though still slower there than whole tiles (docs/HOPPER.md).
                int seg = r - n_dp / (int)gridDim.x;
                if (causal && b1 > piece_begin(piece_at(b0) + 1)) seg = 1 - seg;
                const int piece = piece_at(b0) + seg;
                const long long t0 = piece_begin(piece);  // the tile's first key tile, tail-wide
                const int wk = n_dp + piece;
                WorkTile w{wk % n_mb, wk / n_mb};
                w.k_lo = (int)(max(b0, t0) - t0);
                w.k_hi = (int)(min(b1, t0 + piece_len(piece)) - t0);
                w.piece = piece;
                w.slot = 2 * j + seg;
                return w;
            }
            const int wk = work_index(r);
            return WorkTile{causal ? n_mb - 1 - wk % n_mb : wk % n_mb, wk / n_mb};
        } else {
            if constexpr (kSplit > 1) {
                const int x = (int)blockIdx.x / kSplit;  // the cluster's work tile
                if (!causal) return WorkTile{x, (int)blockIdx.y};
                return lpt_tile((int)(blockIdx.y * (gridDim.x / kSplit)) + x);
            }
            if (!causal) return WorkTile{(int)blockIdx.x, (int)blockIdx.y};
            return lpt_tile((int)(blockIdx.y * gridDim.x + blockIdx.x));
        }
    }

  private:
    // Stream-K: the first tail key tile of CTA j's range (j = gridDim.x: the end).
    __device__ __forceinline__ long long sk_begin(int j) const { return (long long)j * sk_iters / (int)gridDim.x; }
    // Stream-K: tail tile p's length and first key tile (tail-wide), and the tail tile
    // holding key tile x. Causal tails are whole heads (n_dp = 0): tile p is query
    // tile p % n_mb of head p / n_mb; the walk over a head's query tiles runs once per
    // call, n_mb < gridDim.x steps.
    __device__ __forceinline__ int piece_len(int p) const { return causal ? kv.of(p % n_mb) : n_kv; }
    __device__ __forceinline__ long long piece_begin(int p) const {
        if (!causal) return (long long)p * n_kv;
        long long x = (long long)(p / n_mb) * head_iters;
        for (int m = 0; m < p % n_mb; ++m) x += kv.of(m);
        return x;
    }
    __device__ __forceinline__ int piece_at(long long x) const {
        if (!causal) return (int)(x / n_kv);
        const int head = (int)(x / head_iters);
        long long r = x - (long long)head * head_iters;
        int m = 0;
        for (; m < n_mb - 1 && r >= kv.of(m); ++m) r -= kv.of(m);
        return head * n_mb + m;
    }
    // The CTA whose range holds tail key tile x: the largest j with sk_begin(j) <= x.
    __device__ __forceinline__ int sk_owner(long long x) const {
        return (int)(((x + 1) * (int)gridDim.x - 1) / sk_iters);
    }
    // Persistent: the work tile of round r for this CTA (causal: a snake over the
    // rounds; otherwise rotated by `shift` per round).
    __device__ __forceinline__ int work_index(int r) const {
        const int g = (int)gridDim.x, j = (int)blockIdx.x;
        if (causal) return r * g + ((r & 1) ? g - 1 - j : j);
        // Recomputed per round rather than kept: one register more cost the 24-register
        // producer of 2 consumers a spill.
        const int shift = (1 + n_mb - g % n_mb) % n_mb;
        return r * g + (r * shift + j) % g;
    }
};

#endif  // OPTD_TILE_SCHEDULER_CUH
