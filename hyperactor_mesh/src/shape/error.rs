//! [`ShapeError`]: every way to misuse the shape algebra, one variant per kind.
//!
//! Display strings are lowercase, have no trailing period, name the labels, sizes,
//! indices or ranks involved and say how to fix the call. Labels are shown quoted
//! (`'hosts'`) and lists of labels as `['hosts', 'gpus']`, the way Monarch's Python API
//! shows them, because the same messages reach Python users.
//!
//! ```
//! use hyperactor_mesh::shape::{Extent, ShapeError};
//!
//! let err = Extent::new(["hosts"], [2]).unwrap().size("gpus").unwrap_err();
//! assert!(matches!(err, ShapeError::UnknownDimension { .. }));
//! assert_eq!(
//!     err.to_string(),
//!     "no such dimension: there is no dimension 'gpus'; expected one of ['hosts']"
//! );
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use super::extent::Extent;
use super::slice::Slice;

/// How many ranks or indices a message lists before eliding the rest.
const LIST_MAX: usize = 16;

/// A misuse of [`Extent`], [`super::Point`], [`Slice`], [`super::Shape`] or
/// [`crate::value_mesh::ValueMesh`]. Serializable, so that it can be reported to a
/// remote caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    /// Labels and sizes differ in number.
    #[error(
        "got {} labels {} but {} sizes {sizes:?}; pass exactly one size per label",
        labels.len(), Labels(labels), sizes.len()
    )]
    LabelCountMismatch {
        /// The labels given.
        labels: Vec<String>,
        /// The sizes given.
        sizes: Vec<usize>,
    },
    /// A label names two dimensions.
    #[error(
        "duplicate dimension label(s) {} in {}; every dimension needs a distinct label \
         (rename one of them)",
        Labels(duplicates),
        Labels(labels)
    )]
    DuplicateLabel {
        /// The labels that repeat, each once, sorted.
        duplicates: Vec<String>,
        /// All the labels given, in order.
        labels: Vec<String>,
    },
    /// A label names no dimension.
    #[error(
        "no such dimension: there is no dimension {}; expected one of {}",
        Quoted(label),
        Labels(labels)
    )]
    UnknownDimension {
        /// The label asked for.
        label: String,
        /// The labels that exist, in order.
        labels: Vec<String>,
    },
    /// A rank is not below the number of ranks of an extent.
    #[error(
        "rank {rank} is out of range for extent {extent}, which has {n} point(s); \
         expected 0 <= rank < {n}",
        n = extent.num_ranks()
    )]
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// The extent it should lie in.
        extent: Extent,
    },
    /// Coordinates do not name a point of an extent.
    #[error(
        "coordinates {coords:?} are not a point of extent {extent}; give one coordinate \
         per dimension, each below the dimension's size"
    )]
    CoordinatesOutOfRange {
        /// The coordinates given.
        coords: Vec<usize>,
        /// The extent they should lie in.
        extent: Extent,
    },
    /// A local (row-major) index is not below the number of ranks of a view.
    #[error(
        "local index {index} is out of range for a view of {len} rank(s); expected \
         0 <= index < {len}"
    )]
    IndexOutOfRange {
        /// The index given.
        index: usize,
        /// The number of ranks of the view.
        len: usize,
    },
    /// A global rank is not covered by a slice.
    #[error(
        "global rank {rank} is not in {slice}, which covers {}; pass one of those ranks",
        Ranks(slice)
    )]
    RankNotInSlice {
        /// The rank asked for.
        rank: usize,
        /// The slice searched.
        slice: Slice,
    },
    /// Sizes and strides differ in number.
    #[error(
        "got {} sizes {sizes:?} but {} strides {strides:?}; pass one stride per size",
        sizes.len(), strides.len()
    )]
    StrideCountMismatch {
        /// The sizes given.
        sizes: Vec<usize>,
        /// The strides given.
        strides: Vec<usize>,
    },
    /// A stride is 0.
    #[error("strides must be >= 1, got {strides:?}; a stride is the rank step of a dimension")]
    ZeroStride {
        /// The strides given.
        strides: Vec<usize>,
    },
    /// The ranks (or the number of ranks) of a layout do not fit in a `usize`.
    #[error(
        "a layout with offset {offset}, sizes {sizes:?} and strides {strides:?} addresses \
         ranks beyond {}; use smaller sizes, strides or offset",
        usize::MAX
    )]
    TooLarge {
        /// The offset given.
        offset: usize,
        /// The sizes given.
        sizes: Vec<usize>,
        /// The strides given (row-major ones for an extent).
        strides: Vec<usize>,
    },
    /// `select` was given an index outside its dimension.
    #[error(
        "index {index} is out of range for dimension {} of size {size}; expected \
         0 <= {label} < {size}",
        Quoted(label)
    )]
    SelectOutOfRange {
        /// The dimension.
        label: String,
        /// The index given.
        index: usize,
        /// The size of the dimension.
        size: usize,
    },
    /// `select_range` was given a start or stop past the end of its dimension.
    #[error(
        "range {start}..{stop} is out of bounds for dimension {} of size {size}; expected \
         start <= {size} and stop <= {size}",
        Quoted(label)
    )]
    RangeOutOfBounds {
        /// The dimension.
        label: String,
        /// The start given.
        start: usize,
        /// The stop given.
        stop: usize,
        /// The size of the dimension.
        size: usize,
    },
    /// `select_range` was given a step of 0.
    #[error(
        "cannot select dimension {} with step 0: steps must be positive; select in \
         increasing order with a step of 1 or more",
        Quoted(label)
    )]
    ZeroStep {
        /// The dimension.
        label: String,
    },
    /// A split gives no new names for a dimension.
    #[error(
        "cannot split dimension {} into no dimensions; give at least one new name (its \
         own name to keep it)",
        Quoted(label)
    )]
    SplitIntoNothing {
        /// The dimension.
        label: String,
    },
    /// A split names the same dimension twice.
    #[error("dimension {} is split twice; give its new names once", Quoted(label))]
    DuplicateSplit {
        /// The dimension.
        label: String,
    },
    /// A split gives two sizes for the same new dimension.
    #[error(
        "new dimension {} is given two sizes; give its size once",
        Quoted(label)
    )]
    DuplicateSplitSize {
        /// The new dimension.
        label: String,
    },
    /// A split gives a size for an existing dimension that it does not split into.
    #[error(
        "size constraint {}={size} names an existing dimension; only the new dimensions of \
         a split take sizes: split {} into new names and give the size of one of those",
        Quoted(label),
        Quoted(label)
    )]
    SplitSizeOfExistingDimension {
        /// The existing dimension.
        label: String,
        /// The size given for it.
        size: usize,
    },
    /// A split gives a size of 0 for a new dimension.
    #[error(
        "new dimension {} has size 0; sizes of new dimensions must be >= 1",
        Quoted(label)
    )]
    ZeroSplitSize {
        /// The new dimension.
        label: String,
    },
    /// A split leaves more than one new size unknown.
    #[error(
        "cannot split dimension {} (size {size}) into {}: the sizes of {} are all unknown \
         and only one can be inferred; give the sizes of all but one",
        Quoted(label),
        Labels(into),
        Labels(unknown)
    )]
    SplitUnderdetermined {
        /// The dimension split.
        label: String,
        /// Its size.
        size: usize,
        /// The new names.
        into: Vec<String>,
        /// The new names without a size.
        unknown: Vec<String>,
    },
    /// The given sizes of a split, one left out, do not divide the dimension's size.
    #[error(
        "cannot split dimension {} (size {size}) into {}: the given sizes multiply to \
         {product}, which does not divide {size}; choose sizes whose product divides {size}",
        Quoted(label),
        Labels(into)
    )]
    SplitNotDivisible {
        /// The dimension split.
        label: String,
        /// Its size.
        size: usize,
        /// The new names.
        into: Vec<String>,
        /// The product of the sizes given.
        product: usize,
    },
    /// All sizes of a split are given and do not multiply to the dimension's size.
    #[error(
        "cannot split dimension {} (size {size}) into {}: the given sizes multiply to \
         {product}, not {size}; make their product {size} or leave one size out to infer it",
        Quoted(label),
        Labels(into)
    )]
    SplitSizeMismatch {
        /// The dimension split.
        label: String,
        /// Its size.
        size: usize,
        /// The new names.
        into: Vec<String>,
        /// The product of the sizes given.
        product: usize,
    },
    /// Sizes were given for names that no split creates.
    #[error(
        "size constraint(s) {} name no new dimension of this split and no existing \
         dimension (existing: {}); remove them or add them to a split",
        Labels(labels),
        Labels(existing)
    )]
    UnusedSplitSizes {
        /// The names with a size but no split, sorted.
        labels: Vec<String>,
        /// The existing dimensions.
        existing: Vec<String>,
    },
    /// `flatten` was called on a view whose ranks are not consecutive.
    #[error(
        "cannot flatten a view that is not dense: {slice} does not cover consecutive \
         ranks, and only dense views can be flattened; flatten before slicing with steps \
         or partial ranges, or use split/rename instead"
    )]
    NotDense {
        /// The slice of the view.
        slice: Slice,
    },
    /// A value mesh was given a different number of values than its shape has ranks.
    #[error(
        "{values} value(s) given for a shape with extent {extent} of {ranks} rank(s); pass \
         exactly one value per rank, in row-major order"
    )]
    ValueCountMismatch {
        /// The number of values given.
        values: usize,
        /// The number of ranks of the shape.
        ranks: usize,
        /// The extent of the shape.
        extent: Extent,
    },
    /// Indexed values name the same index twice.
    #[error("index {index} is given more than once; give every index in 0..{len} exactly once")]
    DuplicateIndex {
        /// The repeated index.
        index: usize,
        /// The number of ranks.
        len: usize,
    },
    /// Indexed values leave some indices without a value.
    #[error(
        "no value for index(es) {}; give every index in 0..{len} exactly once",
        List(missing)
    )]
    MissingIndices {
        /// The indices without a value, in increasing order.
        missing: Vec<usize>,
        /// The number of ranks.
        len: usize,
    },
}

/// Shows a label as Python shows a `str`: `'hosts'`.
pub(super) struct Quoted<'a>(pub(super) &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quote = if self.0.contains('\'') && !self.0.contains('"') {
            '"'
        } else {
            '\''
        };
        write!(f, "{quote}")?;
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c == quote => write!(f, "\\{c}")?,
                c if c.is_control() => write!(f, "\\x{:02x}", u32::from(c))?,
                c => write!(f, "{c}")?,
            }
        }
        write!(f, "{quote}")
    }
}

/// Shows labels as Python shows a list of `str`: `['hosts', 'gpus']`.
pub(super) struct Labels<'a>(pub(super) &'a [String]);

impl fmt::Display for Labels<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, label) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", Quoted(label))?;
        }
        f.write_str("]")
    }
}

/// Shows at most [`LIST_MAX`] numbers: `[1, 2, 3]` or `[1, 2, ... (40 in all)]`.
struct List<'a>(&'a [usize]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_list(f, self.0.iter().copied(), self.0.len())
    }
}

/// Shows the first ranks of a slice, like [`List`].
struct Ranks<'a>(&'a Slice);

impl fmt::Display for Ranks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_list(f, self.0.iter(), self.0.len())
    }
}

fn write_list(
    f: &mut fmt::Formatter<'_>,
    items: impl Iterator<Item = usize>,
    len: usize,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, item) in items.take(LIST_MAX).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    if len > LIST_MAX {
        write!(f, ", ... ({len} in all)")?;
    }
    f.write_str("]")
}
