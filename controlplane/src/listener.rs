//! The one accept loop of the control plane's two API listeners, the gRPC API and the ironic-inspector API, in
//! plaintext or TLS, with the same limits on both:
//!
//! - at most [`MAX_CONNECTIONS`] open connections; past it, new ones wait in the kernel's backlog until one closes;
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

use crate::tls::{ServerTls, certificate_name};

/// A TLS handshake that has not finished by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes in flight at once, per listener.
pub const MAX_HANDSHAKES: usize = 256;
/// Open connections, per listener. Both listeners together stay well under the 1024 file descriptors systemd
/// gives a service by default, leaving room for etcd, Ironic, Keystone and the store.
pub const MAX_CONNECTIONS: usize = 384;

/// The limits of one listener; [`Limits::default`] is what the control plane uses (tests use smaller ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub handshake_timeout: Duration,
    pub max_handshakes: usize,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { handshake_timeout: HANDSHAKE_TIMEOUT, max_handshakes: MAX_HANDSHAKES, max_connections: MAX_CONNECTIONS }
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
        let _ = stream.set_nodelay(true);
        let Some(tls) = &tls else {
            let peer = PeerInfo { remote: Some(remote), identity: None };
            if tx.send(Conn { io: Io::Plain(stream), peer, _slot: slot }).await.is_err() {
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
                    let _ = tx.send(Conn { io: Io::Tls(Box::new(s)), peer, _slot: slot }).await;
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
