//! `optimizerd doctor [--json]`: check that this machine can run optimizerd, one line per check.
//!
//! Checks, in order: the configuration parses; the runs folder is writable; the plan
//! and its templates load; NVRTC and the CUDA headers are found; a worker starts and
//! reports the GPU and driver; NVRTC can compile for the GPU's arch-specific target
//! (`sm_90a` on Hopper, which templates with `arch_specific = true` use); NVRTC is not
//! of a newer major version than the driver (a newer minor one is fine: cubins load under CUDA's minor-version compatibility); python3 with torch is there for the optional SDPA baseline. Each check says `ok`, `warn`, `fail` (or
//! `skip` when an earlier failure left nothing to check) with a detail, and every
//! problem comes with its fix. The report is returned, not printed: the caller shows
//! [`Report::text`] or the report as JSON and exits non-zero when [`Report::failed`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::spec::config::Config;
use crate::strategy::plan::Plan;
use crate::spec::protocol::DeviceInfo;
use crate::daemon::supervisor::{Supervisor, WorkerCommand, WorkerFailure};

/// A check's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    /// Not checked, because a check it depends on failed.
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// `config`, `runs`, `plan`, `nvrtc`, `gpu`, `arch`, `versions` or `torch`.
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do about it; present for `warn` and `fail`.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn skip(name: &str, detail: impl Into<String>) -> Check {
        Check { name: name.into(), status: Status::Skip, detail: detail.into(), fix: None }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
    /// The GPU the worker reported, when it started.
    pub device: Option<DeviceInfo>,
}

impl Report {
    /// True when any check failed: the caller exits non-zero.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// `ok   config   agent.toml (8 shapes, plan strategies/default.toml)`, one line per
    /// check, continuation lines indented, and `     fix: ...` under each problem.
    pub fn text(&self) -> String {
        const NAME: usize = 9;
        let indent = " ".repeat(5 + NAME);
        let mut s = String::new();
        for c in &self.checks {
            let mut lines = c.detail.lines();
            let _ = writeln!(s, "{:<4} {:<NAME$}{}", c.status.label(), c.name, lines.next().unwrap_or(""));
            for l in lines {
                let _ = writeln!(s, "{indent}{l}");
            }
            if let Some(fix) = &c.fix {
                let _ = writeln!(s, "     fix: {fix}");
            }
        }
        let (fails, warns) = (self.count(Status::Fail), self.count(Status::Warn));
        let _ = match (fails, warns) {
            (0, 0) => writeln!(s, "\nall checks passed"),
            (0, w) => writeln!(s, "\nno failures ({w} warning{})", plural(w)),
            (f, w) => writeln!(s, "\n{f} check{} failed, {w} warning{}", plural(f), plural(w)),
        };
        s
    }

    fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// What `doctor` checks with: the configuration to load, how to start a worker, limits.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// `--config`; None: `agent.toml` in the current folder, else the embedded defaults.
    pub config: Option<PathBuf>,
    /// How to start a worker (normally this binary's `worker` subcommand).
    pub worker: WorkerCommand,
    /// How long the worker may take to start and report its device.
    pub gpu_timeout: Duration,
    /// The Python interpreter to look for torch with.
    pub python: String,
    pub python_timeout: Duration,
}

impl DoctorOptions {
    /// The defaults: this executable as the worker, 60 s for the GPU, `python3`.
    pub fn new(config: Option<PathBuf>) -> anyhow::Result<Self> {
        let worker = WorkerCommand::current_exe().context("cannot find this executable to start a worker with")?;
        Ok(DoctorOptions {
            config,
            worker,
            gpu_timeout: Duration::from_secs(60),
            python: "python3".into(),
            python_timeout: Duration::from_secs(60),
        })
    }
}

const NVRTC_FIX: &str = "run scripts/setup.sh (installs NVRTC 13.0 and the CUDA headers into .deps/), \
or set OPTIMIZERD_NVRTC_LIB=/path/to/libnvrtc.so.13 and OPTIMIZERD_CUDA_INCLUDE=/path/to/cuda/include";
const DRIVER_FIX: &str = "install the NVIDIA driver (580 series or newer for CUDA 13.0) and check that `nvidia-smi` \
lists the GPU; in a container, start it with the GPU exposed (e.g. `docker run --gpus all`)";
const TORCH_FIX: &str = "optional: without torch, runs report speedups over the baseline kernel only; \
for the SDPA baseline install a CUDA build of torch (pip install torch)";

/// Run every check. Never fails itself: what goes wrong is a check's result.
pub async fn doctor(opts: &DoctorOptions) -> Report {
    let mut checks = Vec::new();

    let config = match Config::load(opts.config.as_deref()) {
        Ok(c) => {
            checks.push(Check::ok(
                "config",
                format!(
                    "{} ({} shape{}, plan {})",
                    c.source.display(),
                    c.workload.shapes.len(),
                    plural(c.workload.shapes.len()),
                    c.run.plan.display()
                ),
            ));
            Some(c)
        }
        Err(e) => {
            checks.push(Check::fail("config", crate::error_text::chain(&e), "correct the configuration as the message says"));
            None
        }
    };

    match &config {
        Some(c) => {
            checks.push(runs_check(c));
            checks.push(ledger_check(c).await);
            checks.push(plan_check(c));
        }
        None => {
            for name in ["runs", "ledger", "plan"] {
                checks.push(Check::skip(name, "not checked: the configuration did not load"));
            }
        }
    }

    let nvrtc = crate::nvrtc::locate();
    checks.push(match &nvrtc {
        Ok(tc) => Check::ok(
            "nvrtc",
            format!("NVRTC {}.{}: {}\nheaders: {}", tc.version.0, tc.version.1, tc.lib.display(), tc.include_dir.display()),
        ),
        Err(e) => Check::fail("nvrtc", e.to_string(), NVRTC_FIX),
    });

    // The worker's start and python's torch import are the slow checks: run them together.
    let (gpu, torch) = tokio::join!(gpu_check(opts), torch_check(opts));
    let device = gpu.as_ref().ok().cloned();
    checks.push(match gpu {
        Ok(d) => Check::ok(
            "gpu",
            format!(
                "{}, sm_{} ({}), {} SMs, {} KiB shared memory per block, driver {} ({})",
                d.name,
                d.cc(),
                d.arch,
                d.sm_count,
                d.smem_optin / 1024,
                driver_str(d.driver_version),
                d.driver_version
            ),
        ),
        Err((detail, fix)) => Check::fail("gpu", detail, fix),
    });

    checks.push(arch_check(config.as_ref(), device.as_ref(), nvrtc.as_ref().ok()).await);

    let nvrtc_version = device.as_ref().map(|d| d.nvrtc_version).or_else(|| nvrtc.as_ref().ok().map(|t| t.version));
    checks.push(versions_check(nvrtc_version, device.as_ref().map(|d| d.driver_version)));
    checks.push(torch);
    checks.push(match &config {
        Some(c) => agent_check(&c.agent).await,
        None => Check::skip("agent", "not checked: the configuration did not load"),
    });

    Report { checks, device }
}

/// The agent's endpoint: off, or its key present and `GET {base_url}/models` answering.
/// Never a failure: without the agent the plan runs, its agent stages skipped.
async fn agent_check(a: &crate::spec::agent::AgentSection) -> Check {
    if !a.enabled() {
        return Check::skip("agent", "off (no [agent] base_url): agent stages are skipped");
    }
    let mut detail = format!("{} at {}", a.model, a.base_url);
    let key = if a.api_key_env.is_empty() {
        None
    } else {
        match std::env::var(&a.api_key_env) {
            Ok(k) => Some(k),
            Err(_) => {
                return Check::warn(
                    "agent",
                    format!("{detail}: {} is not set", a.api_key_env),
                    format!("export {}=<your key>, or empty agent.api_key_env for a local server; agent stages end at once without it", a.api_key_env),
                )
            }
        }
    };
    let client = match reqwest::Client::builder().timeout(std::time::Duration::from_secs(5)).build() {
        Ok(c) => c,
        Err(e) => return Check::warn("agent", format!("{detail}: {e}"), "agent stages will end with this error"),
    };
    let mut req = client.get(format!("{}/models", a.base_url.trim().trim_end_matches('/')));
    if let Some(k) = &key {
        req = req.bearer_auth(k);
    }
    match req.send().await {
        Ok(r) if r.status().is_success() => {
            let listed = r
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| v["data"].as_array().map(|d| d.iter().any(|m| m["id"].as_str() == Some(a.model.as_str()))));
            match listed {
                Some(false) => Check::warn(
                    "agent",
                    format!("{detail}: the endpoint answers but does not list model {}", a.model),
                    "set agent.model to one of the endpoint's models (GET /models)",
                ),
                _ => {
                    detail.push_str(&format!(": endpoint answers; limits {} requests, {} tokens, ${:.2}", a.max_requests, a.max_total_tokens, a.max_cost_usd));
                    Check::ok("agent", detail)
                }
            }
        }
        Ok(r) => Check::warn("agent", format!("{detail}: GET /models answered HTTP {}", r.status().as_u16()), "check agent.base_url and the key; agent stages end with the endpoint's error"),
        Err(e) => Check::warn("agent", format!("{detail}: unreachable ({e})"), "start the model server or fix agent.base_url; agent stages end at once while it is down"),
    }
}

fn runs_check(config: &Config) -> Check {
    let dir = config.resolve(&config.run.runs_dir);
    let fix = format!(
        "make {} writable by this user (chmod/chown), or set `run.runs_dir` in {} to a writable folder",
        shown(&dir),
        config_name(config)
    );
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return Check::fail("runs", format!("cannot create {}: {e}", shown(&dir)), fix);
    }
    let probe = tempfile::Builder::new().prefix(".doctor-").tempfile_in(&dir).and_then(|mut f| {
        use std::io::Write;
        f.write_all(b"optimizerd doctor\n")?;
        f.as_file().sync_all()
    });
    if let Err(e) = probe {
        return Check::fail("runs", format!("cannot write in {}: {e}", shown(&dir)), fix);
    }
    match free_bytes(&dir) {
        Some(free) if free < (1 << 30) => Check::warn(
            "runs",
            format!("{} (writable; only {} free)", shown(&dir), human_bytes(free)),
            format!("free disk space under {}: every run keeps logs and a git workspace there", shown(&dir)),
        ),
        Some(free) => Check::ok("runs", format!("{} (writable, {} free)", shown(&dir), human_bytes(free))),
        None => Check::ok("runs", format!("{} (writable)", shown(&dir))),
    }
}

/// The ledger, opened as it is (read-only, nothing upgraded) and checked with `PRAGMA quick_check`.
async fn ledger_check(config: &Config) -> Check {
    use crate::storage::ledger::{Ledger, LedgerError};
    let path = config.resolve(&config.run.runs_dir).join("optimizer.db");
    match Ledger::check(&path).await {
        Ok(h) => {
            let upgrade = if h.schema < h.known_schema { format!("; schema {} is upgraded to {} by the next command", h.schema, h.known_schema) } else { String::new() };
            Check::ok("ledger", format!("{} (quick_check ok, {} run{}{upgrade})", shown(&path), h.runs, plural(h.runs as usize)))
        }
        Err(LedgerError::NotFound { .. }) => Check::ok("ledger", format!("{}: none yet (the first `optimizerd start` makes it)", shown(&path))),
        Err(LedgerError::Corrupt { source, .. }) => {
            Check::fail("ledger", format!("{} is damaged: {}", shown(&path), crate::error_text::chain(&source)), crate::storage::ledger::damaged_fix(&path))
        }
        Err(e) => Check::fail("ledger", crate::error_text::chain(&e), "as the message says"),
    }
}

fn plan_check(config: &Config) -> Check {
    let plan_path = config.resolve(&config.run.plan);
    let templates = config.resolve(&config.run.templates_dir);
    match Plan::load(&plan_path, &templates) {
        Ok(plan) => {
            let names: Vec<&str> = plan.stages.iter().map(|s| s.spec.name.as_str()).collect();
            let embedded = |p: &Path| if p.is_dir() { "" } else { " (embedded copy)" };
            let plan_dir = plan_path.parent().unwrap_or(Path::new("."));
            let truncated: Vec<String> = plan
                .stages
                .iter()
                .filter_map(|s| {
                    let (points, max, unpinned) = s.truncated()?;
                    let unpinned = if unpinned.is_empty() { String::new() } else { format!(", unpinned: {}", unpinned.join(", ")) };
                    Some(format!("stage `{}` (exhaustive) has {points} points and tries the first {max}{unpinned}", s.spec.name))
                })
                .collect();
            if !truncated.is_empty() {
                return Check::warn(
                    "plan",
                    format!("{}: {}", shown(&plan_path), truncated.join("; ")),
                    format!(
                        "in {}, pin in the stage's `space` the knobs it does not mean to search (e.g. `TAIL_SPLIT = [1]`), or raise its `max_candidates`",
                        shown(&plan_path)
                    ),
                );
            }
            Check::ok(
                "plan",
                format!(
                    "{}{}: {} stage{} ({}), templates {}{}",
                    shown(&plan_path),
                    embedded(plan_dir),
                    names.len(),
                    plural(names.len()),
                    names.join(", "),
                    shown(&templates),
                    embedded(&templates)
                ),
            )
        }
        Err(e) => Check::fail(
            "plan",
            e.to_string(),
            format!(
                "correct the plan or template as the message says, or point `run.plan` / `run.templates_dir` in {} elsewhere",
                config_name(config)
            ),
        ),
    }
}

/// Uses only sm_90a instructions (setmaxnreg, wgmma.fence): it compiles only when NVRTC
/// really targets the arch-specific variant.
const ARCH_SPECIFIC_PROBE: &str = r#"
extern "C" __global__ void __launch_bounds__(128) optd_probe_sm90a(int* out) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if (threadIdx.x == 0) *out = 1;
}
"#;

/// Can NVRTC build for this GPU's arch-specific target, and which templates of the plan
/// use it (or are skipped on this GPU, and why)?
async fn arch_check(config: Option<&Config>, device: Option<&DeviceInfo>, tc: Option<&crate::nvrtc::Toolchain>) -> Check {
    let Some(d) = device else {
        return Check::skip("arch", "not checked: no GPU reported");
    };
    // The plan's arch-specific templates (name, min_cc), once each.
    let mut specific: Vec<crate::spec::template::Meta> = Vec::new();
    if let Some(plan) = config.and_then(|c| Plan::load(&c.resolve(&c.run.plan), &c.resolve(&c.run.templates_dir)).ok()) {
        for st in plan.stages {
            if st.template.meta.arch_specific && !specific.iter().any(|m| m.name == st.template.meta.name) {
                specific.push(st.template.meta);
            }
        }
    }
    let usable: Vec<&str> = specific.iter().filter(|m| m.target_arch(d).is_ok()).map(|m| m.name.as_str()).collect();
    let skipped: Vec<String> = specific.iter().filter_map(|m| m.target_arch(d).err()).collect();
    let skipped_text = if skipped.is_empty() { String::new() } else { format!("
skipped on this GPU: {}", skipped.join("; ")) };
    if d.cc() < 90 {
        let what = if specific.is_empty() {
            "the plan has no arch-specific template".to_string()
        } else {
            format!("the plan's arch-specific templates are skipped{skipped_text}")
        };
        return Check::ok(
            "arch",
            format!(
                "{}: templates compile for {}; Hopper templates (arch_specific, sm_90a: wgmma, setmaxnreg) need compute capability 9.0 exactly, so {what}",
                d.arch, d.arch
            ),
        );
    }
    let target = format!("sm_{}{}a", d.cc_major, d.cc_minor);
    let Some(tc) = tc.cloned() else {
        return Check::skip("arch", format!("not checked: NVRTC was not found, so {target} cannot be probed"));
    };
    let probe_target = target.clone();
    let compiled = tokio::task::spawn_blocking(move || {
        // setmaxnreg/wgmma exist only on sm_90a; other arch-specific targets get an empty kernel.
        let src = if probe_target == "sm_90a" { ARCH_SPECIFIC_PROBE } else { "extern \"C\" __global__ void optd_probe(int* out) { *out = 1; }" };
        crate::nvrtc::compile(&tc, src, "arch_probe.cu", &probe_target, &[])
    })
    .await;
    let users = if usable.is_empty() { "no template of the plan uses it".to_string() } else { format!("used by {}", usable.join(", ")) };
    match compiled {
        Ok(Ok(_)) => Check::ok(
            "arch",
            format!(
                "NVRTC compiles for {target} (setmaxnreg, wgmma probe): templates with arch_specific = true use {target} ({users}), the others {}{skipped_text}",
                d.arch
            ),
        ),
        Ok(Err(e)) => {
            let detail = format!("NVRTC cannot compile for {target}, the arch-specific target of this GPU ({users}): {e}");
            let fix = "use NVRTC 12.0 or newer (scripts/setup.sh installs 13.0), or remove the arch-specific stages from the plan";
            if usable.is_empty() {
                Check::warn("arch", detail, fix)
            } else {
                Check::fail("arch", detail, fix)
            }
        }
        Err(e) => Check::warn("arch", format!("the {target} probe compile did not finish: {e}"), "run `optimizerd doctor` again"),
    }
}

/// A path as a person would write it: `runs`, not `./runs`.
fn shown(p: &Path) -> String {
    p.strip_prefix(".").unwrap_or(p).display().to_string()
}

fn config_name(config: &Config) -> String {
    let s = config.source.display().to_string();
    if s.starts_with('<') {
        "agent.toml".into()
    } else {
        s
    }
}

/// Start a worker, greet it, shut it down. Err: (detail, fix).
async fn gpu_check(opts: &DoctorOptions) -> Result<DeviceInfo, (String, String)> {
    let mut sup = Supervisor::new(opts.worker.clone(), opts.gpu_timeout, None);
    // The supervisor times the greeting out itself; the outer limit also covers a
    // shutdown that does not return.
    let outer = opts.gpu_timeout + Duration::from_secs(10);
    let started = tokio::time::timeout(outer, sup.ensure_started()).await;
    let result = match started {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(gpu_failure(&e, opts)),
        Err(_) => Err((
            format!("the worker did not report a device within {}s", outer.as_secs()),
            format!("check `nvidia-smi`: a hung or busy GPU, or a driver being reloaded; {DRIVER_FIX}"),
        )),
    };
    if tokio::time::timeout(Duration::from_secs(10), sup.shutdown()).await.is_err() {
        sup.kill().await;
    }
    result
}

fn gpu_failure(e: &WorkerFailure, opts: &DoctorOptions) -> (String, String) {
    let detail = e.to_string();
    let fix = match e {
        WorkerFailure::Timeout(t) => format!(
            "the worker got no answer from the GPU within {}s: check `nvidia-smi` (a hung or busy GPU, or a driver being reloaded)",
            t.as_secs()
        ),
        WorkerFailure::Start(m) if m.starts_with("cannot run ") => format!(
            "the worker is `{} {}`; reinstall optimizerd or run the binary from where it was built",
            opts.worker.program.display(),
            opts.worker.args.join(" ")
        ),
        _ if detail.contains("NVRTC") || detail.contains("cuda_fp16.h") => NVRTC_FIX.to_string(),
        _ => DRIVER_FIX.to_string(),
    };
    (detail, fix)
}

/// `13000` -> `13.0`, `12080` -> `12.8`.
fn driver_str(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn versions_check(nvrtc: Option<(i32, i32)>, driver: Option<i32>) -> Check {
    let (Some(n), Some(d)) = (nvrtc, driver) else {
        let missing = match (nvrtc, driver) {
            (None, None) => "no NVRTC and no driver version",
            (None, _) => "no NVRTC version",
            _ => "no driver version (the gpu check failed)",
        };
        return Check::skip("versions", format!("not checked: {missing}"));
    };
    let dv = (d / 1000, (d % 1000) / 10);
    if n.0 == dv.0 && n.1 > dv.1 {
        // CUDA's minor-version compatibility: a cubin from a newer NVRTC of the same major
        // version loads on the older driver (PTX would not; the daemon only ever loads cubins).
        // Measured: NVRTC 13.4's wgmma-tma cubins load and pass the checks on driver 580 (CUDA
        // 13.0), docs/HOPPER.md "A newer ptxas".
        return Check::ok(
            "versions",
            format!(
                "NVRTC {}.{} on driver CUDA {}.{}: same major version, cubins load (minor-version compatibility; the daemon never JIT-compiles PTX)",
                n.0, n.1, dv.0, dv.1
            ),
        );
    }
    if n > dv {
        let fix = if dv >= (13, 0) {
            format!(
                "pin NVRTC {}.{} via scripts/setup.sh (its .deps/ copy is searched before $CUDA_HOME; unset OPTIMIZERD_NVRTC_LIB if it names the newer one), or upgrade the driver",
                dv.0, dv.1
            )
        } else {
            "upgrade the NVIDIA driver to one supporting CUDA 13.0 (580 series or newer); optimizerd pins NVRTC 13.0 via scripts/setup.sh".to_string()
        };
        Check::fail(
            "versions",
            format!("NVRTC {}.{} is newer than the driver's CUDA {}.{}: cubins from a newer major version won't load", n.0, n.1, dv.0, dv.1),
            fix,
        )
    } else {
        Check::ok("versions", format!("NVRTC {}.{} <= driver CUDA {}.{}", n.0, n.1, dv.0, dv.1))
    }
}

const TORCH_PROBE: &str =
    "import torch,sys; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.is_available())";

async fn torch_check(opts: &DoctorOptions) -> Check {
    let py = &opts.python;
    let mut cmd = tokio::process::Command::new(py);
    cmd.arg("-c").arg(TORCH_PROBE).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let output = match tokio::time::timeout(opts.python_timeout, cmd.output()).await {
        Err(_) => {
            return Check::warn(
                "torch",
                format!("`{py} -c \"import torch\"` did not finish within {}s", opts.python_timeout.as_secs()),
                TORCH_FIX,
            )
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Check::warn("torch", format!("{py} not found"), TORCH_FIX);
        }
        Ok(Err(e)) => return Check::warn("torch", format!("cannot run {py}: {e}"), TORCH_FIX),
        Ok(Ok(o)) => o,
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("exited with an error").trim().to_string();
        return Check::warn("torch", format!("{py} cannot import torch: {last}"), TORCH_FIX);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let words: Vec<&str> = stdout.lines().last().unwrap_or("").split_whitespace().collect();
    let [version, cuda, cudnn, available] = words[..] else {
        return Check::warn("torch", format!("unexpected answer from {py}: {:?}", stdout.trim()), TORCH_FIX);
    };
    if cuda == "None" {
        return Check::warn("torch", format!("torch {version} is a CPU-only build"), TORCH_FIX);
    }
    let cudnn = if cudnn == "None" { "no cuDNN".to_string() } else { format!("cuDNN {cudnn}") };
    if available != "True" {
        return Check::warn(
            "torch",
            format!("torch {version} (CUDA {cuda}, {cudnn}) cannot see a GPU (torch.cuda.is_available() is False)"),
            format!("{TORCH_FIX}; if the gpu check passes, the torch build's CUDA {cuda} may need a newer driver"),
        );
    }
    Check::ok("torch", format!("torch {version} (CUDA {cuda}, {cudnn}), GPU visible: SDPA baseline available"))
}

/// Free bytes on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the struct we own through a valid pointer; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

fn human_bytes(b: u64) -> String {
    let gib = b as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{} MiB", b >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_minor_nvrtc_passes_and_a_newer_major_fails() {
        let same_major = versions_check(Some((13, 4)), Some(13000));
        assert_eq!(same_major.status, Status::Ok, "{}", same_major.detail);
        assert!(same_major.detail.contains("minor-version compatibility"), "{}", same_major.detail);
        let newer_major = versions_check(Some((13, 0)), Some(12080));
        assert_eq!(newer_major.status, Status::Fail, "{}", newer_major.detail);
        let older = versions_check(Some((13, 0)), Some(13020));
        assert_eq!(older.status, Status::Ok, "{}", older.detail);
    }
}
