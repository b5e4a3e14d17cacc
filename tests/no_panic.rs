//! No input makes the binary panic (issue 23): a table of bad inputs across every
//! subcommand (budgets, seeds, waits, verdicts, run ids, options, every config key with a
//! wrong type, an out-of-range or an absurd value, plans, damaged, empty, truncated,
//! foreign and newer ledgers, missing folders, closed pipes), each run through the built
//! binary. Every one ends with its documented exit code, no `panicked`, one `error:` line
//! and a message naming the thing and the fix; a closed pipe ends quietly with 0.

mod common;

use std::path::{Path, PathBuf};

use common::cli::{add_run, run_in, run_into_closed_pipe};
use optimizerd::cli::exit::{self, CONFIG, LEDGER, NOT_FOUND, NOT_RESUMABLE, SUCCESS, USAGE};
use optimizerd::spec::states::RunState;

/// Where a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum At {
    /// A folder with a ledger holding run `r1` (finished, 3 iterations) and its log.
    Good,
    /// A folder with nothing in it.
    Empty,
    /// `runs/optimizer.db` is not a database.
    Damaged,
    /// `runs/optimizer.db` cut short.
    Truncated,
    /// `runs/optimizer.db` is empty (0 bytes).
    ZeroBytes,
    /// `runs/optimizer.db` is a folder.
    Folder,
    /// `runs/optimizer.db` was written by a newer release.
    Newer,
    /// `runs/optimizer.db` is another SQLite database, not a ledger.
    Foreign,
}

struct Case {
    at: At,
    args: Vec<String>,
    /// Into a pipe whose reader is gone.
    closed_pipe: bool,
    code: u8,
    /// What the output must name (the thing, and the fix).
    says: Vec<String>,
}

fn case(at: At, args: &[&str], code: u8, says: &[&str]) -> Case {
    Case { at, args: args.iter().map(|s| s.to_string()).collect(), closed_pipe: false, code, says: says.iter().map(|s| s.to_string()).collect() }
}

/// Every config key with a wrong type, an out-of-range or an absurd value: (TOML, what
/// the error names). Each is written to its own file and given to a different subcommand.
const CONFIGS: &[(&str, &str)] = &[
    ("[run]\nruns_dir = 5\n", "expected path string"),
    ("[run]\nplan = true\n", "expected path string"),
    ("[run]\ntemplates_dir = [1]\n", "expected path string"),
    ("[run]\nfoo = 1\n", "unknown field `foo`"),
    ("[workload]\ndtype = \"fp64\"\n", "fp64"),
    ("[workload]\nshapes = \"big\"\n", "expected a sequence"),
    ("[workload]\nshapes = []\n", "workload.shapes"),
    ("[workload]\nshapes = [{ b = -1, h = 1, s = 64, d = 64 }]\n", "-1"),
    ("[workload]\nshapes = [{ b = 0, h = 1, s = 64, d = 64 }]\n", "workload.shapes[0].b"),
    ("[workload]\nshapes = [{ b = \"one\", h = 1, s = 64, d = 64 }]\n", "expected u32"),
    ("[workload]\nshapes = [{ b = 4294967296, h = 1, s = 64, d = 64 }]\n", "4294967296"),
    ("[workload]\nshapes = [{ b = 1, h = 1, s = 64, d = 80 }]\n", "workload.shapes[0].d"),
    ("[workload]\nshapes = [{ b = 1, h = 1, s = 64, d = 64, causal = \"yes\" }]\n", "expected a boolean"),
    ("[workload]\nshapes = [{ b = 65536, h = 65536, s = 65536, d = 128 }]\n", "i32 indices"),
    ("[workload]\nshapes = [{ b = 1, h = 1, s = 64 }]\n", "missing field `d`"),
    ("[check]\natol = -1.0\n", "check.atol"),
    ("[check]\natol = \"x\"\n", "expected f64"),
    ("[check]\nrtol_l2 = 0.0\n", "check.rtol_l2"),
    ("[check]\natol = inf\n", "check.atol"),
    ("[check]\natol = nan\n", "check.atol"),
    ("[timing]\nwarmup = -1\n", "-1"),
    ("[timing]\nrounds = 0\n", "timing.rounds"),
    ("[timing]\nrounds = 10000000000\n", "10000000000"),
    ("[timing]\nrounds = 4294967295\n", "timing.rounds"),
    ("[timing]\nsamples_per_round = \"x\"\n", "expected u32"),
    ("[timing]\nlaunches_per_sample = 0\n", "timing.launches_per_sample"),
    ("[timing]\nl2_multiple = -1.0\n", "timing.l2_multiple"),
    ("[timing]\nl2_multiple = 1e300\n", "timing.l2_multiple"),
    ("[timing]\nmax_input_sets = 0\n", "timing.max_input_sets"),
    ("[timing]\nsample_target_us = -5.0\n", "timing.sample_target_us"),
    ("[timing]\nmax_entry_ms = nan\n", "timing.max_entry_ms"),
    ("[timing]\nmin_gain = 1.5\n", "timing.min_gain"),
    ("[timing]\nmethod = \"fast\"\n", "fast"),
    ("[worker]\nhello_timeout = \"soon\"\n", "soon"),
    ("[worker]\nhello_timeout = 5\n", "expected a string"),
    ("[worker]\nload_timeout = \"-5s\"\n", "-5s"),
    ("[worker]\ncheck_timeout = \"99999999999999999999999s\"\n", "99999999999999999999999s"),
    ("[worker]\ngpu_wait_limit = \"1000000000y\"\n", "longer than 30 days"),
    ("[worker]\ngpu_retry_max = true\n", "expected a string"),
    ("[worker]\nlookahead = \"yes\"\n", "expected a boolean"),
    ("[baseline]\nsdpa = \"yes\"\n", "expected a boolean"),
    ("[baseline]\nsdpa_command = 5\n", "expected a string"),
    ("[baseline]\nsdpa_timeout = \"x\"\n", "invalid duration"),
    ("[agent]\nbase_url = 5\n", "expected a string"),
    ("[agent]\nbase_url = \"ftp://x\"\nmodel = \"m\"\n", "agent.base_url"),
    ("[agent]\ntemperature = -1.0\n", "agent.temperature"),
    ("[agent]\nmax_tokens = 0\n", "agent.max_tokens"),
    ("[agent]\nproposals_per_request = 100\n", "agent.proposals_per_request"),
    ("[agent]\nrequest_timeout = \"0s\"\n", "agent.request_timeout"),
    ("[agent]\nbackoff = \"1000000y\"\n", "longer than 30 days"),
    ("[agent]\napi_key_env = \"sk-123 456\"\n", "agent.api_key_env"),
    ("[agent]\nmax_cost_usd = -1.0\n", "agent.max_cost_usd"),
    ("[agent]\nsuspicious_speedup = 0.5\n", "agent.suspicious_speedup"),
    ("[agent]\nallowed_headers = [\"/etc/passwd\"]\n", "agent.allowed_headers"),
    ("[foo]\nx = 1\n", "unknown field `foo`"),
    ("[run\n", "expected"),
    ("[run]\nruns_dir = \"a\"\nruns_dir = \"b\"\n", "duplicate key"),
    ("\u{0}\u{1}\u{2}binary", ":1:"),
];

/// Plans given to `start --plan` (validated before anything is started): (TOML, what the error names).
const PLANS: &[(&str, &str)] = &[
    ("", "missing field `stage`"),
    ("[[stage\n", "plan"),
    ("[open_phase]\nenabled = false\n", "missing field `stage`"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"nope.cu\"\nsearch = \"exhaustive\"\n", "stage `a`: cannot load template `nope.cu`"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\nspace = { NOPE = [1] }\n", "`NOPE`, which is not a knob"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\nspace = { WARPS_PER_CTA = [3] }\n", "not allowed"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"baseline.cu\"\nsearch = \"sideways\"\n", "sideways"),
    ("[[stage]]\nname = \"warm-start\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\n", "warm-start"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\nmax_candidates = -1\n", "-1"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\ncolour = 1\n", "colour"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\n[open_phase]\ntemplates = [\"x.cu\"]\n", "[open_phase] templates names x.cu"),
    ("[[stage]]\nname = \"a\"\ntemplate = \"../../../etc/passwd\"\nsearch = \"exhaustive\"\n", "stage `a`"),
];

/// Subcommands that load the configuration first, to spread the config cases over.
const READERS: &[&[&str]] = &[
    &["runs"],
    &["status"],
    &["history"],
    &["watch"],
    &["report"],
    &["export", "--out", "x"],
    &["stop"],
    &["forget", "r1"],
    &["resume"],
    &["start", "--budget", "1m"],
    &["runs", "--prune"],
];

fn cases(configs: &Path, plans: &Path) -> Vec<Case> {
    use At::*;
    let mut v = Vec::new();
    // Budgets: absurd, negative, zero, unitless, words, overflowing.
    for b in ["", "0", "0s", "-5m", "5", "abc", "18446744073709551615s", "31days", "1e9s", "5 parsecs", "NaN", "inf", "1h-5m", "99999999999999999999999s", "∞"] {
        v.push(case(Empty, &["start", "--budget", b], USAGE, &["--budget", "write e.g. 45s"]));
    }
    for s in ["-5", "abc", "18446744073709551616", "1.5", ""] {
        v.push(case(Empty, &["start", "--budget", "5m", "--seed", s], USAGE, &["--seed", "whole number"]));
    }
    for w in ["-1s", "0s", "forever"] {
        v.push(case(Good, &["stop", "--wait", w], USAGE, &["--wait", "write e.g."]));
    }
    for verdict in ["acepted", "", "ACCEPTED"] {
        v.push(case(Good, &["history", "--verdict", verdict], USAGE, &["--verdict", "unknown verdict", "compile_error"]));
    }
    for (args, says) in [
        (&["frobnicate"][..], "unrecognized subcommand"),
        (&["start"], "--budget <DURATION>"),
        (&["export"], "--out <DIR>"),
        (&["history", "--json", "--csv"], "cannot be used with"),
        (&["completions", "tcsh"], "possible values"),
        (&["runs", "--prune", "--frob"], "--frob"),
        (&["doctor", "--frob"], "--frob"),
        (&["forget"], "<RUNS>"),
        (&["man", "--out"], "--out <DIR>"),
        (&["--config"], "--config <FILE>"),
    ] {
        v.push(case(Good, args, USAGE, &[says]));
    }
    // Run ids: not names, and names of no run.
    for (args, code, says) in [
        (&["status", "../etc"][..], USAGE, "a run id is a name"),
        (&["history", "a/b"], USAGE, "a run id is a name"),
        (&["status", ""], USAGE, "a run id is a name"),
        (&["report", ".hidden"], USAGE, "a run id is a name"),
        (&["watch", "nope"], NOT_FOUND, "no run `nope`"),
        (&["report", "nope"], NOT_FOUND, "no run `nope`"),
        (&["export", "nope", "--out", "x"], NOT_FOUND, "no run `nope`"),
        (&["resume", "nope"], NOT_FOUND, "no run `nope`"),
        (&["stop", "nope"], NOT_FOUND, "no run `nope`"),
        (&["forget", "nope"], NOT_FOUND, "no run `nope`"),
        (&["stop"], NOT_FOUND, "no run is running"),
        (&["resume", "r1"], NOT_RESUMABLE, "already finished"),
    ] {
        v.push(case(Good, args, code, &[says, "optimizerd "]));
    }
    // Every config case, on a different subcommand each.
    for (i, (_, says)) in CONFIGS.iter().enumerate() {
        let file = configs.join(format!("bad-{i}.toml"));
        let mut args = vec!["--config".to_string(), file.display().to_string()];
        args.extend(READERS[i % READERS.len()].iter().map(|s| s.to_string()));
        v.push(Case { at: Good, args, closed_pipe: false, code: CONFIG, says: vec![format!("bad-{i}.toml"), says.to_string()] });
    }
    for (i, (_, says)) in PLANS.iter().enumerate() {
        let file = plans.join(format!("plan-{i}.toml"));
        v.push(case(Good, &["start", "--budget", "1m", "--plan", file.to_str().unwrap()], CONFIG, &[&format!("plan-{i}.toml"), says]));
    }
    v.push(case(Good, &["start", "--budget", "1m", "--plan", "missing.toml"], CONFIG, &["missing.toml", "check `--plan`"]));
    // Missing, unreadable or misplaced files and folders.
    v.push(case(Empty, &["--config", "nope/agent.toml", "runs"], CONFIG, &["nope/agent.toml", "No such file"]));
    v.push(case(Empty, &["runs", "--config", "."], CONFIG, &["cannot read config .", "check --config"]));
    v.push(case(Empty, &["runs"], NOT_FOUND, &["no ledger at", "optimizerd start"]));
    v.push(case(Empty, &["history", "--json"], NOT_FOUND, &["no ledger at", "optimizerd start"]));
    v.push(case(Good, &["export", "r1", "--out", "x"], exit::FAILURE, &["r1/workspace", "No such file"]));
    v.push(case(Good, &["report", "r1", "--out", "/dev/null/x"], exit::FAILURE, &["/dev/null/x", "--out"]));
    // Ledgers that cannot be used, under the commands that open them.
    let ledger_fix = ["optimizer.db", "optimizerd start"];
    for cmd in [&["runs"][..], &["status"], &["history"], &["watch"], &["report"], &["export", "--out", "x"], &["resume"], &["forget", "r1"], &["runs", "--prune"], &["stop", "r1"]] {
        v.push(case(Damaged, cmd, LEDGER, &["is damaged", "mv "]));
    }
    for cmd in [&["runs"][..], &["status", "r1"], &["history", "--csv"]] {
        v.push(case(Truncated, cmd, LEDGER, &["is damaged", "mv "]));
    }
    for cmd in [&["runs"][..], &["status"], &["resume"]] {
        v.push(case(ZeroBytes, cmd, LEDGER, &ledger_fix));
        v.push(case(Folder, cmd, LEDGER, &["is not a file", "optimizerd start"]));
        v.push(case(Foreign, cmd, LEDGER, &["holds no optimizerd ledger", "move it aside"]));
    }
    for cmd in [&["runs"][..], &["status"], &["resume"], &["forget", "r1"]] {
        v.push(case(Newer, cmd, LEDGER, &["newer release", "use that release"]));
    }
    // Closed pipes: the command stops quietly.
    for cmd in [&["history"][..], &["history", "--csv"], &["history", "--json"], &["runs"], &["runs", "--json"], &["status"], &["status", "--json"], &["watch", "r1"], &["--help"], &["completions", "zsh"], &["man"]] {
        let mut c = case(Good, cmd, SUCCESS, &[]);
        c.closed_pipe = true;
        v.push(c);
    }
    v
}

async fn fixture(root: &Path, at: At) -> PathBuf {
    let dir = root.join(format!("{at:?}"));
    let db = dir.join("runs/optimizer.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    match at {
        At::Good => {
            add_run(&db, "r1", RunState::Finished, 3).await;
            std::fs::create_dir_all(dir.join("runs/r1")).unwrap();
            let end = serde_json::json!({ "level": "INFO", "fields": { "kind": "run_end", "run": "r1", "state": "finished", "detail": "budget spent", "message": "run r1 finished: budget spent" } });
            std::fs::write(dir.join("runs/r1/run.log"), format!("{end}\n").repeat(2000)).unwrap();
        }
        At::Empty => {}
        At::Damaged => std::fs::write(&db, "this is not a database\n".repeat(100)).unwrap(),
        At::Truncated => {
            add_run(&db, "r1", RunState::Finished, 300).await;
            std::fs::OpenOptions::new().write(true).open(&db).unwrap().set_len(6000).unwrap();
        }
        At::ZeroBytes => std::fs::write(&db, "").unwrap(),
        At::Folder => std::fs::create_dir_all(&db).unwrap(),
        At::Newer => {
            add_run(&db, "r1", RunState::Finished, 1).await;
            use sqlx::ConnectOptions;
            let mut conn = sqlx::sqlite::SqliteConnectOptions::new().filename(&db).connect().await.unwrap();
            sqlx::query("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (9999, 'from the future', 1, x'00', 0)")
                .execute(&mut conn)
                .await
                .unwrap();
        }
        At::Foreign => {
            use sqlx::ConnectOptions;
            let mut conn = sqlx::sqlite::SqliteConnectOptions::new().filename(&db).create_if_missing(true).connect().await.unwrap();
            sqlx::query("CREATE TABLE notes (x TEXT)").execute(&mut conn).await.unwrap();
        }
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_input_panics_and_each_is_answered_with_its_code_and_fix() {
    let root = tempfile::tempdir().unwrap();
    let configs = root.path().join("configs");
    let plans = root.path().join("plans");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::create_dir_all(&plans).unwrap();
    for (i, (text, _)) in CONFIGS.iter().enumerate() {
        std::fs::write(configs.join(format!("bad-{i}.toml")), text).unwrap();
    }
    for (i, (text, _)) in PLANS.iter().enumerate() {
        std::fs::write(plans.join(format!("plan-{i}.toml")), text).unwrap();
    }
    let mut dirs = std::collections::HashMap::new();
    for at in [At::Good, At::Empty, At::Damaged, At::Truncated, At::ZeroBytes, At::Folder, At::Newer, At::Foreign] {
        dirs.insert(at, fixture(root.path(), at).await);
    }
    let all = cases(&configs, &plans);
    let distinct: std::collections::BTreeSet<(String, Vec<String>)> = all.iter().map(|c| (format!("{:?}", c.at), c.args.clone())).collect();
    assert!(distinct.len() >= 80 && distinct.len() == all.len(), "{} distinct cases of {}", distinct.len(), all.len());
    let documented: Vec<u8> = exit::TABLE.iter().map(|(c, _, _)| *c).collect();
    let mut failures = Vec::new();
    for c in &all {
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let dir = &dirs[&c.at];
        let r = if c.closed_pipe { run_into_closed_pipe(dir, &args) } else { run_in(dir, &args) };
        let text = r.text();
        let mut wrong = Vec::new();
        if text.contains("panicked") {
            wrong.push("panicked".to_string());
        }
        if r.code != Some(c.code as i32) || !documented.contains(&c.code) {
            wrong.push(format!("exit {:?}, expected {}", r.code, c.code));
        }
        if c.closed_pipe {
            if !r.stderr.is_empty() {
                wrong.push("said something on a closed pipe".into());
            }
        } else {
            assert_ne!(c.code, SUCCESS);
            if text.matches("error:").count() != 1 {
                wrong.push(format!("{} `error:` lines", text.matches("error:").count()));
            }
            wrong.extend(c.says.iter().filter(|s| !text.contains(s.as_str())).map(|s| format!("does not say {s:?}")));
        }
        if !wrong.is_empty() {
            failures.push(format!("{:?} {:?}: {}\n{text}", c.at, c.args, wrong.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases:\n\n{}", failures.len(), all.len(), failures.join("\n\n"));
}
