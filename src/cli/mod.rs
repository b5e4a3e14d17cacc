//! The command line: the subcommands (each described, with examples), `--config`
//! accepted before or after any of them, and a thin dispatch to the library. What each
//! takes is in [`args`], `start`/`resume` in [`daemon`], process control (detaching,
//! stopping, live state) in [`process`], the commands beside a run in [`commands`],
//! completions and man pages in [`docs`], and exit codes and how errors are said in
//! [`exit`]. Output goes through [`Out`], so a closed pipe ends a command quietly.

mod args;
mod commands;
mod daemon;
mod docs;
pub mod exit;
mod process;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use args::*;

const LONG_ABOUT: &str = "optimizerd walks a strategy plan (baseline -> decode -> fill the GPU -> memory -> tensor cores -> tuning; on Hopper the wgmma + TMA stage first, before the decode and the generic ones), renders kernel templates, compiles \
each candidate with NVRTC, rejects anything incorrect (fp32 reference, poisoned outputs) or launched on the wrong grid, \
times survivors against the best kernel so far for every workload shape, keeps improvements as git commits and records \
every iteration in SQLite (runs/optimizer.db). A run survives crashes: `optimizerd resume` continues it.\n\n\
--config FILE (default: agent.toml in the current folder, else the embedded defaults) goes before or after the \
subcommand. Paths inside it (run.runs_dir, run.plan, run.templates_dir) are relative to the folder of the config file.";

const EXAMPLES: &str = "Examples:\n  optimizerd doctor\n  optimizerd start --budget 90m\n  optimizerd watch\n  optimizerd stop\n  \
optimizerd resume\n  optimizerd history --verdict accepted\n  optimizerd --config lab/agent.toml runs\n  \
optimizerd report --out docs/report\n  optimizerd workload --from-hf config.json --prefill 4096 --decode-context 4096 > llama.toml\n  \
optimizerd export --python pkg/ && pip install ./pkg\n  optimizerd completions bash > ~/.local/share/bash-completion/completions/optimizerd";

const REPORT_ABOUT: &str = "Draw a run as pictures, from the ledger alone: a finished, stopped, interrupted or still running run.\n\n\
Writes into one folder (default runs/<run>/report):\n  \
report.html      one self-contained page (inline SVG and CSS, no script, opens offline)\n  \
report.md        the same for a pull request; it links the .svg files beside it\n  \
speedup.svg      1. speedup over SDPA default vs budget used, per shape, stages marked\n  \
throughput.svg   2. best kernel vs each SDPA backend (TFLOPS or us), the GPU's peak\n  \
stages.svg       3. the gain each stage bought, per shape\n  \
verdicts.svg     4. how each stage's candidates ended\n\n\
and a table of the best kernel per shape (template, knobs, registers, spills, shared memory, CTAs, waves) \
with the environment (GPU, driver, NVRTC, torch, cuDNN, timing method). Without SDPA in the run, speedups are \
over the run's baseline kernel and the page says so.";

const EXPORT_ABOUT: &str = "Write each shape's best kernel of a run (default: the latest).\n\n\
--out DIR: the exact sources that were timed (.cu) and manifest.json, the launch recipe (argument order, grid and \
shared memory as formulas of the shape, the GPU they were tuned on); examples/run_exported.py loads them with CuPy.\n\n\
--python DIR: an installable Python package (`pip install DIR`, no network): the kernels, their cubins (compiled with \
NVRTC for the run's GPU, with the options the run timed them with; the .cu beside them for other GPUs) and a torch \
custom op, NAME.attention(q, k, v, causal=..., layout=...), that runs the kernel tuned for the call's exact shape, \
else the best of its class whose launch covers the shape, else PyTorch SDPA; NAME.register_transformers() makes it \
attn_implementation=\"optimizerd\" in transformers. An earlier export into DIR is replaced; any other non-empty \
folder is refused. Needs NVRTC (scripts/setup.sh, or a CUDA toolkit).";

const EXPORT_EXAMPLES: &str = "Examples:\n  optimizerd export --out kernels/\n  \
optimizerd export 20261121-184149-4b49 --out /tmp/k && python3 examples/run_exported.py /tmp/k\n  \
optimizerd export --python llama-attn/ --package-name llama_attn && pip install ./llama-attn\n  \
python3 -c 'import llama_attn, torch; print(llama_attn.explain(*[torch.randn(1, 32, 4096, 128, device=\"cuda\", dtype=torch.bfloat16)] * 3, causal=True))'\n  \
optimizerd export --python pkg/ --out kernels/ --json          # both, and what was written as JSON";

const WORKLOAD_ABOUT: &str = "Write the [workload] a model's attention runs, from its transformers config.json, to tune \
a run for that model.\n\n\
Read from the config: num_attention_heads, num_key_value_heads (default: as many), head_dim (default: hidden_size / \
num_attention_heads) and torch_dtype (or dtype); a multimodal model's under text_config. Shapes, for each --batch:\n  \
prefill          sq = sk = each --prefill length, causal\n  \
chunked prefill  sq = --chunk, sk = each longer --prefill length, causal (bottom-right)\n  \
decode           sq = 1, sk = each --decode-context length, not causal (the newest row sees the whole cache)\n  \
draft            sq = each --draft size, sk = each --decode-context length, causal (bottom-right): \
speculative decoding's verification of a draft's tokens\n\n\
What is written loads with the configuration loader (checked before it is written): paste it over the [workload] \
of agent.toml, or use the file as the whole configuration (every other key takes its default).";

const WORKLOAD_EXAMPLES: &str = "Examples:\n  \
optimizerd workload --from-hf Meta-Llama-3-8B/config.json --prefill 4096 --decode-context 4096 --batch 1,8\n  \
optimizerd workload --from-hf config.json --prefill 1024,4096 --chunk 512 --decode-context 4096,16384 --out llama.toml\n  \
optimizerd workload --from-hf config.json --decode-context 4096 --draft 8,16 --batch 8   # speculative decoding\n  \
optimizerd --config llama.toml start --budget 20m        # tune it; then export --python";

#[derive(Debug, Parser)]
#[command(
    name = "optimizerd",
    version,
    about = "Optimize CUDA attention kernels on this machine's GPU, unattended.",
    long_about = LONG_ABOUT,
    after_help = EXAMPLES,
    after_long_help = format!("{EXAMPLES}\n\n{}", exit::help_table()),
)]
pub struct Cli {
    /// Configuration file (default: agent.toml in the current folder, else the embedded
    /// defaults); before or after the subcommand. Its paths are relative to its folder.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start an optimization run (detaches once it has found the GPU, unless --foreground).
    #[command(after_help = "Examples:\n  optimizerd start --budget 5m\n  optimizerd start --budget 1h30m --plan strategies/fault-drill.toml\n  \
optimizerd start --budget 20m --fresh --foreground      # systemd, containers, CI\n  \
optimizerd start --budget 90m --gpus all                # every GPU of this host, one shape class per GPU\n  \
optimizerd start --budget 2h --gpus all --run-id llama-fleet --ledger postgres://optd:PW@db:5432/optd   # on each machine of a fleet")]
    Start(StartArgs),
    /// Continue a stopped, interrupted or killed run where it stopped (failed or finished runs cannot be).
    #[command(after_help = "Examples:\n  optimizerd resume                       # the most recent run that can be resumed\n  \
optimizerd resume 20261121-184149-4b49 --foreground\n  optimizerd resume 20261121-184149-4b49 --rebaseline   # on another GPU model")]
    Resume(ResumeArgs),
    /// Follow a run live: one line per iteration under a progress bar (--json: JSON Lines).
    #[command(after_help = "Examples:\n  optimizerd watch\n  optimizerd watch 20261121-184149-4b49\n  \
optimizerd watch --json | jq -c 'select(.fields.kind == \"iteration\")'   # JSON Lines, one object per line")]
    Watch(WatchArgs),
    /// Stop a run gracefully (after the candidate in flight), or at once with --now.
    #[command(after_help = "Examples:\n  optimizerd stop\n  optimizerd stop 20261121-184149-4b49 --now\n  optimizerd stop --wait 30s")]
    Stop(StopArgs),
    /// List runs with state, GPU, budget and best speedup; --prune removes failed and never-started runs.
    #[command(after_help = "Examples:\n  optimizerd runs\n  optimizerd runs --json\n  optimizerd runs --prune")]
    Runs(RunsArgs),
    /// Remove runs from the ledger, with their folders (not a running one).
    #[command(after_help = "Examples:\n  optimizerd forget 20261124-061334-cf6b\n  optimizerd runs --prune      # every failed or never-started run")]
    Forget(ForgetArgs),
    /// Print a run's iterations from the ledger (filter by stage or verdict; CSV or JSON).
    #[command(after_help = "Examples:\n  optimizerd history --verdict incorrect,crashed          # what went wrong, and why\n  \
optimizerd history --stage tuning --verdict accepted --csv > tuning-wins.csv\n  optimizerd history --stage 'open/*' --json")]
    History(HistoryArgs),
    /// Print a run's state, stage, iterations, best kernel per shape and budget.
    #[command(after_help = "Examples:\n  optimizerd status\n  optimizerd status 20261121-184149-4b49 --json")]
    Status(RunArgs),
    /// Check the config, runs folder, ledger, plan, NVRTC, driver, GPU and python/torch, each with its fix.
    #[command(after_help = "Examples:\n  optimizerd doctor\n  optimizerd --config lab/agent.toml doctor --json")]
    Doctor(DoctorArgs),
    /// Write each shape's best kernel as a standalone .cu plus manifest.json (--out), or as an installable Python package (--python).
    #[command(long_about = EXPORT_ABOUT, after_help = EXPORT_EXAMPLES)]
    Export(ExportArgs),
    /// Write the [workload] of a Hugging Face model from its config.json: prefill, chunked prefill and decode shapes.
    #[command(long_about = WORKLOAD_ABOUT, after_help = WORKLOAD_EXAMPLES)]
    Workload(WorkloadArgs),
    /// Draw a run as pictures: report.html (self-contained), report.md and SVG figures.
    #[command(
        long_about = REPORT_ABOUT,
        after_help = "Examples:\n  optimizerd report                               # the latest run, into runs/<run>/report\n  \
optimizerd report 20261121-184149-4b49 --out docs/report\n  \
optimizerd report --json                        # what was written, for scripts\n\n\
See it as a browser does (headless Chromium, to a PNG):\n  \
bash scripts/report_png.sh docs/report/report.html docs/report/report.png"
    )]
    Report(ReportArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = "Examples:\n  optimizerd completions bash > ~/.local/share/bash-completion/completions/optimizerd\n  \
optimizerd completions zsh > ~/.zfunc/_optimizerd\n  optimizerd completions fish > ~/.config/fish/completions/optimizerd.fish")]
    Completions(CompletionsArgs),
    /// Print the manual page (roff), or write one page per command into a folder.
    #[command(after_help = "Examples:\n  optimizerd man | man -l -\n  optimizerd man --out ~/.local/share/man/man1")]
    Man {
        /// Folder to write optimizerd.1 and optimizerd-<command>.1 into (default: optimizerd.1 on stdout).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Serve GPU requests on stdin/stdout (started by the daemon; not for direct use).
    #[command(hide = true)]
    Worker {
        /// Use a scripted backend (tests): a JSON file describing each candidate's behaviour.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Print the visible GPUs (one JSON `DeviceInfo` per line) and exit.
        #[arg(long)]
        list_devices: bool,
    },
}

/// Standard output for a command's results. A write error (above all a closed pipe,
/// `optimizerd history | head -1`) is returned, never a panic.
pub struct Out {
    stdout: std::io::Stdout,
}

impl Out {
    fn new() -> Self {
        Out { stdout: std::io::stdout() }
    }

    pub fn bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        let mut lock = self.stdout.lock();
        lock.write_all(b)?;
        lock.flush()
    }

    pub fn text(&mut self, s: &str) -> std::io::Result<()> {
        self.bytes(s.as_bytes())
    }

    pub fn line(&mut self, s: &str) -> std::io::Result<()> {
        self.text(&format!("{s}\n"))
    }

    pub fn json<T: serde::Serialize>(&mut self, v: &T) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(v).context("cannot write JSON")?;
        Ok(self.line(&text)?)
    }

    /// The stream itself, for a writer that handles its errors (watch).
    pub fn raw(&mut self) -> std::io::Stdout {
        std::io::stdout()
    }
}

/// A note or a progress line on stderr; a closed stderr is ignored.
pub fn note(s: &str) {
    let _ = writeln!(std::io::stderr(), "{s}");
}

/// The process's exit: parse, run, and say an error once with its code.
pub fn main() -> ExitCode {
    exit::finish(run())
}

fn run() -> anyhow::Result<u8> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { exit::SUCCESS };
            let _ = e.print();
            return Ok(code);
        }
    };
    let config = cli.config.as_deref();
    let mut out = Out::new();
    let out = &mut out;
    match cli.command {
        Command::Worker { script, list_devices } => worker(script, list_devices),
        Command::Completions(a) => docs::completions(a.shell, out),
        Command::Man { out: dir } => docs::man(dir.as_deref(), out),
        Command::Start(a) => runtime()?.block_on(daemon::start(a, config, out)),
        Command::Resume(a) => runtime()?.block_on(daemon::resume(a, config, out)),
        Command::Stop(a) => runtime()?.block_on(async {
            let config = crate::spec::config::Config::load(config)?;
            process::stop(&config, a.run.as_deref(), a.now, a.wait, out).await
        }),
        Command::Watch(a) => runtime()?.block_on(commands::watch(a, config, out)),
        Command::Runs(a) => runtime()?.block_on(commands::runs(a, config, out)),
        Command::Forget(a) => runtime()?.block_on(commands::forget(a, config, out)),
        Command::History(a) => runtime()?.block_on(commands::history(a, config, out)),
        Command::Status(a) => runtime()?.block_on(commands::status(a, config, out)),
        Command::Doctor(a) => runtime()?.block_on(commands::doctor(a, config, out)),
        Command::Export(a) => runtime()?.block_on(commands::export(a, config, out)),
        Command::Report(a) => runtime()?.block_on(commands::run_report(a, config, out)),
        Command::Workload(a) => commands::workload(a, out),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn worker(script: Option<PathBuf>, list_devices: bool) -> anyhow::Result<u8> {
    // A worker must not outlive its daemon: an orphan would hold the GPU.
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    if list_devices {
        let devices = match &script {
            Some(path) => crate::worker::scripted::ScriptedBackend::from_file(path)
                .with_context(|| format!("cannot load worker script {}", path.display()))?
                .devices(),
            None => crate::worker::cuda::list_cuda_devices()?,
        };
        let mut out = std::io::stdout().lock();
        for d in devices {
            writeln!(out, "{}", serde_json::to_string(&d)?)?;
        }
        return Ok(exit::SUCCESS);
    }
    match script {
        Some(path) => {
            let mut backend = crate::worker::scripted::ScriptedBackend::from_file(&path)
                .with_context(|| format!("cannot load worker script {}", path.display()))?;
            crate::worker::serve(&mut backend)?;
        }
        None => {
            // Before this, the CUDA worker's own lines (the backend it found, a failed
            // start) went nowhere.
            if let Err(e) = crate::daemon::logging::init_worker() {
                note(&format!("worker: no log ({e:#})"));
            }
            crate::worker::cuda::run_cuda_worker()?
        }
    }
    Ok(exit::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent_and_every_option_is_described() {
        Cli::command().debug_assert();
        for sub in Cli::command().get_subcommands().filter(|s| !s.is_hide_set()) {
            assert!(sub.get_after_help().is_some_and(|h| h.to_string().contains("Examples:")), "{} has no example", sub.get_name());
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set() && a.get_id() != "help") {
                assert!(arg.get_help().is_some(), "{} {} is not described", sub.get_name(), arg.get_id());
            }
        }
    }

    #[test]
    fn the_detached_daemon_gets_the_same_start_back() {
        let cli = Cli::try_parse_from(["optimizerd", "--config", "c.toml", "start", "--budget", "90m", "--plan", "p.toml", "--seed", "9", "--fresh"]).unwrap();
        let Command::Start(a) = cli.command else { panic!("not a start") };
        let mut argv = vec!["optimizerd".into()];
        argv.extend(a.child_argv("r1", cli.config.as_deref()));
        let child = Cli::try_parse_from(argv).unwrap();
        let Command::Start(b) = child.command else { panic!("not a start") };
        assert_eq!(child.config, cli.config);
        assert_eq!((b.budget, b.plan, b.fresh, b.daemon.seed, b.run_id.as_deref()), (a.budget, a.plan.clone(), true, Some(9), Some("r1")));
        assert!(b.daemon.foreground && !a.daemon.foreground);
    }
}
