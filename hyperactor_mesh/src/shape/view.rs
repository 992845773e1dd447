//! [`Shape`]: a view of global ranks laid out along named dimensions, and the view
//! operations every mesh shares.
//!
//! A shape is the labels of a mesh view plus the [`Slice`] that maps its local
//! coordinates to global ranks. Each operation returns a new shape over a subset (or a
//! relabeling) of the same global ranks:
//!
//! - [`Shape::select`] keeps one coordinate of a dimension and removes the dimension;
//! - [`Shape::select_range`] keeps the dimension, restricted to `start..stop` by `step`;
//! - [`Shape::split`] replaces dimensions by several ([`SplitSpec`]), and
//!   [`Shape::rename`] relabels (a split into one name each);
//! - [`Shape::flatten`] merges every dimension of a dense view into one.
//!
//! Invariants: one label per slice dimension, labels distinct. Local indices, and the
//! [`Point`]s of [`Shape::coordinates`], are relative to the view's own
//! [`Shape::extent`], not to the mesh it was cut from.
//!
//! ```
//! use hyperactor_mesh::shape::{Shape, Slice};
//!
//! # fn main() -> Result<(), hyperactor_mesh::shape::ShapeError> {
//! let shape = Shape::new(["hosts", "gpus"], Slice::new_row_major(vec![4, 8])?)?;
//! let view = shape.select_range("hosts", 1, 4, 1)?.select_range("gpus", 1, 8, 2)?;
//! assert_eq!(view.extent().to_string(), "{'hosts': 3, 'gpus': 4}");
//! assert_eq!(view.select("hosts", 1)?.ranks(), vec![17, 19, 21, 23]);
//! assert!(view.flatten("all").is_err()); // strided: not dense
//! assert_eq!(shape.rename([("hosts", "nodes")])?.labels(), ["nodes", "gpus"]);
//! # Ok(())
//! # }
//! ```

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use super::error::{Labels, ShapeError};
use super::extent::{check_labels, unknown_dimension, Extent};
use super::point::Point;
use super::slice::{row_major_strides, Slice, SliceIter};

pub mod split;

pub use split::SplitSpec;

/// Labels plus a [`Slice`]: which global ranks a mesh view covers, laid out how; see
/// the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Shape {
    labels: Vec<String>,
    slice: Slice,
}

impl Shape {
    /// A shape naming the dimensions of `slice` with `labels`, in order.
    ///
    /// # Errors
    ///
    /// [`ShapeError::LabelCountMismatch`] if there is not one label per dimension of
    /// `slice`, and [`ShapeError::DuplicateLabel`] if a label repeats.
    pub fn new<L: Into<String>>(
        labels: impl IntoIterator<Item = L>,
        slice: Slice,
    ) -> Result<Self, ShapeError> {
        let labels: Vec<String> = labels.into_iter().map(Into::into).collect();
        check_labels(&labels, slice.sizes())?;
        Ok(Self::from_valid(labels, slice))
    }

    /// A shape whose invariants the caller has checked.
    pub(super) fn from_valid(labels: Vec<String>, slice: Slice) -> Self {
        Self { labels, slice }
    }

    /// The zero-dimensional shape of the single global rank 0.
    pub fn unity() -> Self {
        Self::from_valid(Vec::new(), Slice::from_valid(0, Vec::new(), Vec::new()))
    }

    /// The dimension labels, in order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The slice mapping local coordinates to global ranks.
    pub fn slice(&self) -> &Slice {
        &self.slice
    }

    /// The extent of this view: its labels with their sizes.
    pub fn extent(&self) -> Extent {
        Extent::from_valid(
            self.labels.clone(),
            self.slice.sizes().to_vec(),
            self.slice.len(),
        )
    }

    /// The number of dimensions.
    pub fn num_dims(&self) -> usize {
        self.labels.len()
    }

    /// The number of ranks in this view.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether this view has no rank (some dimension has size 0).
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// The global ranks of this view, in row-major order of its coordinates.
    pub fn ranks(&self) -> Vec<usize> {
        self.slice.ranks()
    }

    /// The global ranks of this view, in row-major order of its coordinates.
    pub fn iter(&self) -> SliceIter<'_> {
        self.slice.iter()
    }

    /// The position of dimension `label`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if there is no such dimension.
    pub fn dim(&self, label: &str) -> Result<usize, ShapeError> {
        self.labels
            .iter()
            .position(|l| l == label)
            .ok_or_else(|| unknown_dimension(label, &self.labels))
    }

    /// The size of dimension `label`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if there is no such dimension.
    pub fn size(&self, label: &str) -> Result<usize, ShapeError> {
        Ok(self.slice.sizes()[self.dim(label)?])
    }

    /// The point, relative to [`Shape::extent`], of global rank `rank`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::RankNotInSlice`] if this view does not cover `rank`.
    pub fn coordinates(&self, rank: usize) -> Result<Point, ShapeError> {
        let index = self.slice.index(rank)?;
        Point::new(self.extent(), index)
    }

    /// Keeps only coordinate `index` of dimension `label`, and removes the dimension.
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if there is no such dimension, and
    /// [`ShapeError::SelectOutOfRange`] unless `index` is below its size.
    pub fn select(&self, label: &str, index: usize) -> Result<Shape, ShapeError> {
        let dim = self.dim(label)?;
        let size = self.slice.sizes()[dim];
        if index >= size {
            return Err(ShapeError::SelectOutOfRange {
                label: label.to_string(),
                index,
                size,
            });
        }
        let mut labels = self.labels.clone();
        let mut sizes = self.slice.sizes().to_vec();
        let mut strides = self.slice.strides().to_vec();
        // In range: the new offset is a rank of this (valid) slice.
        let offset = self.slice.offset() + index * strides[dim];
        labels.remove(dim);
        sizes.remove(dim);
        strides.remove(dim);
        Ok(Self::from_valid(
            labels,
            Slice::from_valid(offset, sizes, strides),
        ))
    }

    /// Keeps the coordinates `start, start + step, ...` below `stop` of dimension
    /// `label`, which stays (with size 0 when `start >= stop`).
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if there is no such dimension,
    /// [`ShapeError::ZeroStep`] if `step` is 0, and [`ShapeError::RangeOutOfBounds`] if
    /// `start` or `stop` exceeds the dimension's size.
    pub fn select_range(
        &self,
        label: &str,
        start: usize,
        stop: usize,
        step: usize,
    ) -> Result<Shape, ShapeError> {
        let dim = self.dim(label)?;
        let size = self.slice.sizes()[dim];
        if step == 0 {
            return Err(ShapeError::ZeroStep {
                label: label.to_string(),
            });
        }
        if start > size || stop > size {
            return Err(ShapeError::RangeOutOfBounds {
                label: label.to_string(),
                start,
                stop,
                size,
            });
        }
        let new_size = if start < stop {
            (stop - start).div_ceil(step)
        } else {
            0
        };
        let mut sizes = self.slice.sizes().to_vec();
        let mut strides = self.slice.strides().to_vec();
        let mut offset = self.slice.offset();
        if new_size > 0 {
            // `start < size`: a rank of this (valid) slice.
            offset += start * strides[dim];
        }
        sizes[dim] = new_size;
        // Exact whenever the new size is 2 or more (the span stays within the old one).
        strides[dim] = strides[dim].saturating_mul(step);
        Ok(Self::from_valid(
            self.labels.clone(),
            Slice::from_valid(offset, sizes, strides),
        ))
    }

    /// Replaces dimensions by several, as `spec` says; see [`SplitSpec`].
    ///
    /// # Errors
    ///
    /// Those listed on [`SplitSpec`].
    pub fn split(&self, spec: &SplitSpec) -> Result<Shape, ShapeError> {
        split::split(self, spec)
    }

    /// Relabels dimensions: each `(old, new)` pair renames `old` to `new`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if an old label names no dimension,
    /// [`ShapeError::DuplicateSplit`] if it is renamed twice, and
    /// [`ShapeError::DuplicateLabel`] if a new label clashes with another label.
    pub fn rename<O: Into<String>, N: Into<String>>(
        &self,
        renames: impl IntoIterator<Item = (O, N)>,
    ) -> Result<Shape, ShapeError> {
        let spec = renames
            .into_iter()
            .fold(SplitSpec::new(), |spec, (old, new)| spec.split(old, [new]));
        self.split(&spec)
    }

    /// Merges every dimension of a dense view into one dimension `label` (a view with
    /// no dimensions gets one of size 1).
    ///
    /// # Errors
    ///
    /// [`ShapeError::NotDense`] if the view's ranks are not consecutive (it was cut with
    /// steps or partial ranges along an inner dimension).
    pub fn flatten(&self, label: impl Into<String>) -> Result<Shape, ShapeError> {
        if !self.slice.is_dense() {
            return Err(ShapeError::NotDense {
                slice: self.slice.clone(),
            });
        }
        let slice = Slice::from_valid(self.slice.offset(), vec![self.slice.len()], vec![1]);
        Ok(Self::from_valid(vec![label.into()], slice))
    }
}

/// `Shape(labels=['hosts', 'gpus'], slice=Slice(offset=0, sizes=[2, 4], strides=[4, 1]))`.
impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Shape(labels={}, slice={})",
            Labels(&self.labels),
            self.slice
        )
    }
}

/// What a shape looks like on the wire (when reading).
#[derive(Deserialize)]
#[serde(rename = "Shape")]
struct Wire {
    labels: Vec<String>,
    slice: Slice,
}

/// Validates like [`Shape::new`].
impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        Shape::new(wire.labels, wire.slice).map_err(serde::de::Error::custom)
    }
}

impl Extent {
    /// The dense, row-major region this extent spans: the [`Shape`] of global ranks
    /// `0..num_ranks` with these labels.
    pub fn region(&self) -> Shape {
        let sizes = self.sizes().to_vec();
        let strides = row_major_strides(&sizes);
        Shape::from_valid(self.labels().to_vec(), Slice::from_valid(0, sizes, strides))
    }
}
