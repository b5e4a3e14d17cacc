//! The GPU worker: a child process that owns the CUDA context.
//!
//! It reads one JSON [`Request`] per line on stdin and answers one JSON [`Response`]
//! per line on stdout. Candidates that crash or hang take only this process down;
//! the daemon's supervisor restarts it. After a sticky CUDA error (illegal address,
//! trap) the context is unusable, so the worker replies and exits.

pub mod compile_pool;
pub mod cuda;
pub mod reference;
pub mod scripted;

use std::io::{BufRead, Write};

use crate::spec::protocol::{Request, Response};

/// What executes requests: the real CUDA device, or a scripted double for CPU tests.
pub trait Backend {
    fn handle(&mut self, request: Request) -> Response;
}

/// Serve requests until `Shutdown`, end of input, or a sticky CUDA error.
pub fn serve(backend: &mut dyn Backend) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let response = match serde_json::from_str::<Request>(&line) {
            Ok(Request::Shutdown) => {
                reply(&mut stdout, &Response::Bye)?;
                return Ok(());
            }
            Ok(request) => backend.handle(request),
            Err(e) => Response::BadRequest { message: format!("unparsable request: {e}") },
        };
        reply(&mut stdout, &response)?;
        if let Response::CudaError { sticky: true, .. } = response {
            // The context is poisoned: exit so the supervisor starts a clean process.
            std::process::exit(3);
        }
    }
    Ok(())
}

fn reply(out: &mut impl Write, response: &Response) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, response)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}
