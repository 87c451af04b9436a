//! Reliability suite (docs/reliability.md): compatibility with other
//! people's test suites, stress, fork storms, hostile lifecycles, hostile
//! input and bad configuration.
//!
//! Every test has a smoke form, run by `make test`, and a full form marked
//! `#[ignore]`, run by `make stress` (`MEMSHIM_STRESS=full ... --ignored`).
//! `MEMSHIM_STRESS_SEED` replays a seed printed by a failure;
//! `MEMSHIM_STRESS_SECS` overrides the duration of the timed tests.
//! Figures of each run go to `target/test-scratch/reliability-<level>.txt`.

mod access;
mod alloc;
mod config;
mod cpython;
mod forks;
mod fuzz;
mod global_preload;
mod lifecycles;

use memshim_tests::stress::Level;

macro_rules! smoke_and_full {
    ($($smoke:ident, $full:ident => $f:path;)*) => {$(
        #[test]
        fn $smoke() {
            $f(Level::smoke())
        }
        #[test]
        #[ignore = "long: run by `make stress`"]
        fn $full() {
            $f(Level::Full)
        }
    )*};
}

smoke_and_full! {
    cpython_regression_tests_have_no_new_failures_under_the_shim,
        full_cpython_regression_tests_have_no_new_failures_under_the_shim => cpython::run;
    every_bad_memshim_variable_gives_one_warning_and_changes_nothing_else,
        full_every_bad_memshim_variable_gives_one_warning_and_changes_nothing_else => config::run;
    threads_allocating_under_control_requests_never_corrupt_or_grow,
        full_threads_allocating_under_control_requests_never_corrupt_or_grow => alloc::run;
    multiprocessing_storms_under_purges_give_right_results_and_inherit_nothing,
        full_multiprocessing_storms_under_purges_give_right_results_and_inherit_nothing => forks::multiprocessing;
    spawn_and_fork_loops_under_purges_give_right_results_and_inherit_nothing,
        full_spawn_and_fork_loops_under_purges_give_right_results_and_inherit_nothing => forks::spawn_loop;
    a_process_whose_main_thread_exits_first_ends_with_its_last_thread,
        full_a_process_whose_main_thread_exits_first_ends_with_its_last_thread => lifecycles::main_thread_exits_first;
    signal_storms_never_run_the_apps_handler_on_the_shims_thread,
        full_signal_storms_never_run_the_apps_handler_on_the_shims_thread => lifecycles::signal_storm;
    a_daemon_that_closes_every_fd_keeps_its_connections_and_the_endpoint_heals,
        full_a_daemon_that_closes_every_fd_keeps_its_connections_and_the_endpoint_heals => lifecycles::fd_closing_daemon;
    exec_chains_bash_python_c_behave_as_without_the_shim,
        full_exec_chains_bash_python_c_behave_as_without_the_shim => lifecycles::exec_chain;
    kill_9_during_a_purge_leaves_clients_unblocked_and_a_refusing_stale_socket,
        full_kill_9_during_a_purge_leaves_clients_unblocked_and_a_refusing_stale_socket => lifecycles::kill_9_during_purge;
    the_protocol_decoder_rejects_hostile_lines_cleanly,
        full_the_protocol_decoder_rejects_hostile_lines_cleanly => fuzz::decoder;
    a_hostile_socket_client_leaves_the_host_alive_bounded_and_answering,
        full_a_hostile_socket_client_leaves_the_host_alive_bounded_and_answering => fuzz::live_socket;
    a_globally_preloaded_shell_runs_apt_pip_make_git_tar_sort_find_unchanged,
        full_a_globally_preloaded_shell_runs_apt_pip_make_git_tar_sort_find_unchanged => global_preload::run;
    another_uid_cannot_plant_or_reach_the_socket_directory,
        full_another_uid_cannot_plant_or_reach_the_socket_directory => access::run;
}
