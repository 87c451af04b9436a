//! Tests that must not run beside the tests of other modules. A family's
//! tests run two at a time in one process (`--test-threads=2`), its
//! modules' tests mixed; most share the machine well. A few do not: they
//! load the whole machine (a fork storm, memory cgroups filled to their
//! limit, several interpreters at once, a real model), or they hold the
//! process under test to a bound of time that such a load would break on
//! a machine of two CPUs. Each of those holds [`exclusive`] for its whole
//! run, which keeps it from every such test of another module, as when
//! each module was a test binary of its own: then two tests of one file
//! could run together, tests of two files never did. The family's other
//! tests go on beside it.

use std::sync::{Condvar, Mutex};

/// The module whose exclusive tests run now, and how many of them.
static HELD: Mutex<(&str, usize)> = Mutex::new(("", 0));
static RELEASED: Condvar = Condvar::new();

/// Held until dropped; see [`exclusive`].
pub struct Exclusive(());

/// Waits until no exclusive test of another module runs, then keeps them
/// out until the guard drops. First thing in the test:
/// `let _machine = serial::exclusive(module_path!());`. A test that fails
/// holding it lets the others in as well.
pub fn exclusive(module: &'static str) -> Exclusive {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    while held.1 > 0 && held.0 != module {
        held = RELEASED.wait(held).unwrap_or_else(|e| e.into_inner());
    }
    *held = (module, held.1 + 1);
    Exclusive(())
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        held.1 -= 1;
        if held.1 == 0 {
            RELEASED.notify_all();
        }
    }
}
