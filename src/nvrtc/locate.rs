//! Finding NVRTC and the CUDA headers: environment overrides first, then the project's
//! `.deps/` (pinned pip wheels from `scripts/setup.sh`) next to the working directory or
//! the executable, then `$CUDA_HOME`, `$CUDA_PATH` and `/usr/local/cuda`; loading the
//! library found, preloading its builtins, and reading its version.

use std::ffi::CString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::error::NvrtcError;
use super::ffi::{api_for, dl_error, NVRTC_SUCCESS};

/// Overrides the NVRTC shared library to load (a file path).
pub const ENV_NVRTC_LIB: &str = "OPTIMIZERD_NVRTC_LIB";
/// Overrides the CUDA include directory (must contain `cuda_fp16.h`).
pub const ENV_CUDA_INCLUDE: &str = "OPTIMIZERD_CUDA_INCLUDE";

/// A usable NVRTC: the loaded library, the headers to compile against, and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// Absolute path of the loaded `libnvrtc` file.
    pub lib: PathBuf,
    /// CUDA include directory passed to NVRTC with `--include-path`.
    pub include_dir: PathBuf,
    /// (major, minor) as reported by `nvrtcVersion`.
    pub version: (i32, i32),
}

const LIB_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so", "libnvrtc.so.12"];

/// A place NVRTC might live: candidate library files and the include dir that goes with them.
struct Root {
    libs: Vec<PathBuf>,
    include: PathBuf,
}

fn deps_root(base: &Path) -> Root {
    let cu13 = base.join(".deps/cuda/nvidia/cu13");
    Root {
        libs: vec![cu13.join("lib/libnvrtc.so.13")],
        include: cu13.join("include"),
    }
}

fn toolkit_root(base: &Path) -> Root {
    let mut libs = Vec::new();
    for dir in [
        "lib64",
        "lib",
        "targets/x86_64-linux/lib",
        "targets/sbsa-linux/lib",
    ] {
        for name in LIB_NAMES {
            libs.push(base.join(dir).join(name));
        }
    }
    Root {
        libs,
        include: base.join("include"),
    }
}

fn search_roots() -> Vec<Root> {
    let mut bases: Vec<PathBuf> = Vec::new();
    let mut push_ancestors = |start: &Path| {
        for dir in start.ancestors() {
            if !bases.iter().any(|b| b == dir) {
                bases.push(dir.to_path_buf());
            }
        }
    };
    if let Ok(cwd) = std::env::current_dir() {
        push_ancestors(&cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        let exe = exe.canonicalize().unwrap_or(exe);
        if let Some(dir) = exe.parent() {
            push_ancestors(dir);
        }
    }
    let mut roots: Vec<Root> = bases.iter().map(|b| deps_root(b)).collect();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            roots.push(toolkit_root(Path::new(&v)));
        }
    }
    roots.push(toolkit_root(Path::new("/usr/local/cuda")));
    roots
}

fn is_include_dir(dir: &Path) -> bool {
    dir.join("cuda_fp16.h").is_file()
}

/// Find NVRTC and the CUDA headers, load the library, and return the toolchain.
///
/// Runs the search once per process; later calls return the same result.
pub fn locate() -> Result<Toolchain, NvrtcError> {
    static FOUND: OnceLock<Result<Toolchain, NvrtcError>> = OnceLock::new();
    FOUND.get_or_init(locate_uncached).clone()
}

fn locate_uncached() -> Result<Toolchain, NvrtcError> {
    let env_lib = std::env::var_os(ENV_NVRTC_LIB)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let env_inc = std::env::var_os(ENV_CUDA_INCLUDE)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    locate_in(env_lib, env_inc, search_roots())
}

/// The search itself, with the environment and the roots passed in (for tests).
fn locate_in(
    env_lib: Option<PathBuf>,
    env_inc: Option<PathBuf>,
    roots: Vec<Root>,
) -> Result<Toolchain, NvrtcError> {
    if let Some(p) = &env_lib {
        if !p.is_file() {
            return Err(NvrtcError::EnvLibMissing {
                var: ENV_NVRTC_LIB,
                path: p.clone(),
            });
        }
    }
    if let Some(p) = &env_inc {
        if !is_include_dir(p) {
            return Err(NvrtcError::EnvIncludeInvalid {
                var: ENV_CUDA_INCLUDE,
                path: p.clone(),
            });
        }
    }
    let mut searched = String::new();
    let (lib, paired_include) = match env_lib {
        Some(p) => (p, None),
        None => {
            let mut found = None;
            'outer: for root in &roots {
                for lib in &root.libs {
                    if lib.is_file() {
                        found = Some((lib.clone(), Some(root.include.clone())));
                        break 'outer;
                    }
                    let _ = writeln!(searched, "  {}", lib.display());
                }
            }
            match found {
                Some(f) => f,
                None => return Err(NvrtcError::LibNotFound { searched }),
            }
        }
    };
    let lib = lib.canonicalize().unwrap_or(lib);

    let include_dir = match env_inc {
        Some(p) => p,
        None => {
            // Prefer the headers that ship with the library found, then ../include next to
            // the library file, then any other root's headers.
            let mut candidates: Vec<PathBuf> = Vec::new();
            candidates.extend(paired_include);
            if let Some(libdir) = lib.parent() {
                candidates.push(libdir.join("../include"));
                candidates.push(libdir.join("../../include"));
            }
            candidates.extend(roots.iter().map(|r| r.include.clone()));
            let mut searched = String::new();
            let mut found = None;
            for c in candidates {
                if is_include_dir(&c) {
                    found = Some(c.canonicalize().unwrap_or(c));
                    break;
                }
                let _ = writeln!(searched, "  {}", c.display());
            }
            match found {
                Some(f) => f,
                None => return Err(NvrtcError::IncludeNotFound { lib, searched }),
            }
        }
    };

    let api = api_for(&lib)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    let rc = unsafe { (api.version)(&mut major, &mut minor) };
    if rc != NVRTC_SUCCESS {
        return Err(NvrtcError::Version {
            path: lib,
            message: api.error_name(rc),
        });
    }

    preload_builtins(&lib, (major, minor));

    // cudarc's own NVRTC wrappers dlopen by soname; with our copy resident they find it.
    // We do not depend on them, so a miss is only worth a note.
    // SAFETY: is_culib_present only tries dlopen on a list of names and closes them again.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        tracing::debug!(lib = %lib.display(), "cudarc cannot see NVRTC by soname; optimizerd uses its own handle");
    }
    tracing::debug!(lib = %lib.display(), include = %include_dir.display(), major, minor, "NVRTC located");
    Ok(Toolchain {
        lib,
        include_dir,
        version: (major, minor),
    })
}

/// NVRTC dlopens `libnvrtc-builtins.so.MAJOR.MINOR` by bare name at its first compile,
/// which fails unless that file is on the loader's path. Loading it from the directory of
/// the library we found, `RTLD_GLOBAL`, makes that lookup resolve to the resident copy.
fn preload_builtins(lib: &Path, (major, minor): (i32, i32)) {
    let Some(dir) = lib.parent() else { return };
    let exact = dir.join(format!("libnvrtc-builtins.so.{major}.{minor}"));
    let candidate = if exact.is_file() {
        Some(exact)
    } else {
        // Fall back to any builtins file of the same major version (not the `.alt` variant).
        std::fs::read_dir(dir).ok().and_then(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with(&format!("libnvrtc-builtins.so.{major}"))
                            && !n.contains(".alt.")
                    })
                })
                .min()
        })
    };
    let Some(path) = candidate else {
        tracing::debug!(dir = %dir.display(), "no libnvrtc-builtins next to NVRTC; relying on the loader's path");
        return;
    };
    let Ok(c_path) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: c_path is a valid C string naming NVIDIA's builtins library; the handle is
    // deliberately never closed.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        tracing::warn!(path = %path.display(), error = %dl_error(), "could not preload NVRTC builtins");
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// NVRTC is part of the project's setup (`bash scripts/setup.sh`): these tests never
    /// skip, so a missing toolchain fails loudly with the search report.
    pub(in crate::nvrtc) fn toolchain() -> Toolchain {
        match locate() {
            Ok(tc) => tc,
            Err(e) => panic!(
                "NVRTC is required for these tests (CI={:?}): {e}",
                std::env::var("CI").ok()
            ),
        }
    }

    #[test]
    fn locate_finds_library_headers_and_version() {
        let tc = toolchain();
        assert!(tc.lib.is_file(), "{}", tc.lib.display());
        assert!(tc.include_dir.join("cuda_fp16.h").is_file());
        assert!(tc.version.0 >= 12, "version {:?}", tc.version);
        // Cached: the same answer twice.
        assert_eq!(locate().unwrap(), tc);
    }

    #[test]
    fn search_failures_say_what_was_searched_and_how_to_fix_it() {
        let dir = std::env::temp_dir().join(format!("optd-nvrtc-test-{}", std::process::id()));
        let missing = locate_in(Some(dir.join("libnvrtc.so.13")), None, vec![]).unwrap_err();
        assert!(
            matches!(missing, NvrtcError::EnvLibMissing { .. }),
            "{missing}"
        );
        assert!(
            missing.to_string().contains("scripts/setup.sh"),
            "{missing}"
        );
        assert!(missing.to_string().contains(ENV_NVRTC_LIB), "{missing}");

        let bad_inc = locate_in(None, Some(dir.clone()), vec![]).unwrap_err();
        assert!(
            matches!(bad_inc, NvrtcError::EnvIncludeInvalid { .. }),
            "{bad_inc}"
        );

        let none = locate_in(
            None,
            None,
            vec![deps_root(&dir), toolkit_root(&dir.join("cuda"))],
        )
        .unwrap_err();
        let msg = none.to_string();
        assert!(matches!(none, NvrtcError::LibNotFound { .. }), "{msg}");
        assert!(
            msg.contains(".deps/cuda/nvidia/cu13/lib/libnvrtc.so.13"),
            "{msg}"
        );
        assert!(msg.contains("cuda/lib64/libnvrtc.so"), "{msg}");
        assert!(msg.contains("OPTIMIZERD_NVRTC_LIB"), "{msg}");
    }

    #[test]
    fn explicit_paths_are_honoured() {
        let tc = toolchain();
        let again = locate_in(Some(tc.lib.clone()), Some(tc.include_dir.clone()), vec![]).unwrap();
        assert_eq!(again, tc);
        // The library alone: headers are found next to it.
        let paired = locate_in(Some(tc.lib.clone()), None, vec![]);
        if let Ok(p) = paired {
            assert!(p.include_dir.join("cuda_fp16.h").is_file());
        }
    }

}
