//! Argument conversion and error mapping shared by the shape classes.
//!
//! Python passes any objects; these helpers turn them into the Rust values the
//! `hyperactor_mesh::shape` API takes, raising `TypeError` for a wrong type and
//! `ValueError` or `IndexError` for a negative number (which a `usize` cannot hold)
//! with messages that name the argument. Everything else is checked by the Rust API,
//! whose [`ShapeError`]s [`shape_err`] maps to Python exceptions.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use hyperactor_mesh::shape::ShapeError;
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyInt, PyString, PyTuple, PyType};

/// A [`ShapeError`] as a Python exception: `IndexError` for an index or rank out of
/// range, `ValueError` for everything else.
pub(crate) fn shape_err(err: ShapeError) -> PyErr {
    match err {
        ShapeError::RankOutOfRange { .. }
        | ShapeError::CoordinatesOutOfRange { .. }
        | ShapeError::IndexOutOfRange { .. }
        | ShapeError::SelectOutOfRange { .. } => PyIndexError::new_err(err.to_string()),
        _ => PyValueError::new_err(err.to_string()),
    }
}

/// `repr(obj)`, or a placeholder if `repr` itself fails.
pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "<unprintable object>".to_string(), |r| r.to_string())
}

/// Labels shown as Python shows a list of `str`: `['hosts', 'gpus']`.
pub(crate) fn label_list(labels: &[String]) -> String {
    let quoted: Vec<String> = labels.iter().map(|l| format!("'{l}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// `type(obj).__name__`.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string())
}

/// `obj` as an `i64` if it is an `int` (a `bool` is not), else `None`.
pub(crate) fn as_int(obj: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if obj.is_exact_instance_of::<PyInt>()
        || (obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>())
    {
        return obj.extract::<i64>().map(Some).map_err(|_| {
            PyValueError::new_err(format!(
                "{} is too large: sizes, ranks and indices must fit in 64 bits",
                repr(obj)
            ))
        });
    }
    Ok(None)
}

/// `obj` as an `i64`, or a `TypeError` saying `what` must be an int.
pub(crate) fn int_arg(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    as_int(obj)?.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what} must be an int, got {} ({})",
            repr(obj),
            type_name(obj)
        ))
    })
}

/// The labels argument of `Extent(labels, sizes)` and `Shape(labels, slice)`: a
/// sequence of `str` (not a `str` itself). Returns it as a tuple (the argument itself
/// when it is one) and as Rust strings.
pub(crate) fn labels_arg<'py>(
    what: &str,
    labels: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyTuple>, Vec<String>)> {
    if let Ok(label) = labels.cast::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{what}: labels must be a sequence of strings, got the string {}; wrap it in a \
             list, e.g. [{}]",
            repr(label.as_any()),
            repr(label.as_any())
        )));
    }
    let tuple = match labels.cast_exact::<PyTuple>() {
        Ok(tuple) => tuple.clone(),
        Err(_) => PyTuple::new(
            labels.py(),
            labels.try_iter()?.collect::<PyResult<Vec<_>>>()?,
        )?,
    };
    let mut names = Vec::with_capacity(tuple.len());
    for item in tuple.iter() {
        let Ok(label) = item.cast::<PyString>() else {
            return Err(PyTypeError::new_err(format!(
                "{what}: every label must be a str, got {} ({}); name dimensions with \
                 strings such as 'hosts'",
                repr(&item),
                type_name(&item)
            )));
        };
        names.push(label.to_str()?.to_owned());
    }
    Ok((tuple, names))
}

/// The sizes argument of `Extent(labels, sizes)`: a sequence of ints >= 0, one per
/// label (the count is checked by the Rust API).
pub(crate) fn sizes_arg(
    what: &str,
    labels: &[String],
    sizes: &Bound<'_, PyAny>,
) -> PyResult<Vec<usize>> {
    let mut out = Vec::with_capacity(labels.len());
    for (i, item) in sizes.try_iter()?.enumerate() {
        let item = item?;
        let dim = labels
            .get(i)
            .map_or_else(|| format!("#{i}"), |l| format!("'{l}'"));
        let size = int_arg(&format!("{what}: the size of dimension {dim}"), &item)?;
        let size = usize::try_from(size).map_err(|_| {
            PyValueError::new_err(format!(
                "{what}: dimension {dim} has negative size {size}; sizes must be >= 0"
            ))
        })?;
        out.push(size);
    }
    Ok(out)
}

/// A sequence of ints >= 0 (`Slice` sizes and strides); `minimum` is what the message
/// for a negative one asks for.
pub(crate) fn uints_arg(
    what: &str,
    name: &str,
    minimum: usize,
    values: &Bound<'_, PyAny>,
) -> PyResult<Vec<usize>> {
    let ints = values
        .try_iter()?
        .map(|item| int_arg(&format!("{what}: {name}"), &item?))
        .collect::<PyResult<Vec<i64>>>()?;
    if ints.iter().any(|&v| v < 0) {
        return Err(PyValueError::new_err(format!(
            "{what}: {name} must be >= {minimum}, got {ints:?}"
        )));
    }
    Ok(ints.into_iter().map(|v| v as usize).collect())
}

/// What `__reduce__` returns: a callable and its arguments.
pub(crate) type Reduce<'py, A> = PyResult<(Bound<'py, PyAny>, A)>;

/// A Rust hash of `value`, as `__hash__` returns it.
pub(crate) fn hash_of<T: Hash>(value: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

static KEYS_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static VALUES_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static ITEMS_VIEW: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Which `collections.abc` view a mapping method returns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View {
    Keys,
    Values,
    Items,
}

/// `collections.abc.KeysView(mapping)` (or `ValuesView`, `ItemsView`): what the
/// `keys()`, `values()` and `items()` of a `Mapping` return.
pub(crate) fn mapping_view<'py>(
    view: View,
    mapping: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = mapping.py();
    let (cell, name) = match view {
        View::Keys => (&KEYS_VIEW, "KeysView"),
        View::Values => (&VALUES_VIEW, "ValuesView"),
        View::Items => (&ITEMS_VIEW, "ItemsView"),
    };
    cell.import(py, "collections.abc", name)?.call1((mapping,))
}
