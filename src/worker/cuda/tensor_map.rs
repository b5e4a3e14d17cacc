//! Encoding a plan's tensor maps with `cuTensorMapEncodeTiled` against the device pointers
//! of the tensor set being launched, so TMA templates get their `CUtensorMap` parameters.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::error::{describe, Failure};
use crate::spec::protocol::{Shape, TensorMap, ViewStrides};

/// Encode tensor map `index` of a plan for `shape` viewed through `view`, over the tensor at `ptr`, with the
/// geometry of [`TensorMap::geometry`] and the convention's fixed settings (UINT16
/// bit patterns, no interleave, L2 promotion 128B, out-of-bounds rows read as zeros).
pub(super) fn encode_tensor_map(
    index: usize,
    map: &TensorMap,
    shape: &Shape,
    view: &ViewStrides,
    ptr: sys::CUdeviceptr,
) -> Result<sys::CUtensorMap, Failure> {
    let name = format!("tensor_map[{index}] ({})", map.tensor.as_str());
    let g = map
        .geometry(shape, view)
        .map_err(|why| Failure::Bad(format!("{name}: {why}")))?;
    if !ptr.is_multiple_of(16) {
        return Err(Failure::Bad(format!(
            "{name}: the tensor's address {ptr:#x} is not 16-byte aligned"
        )));
    }
    let swizzle = match map.swizzle {
        32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        other => {
            return Err(Failure::Bad(format!(
                "{name}: swizzle {other} bytes (allowed: 32, 64, 128)"
            )))
        }
    };
    let mut encoded = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: `encoded` is a writable, 128-byte-aligned CUtensorMap; the dims, strides,
    // box and element-stride arrays hold rank (5), rank - 1 (4), 5 and 5 entries as the
    // call requires; `ptr` is a live device allocation of the tensor laid out by `view`.
    let rc = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut encoded,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            crate::spec::protocol::TensorMapGeometry::RANK,
            ptr as *mut c_void,
            g.dims.as_ptr(),
            g.strides_bytes.as_ptr(),
            g.box_dims.as_ptr(),
            g.element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    rc.result().map_err(|e| Failure::Cuda {
        during: format!(
            "encoding {name}: dims {:?}, strides {:?} B, box {:?}, swizzle {} B",
            g.dims, g.strides_bytes, g.box_dims, map.swizzle
        ),
        message: describe(e),
        // Encoding is a host-side call: nothing ran, the context is intact.
        sticky: false,
    })?;
    Ok(encoded)
}
