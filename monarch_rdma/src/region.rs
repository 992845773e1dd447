//! Registered memory: a region of this process's memory, registered in place, and the
//! small reference to it that other processes use.
//!
//! Registering costs no copy and no system call: a [`Registry`] records the address
//! and length under a fresh id and hands back a [`RemoteRegion`], which is all a peer
//! needs to read or write the memory with a one-sided backend (see [`crate::cma`]).
//!
//! Invariants:
//!
//! - REG-1 (caller keeps the memory): the registry never owns the memory. The caller of
//!   [`Registry::register`] guarantees that `[addr, addr + len)` stays valid until it
//!   calls [`Registry::deregister`]; the safe entry point [`Registry::register_slice`]
//!   asks for a `'static` mutable slice for that reason (Python buffers are kept alive
//!   by the object that registered them).
//! - REG-2 (ids are never reused): a deregistered id is unknown for ever, so a stale
//!   [`RemoteRegion`] is refused rather than reaching memory registered later.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::RdmaError;

/// A reference to memory registered by some process: what it pickles or serializes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteRegion {
    /// The owner's process id (on the owner's host).
    pub pid: u32,
    /// The registration id, unique within the owner process (REG-2).
    pub id: u64,
    /// The start address, in the owner's address space.
    pub addr: u64,
    /// The length in bytes.
    pub len: usize,
}

impl RemoteRegion {
    /// The sub-range `[offset, offset + len)` of this region.
    ///
    /// # Errors
    ///
    /// [`RdmaError::OutOfRange`] if the range does not fit in the region.
    pub fn range(&self, offset: usize, len: usize) -> Result<Self, RdmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Self {
                addr: self.addr + offset as u64,
                len,
                ..*self
            }),
            _ => Err(RdmaError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }
}

/// The memory this process registered, by id.
#[derive(Debug, Default)]
pub struct Registry {
    next_id: AtomicU64,
    regions: Mutex<HashMap<u64, RemoteRegion>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `[addr, addr + len)` of this process's memory, in place.
    ///
    /// # Errors
    ///
    /// [`RdmaError::Empty`] for a zero-length region (there is nothing to transfer;
    /// upstream Monarch refuses it too).
    ///
    /// # Safety
    ///
    /// The memory must stay valid, and must only be accessed in ways that tolerate
    /// concurrent one-sided reads and writes by peers, until [`Registry::deregister`]
    /// (REG-1).
    pub unsafe fn register(&self, addr: u64, len: usize) -> Result<RemoteRegion, RdmaError> {
        if len == 0 {
            return Err(RdmaError::Empty);
        }
        let region = RemoteRegion {
            pid: std::process::id(),
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            addr,
            len,
        };
        self.lock().insert(region.id, region);
        Ok(region)
    }

    /// Registers a slice that lives for the rest of the process.
    ///
    /// # Errors
    ///
    /// As [`Registry::register`].
    pub fn register_slice(&self, memory: &'static mut [u8]) -> Result<RemoteRegion, RdmaError> {
        // SAFETY: a 'static mutable borrow is valid for ever and nobody else holds it.
        unsafe { self.register(memory.as_mut_ptr() as u64, memory.len()) }
    }

    /// Forgets registration `id`; later transfers naming it are refused (REG-2).
    /// Returns whether it was registered.
    pub fn deregister(&self, id: u64) -> bool {
        self.lock().remove(&id).is_some()
    }

    /// The registration `id`, if it is still registered.
    pub fn get(&self, id: u64) -> Option<RemoteRegion> {
        self.lock().get(&id).copied()
    }

    /// How many regions are registered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, RemoteRegion>> {
        self.regions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_is_in_place_and_ids_are_never_reused() {
        let registry = Registry::new();
        let memory: &'static mut [u8] = Box::leak(vec![7u8; 4096].into_boxed_slice());
        let addr = memory.as_ptr() as u64;
        let region = registry.register_slice(memory).unwrap();
        assert_eq!((region.addr, region.len), (addr, 4096));
        assert_eq!(region.pid, std::process::id());
        assert_eq!(registry.get(region.id), Some(region));
        assert!(registry.deregister(region.id));
        assert!(!registry.deregister(region.id));
        assert_eq!(registry.get(region.id), None);
        // SAFETY: the memory is leaked, so valid for ever.
        let again = unsafe { registry.register(addr, 4096) }.unwrap();
        assert_ne!(again.id, region.id, "REG-2");
    }

    #[test]
    fn empty_regions_and_bad_ranges_are_refused() {
        let registry = Registry::new();
        // SAFETY: nothing is ever accessed through a refused registration.
        let empty = unsafe { registry.register(0x1000, 0) };
        assert!(matches!(empty, Err(RdmaError::Empty)));
        let region = RemoteRegion {
            pid: 1,
            id: 1,
            addr: 0x1000,
            len: 100,
        };
        assert_eq!(region.range(10, 90).unwrap().addr, 0x1000 + 10);
        let err = region.range(10, 91).unwrap_err();
        assert!(err.to_string().contains("100"), "{err}");
        assert!(region.range(usize::MAX, 2).is_err());
    }
}
