//! The in-process backend, for a single host without etcd: sessions never expire, elections are decided among
//! the candidates of this process, the key-value store lives in memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use tokio::sync::{Notify, broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::session::{Expiry, Session};
use crate::{CoordError, Coordinator, KeyValue, KvEvent, Leadership, LockGuard};

#[derive(Default)]
struct State {
    /// election -> candidates in order of arrival: (key, value)
    elections: HashMap<String, Vec<(String, String)>>,
    kv: BTreeMap<String, KeyValue>,
    /// lock name -> holder key
    locks: HashMap<String, String>,
}

/// The local backend.
pub struct LocalCoordinator {
    state: Mutex<State>,
    changed: Notify,
    revision: AtomicI64,
    events: broadcast::Sender<(i64, KvEvent)>,
}

impl std::fmt::Debug for LocalCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCoordinator").finish_non_exhaustive()
    }
}

impl Default for LocalCoordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalCoordinator {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            revision: AtomicI64::new(0),
            events: broadcast::channel(1024).0,
        }
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_rev(&self) -> i64 {
        self.revision.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[async_trait]
impl Coordinator for LocalCoordinator {
    fn backend(&self) -> &'static str {
        "local"
    }

    async fn session(&self, ttl: Duration) -> Result<Session, CoordError> {
        let (tx, rx) = watch::channel(Expiry::Never);
        Ok(Session { lease: 0, ttl, expiry: rx, stop: CancellationToken::new(), _hold: Some(tx) })
    }

    async fn revoke(&self, session: &Session) -> Result<(), CoordError> {
        session.stop();
        Ok(())
    }

    async fn campaign(
        &self,
        election: &str,
        value: &str,
        _session: &Session,
        cancel: CancellationToken,
    ) -> Result<Leadership, CoordError> {
        let rev = self.next_rev();
        let key = format!("{election}/{rev:016x}");
        self.lock_state().elections.entry(election.to_string()).or_default().push((key.clone(), value.to_string()));
        loop {
            let notified = self.changed.notified();
            let first = self.lock_state().elections.get(election).and_then(|c| c.first().map(|(k, _)| k.clone()));
            if first.as_deref() == Some(key.as_str()) {
                return Ok(Leadership {
                    election: election.to_string(),
                    key,
                    revision: rev,
                    lease: 0,
                    holder: value.to_string(),
                });
            }
            tokio::select! {
                _ = notified => {}
                _ = cancel.cancelled() => {
                    self.lock_state().elections.entry(election.to_string()).or_default().retain(|(k, _)| *k != key);
                    self.changed.notify_waiters();
                    return Err(CoordError::Cancelled);
                }
            }
        }
    }

    async fn resign(&self, l: &Leadership) -> Result<(), CoordError> {
        if let Some(c) = self.lock_state().elections.get_mut(&l.election) {
            c.retain(|(k, _)| *k != l.key);
        }
        self.changed.notify_waiters();
        Ok(())
    }

    async fn leader(&self, election: &str) -> Result<Option<String>, CoordError> {
        Ok(self.lock_state().elections.get(election).and_then(|c| c.first().map(|(_, v)| v.clone())))
    }

    async fn put(&self, key: &str, value: Vec<u8>, _session: Option<&Session>) -> Result<i64, CoordError> {
        let rev = self.next_rev();
        let kv = {
            let mut st = self.lock_state();
            let create = st.kv.get(key).map(|k| k.create_revision).unwrap_or(rev);
            let kv = KeyValue { key: key.to_string(), value, create_revision: create, mod_revision: rev };
            st.kv.insert(key.to_string(), kv.clone());
            kv
        };
        let _ = self.events.send((rev, KvEvent::Put(kv)));
        Ok(rev)
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, CoordError> {
        Ok(self
            .lock_state()
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), CoordError> {
        let removed = self.lock_state().kv.remove(key).is_some();
        if removed {
            let rev = self.next_rev();
            let _ = self.events.send((rev, KvEvent::Delete { key: key.to_string(), mod_revision: rev }));
        }
        Ok(())
    }

    async fn watch_prefix(
        &self,
        prefix: &str,
        after_revision: i64,
    ) -> Result<BoxStream<'static, Result<Vec<KvEvent>, CoordError>>, CoordError> {
        let rx = self.events.subscribe();
        let prefix = prefix.to_string();
        let s = tokio_stream_like(rx).filter_map(move |(rev, ev)| {
            let key = match &ev {
                KvEvent::Put(kv) => kv.key.clone(),
                KvEvent::Delete { key, .. } => key.clone(),
            };
            let keep = rev > after_revision && key.starts_with(&prefix);
            async move { keep.then(|| Ok(vec![ev])) }
        });
        Ok(s.boxed())
    }

    async fn lock(&self, name: &str, _session: &Session, cancel: CancellationToken) -> Result<LockGuard, CoordError> {
        let key = format!("lock/{name}/{:016x}", self.next_rev());
        loop {
            let notified = self.changed.notified();
            {
                let mut st = self.lock_state();
                if !st.locks.contains_key(name) {
                    st.locks.insert(name.to_string(), key.clone());
                    return Ok(LockGuard { name: name.to_string(), key });
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = cancel.cancelled() => return Err(CoordError::Cancelled),
            }
        }
    }

    async fn revoke_lease(&self, _lease: i64) -> Result<(), CoordError> {
        Ok(())
    }

    async fn check_store(&self) -> Result<Option<crate::Amnesia>, CoordError> {
        Ok(None) // the store lives and dies with this process
    }

    async fn still_leading(&self, _leadership: &Leadership) -> Result<bool, CoordError> {
        Ok(true)
    }

    fn store_memory(&self) -> crate::StoreMemory {
        crate::StoreMemory::default()
    }

    fn restore_store_memory(&self, _memory: crate::StoreMemory) {}

    async fn unlock(&self, guard: &LockGuard) -> Result<(), CoordError> {
        {
            let mut st = self.lock_state();
            if st.locks.get(&guard.name) == Some(&guard.key) {
                st.locks.remove(&guard.name);
            }
        }
        self.changed.notify_waiters();
        Ok(())
    }
}

/// A broadcast receiver as a stream (lagged receivers skip ahead; the local backend is for one host).
fn tokio_stream_like(rx: broadcast::Receiver<(i64, KvEvent)>) -> BoxStream<'static, (i64, KvEvent)> {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(v) => return Some((v, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_candidate_leads_and_the_next_follows_on_resign() {
        let c = std::sync::Arc::new(LocalCoordinator::new());
        let s = c.session(Duration::from_secs(3)).await.unwrap();
        assert_eq!(s.expiry(), Expiry::Never);
        let mut w = s.watch();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), w.changed()).await.is_err(),
            "a local session never reports a change (in particular not 'closed')"
        );
        let a = c.campaign("net", "a", &s, CancellationToken::new()).await.unwrap();
        assert_eq!(c.leader("net").await.unwrap().as_deref(), Some("a"));
        let c2 = c.clone();
        let b = tokio::spawn(async move {
            let s = c2.session(Duration::from_secs(3)).await.unwrap();
            c2.campaign("net", "b", &s, CancellationToken::new()).await.unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!b.is_finished(), "b waits while a leads");
        c.resign(&a).await.unwrap();
        let lb = tokio::time::timeout(Duration::from_secs(2), b).await.unwrap().unwrap();
        assert_eq!(c.leader("net").await.unwrap().as_deref(), Some("b"));
        c.resign(&lb).await.unwrap();
        assert_eq!(c.leader("net").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_cancelled_candidate_withdraws() {
        let c = LocalCoordinator::new();
        let s = c.session(Duration::from_secs(3)).await.unwrap();
        let _a = c.campaign("n", "a", &s, CancellationToken::new()).await.unwrap();
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(matches!(c.campaign("n", "b", &s, cancel).await, Err(CoordError::Cancelled)));
        assert_eq!(c.lock_state().elections["n"].len(), 1);
    }

    #[tokio::test]
    async fn kv_prefix_and_locks() {
        let c = LocalCoordinator::new();
        let s = c.session(Duration::from_secs(3)).await.unwrap();
        c.put("members/x/a", b"1".to_vec(), Some(&s)).await.unwrap();
        c.put("members/x/b", b"2".to_vec(), None).await.unwrap();
        c.put("members/y/c", b"3".to_vec(), None).await.unwrap();
        let got: Vec<String> = c.get_prefix("members/x/").await.unwrap().into_iter().map(|k| k.key).collect();
        assert_eq!(got, vec!["members/x/a", "members/x/b"]);
        c.delete("members/x/a").await.unwrap();
        assert_eq!(c.get_prefix("members/x/").await.unwrap().len(), 1);
        let g = c.lock("node-1", &s, CancellationToken::new()).await.unwrap();
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            c2.cancel();
        });
        assert!(matches!(c.lock("node-1", &s, cancel).await, Err(CoordError::Cancelled)), "held lock blocks");
        c.unlock(&g).await.unwrap();
        c.lock("node-1", &s, CancellationToken::new()).await.unwrap();
    }
}
