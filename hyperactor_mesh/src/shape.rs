//! The shape algebra of meshes: named dimensions, points, strided slices of ranks, and
//! the views (`select`, `split`, `rename`, `flatten`) that every mesh shares.
//!
//! A mesh of N ranks (procs, actors, values) is laid out along ordered, **named
//! dimensions** such as `hosts` and `gpus`. Four types describe such layouts:
//!
//! - [`Extent`]: the labels and sizes of the dimensions, e.g. `{'hosts': 2, 'gpus': 4}`:
//!   how big a mesh is, with no ranks attached. Cheap to clone (shared).
//! - [`Point`]: one position within an extent: a rank in `0..num_ranks`, whose
//!   coordinates follow from it in row-major order (the last dimension varies fastest).
//! - [`Slice`]: an offset plus per-dimension sizes and strides: which *global* ranks a
//!   view covers, in row-major order of its coordinates.
//! - [`Shape`]: labels plus a slice: a view of global ranks laid out along named
//!   dimensions. Every mesh operation is a function from shape to shape.
//!
//! A [`SplitSpec`] says how [`Shape::split`] replaces dimensions by several, and
//! [`ShapeError`] is what every fallible operation returns.
//!
//! The files stand in two floors: [`Extent`], [`Point`], [`Slice`] and [`ShapeError`]
//! import each other (a shape error carries the extent or slice it is about, so that
//! its message can show it, and each of those types returns shape errors), and
//! [`Shape`] (`view`) stands above them and is imported by none of them.
//!
//! Invariants, checked by every constructor and by deserialization (these types travel
//! inside messages, so a value read off the wire is validated like one built locally):
//!
//! - labels are distinct, one size per label;
//! - strides are at least 1, and every rank a slice can address fits in a `usize`;
//! - a point's rank is below the number of ranks of its extent.
//!
//! ```
//! use hyperactor_mesh::shape::{Extent, Shape, SplitSpec};
//!
//! # fn main() -> Result<(), hyperactor_mesh::shape::ShapeError> {
//! let extent = Extent::new(["hosts", "gpus"], [2, 4])?;
//! let shape = extent.region(); // global ranks 0..8, row-major
//!
//! // Select host 1 (the dimension goes away), then every other gpu (it stays).
//! let row = shape.select("hosts", 1)?;
//! assert_eq!(row.ranks(), vec![4, 5, 6, 7]);
//! let evens = shape.select_range("gpus", 0, 4, 2)?;
//! assert_eq!(evens.ranks(), vec![0, 2, 4, 6]);
//! assert_eq!(evens.extent().to_string(), "{'hosts': 2, 'gpus': 2}");
//!
//! // Where does global rank 6 sit in the strided view? At hosts=1, gpus=1.
//! let point = evens.coordinates(6)?;
//! assert_eq!((point.rank(), point.coords()), (3, vec![1, 1]));
//!
//! // Split gpus into (tp, cp) with cp = 2; tp = 2 is inferred.
//! let split = shape.split(&SplitSpec::new().split("gpus", ["tp", "cp"]).size("cp", 2))?;
//! assert_eq!(split.extent().to_string(), "{'hosts': 2, 'tp': 2, 'cp': 2}");
//! # Ok(())
//! # }
//! ```

pub mod error;
pub mod extent;
pub mod point;
pub mod slice;
pub mod view;

#[cfg(test)]
mod tests;

pub use error::ShapeError;
pub use extent::Extent;
pub use point::Point;
pub use slice::{Slice, SliceIter};
pub use view::{Shape, SplitSpec};
