//! `cargo xtask doc-check`: the project's Markdown names only things that
//! exist, and writes no counts.
//!
//! For `README.md`, `ARCHITECTURE.md`, `CONTRIBUTING.md` (those that exist)
//! and `docs/bench/README.md`, outside fenced code blocks:
//!
//! * every inline code span is classified by [`classify`] and checked
//!   against the workspace ([`Workspace`]): a path must exist (relative to
//!   the root, the document, `userspace/`, a crate or its `src/`); a crate
//!   name (`slotring-*`) must be a workspace crate; a Rust item (`Type`,
//!   `Type::method`, `slotring_x::Item`, `module::CONST`) must be defined
//!   in the workspace's Rust sources; an `ALL_CAPS_NAME` must occur in the
//!   workspace's sources (a constant, an environment variable, a kernel
//!   flag the code uses) unless [`EXTERNAL_CONST_PREFIXES`] names it;
//! * every relative Markdown link `[x](path)` must resolve;
//! * no phrase counts states, tests or variants (`12 tests`): the count
//!   drifts from the code it describes.
//!
//! Spans that are commands, flags, expressions or prose (a space, a
//! bracket, an operator, a leading `-` or `.`), absolute host paths
//! (`/proc/…`), `snake_case` names (bench keys, functions, kernel symbols)
//! and names [`EXTERNAL_TYPES`] lists are not checked. Every failure is
//! printed as `FILE:LINE: `token`: what is missing`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The documents checked, relative to the root; a missing one is skipped.
pub(crate) const DOCS: &[&str] = &[
    "README.md",
    "ARCHITECTURE.md",
    "CONTRIBUTING.md",
    "docs/bench/README.md",
];

/// CamelCase names the docs use that are not ours: the standard library's,
/// tokio's and the other crates', ClickHouse's.
#[rustfmt::skip]
pub(crate) const EXTERNAL_TYPES: &[&str] = &[
    // std.
    "Send", "Sync", "Arc", "Rc", "Box", "Vec", "String", "Option", "Some", "None", "Result", "Ok",
    "Err", "Mutex", "RwLock", "Condvar", "Barrier", "Cell", "RefCell", "Drop", "Clone", "Copy",
    "Debug", "Default", "Display", "Future", "Pin", "Poll", "Waker", "Context", "Instant",
    "Duration", "SystemTime", "File", "OpenOptions", "Range", "Iterator", "JoinHandle",
    "AtomicU64", "AtomicU32", "AtomicUsize", "AtomicBool", "Ordering", "Error", "Path",
    "PathBuf", "Read", "Write", "Seek", "Fn", "FnMut", "FnOnce", "Sized", "Unpin", "Deref",
    "From", "Into", "TryFrom", "Hash", "Eq", "PartialEq", "Ord", "PartialOrd", "Self",
    "Relaxed", "Acquire", "Release", "AcqRel", "SeqCst",
    // tokio and other crates.
    "Semaphore", "Notify", "Runtime", "Handle", "TcpListener", "TcpStream", "AsyncRead",
    "AsyncWrite", "ReadBuf", "LocalSet", "Interest", "AsyncFd", "RateLimiter", "Quota",
    "Registry", "Collector", "IntCounter", "Histogram", "Parser", "Subcommand", "Serialize",
    "Deserialize", "Ebpf", "Bpf", "Btf", "Skel", "Link",
    // ClickHouse, which slotring's design follows.
    "ClickHouse", "IThrottler", "ReadBufferFromFileDescriptor", "IAsynchronousReader",
    "ThreadPoolReader", "ProfileEvents", "CurrentMetrics", "ProcessList",
    "ConcurrencyControlRoundRobinScheduler", "ConcurrencyControlFairRoundRobinScheduler",
];

/// `ALL_CAPS` prefixes of names that are the kernel's or libc's, not ours.
#[rustfmt::skip]
pub(crate) const EXTERNAL_CONST_PREFIXES: &[&str] = &[
    "IORING_", "RWF_", "O_", "CLOCK_", "BPF_", "POSIX_FADV_", "SCHED_", "CONFIG_", "SYNC_FILE_RANGE",
    "TASK_", "CAP_", "PR_", "MAP_", "PROT_", "RLIMIT_", "SO_", "TCP_", "AT_", "EPOLL", "CLONE_",
    "EFD_", "TFD_", "PERF_", "FAN_", "SIG", "MADV_", "FALLOC_", "IOPRIO_", "SPLICE_F_",
];

/// File name endings that make a span a file name.
#[rustfmt::skip]
const FILE_EXTENSIONS: &[&str] = &[
    "rs", "md", "toml", "json", "c", "h", "service", "sh", "yml", "yaml", "lua", "lock", "o",
    "py", "txt", "conf", "socket", "timer", "rules", "lds",
];

/// Bare file names the docs use that are outputs, not files of the tree.
const EXTERNAL_FILES: &[&str] = &["report.json", "vmlinux.h", "lib.rs", "main.rs", "mod.rs"];

/// Crates the docs name that are not ours (the first segment of a path).
#[rustfmt::skip]
const EXTERNAL_CRATES: &[&str] = &[
    "std", "core", "alloc", "crate", "self", "super", "tokio", "libc", "nix", "aya", "libbpf_rs",
    "io_uring", "serde", "serde_json", "prometheus", "hyper", "clap", "governor", "quanta",
    "loom", "proptest", "anyhow", "thiserror", "arc_swap", "portable_atomic", "bytes",
    // Primitive types.
    "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32",
    "f64", "bool", "char", "str",
];

/// Paths the docs cite from the Linux source tree, not ours.
#[rustfmt::skip]
const KERNEL_PATH_PREFIXES: &[&str] = &[
    "io_uring/", "kernel/", "fs/", "mm/", "block/", "include/linux/", "include/uapi/", "net/",
    "drivers/", "arch/", "tools/",
];

/// What the workspace holds that the docs may name.
#[derive(Debug, Default)]
pub(crate) struct Workspace {
    root: PathBuf,
    /// Package names (`slotring-throttle`).
    crates: BTreeSet<String>,
    /// Directories a relative path may start from besides the root and the
    /// document's: `userspace/`, each crate, each crate's `src/`.
    bases: Vec<PathBuf>,
    /// Every file's name.
    file_names: BTreeSet<String>,
    /// Names of items, enum variants and struct fields.
    items: BTreeSet<String>,
    /// Every identifier-like word of the sources (Rust, C, shell, TOML).
    words: BTreeSet<String>,
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier words of `line`.
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !is_ident_char(c))
        .filter(|w| !w.is_empty())
}

fn is_camel(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
        && s.chars().any(|c| c.is_ascii_lowercase())
}

/// What a Rust source line defines.
#[derive(Debug, PartialEq)]
enum Def<'a> {
    /// An item (`struct`, `fn`, `const`, …), public or not: the docs map
    /// the internals too.
    Item(&'a str),
    /// An enum, a struct or a union, whose variants or fields follow.
    Body(&'a str),
}

/// The name `line` defines, if any.
fn defined_name(line: &str) -> Option<Def<'_>> {
    const KINDS: &[&str] = &[
        "struct", "enum", "trait", "type", "fn", "const", "static", "mod", "union",
    ];
    // The BPF ABI's structs are declared inside `abi_struct!` as
    // `Name = "map_name" {`, their fields following.
    if let Some((name, rest)) = line.trim_start().split_once(" = \"")
        && is_camel(name)
        && rest.trim_end().ends_with('{')
    {
        return Some(Def::Body(name));
    }
    let ws: Vec<&str> = words(line.trim_start()).collect();
    for (i, w) in ws.iter().enumerate() {
        match *w {
            "pub" | "crate" | "super" | "in" | "self" | "async" | "unsafe" | "extern" | "C"
            | "default" => {}
            "const" if ws.get(i + 1) == Some(&"fn") => {}
            k if KINDS.contains(&k) => {
                let name = ws.get(i + 1)?;
                return Some(match k {
                    "enum" | "struct" | "union" => Def::Body(name),
                    _ => Def::Item(name),
                });
            }
            _ => return None,
        }
    }
    None
}

/// The variant or field a line of an enum's or a struct's body declares:
/// `Name,`, `Name {`, `Name(`, `Name = 1,`, `[pub[(crate)]] name: Type,`.
fn member(line: &str) -> Option<&str> {
    let mut t = line.trim_start();
    if let Some(r) = t.strip_prefix("pub") {
        t = match r.strip_prefix('(') {
            Some(vis) => vis.split_once(')').map_or(r, |(_, rest)| rest),
            None => r,
        }
        .trim_start();
    }
    let name = t.split(|c: char| !is_ident_char(c)).next()?;
    let rest = t[name.len()..].trim_start();
    let variant = is_camel(name) && (rest.is_empty() || rest.starts_with([',', '{', '(', '=']));
    let field = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && rest.starts_with(':')
        && !rest.starts_with("::");
    (variant || field).then_some(name)
}

impl Workspace {
    /// Scan the tree at `root` (skipping `target/` and hidden directories).
    pub(crate) fn scan(root: &Path) -> Result<Self> {
        let mut ws = Self {
            root: root.to_owned(),
            ..Self::default()
        };
        let mut files = vec![];
        walk(root, &mut files)?;
        for f in &files {
            if let Some(n) = f.file_name() {
                ws.file_names.insert(n.to_string_lossy().into_owned());
            }
            let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(
                ext,
                "rs" | "c" | "h" | "sh" | "toml" | "service" | "lua" | "json"
            ) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(f) else {
                continue;
            };
            for l in text.lines() {
                ws.words.extend(words(l).map(str::to_owned));
            }
            if ext == "rs" {
                ws.add_rust(&text);
            }
            if f.file_name().is_some_and(|n| n == "Cargo.toml")
                && let Some(name) = package_name(&text)
            {
                let dir = f.parent().unwrap_or(root).to_owned();
                if dir.parent().is_some_and(|p| p.ends_with("userspace")) {
                    ws.bases.push(dir.join("src"));
                    ws.bases.push(dir);
                }
                ws.crates.insert(name);
            }
        }
        ws.bases.insert(0, root.join("userspace"));
        Ok(ws)
    }

    /// Add the items, variants and fields `text` (a Rust file) defines.
    fn add_rust(&mut self, text: &str) {
        // Inside an enum's or a struct's body: the brace depth it is at.
        let mut body_depth: Option<i32> = None;
        let mut depth = 0i32;
        for l in text.lines() {
            let t = l.trim_start();
            if t.starts_with("//") {
                continue;
            }
            if body_depth == Some(depth)
                && !t.starts_with('#')
                && let Some(name) = member(t)
            {
                self.items.insert(name.to_owned());
            }
            match defined_name(t) {
                Some(Def::Item(name)) => {
                    self.items.insert(name.to_owned());
                }
                Some(Def::Body(name)) => {
                    self.items.insert(name.to_owned());
                    if t.trim_end().ends_with('{') {
                        body_depth = Some(depth + 1);
                    }
                }
                None => {}
            }
            if let Some(i) = t.find("macro_rules!")
                && let Some(n) = words(&t[i + "macro_rules!".len()..]).next()
            {
                self.items.insert(n.to_owned());
            }
            depth += t.matches('{').count() as i32 - t.matches('}').count() as i32;
            if body_depth.is_some_and(|d| depth < d) {
                body_depth = None;
            }
        }
    }

    /// Whether the sources use `name` (a `slotring_…` name: a BPF map, a
    /// metric), or, for a counter's metric (`<prefix>_<name>_total`, the
    /// name joined at run time), a name of two or more words it ends with.
    fn names_metric(&self, name: &str) -> bool {
        if self.words.contains(name) {
            return true;
        }
        let base = name.strip_suffix("_total").unwrap_or(name);
        let parts: Vec<&str> = base.split('_').collect();
        (1..parts.len().saturating_sub(1)).any(|i| self.words.contains(&parts[i..].join("_")))
    }

    /// Whether `rel` (a path a document names) exists from one of the
    /// bases or `doc_dir`.
    fn path_exists(&self, rel: &str, doc_dir: &Path) -> bool {
        let rel = rel.trim_end_matches('/');
        self.starts(doc_dir).any(|b| b.join(rel).exists())
    }

    /// The directories a relative path may start from.
    fn starts<'a>(&'a self, doc_dir: &'a Path) -> impl Iterator<Item = &'a Path> {
        [self.root.as_path(), doc_dir]
            .into_iter()
            .chain(self.bases.iter().map(PathBuf::as_path))
    }
}

/// `name = "…"` of a manifest's `[package]`.
fn package_name(manifest: &str) -> Option<String> {
    let package = manifest.split("[package]").nth(1)?;
    package
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find_map(|l| {
            let v = l
                .trim()
                .strip_prefix("name")?
                .trim_start()
                .strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_owned())
        })
}

/// Every file under `dir`, skipping `target/` and hidden entries.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        let ty = e.file_type()?;
        if ty.is_dir() {
            walk(&e.path(), out)?;
        } else if ty.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

/// What a code span names, and so what is checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Check {
    /// Nothing: a command, an expression, prose, or not ours.
    Skip,
    /// A path that must exist.
    Path(String),
    /// A bare file name that some file of the tree must have.
    FileName(String),
    /// A crate name (`slotring-x`, or `slotring_x`: a crate, or a name the
    /// sources use, such as a metric).
    Crate(String),
    /// A Rust path: its segments (the first may be a crate).
    Item(Vec<String>),
    /// An `ALL_CAPS` name that must occur in the sources (a trailing `_`:
    /// as a prefix).
    Const(String),
}

/// How [`check_doc`] treats the span `token`.
pub(crate) fn classify(token: &str) -> Check {
    const PROSE: &[char] = &[
        ' ', '\t', '(', ')', '=', '<', '>', ',', '"', '\'', '|', '&', '*', '+', '!', '$', '{', '}',
        '[', ']', '#', ';', '@', '~', '^', '%', '?', '\\',
    ];
    let t = token.trim();
    if t.is_empty()
        || t.contains(PROSE)
        || !t.is_ascii()
        || t.starts_with(['-', '.', '/'])
        || t.contains("://")
    {
        return Check::Skip;
    }
    // `path:12` and `path:12-20` name the path.
    let t = match t.rsplit_once(':') {
        Some((p, line))
            if !p.ends_with(':')
                && !line.is_empty()
                && line.chars().all(|c| c.is_ascii_digit() || c == '-') =>
        {
            p
        }
        _ => t,
    };
    if t.contains("::") {
        let segs: Vec<String> = t.split("::").map(str::to_owned).collect();
        if segs
            .iter()
            .any(|s| s.is_empty() || !s.chars().all(is_ident_char))
        {
            return Check::Skip;
        }
        if EXTERNAL_CRATES.contains(&segs[0].as_str()) || EXTERNAL_TYPES.contains(&segs[0].as_str())
        {
            return Check::Skip;
        }
        return Check::Item(segs);
    }
    if t.contains(':') || !t.chars().all(|c| is_ident_char(c) || "./-".contains(c)) {
        return Check::Skip;
    }
    let ext = t.rsplit_once('.').map(|(_, e)| e);
    let has_ext = ext.is_some_and(|e| FILE_EXTENSIONS.contains(&e));
    if t.contains('/') {
        return if t.starts_with("target/") || KERNEL_PATH_PREFIXES.iter().any(|p| t.starts_with(p))
        {
            Check::Skip
        } else {
            Check::Path(t.to_owned())
        };
    }
    if has_ext {
        return if EXTERNAL_FILES.contains(&t) {
            Check::Skip
        } else {
            Check::FileName(t.to_owned())
        };
    }
    if t == "slotring" || t.starts_with("slotring-") || t.starts_with("slotring_") {
        return Check::Crate(t.to_owned());
    }
    let caps = t
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if caps && t.contains('_') && t.starts_with(|c: char| c.is_ascii_uppercase()) {
        return if EXTERNAL_CONST_PREFIXES.iter().any(|p| t.starts_with(p)) {
            Check::Skip
        } else {
            Check::Const(t.to_owned())
        };
    }
    if is_camel(t) && !EXTERNAL_TYPES.contains(&t) {
        return Check::Item(vec![t.to_owned()]);
    }
    Check::Skip
}

/// What `check` finds missing in `ws`, if anything.
fn missing(ws: &Workspace, check: &Check, doc_dir: &Path) -> Option<String> {
    match check {
        Check::Skip => None,
        Check::Path(p) => {
            // A path with no file ending is one only when its first
            // segment is a directory of the tree (`MiB/s` is not).
            let first = p.split('/').next().unwrap_or("");
            let has_ext = p
                .rsplit_once('.')
                .is_some_and(|(_, e)| FILE_EXTENSIONS.contains(&e));
            let rooted = ws.starts(doc_dir).any(|b| b.join(first).is_dir());
            (!ws.path_exists(p, doc_dir) && (has_ext || rooted))
                .then(|| "no such file or directory".to_owned())
        }
        Check::FileName(n) => (!ws.file_names.contains(n) && !ws.path_exists(n, doc_dir))
            .then(|| "no file of that name in the tree".to_owned()),
        Check::Crate(c) => {
            let dashed = c.replace('_', "-");
            let ok = ws.crates.contains(&dashed) || (c.contains('_') && ws.names_metric(c));
            (!ok).then(|| "no workspace crate (or name in the sources) of that name".to_owned())
        }
        Check::Item(segs) => {
            let first = &segs[0];
            let starts_lower = first.starts_with(|c: char| c.is_ascii_lowercase());
            if starts_lower && (first == "slotring" || first.starts_with("slotring_")) {
                let dashed = first.replace('_', "-");
                if !ws.crates.contains(&dashed) {
                    return Some(format!("no workspace crate `{dashed}`"));
                }
            } else if !starts_lower && !ws.items.contains(first) {
                return Some(format!("no item `{first}` defined in the workspace"));
            }
            let last = &segs[segs.len() - 1];
            (segs.len() > 1 && !ws.items.contains(last))
                .then(|| format!("no item `{last}` defined in the workspace"))
        }
        Check::Const(c) => {
            let ok = match c.strip_suffix('_') {
                Some(_) => ws.words.iter().any(|w| w.starts_with(c.as_str())),
                None => ws.words.contains(c),
            };
            (!ok).then(|| "not in the workspace's sources (nor an external prefix)".to_owned())
        }
    }
}

/// `text` with fenced code blocks blanked (their lines kept, empty).
fn without_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<&str> = None;
    for l in text.lines() {
        let t = l.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push_str(l),
            _ => {}
        }
        out.push('\n');
    }
    out
}

/// Text found on a 1-based line.
pub(crate) type AtLine = (usize, String);

/// The code spans and link targets of `prose` (fences blanked), each with
/// its line.
pub(crate) fn spans_and_links(prose: &str) -> (Vec<AtLine>, Vec<AtLine>) {
    let b = prose.as_bytes();
    let (mut spans, mut links) = (vec![], vec![]);
    let (mut i, mut line) = (0, 1);
    let run_at = |j: usize| b[j..].iter().take_while(|&&c| c == b'`').count();
    while i < b.len() {
        match b[i] {
            b'\n' => line += 1,
            b'`' => {
                let n = run_at(i);
                let start = i + n;
                let mut j = start;
                let close = loop {
                    match b.get(j) {
                        None => break None,
                        Some(b'`') => {
                            let m = run_at(j);
                            if m == n {
                                break Some(j);
                            }
                            j += m;
                        }
                        Some(_) => j += 1,
                    }
                };
                if let Some(j) = close {
                    let span = &prose[start..j];
                    spans.push((line, span.replace('\n', " ")));
                    line += span.matches('\n').count();
                    i = j + n;
                    continue;
                }
                i += n;
                continue;
            }
            b']' if b.get(i + 1) == Some(&b'(') => {
                if let Some(end) = prose[i + 2..].find(')') {
                    let target = &prose[i + 2..i + 2 + end];
                    if !target.contains('\n') {
                        links.push((line, target.to_owned()));
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    (spans, links)
}

/// The counts in `line` (backticks ignored): `12 tests`, `7 lifecycle
/// states`, `3 variants`.
pub(crate) fn counts(line: &str) -> Vec<String> {
    const NOUNS: &[&str] = &["lifecycle states", "states", "tests", "variants"];
    let l = line.replace('`', "").to_ascii_lowercase();
    let b = l.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !(b[i - 1] as char).is_ascii_alphanumeric();
        if b[i].is_ascii_digit() && boundary {
            let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            let after = &l[i + digits..];
            let rest = after.trim_start_matches(' ');
            if rest.len() < after.len() {
                for noun in NOUNS {
                    let end_ok =
                        |r: &str| r.chars().next().is_none_or(|c| !c.is_ascii_alphanumeric());
                    if let Some(r) = rest.strip_prefix(noun)
                        && end_ok(r)
                    {
                        out.push(format!("{} {noun}", &l[i..i + digits]));
                        break;
                    }
                }
            }
            i += digits;
        } else {
            i += 1;
        }
    }
    out
}

/// Every failure of the document `rel` (its text `text`):
/// `FILE:LINE: `token`: what is missing`.
pub(crate) fn check_doc(ws: &Workspace, rel: &str, text: &str) -> Vec<String> {
    let doc_dir = ws
        .root
        .join(rel)
        .parent()
        .map_or_else(|| ws.root.clone(), Path::to_owned);
    let prose = without_fences(text);
    let (spans, links) = spans_and_links(&prose);
    let mut out = vec![];
    for (line, span) in spans {
        if let Some(why) = missing(ws, &classify(&span), &doc_dir) {
            out.push((line, format!("{rel}:{line}: `{span}`: {why}")));
        }
    }
    for (line, target) in links {
        let t = target.split_whitespace().next().unwrap_or("");
        let t = t.split('#').next().unwrap_or("");
        if t.is_empty() || t.contains(':') {
            continue;
        }
        let path = match t.strip_prefix('/') {
            Some(r) => ws.root.join(r),
            None => doc_dir.join(t),
        };
        if !path.exists() {
            out.push((
                line,
                format!("{rel}:{line}: `{target}`: the link's target does not exist"),
            ));
        }
    }
    for (i, l) in prose.lines().enumerate() {
        for c in counts(l) {
            out.push((
                i + 1,
                format!(
                    "{rel}:{}: `{c}`: a count (counts drift; name the things, not how many)",
                    i + 1
                ),
            ));
        }
    }
    out.sort_by_key(|(line, _)| *line);
    out.into_iter().map(|(_, s)| s).collect()
}

/// The failures of every document of [`DOCS`] under `root`.
pub(crate) fn check_all(root: &Path) -> Result<Vec<String>> {
    let ws = Workspace::scan(root)?;
    let mut out = vec![];
    for rel in DOCS {
        if let Ok(text) = std::fs::read_to_string(root.join(rel)) {
            out.extend(check_doc(&ws, rel, &text));
        }
    }
    Ok(out)
}

/// The command: print every failure; fail if there is one.
pub(crate) fn run(root: &Path) -> Result<()> {
    let failures = check_all(root)?;
    for f in &failures {
        println!("{f}");
    }
    if !failures.is_empty() {
        bail!("doc-check: {} failure(s)", failures.len());
    }
    eprintln!("doc-check: the docs name only what exists");
    Ok(())
}

#[cfg(test)]
mod tests;
