"""Session 48 experiment (not committed): decode-wgmma's combine run three times in a row, stamped after
each pass (pass0 = slot 18, pass1 = slot 19, the existing `combined` after pass 2): is its ~0.5 us the
work, or cold caches (instructions, O's strides in the constant bank) on the first pass?"""
import sys
sys.path.insert(0, "scripts")
import decode_timeline as T

T.EVENTS += ["pass0", "pass1"]
assert len(T.EVENTS) < T.SM_SLOT
LOOP = "    for (int c = own_begin + tid; c < own_end; c += DW_THREADS) {\n        const int row = c / C4, c4 = c % C4;\n"
T.WGMMA_PATCHES += [
    (LOOP, "    for (int pass = 0; pass < 3; ++pass) {\n    if (pass == 1) tl_mark(18);\n    if (pass == 2) tl_mark(19);\n" + LOOP),
    ("= packed;\n    }\n    tl_mark(10);\n", "= packed;\n    }\n    }\n    tl_mark(10);\n"),
]
CLOOP = "        for (int c = c0; c < rows_valid * C4; c += DEC_THREADS) {\n            const int row = c / C4, c4 = c % C4;\n            float lse[CLUSTER];\n            lse[0] = lse_own[row];\n"
T.TAIL_PATCHES["decode-cluster"] += [
    (CLOOP, "        for (int pass = 0; pass < 3; ++pass) {\n        if (pass == 1) tl_mark(18);\n        if (pass == 2) tl_mark(19);\n" + CLOOP),
    ("c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));\n        }\n    }\n    tl_mark(10);\n#else",
     "c == c0 ? dst0 : dec_out_chunk(o, strides, row, c4, heads_q, heads_kv, seq_q));\n        }\n        }\n    }\n    tl_mark(10);\n#else"),
]
T.main()
