//! HTTP/1.1 requests from inside a network namespace, made by the test process itself.
//!
//! The tests ask Ironic, Keystone, etcd and the daemons' metrics thousands of times per run, mostly in wait loops.
//! Each request used to start two programs (`ip netns exec NS curl ...`: about 10 ms of CPU a request, 4% of the test
//! pool's CPU under perf). Here a thread enters the namespace and speaks HTTP/1.1 over a plain TCP connection
//! (`Connection: close`; a body with `Content-Length` or chunked), which is all these servers need.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// An answer: the status, the header block in lower case (as `curl -D -` printed it, status line first), the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// One request from inside the namespace named `ns` (`url`: `http://host:port/path`). `Err` says why no answer came (the connection was
/// refused or timed out, or the answer was not HTTP): what `curl -s` reports as status 0.
pub fn request(
    ns: &str,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response, String> {
    let (method, url) = (method.to_string(), url.to_string());
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let body = body.map(<[u8]>::to_vec);
    crate::in_named_netns(ns, move || {
        let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        request_here(&method, &url, &refs, body.as_deref(), timeout)
    })
}

/// `GET url` from inside `ns`: the body when the server answered 2xx within `timeout` (as `curl -sf`).
pub fn get_ok(ns: &str, url: &str, timeout: Duration) -> Option<String> {
    request(ns, "GET", url, &[], None, timeout).ok().filter(|r| (200..300).contains(&r.status)).map(|r| r.body)
}

/// One request from this thread's network namespace.
pub fn request_here(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response, String> {
    let deadline = Instant::now() + timeout;
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("not an http:// address: {url}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority}: no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect {addr}: {e}"))?;
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_write_timeout(Some(left())).map_err(|e| e.to_string())?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nAccept: */*\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if body.is_some() || !matches!(method, "GET" | "HEAD" | "DELETE") {
        head.push_str(&format!("Content-Length: {}\r\n", body.map_or(0, <[u8]>::len)));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.unwrap_or_default());
    stream.write_all(&out).map_err(|e| format!("send to {addr}: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        stream.set_read_timeout(Some(left())).map_err(|e| e.to_string())?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read from {addr}: {e}")),
        }
        // A server that keeps the connection open despite `Connection: close` is not waited for once the answer
        // is whole.
        if whole(&raw, method == "HEAD") {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!("{addr}: no whole answer within {timeout:?}"));
        }
    }
    parse(&raw, method == "HEAD")
}

/// Whether `raw` holds a whole answer: its headers and all of the body they announce.
fn whole(raw: &[u8], head_only: bool) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
    let body = &raw[end + 4..];
    let no_body = head.lines().next().and_then(|l| l.get(9..12)).is_some_and(|s| s == "204" || s == "304");
    if head_only || no_body {
        return true;
    }
    let header = |name: &str| header(&head, name);
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return dechunk(body).is_ok();
    }
    header("content-length").and_then(|v| v.parse::<usize>().ok()).is_some_and(|n| body.len() >= n)
}

/// An HTTP/1.1 answer read to its end (the server closed the connection).
fn parse(raw: &[u8], head_only: bool) -> Result<Response, String> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("the answer has no complete header block")?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("HTTP/1."))
        .and_then(|l| l.get(2..5))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP status line: {:?}", head.lines().next()))?;
    let headers = head.to_lowercase();
    let mut body = &raw[end + 4..];
    let header = |name: &str| header(&headers, name);
    let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let body = if head_only {
        Vec::new()
    } else if chunked {
        dechunk(body)?
    } else {
        if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            if body.len() < n {
                return Err(format!("the body ended after {} of {n} bytes", body.len()));
            }
            body = &body[..n];
        }
        body.to_vec()
    };
    Ok(Response { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

/// The value of header `name` (lower case) in a lower-cased header block.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')).map(str::trim))
}

/// A chunked body's data.
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").ok_or("a chunk size line without its end")?;
        let line = String::from_utf8_lossy(&rest[..eol]);
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("not a chunk size: {line:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err("a chunk cut short".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_sized_body_and_stops_at_its_length() {
        let r =
            parse(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}trailing", false)
                .unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "{}"));
        assert!(r.headers.starts_with("http/1.1 200 ok\r\ncontent-type: application/json"), "{}", r.headers);
    }

    #[test]
    fn decodes_a_chunked_body() {
        let r = parse(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nnot \r\n5;x=y\r\nfound\r\n0\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "not found"));
    }

    #[test]
    fn refuses_what_is_not_a_whole_http_answer() {
        for raw in [
            &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
        ] {
            assert!(parse(raw, false).is_err(), "{:?}", String::from_utf8_lossy(raw));
        }
        assert!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false).is_err());
    }

    #[test]
    fn a_round_trip_on_loopback() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"{\"a\":1}") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the request ended early");
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nyes").unwrap();
            String::from_utf8(got).unwrap()
        });
        let r = request_here(
            "POST",
            &format!("http://127.0.0.1:{port}/v1/x?y=1"),
            &[("X-OpenStack-Ironic-API-Version", "latest")],
            Some(b"{\"a\":1}"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (201, "yes"));
        let sent = server.join().unwrap();
        assert!(sent.starts_with("POST /v1/x?y=1 HTTP/1.1\r\n"), "{sent}");
        assert!(
            sent.contains("\r\nX-OpenStack-Ironic-API-Version: latest\r\n")
                && sent.contains("\r\nContent-Length: 7\r\n")
        );
        let refused = request_here("GET", &format!("http://127.0.0.1:{port}/"), &[], None, Duration::from_secs(2));
        assert!(refused.is_err(), "nothing listens any more: {refused:?}");
    }
}
