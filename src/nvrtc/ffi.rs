//! The NVRTC C API as this crate calls it: result codes, the entry points resolved with
//! `dlopen`/`dlsym` from a library loaded by absolute path (once per path, never closed),
//! and the program's lifetime, log and cancellation callback.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::error::NvrtcError;

/// NVRTC's result codes that this module treats specially (see `nvrtc.h`).
pub(super) const NVRTC_SUCCESS: c_int = 0;
pub(super) const NVRTC_ERROR_INVALID_OPTION: c_int = 5;
pub(super) const NVRTC_ERROR_COMPILATION: c_int = 6;
pub(super) const NVRTC_ERROR_INTERNAL_ERROR: c_int = 11;
pub(super) const NVRTC_ERROR_CANCELLED: c_int = 16;

pub(super) type Program = *mut c_void;
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

pub(super) struct Api {
    pub(super) version: VersionFn,
    get_error_string: ErrorStringFn,
    pub(super) create_program: CreateProgramFn,
    pub(super) compile_program: CompileProgramFn,
    destroy_program: DestroyProgramFn,
    pub(super) get_cubin_size: SizeFn,
    pub(super) get_cubin: BytesFn,
    get_log_size: SizeFn,
    get_log: BytesFn,
    /// `nvrtcSetFlowCallback` (NVRTC >= 12.x), used to cancel over-long compiles.
    pub(super) set_flow_callback: Option<SetFlowCallbackFn>,
}

impl Api {
    pub(super) fn error_name(&self, code: c_int) -> String {
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

/// The dynamic loader's message for the last failed `dlopen`/`dlsym`.
pub(super) fn dl_error() -> String {
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
pub(super) fn api_for(lib: &Path) -> Result<&'static Api, NvrtcError> {
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

/// Destroys the program on every exit path.
pub(super) struct ProgramGuard<'a> {
    pub(super) api: &'a Api,
    pub(super) prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: prog was created by nvrtcCreateProgram and is destroyed exactly once here.
        unsafe { (self.api.destroy_program)(&mut self.prog) };
    }
}

/// NVRTC's flow callback: asks to cancel once the deadline in `payload` has passed.
pub(super) extern "C" fn cancel_after_deadline(payload: *mut c_void, _reserved: *mut c_void) -> c_int {
    // SAFETY: payload is the &Instant passed to nvrtcSetFlowCallback; it outlives the
    // nvrtcCompileProgram call during which NVRTC invokes this callback. Reading an Instant
    // is thread-safe, and once past the deadline we keep answering 1 as NVRTC requires.
    let deadline = unsafe { &*(payload as *const Instant) };
    c_int::from(Instant::now() >= *deadline)
}

/// The program's log as plain text (empty when NVRTC has none or cannot give it).
pub(super) fn program_log(api: &Api, prog: Program) -> String {
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
