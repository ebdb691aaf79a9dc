//! The one accept loop of the control plane's two API listeners, the gRPC API and the ironic-inspector API, in
//! plaintext or TLS, with the same limits on both:
//!
//! - at most [`MAX_CONNECTIONS`] open connections; past it, new ones wait in the kernel's backlog until one closes;
//! - at most [`MAX_PER_SOURCE`] of them from one source address (IPv6: one /64); past it, a new one is closed;
//! - at most [`MAX_HANDSHAKES`] TLS handshakes in flight, each in its own task and dropped after
//!   [`HANDSHAKE_TIMEOUT`], so a client that stalls in its handshake (or sends plain HTTP to the HTTPS port) delays
//!   nobody else.
//!
//! Each listener has its own budget: the ironic-inspector API faces the PXE network, where anyone may connect, and
//! a flood there must not keep agents from reaching the gRPC API. Refused and timed-out handshakes are logged as
//! refusals ([`crate::refusals`]): once a minute per source at most, and counted.
//!
//! [`Incoming`] is both what tonic serves (a stream of connections) and what axum serves (a listener). Each
//! [`Conn`] carries what it proved ([`PeerInfo`]) and holds its connection slot until it is dropped.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tracing::{debug, warn};

use crate::http_access::rate_limit::source_key;
use crate::tls::{ServerTls, certificate_name};

/// A TLS handshake that has not finished by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes in flight at once, per listener.
pub const MAX_HANDSHAKES: usize = 256;
/// Open connections, per listener. Both listeners together stay well under the 1024 file descriptors systemd
/// gives a service by default, leaving room for etcd, Ironic, Keystone and the store.
pub const MAX_CONNECTIONS: usize = 384;
/// Open connections from one source address (IPv6: one /64), per listener: one machine cannot take every slot.
pub const MAX_PER_SOURCE: usize = 32;

/// The limits of one listener; [`Limits::default`] is what the control plane uses (tests use smaller ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub handshake_timeout: Duration,
    pub max_handshakes: usize,
    pub max_connections: usize,
    pub max_per_source: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            max_handshakes: MAX_HANDSHAKES,
            max_connections: MAX_CONNECTIONS,
            max_per_source: MAX_PER_SOURCE,
        }
    }
}

/// Open connections per source ([`source_key`]), for [`Limits::max_per_source`].
#[derive(Debug, Default)]
struct Sources(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One open connection counted for its source until it is dropped.
#[derive(Debug)]
struct SourceSlot {
    sources: Arc<Sources>,
    key: std::net::IpAddr,
}

impl Sources {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, max: usize) -> Option<SourceSlot> {
        let key = source_key(ip);
        let mut m = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = m.entry(key).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot { sources: self.clone(), key })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut m = self.sources.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// What a connection proved, in every gRPC request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub remote: Option<SocketAddr>,
    /// The client certificate's name, if one was presented (and verified).
    pub identity: Option<String>,
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// One accepted connection, plaintext or TLS (handshake done). It holds a slot of [`Limits::max_connections`]
/// until it is dropped.
#[derive(Debug)]
pub struct Conn {
    io: Io,
    peer: PeerInfo,
    _slot: OwnedSemaphorePermit,
    _source: SourceSlot,
}

impl Conn {
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }
}

/// The connections a listener accepted, in order of their handshakes' ends. Dropping it stops the accept loop.
#[derive(Debug)]
pub struct Incoming {
    ready: mpsc::Receiver<Conn>,
    local: SocketAddr,
    accept_loop: tokio::task::JoinHandle<()>,
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl Incoming {
    /// Accepts connections on `tcp` (named `listener` in the logs) within `limits`; with `tls`, each completes its
    /// handshake first.
    pub fn new(
        listener: &'static str,
        tcp: TcpListener,
        tls: Option<ServerTls>,
        limits: Limits,
    ) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let accept_loop = tokio::spawn(accept_loop(listener, tcp, tls, limits, tx));
        Ok(Self { ready, local, accept_loop })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

async fn accept_loop(
    listener: &'static str,
    tcp: TcpListener,
    tls: Option<ServerTls>,
    limits: Limits,
    tx: mpsc::Sender<Conn>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes));
    let sources = Arc::new(Sources::default());
    loop {
        // A free connection slot (and handshake slot) first: past the limits, clients wait in the backlog.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let handshake = match &tls {
            Some(_) => match handshakes.clone().acquire_owned().await {
                Ok(h) => Some(h),
                Err(_) => return,
            },
            None => None,
        };
        let (stream, remote) = tokio::select! {
            r = tcp.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    warn!(listener, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = tx.closed() => return,
        };
        let Some(source) = sources.take(remote.ip(), limits.max_per_source) else {
            crate::refused!(
                "connections-per-source",
                remote.ip(),
                listener,
                max = limits.max_per_source,
                "connection refused: this source already holds the most connections one source may"
            );
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Some(tls) = &tls else {
            let peer = PeerInfo { remote: Some(remote), identity: None };
            if tx.send(Conn { io: Io::Plain(stream), peer, _slot: slot, _source: source }).await.is_err() {
                return;
            }
            continue;
        };
        let (acceptor, tx) = (tokio_rustls::TlsAcceptor::from(tls.current()), tx.clone());
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await;
            drop(handshake);
            match outcome {
                Ok(Ok(s)) => {
                    let identity =
                        s.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(|c| certificate_name(c));
                    debug!(listener, %remote, identity = ?identity, "TLS connection");
                    let peer = PeerInfo { remote: Some(remote), identity };
                    let _ = tx.send(Conn { io: Io::Tls(Box::new(s)), peer, _slot: slot, _source: source }).await;
                }
                Ok(Err(e)) => {
                    crate::refused!("tls-handshake", remote.ip(), listener, error = %e, "TLS handshake refused");
                }
                Err(_) => {
                    crate::refused!("tls-handshake-timeout", remote.ip(), listener, "TLS handshake timed out");
                }
            }
        });
    }
}

/// For tonic.
impl Stream for Incoming {
    type Item = std::io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().ready.poll_recv(cx).map(|c| c.map(Ok))
    }
}

/// For axum.
impl axum::serve::Listener for Incoming {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            // Always set by the accept loop.
            Some(c) => {
                let remote = c.peer.remote.unwrap_or(self.local);
                (c, remote)
            }
            // The accept loop ended (it cannot while this holds the receiver): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Serves `app` (an axum router, which may extract `ConnectInfo<SocketAddr>`) on `incoming` until `shutdown`
/// resolves, then lets requests in flight finish for up to [`DRAIN_ON_SHUTDOWN`]. A client must send a request's
/// headers within `header_timeout` (HTTP/1), so a connection that dribbles them holds its slot for that long only.
pub async fn serve_http(
    mut incoming: Incoming,
    app: axum::Router,
    header_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use tower::ServiceExt as _;

    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(Duration::from_secs(30)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let conn = tokio::select! {
            c = incoming.ready.recv() => match c {
                Some(c) => c,
                None => break,
            },
            () = &mut shutdown => break,
        };
        let remote = conn.peer.remote.unwrap_or(incoming.local);
        let app = app.clone().map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(axum::extract::ConnectInfo(remote));
            req.map(axum::body::Body::new)
        });
        let service = hyper_util::service::TowerToHyperService::new(app);
        let served = graceful.watch(builder.serve_connection(TokioIo::new(conn), service).into_owned());
        tokio::spawn(async move {
            if let Err(e) = served.await {
                debug!(%remote, error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(incoming);
    if tokio::time::timeout(DRAIN_ON_SHUTDOWN, graceful.shutdown()).await.is_err() {
        debug!("requests still in flight at shutdown were cut");
    }
    Ok(())
}

/// How long requests in flight may finish after a listener is told to stop.
pub const DRAIN_ON_SHUTDOWN: Duration = Duration::from_secs(5);

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use futures::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Long enough for anything that should happen on a busy 2-core machine; only a wait bound, never asserted.
    const DEADLINE: Duration = Duration::from_secs(60);

    /// A self-signed certificate for `localhost`, as files, and the TLS configuration of a client that trusts it.
    fn pki(name: &str) -> (ServerTls, Arc<rustls::ClientConfig>) {
        let dir = std::env::temp_dir().join(format!("ironguard-listener-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        std::fs::write(dir.join("cert.pem"), ck.cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), ck.signing_key.serialize_pem()).unwrap();
        let server = ServerTls::https(&dir.join("cert.pem"), &dir.join("key.pem")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ck.cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(ironguard_ironic::crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (server, Arc::new(client))
    }

    async fn listen(tls: Option<ServerTls>, limits: Limits) -> (Incoming, SocketAddr) {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let incoming = Incoming::new("test", tcp, tls, limits).unwrap();
        let addr = incoming.local_addr();
        (incoming, addr)
    }

    async fn handshake(client: &Arc<rustls::ClientConfig>, addr: SocketAddr) -> std::io::Result<()> {
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut s = tokio_rustls::TlsConnector::from(client.clone()).connect(name, tcp).await?;
        s.write_all(b"ping").await?;
        s.flush().await
    }

    async fn next(incoming: &mut Incoming) -> Conn {
        tokio::time::timeout(DEADLINE, incoming.next()).await.expect("a connection").expect("open").expect("ok")
    }

    /// The server closes a connection that stalls in its handshake: the client reads the end of the stream.
    async fn closed_by_server(stalled: &mut TcpStream) {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(DEADLINE, stalled.read(&mut buf)).await.expect("the server closes it");
        assert!(matches!(n, Ok(0) | Err(_)), "no TLS bytes for a client that never said hello: {n:?}");
    }

    #[tokio::test]
    async fn a_stalled_handshake_delays_nobody_and_is_dropped_at_the_timeout() {
        let (tls, client) = pki("stall");
        let limits = Limits { handshake_timeout: Duration::from_millis(300), ..Limits::default() };
        let (mut incoming, addr) = listen(Some(tls), limits).await;
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        handshake(&client, addr).await.unwrap();
        let mut conn = next(&mut incoming).await;
        let mut ping = [0u8; 4];
        conn.read_exact(&mut ping).await.unwrap();
        assert_eq!(&ping, b"ping", "the second client got through while the first stalled");
        assert!(conn.peer().remote.is_some() && conn.peer().identity.is_none());
        closed_by_server(&mut stalled).await;
    }

    #[tokio::test]
    async fn handshakes_in_flight_are_capped() {
        let (tls, client) = pki("handshakes");
        let timeout = Duration::from_millis(500);
        let limits = Limits { handshake_timeout: timeout, max_handshakes: 1, ..Limits::default() };
        let (mut incoming, addr) = listen(Some(tls), limits).await;
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        // The stalled handshake's timeout starts when the accept loop takes it, which is after connect returned.
        let started = Instant::now();
        // Let the accept loop take the stalled one first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = tokio::spawn({
            let client = client.clone();
            async move { handshake(&client, addr).await }
        });
        let _conn = next(&mut incoming).await;
        // The only handshake slot was the stalled client's until its timeout.
        assert!(started.elapsed() >= timeout - Duration::from_millis(5), "{:?}", started.elapsed());
        closed_by_server(&mut stalled).await;
        second.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn open_connections_are_capped_and_a_closed_one_frees_its_slot() {
        let limits = Limits { max_connections: 2, ..Limits::default() };
        let (mut incoming, addr) = listen(None, limits).await;
        let mut clients = vec![];
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let first = next(&mut incoming).await;
        let _second = next(&mut incoming).await;
        // The third waits in the backlog while two are open.
        assert!(tokio::time::timeout(Duration::from_millis(500), incoming.next()).await.is_err(), "a third slot");
        drop(first);
        let third = next(&mut incoming).await;
        assert_eq!(third.peer().remote.map(|a| a.ip()), Some(std::net::Ipv4Addr::LOCALHOST.into()));
    }

    #[tokio::test]
    async fn headers_that_dribble_are_cut_and_others_are_served() {
        let (incoming, addr) = listen(None, Limits::default()).await;
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(|axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>| async move {
                peer.ip().to_string()
            }),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(incoming, app, Duration::from_millis(500), async {
            let _ = stopped.await;
        }));
        let mut dribble = TcpStream::connect(addr).await.unwrap();
        dribble.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        // Another client is served meanwhile, and its handler sees its address.
        let mut ok = TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut out = vec![];
        tokio::time::timeout(DEADLINE, ok.read_to_end(&mut out)).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200") && text.ends_with("127.0.0.1"), "{text}");
        // The one that never ends its headers is cut (hyper answers 408 or closes).
        let mut out = vec![];
        let _ = tokio::time::timeout(DEADLINE, dribble.read_to_end(&mut out)).await.expect("cut by the server");
        let text = String::from_utf8_lossy(&out);
        assert!(out.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
        stop.send(()).unwrap();
        tokio::time::timeout(DEADLINE, server).await.expect("stops").unwrap().unwrap();
    }

    #[tokio::test]
    async fn one_source_cannot_take_every_slot() {
        let limits = Limits { max_per_source: 2, ..Limits::default() };
        let (mut incoming, addr) = listen(None, limits).await;
        let mut clients = vec![];
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let first = next(&mut incoming).await;
        let _second = next(&mut incoming).await;
        // The third is closed by the server, not queued.
        let mut buf = [0u8; 8];
        let n = tokio::time::timeout(DEADLINE, clients[2].read(&mut buf)).await.expect("closed by the server");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        assert!(tokio::time::timeout(Duration::from_millis(300), incoming.next()).await.is_err(), "a third conn");
        // A closed one gives its source a slot back.
        drop(first);
        let _again = TcpStream::connect(addr).await.unwrap();
        let _third = next(&mut incoming).await;
    }

    #[tokio::test]
    async fn plain_http_to_the_tls_port_is_dropped() {
        let (tls, client) = pki("plain");
        let (mut incoming, addr) = listen(Some(tls), Limits::default()).await;
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = vec![];
        let _ = tokio::time::timeout(DEADLINE, plain.read_to_end(&mut buf)).await.expect("closed");
        assert!(!buf.starts_with(b"HTTP/"), "no HTTP answer: {:?}", String::from_utf8_lossy(&buf));
        // The listener still serves TLS clients.
        handshake(&client, addr).await.unwrap();
        let _ = next(&mut incoming).await;
    }
}
