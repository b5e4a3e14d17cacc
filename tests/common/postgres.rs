//! A real PostgreSQL server for a test: its own cluster in a temporary folder (Debian's
//! server binaries, installed by scripts/setup.sh), on a free loopback port, trust
//! authentication, stopped when dropped. As root (CI), the server runs as the `postgres`
//! user, which owns the folder. A missing server fails the test: it is never skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
}

fn bin_dir() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("PostgreSQL's server is not installed ({}: {e}); run scripts/setup.sh", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().expect("no /usr/lib/postgresql/*/bin/initdb; run scripts/setup.sh")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) only reads the process's user id.
    unsafe { libc::geteuid() == 0 }
}

/// `program args` as the server's user (postgres when we are root).
fn as_server_user(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program).args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    }
}

fn check(mut c: Command, what: &str) {
    let o = c.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(o.status.success(), "{what} failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

impl Postgres {
    pub fn start() -> Postgres {
        let bin = bin_dir();
        let dir = tempfile::Builder::new().prefix("optd-pg").tempdir_in("/tmp").unwrap();
        let data = dir.path().join("data");
        if is_root() {
            check(
                {
                    let mut c = Command::new("chown");
                    c.args(["postgres:postgres"]).arg(dir.path());
                    c
                },
                "chown",
            );
        }
        let d = data.display().to_string();
        check(as_server_user(&bin.join("initdb"), &["-D", &d, "-U", "optd", "--auth=trust", "-E", "UTF8", "--no-sync"]), "initdb");
        let port = free_port();
        let opts = format!("-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", dir.path().display());
        let log = dir.path().join("server.log").display().to_string();
        check(as_server_user(&bin.join("pg_ctl"), &["-D", &d, "-o", &opts, "-l", &log, "-w", "-t", "60", "start"]), "pg_ctl start");
        Postgres { dir, bin, port }
    }

    pub fn url(&self) -> String {
        format!("postgres://optd@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let d = self.dir.path().join("data").display().to_string();
        let _ = as_server_user(&self.bin.join("pg_ctl"), &["-D", &d, "-m", "immediate", "stop"]).output();
    }
}
