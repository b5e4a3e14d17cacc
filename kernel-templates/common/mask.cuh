/******************************************************************************
 * mask.cuh: which keys a query row sees, and the tile-level tests built on it.
 *
 * KeyMask is the rule for one (batch, head):
 *   - keys at or past key_end are never seen (the key sequence length; a
 *     per-sequence bound once key lengths are ragged);
 *   - causal: row i sees keys <= i + causal_offset. Kernel ABI v2 aligns the
 *     queries to the end of the keys (bottom-right, FA2 >= 2.1 / FA3 / SDPA):
 *     pass optd_causal_offset(seq_q, seq_k) = sk - sq, 0 when they have one
 *     length.
 *
 *   sees(row, key)         query row `row` sees key `key`
 *   limit(row)             row `row` sees exactly the keys < limit(row)
 *   keys_before(row_end)   keys < keys_before(row_end) are seen by some row
 *                          < row_end: how far a query tile reads K and V
 *   above(kv0, row_last)   causal: keys >= kv0 are above every row <= row_last
 *                          (a tile a warp or CTA skips)
 *   partial(kv0, n, row)   the n keys from kv0 need per-element masking for
 *                          some row >= row (a key past key_end, or above the
 *                          diagonal); tiles that do not skip the masking
 *
 * Per-element masking of a register tile is layout code: m16n8_mask()
 * (quad_softmax.cuh) for mma.sync / wgmma accumulators, sees() in the
 * lane-per-key templates. A row with nothing to see is all -inf, and
 * online_softmax.cuh's guard keeps it at 0.
 ******************************************************************************/
#ifndef OPTD_MASK_CUH
#define OPTD_MASK_CUH

struct KeyMask {
    int key_end;        // keys >= key_end are masked
    int causal_offset;  // causal: row i sees keys <= i + causal_offset
    bool causal;

    __device__ __forceinline__ KeyMask(int key_end_, bool causal_, int causal_offset_)
        : key_end(key_end_), causal_offset(causal_offset_), causal(causal_) {}

    // Causal: the last key row `row` sees.
    __device__ __forceinline__ int last_key(int row) const { return row + causal_offset; }
    // Two compares, no min: per element, what ptxas schedules best.
    __device__ __forceinline__ bool sees(int row, int key) const {
        return key < key_end && !(causal && key > last_key(row));
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
};

#endif  // OPTD_MASK_CUH
