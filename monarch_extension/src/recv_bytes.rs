//! Message parts as Python objects, with large `bytes` and `bytearray` objects recycled.
//!
//! Python code receives every message part as a `bytes` object, except the out-of-band
//! buffers of a writable object (a NumPy array, a tensor), which arrive as `bytearray`s
//! so that what is rebuilt on them is writable, as with in-band pickles (see
//! [`payload_to_list`]). Either owns its storage, so a part is copied into one; for a
//! large part the copy is cheap (~3 ms for 64 MiB) but fresh memory is not: the first
//! write to each page of a new allocation faults, some ten times the copy's cost on
//! virtual machines. So objects of at least [`RECYCLE_MIN`] bytes made here are
//! remembered, and one that nobody else references any more (its reference count is
//! ours alone) is refilled for the next part of the same kind and length instead of
//! allocating another: it is unreachable from Python code, so the refill cannot be
//! observed. A recycled `bytes` object has its cached hash reset.
//!
//! The sending side uses the same pool: [`lend_bytearray`] gives Python a recycled
//! `bytearray` to snapshot a writable buffer into, which the message then shares.
//!
//! The pool never references more than [`pool_limit`] bytes (the same limit as the
//! channel's receive buffers, `HYPERACTOR_RECV_POOL_BYTES`), nor more than
//! [`MAX_ENTRIES`] objects; a free object unused for [`IDLE_DROP`] is released when the
//! pool is next used. Recycling `bytes` needs the layout of CPython 3.10 to 3.14 (the
//! hash stored just before the data); a check at first use turns it off elsewhere.

use hyperactor::sync::Mutex;
use std::sync::OnceLock;
use std::time::Instant;

use bytes::Bytes;
use hyperactor::channel::buffer_pool::pool_limit;
use hyperactor::channel::buffer_pool::IDLE_DROP;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList};

/// Parts at least this long become recycled objects.
pub(crate) const RECYCLE_MIN: usize = 1 << 20;

/// The most objects the pool references.
pub(crate) const MAX_ENTRIES: usize = 16;

/// The kind of an out-of-band buffer, in a payload's kinds part: read-only (arrives as
/// `bytes`) or writable (arrives as a `bytearray`).
pub(crate) const READ_ONLY: u8 = b'r';
/// See [`READ_ONLY`].
pub(crate) const WRITABLE: u8 = b'w';

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bytes,
    ByteArray,
}

struct Entry {
    obj: Py<PyAny>,
    kind: Kind,
    len: usize,
    since: Instant,
}

/// Only used with the GIL held; the mutex makes the static `Sync`.
static POOL: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// A free pooled object of `kind` and `len` bytes, taken (its `since` refreshed), or
/// `None`. The caller may rewrite its contents.
fn take_free(py: Python<'_>, kind: Kind, len: usize) -> Option<Bound<'_, PyAny>> {
    let mut pool = POOL.lock();
    let now = Instant::now();
    // Release free objects idle too long (dropping a `Py` with the GIL held frees now).
    pool.retain(|e| !(is_free(py, e) && now.duration_since(e.since) >= IDLE_DROP));
    let entry = pool
        .iter_mut()
        .find(|e| e.kind == kind && e.len == len && is_free(py, e))?;
    entry.since = now;
    Some(entry.obj.clone_ref(py).into_bound(py))
}

/// Remembers a new object, keeping the pool within its limits: the least recently used
/// go first (an object still in use stays alive for its other owners; the pool just
/// forgets it).
fn remember(obj: &Bound<'_, PyAny>, kind: Kind, len: usize) {
    let mut pool = POOL.lock();
    pool.push(Entry {
        obj: obj.clone().unbind(),
        kind,
        len,
        since: Instant::now(),
    });
    let limit = pool_limit();
    while pool.len() > MAX_ENTRIES || pool.iter().map(|e| e.len).sum::<usize>() > limit {
        let oldest = (0..pool.len())
            .min_by_key(|&at| pool[at].since)
            .unwrap_or(0);
        pool.swap_remove(oldest);
    }
}

fn recyclable(py: Python<'_>, len: usize) -> bool {
    len >= RECYCLE_MIN && len <= pool_limit() && layout_known(py)
}

/// Copies `src` into `dst` (`len` bytes), letting other Python threads run meanwhile.
///
/// # Safety
///
/// `dst` must be valid for `len` bytes of writes, and unreachable by any other code
/// until this returns.
unsafe fn fill(py: Python<'_>, dst: *mut u8, src: &[u8]) {
    let dst = dst as usize;
    py.detach(|| {
        // SAFETY: as the caller guarantees; `src` is borrowed for the whole copy.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
    });
}

/// `part` as a `bytes` object (see the [module docs](self)).
pub(crate) fn part_to_py<'py>(py: Python<'py>, part: &Bytes) -> Bound<'py, PyBytes> {
    let len = part.len();
    if !recyclable(py, len) {
        return PyBytes::new(py, part);
    }
    if let Some(obj) = take_free(py, Kind::Bytes, len) {
        // SAFETY: the object is a `bytes` of `len` bytes that no Python code can
        // reach: the pool held the only reference, and the second one is `obj`, not
        // yet returned. Its data and the hash cached before it (checked by
        // `layout_known`) are ours to rewrite.
        unsafe {
            let data = ffi::PyBytes_AsString(obj.as_ptr()).cast::<u8>();
            data.cast::<ffi::Py_hash_t>().sub(1).write_unaligned(-1);
            fill(py, data, part);
        }
        // SAFETY: only `bytes` objects are pooled as Kind::Bytes.
        return unsafe { obj.cast_into_unchecked() };
    }
    let obj = PyBytes::new(py, part);
    remember(obj.as_any(), Kind::Bytes, len);
    obj
}

/// `part` as a `bytearray` (recycled like [`part_to_py`]'s `bytes`).
pub(crate) fn part_to_bytearray<'py>(py: Python<'py>, part: &Bytes) -> Bound<'py, PyByteArray> {
    let len = part.len();
    if !recyclable(py, len) {
        return PyByteArray::new(py, part);
    }
    if let Some(obj) = take_free(py, Kind::ByteArray, len) {
        // SAFETY: a pooled `bytearray` of `len` bytes (never resized: no Python code
        // could reach it) that only this function references now.
        unsafe {
            let data = ffi::PyByteArray_AsString(obj.as_ptr()).cast::<u8>();
            fill(py, data, part);
            return obj.cast_into_unchecked();
        }
    }
    let obj = PyByteArray::new(py, part);
    remember(obj.as_any(), Kind::ByteArray, len);
    obj
}

/// A `bytearray` of `len` bytes with arbitrary contents, recycled when one is free:
/// for the sending side to snapshot a writable buffer into.
pub(crate) fn lend_bytearray(py: Python<'_>, len: usize) -> Bound<'_, PyByteArray> {
    if recyclable(py, len) {
        if let Some(obj) = take_free(py, Kind::ByteArray, len) {
            // SAFETY: only `bytearray` objects are pooled as Kind::ByteArray.
            return unsafe { obj.cast_into_unchecked() };
        }
        let obj = PyByteArray::new_with(py, len, |_| Ok(()))
            .unwrap_or_else(|_| PyByteArray::new(py, &vec![0u8; len]));
        remember(obj.as_any(), Kind::ByteArray, len);
        return obj;
    }
    PyByteArray::new(py, &vec![0u8; len])
}

/// Parts as a list of `bytes` (see [`part_to_py`]).
pub(crate) fn parts_to_list<'py>(py: Python<'py>, parts: &[Bytes]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, parts.iter().map(|p| part_to_py(py, p)))
}

/// A Python payload's parts as Python objects. A payload is a pickle, then, if it has
/// out-of-band buffers, a *kinds* part (one byte per buffer, [`READ_ONLY`] or
/// [`WRITABLE`]) and the buffers: read-only ones arrive as `bytes`, writable ones as
/// `bytearray`s. Anything else (one part, or parts whose second is not a kinds part for
/// the rest) arrives as `bytes` throughout.
pub(crate) fn payload_to_list<'py>(
    py: Python<'py>,
    parts: &[Bytes],
) -> PyResult<Bound<'py, PyList>> {
    let kinds = match parts.get(1) {
        Some(k)
            if parts.len() >= 3
                && k.len() == parts.len() - 2
                && k.iter().all(|b| *b == READ_ONLY || *b == WRITABLE) =>
        {
            k
        }
        _ => return parts_to_list(py, parts),
    };
    let list = PyList::empty(py);
    list.append(part_to_py(py, &parts[0]))?;
    list.append(part_to_py(py, kinds))?;
    for (part, kind) in parts[2..].iter().zip(kinds.iter()) {
        if *kind == WRITABLE {
            list.append(part_to_bytearray(py, part))?;
        } else {
            list.append(part_to_py(py, part))?;
        }
    }
    Ok(list)
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
