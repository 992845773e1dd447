//! Memory registrations with the device: the reference-counted cache of the process's
//! registrations, and a transfer's hold on the registration of its local buffer.

use super::*;

/// A registration of memory with the device.
#[derive(Debug)]
pub(super) struct CachedMr {
    pub(super) mr: *mut sys::ibv_mr,
    pub(super) start: u64,
    pub(super) len: usize,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    /// Registered with local and remote write access (read-only memory is registered
    /// for remote reads only).
    pub(super) writable: bool,
    /// Registrations ([`register`]) and transfers using it.
    pub(super) refs: usize,
}

/// The process's registrations, by an internal id, and the ids each registered
/// address holds (a stack: one entry per [`register`] call).
#[derive(Debug, Default)]
pub(super) struct MrCache {
    pub(super) next_id: u64,
    pub(super) mrs: HashMap<u64, CachedMr>,
    pub(super) handles: HashMap<u64, Vec<u64>>,
}

impl MrCache {
    /// A registration covering `[start, start + len)`, writable if `need_write`,
    /// preferring writable ones.
    pub(super) fn covering(&self, start: u64, len: usize, need_write: bool) -> Option<u64> {
        let end = start.checked_add(len as u64)?;
        let covers = |m: &CachedMr| {
            m.start <= start && m.start.checked_add(m.len as u64).is_some_and(|e| end <= e)
        };
        let mut best: Option<(u64, bool)> = None;
        for (id, m) in &self.mrs {
            if covers(m) && (m.writable || !need_write) && best.is_none_or(|(_, w)| !w) {
                best = Some((*id, m.writable));
            }
        }
        best.map(|(id, _)| id)
    }

    /// Adds a registration with one reference; returns its id.
    pub(super) fn insert(&mut self, mut mr: CachedMr) -> u64 {
        self.next_id += 1;
        mr.refs = 1;
        self.mrs.insert(self.next_id, mr);
        self.next_id
    }

    /// Takes a reference on `id`; its keys.
    pub(super) fn acquire(&mut self, id: u64) -> Option<(u32, u32)> {
        let m = self.mrs.get_mut(&id)?;
        m.refs += 1;
        Some((m.lkey, m.rkey))
    }

    /// Drops a reference on `id`; the registration to deregister when it was the last.
    pub(super) fn release(&mut self, id: u64) -> Option<CachedMr> {
        let m = self.mrs.get_mut(&id)?;
        m.refs = m.refs.saturating_sub(1);
        if m.refs == 0 {
            self.mrs.remove(&id)
        } else {
            None
        }
    }

    /// Records that address `addr` was registered through `id`.
    pub(super) fn push_handle(&mut self, addr: u64, id: u64) {
        self.handles.entry(addr).or_default().push(id);
    }

    /// Undoes the last registration of `addr`: `Some(last)` if there was one, with
    /// the registration to deregister when that was its last reference.
    pub(super) fn pop_handle(&mut self, addr: u64) -> Option<Option<CachedMr>> {
        let ids = self.handles.get_mut(&addr)?;
        let id = ids.pop()?;
        if ids.is_empty() {
            self.handles.remove(&addr);
        }
        Some(self.release(id))
    }
}

/// A transfer's hold on a registration of its local buffer.
#[derive(Debug)]
pub(super) struct LocalMr {
    pub(super) device: &'static Device,
    pub(super) lkey: u32,
    pub(super) kind: LocalKind,
}

#[derive(Debug)]
pub(super) enum LocalKind {
    /// A reference on a cached registration.
    Cached(u64),
    /// A registration for this transfer only.
    Temporary(CachedMr),
}

impl Drop for LocalMr {
    fn drop(&mut self) {
        match &self.kind {
            LocalKind::Cached(id) => {
                let last = self.device.mrs.lock().release(*id);
                if let Some(mr) = last {
                    self.device.dereg_mr(&mr);
                }
            }
            LocalKind::Temporary(mr) => self.device.dereg_mr(mr),
        }
    }
}
