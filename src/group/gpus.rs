//! The host's GPUs: listed by the worker (`optimizerd worker --list-devices`, so tests list
//! a scripted host's), chosen by `--gpus`, and refused when they are not one model.

use std::path::Path;
use std::time::Duration;

use crate::spec::protocol::DeviceInfo;
use crate::storage::ledger::GpuSlot;

/// Which GPUs a group uses: `all` visible GPUs, or a list of indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelection {
    All,
    Indices(Vec<u32>),
}

impl std::fmt::Display for GpuSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuSelection::All => f.write_str("all"),
            GpuSelection::Indices(v) => f.write_str(&v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
        }
    }
}

pub fn parse_gpus(s: &str) -> Result<GpuSelection, String> {
    let help = "write `all` or GPU indices separated by commas, e.g. 0,1 (`nvidia-smi -L` lists them)";
    let s = s.trim();
    if s.eq_ignore_ascii_case("all") {
        return Ok(GpuSelection::All);
    }
    let mut out: Vec<u32> = Vec::new();
    for part in s.split(',') {
        let i = part.trim().parse::<u32>().map_err(|_| format!("`{}` is not a GPU index; {help}", part.trim()))?;
        if out.contains(&i) {
            return Err(format!("GPU {i} is listed twice; {help}"));
        }
        out.push(i);
    }
    Ok(GpuSelection::Indices(out))
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("cannot list the GPUs: {0}; `optimizerd doctor` checks the driver and NVRTC")]
    List(String),
    #[error("no GPU is visible to this process (CUDA_VISIBLE_DEVICES={0}); `nvidia-smi -L` lists the host's GPUs")]
    NoneVisible(String),
    #[error("GPU {index} is not among the {count} visible GPUs (0 to {last}); `nvidia-smi -L` lists them, or pass --gpus all")]
    NotVisible { index: u32, count: usize, last: usize },
    #[error("the GPUs are not one model: {list}. Results differ by model and a group compares its runs; start one group per model, e.g. --gpus {first_model}")]
    Mixed { list: String, first_model: String },
}

/// The visible GPUs, in ordinal order, as the worker describes them.
pub async fn list_devices(worker_script: Option<&Path>, timeout: Duration) -> Result<Vec<DeviceInfo>, GpuError> {
    let exe = std::env::current_exe().map_err(|e| GpuError::List(format!("cannot find this executable: {e}")))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("worker");
    if let Some(s) = worker_script {
        cmd.arg("--script").arg(s);
    }
    cmd.arg("--list-devices").stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| GpuError::List(format!("the worker did not answer within {}", humantime::format_duration(timeout))))?
        .map_err(|e| GpuError::List(format!("cannot start the worker: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").trim();
        return Err(GpuError::List(format!("the worker exited with {}: {last}", out.status)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let devices: Vec<DeviceInfo> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| GpuError::List(format!("unreadable device list: {e}")))?;
    if devices.is_empty() {
        return Err(GpuError::NoneVisible(std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())));
    }
    Ok(devices)
}

/// The GPUs `--gpus` names, checked: each visible, all one model (name and compute capability).
pub fn select(selection: &GpuSelection, devices: &[DeviceInfo]) -> Result<Vec<GpuSlot>, GpuError> {
    let indices: Vec<u32> = match selection {
        GpuSelection::All => (0..devices.len() as u32).collect(),
        GpuSelection::Indices(v) => v.clone(),
    };
    let mut slots = Vec::new();
    for index in indices {
        let device = devices
            .get(index as usize)
            .ok_or(GpuError::NotVisible { index, count: devices.len(), last: devices.len().saturating_sub(1) })?;
        slots.push(GpuSlot { index, device: device.clone() });
    }
    if let Some(first) = slots.first() {
        if slots.iter().any(|s| s.device.name != first.device.name || s.device.cc() != first.device.cc()) {
            let list: Vec<String> = slots.iter().map(|s| format!("{} = {} (sm_{})", s.index, s.device.name, s.device.cc())).collect();
            let same: Vec<String> = slots.iter().filter(|s| s.device.name == first.device.name).map(|s| s.index.to_string()).collect();
            return Err(GpuError::Mixed { list: list.join(", "), first_model: same.join(",") });
        }
    }
    Ok(slots)
}

/// What `CUDA_VISIBLE_DEVICES` a daemon on host GPU `index` gets: the index itself, or,
/// when this process already sees a subset (`CUDA_VISIBLE_DEVICES=2,3`), that entry of it.
pub fn visible_id(index: u32, inherited: Option<&str>) -> String {
    match inherited.map(str::trim).filter(|v| !v.is_empty()) {
        Some(list) => list.split(',').nth(index as usize).map(|s| s.trim().to_string()).unwrap_or_else(|| index.to_string()),
        None => index.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, cc: (u32, u32)) -> DeviceInfo {
        let mut d = crate::test_fixtures::h100();
        d.name = name.into();
        (d.cc_major, d.cc_minor) = cc;
        d
    }

    #[test]
    fn all_takes_every_visible_gpu_and_a_list_takes_those_named() {
        let devs = vec![gpu("H100", (9, 0)), gpu("H100", (9, 0)), gpu("H100", (9, 0))];
        let idx = |s: Vec<GpuSlot>| s.iter().map(|g| g.index).collect::<Vec<_>>();
        assert_eq!(idx(select(&GpuSelection::All, &devs).unwrap()), [0, 1, 2]);
        assert_eq!(idx(select(&GpuSelection::Indices(vec![2, 0]), &devs).unwrap()), [2, 0]);
        let e = select(&GpuSelection::Indices(vec![3]), &devs).unwrap_err();
        assert_eq!(e.to_string(), "GPU 3 is not among the 3 visible GPUs (0 to 2); `nvidia-smi -L` lists them, or pass --gpus all");
    }

    #[test]
    fn two_models_are_refused_with_the_gpus_of_one_named() {
        let devs = vec![gpu("H100", (9, 0)), gpu("L4", (8, 9)), gpu("H100", (9, 0))];
        let e = select(&GpuSelection::All, &devs).unwrap_err().to_string();
        assert!(e.contains("0 = H100 (sm_90), 1 = L4 (sm_89), 2 = H100 (sm_90)"), "{e}");
        assert!(e.ends_with("--gpus 0,2"), "{e}");
        assert!(select(&GpuSelection::Indices(vec![0, 2]), &devs).is_ok());
    }

    #[test]
    fn a_subset_already_visible_maps_indices_onto_it() {
        assert_eq!(visible_id(1, None), "1");
        assert_eq!(visible_id(1, Some("4,6")), "6");
        assert_eq!(visible_id(0, Some(" ")), "0");
    }
}
