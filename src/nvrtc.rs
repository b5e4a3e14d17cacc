//! Locating and calling NVRTC, NVIDIA's runtime CUDA C++ compiler.
//!
//! NVRTC ships as a shared library (`libnvrtc.so.13`) plus the CUDA headers; neither
//! is linked at build time. [`locate`] finds both (environment overrides first, then
//! the project's `.deps/` installed by `scripts/setup.sh`, then `$CUDA_HOME`,
//! `$CUDA_PATH` and `/usr/local/cuda`), loads the library by absolute path with
//! `RTLD_NOW | RTLD_GLOBAL` and keeps it loaded for the life of the process. Because
//! the library is then resident under its soname, cudarc's own `dlopen("libnvrtc.so.13")`
//! resolves to the same copy instead of panicking. This module itself calls NVRTC
//! through function pointers resolved from that handle, so it never depends on which
//! copy the dynamic loader would pick by name.
//!
//! [`compile`] turns one CUDA C++ source into a CUBIN for a real architecture
//! (`sm_90`, ..., or an arch-specific one such as `sm_90a`, whose cubin runs only on
//! that exact compute capability but may use wgmma and setmaxnreg), keeping NVRTC's
//! log as plain text so it can be shown to a person.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Overrides the NVRTC shared library to load (a file path).
pub const ENV_NVRTC_LIB: &str = "OPTIMIZERD_NVRTC_LIB";
/// Overrides the CUDA include directory (must contain `cuda_fp16.h`).
pub const ENV_CUDA_INCLUDE: &str = "OPTIMIZERD_CUDA_INCLUDE";

const FIX_HINT: &str = "run scripts/setup.sh (installs NVRTC and the CUDA headers into .deps/), \
or set OPTIMIZERD_NVRTC_LIB=/path/to/libnvrtc.so.13 and OPTIMIZERD_CUDA_INCLUDE=/path/to/cuda/include";

/// NVRTC's result codes that this module treats specially (see `nvrtc.h`).
const NVRTC_SUCCESS: c_int = 0;
const NVRTC_ERROR_INVALID_OPTION: c_int = 5;
const NVRTC_ERROR_COMPILATION: c_int = 6;
const NVRTC_ERROR_INTERNAL_ERROR: c_int = 11;
const NVRTC_ERROR_CANCELLED: c_int = 16;

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

/// Why NVRTC could not be found or loaded. Every message says what was tried and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvrtcError {
    #[error("{var}={path} does not name an existing file; {FIX_HINT}")]
    EnvLibMissing { var: &'static str, path: PathBuf },
    #[error("{var}={path} is not a directory containing cuda_fp16.h; {FIX_HINT}")]
    EnvIncludeInvalid { var: &'static str, path: PathBuf },
    #[error("NVRTC (libnvrtc) not found; searched:\n{searched}\nTo fix: {FIX_HINT}")]
    LibNotFound { searched: String },
    #[error(
        "CUDA headers (cuda_fp16.h) not found for NVRTC at {lib}; searched:\n{searched}\nTo fix: {FIX_HINT}"
    )]
    IncludeNotFound { lib: PathBuf, searched: String },
    #[error("could not load NVRTC from {path}: {reason}; {FIX_HINT}")]
    LoadFailed { path: PathBuf, reason: String },
    #[error("{path} is not a usable NVRTC: missing symbol {symbol}; {FIX_HINT}")]
    MissingSymbol { path: PathBuf, symbol: &'static str },
    #[error("NVRTC at {path} failed to report its version: {message}")]
    Version { path: PathBuf, message: String },
}

/// A successful compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The ELF image (`\x7fELF...`), loadable with `cuModuleLoadData`.
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings), possibly empty.
    pub log: String,
    /// Wall-clock milliseconds spent in NVRTC.
    pub ms: f64,
}

/// Why a compilation produced no CUBIN.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompileFailure {
    /// NVRTC rejected the program (`NVRTC_ERROR_COMPILATION`): a problem in the source.
    #[error("NVRTC rejected the program:\n{log}")]
    Rejected { log: String },
    /// The compile-time budget ran out and NVRTC was asked to cancel.
    #[error("compilation cancelled after exceeding its {limit_ms} ms budget")]
    TimedOut { limit_ms: u64, log: String },
    /// Any other NVRTC failure (bad option, internal error, out of memory, ...).
    #[error("NVRTC failed during {during}: {name} ({code}){}", if log.is_empty() { String::new() } else { format!(":\n{log}") })]
    Nvrtc {
        during: &'static str,
        code: i32,
        name: String,
        log: String,
    },
    /// The inputs could not be handed to NVRTC at all (e.g. a NUL byte in the source).
    #[error("invalid compile input: {0}")]
    InvalidInput(String),
    /// The toolchain's library could not be (re)loaded.
    #[error(transparent)]
    Toolchain(#[from] NvrtcError),
}

impl CompileFailure {
    /// NVRTC's result code when the failure came from an NVRTC call.
    pub fn nvrtc_code(&self) -> Option<i32> {
        match self {
            CompileFailure::Nvrtc { code, .. } => Some(*code),
            CompileFailure::Rejected { .. } => Some(NVRTC_ERROR_COMPILATION),
            CompileFailure::TimedOut { .. } => Some(NVRTC_ERROR_CANCELLED),
            _ => None,
        }
    }

    /// True when the caller passed something NVRTC cannot accept (an option, an arch,
    /// a NUL byte): a bug on the requesting side rather than in the program.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            CompileFailure::InvalidInput(_)
                | CompileFailure::Nvrtc {
                    code: NVRTC_ERROR_INVALID_OPTION,
                    ..
                }
        )
    }

    /// True when NVRTC crashed internally: usually provoked by the program itself.
    pub fn is_internal_compiler_error(&self) -> bool {
        matches!(
            self,
            CompileFailure::Nvrtc {
                code: NVRTC_ERROR_INTERNAL_ERROR,
                ..
            }
        )
    }

    /// The NVRTC log, if any was produced.
    pub fn log(&self) -> &str {
        match self {
            CompileFailure::Rejected { log }
            | CompileFailure::TimedOut { log, .. }
            | CompileFailure::Nvrtc { log, .. } => log,
            _ => "",
        }
    }
}

// ----------------------------------------------------------------------------------------
// The NVRTC entry points, resolved from our own handle.

type Program = *mut c_void;
type FlowCallback = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type CreateProgramFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgramFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type DestroyProgramFn = unsafe extern "C" fn(*mut Program) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type BytesFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type SetFlowCallbackFn = unsafe extern "C" fn(Program, Option<FlowCallback>, *mut c_void) -> c_int;

struct Api {
    version: VersionFn,
    get_error_string: ErrorStringFn,
    create_program: CreateProgramFn,
    compile_program: CompileProgramFn,
    destroy_program: DestroyProgramFn,
    get_cubin_size: SizeFn,
    get_cubin: BytesFn,
    get_log_size: SizeFn,
    get_log: BytesFn,
    /// `nvrtcSetFlowCallback` (NVRTC >= 12.x), used to cancel over-long compiles.
    set_flow_callback: Option<SetFlowCallbackFn>,
}

impl Api {
    fn error_name(&self, code: c_int) -> String {
        // SAFETY: nvrtcGetErrorString accepts any value and returns a pointer to a static
        // NUL-terminated string (or "NVRTC_ERROR unknown"); we null-check it anyway.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            format!("NVRTC error {code}")
        } else {
            // SAFETY: non-null, NUL-terminated, static lifetime per the NVRTC docs.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }
}

/// Libraries loaded by this module, by canonical path. Handles are never closed.
fn loaded_apis() -> &'static Mutex<HashMap<PathBuf, &'static Api>> {
    static APIS: OnceLock<Mutex<HashMap<PathBuf, &'static Api>>> = OnceLock::new();
    APIS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local, NUL-terminated message or null.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-null result of dlerror is a valid C string until the next dl* call.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Load `lib` (once per path, leaked) and resolve the NVRTC entry points from it.
fn api_for(lib: &Path) -> Result<&'static Api, NvrtcError> {
    let key = lib.canonicalize().unwrap_or_else(|_| lib.to_path_buf());
    let mut map = loaded_apis().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(api) = map.get(&key) {
        return Ok(api);
    }
    let c_path =
        CString::new(key.as_os_str().as_encoded_bytes()).map_err(|_| NvrtcError::LoadFailed {
            path: key.clone(),
            reason: "path contains a NUL byte".into(),
        })?;
    // SAFETY: c_path is a valid C string. Loading NVRTC runs its (trusted, NVIDIA-provided)
    // initializers; RTLD_GLOBAL makes it resident under its soname for cudarc's later dlopen.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(NvrtcError::LoadFailed {
            path: key,
            reason: dl_error(),
        });
    }
    let sym = |name: &'static str| -> Result<*mut c_void, NvrtcError> {
        let c_name = CString::new(name).map_err(|_| NvrtcError::MissingSymbol {
            path: key.clone(),
            symbol: name,
        })?;
        // SAFETY: handle is a live dlopen handle (never closed); c_name is a valid C string.
        let p = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
        if p.is_null() {
            Err(NvrtcError::MissingSymbol {
                path: key.clone(),
                symbol: name,
            })
        } else {
            Ok(p)
        }
    };
    // SAFETY (all transmutes below): each symbol is the NVRTC C function of that name, whose
    // signature in nvrtc.h matches the function-pointer type it is transmuted to.
    let api = unsafe {
        Api {
            version: std::mem::transmute::<*mut c_void, VersionFn>(sym("nvrtcVersion")?),
            get_error_string: std::mem::transmute::<*mut c_void, ErrorStringFn>(sym(
                "nvrtcGetErrorString",
            )?),
            create_program: std::mem::transmute::<*mut c_void, CreateProgramFn>(sym(
                "nvrtcCreateProgram",
            )?),
            compile_program: std::mem::transmute::<*mut c_void, CompileProgramFn>(sym(
                "nvrtcCompileProgram",
            )?),
            destroy_program: std::mem::transmute::<*mut c_void, DestroyProgramFn>(sym(
                "nvrtcDestroyProgram",
            )?),
            get_cubin_size: std::mem::transmute::<*mut c_void, SizeFn>(sym("nvrtcGetCUBINSize")?),
            get_cubin: std::mem::transmute::<*mut c_void, BytesFn>(sym("nvrtcGetCUBIN")?),
            get_log_size: std::mem::transmute::<*mut c_void, SizeFn>(sym(
                "nvrtcGetProgramLogSize",
            )?),
            get_log: std::mem::transmute::<*mut c_void, BytesFn>(sym("nvrtcGetProgramLog")?),
            set_flow_callback: sym("nvrtcSetFlowCallback")
                .ok()
                .map(|p| std::mem::transmute::<*mut c_void, SetFlowCallbackFn>(p)),
        }
    };
    let api: &'static Api = Box::leak(Box::new(api));
    map.insert(key, api);
    Ok(api)
}

// ----------------------------------------------------------------------------------------
// Locating the library and the headers.

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

// ----------------------------------------------------------------------------------------
// Compiling.

/// Destroys the program on every exit path.
struct ProgramGuard<'a> {
    api: &'a Api,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: prog was created by nvrtcCreateProgram and is destroyed exactly once here.
        unsafe { (self.api.destroy_program)(&mut self.prog) };
    }
}

extern "C" fn cancel_after_deadline(payload: *mut c_void, _reserved: *mut c_void) -> c_int {
    // SAFETY: payload is the &Instant passed to nvrtcSetFlowCallback; it outlives the
    // nvrtcCompileProgram call during which NVRTC invokes this callback. Reading an Instant
    // is thread-safe, and once past the deadline we keep answering 1 as NVRTC requires.
    let deadline = unsafe { &*(payload as *const Instant) };
    c_int::from(Instant::now() >= *deadline)
}

fn program_log(api: &Api, prog: Program) -> String {
    let mut size = 0usize;
    // SAFETY: prog is live; size is a valid out pointer.
    if unsafe { (api.get_log_size)(prog, &mut size) } != NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: buf holds `size` bytes, the size NVRTC asked for (including the NUL).
    if unsafe { (api.get_log)(prog, buf.as_mut_ptr() as *mut c_char) } != NVRTC_SUCCESS {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
}

/// NVRTC options used for every compile (besides defines).
pub fn base_options(tc: &Toolchain, arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        format!("--include-path={}", tc.include_dir.display()),
        "-lineinfo".to_string(),
    ]
}

/// Compile `source` to a CUBIN for `arch` (a real architecture such as `sm_90`).
///
/// `name` appears in the log's diagnostics (`name(line): error: ...`). `defines` become
/// `-DNAME=VALUE` (or `-DNAME` for an empty value).
pub fn compile(
    tc: &Toolchain,
    source: &str,
    name: &str,
    arch: &str,
    defines: &[(&str, String)],
) -> Result<Compiled, CompileFailure> {
    compile_with_timeout(tc, source, name, arch, defines, None)
}

/// [`compile`] with a soft time budget: past `timeout`, NVRTC is asked to cancel
/// (via `nvrtcSetFlowCallback`) and [`CompileFailure::TimedOut`] is returned.
pub fn compile_with_timeout(
    tc: &Toolchain,
    source: &str,
    name: &str,
    arch: &str,
    defines: &[(&str, String)],
    timeout: Option<Duration>,
) -> Result<Compiled, CompileFailure> {
    let valid_arch = arch
        .strip_prefix("sm_")
        .map(|rest| {
            let digits = rest.trim_end_matches(['a', 'f']);
            !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
        })
        .unwrap_or(false);
    if !valid_arch {
        return Err(CompileFailure::InvalidInput(format!(
            "arch must be a real GPU architecture such as sm_90, got {arch:?}"
        )));
    }
    let c_src = CString::new(source)
        .map_err(|_| CompileFailure::InvalidInput("source contains a NUL byte".into()))?;
    let c_name = CString::new(name)
        .map_err(|_| CompileFailure::InvalidInput("program name contains a NUL byte".into()))?;
    let mut options = base_options(tc, arch);
    for (k, v) in defines {
        if k.is_empty() || k.contains(|c: char| c.is_whitespace() || c == '=') {
            return Err(CompileFailure::InvalidInput(format!(
                "bad macro name {k:?}"
            )));
        }
        options.push(if v.is_empty() {
            format!("-D{k}")
        } else {
            format!("-D{k}={v}")
        });
    }
    let c_opts = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| CompileFailure::InvalidInput("an option contains a NUL byte".into()))?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();

    let api = api_for(&tc.lib)?;
    let start = Instant::now();

    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: all strings are valid NUL-terminated C strings that outlive the program;
    // no headers are passed (count 0, null arrays).
    let rc = unsafe {
        (api.create_program)(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if rc != NVRTC_SUCCESS {
        return Err(CompileFailure::Nvrtc {
            during: "nvrtcCreateProgram",
            code: rc,
            name: api.error_name(rc),
            log: String::new(),
        });
    }
    let guard = ProgramGuard { api, prog };

    let deadline = timeout.map(|t| start + t);
    if let (Some(deadline), Some(set_cb)) = (deadline.as_ref(), api.set_flow_callback) {
        // SAFETY: the payload points at `deadline`, which lives on this stack frame until
        // after nvrtcCompileProgram returns; the callback only reads it.
        let rc = unsafe {
            set_cb(
                guard.prog,
                Some(cancel_after_deadline),
                deadline as *const Instant as *mut c_void,
            )
        };
        if rc != NVRTC_SUCCESS {
            tracing::debug!(
                code = rc,
                "nvrtcSetFlowCallback failed; compile timeout not enforced"
            );
        }
    }

    // SAFETY: prog is live; opt_ptrs holds `len` valid C strings kept alive by c_opts.
    let rc =
        unsafe { (api.compile_program)(guard.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(api, guard.prog);
    let timed_out = deadline.map(|d| Instant::now() >= d).unwrap_or(false);
    match rc {
        NVRTC_SUCCESS => {}
        NVRTC_ERROR_CANCELLED => {
            return Err(CompileFailure::TimedOut {
                limit_ms: timeout.map(|t| t.as_millis() as u64).unwrap_or(0),
                log,
            })
        }
        NVRTC_ERROR_COMPILATION => return Err(CompileFailure::Rejected { log }),
        code => {
            return Err(CompileFailure::Nvrtc {
                during: "nvrtcCompileProgram",
                code,
                name: api.error_name(code),
                log,
            })
        }
    }
    if timed_out {
        // NVRTC without flow callbacks finished anyway; honour the budget after the fact.
        return Err(CompileFailure::TimedOut {
            limit_ms: timeout.map(|t| t.as_millis() as u64).unwrap_or(0),
            log,
        });
    }

    let mut size = 0usize;
    // SAFETY: prog compiled successfully; size is a valid out pointer.
    let rc = unsafe { (api.get_cubin_size)(guard.prog, &mut size) };
    if rc != NVRTC_SUCCESS {
        return Err(CompileFailure::Nvrtc {
            during: "nvrtcGetCUBINSize",
            code: rc,
            name: api.error_name(rc),
            log,
        });
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: cubin has exactly the `size` bytes NVRTC reported.
    let rc = unsafe { (api.get_cubin)(guard.prog, cubin.as_mut_ptr() as *mut c_char) };
    if rc != NVRTC_SUCCESS {
        return Err(CompileFailure::Nvrtc {
            during: "nvrtcGetCUBIN",
            code: rc,
            name: api.error_name(rc),
            log,
        });
    }
    drop(guard);
    Ok(Compiled {
        cubin,
        log,
        ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC is part of the project's setup (`bash scripts/setup.sh`): these tests never
    /// skip, so a missing toolchain fails loudly with the search report.
    fn toolchain() -> Toolchain {
        match locate() {
            Ok(tc) => tc,
            Err(e) => panic!(
                "NVRTC is required for these tests (CI={:?}): {e}",
                std::env::var("CI").ok()
            ),
        }
    }

    const FP16_KERNEL: &str = r#"
#include <cuda_fp16.h>
extern "C" __global__ void axpy_half(__half* y, const __half* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = __float2half(a * __half2float(x[i]) + __half2float(y[i]));
    }
#ifdef OPTD_COUNT_CTAS
    static_assert(OPTD_COUNT_CTAS == 1, "define value passed");
#endif
}
"#;

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

    #[test]
    fn compiles_fp16_kernel_for_each_arch() {
        let tc = toolchain();
        for arch in ["sm_80", "sm_89", "sm_90"] {
            let c = compile(&tc, FP16_KERNEL, "axpy.cu", arch, &[])
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(!c.cubin.is_empty(), "{arch}: empty cubin");
            assert_eq!(&c.cubin[..4], b"\x7fELF", "{arch}: not an ELF image");
            assert!(c.ms > 0.0);
        }
    }

    /// sm_90a (wgmma, setmaxnreg) is a target of its own: the same source is rejected
    /// for plain sm_90 and gives a cubin for sm_90a.
    #[test]
    fn arch_specific_target_compiles_sm90a_only_instructions() {
        let tc = toolchain();
        let src = r#"
extern "C" __global__ void __launch_bounds__(128) probe(int* out) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "not compiled for sm_90a"
#endif
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    if (threadIdx.x == 0) *out = 1;
}
"#;
        let c = compile(&tc, src, "probe.cu", "sm_90a", &[]).unwrap_or_else(|e| panic!("sm_90a: {e}"));
        assert_eq!(&c.cubin[..4], b"\x7fELF", "sm_90a: not an ELF image");
        match compile(&tc, src, "probe.cu", "sm_90", &[]) {
            Err(CompileFailure::Rejected { log }) => assert!(log.contains("sm_90a"), "{log}"),
            other => panic!("sm_90 must reject sm_90a-only code: {other:?}"),
        }
    }

    #[test]
    fn defines_reach_the_preprocessor() {
        let tc = toolchain();
        let ok = compile(
            &tc,
            FP16_KERNEL,
            "axpy.cu",
            "sm_90",
            &[("OPTD_COUNT_CTAS", "1".into())],
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
        let bad = compile(
            &tc,
            FP16_KERNEL,
            "axpy.cu",
            "sm_90",
            &[("OPTD_COUNT_CTAS", "2".into())],
        );
        match bad {
            Err(CompileFailure::Rejected { log }) => {
                assert!(log.contains("define value passed"), "{log}")
            }
            other => panic!("expected rejection, got {other:?}"),
        }
    }

    #[test]
    fn syntax_error_log_names_the_line_as_plain_text() {
        let tc = toolchain();
        let src = "extern \"C\" __global__ void k(int* p) {\n  int x = 1\n  p[0] = x;\n}\n";
        match compile(&tc, src, "broken.cu", "sm_90", &[]) {
            Err(CompileFailure::Rejected { log }) => {
                assert!(
                    log.contains("broken.cu(3)") || log.contains("broken.cu(2)"),
                    "{log}"
                );
                assert!(log.contains("error"), "{log}");
                // Plain text: real newlines/quotes, no Debug escaping.
                assert!(!log.contains("\\n") && !log.contains("\\\""), "{log}");
            }
            other => panic!("expected rejection, got {other:?}"),
        }
    }

    #[test]
    fn bad_inputs_are_reported_as_such() {
        let tc = toolchain();
        let e = compile(&tc, FP16_KERNEL, "a.cu", "compute_90", &[]).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
        let e = compile(&tc, "int x;\0", "a.cu", "sm_90", &[]).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
        let e = compile(&tc, FP16_KERNEL, "a.cu", "sm_90", &[("A B", String::new())]).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
    }

    #[test]
    fn exhausted_budget_cancels() {
        let tc = toolchain();
        let e = compile_with_timeout(&tc, FP16_KERNEL, "a.cu", "sm_90", &[], Some(Duration::ZERO))
            .unwrap_err();
        assert!(matches!(e, CompileFailure::TimedOut { .. }), "{e}");
        let ok = compile_with_timeout(
            &tc,
            FP16_KERNEL,
            "a.cu",
            "sm_90",
            &[],
            Some(Duration::from_secs(120)),
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
    }
}
