//! Where queued requests wait for their dispatch: a slab of [`Slot`]s
//! indexed by request id.
//!
//! # Model
//!
//! A request id is `generation << 32 | index`: `index` names an entry of
//! the slab, `generation` counts that entry's reuses, so an id is unique
//! for as long as the entry's generation does not wrap (2³² reuses of one
//! entry), and a stale id finds nothing. A freed entry is the next one
//! handed out (last in, first out): a scheduler that queues and dispatches
//! at the same pace reuses one warm entry instead of touching a cold one,
//! and nothing allocates once the slab has held its largest queue.

use super::Slot;

/// One line each (the slot is 48 bytes: an error is boxed), so reaching a
/// request's slot is one cache miss, not two.
#[derive(Debug)]
#[repr(align(64))]
struct Entry {
    generation: u32,
    slot: Option<Slot>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Slots {
    entries: Vec<Entry>,
    free: Vec<u32>,
}

fn split(id: u64) -> (u32, usize) {
    ((id >> 32) as u32, (id & u64::from(u32::MAX)) as usize)
}

impl Slots {
    /// Store `slot` under a new id.
    pub(super) fn insert(&mut self, slot: Slot) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.entries.len()).expect("fewer than 2³² queued requests");
                self.entries.push(Entry {
                    generation: 0,
                    slot: None,
                });
                i
            }
        };
        let e = &mut self.entries[index as usize];
        e.slot = Some(slot);
        (u64::from(e.generation) << 32) | u64::from(index)
    }

    fn entry(&self, id: u64) -> Option<&Entry> {
        let (generation, index) = split(id);
        self.entries
            .get(index)
            .filter(|e| e.generation == generation)
    }

    fn entry_mut(&mut self, id: u64) -> Option<&mut Entry> {
        let (generation, index) = split(id);
        self.entries
            .get_mut(index)
            .filter(|e| e.generation == generation)
    }

    /// The slot of request `id`.
    pub(super) fn get(&self, id: u64) -> Option<&Slot> {
        self.entry(id)?.slot.as_ref()
    }

    /// The slot of request `id`, to change.
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Slot> {
        self.entry_mut(id)?.slot.as_mut()
    }

    /// Put `slot` in request `id`'s place (which it keeps); the slot it
    /// replaces (`None`, changing nothing: no such request).
    pub(super) fn replace(&mut self, id: u64, slot: Slot) -> Option<Slot> {
        let e = self.entry_mut(id)?;
        e.slot.as_mut().map(|s| std::mem::replace(s, slot))
    }

    /// Take request `id`'s slot out; its id is never valid again.
    pub(super) fn remove(&mut self, id: u64) -> Option<Slot> {
        let e = self.entry_mut(id)?;
        let slot = e.slot.take()?;
        e.generation = e.generation.wrapping_add(1);
        self.free.push(split(id).1 as u32);
        Some(slot)
    }

    /// Every request and its slot.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Slot)> {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            let s = e.slot.as_ref()?;
            Some(((u64::from(e.generation) << 32) | i as u64, s))
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::workload::WorkloadError;

    fn failed(name: &str) -> Slot {
        Slot::Failed(Box::new(WorkloadError::Unknown {
            node: name.to_owned(),
        }))
    }

    fn name(s: Option<&Slot>) -> Option<&str> {
        match s {
            Some(Slot::Failed(e)) => match &**e {
                WorkloadError::Unknown { node } => Some(node),
                _ => None,
            },
            _ => None,
        }
    }

    #[test]
    fn a_removed_id_finds_nothing_even_when_its_entry_is_reused() {
        let mut s = Slots::default();
        let a = s.insert(failed("a"));
        let b = s.insert(failed("b"));
        assert_ne!(a, b);
        assert_eq!(name(s.get(a)), Some("a"));
        assert_eq!(name(s.remove(a).as_ref()), Some("a"));
        assert!(s.get(a).is_none());
        assert!(s.remove(a).is_none(), "removed once only");
        let c = s.insert(failed("c"));
        assert_eq!(
            c & 0xffff_ffff,
            a & 0xffff_ffff,
            "the freed entry is reused"
        );
        assert_ne!(c, a, "under a new id");
        assert!(s.get(a).is_none() && s.replace(a, failed("x")).is_none());
        assert_eq!(name(s.replace(c, failed("d")).as_ref()), Some("c"));
        assert_eq!(name(s.get(c)), Some("d"));
        let mut ids: Vec<u64> = s.iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        let mut want = vec![b, c];
        want.sort_unstable();
        assert_eq!(ids, want);
    }
}
