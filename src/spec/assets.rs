//! Templates and strategy plans: read from disk, or from copies embedded in the binary.
//!
//! Embedding lets `optimizerd start` run from a bare binary. A folder that exists on
//! disk always wins, so editing `kernel-templates/` or `strategies/` takes effect
//! without a rebuild; a file missing from an existing folder is an error, not a
//! silent fallback.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} does not exist, and no embedded copy of `{file}` exists either (embedded: {known})")]
    Missing { path: PathBuf, file: String, known: String },
}

macro_rules! embed {
    ($($name:literal => $path:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../", $path)))),*]
    };
}

/// Files under `kernel-templates/` and `strategies/`, by path relative to their folder.
static EMBEDDED: &[(&str, &str)] = embed! {
    "common/optd.cuh" => "kernel-templates/common/optd.cuh",
    "common/async_copy.cuh" => "kernel-templates/common/async_copy.cuh",
    "common/split_combine.cuh" => "kernel-templates/common/split_combine.cuh",
    "common/quad_softmax.cuh" => "kernel-templates/common/quad_softmax.cuh",
    "common/online_softmax.cuh" => "kernel-templates/common/online_softmax.cuh",
    "common/mask.cuh" => "kernel-templates/common/mask.cuh",
    "common/tile_scheduler.cuh" => "kernel-templates/common/tile_scheduler.cuh",
    "common/hopper.cuh" => "kernel-templates/common/hopper.cuh",
    "common/wgmma_ops.cuh" => "kernel-templates/common/wgmma_ops.cuh",
    "common/decode_split.cuh" => "kernel-templates/common/decode_split.cuh",
    "common/cluster.cuh" => "kernel-templates/common/cluster.cuh",
    "baseline.cu" => "kernel-templates/baseline.cu",
    "kv_split.cu" => "kernel-templates/kv_split.cu",
    "memory.cu" => "kernel-templates/memory.cu",
    "mma_fa2.cu" => "kernel-templates/mma_fa2.cu",
    "wmma.cu" => "kernel-templates/wmma.cu",
    "wgmma_tma.cu" => "kernel-templates/wgmma_tma.cu",
    "decode.cu" => "kernel-templates/decode.cu",
    "decode_cluster.cu" => "kernel-templates/decode_cluster.cu",
    "decode_wgmma.cu" => "kernel-templates/decode_wgmma.cu",
    "testing/oob_write.cu" => "kernel-templates/testing/oob_write.cu",
    "testing/infinite_loop.cu" => "kernel-templates/testing/infinite_loop.cu",
    "testing/contiguous_rows.cu" => "kernel-templates/testing/contiguous_rows.cu",
    "testing/tensor_map_probe.cu" => "kernel-templates/testing/tensor_map_probe.cu",
    "default.toml" => "strategies/default.toml",
    "fault-drill.toml" => "strategies/fault-drill.toml",
};

/// Read `file` under `dir`; if `dir` does not exist at all, use the embedded copy.
pub fn read(dir: &Path, file: &str) -> Result<String, AssetError> {
    let path = dir.join(file);
    if dir.is_dir() {
        return std::fs::read_to_string(&path).map_err(|source| AssetError::Read { path, source });
    }
    EMBEDDED
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, text)| text.to_string())
        .ok_or_else(|| AssetError::Missing {
            path,
            file: file.to_string(),
            known: EMBEDDED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
        })
}
