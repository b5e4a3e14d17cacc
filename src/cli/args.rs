//! What each subcommand takes: its arguments (every one described), the parsers that
//! bound what users type (budgets of at most 30 days, seeds, run ids, verdicts, each
//! refused with what is allowed), and the detached daemon's argv, built once here from
//! the parsed arguments.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::spec::protocol::{DType, Layout};
use crate::group::{parse_gpus, GpuSelection};
use crate::spec::states::Verdict;

/// The longest budget `start` accepts.
pub const MAX_BUDGET: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest `stop --wait`.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// A duration as people write it (`45s`, `5m`, `1h30m`), more than zero and at most `max`.
fn duration_at_most(s: &str, max: Duration, max_words: &str) -> Result<Duration, String> {
    let examples = format!("write e.g. 45s, 5m, 1h30m (at most {max_words})");
    if s.trim_start().starts_with('-') {
        return Err(format!("cannot be negative; {examples}"));
    }
    let d = humantime::parse_duration(s.trim()).map_err(|e| format!("{e}; {examples}"))?;
    if d.is_zero() {
        return Err(format!("must be more than zero; {examples}"));
    }
    if d > max {
        return Err(format!("is longer than {max_words}; {examples}"));
    }
    Ok(d)
}

pub fn parse_budget(s: &str) -> Result<Duration, String> {
    duration_at_most(s, MAX_BUDGET, "30 days")
}

fn parse_wait(s: &str) -> Result<Duration, String> {
    duration_at_most(s, MAX_WAIT, "24h")
}

fn parse_seed(s: &str) -> Result<u64, String> {
    s.trim().parse::<u64>().map_err(|_| format!("a seed is a whole number from 0 to {}", u64::MAX))
}

/// A run id: a plain name (it names a folder under the runs folder).
pub fn parse_run_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 100
        && !s.starts_with(['.', '-'])
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(s.to_string())
    } else {
        Err("a run id is a name such as 20261121-184149-4b49 (letters, digits, `-`, `_`, `.`); `optimizerd runs` lists them".into())
    }
}

fn parse_verdict(s: &str) -> Result<Verdict, String> {
    s.trim().parse::<Verdict>().map_err(|e| e.to_string())
}

fn verdict_help() -> String {
    let names: Vec<&str> = Verdict::ALL.iter().map(|v| v.as_str()).collect();
    format!("Only these verdicts, e.g. `--verdict incorrect,crashed` (one of: {})", names.join(", "))
}

#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// Stay attached to the terminal (systemd, containers, CI). Without it the run detaches
    /// once it has found the GPU.
    #[arg(long)]
    pub foreground: bool,
    /// Run even if another run holds this GPU (timings will disturb each other).
    #[arg(long)]
    pub allow_concurrent: bool,
    /// Seed for the random inputs, 0 to 18446744073709551615 (default: drawn fresh).
    #[arg(long, value_name = "N", value_parser = parse_seed, allow_hyphen_values = true)]
    pub seed: Option<u64>,
    /// Test double: drive a scripted worker instead of the GPU.
    #[arg(long, hide = true, value_name = "FILE")]
    pub worker_script: Option<PathBuf>,
    /// The host GPU this daemon owns (set by a `--gpus` group, which also makes it the only
    /// visible device): its lock is `gpu-N.lock`, and the ledger records it.
    #[arg(long, hide = true, value_name = "N")]
    pub gpu: Option<u32>,
    /// The `--gpus` group that started this daemon (recorded with the run).
    #[arg(long, hide = true, value_name = "GROUP", value_parser = parse_run_id)]
    pub group: Option<String>,
    /// A fleet's PostgreSQL database (postgres://USER:PASSWORD@HOST:PORT/DB) holding the
    /// group's queue and memory across runs, shared by every machine that starts the same
    /// group id with it (`--gpus` only; default: `fleet.ledger` of the configuration).
    #[arg(long, value_name = "URL")]
    pub ledger: Option<String>,
}

impl DaemonArgs {
    /// The flags the detached daemon is given: these, in the foreground, with the same config.
    fn argv(&self, config: Option<&Path>) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec!["--foreground".into()];
        if let Some(c) = config {
            argv.extend(["--config".into(), c.into()]);
        }
        if self.allow_concurrent {
            argv.push("--allow-concurrent".into());
        }
        if let Some(s) = self.seed {
            argv.extend(["--seed".into(), s.to_string().into()]);
        }
        if let Some(w) = &self.worker_script {
            argv.extend(["--worker-script".into(), w.into()]);
        }
        if let Some(g) = self.gpu {
            argv.extend(["--gpu".into(), g.to_string().into()]);
        }
        if let Some(g) = &self.group {
            argv.extend(["--group".into(), g.into()]);
        }
        if let Some(l) = &self.ledger {
            argv.extend(["--ledger".into(), l.into()]);
        }
        argv
    }
}


#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// How long to optimize, e.g. 45s, 5m, 1h30m (more than zero, at most 30 days). The
    /// candidate in flight finishes past it.
    #[arg(long, value_name = "DURATION", value_parser = parse_budget, allow_hyphen_values = true)]
    pub budget: Duration,
    /// Strategy plan (default: `run.plan` from the configuration, strategies/default.toml).
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// Ignore what earlier runs measured on this kind of GPU. By default a run warm-starts
    /// each shape from the best kernel an earlier run found (re-checked and re-timed first)
    /// and skips the exact sources already measured; --fresh measures everything again.
    #[arg(long)]
    pub fresh: bool,
    /// Optimize on several GPUs of this host: `all`, or indices such as 0,2. The workload is
    /// split into one work item per shape class; one daemon per GPU takes the next item
    /// (its own run, on its GPU, with a share of the budget) until the queue is empty or the
    /// budget is spent. The GPUs must be one model. The group is one id for `watch`,
    /// `status`, `stop` and `resume`.
    #[arg(long, value_name = "all|N,M", value_parser = parse_gpus)]
    pub gpus: Option<GpuSelection>,
    /// Optimize only these shapes of the workload (shape keys, as `status` shows them).
    #[arg(long, value_name = "KEY,KEY", value_delimiter = ',')]
    pub shapes: Option<Vec<String>>,
    #[command(flatten)]
    pub daemon: DaemonArgs,
    /// Run id to use, or with --gpus the group's (default: made from the clock). The machines
    /// of a fleet start the same group id.
    #[arg(long, value_name = "ID", value_parser = parse_run_id)]
    pub run_id: Option<String>,
}

impl StartArgs {
    /// The detached daemon's command line: this start, in the foreground, as `run_id`.
    pub fn child_argv(&self, run_id: &str, config: Option<&Path>) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec!["start".into(), "--run-id".into(), run_id.into()];
        argv.extend(["--budget".into(), humantime::format_duration(self.budget).to_string().into()]);
        if let Some(p) = &self.plan {
            argv.extend(["--plan".into(), p.into()]);
        }
        if self.fresh {
            argv.push("--fresh".into());
        }
        if let Some(keys) = &self.shapes {
            argv.extend(["--shapes".into(), keys.join(",").into()]);
        }
        if let Some(g) = &self.gpus {
            argv.extend(["--gpus".into(), g.to_string().into()]);
        }
        argv.extend(self.daemon.argv(config));
        argv
    }
}

#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// Run id (default: the most recent run that can be resumed).
    #[arg(value_parser = parse_run_id)]
    pub run: Option<String>,
    /// Allow resuming on a different GPU model: the incumbents are re-timed there.
    #[arg(long)]
    pub rebaseline: bool,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

impl ResumeArgs {
    /// The detached daemon's command line: this resume of `run_id`, in the foreground.
    pub fn child_argv(&self, run_id: &str, config: Option<&Path>) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec!["resume".into(), run_id.into()];
        if self.rebaseline {
            argv.push("--rebaseline".into());
        }
        argv.extend(self.daemon.argv(config));
        argv
    }
}

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// Run id (default: the most recent run).
    #[arg(value_parser = parse_run_id)]
    pub run: Option<String>,
    /// Pass the run's log through unchanged: JSON Lines (one JSON object per line), for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct StopArgs {
    /// Run id (default: the run holding the GPU).
    #[arg(value_parser = parse_run_id)]
    pub run: Option<String>,
    /// Abandon the candidate in flight (recorded as interrupted) instead of finishing it.
    #[arg(long)]
    pub now: bool,
    /// How long to wait for the daemon to exit (at most 24h).
    #[arg(long, value_name = "DURATION", value_parser = parse_wait, default_value = "10m", allow_hyphen_values = true)]
    pub wait: Duration,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Run id (default: the most recent run).
    #[arg(value_parser = parse_run_id)]
    pub run: Option<String>,
    /// Machine-readable output (one JSON document).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    /// Machine-readable output (one JSON document: a list, unreadable runs with their `error`).
    #[arg(long)]
    pub json: bool,
    /// Remove failed runs and runs that never started (no GPU recorded, or a folder the
    /// ledger does not know), with their folders; runs with results are kept.
    #[arg(long)]
    pub prune: bool,
}

#[derive(Debug, clap::Args)]
pub struct ForgetArgs {
    /// The runs to remove from the ledger, with their folders.
    #[arg(required = true, value_parser = parse_run_id)]
    pub runs: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// Run id (default: the most recent run).
    #[arg(value_parser = parse_run_id)]
    pub run: Option<String>,
    /// Machine-readable output (the full records, per-shape rows included).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// One CSV row per iteration, with each shape's median time and whether it won.
    #[arg(long)]
    pub csv: bool,
    /// Only these stages (repeat or separate with commas); `open/*` matches every open-phase class.
    #[arg(long, value_delimiter = ',', value_name = "STAGE")]
    pub stage: Vec<String>,
    #[arg(long, value_delimiter = ',', value_name = "VERDICT", value_parser = parse_verdict, help = verdict_help())]
    pub verdict: Vec<Verdict>,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Run id (default: the most recent run), or a `--gpus` group's id: every item's run, and
    /// an index.
    #[arg(value_parser = parse_run_id)]
    pub run: Option<String>,
    /// Folder to write into (created if needed; default: runs/<run or group>/report).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print what was written (paths, notes) as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("into").required(true).multiple(true).args(["out", "python"]))]
pub struct ExportArgs {
    /// Run id (default: the most recent run).
    #[arg(value_parser = parse_run_id)]
    pub run: Option<String>,
    /// Folder to write the kernels (.cu) and manifest.json into (created if needed).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Folder to write an installable Python package into: the kernels, their cubins
    /// (compiled with NVRTC for the GPU the run tuned on) and a torch custom op that
    /// dispatches over them; then `pip install DIR` (no network needed). A folder an
    /// earlier `export --python` wrote is replaced; any other non-empty folder is refused.
    #[arg(long, value_name = "DIR")]
    pub python: Option<PathBuf>,
    /// The package's import name with --python (a Python identifier; also the op
    /// namespace, torch.ops.NAME).
    #[arg(long, value_name = "NAME", default_value = crate::ops::python_package::DEFAULT_NAME, requires = "python", value_parser = parse_package_name)]
    pub package_name: String,
    /// Print what was written as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

fn parse_package_name(s: &str) -> Result<String, String> {
    crate::ops::python_package::validate_name(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

fn parse_positive(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number of at least 1 (e.g. 4096)")),
    }
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "bf16" | "bfloat16" => Ok(DType::Bf16),
        "fp16" | "float16" => Ok(DType::Fp16),
        _ => Err("the kernel templates tune bf16 and fp16: write --dtype bf16 or --dtype fp16".into()),
    }
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    match s {
        "bhsd" => Ok(Layout::Bhsd),
        "bshd" => Ok(Layout::Bshd),
        _ => Err("write bhsd ([B, H, S, D]: transformers, SDPA) or bshd ([B, S, H, D]: FlashAttention, vLLM)".into()),
    }
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("lengths").required(true).multiple(true).args(["prefill", "decode_context"]))]
pub struct WorkloadArgs {
    /// A transformers config.json: num_attention_heads, num_key_value_heads, head_dim (or
    /// hidden_size), torch_dtype; a multimodal model's under text_config.
    #[arg(long, value_name = "CONFIG.json")]
    pub from_hf: PathBuf,
    /// Prompt lengths: prefill shapes with sq = sk = LEN, causal (comma-separated or repeated).
    #[arg(long, value_name = "LEN", value_delimiter = ',', value_parser = parse_positive)]
    pub prefill: Vec<u32>,
    /// KV cache lengths: decode shapes with one query row against LEN keys.
    #[arg(long, value_name = "LEN", value_delimiter = ',', value_parser = parse_positive)]
    pub decode_context: Vec<u32>,
    /// Chunked prefill: also a shape of N queries against each --prefill length above N
    /// (the last chunk of a long prompt), causal.
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    pub chunk: Option<u32>,
    /// Speculative decoding: also shapes of N query rows (a draft's tokens, verified in one
    /// call) against each --decode-context length, causal (bottom-right: row i sees the keys
    /// up to its own position); N >= 2, comma-separated or repeated.
    #[arg(long, value_name = "N", value_delimiter = ',', value_parser = parse_positive)]
    pub draft: Vec<u32>,
    /// Batch sizes: every shape once per batch size.
    #[arg(long, value_name = "B", value_delimiter = ',', value_parser = parse_positive, default_value = "1")]
    pub batch: Vec<u32>,
    /// Element type, bf16 or fp16 (default: the config's torch_dtype; needed when it is
    /// float32 or absent).
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub dtype: Option<DType>,
    /// Memory layout of Q, K, V and O in your model: bhsd (transformers, SDPA) or bshd
    /// (FlashAttention, vLLM).
    #[arg(long, value_name = "LAYOUT", value_parser = parse_layout, default_value = "bhsd")]
    pub layout: Layout,
    /// Write the TOML into FILE instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Machine-readable output (one JSON document).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_bounded_and_explained() {
        assert_eq!(parse_budget("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_budget("30days"), Ok(MAX_BUDGET));
        for (bad, says) in [("18446744073709551615s", "longer than 30 days"), ("-5m", "negative"), ("0s", "more than zero"), ("5", "unit"), ("", "")] {
            let e = parse_budget(bad).unwrap_err();
            assert!(e.contains(says) && e.contains("write e.g. 45s"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn run_ids_are_plain_names() {
        assert!(parse_run_id("20261121-184149-4b49").is_ok());
        for bad in ["", "../x", "a/b", "-5", ".hidden", "a b"] {
            assert!(parse_run_id(bad).unwrap_err().contains("optimizerd runs"), "{bad:?}");
        }
    }

    #[test]
    fn the_child_argv_carries_every_flag() {
        let args = StartArgs {
            budget: Duration::from_secs(90),
            plan: Some("p.toml".into()),
            fresh: true,
            gpus: Some(GpuSelection::Indices(vec![0, 2])),
            shapes: Some(vec!["b1h1s128d64".into(), "b2h8s512d128-causal".into()]),
            daemon: DaemonArgs {
                foreground: false,
                allow_concurrent: true,
                seed: Some(3),
                worker_script: Some("w.json".into()),
                gpu: Some(1),
                group: Some("g1".into()),
                ledger: None,
            },
            run_id: None,
        };
        let argv: Vec<String> = args.child_argv("r1", Some(Path::new("c.toml"))).iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            argv.join(" "),
            "start --run-id r1 --budget 1m 30s --plan p.toml --fresh --shapes b1h1s128d64,b2h8s512d128-causal --gpus 0,2 --foreground --config c.toml \
             --allow-concurrent --seed 3 --worker-script w.json --gpu 1 --group g1"
        );
    }

    #[test]
    fn gpus_are_all_or_distinct_indices() {
        assert_eq!(parse_gpus("all"), Ok(GpuSelection::All));
        assert_eq!(parse_gpus(" 0, 2 "), Ok(GpuSelection::Indices(vec![0, 2])));
        assert!(parse_gpus("0,0").unwrap_err().contains("listed twice"));
        assert!(parse_gpus("one").unwrap_err().contains("`one` is not a GPU index"));
        assert_eq!(GpuSelection::Indices(vec![3, 1]).to_string(), "3,1");
    }
}
