//! `export --python DIR`: a run's best kernels as an installable Python package.
//!
//! The package's sources live in the repository under `python/package/` and are
//! embedded in the binary, so the binary alone can write a package. Export writes them
//! into DIR (`pyproject.toml.in` with its `@NAME@` / `@VERSION@` filled in, as
//! `pyproject.toml`; the `optimizerd_kernels/` folder as `DIR/NAME/`), then the kernels,
//! their cubins and the manifest into `DIR/NAME/kernels/` ([`crate::ops::export`]).
//!
//! DIR is replaced wholesale on the next export, so it must be ours: a marker file
//! (`.optimizerd-package`) says so. A folder without it that holds anything is refused,
//! never emptied: it could be the user's project.

use std::path::{Path, PathBuf};

use include_dir::{include_dir, Dir, DirEntry};

use crate::nvrtc::Toolchain;
use crate::ops::export::{export_with, ExportOptions, Exported, PackageInfo};
use crate::storage::ledger::Ledger;

/// The package skeleton, as the repository has it at build time (build.rs rebuilds on change).
static SKELETON: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/python/package");

/// The skeleton's package folder, written under the chosen name.
const SKELETON_PACKAGE: &str = "optimizerd_kernels";
/// The template of `pyproject.toml`.
const PYPROJECT_IN: &str = "pyproject.toml.in";
/// Marks a folder as written by `export --python`, so the next export may replace it.
pub const MARKER: &str = ".optimizerd-package";
/// The package name without `--package-name`.
pub const DEFAULT_NAME: &str = "optimizerd_kernels";

/// Python's keywords (3.12, hard ones): a package cannot be imported under these names.
const KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del", "elif", "else",
    "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise",
    "return", "try", "while", "with", "yield",
];

/// Modules the package imports: a package of that name would shadow them.
const SHADOWED: [&str; 4] = ["torch", "transformers", "jinja2", "numpy"];

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(
        "package name {name:?} {why}; give --package-name a name Python can import, e.g. optimizerd_kernels or llama3_attention \
         (ASCII letters, digits and `_`, not starting with a digit, not a Python keyword)"
    )]
    BadName { name: String, why: String },
    #[error(
        "{} is not empty and was not written by `optimizerd export --python` (it has no {MARKER}); export into a new or empty folder, \
         or remove this one first (export replaces a folder it wrote, never another)",
        dir.display()
    )]
    Foreign { dir: PathBuf },
    #[error("{} is not a folder; give --python a folder to write the package into", dir.display())]
    NotAFolder { dir: PathBuf },
    #[error("cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PackageError {
    let path = path.to_path_buf();
    move |source| PackageError::Io { what, path, source }
}

/// Whether `name` can be the package's import name (and its torch op namespace).
pub fn validate_name(name: &str) -> Result<(), PackageError> {
    let bad = |why: &str| Err(PackageError::BadName { name: name.to_string(), why: why.to_string() });
    let mut chars = name.chars();
    match chars.next() {
        None => return bad("is empty"),
        Some(c) if c.is_ascii_digit() => return bad("starts with a digit"),
        Some(_) => {}
    }
    // ASCII only, although Python allows more: the name is also the distribution name
    // pip shows and the op namespace `torch.ops.<name>`.
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_')) {
        return bad(&format!("has {c:?}, which a Python identifier cannot hold"));
    }
    if KEYWORDS.contains(&name) {
        return bad("is a Python keyword");
    }
    if SHADOWED.contains(&name) {
        return bad("would shadow a module the package itself imports");
    }
    Ok(())
}

/// The package version: the optimizerd release, and the run as a PEP 440 local label
/// (`0.1.0+20261121.184149.4b49`), so `pip show` tells which run it came from.
pub fn version_for(run_id: &str) -> String {
    let label: Vec<String> = run_id
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| !p.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let release = env!("CARGO_PKG_VERSION");
    if label.is_empty() {
        release.to_string()
    } else {
        format!("{release}+{}", label.join("."))
    }
}

/// What `export --python` wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PythonExport {
    pub dir: PathBuf,
    pub package: String,
    pub version: String,
    /// True when DIR held an earlier export, now replaced.
    pub replaced: bool,
    /// The kernels folder, `DIR/NAME/kernels`, with the manifest.
    pub kernels: Exported,
}

/// Make `dir` an empty folder holding only the marker: created if missing, used if
/// empty, emptied if it holds the marker of an earlier export; refused otherwise.
/// Returns whether an earlier export was replaced.
fn prepare_dir(dir: &Path, marker: &str) -> Result<bool, PackageError> {
    let replaced = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
            false
        }
        Err(e) => return Err(io("read", dir)(e)),
        // A link to a folder is that folder.
        Ok(_) if !dir.is_dir() => return Err(PackageError::NotAFolder { dir: dir.into() }),
        Ok(_) => {
            let entries: Vec<std::fs::DirEntry> =
                std::fs::read_dir(dir).map_err(io("list", dir))?.collect::<Result<_, _>>().map_err(io("list", dir))?;
            let ours = entries.iter().any(|e| e.file_name() == MARKER);
            if !entries.is_empty() && !ours {
                return Err(PackageError::Foreign { dir: dir.into() });
            }
            for e in &entries {
                let path = e.path();
                // A link is removed, never followed: only what export wrote goes.
                let is_dir = e.file_type().map_err(io("read", &path))?.is_dir();
                if is_dir { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) }.map_err(io("remove", &path))?;
            }
            ours
        }
    };
    // First, so that an export that fails half-way leaves a folder the next one may replace.
    let path = dir.join(MARKER);
    std::fs::write(&path, marker).map_err(io("write", &path))?;
    Ok(replaced)
}

/// Where a skeleton file goes under DIR, or None for files that are not sources.
fn target_of(rel: &Path, name: &str) -> Option<PathBuf> {
    if rel.components().any(|c| c.as_os_str() == "__pycache__") || rel.extension().is_some_and(|e| e == "pyc") {
        return None; // left by running the package's tests in the repository
    }
    if rel == Path::new(PYPROJECT_IN) {
        return Some(PathBuf::from("pyproject.toml"));
    }
    match rel.strip_prefix(SKELETON_PACKAGE) {
        Ok(inner) => Some(Path::new(name).join(inner)),
        Err(_) => Some(rel.to_path_buf()),
    }
}

/// Write the embedded skeleton into `dir` as package `name` of `version`.
fn write_skeleton(dir: &Path, name: &str, version: &str) -> Result<(), PackageError> {
    let mut stack: Vec<&Dir<'static>> = vec![&SKELETON];
    while let Some(d) = stack.pop() {
        for entry in d.entries() {
            let file = match entry {
                DirEntry::Dir(sub) => {
                    stack.push(sub);
                    continue;
                }
                DirEntry::File(f) => f,
            };
            let Some(rel) = target_of(file.path(), name) else { continue };
            let path = dir.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            let contents = if file.path() == Path::new(PYPROJECT_IN) {
                String::from_utf8_lossy(file.contents()).replace("@NAME@", name).replace("@VERSION@", version).into_bytes()
            } else {
                file.contents().to_vec()
            };
            std::fs::write(&path, contents).map_err(io("write", &path))?;
        }
    }
    Ok(())
}

/// Write run `run_id`'s best kernels into `dir` as the Python package `name`, each
/// kernel with its cubin compiled by `tc`.
pub async fn export_python(ledger: &Ledger, run_id: &str, dir: &Path, name: &str, tc: Toolchain) -> anyhow::Result<PythonExport> {
    validate_name(name)?;
    // Refuse what can be known before DIR is touched.
    let run = ledger.run(Some(run_id)).await?;
    anyhow::ensure!(!ledger.best(&run.id).await?.is_empty(), "run {} has no correct kernel yet: nothing to export", run.id);
    let version = version_for(&run.id);
    let marker = serde_json::json!({
        "written_by": "optimizerd export --python", "optimizerd": env!("CARGO_PKG_VERSION"), "run": run.id, "package": name,
        "note": "this folder is replaced by the next `optimizerd export --python` into it",
    });
    let replaced = prepare_dir(dir, &serde_json::to_string_pretty(&marker)?)?;
    write_skeleton(dir, name, &version)?;
    let opts = ExportOptions {
        cubins: Some(tc),
        package: Some(PackageInfo { name: name.to_string(), optimizerd: env!("CARGO_PKG_VERSION").to_string() }),
    };
    let kernels = export_with(ledger, &run.id, &dir.join(name).join("kernels"), &opts).await?;
    Ok(PythonExport { dir: dir.to_path_buf(), package: name.to_string(), version, replaced, kernels })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_name_is_an_importable_identifier() {
        for ok in ["optimizerd_kernels", "llama3_attn", "_private", "A1"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for (bad, says) in [("", "empty"), ("3llama", "digit"), ("my-kernels", "'-'"), ("a.b", "'.'"), ("class", "keyword"), ("torch", "shadow"), ("ké", "'é'")] {
            let e = validate_name(bad).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("--package-name"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_version_carries_the_run_as_a_local_label() {
        assert_eq!(version_for("20261121-184149-4b49"), format!("{}+20261121.184149.4b49", env!("CARGO_PKG_VERSION")));
        assert_eq!(version_for("My_Run..x"), format!("{}+my.run.x", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn the_skeleton_is_written_under_the_package_name_without_caches() {
        assert_eq!(target_of(Path::new("optimizerd_kernels/__init__.py"), "llama"), Some(PathBuf::from("llama/__init__.py")));
        assert_eq!(target_of(Path::new("pyproject.toml.in"), "llama"), Some(PathBuf::from("pyproject.toml")));
        assert_eq!(target_of(Path::new("_optd_build/backend.py"), "llama"), Some(PathBuf::from("_optd_build/backend.py")));
        assert_eq!(target_of(Path::new("optimizerd_kernels/__pycache__/x.cpython-312.pyc"), "llama"), None);
        assert!(SKELETON.get_file(PYPROJECT_IN).is_some(), "python/package/{PYPROJECT_IN} is embedded");
        assert!(SKELETON.get_dir(SKELETON_PACKAGE).is_some(), "python/package/{SKELETON_PACKAGE}/ is embedded");
    }

    #[test]
    fn only_an_empty_folder_or_an_earlier_export_is_written_into() {
        let t = tempfile::tempdir().unwrap();
        let fresh = t.path().join("new/pkg");
        assert!(!prepare_dir(&fresh, "m").unwrap(), "created");
        assert!(fresh.join(MARKER).is_file());
        std::fs::create_dir_all(fresh.join("old/sub")).unwrap();
        std::fs::write(fresh.join("old/sub/f"), "x").unwrap();
        assert!(prepare_dir(&fresh, "m").unwrap(), "replaced");
        assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 1, "only the marker is left");
        let empty = t.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(!prepare_dir(&empty, "m").unwrap());
        let foreign = t.path().join("project");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::write(foreign.join("setup.py"), "keep me").unwrap();
        let e = prepare_dir(&foreign, "m").unwrap_err();
        assert!(matches!(e, PackageError::Foreign { .. }) && e.to_string().contains(MARKER), "{e}");
        assert_eq!(std::fs::read_to_string(foreign.join("setup.py")).unwrap(), "keep me");
        let file = t.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(prepare_dir(&file, "m").unwrap_err(), PackageError::NotAFolder { .. }));
    }
}
