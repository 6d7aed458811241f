//! An HTTP object server on hyper 1.x and tokio's multi-thread runtime:
//! `GET /obj/{n}` (with `Range: bytes=a-b`, `a-`, `-n`) serves the file
//! `{dir}/{n}`; `GET /stats` prints what was served and charged.
//!
//! Three ways to read, chosen with `--variant`:
//!
//! * `slotring`: [`SharedEngine`] from any task, one disk throttler for the
//!   whole server (`--rate`, bytes/s; page-cache hits are free);
//! * `tokio-fs`: `tokio::fs`, unthrottled (what most Rust services do);
//! * `tokio-fs-governor`: `tokio::fs` with a `governor` limiter awaited per
//!   read (the usual Rust way to throttle; it charges every byte).
//!
//! ```sh
//! cargo run --release -p slotring-uring --example object_server -- \
//!     --dir /var/tmp/objects --variant slotring --rate 67108864 --listen 127.0.0.1:8080
//! ```
//!
//! Clients ask for ranges at random, so every variant opens the objects
//! with `POSIX_FADV_RANDOM`: no readahead, the disk reads what a read asks
//! for (readahead would read bytes no throttler was charged for).
//!
//! A client that disconnects mid-body drops the response body, and with it
//! the read in flight: the request is cancelled and its buffer stays with
//! the ring until the kernel is done with it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{self, SeekFrom};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, HeaderValue, RANGE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use slotring_throttle::{ThrottlePtr, Throttler, UNLIMITED_BLOCK};
use slotring_uring::{RingConfig, SharedConfig, SharedEngine, UringFile};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;

/// Bytes per read (and per body frame).
pub const CHUNK: usize = 256 << 10;

/// How the server reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Through [`SharedEngine`], throttled, page-cache hits free.
    Slotring,
    /// `tokio::fs`, unthrottled.
    TokioFs,
    /// `tokio::fs` + a `governor` limiter per read.
    TokioFsGovernor,
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "slotring" => Ok(Self::Slotring),
            "tokio-fs" => Ok(Self::TokioFs),
            "tokio-fs-governor" => Ok(Self::TokioFsGovernor),
            other => Err(format!(
                "unknown variant {other:?} (slotring, tokio-fs, tokio-fs-governor)"
            )),
        }
    }
}

/// The server's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the objects are (`{dir}/{n}`).
    pub dir: PathBuf,
    /// How to read.
    pub variant: Variant,
    /// Disk limit, bytes/s (0 = unlimited; ignored by `tokio-fs`).
    pub rate: u64,
    /// Where to listen (port 0 = any).
    pub listen: SocketAddr,
    /// Tokio worker threads (0 = one per CPU).
    pub workers: usize,
    /// Entries per ring (`slotring`).
    pub ring_entries: u32,
}

impl Config {
    /// From `--dir D --variant V --rate R --listen A --workers N --ring-entries E`.
    pub fn from_args(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut c = Config {
            dir: PathBuf::from("."),
            variant: Variant::Slotring,
            rate: 0,
            listen: "127.0.0.1:0".parse().expect("a socket address"),
            workers: 0,
            // Room for a completion per connection on busy servers: a CQ
            // that overflows is kept by the kernel, but flushed only at the
            // next enter.
            ring_entries: 1024,
        };
        while let Some(flag) = args.next() {
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {value:?}: {e}");
            match flag.as_str() {
                "--dir" => c.dir = value.into(),
                "--variant" => c.variant = value.parse()?,
                "--rate" => c.rate = value.parse().map_err(|e| bad(&e))?,
                "--listen" => c.listen = value.parse().map_err(|e| bad(&e))?,
                "--workers" => c.workers = value.parse().map_err(|e| bad(&e))?,
                "--ring-entries" => c.ring_entries = value.parse().map_err(|e| bad(&e))?,
                _ => return Err(format!("unknown flag {flag}")),
            }
        }
        Ok(c)
    }
}

type Limiter = governor::DefaultDirectRateLimiter;

/// What every request shares.
pub struct Server {
    variant: Variant,
    /// The slotring variant's objects, opened once: `n -> file`.
    files: HashMap<u64, Arc<UringFile>>,
    /// The tokio-fs variants' objects: `n -> (path, size)`.
    paths: HashMap<u64, (PathBuf, u64)>,
    engine: Option<SharedEngine>,
    disk: Option<Arc<Throttler>>,
    disk_ptr: Option<ThrottlePtr>,
    governor: Option<Arc<Limiter>>,
    served: AtomicU64,
}

/// governor counts cells of this many bytes (its `n` is a `u32`).
const CELL: u64 = 4096;

impl Server {
    /// Open the objects of `cfg.dir` (files named by a number) and the engine.
    /// Must run inside the runtime (the engine registers with its reactor).
    pub fn new(cfg: &Config) -> io::Result<Arc<Self>> {
        let mut paths = HashMap::new();
        for entry in std::fs::read_dir(&cfg.dir)? {
            let entry = entry?;
            if let Some(n) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u64>().ok())
            {
                paths.insert(n, (entry.path(), entry.metadata()?.len()));
            }
        }
        let mut s = Server {
            variant: cfg.variant,
            files: HashMap::new(),
            paths,
            engine: None,
            disk: None,
            disk_ptr: None,
            governor: None,
            served: AtomicU64::new(0),
        };
        match cfg.variant {
            Variant::Slotring => {
                let (engine, why) = SharedEngine::open(&SharedConfig {
                    ring: RingConfig {
                        entries: cfg.ring_entries,
                        ..RingConfig::default()
                    },
                    ..SharedConfig::default()
                })
                .map_err(io::Error::other)?;
                if let Some(why) = why {
                    eprintln!("object_server: reading with {}: {why}", engine.kind());
                }
                for (&n, (path, _)) in &s.paths {
                    let f = UringFile::new(std::fs::File::open(path)?).map_err(io::Error::other)?;
                    f.advise_random()?;
                    s.files.insert(n, f);
                }
                s.engine = Some(engine);
                if cfg.rate > 0 {
                    let t = Throttler::builder(cfg.rate)
                        .name("disk")
                        .limits_block_device_bandwidth(true)
                        .build()
                        .map_err(io::Error::other)?;
                    let t = Arc::new(t);
                    s.disk_ptr = Some(t.clone());
                    s.disk = Some(t);
                }
            }
            Variant::TokioFsGovernor if cfg.rate > 0 => {
                let cells = u32::try_from((cfg.rate / CELL).max(1)).unwrap_or(u32::MAX);
                let per_s = NonZeroU32::new(cells).expect("at least one cell");
                // One second of burst, like the slotring throttler, and at
                // least one chunk.
                let burst = NonZeroU32::new(cells.max((CHUNK as u64 / CELL) as u32))
                    .expect("at least one cell");
                let q = governor::Quota::per_second(per_s).allow_burst(burst);
                s.governor = Some(Arc::new(governor::RateLimiter::direct(q)));
            }
            Variant::TokioFs | Variant::TokioFsGovernor => {}
        }
        Ok(Arc::new(s))
    }

    fn size_of(&self, n: u64) -> Option<u64> {
        match self.variant {
            Variant::Slotring => self.files.get(&n).map(|f| f.size_hint()),
            _ => self.paths.get(&n).map(|p| p.1),
        }
    }

    /// What was served and charged, and the engine's counters, as
    /// `key=value` lines (`GET /stats`).
    pub fn stats(&self) -> String {
        // Charged to the disk net of what was given back (the throttler's
        // count keeps every charge; the engine counts the refunds).
        let refunded = self
            .engine
            .as_ref()
            .map_or(0, |e| e.counters().page_cache_refund_bytes);
        let charged = self
            .disk
            .as_ref()
            .map_or(0, |d| d.counters().amount.saturating_sub(refunded));
        let mut out = format!(
            "bytes_served={}\ndisk_charged={charged}\n",
            self.served.load(Ordering::Relaxed)
        );
        if let Some(e) = &self.engine {
            // Retire dropped requests whose last CQE came in while nobody
            // was waiting on the ring.
            let _ = e.poll_progress();
            let c = e.counters();
            out += &format!(
                "page_cache_bytes={}\npage_cache_refund_bytes={}\ncancellations={}\nsq_full={}\ncq_overflows={}\nin_flight={}\n",
                c.page_cache_bytes,
                c.page_cache_refund_bytes,
                c.cancellations,
                c.sq_full,
                c.cq_overflows,
                e.in_flight()
            );
        }
        out
    }
}

/// The body: reads one chunk at a time as hyper asks for frames. Dropping
/// it (a client gone) drops the read in flight, which cancels it.
pub struct ReadBody {
    server: Arc<Server>,
    src: Option<Src>,
    pos: u64,
    end: u64,
    pending: Option<ChunkRead>,
}

/// One chunk's read in flight; it hands the source back with the bytes.
type ChunkRead = Pin<Box<dyn Future<Output = (Src, io::Result<Bytes>)> + Send>>;

/// Where a body's bytes come from.
enum Src {
    Ring(Arc<UringFile>),
    Fs(tokio::fs::File),
}

async fn read_chunk(
    server: Arc<Server>,
    src: Src,
    pos: u64,
    len: usize,
) -> (Src, io::Result<Bytes>) {
    match src {
        Src::Ring(f) => {
            let engine = server
                .engine
                .as_ref()
                .expect("slotring variant has an engine");
            let (r, mut buf) = engine
                .read_at(
                    &f,
                    vec![0; len],
                    pos,
                    server.disk_ptr.as_ref(),
                    UNLIMITED_BLOCK,
                )
                .await;
            let out = match r {
                Ok(0) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(n) => {
                    buf.truncate(n);
                    Ok(Bytes::from(buf))
                }
                Err(e) => Err(io::Error::other(e)),
            };
            (Src::Ring(f), out)
        }
        Src::Fs(mut f) => {
            if let Some(g) = &server.governor {
                let cells = NonZeroU32::new(len.div_ceil(CELL as usize) as u32).expect("len > 0");
                if let Err(e) = g.until_n_ready(cells).await {
                    return (Src::Fs(f), Err(io::Error::other(e)));
                }
            }
            let mut buf = vec![0; len];
            let r = async {
                f.seek(SeekFrom::Start(pos)).await?;
                let mut done = 0;
                while done < len {
                    match f.read(&mut buf[done..]).await? {
                        0 => break,
                        n => done += n,
                    }
                }
                if done == 0 {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
                buf.truncate(done);
                Ok(Bytes::from(buf))
            }
            .await;
            (Src::Fs(f), r)
        }
    }
}

impl Body for ReadBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if this.pending.is_none() {
            if this.pos >= this.end {
                return Poll::Ready(None);
            }
            let Some(src) = this.src.take() else {
                return Poll::Ready(None);
            };
            let len = (this.end - this.pos).min(CHUNK as u64) as usize;
            this.pending = Some(Box::pin(read_chunk(
                this.server.clone(),
                src,
                this.pos,
                len,
            )));
        }
        let fut = this.pending.as_mut().expect("set above");
        let (src, r) = std::task::ready!(fut.as_mut().poll(cx));
        this.pending = None;
        this.src = Some(src);
        Poll::Ready(Some(r.map(|b| {
            this.pos += b.len() as u64;
            this.server
                .served
                .fetch_add(b.len() as u64, Ordering::Relaxed);
            Frame::data(b)
        })))
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.pos >= self.end
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.end - self.pos)
    }
}

/// What a `Range` header asks for, against an object of `size` bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Want {
    /// The whole object (no header, or one we ignore, as RFC 9110 allows).
    All,
    /// `[start, end)`.
    Part(u64, u64),
    /// Nothing satisfiable: 416.
    Unsatisfiable,
}

/// Parse one `bytes=` range (`a-b`, `a-`, `-n`); several ranges or a
/// malformed header are ignored (the whole object is served).
pub fn parse_range(h: Option<&HeaderValue>, size: u64) -> Want {
    let Some(spec) = h
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().strip_prefix("bytes="))
    else {
        return Want::All;
    };
    if spec.contains(',') {
        return Want::All;
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Want::All;
    };
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| s.parse::<u64>().ok();
    match (a.is_empty(), b.is_empty()) {
        (true, false) => match num(b) {
            Some(0) => Want::Unsatisfiable,
            Some(n) if size > 0 => Want::Part(size.saturating_sub(n), size),
            Some(_) => Want::Unsatisfiable,
            None => Want::All,
        },
        (false, _) => {
            let Some(start) = num(a) else {
                return Want::All;
            };
            let last = if b.is_empty() { Some(u64::MAX) } else { num(b) };
            match last {
                None => Want::All,
                Some(last) if last < start => Want::All,
                Some(_) if start >= size => Want::Unsatisfiable,
                Some(last) => Want::Part(start, last.saturating_add(1).min(size)),
            }
        }
        (true, true) => Want::All,
    }
}

type Resp = Response<http_body_util::Either<ReadBody, http_body_util::Full<Bytes>>>;

fn plain(status: StatusCode, text: String) -> Resp {
    let mut r = Response::new(http_body_util::Either::Right(http_body_util::Full::new(
        Bytes::from(text),
    )));
    *r.status_mut() = status;
    r
}

/// Serve one request.
pub async fn handle(server: Arc<Server>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    if req.method() != Method::GET {
        return Ok(plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into()));
    }
    let path = req.uri().path();
    if path == "/stats" {
        return Ok(plain(StatusCode::OK, server.stats()));
    }
    let Some(n) = path
        .strip_prefix("/obj/")
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            format!("no such path {path}\n"),
        ));
    };
    let Some(size) = server.size_of(n) else {
        return Ok(plain(StatusCode::NOT_FOUND, format!("no object {n}\n")));
    };
    let (status, start, end) = match parse_range(req.headers().get(RANGE), size) {
        Want::All => (StatusCode::OK, 0, size),
        Want::Part(a, b) => (StatusCode::PARTIAL_CONTENT, a, b),
        Want::Unsatisfiable => {
            let mut r = plain(StatusCode::RANGE_NOT_SATISFIABLE, String::new());
            r.headers_mut().insert(
                CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{size}")).expect("ascii"),
            );
            return Ok(r);
        }
    };
    let src = match server.variant {
        Variant::Slotring => Src::Ring(server.files[&n].clone()),
        Variant::TokioFs | Variant::TokioFsGovernor => {
            match tokio::fs::File::open(&server.paths[&n].0).await {
                Ok(f) => {
                    // Same as the slotring variant: no readahead.
                    let _ = nix::fcntl::posix_fadvise(
                        &f,
                        0,
                        0,
                        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
                    );
                    Src::Fs(f)
                }
                Err(e) => {
                    return Ok(plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("open object {n}: {e}\n"),
                    ));
                }
            }
        }
    };
    let body = ReadBody {
        server: server.clone(),
        src: Some(src),
        pos: start,
        end,
        pending: None,
    };
    let mut r = Response::new(http_body_util::Either::Left(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_LENGTH, HeaderValue::from(end - start));
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    // Names the object and its size (the test's wrk script checks bytes by it).
    let etag = format!("\"{n}-{size}\"");
    h.insert(ETAG, HeaderValue::from_str(&etag).expect("ascii"));
    if status == StatusCode::PARTIAL_CONTENT {
        let v = format!("bytes {start}-{}/{size}", end - 1);
        h.insert(CONTENT_RANGE, HeaderValue::from_str(&v).expect("ascii"));
    }
    Ok(r)
}

/// Accept connections on `listener` forever, each on its own task.
pub async fn serve(server: Arc<Server>, listener: TcpListener) -> io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(server.clone(), req));
            // A client that goes away mid-body ends its connection here.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// The runtime the server runs on.
pub fn runtime(cfg: &Config) -> io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if cfg.workers > 0 {
        b.worker_threads(cfg.workers);
    }
    b.enable_all()
        .thread_keep_alive(Duration::from_secs(10))
        .build()
}

/// Parse the command line and serve until killed.
#[allow(
    dead_code,
    reason = "tests include this file for `serve` and call no main"
)]
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = Config::from_args(std::env::args().skip(1))?;
    let rt = runtime(&cfg)?;
    rt.block_on(async {
        let server = Server::new(&cfg)?;
        let listener = TcpListener::bind(cfg.listen).await?;
        // The one line a driver (the test, the bench) waits for.
        println!("listening on {}", listener.local_addr()?);
        serve(server, listener).await?;
        Ok(())
    })
}
