//! Interpreters exiting while control requests arrive: no hang, no crash,
//! no output (hazard 34, the exit gate in shim/src/python/gate.rs).

mod python_support;

use memshim_tests::python;
use std::io::Write;

#[test]
fn two_hundred_interpreters_exit_cleanly_under_request_fire() {
    let answered = python_support::exit_rounds(&python(), "exit", 200);
    let _ = writeln!(
        std::io::stderr(),
        "200 exits under fire: {answered} requests answered with a result"
    );
    assert!(
        answered > 0,
        "no request was ever answered: the fire was not live"
    );
}
