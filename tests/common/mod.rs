//! Shared fixtures: a temporary project (config, plan, worker script) whose runs
//! are driven by the real engine against the scripted worker process.

#![allow(dead_code)]

pub mod chat_server;
pub mod cli;
pub mod postgres;

use std::path::{Path, PathBuf};
use std::time::Duration;

use optimizerd::spec::config::Config;
use optimizerd::engine::{self, RunEnd, RunOptions};
use optimizerd::spec::protocol::DeviceInfo;
use optimizerd::daemon::supervisor::WorkerCommand;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn h100() -> DeviceInfo {
    DeviceInfo {
        name: "NVIDIA H100 80GB HBM3 (scripted)".into(),
        cc_major: 9,
        cc_minor: 0,
        sm_count: 132,
        smem_optin: 232448,
        smem_per_sm: 233472,
        l2_bytes: 50 * 1024 * 1024,
        max_threads_per_sm: 2048,
        driver_version: 13000,
        nvrtc_version: (13, 0),
        arch: "sm_90".into(),
    }
}

pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    /// A project folder with `agent.toml` (two small shapes, short worker timeouts),
    /// the plan `plan_toml` and the worker script `rules` (JSON array) + `default`.
    pub fn new(plan_toml: &str, rules: serde_json::Value, default: serde_json::Value) -> Project {
        let dir = tempfile::tempdir().unwrap();
        let templates = repo_root().join("kernel-templates");
        std::fs::write(
            dir.path().join("agent.toml"),
            format!(
                r#"
[run]
runs_dir = "runs"
plan = "plan.toml"
templates_dir = "{}"

[workload]
dtype = "fp16"
shapes = [ {{ b = 1, h = 1, s = 128, d = 64 }}, {{ b = 2, h = 8, s = 512, d = 128, causal = true }} ]

[timing]
rounds = 2
samples_per_round = 5

[worker]
hello_timeout = "10s"
load_timeout = "5s"
check_timeout = "2s"
time_timeout = "2s"
gpu_wait_limit = "3s"
gpu_retry_max = "200ms"
"#,
                templates.display()
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("plan.toml"), plan_toml).unwrap();
        let script = serde_json::json!({ "device": h100(), "rules": rules, "default": default });
        std::fs::write(dir.path().join("script.json"), serde_json::to_string_pretty(&script).unwrap()).unwrap();
        Project { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn config(&self) -> Config {
        Config::load_file(&self.path().join("agent.toml")).unwrap()
    }

    pub fn worker(&self) -> WorkerCommand {
        WorkerCommand {
            program: PathBuf::from(env!("CARGO_BIN_EXE_optimizerd")),
            args: vec!["worker".into(), "--script".into(), self.path().join("script.json").display().to_string()],
            env: vec![],
        }
    }

    pub async fn run(&self, run_id: &str, budget: Duration) -> RunEnd {
        self.run_with(run_id, budget, false).await
    }

    /// A new run; `fresh` ignores the memory of earlier runs (`start --fresh`).
    pub async fn run_with(&self, run_id: &str, budget: Duration, fresh: bool) -> RunEnd {
        let config = self.config();
        let opts = RunOptions {
            plan_path: config.resolve(&config.run.plan),
            config,
            budget,
            worker: self.worker(),
            run_id: Some(run_id.into()),
            seed: Some(7),
            mode: engine::Mode::New,
            allow_concurrent: false,
            fresh,
            placement: Default::default(),
        };
        let (id, end) = engine::run(opts, optimizerd::daemon::shutdown::Shutdown::never()).await.expect("run completes");
        assert_eq!(id, run_id);
        end
    }

    pub fn db(&self) -> PathBuf {
        self.path().join("runs/optimizer.db")
    }

    pub fn workspace(&self, run_id: &str) -> PathBuf {
        self.path().join("runs").join(run_id).join("workspace")
    }
}

impl Project {
    /// Replace the `[workload]` shapes line of agent.toml with `lines` (e.g. a
    /// `layout = "bshd"` line and a `shapes = [...]` line in the new grammar).
    pub fn set_workload(&self, lines: &str) {
        let path = self.path().join("agent.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let old = text.lines().find(|l| l.starts_with("shapes = [")).expect("agent.toml has a shapes line").to_string();
        std::fs::write(path, text.replace(&old, lines)).unwrap();
    }

    /// Turn screening off (`timing.early_reject = 0`): fault drills whose scripted kernels are
    /// slow and fail only in the check (crash, CTA mismatch, wrong output) would otherwise be
    /// rejected early, before the check they exercise.
    pub fn without_screening(&self) {
        let path = self.path().join("agent.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("samples_per_round = 5\n"), "the fixture's [timing] table moved");
        std::fs::write(path, text.replace("samples_per_round = 5\n", "samples_per_round = 5\nearly_reject = 0\n")).unwrap();
    }

    /// Append TOML (e.g. a `[baseline]` section) to the project's agent.toml.
    pub fn append_config(&self, toml: &str) {
        let path = self.path().join("agent.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(toml);
        std::fs::write(path, text).unwrap();
    }
}

impl Project {
    /// Make the scripted worker report `device` (e.g. an sm_89 GPU) instead of the H100.
    pub fn set_device(&self, device: &DeviceInfo) {
        self.set_script("device", serde_json::to_value(device).unwrap());
    }

    /// Every worker request takes this long (so a budget ends a run mid-way).
    pub fn set_step_delay_ms(&self, ms: u64) {
        self.set_script("step_delay_ms", serde_json::json!(ms));
    }

    /// A load whose build the look-ahead did not ask for waits this long for it (and says so).
    pub fn set_compile_ms(&self, ms: u64) {
        self.set_script("compile_ms", serde_json::json!(ms));
    }

    /// Replace the worker script's rules (e.g. a kernel that was correct becomes wrong).
    pub fn set_rules(&self, rules: serde_json::Value) {
        self.set_script("rules", rules);
    }

    fn set_script(&self, key: &str, value: serde_json::Value) {
        let path = self.path().join("script.json");
        let mut script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        script[key] = value;
        std::fs::write(path, serde_json::to_string_pretty(&script).unwrap()).unwrap();
    }
}

/// An Ada GPU (sm_89): no arch-specific Hopper target.
pub fn l4() -> DeviceInfo {
    DeviceInfo {
        name: "NVIDIA L4 (scripted)".into(),
        cc_major: 8,
        cc_minor: 9,
        sm_count: 58,
        smem_optin: 101376,
        smem_per_sm: 102400,
        l2_bytes: 48 * 1024 * 1024,
        max_threads_per_sm: 1536,
        driver_version: 13000,
        nvrtc_version: (13, 0),
        arch: "sm_89".into(),
    }
}

/// A plan that walks a baseline, a planted crash and the kv-split template (shared by the
/// report tests and the old-ledger fixture, `tests/fixtures/ledger-719c150.tar.gz`, which
/// was made with it and [`kv_split_rules`]).
pub const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "planted-oob-write"
template = "testing/oob_write.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [1, 2, 4, 8] }

[[stage]]
name = "kv-split-deep"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [16] }

[open_phase]
enabled = false
"#;

/// The worker's answers for [`PLAN`]: one kernel per verdict (crash, compile error, wrong,
/// faster), and the deepest split faster on the small shape only.
pub fn kv_split_rules() -> serde_json::Value {
    serde_json::json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["template `test-oob-write`"], "behaviour": { "crash": { "step": "check" } } },
        { "source_contains": ["#define MAX_SPLITS 1\n"], "behaviour": { "ok": { "us": 99.0 } } },
        { "source_contains": ["#define MAX_SPLITS 2\n"], "behaviour": { "compile_error": { "log": "kernel.cu(12): error: expected a \";\"" } } },
        { "source_contains": ["#define MAX_SPLITS 4\n"], "behaviour": "wrong" },
        { "source_contains": ["#define MAX_SPLITS 8\n"], "behaviour": { "ok": { "us": 40.0 } } },
        { "source_contains": ["#define MAX_SPLITS 16\n"], "behaviour": { "ok": { "us": 60.0, "per_shape": { "b1h1s128d64": 20.0 } } } }
    ])
}

/// A plan of two stages without the open phase: the baseline kernel, then kv-split over
/// `splits` (e.g. "1, 2, 4, 8") at BLOCK_M 32 and 4 warps. Scripted rules tell the candidates
/// apart by their `#define MAX_SPLITS n` line.
pub fn kv_split_plan(splits: &str) -> String {
    format!(
        r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = {{ BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [{splits}] }}

[open_phase]
enabled = false
"#
    )
}
