//! Supervises the GPU worker process: spawn, request/response with a timeout,
//! kill on hang, and report crashes with the child's exit status and stderr.
//!
//! The worker runs in its own process group so a hung kernel is evicted by killing
//! the whole group; the driver tears its context down. Nothing the worker does can
//! poison the daemon or the next worker.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::spec::protocol::{DeviceInfo, Request, Response};
use crate::daemon::shutdown::Shutdown;

/// How to start a worker: the program and its arguments (normally `optimizerd worker`).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl WorkerCommand {
    /// This executable's `worker` subcommand.
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(WorkerCommand { program: std::env::current_exe()?, args: vec!["worker".into()], env: vec![] })
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkerFailure {
    /// The worker exited or closed its stdout mid-request.
    #[error("worker died: {0}")]
    Crashed(String),
    /// No answer within the limit; the worker was killed.
    #[error("no answer within {0:?}; worker killed")]
    Timeout(Duration),
    /// The worker could not be started (or answered its first request with an error).
    #[error("worker could not start: {0}")]
    Start(String),
    /// An immediate stop was requested; the worker was killed mid-request.
    #[error("abandoned: immediate stop requested; worker killed")]
    Aborted,
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

pub struct Supervisor {
    command: WorkerCommand,
    hello_timeout: Duration,
    running: Option<Running>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Appended with every worker's stderr, for post-mortems.
    stderr_log: Option<PathBuf>,
    /// Incremented on every (re)start, so callers know loaded modules are gone.
    generation: u64,
    device: Option<DeviceInfo>,
    /// An immediate stop kills the worker mid-request.
    abort: Shutdown,
}

const STDERR_LINES: usize = 40;

impl Supervisor {
    pub fn new(command: WorkerCommand, hello_timeout: Duration, stderr_log: Option<PathBuf>) -> Self {
        Supervisor {
            command,
            hello_timeout,
            running: None,
            stderr_tail: Arc::new(Mutex::new(VecDeque::new())),
            stderr_log,
            generation: 0,
            device: None,
            abort: Shutdown::never(),
        }
    }

    /// Abandon requests in flight when `abort` asks for an immediate stop.
    pub fn set_abort(&mut self, abort: Shutdown) {
        self.abort = abort;
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// The device the current (or last) worker reported.
    pub fn device(&self) -> Option<&DeviceInfo> {
        self.device.as_ref()
    }

    /// Start a worker if none runs, and greet it. Returns the device it reports.
    pub async fn ensure_started(&mut self) -> Result<DeviceInfo, WorkerFailure> {
        if self.running.is_none() {
            self.spawn()?;
            match self.exchange(&Request::Hello, self.hello_timeout).await {
                Ok(Response::Hello(info)) => self.device = Some(info),
                Ok(Response::CudaError { during, message, .. }) => {
                    self.kill().await;
                    return Err(WorkerFailure::Start(format!("{during}: {message}")));
                }
                Ok(other) => {
                    self.kill().await;
                    return Err(WorkerFailure::Start(format!("unexpected first reply {other:?}")));
                }
                Err(e) => return Err(WorkerFailure::Start(e.to_string())),
            }
        }
        self.device.clone().ok_or_else(|| WorkerFailure::Start("no device info".into()))
    }

    /// Send one request and wait at most `timeout` for its answer. Starts the worker
    /// if needed. A sticky CUDA error is returned as a response; the worker exits
    /// after sending it and is restarted on the next request.
    pub async fn request(&mut self, request: &Request, timeout: Duration) -> Result<Response, WorkerFailure> {
        self.ensure_started().await?;
        let response = self.exchange(request, timeout).await?;
        if let Response::CudaError { sticky: true, .. } = &response {
            self.reap().await;
        }
        Ok(response)
    }

    async fn exchange(&mut self, request: &Request, timeout: Duration) -> Result<Response, WorkerFailure> {
        let Some(run) = self.running.as_mut() else {
            return Err(WorkerFailure::Crashed("worker not running".into()));
        };
        let mut line = serde_json::to_string(request).map_err(|e| WorkerFailure::Crashed(format!("encode request: {e}")))?;
        line.push('\n');
        let io = async {
            run.stdin.write_all(line.as_bytes()).await?;
            run.stdin.flush().await?;
            run.stdout.next_line().await
        };
        let mut abort = self.abort.clone();
        let outcome = tokio::select! {
            r = tokio::time::timeout(timeout, io) => Some(r),
            _ = abort.now() => None,
        };
        let Some(outcome) = outcome else {
            self.kill().await;
            return Err(WorkerFailure::Aborted);
        };
        match outcome {
            Ok(Ok(Some(reply))) => match serde_json::from_str::<Response>(&reply) {
                Ok(r) => Ok(r),
                Err(e) => {
                    self.kill().await;
                    Err(WorkerFailure::Crashed(format!("unparsable reply ({e}): {}", truncate(&reply, 400))))
                }
            },
            Ok(Ok(None)) | Ok(Err(_)) => {
                let status = self.reap().await;
                Err(WorkerFailure::Crashed(format!("{status}{}", self.stderr_excerpt())))
            }
            Err(_) => {
                self.kill().await;
                Err(WorkerFailure::Timeout(timeout))
            }
        }
    }

    fn spawn(&mut self) -> Result<(), WorkerFailure> {
        let mut cmd = Command::new(&self.command.program);
        cmd.args(&self.command.args)
            .envs(self.command.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Own process group: a hang is ended by killing the group, and a Ctrl-C aimed
        // at the daemon's terminal does not hit the worker mid-kernel.
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| WorkerFailure::Start(format!("cannot run {}: {e}", self.command.program.display())))?;
        let stdin = child.stdin.take().ok_or_else(|| WorkerFailure::Start("no stdin pipe".into()))?;
        let stdout = child.stdout.take().ok_or_else(|| WorkerFailure::Start("no stdout pipe".into()))?;
        if let Some(stderr) = child.stderr.take() {
            let tail = self.stderr_tail.clone();
            let log = self.stderr_log.clone();
            let generation = self.generation + 1;
            // Drained on its own task so a chatty worker never blocks on a full pipe.
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                let mut file = match &log {
                    Some(p) => tokio::fs::OpenOptions::new().create(true).append(true).open(p).await.ok(),
                    None => None,
                };
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(f) = file.as_mut() {
                        let _ = f.write_all(format!("[worker {generation}] {line}\n").as_bytes()).await;
                    }
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == STDERR_LINES {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            });
        }
        if let Ok(mut t) = self.stderr_tail.lock() {
            t.clear();
        }
        self.generation += 1;
        self.running = Some(Running { child, stdin, stdout: BufReader::new(stdout).lines() });
        tracing::debug!(generation = self.generation, "worker started");
        Ok(())
    }

    /// Kill the worker's process group and wait for it.
    pub async fn kill(&mut self) {
        if let Some(mut run) = self.running.take() {
            #[cfg(unix)]
            if let Some(pid) = run.child.id() {
                // SAFETY: kill(2) with a negative pid signals the process group we created.
                unsafe {
                    libc::kill(-(pid as i32), libc::SIGKILL);
                }
            }
            let _ = run.child.kill().await;
            let _ = run.child.wait().await;
        }
    }

    /// Wait briefly for a worker that is exiting; describe how it ended.
    async fn reap(&mut self) -> String {
        let Some(mut run) = self.running.take() else { return "worker not running".into() };
        drop(run.stdin);
        let status = match tokio::time::timeout(Duration::from_secs(5), run.child.wait()).await {
            Ok(Ok(s)) => describe_exit(s),
            Ok(Err(e)) => format!("wait failed: {e}"),
            Err(_) => {
                let _ = run.child.kill().await;
                "closed its output but did not exit; killed".into()
            }
        };
        // Let the stderr task catch the last lines.
        tokio::time::sleep(Duration::from_millis(50)).await;
        status
    }

    fn stderr_excerpt(&self) -> String {
        let t = self.stderr_tail.lock().map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n")).unwrap_or_default();
        if t.trim().is_empty() {
            String::new()
        } else {
            format!("; stderr: {}", truncate(t.trim(), 2000))
        }
    }

    /// Ask the worker to exit; kill it if it does not.
    pub async fn shutdown(&mut self) {
        if self.running.is_some() {
            let _ = self.exchange(&Request::Shutdown, Duration::from_secs(5)).await;
            self.reap().await;
        }
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("killed by signal {sig}");
        }
    }
    match status.code() {
        Some(c) => format!("exited with status {c}"),
        None => "exited".into(),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    }
}
