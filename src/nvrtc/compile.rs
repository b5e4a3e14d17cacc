//! Compiling one CUDA C++ source to a CUBIN with NVRTC: the options (architecture, C++17,
//! headers, line info, defines), a soft time budget enforced by cancelling, and the result
//! or the reason there is none, with NVRTC's log kept as plain text.

use std::ffi::{c_char, c_int, c_void, CString};
use std::time::{Duration, Instant};

use super::error::NvrtcError;
use super::ffi::{
    api_for, cancel_after_deadline, program_log, Program, ProgramGuard, NVRTC_ERROR_CANCELLED,
    NVRTC_ERROR_COMPILATION, NVRTC_ERROR_INTERNAL_ERROR, NVRTC_ERROR_INVALID_OPTION,
    NVRTC_SUCCESS,
};
use super::locate::Toolchain;

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
    use crate::nvrtc::locate::tests::toolchain;

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
