//! The shape of a cast tree: how a list of receivers is cut into chunks, and which
//! receivers each node relays to.
//!
//! A cast to `n` receivers (in view order) is cut into at most `fanout` contiguous
//! chunks whose sizes differ by at most one (larger first). The first receiver of a
//! chunk, its *head*, gets the message for the whole chunk and does the same with the
//! rest of it, so the tree has depth about `log_fanout(n)` and no node sends more than
//! `fanout` copies.
//!
//! ```
//! use hyperactor_mesh::cast::tree::{chunks, subtree_ends};
//!
//! assert_eq!(chunks(10, 4), vec![0..3, 3..6, 6..8, 8..10]);
//! // Receiver 0 heads 0..3 and relays to 1 and 2, each a subtree of one.
//! assert_eq!(&subtree_ends(10, 4)[..3], &[3, 2, 3]);
//! ```

use std::ops::Range;

/// The chunks a list of `n` receivers is cut into: at most `fanout` (0 counts as 1),
/// contiguous, sizes differing by at most one (larger first).
pub fn chunks(n: usize, fanout: usize) -> Vec<Range<usize>> {
    let k = n.min(fanout.max(1));
    if k == 0 {
        return Vec::new();
    }
    let (base, extra) = (n / k, n % k);
    let mut start = 0;
    (0..k)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// For each position of a cast's receiver list, the end (exclusive) of the subtree it
/// heads: the receivers whose message travels through it are `pos..ends[pos]`.
pub fn subtree_ends(n: usize, fanout: usize) -> Vec<u32> {
    fn layout(range: Range<usize>, fanout: usize, ends: &mut [u32]) {
        for chunk in chunks(range.len(), fanout) {
            let (start, end) = (range.start + chunk.start, range.start + chunk.end);
            ends[start] = end as u32;
            layout(start + 1..end, fanout, ends);
        }
    }
    let mut ends = vec![0; n];
    layout(0..n, fanout, &mut ends);
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_balanced_and_contiguous() {
        assert_eq!(chunks(0, 4), Vec::<Range<usize>>::new());
        assert_eq!(chunks(3, 16), vec![0..1, 1..2, 2..3]);
        assert_eq!(chunks(10, 4), vec![0..3, 3..6, 6..8, 8..10]);
        assert_eq!(chunks(5, 0), vec![0..5], "fan-out 0 is treated as 1");
    }

    #[test]
    fn every_receiver_is_in_exactly_the_subtrees_of_its_ancestors() {
        for n in 0..40 {
            for fanout in 1..6 {
                let ends = subtree_ends(n, fanout);
                for (pos, &end) in ends.iter().enumerate() {
                    assert!(end as usize > pos && end as usize <= n, "n={n} f={fanout}");
                }
            }
        }
    }
}
