//! The privileged end-to-end tests, one test binary: each file beside this one is a module of it (`answers`,
//! `ha`, `debian_kernel`, ...), and a test's name starts with its file's
//! (`ha::exactly_one_leader_and_offers_only_from_its_dnsmasq`; `cargo nextest run -E 'binary(end_to_end) &
//! test(/^ha::/)'` runs one file). One binary rather than a binary per file: each binary compiled the generic code
//! of the whole stack (tokio, tonic, the control plane, the agent) and linked it again, 23 times over, and the fresh
//! roots of scripts/fresh-root.sh compile and link every test binary again as well (a rebuild of this package's
//! tests: 51 CPU-seconds as 23 binaries, 33 as one). nextest still runs every test in a process of its own.
mod answers;
mod dataplane;
mod debian_kernel;
mod drift;
mod egress;
mod explain;
mod faults;
mod filter_service;
mod filter_store;
mod grpc_tls;
mod ha;
mod hooks;
mod hostile_client;
mod hostsdir;
mod inspection;
mod ipset;
mod ironic_contract;
mod ironic_ha;
mod packaging;
mod real_ironic;
mod real_ironic_processing;
mod wedged;
mod work_queue;
