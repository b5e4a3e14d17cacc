//! Validating a request's shapes and plans before anything touches the GPU: no zero
//! dimension, sizes that fit the kernel ABI's i32 arguments, at least one launch, no empty
//! grid or block, and tensor maps whose geometry the TMA can encode.

use crate::spec::protocol::{Shape, ShapePlan, ViewStrides};

pub(super) fn validate_shape(s: &Shape) -> Result<(), String> {
    if [s.b, s.hq, s.hkv, s.sq, s.sk, s.d].contains(&0) {
        return Err(format!("shape {} has a zero dimension", s.key()));
    }
    if !s.hq.is_multiple_of(s.hkv) || s.sq > s.sk {
        return Err(format!("shape {} needs HQ a multiple of HKV and SQ <= SK", s.key()));
    }
    if [s.b, s.hq, s.hkv, s.sq, s.sk].iter().any(|&x| i32::try_from(x).is_err()) {
        return Err(format!(
            "shape {} does not fit the i32 kernel arguments",
            s.key()
        ));
    }
    Ok(())
}

pub(super) fn validate_plan(p: &ShapePlan) -> Result<(), String> {
    validate_shape(&p.shape)?;
    if p.launches.is_empty() {
        return Err(format!("plan for {} has no launches", p.shape.key()));
    }
    if i32::try_from(p.n_splits).is_err() {
        return Err(format!(
            "plan for {}: n_splits {} does not fit i32",
            p.shape.key(),
            p.n_splits
        ));
    }
    for (i, m) in p.tensor_maps.iter().enumerate() {
        // The check launches on contiguous and padded views; timing on contiguous.
        let views = [ViewStrides::contiguous(&p.shape), ViewStrides::padded(&p.shape)];
        views.iter().try_for_each(|v| m.geometry(&p.shape, v).map(|_| ())).map_err(|why| {
            format!("plan for {}: tensor_map[{i}] ({}): {why}", p.shape.key(), m.tensor.as_str())
        })?;
    }
    for (i, l) in p.launches.iter().enumerate() {
        if l.grid.contains(&0) || l.block.contains(&0) {
            return Err(format!(
                "plan for {}: launch {i} ({}) has an empty grid {:?} or block {:?}",
                p.shape.key(),
                l.kernel,
                l.grid,
                l.block
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{Launch, TensorMap, TensorName};

    #[test]
    fn plans_are_validated() {
        let shape = Shape::mha(1, 1, 64, 64, false, crate::spec::protocol::DType::Fp16);
        let launch = Launch {
            kernel: "k".into(),
            grid: [1, 1, 1],
            block: [128, 1, 1],
            dyn_smem: 0,
        };
        let ok = ShapePlan {
            shape,
            n_splits: 1,
            launches: vec![launch.clone()],
            tensor_maps: vec![],
        };
        assert!(validate_plan(&ok).is_ok());
        let mut bad = ok.clone();
        bad.launches[0].grid = [0, 1, 1];
        assert!(validate_plan(&bad).is_err());
        let mut bad = ok.clone();
        bad.launches.clear();
        assert!(validate_plan(&bad).is_err());
        let mut bad = ok.clone();
        bad.shape.d = 0;
        assert!(validate_plan(&bad).is_err());
        // Tensor maps: validated with the same geometry the daemon's gate used.
        let mut maps = ok;
        maps.tensor_maps = vec![TensorMap { tensor: TensorName::K, box_rows: 64, swizzle: 128, box_panels: None }];
        assert!(validate_plan(&maps).is_ok());
        maps.tensor_maps[0].box_rows = 300;
        let err = validate_plan(&maps).unwrap_err();
        assert!(err.contains("tensor_map[0] (k)") && err.contains("box_rows = 300"), "{err}");
    }
}
