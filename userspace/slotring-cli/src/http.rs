//! A tiny HTTP server for `/metrics` (std `TcpListener`, one thread).
//!
//! Serves `GET /metrics` with the text exposition format and `GET /` with a
//! pointer to it; everything else is 404/405. Connections are handled one
//! at a time with short timeouts: a scrape is small and Prometheus scrapes
//! rarely. By default only loopback addresses are accepted.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The default listen address (Prometheus' "slotring" port is unregistered;
/// 9464 is the conventional exporter port used by OpenTelemetry).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is not a loopback address and remote access was not allowed.
    #[error("refusing to listen on non-loopback address {addr} (pass --allow-remote to allow it)")]
    NotLoopback {
        /// The rejected address.
        addr: SocketAddr,
    },
    /// `bind` failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Renders the body of `/metrics` on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Render `/metrics` from a registry holding slotring's collector (and
/// whatever else the caller registered).
pub fn render_registry(registry: prometheus::Registry) -> Render {
    Arc::new(move || {
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("every family has a name and at least one metric")
    })
}

/// A running `/metrics` server; stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MetricsServer {
    /// Bind `addr` (port 0 picks a free port) and serve `render()` on
    /// `/metrics` from a background thread.
    pub fn start(addr: SocketAddr, allow_remote: bool, render: Render) -> Result<Self, ServeError> {
        if !allow_remote && !addr.ip().is_loopback() {
            return Err(ServeError::NotLoopback { addr });
        }
        let listener =
            TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("slotring-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    // Acquire pairs with the Release store in `Drop`.
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(stream) = conn {
                        let _ = handle(stream, &render);
                    }
                }
            })
            .map_err(|source| ServeError::Bind { addr, source })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn handle(mut stream: TcpStream, render: &Render) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Drain the headers.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", prometheus::TEXT_FORMAT, render()),
        ("GET", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "slotring exporter: metrics at /metrics\n".to_owned(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_owned(),
        ),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// Fetch `http://addr/path` with a plain HTTP/1.1 GET (for tests, `stats`
/// against an exporter, and health checks). Returns `(status, body)`.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::Read;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_metrics_and_404() {
        let srv = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            false,
            Arc::new(|| "x_total 1\n".to_owned()),
        )
        .unwrap();
        let (code, body) = http_get(srv.addr(), "/metrics").unwrap();
        assert_eq!((code, body.as_str()), (200, "x_total 1\n"));
        assert_eq!(http_get(srv.addr(), "/nope").unwrap().0, 404);
    }

    #[test]
    fn refuses_remote_by_default() {
        let err = MetricsServer::start("0.0.0.0:0".parse().unwrap(), false, Arc::new(String::new))
            .unwrap_err();
        assert!(err.to_string().contains("0.0.0.0:0"), "{err}");
    }
}
