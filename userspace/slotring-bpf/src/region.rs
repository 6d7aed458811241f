//! Word-addressed memory shared with BPF: the mmapped value area of a
//! `BPF_F_MMAPABLE` array map, or plain heap memory when no probes are
//! loaded (the degraded mode keeps every counter working).
//!
//! This is the crate's only `unsafe`: mapping, viewing and unmapping map
//! memory.
//!
//! Memory ordering: the map memory is shared with BPF programs, which use
//! plain loads/stores (and `__sync_fetch_and_add` for histograms). Every
//! Rust access is a 64-bit atomic on an 8-aligned word, so neither side ever
//! sees a torn word. What each word's ordering means is documented where it
//! is used (`lease.rs`, `stats`).

use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

use crate::BpfError;

enum Backing {
    Mapped {
        ptr: NonNull<AtomicU64>,
        bytes: usize,
    },
    Heap(Box<[AtomicU64]>),
}

/// A fixed array of `entries` values of `words_per_entry` u64 words each.
pub(crate) struct Region {
    backing: Backing,
    words_per_entry: usize,
    entries: usize,
}

// SAFETY: the region is a block of `AtomicU64`s, which are Sync and Send;
// the raw pointer is only a handle to memory owned by this value.
unsafe impl Send for Region {}
// SAFETY: as above; all access goes through `&AtomicU64`.
unsafe impl Sync for Region {}

fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as usize
}

impl Region {
    /// Plain memory (degraded mode, or before any map exists).
    pub(crate) fn heap(words_per_entry: usize, entries: usize) -> Self {
        let v: Vec<AtomicU64> = (0..words_per_entry * entries)
            .map(|_| AtomicU64::new(0))
            .collect();
        Self {
            backing: Backing::Heap(v.into_boxed_slice()),
            words_per_entry,
            entries,
        }
    }

    /// Map the value area of an mmapable array map.
    pub(crate) fn map(
        name: &str,
        fd: BorrowedFd<'_>,
        words_per_entry: usize,
        entries: usize,
    ) -> Result<Self, BpfError> {
        let page = page_size();
        let bytes = (words_per_entry * 8 * entries).div_ceil(page) * page;
        let len = std::num::NonZeroUsize::new(bytes).expect("maps have at least one entry");
        // SAFETY: a fresh shared mapping of a BPF_F_MMAPABLE array map's fd;
        // the kernel checks the length against the map's value area, and we
        // only ever access it as `AtomicU64`s (the area is page aligned and
        // its values are 8-byte multiples, so every word is aligned).
        let ptr = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| BpfError::Mmap {
            map: name.to_owned(),
            source: e.into(),
        })?;
        Ok(Self {
            backing: Backing::Mapped {
                ptr: ptr.cast(),
                bytes,
            },
            words_per_entry,
            entries,
        })
    }

    /// Whether this is kernel map memory.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped { .. })
    }

    fn words(&self) -> &[AtomicU64] {
        match &self.backing {
            // SAFETY: `ptr` is a live mapping of at least `bytes` bytes (we
            // only unmap in `Drop`/`retire`, which take `self` by value or
            // &mut), page aligned, and `words_per_entry * entries * 8 <=
            // bytes`; AtomicU64 has the layout of u64 and any bit pattern is
            // valid.
            Backing::Mapped { ptr, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), self.words_per_entry * self.entries)
            },
            Backing::Heap(v) => v,
        }
    }

    /// The words of entry `i` (panics if out of range: callers check).
    pub(crate) fn entry(&self, i: usize) -> &[AtomicU64] {
        let w = self.words_per_entry;
        &self.words()[i * w..(i + 1) * w]
    }

    /// Load entry `i` word by word (`Relaxed`: statistics).
    pub(crate) fn load(&self, i: usize) -> Vec<u64> {
        self.entry(i)
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect()
    }

    /// Store entry `i` word by word (`Relaxed`: statistics).
    pub(crate) fn store(&self, i: usize, words: &[u64]) {
        for (dst, v) in self.entry(i).iter().zip(words) {
            dst.store(*v, Ordering::Relaxed);
        }
    }

    /// Detach from the map without invalidating the address: the range is
    /// replaced, atomically, by anonymous memory that is then leaked. Used for
    /// regions owned by a leaked `Shared` (lease slots and accounting): a
    /// thread that still holds a slot index (it learns of the drop at its
    /// next state change) writes into that memory instead of faulting, and
    /// the map loses its last reference once its fds close.
    pub(crate) fn retire(&self) {
        if let Backing::Mapped { ptr, bytes } = self.backing {
            let len = std::num::NonZeroUsize::new(bytes).expect("non-empty");
            let addr = std::num::NonZeroUsize::new(ptr.as_ptr() as usize).expect("non-null");
            // SAFETY: MAP_FIXED over exactly the range we mapped and own;
            // nothing else lives there. The new anonymous mapping is never
            // unmapped (the owner is leaked), so outstanding `&AtomicU64`s
            // into the range stay valid. If it fails the map simply stays
            // mapped (a leak, not a fault).
            let _ = unsafe {
                mmap_anonymous(
                    Some(addr),
                    len,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED,
                )
            };
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Backing::Mapped { ptr, bytes } = self.backing {
            // SAFETY: we own this mapping; `&self` borrows have ended because
            // we are being dropped.
            let _ = unsafe { munmap(ptr.cast(), bytes) };
        }
    }
}
