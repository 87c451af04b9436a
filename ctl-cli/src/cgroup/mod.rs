//! The memory cgroup of a process: where it is and what the kernel
//! charges it (fs.rs), that charge attributed to processes, allocators and
//! Python (charge.rs), and the `/dev/shm` files its processes see (shm.rs).

pub mod charge;
pub mod fs;
pub mod shm;
