//! `Extent`, `Point`, `Slice` and `Shape`: the shape algebra of
//! [`hyperactor_mesh::shape`], bound for Python.
//!
//! The classes are thin: each holds the Rust value and forwards to it. What is
//! Python's own is handled here: argument types, negative numbers (refused with the
//! error a Rust `usize` would give for an out-of-range value), Python `slice` objects
//! (`Shape.select`), the dict form of `Shape.split`, and the `Mapping` protocol of
//! `Extent` and `Point` (both are registered as `collections.abc.Mapping`s).
//!
//! For speed on hot paths (a `Point` per message, `ValueMesh.items()`), an `Extent`
//! keeps its labels as a Python tuple, and a `Point` keeps the `Extent` object it was
//! made with, so `p.extent`, iteration and `dict(p)` make no new strings.

use hyperactor_mesh::shape::{Extent, Point};
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyList, PyMapping, PyString, PyTuple};

mod args;
mod view;

use args::{
    hash_of, int_arg, labels_arg, mapping_view, repr, shape_err, sizes_arg, type_name, Reduce, View,
};
pub use view::{PyShape, PySlice};

/// A `label` argument as a Rust string; `None` if it is not a `str`.
fn label_str<'a>(label: &'a Bound<'_, PyAny>) -> Option<&'a str> {
    label.cast::<PyString>().ok().and_then(|s| s.to_str().ok())
}

/// The error for a `label` that is not a `str`, hence no dimension.
fn not_a_label(label: &Bound<'_, PyAny>, extent: &Extent) -> PyErr {
    let err = hyperactor_mesh::shape::ShapeError::UnknownDimension {
        label: repr(label),
        labels: extent.labels().to_vec(),
    };
    shape_err(err)
}

/// The ordered, named sizes of a mesh: a `Mapping` from dimension label to size.
///
/// `Extent(labels, sizes)`: labels are distinct strings, sizes ints >= 0, one per
/// label. `TypeError` for a label that is not a `str` (or labels given as one `str`)
/// or a size that is not an `int`; `ValueError` for a count mismatch, a negative size
/// or a repeated label. An unknown label raises `ValueError` (not `KeyError`).
#[pyclass(module = "monarch._rust_bindings", name = "Extent", frozen, mapping)]
#[derive(Debug)]
pub struct PyExtent {
    extent: Extent,
    labels: Py<PyTuple>,
}

impl PyExtent {
    /// Wraps a Rust extent.
    pub(crate) fn from_extent(py: Python<'_>, extent: Extent) -> PyResult<Self> {
        let labels = PyTuple::new(py, extent.labels())?.unbind();
        Ok(Self { extent, labels })
    }

    /// The Rust extent.
    pub fn extent(&self) -> &Extent {
        &self.extent
    }
}

#[pymethods]
impl PyExtent {
    #[new]
    fn new(labels: &Bound<'_, PyAny>, sizes: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (tuple, names) = labels_arg("Extent", labels)?;
        let sizes = sizes_arg("Extent", &names, sizes)?;
        let extent = Extent::new(names, sizes).map_err(shape_err)?;
        Ok(Self {
            extent,
            labels: tuple.unbind(),
        })
    }

    /// The dimension labels, in order (a fresh list).
    #[getter]
    fn labels<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.labels.bind(py).to_list()
    }

    /// The dimension sizes, in label order (a fresh list).
    #[getter]
    fn sizes(&self) -> Vec<usize> {
        self.extent.sizes().to_vec()
    }

    /// The number of points: the product of the sizes (1 with no dimensions).
    #[getter]
    fn nelements(&self) -> usize {
        self.extent.num_ranks()
    }

    /// The dense, row-major region this extent spans, as a `Shape` at offset 0.
    #[getter]
    fn region(&self) -> PyShape {
        PyShape::from(self.extent.region())
    }

    fn __getitem__(&self, label: &Bound<'_, PyAny>) -> PyResult<usize> {
        let Some(name) = label_str(label) else {
            return Err(not_a_label(label, &self.extent));
        };
        self.extent.size(name).map_err(shape_err)
    }

    fn __contains__(&self, label: &Bound<'_, PyAny>) -> bool {
        label_str(label).is_some_and(|name| self.extent.contains(name))
    }

    /// `self[label]`, or `default` when there is no such dimension.
    #[pyo3(signature = (label, default = None))]
    fn get(
        &self,
        py: Python<'_>,
        label: &Bound<'_, PyAny>,
        default: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        match label_str(label).and_then(|name| self.extent.size(name).ok()) {
            Some(size) => Ok(size.into_pyobject(py)?.into_any().unbind()),
            None => Ok(default.unwrap_or_else(|| py.None())),
        }
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        self.labels.bind(py).as_any().try_iter()
    }

    fn __len__(&self) -> usize {
        self.extent.num_dims()
    }

    /// A `KeysView` of the labels.
    fn keys<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        mapping_view(View::Keys, slf.as_any())
    }

    /// A `ValuesView` of the sizes.
    fn values<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        mapping_view(View::Values, slf.as_any())
    }

    /// An `ItemsView` of `(label, size)` pairs.
    fn items<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        mapping_view(View::Items, slf.as_any())
    }

    fn __eq__(&self, other: PyRef<'_, Self>) -> bool {
        self.extent == other.extent
    }

    fn __hash__(&self) -> u64 {
        hash_of(&self.extent)
    }

    fn __repr__(&self) -> String {
        format!("Extent({})", self.extent)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> Reduce<'py, (Bound<'py, PyList>, Vec<usize>)> {
        let this = slf.get();
        Ok((
            slf.get_type().into_any(),
            (this.labels(slf.py()), this.sizes()),
        ))
    }
}

/// A position in a mesh: a `Mapping` from dimension label to coordinate.
///
/// `Point(rank, extent)`: `rank` is the row-major linear index of the point within
/// `extent` (the last dimension varies fastest). `TypeError` if `rank` is not an `int`
/// or `extent` not an `Extent`; `IndexError` unless `0 <= rank < extent.nelements`. An
/// unknown label raises `ValueError`.
#[pyclass(module = "monarch._rust_bindings", name = "Point", frozen, mapping)]
#[derive(Debug)]
pub struct PyPoint {
    point: Point,
    extent: Py<PyExtent>,
}

impl PyPoint {
    /// Wraps a Rust point.
    pub(crate) fn from_point(py: Python<'_>, point: Point) -> PyResult<Self> {
        let extent = Py::new(py, PyExtent::from_extent(py, point.extent().clone())?)?;
        Ok(Self { point, extent })
    }

    /// The Rust point.
    pub fn point(&self) -> &Point {
        &self.point
    }
}

#[pymethods]
impl PyPoint {
    #[new]
    fn new(rank: &Bound<'_, PyAny>, extent: &Bound<'_, PyAny>) -> PyResult<Self> {
        let Ok(extent) = extent.cast::<PyExtent>() else {
            return Err(PyTypeError::new_err(format!(
                "Point: extent must be an Extent, got {}; build one with Extent(labels, sizes)",
                type_name(extent)
            )));
        };
        let rank = int_arg("Point: rank", rank)?;
        let inner = &extent.get().extent;
        let Ok(rank) = usize::try_from(rank) else {
            let n = inner.num_ranks();
            return Err(PyIndexError::new_err(format!(
                "rank {rank} is out of range for extent {inner}, which has {n} point(s); \
                 expected 0 <= rank < {n}"
            )));
        };
        let point = Point::new(inner.clone(), rank).map_err(shape_err)?;
        Ok(Self {
            point,
            extent: extent.clone().unbind(),
        })
    }

    /// The row-major linear index of this point within `extent`.
    #[getter]
    fn rank(&self) -> usize {
        self.point.rank()
    }

    /// The extent this point lies in.
    #[getter]
    fn extent(&self, py: Python<'_>) -> Py<PyExtent> {
        self.extent.clone_ref(py)
    }

    /// The size of dimension `label` of `extent` (`ValueError` if unknown).
    fn size(&self, label: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.extent.get().__getitem__(label)
    }

    fn __getitem__(&self, label: &Bound<'_, PyAny>) -> PyResult<usize> {
        let Some(name) = label_str(label) else {
            return Err(not_a_label(label, self.point.extent()));
        };
        self.point.coord(name).map_err(shape_err)
    }

    fn __contains__(&self, label: &Bound<'_, PyAny>) -> bool {
        self.extent.get().__contains__(label)
    }

    /// `self[label]`, or `default` when there is no such dimension.
    #[pyo3(signature = (label, default = None))]
    fn get(
        &self,
        py: Python<'_>,
        label: &Bound<'_, PyAny>,
        default: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        match label_str(label).and_then(|name| self.point.coord(name).ok()) {
            Some(coord) => Ok(coord.into_pyobject(py)?.into_any().unbind()),
            None => Ok(default.unwrap_or_else(|| py.None())),
        }
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        self.extent.get().__iter__(py)
    }

    fn __len__(&self) -> usize {
        self.point.num_dims()
    }

    /// A `KeysView` of the labels.
    fn keys<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        mapping_view(View::Keys, slf.as_any())
    }

    /// A `ValuesView` of the coordinates.
    fn values<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        mapping_view(View::Values, slf.as_any())
    }

    /// An `ItemsView` of `(label, coordinate)` pairs.
    fn items<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        mapping_view(View::Items, slf.as_any())
    }

    fn __eq__(&self, other: PyRef<'_, Self>) -> bool {
        self.point == other.point
    }

    fn __hash__(&self) -> u64 {
        hash_of(&self.point)
    }

    fn __repr__(&self) -> String {
        self.point.to_string()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> Reduce<'py, (usize, Py<PyExtent>)> {
        let this = slf.get();
        Ok((
            slf.get_type().into_any(),
            (this.rank(), this.extent(slf.py())),
        ))
    }
}

/// Adds the shape classes to the module, and registers `Extent` and `Point` as
/// `collections.abc.Mapping`s.
///
/// # Errors
///
/// Fails if a class cannot be added or registered.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyExtent>()?;
    m.add_class::<PyPoint>()?;
    m.add_class::<PySlice>()?;
    m.add_class::<PyShape>()?;
    PyMapping::register::<PyExtent>(m.py())?;
    PyMapping::register::<PyPoint>(m.py())?;
    Ok(())
}
