//! Rate limits for log lines that peers can trigger.
//!
//! A peer that sends malformed frames, or many connections that fail, must
//! not be able to flood the logs. Every such log line goes through a
//! [`LogLimit`], a process-wide `static` per kind of line: it lets one line
//! through per interval (one second for [`LogLimit::per_second`]) and counts
//! the lines it holds back, and the next line that passes reports that count,
//! so nothing is hidden, only summarised.
//!
//! Invariant: between two lines that pass, at least the limit's interval
//! went by; the count a passing line reports is exactly the number of lines
//! held back since the previous one.
//!
//! ```
//! use hyperactor::channel::log_limit::LogLimit;
//!
//! static BAD_FRAME: LogLimit = LogLimit::per_second();
//! if let Some(suppressed) = BAD_FRAME.check() {
//!     tracing::warn!(suppressed, "closing a connection that sent a malformed frame");
//! }
//! ```

use crate::sync::StaticMutex;
use std::time::Duration;

use tokio::time::Instant;

/// Lets one log line of a kind through per interval; see the [module docs](self).
#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    state: StaticMutex<State>,
}

#[derive(Debug)]
struct State {
    /// When the last line passed; `None` before the first.
    last: Option<Instant>,
    /// Lines held back since then.
    suppressed: u64,
}

impl LogLimit {
    /// A limit of one line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        LogLimit {
            interval,
            state: StaticMutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// A limit of one line per second.
    pub const fn per_second() -> Self {
        Self::new(Duration::from_secs(1))
    }

    /// Whether a line may be logged now. `Some(n)`: log it, and say that `n`
    /// lines were held back since the last one; `None`: skip it (it is
    /// counted).
    pub fn check(&self) -> Option<u64> {
        self.check_at(Instant::now())
    }

    /// As [`LogLimit::check`], at the time `now` (for tests; the time may
    /// only move forward).
    pub fn check_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock();
        let due = match state.last {
            None => true,
            Some(last) => now.saturating_duration_since(last) >= self.interval,
        };
        if !due {
            state.suppressed += 1;
            return None;
        }
        state.last = Some(now);
        Some(std::mem::take(&mut state.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_passes_then_one_per_interval() {
        let limit = LogLimit::per_second();
        let t0 = Instant::now();
        assert_eq!(limit.check_at(t0), Some(0));
        for ms in [0, 1, 500, 999] {
            assert_eq!(limit.check_at(t0 + Duration::from_millis(ms)), None, "{ms}");
        }
        // The next line reports the four held back, and restarts the interval.
        assert_eq!(limit.check_at(t0 + Duration::from_secs(1)), Some(4));
        assert_eq!(limit.check_at(t0 + Duration::from_millis(1500)), None);
        assert_eq!(limit.check_at(t0 + Duration::from_millis(1999)), None);
        assert_eq!(limit.check_at(t0 + Duration::from_secs(2)), Some(2));
        // After a quiet spell, a line passes at once and reports nothing.
        assert_eq!(limit.check_at(t0 + Duration::from_secs(60)), Some(0));
    }

    #[test]
    fn a_flood_passes_one_line_per_interval() {
        let limit = LogLimit::new(Duration::from_millis(100));
        let t0 = Instant::now();
        let mut passed = Vec::new();
        // 10,000 lines over 1 s (one every 100 µs).
        for i in 0..10_000u64 {
            if let Some(n) = limit.check_at(t0 + Duration::from_micros(100 * i)) {
                passed.push(n);
            }
        }
        assert_eq!(passed.len(), 10, "{passed:?}");
        assert_eq!(passed[0], 0);
        assert!(passed[1..].iter().all(|&n| n == 999), "{passed:?}");
        // Every line is accounted for: passed, reported as held back, or held
        // back since the last one passed (999, reported by the next).
        assert_eq!(
            passed.len() as u64 + passed.iter().sum::<u64>() + 999,
            10_000
        );
        assert_eq!(
            limit.check_at(t0 + Duration::from_secs(1)),
            Some(999),
            "the next line reports the rest"
        );
    }

    #[test]
    fn time_going_backwards_is_no_new_interval() {
        let limit = LogLimit::per_second();
        let t0 = Instant::now() + Duration::from_secs(10);
        assert_eq!(limit.check_at(t0), Some(0));
        assert_eq!(limit.check_at(t0 - Duration::from_secs(5)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn check_follows_the_runtime_clock() {
        let limit = LogLimit::per_second();
        assert_eq!(limit.check(), Some(0));
        assert_eq!(limit.check(), None);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(limit.check(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(limit.check(), Some(2));
    }

    #[test]
    fn one_limit_is_shared_by_threads() {
        static LIMIT: LogLimit = LogLimit::per_second();
        let passed: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).filter(|_| LIMIT.check().is_some()).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap() as u64).sum()
        });
        // 4,000 lines in (much) less than a second on any machine this runs on;
        // even a slow one lets through at most a handful.
        assert!((1..=5).contains(&passed), "{passed} lines passed");
    }
}
