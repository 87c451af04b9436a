//! Link flags for libmemshim.so.
//!
//! * `--wrap=secure_getenv`: jemalloc reads its configuration with
//!   `secure_getenv("_RJEM_MALLOC_CONF")` exactly once, inside its own
//!   initialisation, on the first allocation of the process. Wrapping that one
//!   call is how `MEMSHIM_*`, `MALLOC_CONF` and `MEMSHIM_MALLOC_CONF` reach
//!   jemalloc before `main` without adding anything to the allocation path
//!   (see `src/options.rs`).
//! * `-z nodelete`: if someone `dlopen`s the library and later `dlclose`s it,
//!   the atfork handlers and the exported symbols must stay mapped.
//! * `-z now`: resolve everything at load time, so no lazy PLT resolution
//!   (which can allocate) ever runs inside `malloc`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=secure_getenv");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmemshim.so");
}
