//! The records of a raw scan batch (`sowstream.wire.rawscan`, layout version 1) split in one
//! call, so a client reading a full scan pays no Python work per record header.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::stored_head;

/// Record `[start, end)` of `raw` as `(key, body, offset, timestamp, expiration)`, or None where
/// `RawBatch.record` would refuse it (it then names the problem itself).
fn record<'py>(
    py: Python<'py>,
    raw: &[u8],
    start: usize,
    end: usize,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Some(stored) = raw.get(start..end) else {
        return Ok(None);
    };
    let Some(head) = stored_head(stored) else {
        return Ok(None);
    };
    let Ok(key) = std::str::from_utf8(&stored[head.key.clone()]) else {
        return Ok(None);
    };
    let item = (
        PyString::new(py, key),
        PyBytes::new(py, &stored[head.key.end..]),
        head.offset,
        head.timestamp,
        head.expiration,
    );
    Ok(Some(item.into_pyobject(py)?))
}

/// Per record of a raw batch whose records span `[starts[i], ends[i])` of `block`: the tuple
/// `RawBatch.record(i)` returns, or None where that raises.
#[pyfunction]
pub fn raw_records<'py>(
    py: Python<'py>,
    block: &Bound<'py, PyBytes>,
    starts: Vec<usize>,
    ends: Vec<usize>,
) -> PyResult<Bound<'py, PyList>> {
    let raw = block.as_bytes();
    let out = PyList::empty(py);
    for (&start, &end) in starts.iter().zip(ends.iter()) {
        match record(py, raw, start, end)? {
            Some(item) => out.append(item)?,
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}
