//! The control endpoint and memshim-ctl: processes, descriptors,
//! namespaces, purges, hostile clients, access control, the CLI's errors,
//! `record`'s timeline, `profile`'s heap profiles and the files it reads, and the protocol document's client. One test binary; the modules were
//! separate binaries before (`control_<module>`).

mod cli_errors;
mod descriptors;
mod doc;
mod namespace;
mod process;
mod profile;
mod profile_files;
mod purge;
mod record;
mod robustness;
mod security;
