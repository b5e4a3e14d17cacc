//! The `optimizerd` binary: parse the command line, run, say an error once with its exit code.

fn main() -> std::process::ExitCode {
    optimizerd::cli::main()
}
