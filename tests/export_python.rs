//! `optimizerd export --python DIR`: a scripted-worker run over a grouped-query prefill
//! shape and a decode shape, exported as an installable Python package: its layout, the
//! manifest's device / package / min_cc / max_sq / cubin, cubins that are CUDA ELF images
//! for the kernel's arch, the folder marker (an earlier export is replaced, another folder
//! refused), a bad package name, NVRTC missing; then the package's own Python tests
//! (python/tests, when the repository has them) against the exported folder.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Project;
use optimizerd::cli::exit;
use optimizerd::engine::RunEnd;
use serde_json::json;

const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "decode"
template = "decode.cu"
search = "exhaustive"
space = { BLOCK_N = [16], NUM_WARPS = [4], STAGES = [3], SPLIT_WAVES = [1], MIN_SPLIT_TILES = [2], WARP_LOADS = [0], M_TILES = [1], K_FIRST = [0] }

[open_phase]
enabled = false
"#;

/// What a command did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `optimizerd ARGS` in `dir`, with `env` added.
fn optimizerd(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let o = Command::new(env!("CARGO_BIN_EXE_optimizerd"))
        .current_dir(dir)
        .args(args)
        .envs(env.iter().copied())
        .env_remove(optimizerd::failpoint::ENV)
        .stdin(Stdio::null())
        .output()
        .expect("run optimizerd");
    Ran { code: o.status.code(), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

fn assert_code(r: &Ran, code: u8) {
    assert_eq!(r.code, Some(code as i32), "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// A CUDA cubin's ELF header: e_machine (EM_CUDA is 190) and e_flags, which hold the SM
/// version (bits 8..16 in the ELF ABI of CUDA >= 12.8, e.g. 0x0a005a04 for sm_90; bits
/// 0..8 before).
fn cubin_header(bytes: &[u8]) -> (u16, u32) {
    assert!(bytes.len() > 64 && &bytes[..4] == b"\x7fELF", "not an ELF image");
    assert_eq!(bytes[4], 2, "a 64-bit ELF");
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    let flags = u32::from_le_bytes([bytes[48], bytes[49], bytes[50], bytes[51]]);
    (machine, flags)
}

/// A run whose best kernels are the baseline (prefill shape) and decode-split (decode shape).
async fn tuned() -> Project {
    let rules = json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["template `decode-split`"], "behaviour": { "ok": { "us": 10.0 } } }
    ]);
    let p = Project::new(PLAN, rules, json!({ "ok": { "us": 50.0 } }));
    p.append_config("\n[baseline]\nsdpa = false\n");
    p.set_workload(
        "shapes = [ { b = 1, hq = 8, hkv = 2, s = 128, d = 64, causal = true }, \
         { b = 2, hq = 8, hkv = 2, sq = 1, sk = 512, d = 128 } ]",
    );
    let config = std::fs::read_to_string(p.path().join("agent.toml")).unwrap().replace("dtype = \"fp16\"", "dtype = \"bf16\"");
    std::fs::write(p.path().join("agent.toml"), config).unwrap();
    assert_eq!(p.run("gq", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_python_writes_an_installable_package_with_cubins() {
    let p = tuned().await;
    let r = optimizerd(p.path(), &["export", "--python", "pkg", "--out", "plain"], &[]);
    assert_code(&r, exit::SUCCESS);
    // The hints teach the next steps.
    for says in ["wrote the Python package optimizerd_kernels", "2 kernels of run gq, 2 cubins (sm_90)", "pip install pkg", "import optimizerd_kernels", "register_transformers()", "plain/manifest.json"] {
        assert!(r.stdout.contains(says), "{says:?} in:\n{}", r.stdout);
    }

    // Layout: the skeleton with the package folder under its name, the kernels inside it.
    let pkg = p.path().join("pkg");
    assert!(pkg.join(".optimizerd-package").is_file());
    assert!(pkg.join("_optd_build/backend.py").is_file());
    assert!(pkg.join("optimizerd_kernels/__init__.py").is_file());
    assert!(!pkg.join("pyproject.toml.in").exists());
    let pyproject = std::fs::read_to_string(pkg.join("pyproject.toml")).unwrap();
    assert!(pyproject.contains("name = \"optimizerd_kernels\""), "{pyproject}");
    assert!(pyproject.contains(&format!("version = \"{}+gq\"", env!("CARGO_PKG_VERSION"))), "{pyproject}");
    assert!(!pyproject.contains('@'), "every placeholder filled: {pyproject}");
    assert!(!walk(&pkg).iter().any(|f| f.contains("__pycache__") || f.ends_with(".pyc")), "no caches: {:?}", walk(&pkg));

    // The manifest: format 2 plus the device, the package, and per kernel min_cc, max_sq, cubin.
    let kernels_dir = pkg.join("optimizerd_kernels/kernels");
    let m = read_json(&kernels_dir.join("manifest.json"));
    assert_eq!(m["format"], 3);
    assert_eq!(m["device"], json!({ "name": "NVIDIA H100 80GB HBM3 (scripted)", "cc": 90, "sms": 132, "smem_optin": 232448 }));
    assert_eq!(m["package"], json!({ "name": "optimizerd_kernels", "optimizerd": env!("CARGO_PKG_VERSION") }));
    let kernels = m["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 2, "{m:#}");
    let by_template = |t: &str| kernels.iter().find(|k| k["template"] == t).unwrap_or_else(|| panic!("no {t} kernel: {m:#}"));
    let decode = by_template("decode-split");
    assert_eq!((decode["min_cc"].as_u64(), decode["max_sq"].as_u64()), (Some(80), Some(16)));
    assert_eq!(decode["shapes"][0]["key"], "b2hq8hkv2sq1sk512d128-bf16");
    assert_eq!(decode["dtype"], "bf16");
    let base = by_template("baseline");
    assert_eq!((base["min_cc"].as_u64(), base["max_sq"].is_null()), (Some(70), true));
    assert_eq!(base["shapes"][0]["key"], "b1hq8hkv2s128d64-causal-bf16");
    for k in kernels {
        let file = k["file"].as_str().unwrap();
        assert!(kernels_dir.join(file).is_file(), "{file}");
        let cubin = k["cubin"].as_str().unwrap_or_else(|| panic!("{file} has no cubin: {k:#}"));
        assert_eq!(cubin, file.replace(".cu", ".cubin"));
        assert_eq!(k["arch"], "sm_90");
        let (machine, flags) = cubin_header(&std::fs::read(kernels_dir.join(cubin)).unwrap());
        assert_eq!(machine, 190, "{cubin}: EM_CUDA");
        assert!(flags & 0xff == 90 || (flags >> 8) & 0xff == 90, "{cubin}: built for sm_90 (e_flags {flags:#x})");
    }

    // `--out` alone: the same kernels, the device, no package and no cubins.
    let plain = read_json(&p.path().join("plain/manifest.json"));
    assert_eq!(plain["device"], m["device"]);
    assert!(plain.get("package").is_none(), "{plain:#}");
    assert!(plain["kernels"].as_array().unwrap().iter().all(|k| k["cubin"].is_null() && k["min_cc"].is_u64()));
    assert!(!walk(&p.path().join("plain")).iter().any(|f| f.ends_with(".cubin")));

    // The package's own tests, against this export.
    python_tests(&pkg);

    // Again, under another name: the earlier export is replaced, not merged.
    std::fs::write(pkg.join("optimizerd_kernels/stale.py"), "").unwrap();
    let r = optimizerd(p.path(), &["export", "gq", "--python", "pkg", "--package-name", "llama_attn", "--json"], &[]);
    assert_code(&r, exit::SUCCESS);
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    assert_eq!((j["run"].as_str(), j["out"].is_null()), (Some("gq"), true));
    assert_eq!((j["python"]["package"].as_str(), j["python"]["replaced"].as_bool()), (Some("llama_attn"), Some(true)));
    assert_eq!(j["python"]["kernels"]["cubins"].as_array().unwrap().len(), 2);
    assert!(!pkg.join("optimizerd_kernels").exists(), "the old package folder is gone");
    assert_eq!(read_json(&pkg.join("llama_attn/kernels/manifest.json"))["package"]["name"], "llama_attn");
    assert!(std::fs::read_to_string(pkg.join("pyproject.toml")).unwrap().contains("name = \"llama_attn\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_python_refuses_what_it_must_not_write() {
    let p = tuned().await;
    // A folder that is not an earlier export is never emptied.
    let mine = p.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "keep").unwrap();
    let r = optimizerd(p.path(), &["export", "--python", "mine"], &[]);
    assert_code(&r, exit::FAILURE);
    assert!(r.stderr.contains("mine is not empty") && r.stderr.contains(".optimizerd-package") && r.stderr.contains("new or empty folder"), "{}", r.stderr);
    assert_eq!(walk(&mine), vec!["notes.txt".to_string()]);
    // A name Python cannot import: a usage error naming the fix; nothing written.
    for (name, says) in [("my-kernels", "'-'"), ("import", "keyword"), ("9lives", "digit")] {
        let r = optimizerd(p.path(), &["export", "--python", "bad", "--package-name", name], &[]);
        assert_code(&r, exit::USAGE);
        assert!(r.stderr.contains(says) && r.stderr.contains("--package-name"), "{name}: {}", r.stderr);
    }
    assert!(!p.path().join("bad").exists());
    // --package-name goes with --python; one of --out and --python is needed.
    let r = optimizerd(p.path(), &["export", "--out", "x", "--package-name", "k"], &[]);
    assert_code(&r, exit::USAGE);
    let r = optimizerd(p.path(), &["export"], &[]);
    assert_code(&r, exit::USAGE);
    assert!(r.stderr.contains("--out <DIR>|--python <DIR>"), "{}", r.stderr);
    // Without NVRTC: what to do, exit status NO_GPU, and nothing written.
    let r = optimizerd(p.path(), &["export", "--python", "nonvrtc"], &[("OPTIMIZERD_NVRTC_LIB", "/nonexistent/libnvrtc.so.13")]);
    assert_code(&r, exit::NO_GPU);
    assert!(r.stderr.contains("cubin with NVRTC") && r.stderr.contains("scripts/setup.sh") && r.stderr.contains("--out only"), "{}", r.stderr);
    assert!(!p.path().join("nonvrtc").exists());
    // A file where the folder should be.
    std::fs::write(p.path().join("afile"), "").unwrap();
    let r = optimizerd(p.path(), &["export", "--python", "afile"], &[]);
    assert_code(&r, exit::FAILURE);
    assert!(r.stderr.contains("afile is not a folder"), "{}", r.stderr);
}

/// Files under `dir`, relative, sorted.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// `python3 -m unittest discover -s python/tests` with OPTD_PACKAGE_DIR = `pkg`, when the
/// repository has python/tests. Without torch in .deps/py: a failure under CI (the
/// setup is broken), else skipped with the reason.
fn python_tests(pkg: &Path) {
    let repo = common::repo_root();
    if !repo.join("python/tests").is_dir() {
        println!("skipped the package's Python tests: {} does not exist", repo.join("python/tests").display());
        return;
    }
    let pythonpath = repo.join(".deps/py");
    let has_torch = Command::new("python3")
        .args(["-c", "import torch"])
        .env("PYTHONPATH", &pythonpath)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        let why = format!("python3 cannot import torch from {} (scripts/setup.sh installs it)", pythonpath.display());
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true: the package's Python tests must run, but {why}");
        println!("skipped the package's Python tests: {why}");
        return;
    }
    let o = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "python/tests", "-v"])
        .current_dir(&repo)
        .env("OPTD_PACKAGE_DIR", pkg)
        .env("PYTHONPATH", &pythonpath)
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the package's Python tests failed against {}:\n{text}", pkg.display());
    println!("{text}");
}
