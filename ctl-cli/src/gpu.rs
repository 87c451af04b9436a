//! VRAM as the driver sees it, beside PyTorch's own figures: for each
//! device where a process's torch has a CUDA context, what NVML says the
//! process uses there (`memshim-nvml`), what the caching allocator has
//! reserved, and the difference, which is the CUDA context itself (about
//! 250-500 MiB per device: kernels, the driver's own state) plus what
//! libraries allocate outside PyTorch's allocator (cuBLAS/cuDNN handles,
//! NCCL buffers). Only `release` can lower the reserved part; the rest
//! goes when the process ends. docs/stats.md defines the figures.

use memshim_proto::TorchSection;
use serde::Serialize;

/// One device of one process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVram {
    /// torch's device index.
    pub index: u32,
    /// `GPU-...`, if torch reported it.
    pub uuid: Option<String>,
    /// Bytes the driver says the process uses on the device (NVML); `None`
    /// without NVML, or if the driver does not list the process.
    pub driver_used: Option<u64>,
    /// The caching allocator's reserved bytes (torch).
    pub torch_reserved: u64,
    /// `driver_used - torch_reserved`: the CUDA context and memory that
    /// libraries allocate outside PyTorch's allocator.
    pub context_and_other: Option<u64>,
    /// The device's memory in total (NVML).
    pub total: Option<u64>,
}

/// The VRAM report of process `pid` (as this CLI sees it) whose torch
/// section is `t`, and why the driver's figures are missing, if they are.
/// Empty when torch has no device with a context: NVML is then not loaded.
pub fn vram(pid: i32, t: &TorchSection) -> (Vec<DeviceVram>, Option<String>) {
    if t.devices.is_empty() {
        return (Vec::new(), None);
    }
    let (nvml, why) = match memshim_nvml::process_vram(pid as u32) {
        Ok(v) => (v, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let mut missing = false;
    let out = t
        .devices
        .iter()
        .map(|d| {
            let seen = d
                .uuid
                .as_deref()
                .and_then(|u| nvml.iter().find(|g| g.uuid == u));
            missing |= seen.is_none();
            let driver_used = seen.and_then(|g| g.used);
            DeviceVram {
                index: d.index,
                uuid: d.uuid.clone(),
                driver_used,
                torch_reserved: d.reserved,
                context_and_other: driver_used.map(|u| u.saturating_sub(d.reserved)),
                total: seen.map(|g| g.total),
            }
        })
        .collect();
    let why = why.or_else(|| {
        missing.then(|| {
            "the driver does not list this pid on every device (a pid namespace of its own? \
             run memshim-ctl on the host)"
                .to_owned()
        })
    });
    (out, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memshim_proto::TorchDevice;

    #[test]
    fn no_device_no_nvml() {
        let t = TorchSection::default();
        assert_eq!(vram(1, &t), (vec![], None));
    }

    #[test]
    fn a_device_without_driver_figures_says_why() {
        let t = TorchSection {
            cuda_initialized: true,
            devices: vec![TorchDevice {
                index: 0,
                reserved: 1 << 30,
                uuid: Some("GPU-x".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (v, why) = vram(std::process::id() as i32, &t);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].torch_reserved, 1 << 30);
        assert_eq!(v[0].driver_used, None);
        assert!(why.is_some());
    }
}
