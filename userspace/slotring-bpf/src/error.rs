//! The one error type of this crate.

use std::path::PathBuf;

/// Why the probes could not be loaded, attached or pinned, or why an input
/// was refused. Loading failures are also kept as the reason of a degraded
/// (memory-only) instance.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The process lacks CAP_BPF / CAP_PERFMON (or CAP_SYS_ADMIN).
    #[error("no privilege to use BPF while {what}: {source} (needs CAP_BPF and CAP_PERFMON)")]
    NoPrivilege {
        /// The step that was refused.
        what: String,
        /// The kernel's answer (EPERM / EACCES).
        source: std::io::Error,
    },
    /// The kernel has no BTF (`/sys/kernel/btf/vmlinux`), needed for CO-RE.
    #[error("kernel BTF unavailable: {0}")]
    NoBtf(String),
    /// The verifier rejected a program.
    #[error("verifier rejected program `{program}`: {source}\n--- verifier log ---\n{log}")]
    Verifier {
        /// Program (function) name.
        program: String,
        /// The BPF_PROG_LOAD error.
        source: std::io::Error,
        /// The verifier log.
        log: String,
    },
    /// Some other loader step failed.
    #[error("BPF {what} failed: {detail}")]
    Load {
        /// The step.
        what: String,
        /// aya's message.
        detail: String,
    },
    /// Attaching a program failed.
    #[error("attaching `{program}` to `{tracepoint}` failed: {detail}")]
    Attach {
        /// Program name.
        program: String,
        /// Tracepoint name.
        tracepoint: String,
        /// aya's message.
        detail: String,
    },
    /// bpffs is not mounted and could not be mounted, or a pin failed.
    #[error("pinning under {path}: {detail}")]
    Pin {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// mmap of an mmapable map failed.
    #[error("mmap of map `{map}` failed: {source}")]
    Mmap {
        /// Map name.
        map: String,
        /// The error.
        source: std::io::Error,
    },
    /// More threads registered than `MAX_THREADS`.
    #[error("all {capacity} thread slots are in use (thread {tid} not registered)")]
    ThreadsExhausted {
        /// The capacity.
        capacity: u32,
        /// The refused thread.
        tid: u32,
    },
    /// A stats index out of range.
    #[error("{map} index {index} out of range (capacity {capacity})")]
    IndexOutOfRange {
        /// Map name.
        map: &'static str,
        /// The index.
        index: u32,
        /// The capacity.
        capacity: u32,
    },
    /// A thread that was never registered with this instance.
    #[error("thread {tid} is not registered")]
    UnknownThread {
        /// The thread id.
        tid: u32,
    },
    /// A thread tried to register while no instance is loaded (none was
    /// created yet, or the last one was dropped).
    #[error("thread {tid} cannot register: no slotring-bpf instance is loaded")]
    NoInstance {
        /// The thread id.
        tid: u32,
    },
    /// A thread tried to register with an instance that is being dropped.
    #[error("thread {tid} cannot register: its slotring-bpf instance was dropped")]
    InstanceDropped {
        /// The thread id.
        tid: u32,
    },
    /// The calling thread is registered with a newer instance than the one
    /// asked (threads register with the most recently created instance).
    #[error("thread {tid} is registered with a newer slotring-bpf instance, not this one")]
    OtherInstance {
        /// The thread id.
        tid: u32,
    },
    /// A value read from outside (a pinned map) does not have the size of
    /// the ABI struct it should hold.
    #[error("a `struct {c_name}` is {expected} words, got {got}")]
    ValueSize {
        /// The C struct name.
        c_name: &'static str,
        /// Words the struct takes.
        expected: usize,
        /// Words supplied.
        got: usize,
    },
    /// An invalid verification threshold.
    #[error("threshold ratio {0} is not in [0, 1]")]
    BadThreshold(f64),
}

impl BpfError {
    /// Whether this is a privilege problem (the expected degraded case).
    pub fn is_no_privilege(&self) -> bool {
        matches!(self, BpfError::NoPrivilege { .. })
    }
}

pub(crate) fn is_perm(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}
