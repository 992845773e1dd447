//! Received message parts as Python `bytes`, with large `bytes` objects recycled.
//!
//! Python code receives every message part as a `bytes` object: the pickle, and each
//! out-of-band buffer, which unpickles to the very `bytes` object the sender passed.
//! A `bytes` object owns its storage, so a part is copied into one; for a large part
//! the copy is cheap (~3 ms for 64 MiB) but fresh memory is not: the first write to
//! each page of a new allocation faults, some ten times the copy's cost on virtual
//! machines. So `bytes` objects of at least [`RECYCLE_MIN`] bytes made here are
//! remembered, and one that nobody else references any more (its reference count is
//! ours alone) is refilled for the next part of the same length instead of allocating
//! another: it is unreachable from Python code, so the refill cannot be observed. Its
//! cached hash is reset with it.
//!
//! The pool never references more than [`pool_limit`] bytes (the same limit as the
//! channel's receive buffers, `HYPERACTOR_RECV_POOL_BYTES`), nor more than
//! [`MAX_ENTRIES`] objects; a free object unused for [`IDLE_DROP`] is released when the
//! pool is next used. Recycling needs the `bytes` layout of CPython 3.10 to 3.14 (the
//! hash stored just before the data); a check at first use turns it off elsewhere.

use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Instant;

use bytes::Bytes;
use hyperactor::channel::buffer_pool::pool_limit;
use hyperactor::channel::buffer_pool::IDLE_DROP;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// Parts at least this long become recycled `bytes` objects.
pub(crate) const RECYCLE_MIN: usize = 1 << 20;

/// The most `bytes` objects the pool references.
pub(crate) const MAX_ENTRIES: usize = 8;

struct Entry {
    obj: Py<PyBytes>,
    len: usize,
    since: Instant,
}

/// Only used with the GIL held; the mutex makes the static `Sync`.
static POOL: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// `part` as a `bytes` object (see the [module docs](self)).
pub(crate) fn part_to_py<'py>(py: Python<'py>, part: &Bytes) -> Bound<'py, PyBytes> {
    let len = part.len();
    if len < RECYCLE_MIN || len > pool_limit() || !layout_known(py) {
        return PyBytes::new(py, part);
    }
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    // Release free objects idle too long (dropping a `Py` with the GIL held frees now).
    pool.retain(|e| !(is_free(py, e) && now.duration_since(e.since) >= IDLE_DROP));
    if let Some(entry) = pool.iter_mut().find(|e| e.len == len && is_free(py, e)) {
        entry.since = now;
        let obj = entry.obj.clone_ref(py).into_bound(py);
        drop(pool);
        // SAFETY: the object is a `bytes` of `len` bytes that no Python code can
        // reach: the pool held the only reference, and the second one is `obj`, not
        // yet returned. Its data and the hash cached before it (checked by
        // `layout_known`) are ours to rewrite.
        unsafe {
            let data = ffi::PyBytes_AsString(obj.as_ptr()).cast::<u8>();
            data.cast::<ffi::Py_hash_t>().sub(1).write_unaligned(-1);
            let dst = data as usize;
            // The copy of a large part lets other Python threads run.
            py.detach(|| {
                std::ptr::copy_nonoverlapping(part.as_ptr(), dst as *mut u8, len);
            });
        }
        return obj;
    }
    let obj = PyBytes::new(py, part);
    pool.push(Entry {
        obj: obj.clone().unbind(),
        len,
        since: now,
    });
    // Keep within the limits, releasing the least recently used first (an object
    // still in use stays alive for its other owners; the pool just forgets it).
    let limit = pool_limit();
    while pool.len() > MAX_ENTRIES || pool.iter().map(|e| e.len).sum::<usize>() > limit {
        let oldest = (0..pool.len())
            .min_by_key(|&at| pool[at].since)
            .unwrap_or(0);
        pool.swap_remove(oldest);
    }
    obj
}

/// Parts as a list of `bytes` (see [`part_to_py`]).
pub(crate) fn parts_to_list<'py>(py: Python<'py>, parts: &[Bytes]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, parts.iter().map(|p| part_to_py(py, p)))
}

fn is_free(_py: Python<'_>, entry: &Entry) -> bool {
    // SAFETY: the pool's reference keeps the object alive; the GIL is held.
    unsafe { ffi::Py_REFCNT(entry.obj.as_ptr()) == 1 }
}

/// Whether `bytes` objects store their length two words and their hash one word
/// before their data, as CPython 3.10 to 3.14 do; checked once, on a probe object.
fn layout_known(py: Python<'_>) -> bool {
    static KNOWN: OnceLock<bool> = OnceLock::new();
    *KNOWN.get_or_init(|| {
        let probe = PyBytes::new(py, b"monarch: the layout of bytes objects");
        let Ok(hash) = probe.hash() else {
            return false;
        };
        // SAFETY: reads two words inside the object's header, before its data.
        unsafe {
            let data = ffi::PyBytes_AsString(probe.as_ptr()).cast::<ffi::Py_ssize_t>();
            let stored_hash = data.sub(1).read_unaligned();
            let stored_len = data.sub(2).read_unaligned();
            stored_hash == hash && stored_len == probe.as_bytes().len() as ffi::Py_ssize_t
        }
    })
}
