//! Rate-limited warnings for bad input: a peer that sends garbage must not flood the
//! logs. A [`RateLimited`] logs at most one line per [`INTERVAL`]; the next line it logs
//! says how many it suppressed in between.
//!
//! ```
//! use hyperactor_mesh::rate_limit::RateLimited;
//!
//! static BAD_INPUT: RateLimited = RateLimited::new();
//! BAD_INPUT.warn(format_args!("dropping a malformed message"));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// At most one line per this interval, per [`RateLimited`].
pub const INTERVAL: Duration = Duration::from_secs(1);

/// A source of rate-limited warnings: see the [module docs](self).
#[derive(Debug)]
pub struct RateLimited {
    /// When the last line was logged, in nanoseconds since [`epoch`] (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Default for RateLimited {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimited {
    /// A source that has logged nothing yet.
    pub const fn new() -> Self {
        Self {
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged at `now` (nanoseconds since the epoch, at least 1);
    /// if so, returns how many were suppressed since the last one.
    fn admit(&self, now: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let interval = INTERVAL.as_nanos() as u64;
        if last != 0 && now.saturating_sub(last) < interval {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }

    /// Logs `message` as a warning, unless a line was logged less than [`INTERVAL`] ago.
    pub fn warn(&self, message: std::fmt::Arguments<'_>) {
        let now = (Instant::now() - epoch()).as_nanos() as u64 + 1;
        if let Some(suppressed) = self.admit(now) {
            if suppressed > 0 {
                tracing::warn!("{message} ({suppressed} similar messages suppressed)");
            } else {
                tracing::warn!("{message}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_a_count_of_the_rest() {
        let limiter = RateLimited::new();
        let second = INTERVAL.as_nanos() as u64;
        assert_eq!(limiter.admit(1), Some(0));
        for i in 0..10 {
            assert_eq!(limiter.admit(2 + i), None);
        }
        assert_eq!(limiter.admit(1 + second), Some(10));
        assert_eq!(limiter.admit(2 + second), None);
    }
}
