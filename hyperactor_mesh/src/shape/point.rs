//! [`Point`]: one position within an [`Extent`], as a rank plus named coordinates.
//!
//! The rank is the row-major linear index of the point in its extent (the last
//! dimension varies fastest); the coordinates follow from it and are computed on
//! demand. A point of the extent with no dimensions has rank 0 and no coordinates.
//!
//! Invariant: `rank < extent.num_ranks()`. A point holds its extent (a shared clone),
//! so points of one mesh are cheap to make.
//!
//! ```
//! use hyperactor_mesh::shape::{Extent, Point};
//!
//! # fn main() -> Result<(), hyperactor_mesh::shape::ShapeError> {
//! let extent = Extent::new(["hosts", "gpus"], [2, 4])?;
//! let point = Point::new(extent.clone(), 5)?;
//! assert_eq!(point.coords(), vec![1, 1]);
//! assert_eq!(point.coord("gpus")?, 1);
//! assert_eq!(point.to_string(), "{'hosts': 1/2, 'gpus': 1/4}");
//! assert_eq!(extent.point_at(&[1, 1])?, point);
//! # Ok(())
//! # }
//! ```

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{Quoted, ShapeError};
use super::extent::Extent;

/// A position within an extent; see the [module docs](self).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Point {
    extent: Extent,
    rank: usize,
}

impl Point {
    /// The point of rank `rank` (row-major) within `extent`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::RankOutOfRange`] unless `rank < extent.num_ranks()`.
    pub fn new(extent: Extent, rank: usize) -> Result<Self, ShapeError> {
        if rank >= extent.num_ranks() {
            return Err(ShapeError::RankOutOfRange { rank, extent });
        }
        Ok(Self { extent, rank })
    }

    /// A point whose rank the caller has checked.
    pub(crate) fn new_unchecked(extent: Extent, rank: usize) -> Self {
        Self { extent, rank }
    }

    /// The row-major linear index of this point within its extent.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The extent this point lies in.
    pub fn extent(&self) -> &Extent {
        &self.extent
    }

    /// The number of dimensions (of coordinates).
    pub fn num_dims(&self) -> usize {
        self.extent.num_dims()
    }

    /// The coordinate along the dimension at position `dim`, if there is one.
    pub fn coord_at(&self, dim: usize) -> Option<usize> {
        let sizes = self.extent.sizes();
        let size = *sizes.get(dim)?;
        // Every size is >= 1 (the extent has a point), and the product fits a usize.
        let inner: usize = sizes[dim + 1..].iter().product();
        Some(self.rank / inner % size)
    }

    /// The coordinate along dimension `label`.
    ///
    /// # Errors
    ///
    /// [`ShapeError::UnknownDimension`] if there is no such dimension.
    pub fn coord(&self, label: &str) -> Result<usize, ShapeError> {
        let dim = self.extent.dim(label)?;
        Ok(self.coord_at(dim).unwrap_or_default())
    }

    /// The coordinates, one per dimension, in order.
    pub fn coords(&self) -> Vec<usize> {
        let sizes = self.extent.sizes();
        let mut coords = vec![0; sizes.len()];
        let mut rest = self.rank;
        for (coord, &size) in coords.iter_mut().zip(sizes).rev() {
            *coord = rest % size;
            rest /= size;
        }
        coords
    }

    /// `(label, coordinate)` of each dimension, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, usize)> + '_ {
        self.extent
            .labels()
            .iter()
            .map(String::as_str)
            .zip(self.coords())
    }
}

impl fmt::Debug for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Point")
            .field("rank", &self.rank)
            .field("extent", &self.extent)
            .finish()
    }
}

/// `{'hosts': 1/2, 'gpus': 1/4}`: each coordinate over its dimension's size.
impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        let coords = self.coords();
        for (i, ((label, size), coord)) in self.extent.iter().zip(coords).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {coord}/{size}", Quoted(label))?;
        }
        f.write_str("}")
    }
}

/// What a point looks like on the wire (borrowed when writing).
#[derive(Serialize)]
#[serde(rename = "Point")]
struct WireRef<'a> {
    extent: &'a Extent,
    rank: usize,
}

/// What a point looks like on the wire (owned when reading).
#[derive(Deserialize)]
#[serde(rename = "Point")]
struct Wire {
    extent: Extent,
    rank: usize,
}

impl Serialize for Point {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireRef {
            extent: &self.extent,
            rank: self.rank,
        }
        .serialize(serializer)
    }
}

/// Validates like [`Point::new`].
impl<'de> Deserialize<'de> for Point {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        Point::new(wire.extent, wire.rank).map_err(serde::de::Error::custom)
    }
}
