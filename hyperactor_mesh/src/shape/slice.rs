//! [`Slice`]: an n-dimensional strided view of a space of global ranks.
//!
//! A slice maps each local coordinate `(c_0, ..., c_{n-1})`, with `c_i < sizes[i]`, to
//! the global rank `offset + sum(c_i * strides[i])`. Local indices enumerate the
//! coordinates in row-major order (the last dimension varies fastest), so a dense slice
//! ([`Slice::new_row_major`]) maps local index `i` to global rank `offset + i`.
//!
//! Invariants: one stride per size; strides are at least 1; a slice with ranks has its
//! number of ranks and its largest rank within `usize`. Slices made by selecting,
//! splitting and flattening a dense slice (what [`super::Shape`] does) never map two
//! local indices to the same rank.
//!
//! ```
//! use hyperactor_mesh::shape::Slice;
//!
//! # fn main() -> Result<(), hyperactor_mesh::shape::ShapeError> {
//! let slice = Slice::new(1, vec![2, 2], vec![4, 2])?;
//! assert_eq!(slice.iter().collect::<Vec<_>>(), vec![1, 3, 5, 7]);
//! assert_eq!((slice.len(), slice.get(3)?, slice.index(5)?), (4, 7, 2));
//! assert!(!slice.is_dense() && slice.contains(3) && !slice.contains(4));
//! assert_eq!(slice.to_string(), "Slice(offset=1, sizes=[2, 2], strides=[4, 2])");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::iter::FusedIterator;

use serde::{Deserialize, Deserializer, Serialize};

use super::error::ShapeError;

/// The number of elements of a layout of `sizes`, if it fits in a `usize`.
pub(super) fn checked_len(sizes: &[usize]) -> Option<usize> {
    if sizes.contains(&0) {
        return Some(0);
    }
    sizes.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s))
}

/// Row-major strides of `sizes` (a dimension of size 0 counts as 1), saturating.
pub(super) fn row_major_strides(sizes: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; sizes.len()];
    let mut acc = 1usize;
    for (stride, &size) in strides.iter_mut().zip(sizes).rev() {
        *stride = acc;
        acc = acc.saturating_mul(size.max(1));
    }
    strides
}

/// An offset plus per-dimension sizes and strides over global ranks; see the
/// [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Slice {
    offset: usize,
    sizes: Vec<usize>,
    strides: Vec<usize>,
}

impl Slice {
    /// A slice of `sizes` with `strides`, starting at global rank `offset`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::StrideCountMismatch`] if there is not one stride per size,
    /// [`ShapeError::ZeroStride`] if a stride is 0, and [`ShapeError::TooLarge`] if the
    /// slice has ranks and its number of ranks or its largest rank does not fit in a
    /// `usize`.
    pub fn new(offset: usize, sizes: Vec<usize>, strides: Vec<usize>) -> Result<Self, ShapeError> {
        if sizes.len() != strides.len() {
            return Err(ShapeError::StrideCountMismatch { sizes, strides });
        }
        if strides.contains(&0) {
            return Err(ShapeError::ZeroStride { strides });
        }
        if !sizes.contains(&0)
            && (checked_len(&sizes).is_none() || max_rank(offset, &sizes, &strides).is_none())
        {
            return Err(ShapeError::TooLarge {
                offset,
                sizes,
                strides,
            });
        }
        Ok(Self::from_valid(offset, sizes, strides))
    }

    /// A slice whose invariants the caller has checked.
    pub(super) fn from_valid(offset: usize, sizes: Vec<usize>, strides: Vec<usize>) -> Self {
        Self {
            offset,
            sizes,
            strides,
        }
    }

    /// The dense, row-major slice of `sizes` at offset 0: local index `i` is rank `i`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::TooLarge`] if the number of ranks does not fit in a `usize`.
    pub fn new_row_major(sizes: Vec<usize>) -> Result<Self, ShapeError> {
        Self::new_row_major_at(0, sizes)
    }

    /// The dense, row-major slice of `sizes` starting at global rank `offset`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::TooLarge`] if the number of ranks or the largest rank does not fit
    /// in a `usize`.
    pub fn new_row_major_at(offset: usize, sizes: Vec<usize>) -> Result<Self, ShapeError> {
        let strides = row_major_strides(&sizes);
        Self::new(offset, sizes, strides)
    }

    /// The global rank of local index 0 (of the first coordinate).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The per-dimension sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The per-dimension strides, in global ranks.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The number of dimensions.
    pub fn num_dims(&self) -> usize {
        self.sizes.len()
    }

    /// The number of ranks covered: the product of the sizes.
    pub fn len(&self) -> usize {
        checked_len(&self.sizes).unwrap_or_default()
    }

    /// Whether the slice covers no rank (some size is 0).
    pub fn is_empty(&self) -> bool {
        self.sizes.contains(&0)
    }

    /// Whether the slice covers `len()` consecutive global ranks in order. Dimensions of
    /// size 1 do not matter; an empty slice is dense.
    pub fn is_dense(&self) -> bool {
        if self.is_empty() {
            return true;
        }
        let mut expected = 1usize;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected = expected.saturating_mul(size);
        }
        true
    }

    /// The global rank at local (row-major) index `index`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::IndexOutOfRange`] unless `index < self.len()`.
    pub fn get(&self, index: usize) -> Result<usize, ShapeError> {
        let len = self.len();
        if index >= len {
            return Err(ShapeError::IndexOutOfRange { index, len });
        }
        let mut rest = index;
        let mut rank = self.offset;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides).rev() {
            rank += rest % size * stride;
            rest /= size;
        }
        Ok(rank)
    }

    /// The global ranks covered, in local (row-major) order.
    pub fn iter(&self) -> SliceIter<'_> {
        SliceIter {
            slice: self,
            coords: vec![0; self.sizes.len()],
            rank: self.offset,
            remaining: self.len(),
        }
    }

    /// The global ranks covered, in local (row-major) order, collected.
    pub fn ranks(&self) -> Vec<usize> {
        self.iter().collect()
    }

    /// The local (row-major) index of global rank `rank`.
    ///
    /// Fast for slices whose every stride exceeds the span of the later dimensions (all
    /// those made from a dense slice by [`super::Shape`]); other slices are searched.
    ///
    /// # Errors
    ///
    /// [`ShapeError::RankNotInSlice`] if the slice does not cover `rank`.
    pub fn index(&self, rank: usize) -> Result<usize, ShapeError> {
        self.local_index(rank)
            .ok_or_else(|| ShapeError::RankNotInSlice {
                rank,
                slice: self.clone(),
            })
    }

    /// Whether the slice covers global rank `rank`.
    pub fn contains(&self, rank: usize) -> bool {
        self.local_index(rank).is_some()
    }

    fn local_index(&self, rank: usize) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        if !self.is_nested() {
            return self.iter().position(|r| r == rank);
        }
        let mut rest = rank.checked_sub(self.offset)?;
        let mut local = 0;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides) {
            let coord = if size == 1 { 0 } else { rest / stride };
            if coord >= size {
                return None;
            }
            rest -= coord * stride;
            local = local * size + coord;
        }
        (rest == 0).then_some(local)
    }

    /// Whether each stride exceeds the span of all later dimensions (ignoring size 1):
    /// then the coordinates of a rank follow greedily, outermost first.
    fn is_nested(&self) -> bool {
        let mut span = 0usize;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides).rev() {
            if size <= 1 {
                continue;
            }
            if stride <= span {
                return false;
            }
            span += (size - 1) * stride;
        }
        true
    }
}

/// The largest rank of a slice with ranks, if it fits in a `usize`.
fn max_rank(offset: usize, sizes: &[usize], strides: &[usize]) -> Option<usize> {
    sizes
        .iter()
        .zip(strides)
        .try_fold(offset, |acc, (&size, &stride)| {
            acc.checked_add(size.saturating_sub(1).checked_mul(stride)?)
        })
}

/// `Slice(offset=1, sizes=[2, 2], strides=[4, 2])`.
impl fmt::Display for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Slice(offset={}, sizes={:?}, strides={:?})",
            self.offset, self.sizes, self.strides
        )
    }
}

impl<'a> IntoIterator for &'a Slice {
    type Item = usize;
    type IntoIter = SliceIter<'a>;

    fn into_iter(self) -> SliceIter<'a> {
        self.iter()
    }
}

/// The global ranks of a [`Slice`], in local (row-major) order: [`Slice::iter`].
#[derive(Debug, Clone)]
pub struct SliceIter<'a> {
    slice: &'a Slice,
    coords: Vec<usize>,
    rank: usize,
    remaining: usize,
}

impl Iterator for SliceIter<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let out = self.rank;
        self.remaining -= 1;
        if self.remaining > 0 {
            // Advance the odometer: the last dimension fastest.
            let dims = self.slice.sizes.iter().zip(&self.slice.strides);
            for (coord, (&size, &stride)) in self.coords.iter_mut().zip(dims).rev() {
                *coord += 1;
                if *coord < size {
                    self.rank += stride;
                    break;
                }
                *coord = 0;
                self.rank -= (size - 1) * stride;
            }
        }
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for SliceIter<'_> {}

impl FusedIterator for SliceIter<'_> {}

/// What a slice looks like on the wire (when reading).
#[derive(Deserialize)]
#[serde(rename = "Slice")]
struct Wire {
    offset: usize,
    sizes: Vec<usize>,
    strides: Vec<usize>,
}

/// Validates like [`Slice::new`].
impl<'de> Deserialize<'de> for Slice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        Slice::new(wire.offset, wire.sizes, wire.strides).map_err(serde::de::Error::custom)
    }
}
