//! A minimal HTTP/1.1 client over a tokio `TcpStream`: one request per connection (`Connection: close`),
//! `Content-Length` bodies, plain `http://` only. The workspace has no HTTP client crate; this is enough for tests
//! to talk to the fake (its Ironic API and its `/_fake` admin API), in this crate and in others. [`Admin`] is the
//! admin API, typed, for a fake in another process.

use serde::de::DeserializeOwned;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Why a request got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("unsupported URL {0:?}: only http://HOST[:PORT][/PATH] is")]
    InvalidUrl(String),
    #[error("talking to {authority}")]
    Io {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed HTTP response: {0}")]
    MalformedResponse(String),
    #[error("response body is not JSON")]
    Json(#[source] serde_json::Error),
    #[error("{method} {url} answered {status}: {body}")]
    Status { method: String, url: String, status: u16, body: String },
}

/// An HTTP response, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Header names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value, ClientError> {
        serde_json::from_slice(&self.body).map_err(ClientError::Json)
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET url`.
pub async fn get(url: &str) -> Result<Response, ClientError> {
    send("GET", url, &[], None).await
}

/// `method url` with a JSON body.
pub async fn send_json(method: &str, url: &str, body: &serde_json::Value) -> Result<Response, ClientError> {
    send(method, url, &[("Content-Type", "application/json")], Some(body.to_string().as_bytes())).await
}

/// Sends one request to an absolute `http://` URL and reads the whole response.
pub async fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Result<Response, ClientError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| ClientError::InvalidUrl(url.to_owned()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(ClientError::InvalidUrl(url.to_owned()));
    }
    let io = |source| ClientError::Io { authority: authority.to_owned(), source };
    let connect_to = if authority.contains(':') { authority.to_owned() } else { format!("{authority}:80") };
    let mut stream = TcpStream::connect(connect_to.as_str()).await.map_err(io)?;

    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or_default();
    if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.map_err(io)?;

    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.map_err(io)?;
    parse_response(&raw)
}

/// The `/_fake` admin API of a fake Ironic, typed: what in-process tests do with [`crate::FakeIronic`]'s methods,
/// for a `fake-ironic` process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    base: String,
}

impl Admin {
    /// The admin API of the fake at `url` (`http://HOST:PORT`, as [`crate::FakeIronic::url`] gives it).
    pub fn new(url: impl Into<String>) -> Admin {
        Admin { base: url.into().trim_end_matches('/').to_owned() }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let resp = match body {
            Some(b) => send_json(method, &url, b).await?,
            None => send(method, &url, &[], None).await?,
        };
        if !(200..300).contains(&resp.status) {
            return Err(ClientError::Status { method: method.to_owned(), url, status: resp.status, body: resp.text() });
        }
        serde_json::from_slice(&resp.body).map_err(ClientError::Json)
    }

    /// The stored node with this UUID or name; `None` when there is none.
    pub async fn node(&self, ident: &str) -> Result<Option<crate::Node>, ClientError> {
        match self.call("GET", &format!("/_fake/nodes/{ident}"), None).await {
            Ok(node) => Ok(Some(node)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every stored node.
    pub async fn nodes(&self) -> Result<Vec<crate::Node>, ClientError> {
        self.call("GET", "/_fake/nodes", None).await
    }

    /// The ports of the node with this UUID or name; `None` when there is no such node.
    pub async fn ports_of(&self, ident: &str) -> Result<Option<Vec<crate::Port>>, ClientError> {
        match self.call("GET", &format!("/_fake/nodes/{ident}/ports"), None).await {
            Ok(ports) => Ok(Some(ports)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The stored port with this UUID; `None` when there is none.
    pub async fn port(&self, uuid: &str) -> Result<Option<crate::Port>, ClientError> {
        match self.call("GET", &format!("/_fake/ports/{uuid}"), None).await {
            Ok(port) => Ok(Some(port)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Adds a node (or replaces the one with its UUID); returns it as stored.
    pub async fn add_node(&self, node: &crate::Node) -> Result<crate::Node, ClientError> {
        self.call("POST", "/_fake/nodes", Some(&serde_json::json!(node))).await
    }

    /// Adds a port (`pxe_enabled`, `extra`, `local_link_connection`, ... as given); returns it as stored.
    pub async fn add_port(&self, port: &crate::Port) -> Result<crate::Port, ClientError> {
        self.call("POST", "/_fake/ports", Some(&serde_json::json!(port))).await
    }

    /// The Ironic API requests recorded so far.
    pub async fn calls(&self) -> Result<Vec<crate::Call>, ClientError> {
        self.call("GET", "/_fake/calls", None).await
    }
}

fn parse_response(raw: &[u8]) -> Result<Response, ClientError> {
    let malformed = |what: &str| ClientError::MalformedResponse(what.to_owned());
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| malformed("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| malformed("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed(&format!("status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut response = Response { status, headers, body: Vec::new() };
    let rest = &raw[end + 4..];
    response.body = if response.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest).ok_or_else(|| malformed("bad chunked body"))?
    } else if let Some(len) = response.header("content-length") {
        let len: usize = len.parse().map_err(|_| malformed("bad Content-Length"))?;
        rest.get(..len).ok_or_else(|| malformed("body shorter than Content-Length"))?.to_vec()
    } else {
        rest.to_vec()
    };
    Ok(response)
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_field = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_field.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhiXX").unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.header("x-a")), (200, &b"hi"[..], Some("b")));
        let r =
            parse_response(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (201, &b"abc"[..]));
        assert!(parse_response(b"garbage").is_err());
    }
}
