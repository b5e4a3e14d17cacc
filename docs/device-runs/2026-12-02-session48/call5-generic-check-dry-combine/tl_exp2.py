"""Session 48 experiment 2 (not committed): the combine's loop run once BEFORE the wait for the other
ranks' bytes (a dry pass over whatever has landed; its stores are overwritten by the real pass) and once
after it, one copy of the code (#pragma unroll 1): does the real pass then run at its warm speed? Stamps:
dry = slot 18 (dry pass done), pushed (9) = wait done, combined (10) = real pass done."""
import sys
sys.path.insert(0, "scripts")
import decode_timeline as T

T.EVENTS += ["dry"]
assert len(T.EVENTS) < T.SM_SLOT
# decode-cluster, COMBINE 1/2 (rank 0)
CLOOP = "        for (int c = c0; c < rows_valid * C4; c += DEC_THREADS) {\n            const int row = c / C4, c4 = c % C4;\n            float lse[CLUSTER];\n            lse[0] = lse_own[row];\n"
T.TAIL_PATCHES["decode-cluster"] += [
    ("    cluster_mbar_wait(mbar, 0);\n    tl_mark(9);\n    {\n        const float* lse_own", "    {\n        const float* lse_own"),
    (CLOOP, "#pragma unroll 1\n        for (int pass = 0; pass < 2; ++pass) {\n        if (pass == 1) { tl_mark(18); cluster_mbar_wait(mbar, 0); tl_mark(9); }\n" + CLOOP),
    ("c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));\n        }\n    }\n    tl_mark(10);\n#else",
     "c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));\n        }\n        }\n    }\n    tl_mark(10);\n#else"),
]
# decode-wgmma
WLOOP = "    for (int c = own_begin + tid; c < own_end; c += DW_THREADS) {\n        const int row = c / C4, c4 = c % C4;\n"
T.WGMMA_PATCHES += [
    ("    tl_mark(14);\n    cluster_mbar_wait(cbar, 0);\n    tl_mark(9);\n", "    tl_mark(14);\n"),
    ('    asm volatile("barrier.cluster.arrive.relaxed.aligned;\\n" ::: "memory");\n    const float* rxf',
     '    const float* rxf'),
    (WLOOP, "#pragma unroll 1\n    for (int pass = 0; pass < 2; ++pass) {\n    if (pass == 1) { tl_mark(18); cluster_mbar_wait(cbar, 0); tl_mark(9);\n"
            '        asm volatile("barrier.cluster.arrive.relaxed.aligned;\\n" ::: "memory"); }\n' + WLOOP),
    ("= packed;\n    }\n    tl_mark(10);\n", "= packed;\n    }\n    }\n    tl_mark(10);\n"),
]
T.POINTS = [p for p in T.POINTS if (p[0].name == "decode-wgmma" and p[1]["BLOCK_N"] == 128)
            or (p[0].name == "decode-cluster" and p[1].get("COMBINE") == 2 and p[1]["CLUSTER"] == 8)]
T.main()
