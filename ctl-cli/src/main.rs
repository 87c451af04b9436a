//! memshim-ctl: finds shimmed processes and shows or releases their memory.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    eprintln!("memshim-ctl: no commands yet");
    std::process::ExitCode::from(2)
}
