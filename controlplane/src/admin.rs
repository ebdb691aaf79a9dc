//! The admin HTTP endpoint: `/metrics` (Prometheus text; the gauges read from the store are read first), `/healthz`
//! (the process answers), `/readyz` (the store is open and the gRPC server is serving).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::{Metrics, StoreGauges};

#[derive(Debug, Clone)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    pub store_gauges: Arc<StoreGauges>,
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    s.store_gauges.refresh().await;
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
