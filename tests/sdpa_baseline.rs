//! The SDPA baseline in a run: recorded per shape, cached per device + torch + cuDNN,
//! shown next to the best kernels; a machine without torch still runs.
//! The script is replaced by a fake at the GPU boundary; the ledger and processes are real.

mod common;

use std::time::Duration;

use common::Project;
use optimizerd::engine::RunEnd;
use optimizerd::storage::ledger::Ledger;
use serde_json::json;

const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[open_phase]
enabled = false
"#;

/// A stand-in for scripts/sdpa_baseline.py: fixed timings, and a count of measuring calls.
const FAKE: &str = r#"#!/bin/sh
if [ "$1" = "--versions" ]; then
  echo '{"torch":"2.11.0+cu130","cuda":"13.0","cudnn":91900,"device":"NVIDIA H100 80GB HBM3","cc":"9.0"}'
  exit 0
fi
echo x >> "$(dirname "$0")/measured.count"
echo '{"versions":{"torch":"2.11.0+cu130","cuda":"13.0","cudnn":91900,"device":"NVIDIA H100 80GB HBM3","cc":"9.0"},"results":[
 {"input_sets":16,"default":{"graph_us":6.0,"eager_us":32.5,"picked":"cudnn"},"flash":{"graph_us":5.3,"eager_us":30.0},"cudnn":{"graph_us":5.9,"eager_us":31.0},"efficient":{"error":"RuntimeError: no kernel"}},
 {"input_sets":2,"default":{"graph_us":50.0,"eager_us":52.0,"picked":"cudnn"},"flash":{"graph_us":80.0,"eager_us":81.0},"cudnn":{"graph_us":50.0,"eager_us":52.0},"efficient":{"graph_us":90.0,"eager_us":91.0}}
]}'
"#;

fn project() -> Project {
    let p = Project::new(PLAN, json!([]), json!({ "ok": { "us": 25.0 } }));
    let fake = p.path().join("fake_sdpa.sh");
    std::fs::write(&fake, FAKE).unwrap();
    p.append_config(&format!("\n[baseline]\nsdpa_command = \"sh {}\"\n", fake.display()));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdpa_is_recorded_per_shape_and_cached_for_the_next_run() {
    let p = project();
    assert_eq!(p.run("one", Duration::from_secs(60)).await, RunEnd::Finished("plan exhausted".into()));
    assert_eq!(p.run("two", Duration::from_secs(60)).await, RunEnd::Finished("plan exhausted".into()));
    let count = std::fs::read_to_string(p.path().join("measured.count")).unwrap();
    // Run one measures at its start and at its closing comparison; run two takes its start
    // figures from the cache and measures only at its closing comparison.
    assert_eq!(count.lines().count(), 3, "the second run should have used the cache at its start");

    let ledger = Ledger::open(&p.db()).await.unwrap();
    for (run, cached) in [("one", false), ("two", true)] {
        let rows = ledger.sdpa(run).await.unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].shape, "b1h1s128d64");
        assert_eq!(rows[0].default_graph_us, Some(6.0));
        assert_eq!(rows[0].picked.as_deref(), Some("cudnn"));
        assert_eq!(rows[0].backends["flash"]["graph_us"], json!(5.3));
        assert!(rows[0].backends["efficient"]["error"].as_str().unwrap().contains("no kernel"));
        assert_eq!(rows[1].shape, "b2h8s512d128-causal");
        assert!(rows.iter().all(|r| r.cached == cached));
        assert_eq!(rows[0].versions["cudnn"], json!(91900));
    }
    // The status table puts SDPA next to the best kernel: 6.0 / 25.0 = 0.24x.
    let s = optimizerd::ops::report::status(&ledger, Some("two")).await.unwrap();
    let text = optimizerd::ops::report::status_text(&s);
    assert!(text.contains("6.00 cudnn") && text.contains("0.24x"), "{text}");
    assert!(text.contains("cuDNN 91900"), "{text}");

    // The closing comparison: the best kernel (25 us) timed before and after a fresh SDPA
    // measurement, one row per shape, quoted in status.
    let closing = ledger.closing("two").await.unwrap();
    assert_eq!(closing.iter().map(|c| c.shape.as_str()).collect::<Vec<_>>(), ["b1h1s128d64", "b2h8s512d128-causal"]);
    assert_eq!((closing[0].ours_before_us, closing[0].ours_after_us, closing[0].sdpa_default_us), (25.0, 25.0, Some(6.0)));
    assert_eq!(closing[1].vs_default(), Some(2.0));
    assert_eq!(closing[0].sdpa_backends["flash"]["graph_us"], json!(5.3));
    assert!(text.contains("closing comparison") && text.contains("2.00x"), "{text}");
    let events = ledger.events("two").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "closing" && e.message.contains("b2h8s512d128-causal 25.00 us vs SDPA default 50.00 us = 2.00x")), "{events:?}");
    // This script knows no FlashAttention-4: the run says it was not measured, and no FA4 columns.
    assert!(events.iter().any(|e| e.kind.as_str() == "closing" && e.message.ends_with("; FA4 not measured")), "{events:?}");
    assert!(text.contains("fa4:  FA4 not measured") && !text.contains("vs fa4"), "{text}");
    // `export` says which shape SDPA beat in the closing comparison (6.00 against 25.00 us);
    // the other (50.00 against 25.00) gets no note.
    let e = optimizerd::ops::export::export_with(&ledger, "two", &p.path().join("exp"), &Default::default()).await.unwrap();
    assert_eq!(e.notes.len(), 1, "{:?}", e.notes);
    assert!(e.notes[0].starts_with("b1h1s128d64: SDPA's default (cudnn) took 6.00 us against the kernel's 25.00 us"), "{:?}", e.notes);
}

/// The script of a machine with FlashAttention-4: an `fa4` backend per shape (it cannot run
/// the small one), and its version.
const FAKE_FA4: &str = r#"#!/bin/sh
V='{"torch":"2.11.0+cu130","cuda":"13.0","cudnn":91900,"device":"NVIDIA H100 80GB HBM3","cc":"9.0","fa4":"4.0.0b36"}'
if [ "$1" = "--versions" ]; then echo "$V"; exit 0; fi
echo '{"versions":'"$V"',"results":[
 {"default":{"graph_us":6.0,"picked":"cudnn"},"flash":{"graph_us":5.3},"fa4":{"error":"NotImplementedError: too small"}},
 {"default":{"graph_us":50.0,"picked":"cudnn"},"flash":{"graph_us":80.0},"fa4":{"graph_us":40.0,"ran":"fa4","kv":"mha","mask":"is_causal"}}
]}'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fa4_is_recorded_beside_sdpa_and_quoted_in_the_closing_comparison_and_status() {
    let p = Project::new(PLAN, json!([]), json!({ "ok": { "us": 25.0 } }));
    let fake = p.path().join("fake_fa4.sh");
    std::fs::write(&fake, FAKE_FA4).unwrap();
    p.append_config(&format!("\n[baseline]\nsdpa_command = \"sh {}\"\n", fake.display()));
    assert_eq!(p.run("fa4", Duration::from_secs(60)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let rows = ledger.sdpa("fa4").await.unwrap();
    assert_eq!(rows[1].backends["fa4"]["graph_us"], json!(40.0));
    assert_eq!(rows[0].versions["fa4"], json!("4.0.0b36"));
    let closing = ledger.closing("fa4").await.unwrap();
    assert_eq!(closing[1].vs_fa4(), Some(1.6));
    assert_eq!(closing[0].vs_fa4(), None);
    let events = ledger.events("fa4").await.unwrap();
    let msg = &events.iter().find(|e| e.kind.as_str() == "closing").expect("a closing comparison").message;
    assert!(msg.contains("b2h8s512d128-causal 25.00 us vs SDPA default 50.00 us = 2.00x, FA4 40.00 us = 1.60x"), "{msg}");
    assert!(msg.contains("b1h1s128d64 25.00 us vs SDPA default 6.00 us = 0.24x, FA4 could not run it"), "{msg}");
    assert!(!msg.contains("not measured"), "{msg}");
    let text = optimizerd::ops::report::status_text(&optimizerd::ops::report::status(&ledger, Some("fa4")).await.unwrap());
    let big = text.lines().filter(|l| l.starts_with("b2h8s512d128-causal ")).collect::<Vec<_>>();
    assert_eq!(big.len(), 2, "a best-table line and a closing line: {text}");
    for l in big {
        assert!(l.contains(" 40.00 ") && l.contains(" 1.60x"), "FA4 and vs FA4 beside SDPA: {l}");
    }
    assert!(text.contains("fa4:  FlashAttention-4 4.0.0b36"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_torch_the_run_goes_on_and_says_so() {
    let p = Project::new(PLAN, json!([]), json!({ "ok": { "us": 25.0 } }));
    p.append_config("\n[baseline]\nsdpa_command = \"python3-that-does-not-exist {script}\"\n");
    assert_eq!(p.run("notorch", Duration::from_secs(60)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    assert!(ledger.sdpa("notorch").await.unwrap().is_empty());
    let events = ledger.events("notorch").await.unwrap();
    let note = events.iter().find(|e| e.kind.as_str() == "sdpa_unavailable").expect("a note that SDPA is unavailable");
    assert!(note.message.contains("over the baseline kernel only"), "{}", note.message);
    assert_eq!(ledger.iterations("notorch").await.unwrap().len(), 1);
}
