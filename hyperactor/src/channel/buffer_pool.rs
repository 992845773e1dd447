//! Reuse of large receive buffers.
//!
//! Fresh memory is expensive: the first write to every page of it faults into
//! the kernel, which on virtual machines costs about ten times the copy itself
//! (some 30 ms for 64 MiB). A process that receives large frames would pay that
//! for every one. Instead the frame decoder reads a part of at least
//! [`POOLED_MIN`] bytes into an idle buffer from this pool when one fits, and
//! the part's [`Bytes`] hands the buffer back to the pool when its last clone is
//! dropped; the next large frame then lands in memory that is already mapped.
//!
//! The pool is bounded: it keeps at most [`pool_limit`] bytes of idle buffers
//! (the environment variable `HYPERACTOR_RECV_POOL_BYTES`, read once per
//! process; 256 MiB by default, `0` turns pooling off) and drops a buffer that
//! has been idle for [`IDLE_DROP`] the next time it is used. A buffer is only
//! reused for a part at least half its size, so one large frame does not pin a
//! large buffer under a stream of small ones.
//!
//! ```
//! use hyperactor::channel::buffer_pool;
//! let len = 4 * buffer_pool::POOLED_MIN;
//! let mut buf = buffer_pool::take(len).unwrap_or_else(|| Vec::with_capacity(len));
//! buf.resize(len, 7);
//! let part = buffer_pool::freeze(buf);
//! assert_eq!(part.len(), len);
//! drop(part); // back in the pool, unless pooling is off
//! ```

use crate::sync::StaticMutex;
use std::sync::OnceLock;
use std::time::Duration;
use std::time::Instant;

use bytes::Bytes;

/// Parts at least this long are read into pooled buffers.
pub const POOLED_MIN: usize = 1 << 20;

/// The default of [`pool_limit`]: 256 MiB.
pub const DEFAULT_POOL_LIMIT: usize = 256 << 20;

/// The environment variable that sets [`pool_limit`], in bytes.
pub const POOL_LIMIT_ENV: &str = "HYPERACTOR_RECV_POOL_BYTES";

/// An idle buffer unused for this long is dropped when the pool is next used.
pub const IDLE_DROP: Duration = Duration::from_secs(30);

/// The most bytes of idle buffers the pool keeps (see the [module docs](self)).
pub fn pool_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| match std::env::var(POOL_LIMIT_ENV) {
        Err(_) => DEFAULT_POOL_LIMIT,
        Ok(value) => value.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(
                "{POOL_LIMIT_ENV}={value:?} is not a number of bytes; \
                 using the default, {DEFAULT_POOL_LIMIT}"
            );
            DEFAULT_POOL_LIMIT
        }),
    })
}

struct Idle {
    buf: Vec<u8>,
    since: Instant,
}

struct Pool {
    idle: Vec<Idle>,
    bytes: usize,
}

impl Pool {
    const fn new() -> Self {
        Pool {
            idle: Vec::new(),
            bytes: 0,
        }
    }

    fn drop_stale(&mut self, now: Instant) {
        let bytes = &mut self.bytes;
        self.idle.retain(|i| {
            let keep = now.duration_since(i.since) < IDLE_DROP;
            if !keep {
                *bytes -= i.buf.capacity();
            }
            keep
        });
    }

    fn take(&mut self, len: usize, now: Instant) -> Option<Vec<u8>> {
        self.drop_stale(now);
        let best = self
            .idle
            .iter()
            .enumerate()
            .filter(|(_, i)| i.buf.capacity() >= len && i.buf.capacity() / 2 <= len)
            .min_by_key(|(_, i)| i.buf.capacity())
            .map(|(at, _)| at)?;
        let idle = self.idle.swap_remove(best);
        self.bytes -= idle.buf.capacity();
        Some(idle.buf)
    }

    fn give_back(&mut self, mut buf: Vec<u8>, limit: usize, now: Instant) {
        let cap = buf.capacity();
        if cap > limit {
            return;
        }
        buf.clear();
        self.drop_stale(now);
        // Make room by dropping the buffers idle the longest.
        while self.bytes + cap > limit && !self.idle.is_empty() {
            let oldest = (0..self.idle.len())
                .min_by_key(|&at| self.idle[at].since)
                .unwrap_or(0);
            let dropped = self.idle.swap_remove(oldest);
            self.bytes -= dropped.buf.capacity();
        }
        self.bytes += cap;
        self.idle.push(Idle { buf, since: now });
    }
}

static POOL: StaticMutex<Pool> = StaticMutex::new(Pool::new());

fn lock() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock()
}

/// An empty idle buffer with room for `len` bytes and at most twice that, if
/// the pool has one; `None` for parts under [`POOLED_MIN`].
pub fn take(len: usize) -> Option<Vec<u8>> {
    if len < POOLED_MIN || pool_limit() == 0 {
        return None;
    }
    lock().take(len, Instant::now())
}

/// `buf` as [`Bytes`] that give the buffer back to the pool when the last
/// clone is dropped (a buffer under [`POOLED_MIN`] is just converted).
pub fn freeze(buf: Vec<u8>) -> Bytes {
    if buf.capacity() < POOLED_MIN || pool_limit() == 0 {
        return Bytes::from(buf);
    }
    Bytes::from_owner(Pooled(buf))
}

/// The bytes of idle buffers the pool holds now.
pub fn idle_bytes() -> usize {
    lock().bytes
}

/// The owner behind a pooled part's [`Bytes`].
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        lock().give_back(buf, pool_limit(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(len: usize) -> Vec<u8> {
        vec![1u8; len]
    }

    #[test]
    fn a_part_gives_its_buffer_back_when_its_last_clone_drops() {
        let len = 3 * POOLED_MIN;
        let buf = filled(len);
        let ptr = buf.as_ptr();
        let part = freeze(buf);
        let clone = part.clone();
        drop(part);
        assert_eq!(clone.as_ptr(), ptr, "no copy");
        assert_eq!(&clone[..], &vec![1u8; len][..]);
        // Other tests use the global pool too: only what this one owns is checked.
        drop(clone);
        assert_eq!(take(POOLED_MIN - 1), None, "small parts are never pooled");
    }

    #[test]
    fn buffers_are_reused_only_when_they_fit() {
        let mut pool = Pool::new();
        let now = Instant::now();
        let len = 3 * POOLED_MIN;
        let buf = filled(len);
        let ptr = buf.as_ptr();
        pool.give_back(buf, DEFAULT_POOL_LIMIT, now);
        assert_eq!(pool.bytes, len);
        assert!(pool.take(len / 2 - 1, now).is_none(), "too large for it");
        assert!(pool.take(len + 1, now).is_none(), "too small for it");
        let again = pool.take(len, now).expect("the buffer given back");
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.is_empty() && again.capacity() >= len);
        assert_eq!(pool.bytes, 0);
    }

    #[test]
    fn the_pool_stays_under_its_limit_and_drops_stale_buffers() {
        let mut pool = Pool::new();
        let t0 = Instant::now();
        let len = 2 * POOLED_MIN;
        pool.give_back(filled(len), 3 * len, t0);
        pool.give_back(filled(len), 3 * len, t0 + Duration::from_secs(1));
        pool.give_back(filled(len), 3 * len, t0 + Duration::from_secs(2));
        pool.give_back(filled(len), 3 * len, t0 + Duration::from_secs(3));
        assert_eq!(pool.idle.len(), 3, "the oldest made room");
        assert!(pool.bytes <= 3 * len);
        assert!(pool.idle.iter().all(|i| i.since > t0));
        pool.give_back(filled(4 * len), 3 * len, t0);
        assert_eq!(pool.idle.len(), 3, "a buffer over the limit is not kept");
        let late = t0 + Duration::from_secs(2) + IDLE_DROP;
        assert!(pool.take(len, late).is_some());
        assert!(
            pool.idle.is_empty(),
            "stale buffers dropped: {}",
            pool.idle.len()
        );
        assert_eq!(pool.bytes, 0);
    }
}
