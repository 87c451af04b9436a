//! The Python bridge on real CPythons: every version, the main thread's
//! states, release and gc, hostile hosts, interpreter lifecycles, the CUDA
//! paths and idle return with a stand-in torch, real PyTorch, and Python
//! functions in heap profiles (`-X perf`). One test
//! binary; the modules were separate binaries before (`python_<module>`).
//! `make test-torch` runs the one test that needs the default python3's
//! torch (`torch::`, ignored otherwise).

mod attach;
mod cuda_idle;
mod cuda_paths;
mod hostile;
mod lifecycle;
mod profile;
mod reach;
mod release;
mod sampling;
mod torch;
mod versions;
mod without_preload;
mod without_preload_figures;
