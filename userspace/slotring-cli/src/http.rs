//! The `/metrics` server: hyper's HTTP/1 on a small tokio runtime of its own.
//!
//! `GET /metrics` (and `HEAD`: the same headers, no body) serves the text
//! exposition format, `GET /` a pointer to it, other paths 404, other
//! methods 405 with `Allow: GET, HEAD`. One request per connection
//! (`Connection: close`, as Prometheus is happy with); a client that
//! half-closes its side after the request still gets the whole response.
//! By default only loopback addresses are accepted.
//!
//! A client cannot hold the server, the process or its memory:
//!
//! * the whole request head must arrive within 5 s (hyper's
//!   `header_read_timeout`: one deadline, not one per read) and fit in 8 KiB
//!   (beyond: 431 and close), and no connection outlives 10 s (a client that
//!   never reads its response);
//! * connections are served concurrently, at most 64 at a time; beyond that
//!   a new connection is closed as soon as it is accepted;
//! * an accept error that is not about one connection (`EMFILE`, `ENFILE`,
//!   `ENOBUFS`, `ENOMEM`) pauses accepting for 100 ms instead of retrying at
//!   once, and is reported once per episode;
//! * stopping (drop) closes the listener, drops every connection still
//!   reading its head at once, and gives responses already being rendered or
//!   written at most 1 s.
//!
//! Rendering runs on the runtime's blocking pool, so a slow render never
//! stalls accepting, the deadlines or a stop.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// The default listen address (Prometheus' "slotring" port is unregistered;
/// 9464 is the conventional exporter port used by OpenTelemetry).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// The whole request head must arrive within this time.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head accepted (hyper's smallest read buffer).
const MAX_HEAD_BYTES: usize = 8 << 10;
/// Connections served at once; more are closed as soon as they are accepted.
const MAX_CONNECTIONS: usize = 64;
/// No connection lives longer than this.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// On stop, responses in flight get at most this long to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// The pause after an accept error that is not about one connection.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server's runtime or thread could not be started.
    #[error("cannot start the /metrics server for {addr}")]
    Start {
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
    stop: watch::Sender<bool>,
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
        let bind = |source| ServeError::Bind { addr, source };
        let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let start = |source| ServeError::Start { addr, source };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(2)
            .thread_name("slotring-metrics-render")
            .build()
            .map_err(start)?;
        let listener = {
            let _in_runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(start)?
        };
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("slotring-metrics".into())
            .spawn(move || {
                runtime.block_on(serve(listener, render, stopped));
                // Whatever is left (a render past the grace, a response to a
                // client that does not read) is abandoned, not waited for.
                runtime.shutdown_background();
            })
            .map_err(start)?;
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
        // Wakes the accept loop and every connection (the receivers only
        // look at the change, not at the value).
        self.stop.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accept until stopped, then give the responses in flight their grace.
async fn serve(
    listener: tokio::net::TcpListener,
    render: Render,
    mut stopped: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut failing = false;
    loop {
        let accepted = tokio::select! {
            _ = stopped.changed() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _peer)) => {
                failing = false;
                // Over the cap: dropping the stream closes it at once.
                if let Ok(slot) = slots.clone().try_acquire_owned() {
                    tokio::spawn(connection(stream, render.clone(), stopped.clone(), slot));
                }
            }
            Err(e) if about_one_connection(&e) => {}
            Err(e) => {
                if !failing {
                    eprintln!(
                        "slotring: /metrics on {}: accept failed ({e}); retrying every {} ms",
                        listener
                            .local_addr()
                            .map_or_else(|_| "?".into(), |a| a.to_string()),
                        ACCEPT_BACKOFF.as_millis()
                    );
                    failing = true;
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
    drop(listener);
    // Every connection holds a slot until it ends: all slots back means no
    // response is in flight any more.
    let all = u32::try_from(MAX_CONNECTIONS).expect("a small cap");
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, slots.acquire_many(all)).await;
}

/// Accept errors that concern only the connection being accepted (retry at
/// once); anything else is about the process or the system (back off).
fn about_one_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted)
        || e.raw_os_error() == Some(libc::EPROTO)
}

/// Serve one request on `stream` within the deadlines; on stop, drop it at
/// once unless its response is under way.
async fn connection(
    stream: tokio::net::TcpStream,
    render: Render,
    mut stopped: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    // Set by the service, read after the connection future yields, both on
    // this task: Relaxed suffices (the Arc is only there because the
    // service must be `Send`).
    let responding = Arc::new(AtomicBool::new(false));
    let service = {
        let responding = responding.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            responding.store(true, Ordering::Relaxed);
            let render = render.clone();
            async move { Ok::<_, Infallible>(respond(&req, render).await) }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        // A client that half-closes after its request (`nc -N`, simple
        // health checks) still gets its answer: hyper would otherwise
        // take the read side's EOF for the end of the connection and drop
        // a response still being rendered.
        .half_close(true)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let deadline = tokio::time::Instant::now() + CONNECTION_DEADLINE;
    tokio::select! {
        // Errors (a timed-out or oversized head, a reset) end the connection;
        // there is nobody to report them to.
        _ = tokio::time::timeout_at(deadline, conn.as_mut()) => {}
        _ = stopped.changed() => {
            if responding.load(Ordering::Relaxed) {
                conn.as_mut().graceful_shutdown();
                // Bounded by the deadline, and by the server's grace (the
                // runtime is shut down after it).
                let _ = tokio::time::timeout_at(deadline, conn).await;
            }
        }
    }
}

async fn respond(req: &Request<Incoming>, render: Render) -> Response<Full<Bytes>> {
    let method = req.method();
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n",
            method,
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => {
            let body = match tokio::task::spawn_blocking(move || render()).await {
                Ok(body) => body,
                // The render panicked: say so instead of dropping the connection.
                Err(_) => {
                    return text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "rendering the metrics failed\n",
                        method,
                    );
                }
            };
            reply(StatusCode::OK, prometheus::TEXT_FORMAT, body.into(), method)
        }
        "/" => text(
            StatusCode::OK,
            "slotring exporter: metrics at /metrics\n",
            method,
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n", method),
    }
}

fn text(status: StatusCode, body: &'static str, method: &Method) -> Response<Full<Bytes>> {
    reply(
        status,
        "text/plain; charset=utf-8",
        Bytes::from_static(body.as_bytes()),
        method,
    )
}

/// A response with an explicit `Content-Length`; to `HEAD` the same headers
/// and no body.
fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: Bytes,
    method: &Method,
) -> Response<Full<Bytes>> {
    let len = body.len();
    let body = if method == Method::HEAD {
        Bytes::new()
    } else {
        body
    };
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// Fetch `http://addr/path` with a plain HTTP/1.1 GET (for tests, `stats`
/// against an exporter, and health checks). Returns `(status, body)`.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
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
    use std::io::{Read, Write};
    use std::sync::mpsc;
    use std::time::Instant;

    use super::*;

    fn serve(render: Render) -> MetricsServer {
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), false, render).unwrap()
    }

    /// Send `raw`, read until the server closes (or 10 s pass).
    fn exchange(addr: SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A connection that has sent part of a head and nothing more.
    fn half_head(addr: SocketAddr) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: a").unwrap();
        s
    }

    /// Whether the server closed `s` within `limit` (EOF or reset).
    fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
        s.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    #[test]
    fn serves_metrics_and_404() {
        let srv = serve(Arc::new(|| "x_total 1\n".to_owned()));
        let (code, body) = http_get(srv.addr(), "/metrics").unwrap();
        assert_eq!((code, body.as_str()), (200, "x_total 1\n"));
        assert_eq!(http_get(srv.addr(), "/metrics?x=1").unwrap().0, 200);
        assert_eq!(http_get(srv.addr(), "/nope").unwrap().0, 404);
        assert_eq!(http_get(srv.addr(), "/").unwrap().0, 200);
    }

    #[test]
    fn refuses_remote_by_default() {
        let err = MetricsServer::start("0.0.0.0:0".parse().unwrap(), false, Arc::new(String::new))
            .unwrap_err();
        assert!(err.to_string().contains("0.0.0.0:0"), "{err}");
    }

    #[test]
    fn head_gets_the_headers_of_get_and_other_methods_405_with_allow() {
        let srv = serve(Arc::new(|| "x_total 1\n".to_owned()));
        let head = exchange(srv.addr(), b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-length: 10\r\n"), "{head}");
        assert!(
            head.contains("\r\ncontent-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(head.ends_with("\r\n\r\n"), "no body: {head:?}");
        let post = exchange(
            srv.addr(),
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
        );
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(post.contains("\r\nallow: GET, HEAD\r\n"), "{post}");
    }

    #[test]
    fn a_head_larger_than_the_cap_gets_431() {
        let srv = serve(Arc::new(String::new));
        let mut raw = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
        raw.resize(MAX_HEAD_BYTES * 2, b'a');
        let r = exchange(srv.addr(), &raw);
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 431"), "{r}");
        // A head within the cap is fine.
        let mut raw = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
        raw.resize(MAX_HEAD_BYTES / 2, b'a');
        raw.extend_from_slice(b"\r\n\r\n");
        let r = exchange(srv.addr(), &raw);
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }

    #[test]
    fn slow_heads_neither_delay_a_scrape_nor_outlive_the_head_deadline() {
        let srv = serve(Arc::new(|| "x_total 1\n".to_owned()));
        let mut slow: Vec<TcpStream> = (0..20).map(|_| half_head(srv.addr())).collect();
        let t = Instant::now();
        assert_eq!(http_get(srv.addr(), "/metrics").unwrap().0, 200);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a scrape took {:?} with 20 slow heads pending",
            t.elapsed()
        );
        // Bytes arriving now and then do not extend the deadline.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(500));
            for s in &mut slow {
                s.write_all(b"a").unwrap();
            }
        }
        let waited = t.elapsed();
        for s in &mut slow {
            assert!(
                closed_within(
                    s,
                    HEAD_TIMEOUT.saturating_sub(waited) + Duration::from_secs(2)
                ),
                "a slow head outlived the {HEAD_TIMEOUT:?} head deadline"
            );
        }
    }

    #[test]
    fn connections_beyond_the_cap_are_closed_at_once() {
        let srv = serve(Arc::new(|| "x_total 1\n".to_owned()));
        let held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| half_head(srv.addr()))
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut extra = TcpStream::connect(srv.addr()).unwrap();
        assert!(
            closed_within(&mut extra, Duration::from_secs(1)),
            "connection {} was not closed at once",
            MAX_CONNECTIONS + 1
        );
        // Once the held ones end, scrapes are served again.
        drop(held);
        let start = Instant::now();
        while http_get(srv.addr(), "/metrics").map(|r| r.0).unwrap_or(0) != 200 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "never served again"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn stop_never_waits_for_a_slow_client() {
        let srv = serve(Arc::new(String::new));
        let mut slow = half_head(srv.addr());
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        drop(srv);
        // Well below the 1 s grace, which is for responses in flight only.
        assert!(
            t.elapsed() < Duration::from_millis(800),
            "stop waited {:?} for a client still sending its head",
            t.elapsed()
        );
        assert!(closed_within(&mut slow, Duration::from_secs(1)));
    }

    #[test]
    fn stop_lets_a_response_in_flight_finish() {
        let (started, rendering) = mpsc::channel();
        let started = std::sync::Mutex::new(started);
        let srv = serve(Arc::new(move || {
            let _ = started.lock().unwrap().send(());
            std::thread::sleep(Duration::from_millis(300));
            "x_total 1\n".to_owned()
        }));
        let addr = srv.addr();
        let scrape = std::thread::spawn(move || http_get(addr, "/metrics"));
        rendering.recv_timeout(Duration::from_secs(5)).unwrap();
        drop(srv);
        let (code, body) = scrape.join().unwrap().unwrap();
        assert_eq!((code, body.as_str()), (200, "x_total 1\n"));
    }

    #[test]
    fn stop_waits_for_a_slow_render_at_most_the_grace() {
        let (started, rendering) = mpsc::channel();
        let started = std::sync::Mutex::new(started);
        let srv = serve(Arc::new(move || {
            let _ = started.lock().unwrap().send(());
            std::thread::sleep(Duration::from_secs(5));
            String::new()
        }));
        let addr = srv.addr();
        let _scrape = std::thread::spawn(move || http_get(addr, "/metrics"));
        rendering.recv_timeout(Duration::from_secs(5)).unwrap();
        let t = Instant::now();
        drop(srv);
        let took = t.elapsed();
        assert!(
            took >= SHUTDOWN_GRACE && took < SHUTDOWN_GRACE + Duration::from_secs(2),
            "stop took {took:?} with a render in flight (grace {SHUTDOWN_GRACE:?})"
        );
    }
}
