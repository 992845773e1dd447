//! [`Extent`]: the ordered, named sizes of a mesh.
//!
//! An extent says how big a mesh is along each of its dimensions, in order, e.g.
//! `{'hosts': 2, 'gpus': 4}`; its number of ranks is the product of the sizes (1 for the
//! extent with no dimensions, [`Extent::unity`]). Ranks `0..num_ranks` enumerate its
//! [`Point`]s in row-major order: the last dimension varies fastest.
//!
//! Invariants: labels are distinct, one size per label, and the number of ranks fits in
//! a `usize`. Two extents are equal when they have the same labels in the same order
//! with the same sizes. Clones share one allocation, so handing an extent to every
//! point of a mesh is cheap.
//!
//! ```
//! use hyperactor_mesh::shape::Extent;
//!
//! # fn main() -> Result<(), hyperactor_mesh::shape::ShapeError> {
//! let extent = Extent::new(["hosts", "gpus"], [2, 4])?;
//! assert_eq!((extent.num_dims(), extent.num_ranks()), (2, 8));
//! assert_eq!(extent.size("gpus")?, 4);
//! assert_eq!(extent.point(6)?.coords(), vec![1, 2]);
//! assert_eq!(extent.to_string(), "{'hosts': 2, 'gpus': 4}");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{Quoted, ShapeError};
use super::point::Point;
use super::slice::{checked_len, row_major_strides};

/// The ordered, named sizes of a mesh; see the [module docs](self).
#[derive(Clone)]
pub struct Extent {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    labels: Vec<String>,
    sizes: Vec<usize>,
    num_ranks: usize,
}

/// Checks that `labels` are distinct and that there is one of them per size.
pub(super) fn check_labels(labels: &[String], sizes: &[usize]) -> Result<(), ShapeError> {
    if labels.len() != sizes.len() {
        return Err(ShapeError::LabelCountMismatch {
            labels: labels.to_vec(),
            sizes: sizes.to_vec(),
        });
    }
    // Pairwise for the few dimensions meshes have (no allocation); sorted for many.
    let repeats = if labels.len() <= 8 {
        (1..labels.len()).any(|i| labels[..i].contains(&labels[i]))
    } else {
        let mut sorted: Vec<&String> = labels.iter().collect();
        sorted.sort_unstable();
        sorted.windows(2).any(|w| w[0] == w[1])
    };
    if repeats {
        let mut sorted: Vec<&String> = labels.iter().collect();
        sorted.sort_unstable();
        let mut duplicates: Vec<String> = sorted
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0].clone())
            .collect();
        duplicates.dedup();
        return Err(ShapeError::DuplicateLabel {
            duplicates,
            labels: labels.to_vec(),
        });
    }
    Ok(())
}

impl Extent {
    /// An extent with dimensions `labels` of sizes `sizes`, in order.
    ///
    /// # Errors
    ///
    /// [`ShapeError::LabelCountMismatch`] if there is not one size per label,
    /// [`ShapeError::DuplicateLabel`] if a label repeats, and [`ShapeError::TooLarge`]
    /// if the number of ranks does not fit in a `usize`.
    pub fn new<L: Into<String>>(
        labels: impl IntoIterator<Item = L>,
        sizes: impl IntoIterator<Item = usize>,
    ) -> Result<Self, ShapeError> {
        let labels: Vec<String> = labels.into_iter().map(Into::into).collect();
        let sizes: Vec<usize> = sizes.into_iter().collect();
        check_labels(&labels, &sizes)?;
        let Some(num_ranks) = checked_len(&sizes) else {
            return Err(ShapeError::TooLarge {
                offset: 0,
                strides: row_major_strides(&sizes),
                sizes,
            });
        };
        Ok(Self::from_valid(labels, sizes, num_ranks))
    }

    /// An extent whose invariants the caller has checked.
    pub(super) fn from_valid(labels: Vec<String>, sizes: Vec<usize>, num_ranks: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                labels,
                sizes,
                num_ranks,
            }),
        }
    }

    /// The extent with no dimensions: one rank, rank 0.
    pub fn unity() -> Self {
        Self::from_valid(Vec::new(), Vec::new(), 1)
    }

    /// The dimension labels, in order.
    pub fn labels(&self) -> &[String] {
        &self.inner.labels
    }

    /// The dimension sizes, in label order.
    pub fn sizes(&self) -> &[usize] {
        &self.inner.sizes
    }

    /// The number of dimensions.
    pub fn num_dims(&self) -> usize {
        self.inner.labels.len()
    }

    /// The number of ranks (points): the product of the sizes, 1 with no dimensions.
    pub fn num_ranks(&self) -> usize {
        self.inner.num_ranks
    }

    /// The position of dimension `label` among the dimensions, if there is one.
    pub fn position(&self, label: &str) -> Option<usize> {
        self.inner.labels.iter().position(|l| l == label)
    }

    /// Whether there is a dimension `label`.
    pub fn contains(&self, label: &str) -> bool {
        self.position(label).is_some()
    }

    /// The position of dimension `label` among the dimensions.
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if there is no such dimension.
    pub fn dim(&self, label: &str) -> Result<usize, ShapeError> {
        self.position(label)
            .ok_or_else(|| unknown_dimension(label, self.labels()))
    }

    /// The size of dimension `label`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if there is no such dimension.
    pub fn size(&self, label: &str) -> Result<usize, ShapeError> {
        Ok(self.inner.sizes[self.dim(label)?])
    }

    /// `(label, size)` of each dimension, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, usize)> + '_ {
        self.inner
            .labels
            .iter()
            .map(String::as_str)
            .zip(self.inner.sizes.iter().copied())
    }

    /// The point of rank `rank`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::RankOutOfRange`] unless `rank < self.num_ranks()`.
    pub fn point(&self, rank: usize) -> Result<Point, ShapeError> {
        Point::new(self.clone(), rank)
    }

    /// The point with coordinates `coords`, one per dimension, in order.
    ///
    /// # Errors
    ///
    /// [`ShapeError::CoordinatesOutOfRange`] if there is not one coordinate per
    /// dimension or a coordinate is not below its dimension's size.
    pub fn point_at(&self, coords: &[usize]) -> Result<Point, ShapeError> {
        let sizes = self.sizes();
        if coords.len() != sizes.len() || coords.iter().zip(sizes).any(|(c, s)| c >= s) {
            return Err(ShapeError::CoordinatesOutOfRange {
                coords: coords.to_vec(),
                extent: self.clone(),
            });
        }
        let rank = coords
            .iter()
            .zip(sizes)
            .fold(0, |rank, (&coord, &size)| rank * size + coord);
        Point::new(self.clone(), rank)
    }

    /// Every point of this extent, in rank order.
    pub fn points(&self) -> impl ExactSizeIterator<Item = Point> + '_ {
        (0..self.num_ranks()).map(|rank| Point::new_unchecked(self.clone(), rank))
    }
}

/// The error for a `label` that is not among `labels`.
pub(super) fn unknown_dimension(label: &str, labels: &[String]) -> ShapeError {
    ShapeError::UnknownDimension {
        label: label.to_string(),
        labels: labels.to_vec(),
    }
}

impl PartialEq for Extent {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.labels == other.inner.labels && self.inner.sizes == other.inner.sizes)
    }
}

impl Eq for Extent {}

impl Hash for Extent {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.labels.hash(state);
        self.inner.sizes.hash(state);
    }
}

impl fmt::Debug for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extent")
            .field("labels", &self.inner.labels)
            .field("sizes", &self.inner.sizes)
            .finish()
    }
}

/// `{'hosts': 2, 'gpus': 4}` (`{}` with no dimensions).
impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (label, size)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {size}", Quoted(label))?;
        }
        f.write_str("}")
    }
}

/// What an extent looks like on the wire (borrowed when writing).
#[derive(Serialize)]
#[serde(rename = "Extent")]
struct WireRef<'a> {
    labels: &'a [String],
    sizes: &'a [usize],
}

/// What an extent looks like on the wire (owned when reading).
#[derive(Deserialize)]
#[serde(rename = "Extent")]
struct Wire {
    labels: Vec<String>,
    sizes: Vec<usize>,
}

impl Serialize for Extent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireRef {
            labels: self.labels(),
            sizes: self.sizes(),
        }
        .serialize(serializer)
    }
}

/// Validates like [`Extent::new`].
impl<'de> Deserialize<'de> for Extent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        Extent::new(wire.labels, wire.sizes).map_err(serde::de::Error::custom)
    }
}
