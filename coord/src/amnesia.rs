//! Store amnesia: an etcd cluster can be replaced by an empty one on the same endpoints, or restored from an old
//! snapshot. Sessions, elections and keys then start over, and an election held on the new store knows nothing
//! of the leaders of the old one, which may still be serving until their fence deadline. Every process therefore
//! remembers what it saw of its store ([`StoreMemory`]: cluster id, the store's epoch key, the highest revision)
//! and compares each new look ([`judge`]). A difference is [`Amnesia`]: the caller fails closed and waits until
//! every earlier leader's fence has certainly passed before it opens again.

use serde::{Deserialize, Serialize};

/// What this process saw of its store. Persisted by the agent across restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreMemory {
    /// etcd's cluster id (0: not seen yet).
    pub cluster_id: u64,
    /// The value of the store's epoch key: written once into a store that has none.
    pub epoch: String,
    /// The highest store revision seen in a linearizable reply.
    pub revision: i64,
}

/// The store forgot: why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Amnesia {
    pub detail: String,
}

impl std::fmt::Display for Amnesia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "store amnesia: {}", self.detail)
    }
}

/// One look at the store: its cluster id, its epoch (and whether this look created it), its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLook {
    pub cluster_id: u64,
    pub epoch: String,
    pub created_epoch: bool,
    pub revision: i64,
}

/// Compares a look with what was remembered; returns the new memory and the amnesia, if any. Pure.
pub fn judge(memory: &StoreMemory, look: &StoreLook) -> (StoreMemory, Option<Amnesia>) {
    let mut why = Vec::new();
    if memory.cluster_id != 0 && look.cluster_id != 0 && look.cluster_id != memory.cluster_id {
        why.push(format!("the cluster id changed from {:x} to {:x}", memory.cluster_id, look.cluster_id));
    }
    if !memory.epoch.is_empty() && look.epoch != memory.epoch {
        why.push(if look.created_epoch {
            "the store had no epoch key any more (an empty or replaced cluster)".to_string()
        } else {
            format!("the store's epoch changed from {} to {}", memory.epoch, look.epoch)
        });
    }
    if memory.revision > 0 && look.revision < memory.revision {
        why.push(format!("the store's revision went back from {} to {}", memory.revision, look.revision));
    }
    let next = StoreMemory {
        cluster_id: if look.cluster_id != 0 { look.cluster_id } else { memory.cluster_id },
        epoch: look.epoch.clone(),
        revision: if why.is_empty() { memory.revision.max(look.revision) } else { look.revision },
    };
    let amnesia = (!why.is_empty()).then(|| Amnesia { detail: why.join("; ") });
    (next, amnesia)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(cluster_id: u64, epoch: &str, created: bool, revision: i64) -> StoreLook {
        StoreLook { cluster_id, epoch: epoch.into(), created_epoch: created, revision }
    }

    #[test]
    fn a_first_look_and_a_steady_store_are_fine() {
        let (m, a) = judge(&StoreMemory::default(), &look(7, "e1", true, 5));
        assert!(a.is_none());
        assert_eq!(m, StoreMemory { cluster_id: 7, epoch: "e1".into(), revision: 5 });
        let (m2, a) = judge(&m, &look(7, "e1", false, 9));
        assert!(a.is_none());
        assert_eq!(m2.revision, 9);
        // The same revision again (nothing written meanwhile) is fine.
        assert!(judge(&m2, &look(7, "e1", false, 9)).1.is_none());
    }

    #[test]
    fn every_kind_of_forgetting_is_amnesia() {
        let m = StoreMemory { cluster_id: 7, epoch: "e1".into(), revision: 50 };
        let empty = judge(&m, &look(7, "e2", true, 2)).1.expect("an empty store on the same cluster id");
        assert!(empty.detail.contains("no epoch") && empty.detail.contains("50 to 2"), "{empty}");
        assert!(judge(&m, &look(8, "e1", false, 60)).1.unwrap().detail.contains("cluster id"));
        assert!(judge(&m, &look(7, "e1", false, 40)).1.unwrap().detail.contains("went back"), "an old snapshot");
        assert!(judge(&m, &look(7, "e3", false, 60)).1.unwrap().detail.contains("epoch changed"));
        // After amnesia the memory follows the new store, so it fires once.
        let (next, _) = judge(&m, &look(7, "e2", true, 2));
        assert!(judge(&next, &look(7, "e2", false, 3)).1.is_none());
    }
}
