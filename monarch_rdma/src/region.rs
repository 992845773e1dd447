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

use hyperactor::sync::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::RdmaError;

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
    /// A random secret of this registration: a peer that names the registration over
    /// a socket must present it (REG-3).
    pub key: u64,
    /// Where, in the owner's address space, the registration's [`Slot`] lies: a
    /// same-host peer reads it before a transfer to check that the registration is
    /// still live (REG-4). 0 when unknown (the check is then skipped).
    pub slot: u64,
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

    /// The byte offset of this (sub-)region inside its registration, given the
    /// registration's start address.
    pub fn offset_in(&self, start: u64) -> usize {
        (self.addr - start) as usize
    }

    /// Checks that a local buffer of `local` bytes matches this region, as every
    /// whole-region transfer needs.
    ///
    /// # Errors
    ///
    /// [`RdmaError::SizeMismatch`] unless `local == self.len`.
    pub fn check_len(&self, local: usize) -> Result<(), RdmaError> {
        if self.len != local {
            return Err(RdmaError::SizeMismatch {
                remote: self.len,
                local,
            });
        }
        Ok(())
    }
}

/// What a same-host peer reads to check a registration (REG-4): the registration's id
/// and extent while it is live; id 0 once it was deregistered. Slots live in memory
/// that is never freed, so reading a stale slot is always safe; a slot is reused only
/// under a new id.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Slot {
    /// The registration's id, 0 when the slot is free.
    pub id: AtomicU64,
    /// The registration's start address.
    pub addr: AtomicU64,
    /// The registration's length.
    pub len: AtomicU64,
}

impl Slot {
    /// The slot's contents as a peer sees them: `(id, addr, len)`.
    pub fn decode(bytes: &[u8; SLOT_BYTES]) -> (u64, u64, u64) {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        (word(0), word(1), word(2))
    }
}

/// The size of a [`Slot`] in bytes.
pub const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

/// How many slots are allocated at once.
const SLOTS_PER_BLOCK: usize = 256;

struct Entry {
    region: RemoteRegion,
    slot: &'static Slot,
    /// What keeps the memory alive (e.g. the Python object), dropped at deregistration.
    keepalive: Option<Box<dyn Any + Send + Sync>>,
    /// Whether the CPU can reach the memory (false for device memory, which only a
    /// device-aware path may copy).
    host: bool,
}

#[derive(Default)]
struct Table {
    entries: HashMap<u64, Entry>,
    free: Vec<&'static Slot>,
}

/// The memory this process registered, by id.
///
/// Invariants, besides REG-1 and REG-2 of the module docs:
///
/// - REG-3 (keys): every registration gets a random 64-bit key; [`Registry::lookup`]
///   refuses a request whose key differs, so a peer can only reach memory whose
///   handle it was given.
/// - REG-4 (slots): while registration `id` is live, its slot holds `id`, the start
///   address and the length; [`Registry::deregister`] sets the slot's id to 0 before
///   it returns and before the memory's keep-alive is dropped.
#[derive(Default)]
pub struct Registry {
    next_id: AtomicU64,
    table: Mutex<Table>,
    /// Called with each registration that ends (e.g. to release its device
    /// registration), after the slot is cleared and before the keep-alive is dropped.
    hooks: Mutex<Vec<fn(&RemoteRegion)>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({} regions)", self.len())
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// This process's registry, the one the transfer servers serve from.
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(Registry::new)
    }

    /// Registers `[addr, addr + len)` of this process's memory, in place. `keepalive`
    /// is kept until the registration ends (pass what owns the memory).
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
    pub unsafe fn register(
        &self,
        addr: u64,
        len: usize,
        keepalive: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<RemoteRegion, RdmaError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.insert(addr, len, keepalive, true) }
    }

    /// Registers device memory (e.g. CUDA) at device address `addr`: it gets an id, a
    /// key and a slot like host memory, but [`Registry::lookup`] refuses it, so a
    /// host-memory path never dereferences it.
    ///
    /// # Errors
    ///
    /// As [`Registry::register`].
    ///
    /// # Safety
    ///
    /// As [`Registry::register`], for the device memory.
    pub unsafe fn register_device(
        &self,
        addr: u64,
        len: usize,
        keepalive: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<RemoteRegion, RdmaError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.insert(addr, len, keepalive, false) }
    }

    /// # Safety
    ///
    /// As [`Registry::register`].
    unsafe fn insert(
        &self,
        addr: u64,
        len: usize,
        keepalive: Option<Box<dyn Any + Send + Sync>>,
        host: bool,
    ) -> Result<RemoteRegion, RdmaError> {
        if len == 0 {
            return Err(RdmaError::Empty);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut table = self.lock();
        let slot = match table.free.pop() {
            Some(slot) => slot,
            None => {
                let block: &'static [Slot] = Box::leak(
                    (0..SLOTS_PER_BLOCK)
                        .map(|_| Slot::default())
                        .collect::<Vec<_>>()
                        .into_boxed_slice(),
                );
                table.free.extend(block.iter().skip(1));
                &block[0]
            }
        };
        slot.addr.store(addr, Ordering::Relaxed);
        slot.len.store(len as u64, Ordering::Relaxed);
        slot.id.store(id, Ordering::Release);
        let region = RemoteRegion {
            pid: std::process::id(),
            id,
            addr,
            len,
            key: random_u64(),
            slot: std::ptr::from_ref(slot) as u64,
        };
        table.entries.insert(
            id,
            Entry {
                region,
                slot,
                keepalive,
                host,
            },
        );
        Ok(region)
    }

    /// Registers a slice that lives for the rest of the process.
    ///
    /// # Errors
    ///
    /// As [`Registry::register`].
    pub fn register_slice(&self, memory: &'static mut [u8]) -> Result<RemoteRegion, RdmaError> {
        // SAFETY: a 'static mutable borrow is valid for ever and nobody else holds it.
        unsafe { self.register(memory.as_mut_ptr() as u64, memory.len(), None) }
    }

    /// Forgets registration `id`; later transfers naming it are refused (REG-2, REG-4).
    /// Returns whether it was registered. The keep-alive is dropped after the table's
    /// lock is released.
    pub fn deregister(&self, id: u64) -> bool {
        let entry = {
            let mut table = self.lock();
            let Some(entry) = table.entries.remove(&id) else {
                return false;
            };
            entry.slot.id.store(0, Ordering::Release);
            table.free.push(entry.slot);
            entry
        };
        let hooks = self.hooks.lock().clone();
        for hook in hooks {
            hook(&entry.region);
        }
        drop(entry.keepalive);
        true
    }

    /// Calls `hook` with every registration that ends from now on (once per distinct
    /// hook), after peers can no longer reach it and before its memory is let go.
    pub fn on_deregister(&self, hook: fn(&RemoteRegion)) {
        let mut hooks = self.hooks.lock();
        if !hooks.iter().any(|h| std::ptr::fn_addr_eq(*h, hook)) {
            hooks.push(hook);
        }
    }

    /// The registration `id`, if it is still registered.
    pub fn get(&self, id: u64) -> Option<RemoteRegion> {
        self.lock().entries.get(&id).map(|e| e.region)
    }

    /// The registration `id`, checked against the key a peer presented (REG-3).
    ///
    /// # Errors
    ///
    /// [`RdmaError::Dropped`] if `id` is not registered (never, or no longer), or the
    /// key is wrong (a peer must not learn which ids exist); [`RdmaError::Refused`] for
    /// device memory (see [`Registry::register_device`]).
    pub fn lookup(&self, id: u64, key: u64) -> Result<RemoteRegion, RdmaError> {
        let table = self.lock();
        match table.entries.get(&id) {
            Some(entry) if entry.region.key == key && entry.host => Ok(entry.region),
            Some(entry) if entry.region.key == key => Err(RdmaError::Refused {
                pid: std::process::id(),
                message: "the buffer is in device (CUDA) memory, which this path cannot \
                          copy; between hosts that takes ibverbs with GPUDirect, so register \
                          a CPU copy of the tensor instead"
                    .into(),
            }),
            _ => Err(RdmaError::Dropped {
                pid: std::process::id(),
                id,
            }),
        }
    }

    /// Ends registration `id` if `key` is its key (a peer's drop request, REG-3).
    /// Returns whether it was registered; a wrong key looks like an unknown id.
    pub fn deregister_with_key(&self, id: u64, key: u64) -> bool {
        match self.get(id) {
            Some(region) if region.key == key => self.deregister(id),
            _ => false,
        }
    }

    /// How many regions are registered.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> hyperactor::sync::MutexGuard<'_, Table> {
        self.table.lock()
    }
}

/// 64 random bits from the kernel (falling back to the clock and a counter, which
/// only a broken kernel needs).
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the array.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n == 8 {
        return u64::from_ne_bytes(bytes);
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(17)
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
        let again = unsafe { registry.register(addr, 4096, None) }.unwrap();
        assert_ne!(again.id, region.id, "REG-2");
    }

    #[test]
    fn deregistration_hooks_run_once_per_ended_registration() {
        static ENDED: AtomicU64 = AtomicU64::new(0);
        fn hook(_: &RemoteRegion) {
            ENDED.fetch_add(1, Ordering::SeqCst);
        }
        let registry = Registry::new();
        registry.on_deregister(hook);
        registry.on_deregister(hook);
        let memory: &'static mut [u8] = Box::leak(vec![0u8; 8].into_boxed_slice());
        let region = registry.register_slice(memory).unwrap();
        assert!(!registry.deregister_with_key(region.id, region.key ^ 1));
        assert_eq!(ENDED.load(Ordering::SeqCst), 0);
        assert!(registry.deregister_with_key(region.id, region.key));
        assert!(!registry.deregister(region.id));
        assert_eq!(ENDED.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn empty_regions_and_bad_ranges_are_refused() {
        let registry = Registry::new();
        // SAFETY: nothing is ever accessed through a refused registration.
        let empty = unsafe { registry.register(0x1000, 0, None) };
        assert!(matches!(empty, Err(RdmaError::Empty)));
        let region = RemoteRegion {
            pid: 1,
            id: 1,
            addr: 0x1000,
            len: 100,
            key: 0,
            slot: 0,
        };
        assert_eq!(region.range(10, 90).unwrap().addr, 0x1000 + 10);
        let err = region.range(10, 91).unwrap_err();
        assert!(err.to_string().contains("100"), "{err}");
        assert!(region.range(usize::MAX, 2).is_err());
    }
}
