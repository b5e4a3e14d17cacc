/******************************************************************************
 * mask.cuh: which keys a query row sees, and the tile-level tests built on it.
 *
 * KeyMask is the rule for one (batch, head):
 *   - keys at or past key_end are never seen (the key sequence length; a
 *     per-sequence bound once key lengths are ragged);
 *   - causal: row i sees keys <= i + causal_offset. The kernel ABI aligns the
 *     queries to the end of the keys (bottom-right, FA2 >= 2.1 / FA3 / SDPA):
 *     pass optd_causal_offset(seq_q, seq_k) = sk - sq, 0 when they have one
 *     length;
 *   - window W (ABI v3's `window`, 0: none; only given with causal): row i
 *     also loses the keys < i + causal_offset - W + 1, so it sees at most W
 *     keys ending at its diagonal, which it always sees: a windowed causal
 *     row is never empty.
 *
 * The right edge (key_end, the diagonal):
 *   sees(row, key)         query row `row` sees key `key` (both edges)
 *   limit(row)             row `row` sees no key >= limit(row)
 *   keys_before(row_end)   keys < keys_before(row_end) are seen by some row
 *                          < row_end: how far a query tile reads K and V
 *   above(kv0, row_last)   causal: keys >= kv0 are above every row <= row_last
 *                          (a tile a warp or CTA skips)
 *   partial(kv0, n, row)   the n keys from kv0 need per-element masking on
 *                          their right for some row >= row (a key past
 *                          key_end, or above the diagonal)
 * The left edge (the window; all false / 0 without one):
 *   first_key(row)         row `row` sees no key < first_key(row)
 *   keys_from(row_first)   no row >= row_first sees a key < keys_from: where a
 *                          query tile's key loop starts (rounded down to a
 *                          tile)
 *   left_of(kv_end, row_first)  keys < kv_end are seen by no row >= row_first
 *                          (a tile to skip)
 *   partial_left(kv0, row_last) a tile from kv0 needs per-element masking on
 *                          its left for some row <= row_last
 * Split-KV (flash-decoding) blocks:
 *   split_tiles(row0, rows, tile, n_splits, split)  the key tiles split
 *                          `split` of the query block [row0, row0 + rows)
 *                          reads ([begin, end); empty when end <= begin)
 * first_key and limit grow with the row, so a tile's first row bounds its
 * left edge tests and its last row its right edge ones (and the reverse).
 *
 * Per-element masking of a register tile is layout code: m16n8_mask() and
 * m16n8_mask_left() (quad_softmax.cuh) for mma.sync / wgmma accumulators,
 * sees() in the lane-per-key templates. A row with nothing to see in a tile
 * is all -inf there, and online_softmax.cuh's guard keeps it at 0.
 ******************************************************************************/
#ifndef OPTD_MASK_CUH
#define OPTD_MASK_CUH

struct KeyMask {
    int key_end;        // keys >= key_end are masked
    int causal_offset;  // causal: row i sees keys <= i + causal_offset
    int window;         // > 0: row i sees keys > i + causal_offset - window; 0: no window
    bool causal;

    __device__ __forceinline__ KeyMask(int key_end_, bool causal_, int causal_offset_, int window_)
        : key_end(key_end_), causal_offset(causal_offset_), window(window_), causal(causal_) {}

    // Causal: the last key row `row` sees.
    __device__ __forceinline__ int last_key(int row) const { return row + causal_offset; }
    // The window: the first key row `row` sees.
    __device__ __forceinline__ int first_key(int row) const {
        return window ? max(0, row + causal_offset - window + 1) : 0;
    }
    // Two compares without a window, no min: per element, what ptxas schedules
    // best; the window's compare only where there is one.
    __device__ __forceinline__ bool sees(int row, int key) const {
        return key < key_end && !(causal && key > last_key(row)) && !(window && key < first_key(row));
    }
    __device__ __forceinline__ int limit(int row) const {
        return causal ? min(key_end, row + 1 + causal_offset) : key_end;
    }
    __device__ __forceinline__ int keys_before(int row_end) const {
        return causal ? min(key_end, row_end + causal_offset) : key_end;
    }
    __device__ __forceinline__ bool above(int kv0, int row_last) const {
        return causal && kv0 > row_last + causal_offset;
    }
    __device__ __forceinline__ bool partial(int kv0, int n, int row) const {
        return kv0 + n > key_end || (causal && kv0 + n - 1 > row + causal_offset);
    }
    __device__ __forceinline__ int keys_from(int row_first) const { return first_key(row_first); }
    __device__ __forceinline__ bool left_of(int kv_end, int row_first) const {
        return window && kv_end <= first_key(row_first);
    }
    __device__ __forceinline__ bool partial_left(int kv0, int row_last) const {
        return window && kv0 < first_key(row_last);
    }

    struct TileRange {
        int begin, end;  // key tiles [begin, end); nothing to do when end <= begin
    };
    // Without a window the splits divide [0, key_end) in tiles of `tile` keys (the
    // templates' spec formula for kv_tiles), so a split's range does not depend on the
    // block, and causal masking only trims its end at the block's last visible key. A
    // window bounds the block's keys to [keys_from(row0), keys_before(row0 + rows)),
    // about W + rows, and the splits divide that range instead (the spec's kv_tiles is
    // then its most tiles: a block with fewer leaves a split empty, which writes LSE
    // -inf, weight 0 in the combine).
    __device__ __forceinline__ TileRange split_tiles(int row0, int rows, int tile, int n_splits, int split) const {
        const int kv_hi = keys_before(row0 + rows);
        const int r_begin = keys_from(row0) / tile;
        const int r_end = ((window ? kv_hi : key_end) + tile - 1) / tile;
        const int tps = (r_end - r_begin + n_splits - 1) / n_splits;
        const int begin = r_begin + split * tps;
        return {begin, min(min(r_end, begin + tps), (kv_hi + tile - 1) / tile)};
    }
};

#endif  // OPTD_MASK_CUH
