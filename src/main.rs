//! The `optimizerd` binary: parse the command line, run, print the error chain once.

use std::process::ExitCode;

fn main() -> ExitCode {
    match optimizerd::cli::main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
