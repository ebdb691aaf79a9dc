//! Several real Ironic 39 conductors sharing one MariaDB over JSON-RPC: the production shape (Metal3's HA mode,
//! kolla) that ironguard's HA PXE filter serves.
//!
//! [`IronicConductors::start`] starts a private [`MariaDb`] (its files under the test's directory), creates Ironic's
//! schema once, then one [`RealIronic`] conductor (API and conductor in one process) per given namespace and address,
//! all at once (each takes tens of seconds to import Ironic). [`IronicConductors::timings`] says what each step took.

use std::time::{Duration, Instant};

use crate::ironic::RealIronic;
use crate::mariadb::MariaDb;
use crate::{Netns, TempDir, wait_for};

/// The port every conductor's API listens on (each in its own namespace).
pub const API_PORT: u16 = 6385;
/// The port every conductor's JSON-RPC server listens on (Ironic's default: the conductor then registers under its
/// address alone).
pub const RPC_PORT: u16 = 8089;

/// How long each part of [`IronicConductors::start`] took.
#[derive(Debug, Clone)]
pub struct Timings {
    /// `mariadb-install-db`, the server answering, the database and user created.
    pub mariadb: Duration,
    /// `ironic-dbsync create_schema` on MariaDB.
    pub schema: Duration,
    /// Each conductor, start to API answering (they start together).
    pub conductors: Vec<Duration>,
    /// All of it, and every conductor registered alive.
    pub total: Duration,
}

/// The conductors and their database. Dropped in field order: the conductors, then the database.
#[derive(Debug)]
pub struct IronicConductors {
    pub conductors: Vec<RealIronic>,
    pub db: MariaDb,
    pub timings: Timings,
}

impl IronicConductors {
    /// One conductor per `(namespace, address)`; its API on `address:API_PORT`, JSON-RPC on `address:RPC_PORT`, its
    /// name its address. The namespaces must reach each other's addresses. `extra_conf` is appended to each
    /// conductor's configuration. Returns once every conductor answers and all are registered alive.
    pub fn start(members: &[(&Netns, &str)], dir: &TempDir, extra_conf: &str) -> Self {
        let t = Instant::now();
        let db = MariaDb::start(dir);
        let schema = db.ironic_schema();
        let url = db.ironic_url();
        let conductors: Vec<RealIronic> = std::thread::scope(|s| {
            let handles: Vec<_> = members
                .iter()
                .map(|(ns, host)| {
                    let url = url.as_str();
                    s.spawn(move || RealIronic::start_conductor(ns, dir, host, API_PORT, url, RPC_PORT, extra_conf))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a conductor failed to start")).collect()
        });
        let mut me = Self {
            timings: Timings {
                mariadb: db.setup,
                schema,
                conductors: conductors.iter().map(|c| c.startup).collect(),
                total: Duration::ZERO,
            },
            conductors,
            db,
        };
        let want: Vec<String> = me.conductors.iter().map(|c| c.conductor.clone()).collect();
        let alive = wait_for(crate::SETUP_DEADLINE, || {
            let mut up = me.alive_conductors();
            up.sort();
            let mut w = want.clone();
            w.sort();
            (up == w).then_some(())
        });
        assert!(
            alive.is_some(),
            "not every conductor registered alive ({want:?}): {}",
            me.conductors[0].baremetal_json(&["conductor", "list"])
        );
        me.timings.total = t.elapsed();
        me
    }

    /// The conductors `baremetal conductor list` shows alive, through the first conductor's API.
    pub fn alive_conductors(&self) -> Vec<String> {
        let list = self.conductors[0].baremetal_json(&["conductor", "list"]);
        list.as_array()
            .map(|a| {
                a.iter()
                    .filter(|c| c["alive"].as_bool() == Some(true))
                    .filter_map(|c| c["hostname"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Index of the conductor named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.conductors.iter().position(|c| c.conductor == name)
    }
}
