//! The HTTP server: one axum router for the Ironic API ([`crate::api`]) and the admin API ([`crate::admin`]),
//! behind the [`crate::gate`] layer, served until a shutdown future resolves.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::http::{HeaderMap, header};
use tokio::net::TcpListener;

use crate::config::FakeIronicConfig;
use crate::model::Store;

/// What every handler shares: the configuration, the store and the address the server is bound to.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: FakeIronicConfig,
    pub(crate) local_addr: SocketAddr,
    store: Mutex<Store>,
}

impl Shared {
    pub(crate) fn new(config: FakeIronicConfig, local_addr: SocketAddr) -> Shared {
        Shared { config, local_addr, store: Mutex::new(Store::default()) }
    }

    /// The store. A panic while it was held (a failed assertion in a test helper) does not make it unusable.
    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `http://HOST` as the client addressed us (the `Host` header), else the bound address: the base of links.
    pub(crate) fn base_url(&self, headers: &HeaderMap) -> String {
        match headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
            Some(host) if !host.is_empty() => format!("http://{host}"),
            _ => format!("http://{}", self.local_addr),
        }
    }
}

/// The whole application: Ironic API and admin API behind the gate.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    crate::api::routes()
        .merge(crate::admin::routes())
        .fallback(crate::api::not_found)
        .layer(axum::middleware::from_fn_with_state(shared.clone(), crate::gate::gate))
        .with_state(shared)
}

/// Serves `listener` until `shutdown` resolves, then stops accepting and lets requests in flight finish.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(shared)).with_graceful_shutdown(shutdown).await
}
