//! The records of a raw scan batch (`sowstream.wire.rawscan`, layout version 1) split in one
//! call, so a client reading a full scan pays no Python work per record header.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

const PLAIN: u8 = 0x01;
const EXPIRING: u8 = 0x03;
// marker u8, log offset i64, log timestamp i64, SowKey length u32 (then for EXPIRING an i64).
const HEAD: usize = 1 + 8 + 8 + 4;

fn be_i64(raw: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[at..at + 8]);
    i64::from_be_bytes(b)
}

/// Record `[start, end)` of `raw` as `(key, body, offset, timestamp, expiration)`, or None where
/// `RawBatch.record` would refuse it (it then names the problem itself).
fn record<'py>(
    py: Python<'py>,
    raw: &[u8],
    start: usize,
    end: usize,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    if end > raw.len() || start > end || end - start < HEAD {
        return Ok(None);
    }
    let marker = raw[start];
    let key_at = match marker {
        PLAIN => start + HEAD,
        EXPIRING => start + HEAD + 8,
        _ => return Ok(None),
    };
    let mut len = [0u8; 4];
    len.copy_from_slice(&raw[start + 17..start + 21]);
    let size = u32::from_be_bytes(len) as usize;
    if key_at + size > end {
        return Ok(None);
    }
    let Ok(key) = std::str::from_utf8(&raw[key_at..key_at + size]) else {
        return Ok(None);
    };
    let expiration = if marker == EXPIRING {
        Some(be_i64(raw, start + HEAD))
    } else {
        None
    };
    let item = (
        PyString::new(py, key),
        PyBytes::new(py, &raw[key_at + size..end]),
        be_i64(raw, start + 1),
        be_i64(raw, start + 9),
        expiration,
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
