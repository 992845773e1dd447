//! [`SplitSpec`] and [`Shape::split`]: replacing dimensions by several.
//!
//! A split of dimension `hosts` (size `n`) into `["dp", "pp"]` (outermost first) keeps
//! the same global ranks in the same order: `dp` gets the stride of `hosts` times the
//! size of `pp`, and `pp` the stride of `hosts`. Sizes are given per new name; in each
//! split at most one size may be left out, and it is inferred (the given sizes must
//! divide `n`); if all are given they must multiply to `n`. Dimensions not split are
//! kept where they are.
//!
//! ```
//! use hyperactor_mesh::shape::{Shape, Slice, SplitSpec};
//!
//! # fn main() -> Result<(), hyperactor_mesh::shape::ShapeError> {
//! let shape = Shape::new(["hosts", "gpus"], Slice::new_row_major(vec![4, 8])?)?;
//! let spec = SplitSpec::new().split("hosts", ["dp", "pp"]).size("pp", 2);
//! let split = shape.split(&spec)?;
//! assert_eq!(split.labels(), ["dp", "pp", "gpus"]);
//! assert_eq!(split.slice().strides(), [16, 8, 1]);
//! assert_eq!(split.ranks(), shape.ranks());
//! # Ok(())
//! # }
//! ```

use serde::{Deserialize, Serialize};

use super::{Shape, ShapeError, Slice};

/// How [`Shape::split`] replaces dimensions: for some existing dimensions, their new
/// names (outermost first), and sizes for some of the new names.
///
/// [`Shape::split`] fails with [`ShapeError::UnknownDimension`] (a split names no
/// dimension), [`ShapeError::DuplicateSplit`], [`ShapeError::SplitIntoNothing`],
/// [`ShapeError::DuplicateSplitSize`], [`ShapeError::ZeroSplitSize`],
/// [`ShapeError::SplitSizeOfExistingDimension`] (a size for an existing dimension that
/// is not also a new name), [`ShapeError::SplitUnderdetermined`] (two sizes left out in
/// one split), [`ShapeError::SplitNotDivisible`], [`ShapeError::SplitSizeMismatch`],
/// [`ShapeError::UnusedSplitSizes`] (sizes for names no split creates) and
/// [`ShapeError::DuplicateLabel`] (the resulting labels clash).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SplitSpec {
    splits: Vec<(String, Vec<String>)>,
    sizes: Vec<(String, usize)>,
}

impl SplitSpec {
    /// A spec that splits nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also split dimension `label` into the dimensions `into`, outermost first.
    #[must_use]
    pub fn split<L: Into<String>>(
        mut self,
        label: impl Into<String>,
        into: impl IntoIterator<Item = L>,
    ) -> Self {
        self.splits
            .push((label.into(), into.into_iter().map(Into::into).collect()));
        self
    }

    /// Also give new dimension `label` size `size`.
    #[must_use]
    pub fn size(mut self, label: impl Into<String>, size: usize) -> Self {
        self.sizes.push((label.into(), size));
        self
    }

    /// The splits: `(existing label, new labels)`, in the order given.
    pub fn splits(&self) -> &[(String, Vec<String>)] {
        &self.splits
    }

    /// The sizes: `(new label, size)`, in the order given.
    pub fn sizes(&self) -> &[(String, usize)] {
        &self.sizes
    }

    fn size_of(&self, label: &str) -> Option<(usize, usize)> {
        self.sizes
            .iter()
            .position(|(l, _)| l == label)
            .map(|i| (i, self.sizes[i].1))
    }

    fn is_new_name(&self, label: &str) -> bool {
        self.splits
            .iter()
            .any(|(_, into)| into.iter().any(|l| l == label))
    }

    /// Checks everything that does not depend on the sizes of the dimensions split.
    fn validate(&self, shape: &Shape) -> Result<(), ShapeError> {
        for (i, (label, into)) in self.splits.iter().enumerate() {
            shape.dim(label)?;
            if self.splits[..i].iter().any(|(l, _)| l == label) {
                return Err(ShapeError::DuplicateSplit {
                    label: label.clone(),
                });
            }
            if into.is_empty() {
                return Err(ShapeError::SplitIntoNothing {
                    label: label.clone(),
                });
            }
        }
        for (i, (label, size)) in self.sizes.iter().enumerate() {
            if self.sizes[..i].iter().any(|(l, _)| l == label) {
                return Err(ShapeError::DuplicateSplitSize {
                    label: label.clone(),
                });
            }
            if !self.is_new_name(label) && shape.labels().contains(label) {
                return Err(ShapeError::SplitSizeOfExistingDimension {
                    label: label.clone(),
                    size: *size,
                });
            }
            if *size == 0 {
                return Err(ShapeError::ZeroSplitSize {
                    label: label.clone(),
                });
            }
        }
        Ok(())
    }
}

/// The sizes of the new dimensions `into` of dimension `label` (size `size`); marks the
/// sizes used in `used`.
fn split_sizes(
    spec: &SplitSpec,
    label: &str,
    size: usize,
    into: &[String],
    used: &mut [bool],
) -> Result<Vec<usize>, ShapeError> {
    let mut known = 1usize;
    let mut unknown = Vec::new();
    for name in into {
        match spec.size_of(name) {
            Some((i, s)) => {
                used[i] = true;
                known = known.saturating_mul(s);
            }
            None => unknown.push(name.clone()),
        }
    }
    let sizes = |inferred: usize| {
        into.iter()
            .map(|name| spec.size_of(name).map_or(inferred, |(_, s)| s))
            .collect()
    };
    match unknown.len() {
        0 if known == size => Ok(sizes(0)),
        0 => Err(ShapeError::SplitSizeMismatch {
            label: label.to_string(),
            size,
            into: into.to_vec(),
            product: known,
        }),
        1 if size.is_multiple_of(known) => Ok(sizes(size / known)),
        1 => Err(ShapeError::SplitNotDivisible {
            label: label.to_string(),
            size,
            into: into.to_vec(),
            product: known,
        }),
        _ => Err(ShapeError::SplitUnderdetermined {
            label: label.to_string(),
            size,
            into: into.to_vec(),
            unknown,
        }),
    }
}

/// [`Shape::split`].
pub(super) fn split(shape: &Shape, spec: &SplitSpec) -> Result<Shape, ShapeError> {
    spec.validate(shape)?;
    let slice = shape.slice();
    let mut used = vec![false; spec.sizes.len()];
    let mut labels = Vec::with_capacity(shape.num_dims());
    let mut sizes = Vec::with_capacity(shape.num_dims());
    let mut strides = Vec::with_capacity(shape.num_dims());
    let dims = shape
        .labels()
        .iter()
        .zip(slice.sizes())
        .zip(slice.strides());
    for ((label, &size), &stride) in dims {
        let Some((_, into)) = spec.splits.iter().find(|(l, _)| l == label) else {
            labels.push(label.clone());
            sizes.push(size);
            strides.push(stride);
            continue;
        };
        let new_sizes = split_sizes(spec, label, size, into, &mut used)?;
        let mut new_strides = vec![0; new_sizes.len()];
        let mut inner = stride;
        for (s, &n) in new_strides.iter_mut().zip(&new_sizes).rev() {
            *s = inner;
            inner = inner.saturating_mul(n);
        }
        labels.extend(into.iter().cloned());
        sizes.extend(new_sizes);
        strides.extend(new_strides);
    }
    let mut unused: Vec<String> = spec
        .sizes
        .iter()
        .zip(&used)
        .filter(|(_, &u)| !u)
        .map(|((l, _), _)| l.clone())
        .collect();
    if !unused.is_empty() {
        unused.sort();
        return Err(ShapeError::UnusedSplitSizes {
            labels: unused,
            existing: shape.labels().to_vec(),
        });
    }
    Shape::new(labels, Slice::new(slice.offset(), sizes, strides)?)
}
