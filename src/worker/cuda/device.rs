//! What the device can do: its description for `Hello` (name, compute capability, SMs,
//! shared memory, L2, driver) and the occupancy of a kernel configuration.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaFunction, DriverError};

use super::kernels::Build;
use crate::nvrtc::Toolchain;
use crate::spec::protocol::{DeviceInfo, OccupancyQuery};

/// Blocks per SM for one occupancy query; 0 when the configuration cannot launch at all.
pub(super) fn occupancy_of(
    build: &mut Build,
    f: &CudaFunction,
    q: &OccupancyQuery,
) -> Result<u32, DriverError> {
    let invalid = |e: &DriverError| e.0 == sys::CUresult::CUDA_ERROR_INVALID_VALUE;
    match build.allow_smem(&q.kernel, f, q.dyn_smem) {
        Ok(()) => {}
        // More dynamic shared memory than the device allows: it cannot run.
        Err(e) if invalid(&e) => return Ok(0),
        Err(e) => return Err(e),
    }
    match f.occupancy_max_active_blocks_per_multiprocessor(
        q.block_threads,
        q.dyn_smem as usize,
        None,
    ) {
        Ok(n) => Ok(n),
        Err(e) if invalid(&e) => Ok(0),
        Err(e) => Err(e),
    }
}

/// The device behind `ctx`, with the NVRTC version of `tc`.
pub(super) fn device_info(ctx: &Arc<CudaContext>, tc: &Toolchain) -> Result<DeviceInfo, DriverError> {
    let attr = |a: CUdevice_attribute| ctx.attribute(a).map(|v| v.max(0) as u32);
    let (major, minor) = ctx.compute_capability()?;
    let mut driver_version = 0i32;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result()?;
    Ok(DeviceInfo {
        name: ctx.name()?,
        cc_major: major.max(0) as u32,
        cc_minor: minor.max(0) as u32,
        sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        smem_optin: attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?,
        smem_per_sm: attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )?,
        l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
        max_threads_per_sm: attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
        )?,
        driver_version,
        nvrtc_version: tc.version,
        arch: format!("sm_{major}{minor}"),
    })
}
