//! The agent stage end to end on a CPU: a real local HTTP server replays scripted
//! OpenAI-compatible replies; the daemon (real ledger, git, NVRTC) takes each proposal
//! through the gates, with the scripted worker standing in for the GPU and simulating
//! the anti-cheat probes it is told a kernel fails.
//!
//! The cheating kernels of the scripted set, each caught (test
//! `every_scripted_cheat_is_caught`):
//! - runtime (the worker's probes): writes past O (guard regions), writes K (inputs
//!   compared after the run), skips work when O looks written (second-stream rerun with
//!   O not re-poisoned), reuses a cached result (re-check after timing on fresh inputs at
//!   other addresses), and a "kernel" 100x faster than the incumbent (flagged, not accepted);
//! - static (refused before compiling): a `__device__` counter kept across launches, a
//!   header outside the allow-list, a changed spec (knob values), a kernel that bumps
//!   `cta_counter` itself, device-heap allocation.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::chat_server::{ChatServer, Reply};
use common::Project;
use optimizerd::engine::RunEnd;
use optimizerd::storage::ledger::{IterationRecord, Ledger};
use serde_json::json;

const KEY_ENV: &str = "OPTD_TEST_AGENT_KEY";
const KEY: &str = "sk-test-0123456789-do-not-store";

fn plan(max_candidates: u32) -> String {
    format!(
        r#"
[open_phase]
enabled = false

[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"

[[stage]]
name = "agent"
template = "baseline.cu"
search = "agent"
max_candidates = {max_candidates}

[[stage]]
name = "after"
description = "runs after the agent stage, whatever happened there"
template = "kv_split.cu"
search = "exhaustive"
space = {{ BLOCK_M = [16], NUM_WARPS = [4], MAX_SPLITS = [1] }}
"#
    )
}

/// Marker comments in the edits select the scripted worker's behaviour.
fn rules() -> serde_json::Value {
    let cheat = |probe: &str, us: f64| json!({"cheat": {"probe": probe, "us": us}});
    json!([
        {"source_contains": ["AGENT_FAST"], "behaviour": {"ok": {"us": 50.0}}},
        {"source_contains": ["AGENT_WRONG"], "behaviour": "wrong"},
        {"source_contains": ["CHEAT_GUARD"], "behaviour": cheat("guard", 40.0)},
        {"source_contains": ["CHEAT_INPUTS"], "behaviour": cheat("inputs", 40.0)},
        {"source_contains": ["CHEAT_RERUN"], "behaviour": cheat("rerun", 2.0)},
        {"source_contains": ["CHEAT_RECHECK"], "behaviour": cheat("recheck", 60.0)},
        {"source_contains": ["CHEAT_TIMER"], "behaviour": {"ok": {"us": 1.0}}},
    ])
}

/// A search/replace proposal against kernel-templates/baseline.cu.
fn edit(summary: &str, search: &str, replace: &str) -> String {
    format!("Here is my proposal.\nSUMMARY: {summary}\n```cuda\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```\n")
}

fn improving() -> String {
    edit("unroll the key loop's dot product (AGENT_FAST)", "        s = warp_sum(s);", "        s = warp_sum(s);  // AGENT_FAST")
}

fn wrong() -> String {
    edit("skip the final normalisation", "    const float inv_l = 1.f / l;", "    const float inv_l = 1.f;  // AGENT_WRONG")
}

fn compile_error() -> String {
    edit("reciprocal without a semicolon", "    const float inv_l = 1.f / l;", "    const float inv_l = 1.f / l  // missing semicolon")
}

fn not_applying() -> String {
    edit("retile K in shared memory", "    for (int tile = 0; tile < n_tiles; ++tile) {", "    for (int tile = 0; tile < n_tiles; tile += 2) {")
}

const INCLUDE: &str = "#include \"common/optd.cuh\"";

/// (name, reply, expected verdict, words the reason must contain)
fn cheats() -> Vec<(&'static str, String, &'static str, &'static str)> {
    vec![
        (
            "writes past O",
            edit(
                "also zero the row after the last one (CHEAT_GUARD)",
                "    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] * inv_l);",
                "    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = from_f32(acc[i] * inv_l);\n    if (blockIdx.y == gridDim.y - 1 && row == seq_q - 1) orow[D + lane] = from_f32(0.f);  // CHEAT_GUARD",
            ),
            "cheating",
            "guard",
        ),
        (
            "writes K",
            edit(
                "reuse K's memory as scratch (CHEAT_INPUTS)",
                "        s = warp_sum(s);",
                "        s = warp_sum(s);\n        if (lane == 0 && j == 0) ((elem_t*)kr)[0] = from_f32(s);  // CHEAT_INPUTS",
            ),
            "cheating",
            "inputs",
        ),
        (
            "skips work when O looks written",
            edit(
                "early exit when the row is already done (CHEAT_RERUN)",
                "    const int key0 = mask.first_key(row), key_end = mask.limit(row);",
                "    const int key0 = mask.first_key(row), key_end = mask.limit(row);\n    { const float prev = to_f32(o[optd_head_off(strides.o_b, strides.o_h, b, h) + row * strides.o_s + lane]); if (__all_sync(0xffffffffu, prev == prev)) return; }  // CHEAT_RERUN",
            ),
            "cheating",
            "rerun",
        ),
        (
            "reuses an earlier result",
            edit(
                "keep the previous output when the scale repeats (CHEAT_RECHECK)",
                "    const float inv_l = 1.f / l;",
                "    const float inv_l = 1.f / l;  // CHEAT_RECHECK",
            ),
            "cheating",
            "fresh inputs at other addresses",
        ),
        (
            "100x faster than the incumbent",
            edit("remove the softmax (CHEAT_TIMER)", "        const float p = exp2f(s - m_new);", "        const float p = exp2f(s - m_new);  // CHEAT_TIMER"),
            "flagged",
            "implausibly fast",
        ),
        (
            "global state across launches",
            edit("count launches", INCLUDE, &format!("{INCLUDE}\n__device__ unsigned int launches_seen = 0;")),
            "rejected_proposal",
            "anti-cheat: declares mutable global device state",
        ),
        (
            "header outside the allow-list",
            edit("use printf for debugging", INCLUDE, &format!("{INCLUDE}\n#include <cstdio>")),
            "rejected_proposal",
            "anti-cheat: includes <cstdio>",
        ),
        (
            "changes the spec",
            edit("allow 8 warps per CTA", "WARPS_PER_CTA = [4]", "WARPS_PER_CTA = [4, 8]"),
            "rejected_proposal",
            "anti-cheat: changes the `optimizerd:spec` comment",
        ),
        (
            "fakes the CTA count",
            edit("count CTAs early", "        s = warp_sum(s);", "        s = warp_sum(s);\n        if (j == 0 && lane == 0) atomicAdd(cta_counter, 1u);"),
            "rejected_proposal",
            "anti-cheat: uses cta_counter",
        ),
        (
            "device heap",
            edit("scratch on the device heap", "    float m = OPTD_NEG_INF, l = 0.f;", "    float* scratch = (float*)malloc(64);\n    float m = OPTD_NEG_INF, l = 0.f;"),
            "rejected_proposal",
            "anti-cheat: uses `malloc`",
        ),
    ]
}

/// A project whose agent points at `server`, with `agent` extra `[agent]` lines.
fn project(server: &ChatServer, max_candidates: u32, agent: &str) -> Project {
    let p = Project::new(&plan(max_candidates), rules(), json!({"ok": {"us": 100.0}}));
    let mut section = format!("base_url = \"{}\"\nmodel = \"scripted-coder\"\n", server.base_url());
    for (key, value) in [("backoff", "\"50ms\""), ("request_timeout", "\"10s\"")] {
        if !agent.lines().any(|l| l.starts_with(key)) {
            section.push_str(&format!("{key} = {value}\n"));
        }
    }
    p.append_config(&format!("\n[baseline]\nsdpa = false\n\n[agent]\n{section}{agent}\n"));
    // Real NVRTC compiles every candidate: allow it the time it takes on a busy CPU.
    let cfg_path = p.path().join("agent.toml");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap().replace("load_timeout = \"5s\"", "load_timeout = \"120s\"");
    std::fs::write(&cfg_path, cfg).unwrap();
    let script_path = p.path().join("script.json");
    let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&script_path).unwrap()).unwrap();
    script["nvrtc"] = json!(true);
    std::fs::write(&script_path, serde_json::to_string_pretty(&script).unwrap()).unwrap();
    p
}

async fn ledger(p: &Project) -> Ledger {
    Ledger::open(&p.db()).await.unwrap()
}

async fn agent_iterations(p: &Project, run: &str) -> Vec<IterationRecord> {
    let l = ledger(p).await;
    let its = l.iterations(run).await.unwrap();
    l.close().await;
    its.into_iter().filter(|i| i.stage == "agent").collect()
}

async fn events(p: &Project, run: &str, kind: &str) -> Vec<String> {
    let l = ledger(p).await;
    let e = l.events(run).await.unwrap();
    l.close().await;
    e.into_iter().filter(|e| e.kind.as_str() == kind).map(|e| e.message).collect()
}

/// The rest of the plan ran: the stage after the agent's has its iteration.
async fn assert_plan_went_on(p: &Project, run: &str) {
    let l = ledger(p).await;
    let its = l.iterations(run).await.unwrap();
    l.close().await;
    let judged = |v: &str| matches!(v, "rejected" | "rejected_early");
    assert!(its.iter().any(|i| i.stage == "after" && judged(i.verdict.as_str())), "the stage after the agent's did not run: {its:#?}");
}

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let o = Command::new("git").current_dir(dir).args(args).output().unwrap();
    assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_improving_edit_is_accepted_committed_and_reported() {
    let server = ChatServer::start(vec![Reply::text(&improving())]).await;
    let p = project(&server, 1, &format!("api_key_env = \"{KEY_ENV}\"\nusd_per_mtok_prompt = 2.0\nusd_per_mtok_completion = 10.0\n"));
    // SAFETY: set before the run starts; no other thread of this test reads the environment concurrently.
    unsafe { std::env::set_var(KEY_ENV, KEY) };
    assert_eq!(p.run("a1", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));

    let its = agent_iterations(&p, "a1").await;
    assert_eq!(its.len(), 1, "{its:#?}");
    let it = &its[0];
    assert_eq!(it.verdict.as_str(), "accepted", "{it:#?}");
    assert_eq!(it.template, format!("baseline+agent#{}", it.seq));
    assert!(it.reason.starts_with("edit \"unroll the key loop's dot product (AGENT_FAST)\": won "), "{}", it.reason);
    assert!(it.shapes.iter().all(|s| s.won && (s.speedup_vs_incumbent.unwrap() - 2.0).abs() < 0.05), "{:#?}", it.shapes);
    assert_plan_went_on(&p, "a1").await;

    // What was sent: the template, the rules, the diagnosis, the GPU; the key as a header only.
    let reqs = server.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["model"], "scripted-coder");
    let user = reqs[0]["messages"][1]["content"].as_str().unwrap();
    for want in ["optimizerd:spec", "baseline_fwd", "SUMMARY:", "Diagnosis", "NVIDIA H100", "Include only", "b1h1s128d64"] {
        assert!(user.contains(want), "prompt lacks {want:?}");
    }
    assert_eq!(server.auth.lock().unwrap()[0].as_deref(), Some(format!("Bearer {KEY}").as_str()));

    // The ledger: the request with its tokens, cost and reply; never the key.
    let l = ledger(&p).await;
    let rows = l.agent_requests("a1").await.unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!((r.status.as_str(), r.prompt_tokens, r.completion_tokens), ("replied", Some(1000), Some(200)));
    assert!((r.cost_usd.unwrap() - (1000.0 * 2.0 + 200.0 * 10.0) / 1e6).abs() < 1e-12);
    assert_eq!(r.prompt_hash.len(), 64);
    assert!(r.reply_text.as_deref().unwrap().contains("AGENT_FAST"));
    let status = optimizerd::ops::report::status(&l, Some("a1")).await.unwrap();
    let text = optimizerd::ops::report::status_text(&status);
    assert!(text.contains("agent      1 requests of 20, 1200 tokens of 500000, $0.0040 of $5.00 (scripted-coder at http://127.0.0.1:"), "{text}");
    let history = optimizerd::ops::report::history_text(&l.iterations("a1").await.unwrap());
    assert!(history.lines().any(|l| l.contains("accepted") && l.contains("edit \"unroll the key loop's dot product")), "{history}");
    // The accepted agent kernel exports like any other: the exact source that was timed.
    let out = p.path().join("exported");
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(optimizerd::ops::export::export(&l, "a1", &out).await.unwrap()).unwrap()).unwrap();
    let k = &manifest["kernels"][0];
    assert_eq!((k["template"].as_str(), k["shapes"].as_array().map(|s| s.len())), (Some("baseline"), Some(2)), "{manifest:#}");
    assert!(std::fs::read_to_string(out.join(k["file"].as_str().unwrap())).unwrap().contains("AGENT_FAST"));
    l.close().await;
    let db = std::fs::read(p.db()).unwrap();
    assert!(!db.windows(KEY.len()).any(|w| w == KEY.as_bytes()), "the API key reached the ledger");

    // Git: the edit is the commit; best holds the edited kernel.
    let ws = p.workspace("a1");
    let log = git(&ws, &["log", "--format=%s", "best"]);
    assert!(log.contains("agent edit of baseline.cu: unroll the key loop's dot product"), "{log}");
    let diff = git(&ws, &["show", "best:agent/edit.diff"]);
    assert!(diff.contains("+        s = warp_sum(s);  // AGENT_FAST"), "{diff}");
    assert!(git(&ws, &["show", "best:kernels/b1h1s128d64.cu"]).contains("AGENT_FAST"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compile_error_wrong_result_and_an_edit_that_does_not_apply_are_recorded_best_of_three() {
    let contents = vec![compile_error(), wrong(), not_applying()];
    let server = ChatServer::start(vec![Reply::Choices { contents, prompt_tokens: 900, completion_tokens: 600 }]).await;
    let p = project(&server, 3, "proposals_per_request = 3\n");
    assert_eq!(p.run("a2", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    assert_eq!(server.requests.lock().unwrap()[0]["n"], 3);
    assert_eq!(server.request_count(), 1, "three proposals from one request");
    let its = agent_iterations(&p, "a2").await;
    let verdicts: Vec<&str> = its.iter().map(|i| i.verdict.as_str()).collect();
    assert_eq!(verdicts, ["compile_error", "incorrect", "rejected_proposal"], "{its:#?}");
    // The compile error is NVRTC's own.
    assert!(its[0].error.as_deref().unwrap_or("").contains("error"), "{:?}", its[0].error);
    assert!(its[0].reason.starts_with("edit \"reciprocal without a semicolon\":"), "{}", its[0].reason);
    assert!(its[1].reason.contains("max_abs"), "{}", its[1].reason);
    assert!(its[2].reason.contains("does not apply") && its[2].reason.contains("not found"), "{}", its[2].reason);
    assert!(its[2].git_commit.is_none() && its[2].arch.is_none(), "an edit that does not apply is never committed nor compiled");
    // Compiled-but-failed candidates are kept under refs/rejected.
    let refs = git(&p.workspace("a2"), &["for-each-ref", "--format=%(refname)", "refs/rejected"]);
    assert!(refs.contains(&format!("refs/rejected/{}", its[0].seq)) && refs.contains(&format!("refs/rejected/{}", its[1].seq)), "{refs}");
    assert_plan_went_on(&p, "a2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_scripted_cheat_is_caught() {
    let cheats = cheats();
    let replies: Vec<Reply> = cheats.chunks(5).map(|c| Reply::Choices { contents: c.iter().map(|x| x.1.clone()).collect(), prompt_tokens: 10, completion_tokens: 10 }).collect();
    let server = ChatServer::start(replies).await;
    let p = project(&server, cheats.len() as u32, "proposals_per_request = 5\n");
    assert_eq!(p.run("a3", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = agent_iterations(&p, "a3").await;
    assert_eq!(its.len(), cheats.len(), "{its:#?}");
    for ((name, _, verdict, why), it) in cheats.iter().zip(&its) {
        assert_eq!(it.verdict.as_str(), *verdict, "{name}: {it:#?}");
        assert!(it.reason.contains(why), "{name}: reason {:?} lacks {why:?}", it.reason);
        assert!(!it.shapes.iter().any(|s| s.won), "{name} won a shape");
    }
    // The best kernels are still the baseline's.
    let l = ledger(&p).await;
    assert!(l.best("a3").await.unwrap().iter().all(|b| b.seq == 1));
    l.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_429_with_retry_after_is_waited_for_then_the_reply_is_used() {
    let server = ChatServer::start(vec![
        Reply::Status { code: 429, retry_after: Some(1), body: "{\"error\":\"rate limited\"}".into() },
        Reply::text(&improving()),
    ])
    .await;
    let p = project(&server, 1, "");
    let t0 = Instant::now();
    assert_eq!(p.run("a4", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    assert!(t0.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was not honoured");
    assert_eq!(server.request_count(), 2);
    let its = agent_iterations(&p, "a4").await;
    assert_eq!(its[0].verdict.as_str(), "accepted", "{its:#?}");
    let l = ledger(&p).await;
    let rows = l.agent_requests("a4").await.unwrap();
    assert_eq!((rows.len(), rows[0].attempts), (1, Some(2)), "one request, two attempts: {rows:#?}");
    l.close().await;
}

/// One endpoint fault: the stage ends with `why` recorded, the run goes on.
async fn fault(run: &str, replies: Vec<Reply>, agent: &str, why: &str, attempts: usize) {
    let server = ChatServer::start(replies).await;
    let p = project(&server, 4, agent);
    assert_eq!(p.run(run, Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()), "{run}");
    let ended = events(&p, run, "agent_stage_end").await;
    assert_eq!(ended.len(), 1, "{run}: {ended:?}");
    assert!(ended[0].contains("request 1 failed") && ended[0].contains(why) && ended[0].ends_with("the plan goes on"), "{run}: {ended:?}");
    assert_eq!(server.request_count(), attempts, "{run}: attempts");
    assert!(agent_iterations(&p, run).await.is_empty(), "{run}: no proposal to evaluate");
    let l = ledger(&p).await;
    let rows = l.agent_requests(run).await.unwrap();
    assert_eq!(rows.len(), 1, "{run}");
    assert_eq!(rows[0].status.as_str(), "failed", "{run}");
    assert!(rows[0].error.as_deref().unwrap().contains(why), "{run}: {:?}", rows[0].error);
    l.close().await;
    assert_plan_went_on(&p, run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_500_is_retried_then_ends_the_stage() {
    let e500 = || Reply::Status { code: 500, retry_after: None, body: "{\"error\":\"boom\"}".into() };
    fault("f500", vec![e500(), e500(), e500()], "retries = 2\n", "HTTP 500 after 3 attempt(s)", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeout_ends_the_stage() {
    let slow = Reply::Delay(Duration::from_secs(5), Box::new(Reply::text(&improving())));
    fault("ftime", vec![slow], "retries = 0\nrequest_timeout = \"1s\"\n", "no reply within 1s", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_json_ends_the_stage() {
    fault("fjson", vec![Reply::Raw("{\"choices\": [{\"message\": ".into())], "", "malformed reply", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_enormous_reply_is_refused() {
    fault("fhuge", vec![Reply::Huge(8 << 20)], "max_reply_bytes = 65536\n", "larger than agent.max_reply_bytes = 65536", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_endpoint_that_is_down_ends_the_stage() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let p = Project::new(&plan(2), rules(), json!({"ok": {"us": 100.0}}));
    p.append_config(&format!("\n[baseline]\nsdpa = false\n\n[agent]\nbase_url = \"http://127.0.0.1:{port}/v1\"\nmodel = \"m\"\nretries = 1\nbackoff = \"10ms\"\n"));
    assert_eq!(p.run("fdown", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ended = events(&p, "fdown", "agent_stage_end").await;
    assert!(ended.len() == 1 && ended[0].contains("unreachable after 2 attempt(s)"), "{ended:?}");
    assert_plan_went_on(&p, "fdown").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_request_token_and_cost_limits_stop_the_stage() {
    // Requests: one allowed; the edit does not apply, and no second request is sent.
    let server = ChatServer::start(vec![Reply::text(&not_applying()), Reply::text(&improving())]).await;
    let p = project(&server, 5, "max_requests = 1\n");
    assert_eq!(p.run("l1", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    assert_eq!(server.request_count(), 1);
    let ended = events(&p, "l1", "agent_stage_end").await;
    assert!(ended[0].contains("limit reached: agent.max_requests reached (1 of 1)"), "{ended:?}");
    assert_plan_went_on(&p, "l1").await;

    // Tokens: the first reply used 400k of 405k; the next could pass the limit.
    let big = Reply::Choices { contents: vec![not_applying()], prompt_tokens: 399_000, completion_tokens: 1_000 };
    let server = ChatServer::start(vec![big, Reply::text(&improving())]).await;
    let p = project(&server, 5, "max_total_tokens = 405000\n");
    assert_eq!(p.run("l2", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    assert_eq!(server.request_count(), 1);
    let ended = events(&p, "l2", "agent_stage_end").await;
    assert!(ended[0].contains("limit reached: agent.max_total_tokens: 400000 used"), "{ended:?}");

    // Cost: $0.99 used of $1.00 at $10 per million completion tokens.
    let pricey = Reply::Choices { contents: vec![not_applying()], prompt_tokens: 0, completion_tokens: 99_000 };
    let server = ChatServer::start(vec![pricey, Reply::text(&improving())]).await;
    let p = project(&server, 5, "max_cost_usd = 1.0\nusd_per_mtok_completion = 10.0\n");
    assert_eq!(p.run("l3", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    assert_eq!(server.request_count(), 1);
    let ended = events(&p, "l3", "agent_stage_end").await;
    assert!(ended[0].contains("limit reached: agent.max_cost_usd: $0.9900 used"), "{ended:?}");
    let l = ledger(&p).await;
    let text = optimizerd::ops::report::status_text(&optimizerd::ops::report::status(&l, Some("l3")).await.unwrap());
    assert!(text.contains("agent      1 requests of 20, 99000 tokens of 500000, $0.9900 of $1.00"), "{text}");
    l.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_endpoint_the_agent_stage_is_skipped_with_the_reason() {
    let p = Project::new(&plan(2), rules(), json!({"ok": {"us": 100.0}}));
    p.append_config("\n[baseline]\nsdpa = false\n");
    assert_eq!(p.run("off", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let skipped = events(&p, "off", "stage_skipped").await;
    assert!(skipped.iter().any(|m| m.contains("stage agent skipped: the agent is off (no [agent] base_url")), "{skipped:?}");
    assert!(agent_iterations(&p, "off").await.is_empty());
    assert_plan_went_on(&p, "off").await;
}

// -- kill -9 and resume ---------------------------------------------------------------------

fn cli(p: &Project, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_optimizerd"));
    cmd.current_dir(p.path()).args(args).env_remove(optimizerd::failpoint::ENV);
    if matches!(args.first(), Some(&"start") | Some(&"resume")) {
        cmd.arg("--worker-script").arg(p.path().join("script.json"));
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run optimizerd")
}

fn runs_dir(p: &Project) -> PathBuf {
    p.path().join("runs")
}

async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_minus_nine_mid_request_then_resume_asks_again_and_finishes() {
    // The first request never gets its reply: the daemon is killed while waiting.
    let server = ChatServer::start(vec![Reply::Delay(Duration::from_secs(60), Box::new(Reply::text(&improving()))), Reply::text(&improving())]).await;
    let p = project(&server, 1, "request_timeout = \"2m\"\n");
    let o = cli(&p, &["start", "--budget", "10m", "--run-id", "k1", "--seed", "3"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    wait_until("the first agent request", Duration::from_secs(60), || server.request_count() == 1).await;
    let (_, pid) = optimizerd::daemon::lock::holder(&runs_dir(&p), 0).expect("daemon holds the lock");
    // SAFETY: kill(2) on the daemon this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let runs = runs_dir(&p);
    wait_until("the lock to be released", Duration::from_secs(10), || optimizerd::daemon::lock::holder(&runs, 0).is_none()).await;
    let o = cli(&p, &["resume", "k1", "--foreground"], &[]);
    assert!(o.status.success(), "resume: {}", text(&o));
    assert_eq!(server.request_count(), 2, "the unanswered request is asked again, once");
    let l = ledger(&p).await;
    let rows = l.agent_requests("k1").await.unwrap();
    let statuses: Vec<&str> = rows.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(statuses, ["interrupted", "replied"], "{rows:#?}");
    assert_eq!(l.agent_usage("k1").await.unwrap().requests, 1, "only the answered request counts");
    assert_eq!(l.run(Some("k1")).await.unwrap().state.to_string(), "finished");
    l.close().await;
    let its = agent_iterations(&p, "k1").await;
    assert_eq!(its.iter().map(|i| i.verdict.as_str()).collect::<Vec<_>>(), ["accepted"], "{its:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_minus_nine_after_the_reply_is_stored_never_pays_for_it_twice() {
    // The failpoint aborts the daemon right after the reply reached the ledger (the
    // iteration in progress is the baseline's, #1), before its proposals were evaluated.
    let server = ChatServer::start(vec![Reply::Choices { contents: vec![wrong(), improving()], prompt_tokens: 500, completion_tokens: 500 }]).await;
    let p = project(&server, 2, "proposals_per_request = 2\n");
    let fp = "agent-reply-stored@1".to_string();
    let o = cli(&p, &["start", "--budget", "10m", "--run-id", "k2", "--seed", "3"], &[(optimizerd::failpoint::ENV, &fp)]);
    assert!(o.status.success(), "{}", text(&o));
    let runs = runs_dir(&p);
    wait_until("the daemon to die at the failpoint", Duration::from_secs(60), || {
        server.request_count() == 1 && optimizerd::daemon::lock::holder(&runs, 0).is_none()
    })
    .await;
    assert!(agent_iterations(&p, "k2").await.is_empty(), "died before evaluating");
    let o = cli(&p, &["resume", "k2", "--foreground"], &[]);
    assert!(o.status.success(), "resume: {}", text(&o));
    assert_eq!(server.request_count(), 1, "the stored reply was used; nothing was asked again");
    let its = agent_iterations(&p, "k2").await;
    assert_eq!(its.iter().map(|i| i.verdict.as_str()).collect::<Vec<_>>(), ["incorrect", "accepted"], "{its:#?}");
    let l = ledger(&p).await;
    let u = l.agent_usage("k2").await.unwrap();
    assert_eq!((u.requests, u.tokens()), (1, 1000));
    l.close().await;
}

/// The device e2e's replies (scripts/agent_e2e_replies.json) do on the CPU what the GPU
/// run expects of them up to the GPU: the static rejections are rejected for the stated
/// reason, the compile error is NVRTC's, and every other edit applies, passes the static
/// checks and compiles for sm_90 with the real NVRTC (so the run on the H100 tests the
/// probes, not a typo).
#[test]
fn the_device_e2e_replies_behave_as_expected_up_to_the_gpu() {
    use optimizerd::agent::{anticheat, edits};
    use optimizerd::spec::template::{Params, Template};
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(common::repo_root().join("scripts/agent_e2e_replies.json")).unwrap()).unwrap();
    let dir = common::repo_root().join("kernel-templates");
    let tc = optimizerd::nvrtc::locate().unwrap_or_else(|e| panic!("NVRTC is required for this test (run scripts/setup.sh): {e}"));
    let mut base = Template::load(&dir, doc["template"].as_str().unwrap()).unwrap();
    let allowed = optimizerd::spec::agent::AgentSection::default().allowed_headers;
    let choices: Vec<String> = doc["replies"].as_array().unwrap().iter().flat_map(|r| r["choices"].as_array().cloned().unwrap_or_default()).map(|c| c.as_str().unwrap().to_string()).collect();
    let expected = doc["expected"].as_array().unwrap();
    assert_eq!(choices.len(), expected.len());
    let params: Params = [("WARPS_PER_CTA".to_string(), 4)].into();
    for (reply, e) in choices.iter().zip(expected) {
        let (name, verdict, why) = (e["name"].as_str().unwrap(), e["verdict"].as_str().unwrap(), e["reason"].as_str().unwrap());
        let proposal = edits::parse(reply).unwrap_or_else(|w| panic!("{name}: {w}"));
        let applied = edits::apply(&base.text, &proposal);
        if verdict == "rejected_proposal" {
            let refusal = applied.and_then(|t| anticheat::check(&base, &t, &allowed).map(|_| t)).map(|_| ()).unwrap_err();
            let refusal = format!("does not apply: {refusal} / anti-cheat: {refusal}");
            assert!(refusal.contains(why), "{name}: {refusal}");
            continue;
        }
        let text = applied.unwrap_or_else(|w| panic!("{name}: {w}"));
        anticheat::check(&base, &text, &allowed).unwrap_or_else(|w| panic!("{name}: {w}"));
        let t = Template::parse("baseline.cu", text).unwrap();
        for dtype in [optimizerd::spec::protocol::DType::Fp16, optimizerd::spec::protocol::DType::Bf16] {
            let src = optimizerd::pipeline::render::render(&t, &params, dtype, &dir).unwrap();
            let built = optimizerd::nvrtc::compile(&tc, &src.source, "candidate.cu", "sm_90", &[]);
            match verdict {
                "compile_error" => assert!(built.unwrap_err().log().contains("error"), "{name}"),
                _ => {
                    built.unwrap_or_else(|e| panic!("{name} ({}): {e}", dtype.as_str()));
                }
            }
        }
        if verdict == "accepted" {
            base = t;
        }
    }
}

/// scripts/agent_e2e.sh itself (endpoint, config, plan, the verdict checker) runs on the
/// CPU against the scripted worker (scripts/agent_e2e_rehearsal.json, which simulates
/// what each probe reports on the GPU) and ends with every verdict as expected.
#[test]
fn the_device_e2e_script_passes_its_cpu_rehearsal() {
    let root = common::repo_root();
    let out = tempfile::tempdir().unwrap();
    let o = Command::new("bash")
        .arg(root.join("scripts/agent_e2e.sh"))
        .env("OUT", out.path())
        .env("OPTIMIZERD_BIN", env!("CARGO_BIN_EXE_optimizerd"))
        .env("OPTIMIZERD_E2E_WORKER_SCRIPT", root.join("scripts/agent_e2e_rehearsal.json"))
        .output()
        .expect("bash scripts/agent_e2e.sh");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout.lines().last(), Some("agent e2e: 9/9 verdicts as expected"), "{stdout}");
    assert!(stdout.contains("check: 429 retried (attempts 2)                 yes"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_agent_endpoint() {
    use optimizerd::ops::doctor::{self, DoctorOptions, Status};
    let server = ChatServer::start(vec![]).await;
    let check = |agent: String| {
        let p = Project::new(&plan(1), rules(), json!({"ok": {"us": 100.0}}));
        if !agent.is_empty() {
            p.append_config(&format!("\n[agent]\n{agent}"));
        }
        p
    };
    let run = |p: &Project| DoctorOptions {
        config: Some(p.path().join("agent.toml")),
        worker: p.worker(),
        gpu_timeout: Duration::from_secs(20),
        python: "python3-optimizerd-test-absent".into(),
        python_timeout: Duration::from_secs(5),
    };
    let url = server.base_url();
    for (agent, status, words) in [
        (String::new(), Status::Skip, "off (no [agent] base_url)"),
        (format!("base_url = \"{url}\"\nmodel = \"scripted-coder\"\n"), Status::Ok, "endpoint answers; limits 20 requests"),
        (format!("base_url = \"{url}\"\nmodel = \"gpt-9\"\n"), Status::Warn, "does not list model gpt-9"),
        (format!("base_url = \"{url}\"\nmodel = \"m\"\napi_key_env = \"OPTD_TEST_KEY_THAT_IS_NOT_SET\"\n"), Status::Warn, "OPTD_TEST_KEY_THAT_IS_NOT_SET is not set"),
        ("base_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n".to_string(), Status::Warn, "unreachable"),
    ] {
        let p = check(agent.clone());
        let report = doctor::doctor(&run(&p)).await;
        let c = report.check("agent").expect("an agent check");
        assert_eq!(c.status, status, "{agent}: {}", report.text());
        assert!(c.detail.contains(words), "{agent}: {}", c.detail);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_tuning_evolves_the_knobs_of_the_accepted_edit() {
    let plan = r#"
[open_phase]
enabled = false

[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"

[[stage]]
name = "agent"
template = "kv_split.cu"
search = "agent"
max_candidates = 1
start = { BLOCK_M = 16, NUM_WARPS = 4, MAX_SPLITS = 1 }

[[stage]]
name = "agent-tuning"
template = "kv_split.cu"
search = "agent-tuning"
start_from_best = true
space = { BLOCK_M = [16], NUM_WARPS = [4], MAX_SPLITS = [1, 2, 4] }
max_candidates = 4
"#;
    let rules = json!([
        {"source_contains": ["AGENT_KV", "#define MAX_SPLITS 2"], "behaviour": {"ok": {"us": 30.0}}},
        {"source_contains": ["AGENT_KV"], "behaviour": {"ok": {"us": 50.0}}},
    ]);
    let server = ChatServer::start(vec![Reply::text(&edit(
        "note the split (AGENT_KV)",
        INCLUDE,
        &format!("{INCLUDE}\n// AGENT_KV"),
    ))])
    .await;
    let p = Project::new(plan, rules, json!({"ok": {"us": 100.0}}));
    p.append_config(&format!("\n[baseline]\nsdpa = false\n\n[agent]\nbase_url = \"{}\"\nmodel = \"m\"\n", server.base_url()));
    assert_eq!(p.run("t1", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let l = ledger(&p).await;
    let its = l.iterations("t1").await.unwrap();
    l.close().await;
    let edit_it = its.iter().find(|i| i.stage == "agent").unwrap();
    assert_eq!(edit_it.verdict.as_str(), "accepted", "{its:#?}");
    let name = format!("kv-split+agent#{}", edit_it.seq);
    let tuning: Vec<&IterationRecord> = its.iter().filter(|i| i.stage == "agent-tuning").collect();
    assert!(!tuning.is_empty() && tuning.iter().all(|i| i.template == name), "{tuning:#?}");
    let won = tuning.iter().find(|i| i.verdict.as_str() == "accepted").expect("a tuned point wins");
    assert!(won.params_json.contains("\"MAX_SPLITS\":2"), "{won:#?}");
    assert!(!tuning.iter().any(|i| i.params_json.contains("\"MAX_SPLITS\":1")), "the edit's own point is not measured again");
    // Without an accepted edit the stage is skipped with the reason.
    let p = Project::new(plan, json!([]), json!({"ok": {"us": 100.0}}));
    let server = ChatServer::start(vec![Reply::text(&not_applying())]).await;
    p.append_config(&format!("\n[baseline]\nsdpa = false\n\n[agent]\nbase_url = \"{}\"\nmodel = \"m\"\n", server.base_url()));
    assert_eq!(p.run("t2", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let skipped = events(&p, "t2", "stage_skipped").await;
    assert!(skipped.iter().any(|m| m == "stage agent-tuning skipped: no accepted agent edit of kv_split.cu to tune"), "{skipped:?}");
}
