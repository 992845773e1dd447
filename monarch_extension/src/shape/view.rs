//! `Slice` and `Shape`: strided global ranks, and the named views of meshes.
//!
//! `Shape.select` takes an `int` (selects and removes the dimension) or a Python
//! `slice` (keeps it, restricted; positive steps only), converted here to
//! [`Shape::select`] and [`Shape::select_range`]. `Shape.split` takes the dict form of
//! `MeshTrait.split` (an existing label maps to a tuple of new names, a new name to its
//! size), converted here to a [`SplitSpec`].

use hyperactor_mesh::shape::{Shape, Slice, SplitSpec};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyDict, PyIterator, PyList, PySequence, PySlice as PyBuiltinSlice, PySliceMethods, PyString,
};

use super::args::{
    as_int, hash_of, int_arg, label_list, labels_arg, repr, shape_err, type_name, uints_arg, Reduce,
};
use super::{PyExtent, PyPoint};

/// An `offset` plus per-dimension `sizes` and `strides` over global ranks.
///
/// `Slice(*, offset, sizes, strides)` maps local coordinate `(c_0, ..., c_n)` to global
/// rank `offset + sum(c_i * strides[i])`; local indices enumerate coordinates in
/// row-major order. `TypeError` for a value that is not an int; `ValueError` for a
/// negative offset or size, a stride below 1, or one stride per size missing.
#[pyclass(module = "monarch._rust_bindings", name = "Slice", frozen)]
#[derive(Debug)]
pub struct PySlice {
    slice: Slice,
}

impl From<Slice> for PySlice {
    fn from(slice: Slice) -> Self {
        Self { slice }
    }
}

impl PySlice {
    /// The Rust slice.
    pub fn slice(&self) -> &Slice {
        &self.slice
    }
}

fn offset_arg(offset: &Bound<'_, PyAny>) -> PyResult<usize> {
    let offset = int_arg("Slice: offset", offset)?;
    usize::try_from(offset)
        .map_err(|_| PyValueError::new_err(format!("Slice: offset must be >= 0, got {offset}")))
}

#[pymethods]
impl PySlice {
    #[new]
    #[pyo3(signature = (*, offset, sizes, strides))]
    fn new(
        offset: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        strides: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Self::_from_parts(offset, sizes, strides)
    }

    /// Rebuilds a pickled `Slice` (the constructor takes keywords only).
    #[staticmethod]
    fn _from_parts(
        offset: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        strides: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let offset = offset_arg(offset)?;
        let sizes = uints_arg("Slice", "sizes", 0, sizes)?;
        let strides = uints_arg("Slice", "strides", 1, strides)?;
        let slice = Slice::new(offset, sizes, strides).map_err(shape_err)?;
        Ok(Self { slice })
    }

    /// A dense slice over `sizes` starting at `offset` (row-major strides).
    #[staticmethod]
    #[pyo3(signature = (sizes, offset = None))]
    fn new_row_major(
        sizes: &Bound<'_, PyAny>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let offset = offset.map(offset_arg).transpose()?.unwrap_or(0);
        let sizes = uints_arg("Slice", "sizes", 0, sizes)?;
        let slice = Slice::new_row_major_at(offset, sizes).map_err(shape_err)?;
        Ok(Self { slice })
    }

    /// The global rank of local index 0.
    #[getter]
    fn offset(&self) -> usize {
        self.slice.offset()
    }

    /// The per-dimension sizes (a fresh list).
    #[getter]
    fn sizes(&self) -> Vec<usize> {
        self.slice.sizes().to_vec()
    }

    /// The per-dimension strides, in global ranks (a fresh list).
    #[getter]
    fn strides(&self) -> Vec<usize> {
        self.slice.strides().to_vec()
    }

    /// The number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.slice.num_dims()
    }

    fn __len__(&self) -> usize {
        self.slice.len()
    }

    /// Whether the slice covers `len(self)` consecutive global ranks in order.
    /// Dimensions of size 1 do not matter; an empty slice is dense.
    fn is_dense(&self) -> bool {
        self.slice.is_dense()
    }

    /// The global rank at local (row-major) `index`.
    fn __getitem__(&self, index: &Bound<'_, PyAny>) -> PyResult<usize> {
        let Some(index) = as_int(index)? else {
            return Err(PyTypeError::new_err(format!(
                "Slice indices must be ints, got {}",
                type_name(index)
            )));
        };
        let len = self.slice.len();
        let Ok(index) = usize::try_from(index) else {
            return Err(PyIndexError::new_err(format!(
                "local index {index} is out of range for a view of {len} rank(s); expected \
                 0 <= index < {len} (negative indices are not allowed)"
            )));
        };
        self.slice.get(index).map_err(shape_err)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        PyList::new(py, self.slice.iter())?.as_any().try_iter()
    }

    /// The global ranks covered, in local (row-major) order.
    fn ranks(&self) -> Vec<usize> {
        self.slice.ranks()
    }

    /// The local (row-major) index of global `rank` (`ValueError` if not covered).
    fn index(&self, rank: &Bound<'_, PyAny>) -> PyResult<usize> {
        let rank = int_arg("Slice.index: rank", rank)?;
        let Ok(rank) = usize::try_from(rank) else {
            return Err(PyValueError::new_err(format!(
                "global rank {rank} is not in {}: ranks are never negative",
                self.slice
            )));
        };
        self.slice.index(rank).map_err(shape_err)
    }

    fn __contains__(&self, rank: &Bound<'_, PyAny>) -> bool {
        rank.extract::<usize>()
            .is_ok_and(|rank| self.slice.contains(rank))
    }

    fn __eq__(&self, other: PyRef<'_, Self>) -> bool {
        self.slice == other.slice
    }

    fn __hash__(&self) -> u64 {
        hash_of(&self.slice)
    }

    fn __repr__(&self) -> String {
        self.slice.to_string()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> Reduce<'py, (usize, Vec<usize>, Vec<usize>)> {
        let slice = &slf.get().slice;
        Ok((
            slf.get_type().getattr("_from_parts")?,
            (
                slice.offset(),
                slice.sizes().to_vec(),
                slice.strides().to_vec(),
            ),
        ))
    }
}

/// The labels and `Slice` of a mesh view: which global ranks, laid out how.
///
/// `Shape(labels, slice)`: one distinct `str` label per dimension of `slice`.
/// `TypeError` if `slice` is not a `Slice` or a label not a `str`; `ValueError` for a
/// count mismatch or a repeated label.
#[pyclass(module = "monarch._rust_bindings", name = "Shape", frozen)]
#[derive(Debug)]
pub struct PyShape {
    shape: Shape,
}

impl From<Shape> for PyShape {
    fn from(shape: Shape) -> Self {
        Self { shape }
    }
}

impl PyShape {
    /// The Rust shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
}

/// `Shape.select(label, index)` for an `int` index.
fn select_int(shape: &Shape, label: &str, size: usize, index: i64) -> PyResult<Shape> {
    let Ok(index) = usize::try_from(index) else {
        return Err(PyIndexError::new_err(format!(
            "index {index} is out of range for dimension '{label}' of size {size}; expected \
             0 <= {label} < {size} (negative indices are not allowed)"
        )));
    };
    shape.select(label, index).map_err(shape_err)
}

/// `Shape.select(label, index)` for a `slice` index.
fn select_slice(
    shape: &Shape,
    label: &str,
    size: usize,
    index: &Bound<'_, PyBuiltinSlice>,
) -> PyResult<Shape> {
    let step = index.getattr("step")?;
    if !step.is_none() && as_int(&step)?.is_none_or(|s| s <= 0) {
        return Err(PyValueError::new_err(format!(
            "cannot slice dimension '{label}' with step {}: steps must be positive ints; \
             select in increasing order, e.g. {label}=slice(None, None, 2)",
            repr(&step)
        )));
    }
    let len = isize::try_from(size)
        .map_err(|_| PyValueError::new_err(format!("dimension '{label}' is too large")))?;
    let indices = index.indices(len)?;
    // With a positive step, `slice.indices` gives 0 <= start, stop <= size.
    let (start, stop) = (indices.start.max(0) as usize, indices.stop.max(0) as usize);
    shape
        .select_range(label, start, stop, indices.step as usize)
        .map_err(shape_err)
}

/// The dict form of `split` (see `MeshTrait.split`) as a [`SplitSpec`].
fn split_spec(shape: &Shape, spec: &Bound<'_, PyAny>) -> PyResult<SplitSpec> {
    let items = match spec.cast::<PyDict>() {
        Ok(dict) => dict.items().into_any(),
        Err(_) => spec.call_method0("items")?,
    };
    let labels = shape.labels();
    let mut out = SplitSpec::new();
    for item in items.try_iter()? {
        let (name, value): (String, Bound<'_, PyAny>) = item?.extract()?;
        let value_repr = repr(&value);
        if labels.contains(&name) {
            if as_int(&value)?.is_some() {
                return Err(PyValueError::new_err(format!(
                    "{name}={value_repr} names an existing dimension; give its new names as \
                     a tuple, e.g. {name}=('a', 'b'), and constrain the size of a new name \
                     instead, e.g. b=2"
                )));
            }
            let names = match value.cast::<PySequence>() {
                Ok(seq) if !value.is_instance_of::<PyString>() => seq
                    .try_iter()?
                    .map(|n| n?.extract::<String>())
                    .collect::<PyResult<Vec<String>>>()
                    .ok(),
                _ => None,
            };
            let Some(names) = names else {
                return Err(PyTypeError::new_err(format!(
                    "cannot split dimension '{name}': expected a tuple of new dimension \
                     names, got {value_repr}; write e.g. {name}=('a', 'b') (or \
                     {name}=({value_repr},) to rename it)"
                )));
            };
            out = out.split(name, names);
        } else {
            let size = as_int(&value)?.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "'{name}' is not a dimension (expected one of {}), so \
                     {name}={value_repr} must be the int size of a new dimension",
                    label_list(labels)
                ))
            })?;
            let size = usize::try_from(size).map_err(|_| {
                PyValueError::new_err(format!(
                    "new dimension '{name}' has size {size}; sizes of new dimensions must \
                     be >= 1"
                ))
            })?;
            out = out.size(name, size);
        }
    }
    Ok(out)
}

#[pymethods]
impl PyShape {
    #[new]
    fn new(labels: &Bound<'_, PyAny>, slice: &Bound<'_, PyAny>) -> PyResult<Self> {
        let Ok(slice) = slice.cast::<PySlice>() else {
            return Err(PyTypeError::new_err(format!(
                "Shape: slice must be a Slice, got {}; build one with Slice(offset=..., \
                 sizes=..., strides=...) or Slice.new_row_major(sizes)",
                type_name(slice)
            )));
        };
        let (_, names) = labels_arg("Shape", labels)?;
        let shape = Shape::new(names, slice.get().slice.clone()).map_err(shape_err)?;
        Ok(Self { shape })
    }

    /// The zero-dimensional shape of the single rank 0.
    #[staticmethod]
    fn unity() -> Self {
        Self::from(Shape::unity())
    }

    /// The dimension labels, in order (a fresh list).
    #[getter]
    fn labels(&self) -> Vec<String> {
        self.shape.labels().to_vec()
    }

    /// The `Slice` mapping local coordinates to global ranks.
    #[getter]
    fn ndslice(&self) -> PySlice {
        PySlice::from(self.shape.slice().clone())
    }

    /// The extent of this view: its labels with their sizes.
    #[getter]
    fn extent(&self, py: Python<'_>) -> PyResult<PyExtent> {
        PyExtent::from_extent(py, self.shape.extent())
    }

    /// The global ranks of this view, in row-major order of its coordinates.
    fn ranks(&self) -> Vec<usize> {
        self.shape.ranks()
    }

    fn __len__(&self) -> usize {
        self.shape.len()
    }

    /// The `Point` (relative to `extent`) of global `rank` (`ValueError` if not in view).
    fn coordinates(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<PyPoint> {
        let rank = int_arg("Shape.coordinates: rank", rank)?;
        let Ok(rank) = usize::try_from(rank) else {
            return Err(PyValueError::new_err(format!(
                "global rank {rank} is not in {}: ranks are never negative",
                self.shape
            )));
        };
        PyPoint::from_point(py, self.shape.coordinates(rank).map_err(shape_err)?)
    }

    /// Restricts dimension `label`: an int selects one coordinate and removes the
    /// dimension; a `slice` keeps it, restricted (positive steps only).
    fn select(&self, label: &str, index: &Bound<'_, PyAny>) -> PyResult<Self> {
        let size = self.shape.size(label).map_err(shape_err)?;
        let shape = if let Ok(slice) = index.cast::<PyBuiltinSlice>() {
            select_slice(&self.shape, label, size, slice)?
        } else if let Some(index) = as_int(index)? {
            select_int(&self.shape, label, size, index)?
        } else {
            return Err(PyTypeError::new_err(format!(
                "cannot select dimension '{label}' with {} ({}): expected an int (selects \
                 and removes the dimension) or a slice (keeps it), e.g. {label}=0 or \
                 {label}=slice(0, 2)",
                repr(index),
                type_name(index)
            )));
        };
        Ok(Self::from(shape))
    }

    /// Selects coordinate `index` of dimension `label` and removes the dimension (as
    /// `select` with an int); out of range is a `ValueError`, a negative index an
    /// `OverflowError`.
    fn at(&self, label: &str, index: usize) -> PyResult<Self> {
        let size = self.shape.size(label).map_err(shape_err)?;
        if index >= size {
            return Err(PyValueError::new_err(format!(
                "index {index} is out of range for dimension '{label}' of size {size}; \
                 expected 0 <= {label} < {size}"
            )));
        }
        Ok(Self::from(
            self.shape.select(label, index).map_err(shape_err)?,
        ))
    }

    /// Splits dimensions into several: `spec` maps an existing label to a tuple of new
    /// names (outermost first), and a new name to its size; at most one size per split
    /// may be left out, and is inferred.
    fn split(&self, spec: &Bound<'_, PyAny>) -> PyResult<Self> {
        let spec = split_spec(&self.shape, spec)?;
        Ok(Self::from(self.shape.split(&spec).map_err(shape_err)?))
    }

    /// Relabels dimensions: `old_to_new` maps old labels to new ones.
    fn rename(&self, old_to_new: &Bound<'_, PyAny>) -> PyResult<Self> {
        let items = match old_to_new.cast::<PyDict>() {
            Ok(dict) => dict.items().into_any(),
            Err(_) => old_to_new.call_method0("items")?,
        };
        let mut renames = Vec::new();
        for item in items.try_iter()? {
            let (old, new): (String, Bound<'_, PyAny>) = item?.extract()?;
            self.shape.dim(&old).map_err(shape_err)?;
            let Ok(new) = new.extract::<String>() else {
                return Err(PyTypeError::new_err(format!(
                    "cannot rename dimension '{old}' to {}: the new name must be a str, \
                     e.g. {old}='nodes'",
                    repr(&new)
                )));
            };
            renames.push((old, new));
        }
        Ok(Self::from(self.shape.rename(renames).map_err(shape_err)?))
    }

    /// Merges all dimensions of a dense view into one named `name` (`ValueError` if
    /// the view is not dense).
    fn flatten(&self, name: &Bound<'_, PyAny>) -> PyResult<Self> {
        let Ok(name) = name.extract::<String>() else {
            return Err(PyTypeError::new_err(format!(
                "cannot flatten: the new dimension name must be a str, got {}",
                repr(name)
            )));
        };
        Ok(Self::from(self.shape.flatten(name).map_err(shape_err)?))
    }

    fn __eq__(&self, other: PyRef<'_, Self>) -> bool {
        self.shape == other.shape
    }

    fn __hash__(&self) -> u64 {
        hash_of(&self.shape)
    }

    fn __repr__(&self) -> String {
        self.shape.to_string()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> Reduce<'py, (Vec<String>, PySlice)> {
        let this = slf.get();
        Ok((slf.get_type().into_any(), (this.labels(), this.ndslice())))
    }
}
