//! [`ValueMesh`]: one value per rank of a mesh view, what a call to every rank returns.
//!
//! A value mesh pairs a [`Shape`] with one value per rank of that shape, stored in the
//! view's local row-major order: value `i` belongs to global rank
//! `shape.slice().get(i)`. The [`Point`]s it hands out are relative to its own
//! [`ValueMesh::extent`], not to the mesh it was cut from. Views (`select`,
//! `select_range`, `split`, `rename`, `flatten`) work as on [`Shape`] and keep the
//! values of the ranks they keep.
//!
//! Invariant: `values.len() == shape.len()`.
//!
//! ```
//! use hyperactor_mesh::shape::Extent;
//! use hyperactor_mesh::value_mesh::ValueMesh;
//!
//! # fn main() -> Result<(), hyperactor_mesh::shape::ShapeError> {
//! let extent = Extent::new(["hosts", "gpus"], [2, 2])?;
//! // Replies arrive in any order, tagged with their index.
//! let replies = vec![(3, "d"), (0, "a"), (2, "c"), (1, "b")];
//! let mesh = ValueMesh::from_indexed(extent.region(), replies)?;
//! assert_eq!(mesh.values(), ["a", "b", "c", "d"]);
//!
//! let gpu1 = mesh.select("gpus", 1)?;
//! let pairs: Vec<_> = gpu1.iter().map(|(p, v)| (p.rank(), *v)).collect();
//! assert_eq!(pairs, vec![(0, "b"), (1, "d")]);
//! assert_eq!(mesh.map(str::len).into_values(), vec![1, 1, 1, 1]);
//! # Ok(())
//! # }
//! ```

use serde::{Deserialize, Deserializer, Serialize};

use crate::shape::{Extent, Point, Shape, ShapeError, SplitSpec};

/// One value per rank of a [`Shape`], in local row-major order; see the
/// [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ValueMesh<T> {
    shape: Shape,
    values: Vec<T>,
}

impl<T> ValueMesh<T> {
    /// A value mesh over `shape` with `values` in its local row-major order.
    ///
    /// # Errors
    ///
    /// [`ShapeError::ValueCountMismatch`] unless there is one value per rank.
    pub fn new(shape: Shape, values: Vec<T>) -> Result<Self, ShapeError> {
        if values.len() != shape.len() {
            return Err(ShapeError::ValueCountMismatch {
                values: values.len(),
                ranks: shape.len(),
                extent: shape.extent(),
            });
        }
        Ok(Self { shape, values })
    }

    /// A value mesh over the region of `extent` (global ranks `0..num_ranks`).
    ///
    /// # Errors
    ///
    /// [`ShapeError::ValueCountMismatch`] unless there is one value per rank.
    pub fn from_extent(extent: &Extent, values: Vec<T>) -> Result<Self, ShapeError> {
        Self::new(extent.region(), values)
    }

    /// A value mesh over `shape` from `(local index, value)` pairs in any order, which
    /// must give every index in `0..shape.len()` exactly once.
    ///
    /// # Errors
    ///
    /// [`ShapeError::IndexOutOfRange`] for an index not below `shape.len()`,
    /// [`ShapeError::DuplicateIndex`] for an index given twice, and
    /// [`ShapeError::MissingIndices`] naming the indices given no value.
    pub fn from_indexed(
        shape: Shape,
        pairs: impl IntoIterator<Item = (usize, T)>,
    ) -> Result<Self, ShapeError> {
        let len = shape.len();
        let mut slots: Vec<Option<T>> = std::iter::repeat_with(|| None).take(len).collect();
        for (index, value) in pairs {
            let slot = slots
                .get_mut(index)
                .ok_or(ShapeError::IndexOutOfRange { index, len })?;
            if slot.replace(value).is_some() {
                return Err(ShapeError::DuplicateIndex { index, len });
            }
        }
        let missing: Vec<usize> = (0..len).filter(|&i| slots[i].is_none()).collect();
        if !missing.is_empty() {
            return Err(ShapeError::MissingIndices { missing, len });
        }
        let values = slots.into_iter().flatten().collect();
        Ok(Self { shape, values })
    }

    /// The shape of this view.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The extent of this view; points are relative to it.
    pub fn extent(&self) -> Extent {
        self.shape.extent()
    }

    /// The number of values (of ranks).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there is no value (the shape has no rank).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The value at local row-major index `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&T> {
        self.values.get(index)
    }

    /// The value at `point`, which must lie in this mesh's extent.
    ///
    /// # Errors
    ///
    /// [`ShapeError::CoordinatesOutOfRange`] if `point` belongs to another extent.
    pub fn get_point(&self, point: &Point) -> Result<&T, ShapeError> {
        let extent = self.extent();
        if point.extent() != &extent {
            return Err(ShapeError::CoordinatesOutOfRange {
                coords: point.coords(),
                extent,
            });
        }
        Ok(&self.values[point.rank()])
    }

    /// `(point, value)` pairs in row-major order; points are relative to
    /// [`ValueMesh::extent`].
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Point, &T)> + '_ {
        let extent = self.extent();
        self.values
            .iter()
            .enumerate()
            .map(move |(rank, value)| (Point::new_unchecked(extent.clone(), rank), value))
    }

    /// The values, in row-major order.
    pub fn values(&self) -> &[T] {
        &self.values
    }

    /// The values, in row-major order, taken out.
    pub fn into_values(self) -> Vec<T> {
        self.values
    }

    /// The shape and the values, taken apart.
    pub fn into_parts(self) -> (Shape, Vec<T>) {
        (self.shape, self.values)
    }

    /// A value mesh of the same shape with `f` applied to each value, in order.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> ValueMesh<U> {
        ValueMesh {
            shape: self.shape,
            values: self.values.into_iter().map(f).collect(),
        }
    }

    /// [`Shape::split`], keeping the values (their order does not change).
    ///
    /// # Errors
    ///
    /// As [`Shape::split`].
    pub fn split(self, spec: &SplitSpec) -> Result<Self, ShapeError> {
        let shape = self.shape.split(spec)?;
        Ok(Self { shape, ..self })
    }

    /// [`Shape::rename`], keeping the values.
    ///
    /// # Errors
    ///
    /// As [`Shape::rename`].
    pub fn rename<O: Into<String>, N: Into<String>>(
        self,
        renames: impl IntoIterator<Item = (O, N)>,
    ) -> Result<Self, ShapeError> {
        let shape = self.shape.rename(renames)?;
        Ok(Self { shape, ..self })
    }

    /// [`Shape::flatten`], keeping the values.
    ///
    /// # Errors
    ///
    /// As [`Shape::flatten`].
    pub fn flatten(self, label: impl Into<String>) -> Result<Self, ShapeError> {
        let shape = self.shape.flatten(label)?;
        Ok(Self { shape, ..self })
    }
}

impl<T: Clone> ValueMesh<T> {
    /// [`Shape::select`], with the values of the ranks kept.
    ///
    /// # Errors
    ///
    /// As [`Shape::select`].
    pub fn select(&self, label: &str, index: usize) -> Result<Self, ShapeError> {
        self.view(self.shape.select(label, index)?)
    }

    /// [`Shape::select_range`], with the values of the ranks kept.
    ///
    /// # Errors
    ///
    /// As [`Shape::select_range`].
    pub fn select_range(
        &self,
        label: &str,
        start: usize,
        stop: usize,
        step: usize,
    ) -> Result<Self, ShapeError> {
        self.view(self.shape.select_range(label, start, stop, step)?)
    }

    /// The value mesh over `shape`, a view of some of this mesh's global ranks, with
    /// their values.
    ///
    /// # Errors
    ///
    /// [`ShapeError::RankNotInSlice`] if `shape` covers a rank this mesh does not.
    pub fn view(&self, shape: Shape) -> Result<Self, ShapeError> {
        let values = shape
            .iter()
            .map(|rank| Ok(self.values[self.shape.slice().index(rank)?].clone()))
            .collect::<Result<_, ShapeError>>()?;
        Ok(Self { shape, values })
    }
}

/// What a value mesh looks like on the wire (when reading).
#[derive(Deserialize)]
#[serde(rename = "ValueMesh")]
struct Wire<T> {
    shape: Shape,
    values: Vec<T>,
}

/// Validates like [`ValueMesh::new`].
impl<'de, T: Deserialize<'de>> Deserialize<'de> for ValueMesh<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        ValueMesh::new(wire.shape, wire.values).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Slice;

    fn mesh(labels: &[&str], sizes: &[usize]) -> ValueMesh<usize> {
        let extent = Extent::new(labels.iter().copied(), sizes.iter().copied()).unwrap();
        ValueMesh::from_extent(&extent, (0..extent.num_ranks()).collect()).unwrap()
    }

    #[test]
    fn new_checks_the_number_of_values() {
        let shape = Shape::new(["a"], Slice::new_row_major(vec![2]).unwrap()).unwrap();
        let err = ValueMesh::new(shape.clone(), vec![1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "1 value(s) given for a shape with extent {'a': 2} of 2 rank(s); pass exactly one \
             value per rank, in row-major order"
        );
        let vm = ValueMesh::new(shape.clone(), vec!['x', 'y']).unwrap();
        assert_eq!((vm.len(), vm.is_empty(), vm.shape()), (2, false, &shape));
        assert_eq!((vm.get(1), vm.get(2)), (Some(&'y'), None));
        assert_eq!(vm.into_parts(), (shape, vec!['x', 'y']));
    }

    #[test]
    fn from_indexed_needs_every_index_once() {
        let region = Extent::new(["a"], [3]).unwrap().region();
        let vm = ValueMesh::from_indexed(region.clone(), [(2, 'c'), (0, 'a'), (1, 'b')]).unwrap();
        assert_eq!(vm.values(), ['a', 'b', 'c']);
        let err = ValueMesh::from_indexed(region.clone(), [(0, 'a'), (0, 'b')]).unwrap_err();
        assert_eq!(err, ShapeError::DuplicateIndex { index: 0, len: 3 });
        assert_eq!(
            err.to_string(),
            "index 0 is given more than once; give every index in 0..3 exactly once"
        );
        let err = ValueMesh::from_indexed(region.clone(), [(1, 'b')]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no value for index(es) [0, 2]; give every index in 0..3 exactly once"
        );
        let err = ValueMesh::from_indexed(region, [(3, 'd')]).unwrap_err();
        assert_eq!(err, ShapeError::IndexOutOfRange { index: 3, len: 3 });
    }

    #[test]
    fn iter_yields_points_relative_to_the_view() {
        let vm = mesh(&["hosts", "gpus"], &[2, 4]);
        let sub = vm
            .select("hosts", 1)
            .unwrap()
            .select_range("gpus", 1, 4, 2)
            .unwrap();
        assert_eq!(sub.values(), [5, 7]);
        let items: Vec<(String, usize)> = sub.iter().map(|(p, v)| (p.to_string(), *v)).collect();
        assert_eq!(
            items,
            [("{'gpus': 0/2}".into(), 5), ("{'gpus': 1/2}".into(), 7)]
        );
        let point = sub.extent().point(1).unwrap();
        assert_eq!(sub.get_point(&point), Ok(&7));
        let foreign = vm.extent().point(1).unwrap();
        assert!(matches!(
            sub.get_point(&foreign),
            Err(ShapeError::CoordinatesOutOfRange { .. })
        ));
        assert_eq!(sub.select("gpus", 1).unwrap().values(), [7]);
    }

    #[test]
    fn reshaping_keeps_the_values_in_order() {
        let vm = mesh(&["hosts", "gpus"], &[2, 4]);
        assert_eq!(
            vm.clone().flatten("r").unwrap().values(),
            (0..8).collect::<Vec<_>>()
        );
        let split = vm
            .clone()
            .split(&SplitSpec::new().split("gpus", ["a", "b"]).size("b", 2))
            .unwrap();
        let point = split.extent().point_at(&[1, 1, 0]).unwrap();
        assert_eq!(split.get_point(&point), Ok(&6));
        let renamed = vm.clone().rename([("hosts", "nodes")]).unwrap();
        assert_eq!(renamed.extent().labels(), ["nodes", "gpus"]);
        let strided = vm.select_range("gpus", 0, 4, 2).unwrap();
        assert!(matches!(
            strided.flatten("r"),
            Err(ShapeError::NotDense { .. })
        ));
    }

    #[test]
    fn view_needs_ranks_of_the_mesh() {
        let vm = mesh(&["gpus"], &[4]);
        let outside = Shape::new(["gpus"], Slice::new_row_major_at(2, vec![4]).unwrap()).unwrap();
        assert!(matches!(
            vm.view(outside),
            Err(ShapeError::RankNotInSlice { rank: 4, .. })
        ));
    }

    #[test]
    fn map_and_into_values() {
        let vm = mesh(&["a"], &[3]).map(|v| v * 10);
        assert_eq!(vm.values(), [0, 10, 20]);
        assert_eq!(vm.into_values(), vec![0, 10, 20]);
    }

    #[test]
    fn serde_round_trip_and_validation() {
        let vm = mesh(&["a"], &[2]);
        let json = serde_json::to_string(&vm).unwrap();
        assert_eq!(serde_json::from_str::<ValueMesh<usize>>(&json).unwrap(), vm);
        let bad = json.replace("[0,1]", "[0]");
        assert_ne!(bad, json);
        let err = serde_json::from_str::<ValueMesh<usize>>(&bad).unwrap_err();
        assert!(err.to_string().contains("1 value(s) given"), "{err}");
    }
}
