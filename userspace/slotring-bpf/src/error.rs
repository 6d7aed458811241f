//! The one error type of this crate.

use std::path::PathBuf;

/// Why the probes could not be loaded, attached or pinned, or why an input
/// was refused. Loading failures are also kept as the reason of a degraded
/// (memory-only) instance.
///
/// Each message says what failed and with which value; the error that caused
/// it (the kernel's answer, or aya's error with its own causes) is the
/// [`std::error::Error::source`] and is not repeated in the message, so a
/// printed chain (`{:#}` of an `anyhow::Error`) names every cause once.
/// aya's larger errors are boxed to keep this type small.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The process lacks CAP_BPF / CAP_PERFMON (or CAP_SYS_ADMIN).
    #[error("no privilege to use BPF while {what} (needs CAP_BPF and CAP_PERFMON)")]
    NoPrivilege {
        /// The step that was refused.
        what: String,
        /// The kernel's answer (EPERM / EACCES).
        source: std::io::Error,
    },
    /// The kernel has no BTF (`/sys/kernel/btf/vmlinux`), needed for CO-RE.
    #[error("kernel BTF unavailable")]
    NoBtf(#[source] aya::BtfError),
    /// The verifier rejected a program.
    #[error(
        "verifier rejected program `{program}`\n--- verifier log ---\n{}\n--- end of verifier log ---",
        .log.trim_end()
    )]
    Verifier {
        /// Program (function) name.
        program: String,
        /// The BPF_PROG_LOAD error.
        source: std::io::Error,
        /// The verifier log.
        log: String,
    },
    /// Loading the embedded object failed (aya's parsing, relocation or
    /// map creation step).
    #[error("loading the BPF object failed")]
    Object {
        /// aya's error.
        source: Box<aya::EbpfError>,
    },
    /// Creating the maps of the embedded object failed.
    #[error("creating the maps of the BPF object failed")]
    CreateMaps {
        /// aya's error (it names the map).
        source: Box<aya::maps::MapError>,
    },
    /// A program or map the loader needs is not in the embedded object.
    #[error("the BPF object has no {kind} `{name}`")]
    NotInObject {
        /// `"program"` or `"map"`.
        kind: &'static str,
        /// The program (function) or map name.
        name: String,
    },
    /// A map of the embedded object is not an array map.
    #[error("map `{map}` of the BPF object is not an array")]
    NotAnArray {
        /// Map name.
        map: String,
    },
    /// A step on a program of the object (converting it to its attach type,
    /// loading, unloading) failed.
    #[error("{what} program `{program}` failed")]
    Program {
        /// The step, e.g. `loading`.
        what: &'static str,
        /// Program (function) name.
        program: String,
        /// aya's error.
        source: Box<aya::programs::ProgramError>,
    },
    /// Attaching a program failed.
    #[error("attaching `{program}` to `{tracepoint}` failed")]
    Attach {
        /// Program name.
        program: String,
        /// Tracepoint name.
        tracepoint: String,
        /// aya's error.
        source: Box<aya::programs::ProgramError>,
    },
    /// A step on a map (opening it as a typed map, registering a thread in
    /// it) failed.
    #[error("{what} failed")]
    Map {
        /// The step, naming the map and the value (e.g. registering
        /// thread 42 in map `thread_index`).
        what: String,
        /// aya's error.
        source: Box<aya::maps::MapError>,
    },
    /// Reading a thread's scheduler statistics (the baseline of its
    /// accounting) failed.
    #[error("reading /proc/thread-self/schedstat of thread {tid} failed")]
    Schedstat {
        /// The thread id.
        tid: u32,
        /// The read or parse error.
        source: std::io::Error,
    },
    /// bpffs is not mounted on `/sys/fs/bpf` and mounting it failed.
    #[error("mounting bpffs on {path} failed")]
    MountBpffs {
        /// The mount point.
        path: PathBuf,
        /// The mount(2) error.
        source: nix::errno::Errno,
    },
    /// The pin directory is not on a bpffs mount.
    #[error("pin directory {path} is not on a bpffs mount")]
    NotBpffs {
        /// The pin directory.
        path: PathBuf,
    },
    /// A step on a pin directory or pinned file (creating, opening,
    /// listing, removing, chown, chmod) failed.
    #[error("{what} {path} failed")]
    PinAccess {
        /// The step, e.g. `creating`, `chown of` or `chmod of`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An existing pin directory (or an ancestor) fails the ownership
    /// checks: it is neither used nor changed.
    #[error(
        "refusing pin directory {path}: {reason} (owner uid {owner}, mode {mode:04o}); remove it or choose another pin directory"
    )]
    UnsafePinDir {
        /// The refused directory (or link or file).
        path: PathBuf,
        /// Its owner uid.
        owner: u32,
        /// Its permission bits.
        mode: u32,
        /// Why it is refused, e.g. `owned by another user`.
        reason: &'static str,
    },
    /// The pin root is not a usable path.
    #[error("pin directory {path} {reason}")]
    BadPinDir {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An instance name that is not one plain path component.
    #[error("instance name {name:?} is not 1 to 64 of [A-Za-z0-9._-] (and not `.` or `..`)")]
    BadInstanceName {
        /// The name.
        name: String,
    },
    /// The instance directory holds pins that are not provably stale.
    #[error(
        "pin directory {path} is in use: its owner is {liveness}; choose another instance name"
    )]
    InstanceInUse {
        /// The instance directory.
        path: PathBuf,
        /// What its owner record says.
        liveness: crate::pins::Liveness,
    },
    /// Pinning a map or program failed.
    #[error("pinning {path} failed")]
    Pin {
        /// The pin path.
        path: PathBuf,
        /// aya's error.
        source: aya::pin::PinError,
    },
    /// mmap of an mmapable map failed.
    #[error("mmap of map `{map}` failed")]
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
    /// A fraction of the per-episode rule over 100 %.
    #[error("episode rule `{field}` is {value} parts per million, more than 1000000")]
    BadRule {
        /// The field of [`crate::abi::EpisodeRule`].
        field: &'static str,
        /// Its value.
        value: u64,
    },
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

/// `e` and its causes joined by `: `, as `{:#}` of an `anyhow::Error` prints
/// them: the text for a one-line report of an error.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io;

    use super::{BpfError, chain};

    /// A "no BTF" error whose cause is `why`, as a degraded instance's reason.
    pub(crate) fn no_btf(why: &str) -> BpfError {
        BpfError::NoBtf(aya::BtfError::FileError {
            path: "/sys/kernel/btf/vmlinux".into(),
            error: io::Error::other(why.to_owned()),
        })
    }

    fn os_error(errno: i32) -> String {
        io::Error::from_raw_os_error(errno).to_string()
    }

    #[test]
    fn each_cause_is_printed_once() {
        // The kernel's answer directly under ours.
        let e = BpfError::PinAccess {
            what: "chmod of",
            path: "/sys/fs/bpf/slotring".into(),
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        let text = chain(&e);
        assert_eq!(
            text,
            format!(
                "chmod of /sys/fs/bpf/slotring failed: {}",
                os_error(libc::EPERM)
            )
        );
        // aya's error, with the kernel's answer under it.
        let e = BpfError::Pin {
            path: "/sys/fs/bpf/slotring/prog_switch_btf".into(),
            source: aya::pin::PinError::SyscallError(aya::sys::SyscallError {
                call: "BPF_OBJ_PIN",
                io_error: io::Error::from_raw_os_error(libc::EEXIST),
            }),
        };
        let text = chain(&e);
        assert!(
            text.starts_with("pinning /sys/fs/bpf/slotring/prog_switch_btf failed: "),
            "{text}"
        );
        assert_eq!(text.matches("BPF_OBJ_PIN").count(), 1, "{text}");
        assert_eq!(text.matches(&os_error(libc::EEXIST)).count(), 1, "{text}");
        // The privilege hint and the step stay in our message.
        let e = BpfError::NoPrivilege {
            what: "creating map `lease`".into(),
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        let text = chain(&e);
        assert!(text.contains("creating map `lease`"), "{text}");
        assert!(text.contains("CAP_BPF"), "{text}");
        assert_eq!(text.matches(&os_error(libc::EPERM)).count(), 1, "{text}");
    }

    #[test]
    fn a_degraded_instance_reports_its_whole_reason_once() {
        let _g = crate::lease::tests::instances();
        let e = BpfError::NoBtf(aya::BtfError::FileError {
            path: "/sys/kernel/btf/vmlinux".into(),
            error: io::Error::from_raw_os_error(libc::ENOENT),
        });
        let bpf = crate::SlotringBpf::degraded(e);
        let report = bpf.verify(&[], crate::VerifyConfig::default()).unwrap();
        let crate::Verdict::Unverified { reason } = &report.verdict else {
            panic!("a degraded instance cannot verify: {report}");
        };
        assert!(reason.starts_with("kernel BTF unavailable: "), "{reason}");
        assert_eq!(
            reason.matches("/sys/kernel/btf/vmlinux").count(),
            1,
            "{reason}"
        );
        assert_eq!(
            reason.matches(&os_error(libc::ENOENT)).count(),
            1,
            "{reason}"
        );
    }
}
