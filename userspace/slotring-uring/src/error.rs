//! The one error type of this crate.

use std::io;

use slotring_throttle::ThrottleError;

use crate::policy::Op;

/// What can go wrong in the engines. Being throttled is not an error.
///
/// Each message says what failed and with which value; the kernel's answer
/// is the `source` (printed once by `{:#}` or an error-chain reporter, never
/// formatted into the message as well).
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// io_uring cannot be used here; `cause` names why (use [`crate::PreadEngine`]).
    #[error("io_uring is unavailable: {cause}")]
    Unavailable {
        /// Why (`io_uring_disabled` sysctl, seccomp/LSM `EPERM`, old kernel, …).
        cause: &'static str,
        /// The error `io_uring_setup` returned.
        source: io::Error,
    },
    /// The request was cancelled (dropped future, [`crate::UringEngine::cancel`],
    /// or an `-ECANCELED` completion).
    #[error("request cancelled")]
    Cancelled,
    /// A read or write failed.
    #[error("{op} of {len} bytes at offset {offset} failed")]
    Io {
        /// Which operation.
        op: Op,
        /// File offset of the failing piece.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The kernel's answer.
        source: io::Error,
    },
    /// A write failed after `written` of its `len` bytes had reached the
    /// file (those are in the file and counted in `write_bytes`; nothing
    /// after them is).
    #[error("write of {len} bytes to {file} failed at offset {offset}, {written} bytes written")]
    Write {
        /// The file, as the kernel names it (or `fd N`).
        file: String,
        /// File offset where the write stopped (the request's offset plus
        /// `written`).
        offset: u64,
        /// Bytes the request asked to write.
        len: u64,
        /// Bytes written before the failure.
        written: u64,
        /// The kernel's answer (`ENOSPC`, `EIO`, `WriteZero` for a write
        /// that moved nothing, ...).
        source: io::Error,
    },
    /// A ring syscall (`io_uring_enter`, `io_uring_register`) failed.
    #[error("{what} failed")]
    Ring {
        /// Which call.
        what: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Charging the throttle chain failed (lifetime limit, overflow, …).
    #[error(transparent)]
    Throttle(#[from] ThrottleError),
    /// A combination of configuration flags that cannot work together.
    #[error("invalid {what}: {flags}")]
    InvalidFlags {
        /// Which combination.
        what: &'static str,
        /// The offending flags and their values, e.g.
        /// `"defer_taskrun=true single_issuer=false"`.
        flags: String,
    },
    /// A ticket that cannot be waited on: the request was abandoned
    /// ([`crate::UringEngine::abandon`]) or already collected.
    #[error("ticket of slot {index} (generation {generation}) is {why}")]
    Ticket {
        /// The ticket's slot index.
        index: u32,
        /// The ticket's slot generation.
        generation: u32,
        /// `"abandoned"`, or `"not live (collected, or abandoned and released)"`.
        why: &'static str,
    },
    /// Bad input.
    #[error("invalid {what}: {value}")]
    Invalid {
        /// What was invalid.
        what: &'static str,
        /// The rejected value.
        value: u64,
    },
}

impl UringError {
    /// Classify an `io_uring_setup` failure.
    pub(crate) fn unavailable(source: io::Error) -> Self {
        let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        let cause = match (source.raw_os_error(), disabled) {
            (Some(libc::EPERM), Some(2)) => "sysctl kernel.io_uring_disabled=2",
            (Some(libc::EPERM), Some(1)) => {
                "sysctl kernel.io_uring_disabled=1 and the process is not in kernel.io_uring_group"
            }
            (Some(libc::EPERM), _) => "io_uring_setup denied (seccomp or an LSM)",
            (Some(libc::ENOSYS), _) => "kernel without io_uring (too old or CONFIG_IO_URING=n)",
            (Some(libc::EINVAL), _) => "a setup flag is not supported by this kernel",
            (Some(libc::ENOMEM), _) => "no memory for the ring (RLIMIT_MEMLOCK?)",
            _ => "io_uring_setup failed",
        };
        UringError::Unavailable { cause, source }
    }

    /// A write of `len` bytes at `offset` to `file` that failed with
    /// `source` after `written` bytes.
    pub(crate) fn write(
        file: &crate::file::UringFile,
        offset: u64,
        len: u64,
        written: u64,
        source: io::Error,
    ) -> Self {
        UringError::Write {
            file: file.name(),
            offset: offset + written,
            len,
            written,
            source,
        }
    }

    /// Whether this is [`UringError::Cancelled`].
    pub fn is_cancelled(&self) -> bool {
        matches!(self, UringError::Cancelled)
    }
}

/// tokio-uring's `BufResult`: the result and the buffer, which is always handed back.
pub type BufResult<T, B> = (Result<T, UringError>, B);

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    /// Every message of `e`'s chain, outermost first (what `{:#}` prints).
    fn chain(e: &UringError) -> Vec<String> {
        let mut out = Vec::new();
        let mut next: Option<&dyn Error> = Some(e);
        while let Some(e) = next {
            out.push(e.to_string());
            next = e.source();
        }
        out
    }

    #[test]
    fn the_os_error_is_printed_once_as_the_source() {
        let os = io::Error::from_raw_os_error(libc::EIO).to_string();
        let io = UringError::Io {
            op: Op::Read,
            offset: 4096,
            len: 512,
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        assert_eq!(
            chain(&io),
            ["read of 512 bytes at offset 4096 failed", os.as_str()]
        );
        let ring = UringError::Ring {
            what: "io_uring_enter",
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        assert_eq!(chain(&ring), ["io_uring_enter failed", os.as_str()]);
        let setup = UringError::unavailable(io::Error::from_raw_os_error(libc::ENOSYS));
        let msgs = chain(&setup);
        assert_eq!(
            msgs[0],
            "io_uring is unavailable: kernel without io_uring (too old or CONFIG_IO_URING=n)"
        );
        assert_eq!(
            msgs.iter()
                .filter(|m| m.contains(&io::Error::from_raw_os_error(libc::ENOSYS).to_string()))
                .count(),
            1
        );
    }
}
