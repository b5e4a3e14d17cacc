//! A loaded candidate's kernels: each build's module with the functions resolved from it
//! so far (and the dynamic shared memory each was allowed), and resolving a plan's launches
//! to functions ready to launch with an [`Abi`].

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUfunction_attribute};
use cudarc::driver::{CudaFunction, CudaModule, CudaStream, DriverError};

use super::abi::Abi;
use super::error::{api, Failure};
use crate::spec::protocol::{Launch, ShapePlan};

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_DYN_SMEM: u32 = 48 * 1024;

/// One loaded CUBIN and the functions resolved from it so far.
pub(super) struct Build {
    module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
    /// Dynamic smem limit already set per function (only set above 48 KiB).
    smem_set: HashMap<String, u32>,
}

impl Build {
    pub(super) fn new(module: Arc<CudaModule>) -> Self {
        Build {
            module,
            functions: HashMap::new(),
            smem_set: HashMap::new(),
        }
    }

    /// The named kernel, or `Ok(None)` when the module has no such function.
    pub(super) fn function(&mut self, name: &str) -> Result<Option<CudaFunction>, DriverError> {
        if let Some(f) = self.functions.get(name) {
            return Ok(Some(f.clone()));
        }
        if name.is_empty() || name.contains('\0') {
            return Ok(None);
        }
        match self.module.load_function(name) {
            Ok(f) => {
                self.functions.insert(name.to_string(), f.clone());
                Ok(Some(f))
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Raise the function's dynamic shared memory limit when `dyn_smem` needs opting in.
    pub(super) fn allow_smem(
        &mut self,
        name: &str,
        f: &CudaFunction,
        dyn_smem: u32,
    ) -> Result<(), DriverError> {
        if dyn_smem <= DEFAULT_DYN_SMEM || self.smem_set.get(name).is_some_and(|&s| s >= dyn_smem) {
            return Ok(());
        }
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(dyn_smem).unwrap_or(i32::MAX),
        )?;
        self.smem_set.insert(name.to_string(), dyn_smem);
        Ok(())
    }
}

/// A candidate: its one build, CTA counting compiled in (counting only when the launch's
/// counter is not null), checked and timed.
pub(super) struct Candidate {
    pub(super) build: Build,
}

/// A kernel resolved for a launch, with the launch it serves.
pub(super) struct Resolved<'a> {
    function: CudaFunction,
    pub(super) launch: &'a Launch,
}

/// Resolve every launch of `plan` in `build`, opting in to large shared memory as needed.
pub(super) fn resolve<'a>(
    build: &mut Build,
    plan: &'a ShapePlan,
    what: &str,
) -> Result<Vec<Resolved<'a>>, Failure> {
    let mut out = Vec::with_capacity(plan.launches.len());
    for (i, l) in plan.launches.iter().enumerate() {
        let f = api(build.function(&l.kernel), || {
            format!("{what}: resolving kernel {}", l.kernel)
        })?
        .ok_or_else(|| {
            Failure::Bad(format!(
                "{what}: launch {i} names kernel `{}`, which the loaded module does not define",
                l.kernel
            ))
        })?;
        api(build.allow_smem(&l.kernel, &f, l.dyn_smem), || {
            format!(
                "{what}: launch {i} ({}): allowing {} B of dynamic shared memory",
                l.kernel, l.dyn_smem
            )
        })?;
        out.push(Resolved {
            function: f,
            launch: l,
        });
    }
    Ok(out)
}

impl Resolved<'_> {
    /// Queue this launch on `stream` with `abi` and the CTA counter at `counter`.
    pub(super) fn function_launch(
        &self,
        abi: &Abi,
        counter: sys::CUdeviceptr,
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        abi.launch(&self.function, self.launch, counter, stream)
    }
}
