//! sowstream's compiled fold: one partition's chunk of transaction-log records of a JSON SOW
//! topic in, what the Python fold (`sowstream.engine.apply.Applier._fold`) would make of them out.
//!
//! Two calls per chunk: `Chunk(spec, records, folded)` decodes every record (command, JSON body,
//! SowKey, expiration header) and lists the store keys whose old values the fold reads;
//! `Chunk.fold(olds)` takes those values (read by Python through the worker's own store, so no
//! second RocksDB is linked here) and returns, per record, what it did: applied (the new record's
//! fields), unchanged (a replay), re-keyed or dead-lettered, plus the stored form of every key's
//! final state. Anything this fold does not reproduce exactly it declines at that record: the
//! result says where, and the Python fold goes on from there, so log order holds.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use blake2::digest::consts::U12;
use blake2::{Blake2b, Digest};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fmt::Write as _;

mod rawscan;

type Blake2b96 = Blake2b<U12>;

const COMMAND: &str = "sow.cmd";
const SOW_KEY: &str = "sow.key";
const EXPIRATION: &str = "sow.expiration";
const FILTER: &str = "sow.filter";
const MAX_USER_KEY_LENGTH: usize = 1024;

// What an op in the result is (the first item of its tuple).
const APPLIED: u8 = 0;
const DEAD: u8 = 1;
const REKEY: u8 = 2;
const UNCHANGED: u8 = 3;

#[derive(Clone, Copy, PartialEq)]
enum Cmd {
    Publish,
    Delta,
    Delete,
}

/// The topic as the fold needs it, made once per topic by Python (`sowstream.engine.native`).
struct Spec {
    name_repr: String, // repr() of the topic name, as Python's messages spell it
    key_domain: String,
    key_paths: Vec<(String, Vec<String>)>, // (path as written, its steps)
    user_keys: bool,
    default_expiration_ms: Option<i64>,
    panic_at: Option<i64>, // test hook: panic on the record at this offset
}

/// One log record after decoding.
enum Decoded {
    Skip, // at or below the partition's folded offset: already applied
    Dead { reason: &'static str, text: String },
    Op(Op),
}

struct Op {
    cmd: Cmd,
    sow_key: String,
    key_slot: usize, // index of its store key in Chunk::keys
    offset: i64,
    timestamp: i64,
    body: Option<Value>,
    value: Option<Py<PyBytes>>,
    expiration_ms: Option<i64>,
    rekey: bool,
}

/// A key's state while folding: absent, or a record (its parsed body made when a merge needs it).
struct State {
    data: Py<PyBytes>,
    offset: i64,
    timestamp: i64,
    expiration: Option<i64>,
    parsed: Option<Map<String, Value>>,
    body_of: Option<usize>, // the decoded op whose body this record is (parsed on demand)
}

/// Why a record is left to the Python fold (never shown: the Python fold decides).
struct Decline;

#[pyclass(module = "sowstream_native._fold")]
struct Chunk {
    spec_panic_at: Option<i64>,
    default_expiration_ms: Option<i64>,
    decoded: Vec<Decoded>,
    declined_at: usize,
    keys: Vec<Py<PyBytes>>,
}

fn extract_spec(spec: &Bound<'_, PyTuple>) -> PyResult<Spec> {
    let paths: Vec<String> = spec.get_item(2)?.extract()?;
    let key_paths = paths
        .into_iter()
        .map(|p| {
            let steps = p
                .strip_prefix('/')
                .unwrap_or(&p)
                .split('/')
                .map(str::to_owned)
                .collect();
            (p, steps)
        })
        .collect();
    Ok(Spec {
        name_repr: spec.get_item(0)?.extract()?,
        key_domain: spec.get_item(1)?.extract()?,
        key_paths,
        user_keys: spec.get_item(3)?.extract()?,
        default_expiration_ms: spec.get_item(4)?.extract()?,
        panic_at: spec.get_item(5)?.extract()?,
    })
}

fn header<'py>(headers: &Bound<'py, PyDict>, name: &str) -> PyResult<Option<String>> {
    match headers.get_item(name)? {
        Some(v) if !v.is_none() => Ok(Some(v.cast::<PyString>()?.to_str()?.to_owned())),
        _ => Ok(None),
    }
}

/// The SowKey from the Key fields of a body, as `sowstream.sow.keys.generated_sow_key` makes it.
fn generated_key(
    spec: &Spec,
    body: &Map<String, Value>,
) -> Result<Result<String, Decoded>, Decline> {
    let mut hasher = Blake2b96::new();
    let domain = spec.key_domain.as_bytes();
    hasher.update((domain.len() as u32).to_be_bytes());
    hasher.update(domain);
    for (path, steps) in &spec.key_paths {
        let mut node: Option<&Value> = None;
        let mut map = Some(body);
        for step in steps {
            let Some(m) = map else { return Err(Decline) }; // an array or scalar on the way
            node = m.get(step);
            map = match node {
                Some(Value::Object(inner)) => Some(inner),
                Some(Value::Null) | None => None,
                Some(Value::Array(_)) => return Err(Decline),
                _ => None,
            };
            if matches!(node, None | Some(Value::Null)) {
                break;
            }
        }
        let text = match node {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Bool(b)) => Some(if *b { "true" } else { "false" }.to_owned()),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            Some(Value::Object(_)) => {
                return Ok(Err(Decoded::Dead {
                    reason: "bad_key_field",
                    text: format!(
                        "topic {}: key field {} must be a single scalar value",
                        spec.name_repr, path
                    ),
                }))
            }
            _ => return Err(Decline), // floats and arrays: canonical_text's other cases
        };
        let Some(text) = text else {
            return Ok(Err(Decoded::Dead {
                reason: "missing_key_field",
                text: format!(
                    "topic {}: key field {} is missing from the message",
                    spec.name_repr, path
                ),
            }));
        };
        let raw = text.as_bytes();
        hasher.update((raw.len() as u32).to_be_bytes());
        hasher.update(raw);
    }
    Ok(Ok(URL_SAFE_NO_PAD.encode(hasher.finalize())))
}

/// A publisher's SowKey checked as `validate_user_sow_key` does (what it would refuse with a
/// message quoting the key is declined: Python spells the quote).
fn user_key(spec: &Spec, supplied: Option<String>) -> Result<Result<String, Decoded>, Decline> {
    match supplied {
        None => Ok(Err(Decoded::Dead {
            reason: "missing_sow_key",
            text: format!(
                "topic {} has no Key fields: the publisher must supply a SowKey",
                spec.name_repr
            ),
        })),
        Some(k) if k.is_empty() => user_key(spec, None),
        Some(k) => {
            let ok = k.len() <= MAX_USER_KEY_LENGTH
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+/=_-".contains(&b));
            if ok {
                Ok(Ok(k))
            } else {
                Err(Decline)
            }
        }
    }
}

/// The per-message expiration header in ms (digits only: seconds; other forms are declined).
fn expiration_header(text: Option<String>) -> Result<Option<i64>, Decline> {
    match text {
        None => Ok(None),
        Some(t) if t.is_empty() => Ok(None),
        Some(t) => {
            if !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(Decline);
            }
            let secs: i64 = t.parse().map_err(|_| Decline)?;
            secs.checked_mul(1000).map(Some).ok_or(Decline)
        }
    }
}

fn parse_object(data: &[u8]) -> Result<Map<String, Value>, Decline> {
    match serde_json::from_slice::<Value>(data) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(Decline), // Python's dead letter quotes orjson's own error text
    }
}

fn decode_one(
    py: Python<'_>,
    spec: &Spec,
    rec: &Bound<'_, PyAny>,
    folded: i64,
) -> PyResult<Result<(Decoded, i64), Decline>> {
    let offset: i64 = rec.getattr(pyo3::intern!(py, "offset"))?.extract()?;
    if offset <= folded {
        return Ok(Ok((Decoded::Skip, offset)));
    }
    if spec.panic_at == Some(offset) {
        panic!("test hook: panic at offset {offset}");
    }
    let timestamp: i64 = rec.getattr(pyo3::intern!(py, "timestamp"))?.extract()?;
    let key = rec.getattr(pyo3::intern!(py, "key"))?;
    let value = rec.getattr(pyo3::intern!(py, "value"))?;
    let headers = rec.getattr(pyo3::intern!(py, "headers"))?;
    let headers = headers.cast::<PyDict>()?;
    let cmd = match header(headers, COMMAND)?.as_deref() {
        None | Some("") | Some("publish") => Cmd::Publish,
        Some("delta_publish") => Cmd::Delta,
        Some("sow_delete") => Cmd::Delete,
        Some(_) => return Ok(Err(Decline)), // unknown_command: Python quotes it
    };
    let kafka_key: Option<String> = if key.is_none() {
        None
    } else {
        let raw = key.cast::<PyBytes>()?.as_bytes();
        if raw.is_empty() {
            None
        } else {
            match std::str::from_utf8(raw) {
                Ok(s) => Some(s.to_owned()),
                Err(_) => return Ok(Err(Decline)), // Python decodes with replacement characters
            }
        }
    };
    let value: Option<Py<PyBytes>> = if value.is_none() {
        None
    } else {
        Some(value.cast::<PyBytes>()?.clone().unbind())
    };
    let value_bytes: &[u8] = value.as_ref().map(|v| v.as_bytes(py)).unwrap_or(b"");
    let dead = |d: Decoded| Ok(Ok((d, offset)));
    let mut op = Op {
        cmd,
        sow_key: String::new(),
        key_slot: 0,
        offset,
        timestamp,
        body: None,
        value: None,
        expiration_ms: None,
        rekey: false,
    };
    if cmd == Cmd::Delete {
        if headers.contains(FILTER)? {
            return Ok(Err(Decline)); // a delete by filter
        }
        if value_bytes.is_empty() {
            let supplied = kafka_key
                .clone()
                .or(header(headers, SOW_KEY)?.filter(|s| !s.is_empty()));
            let sow_key = if spec.user_keys {
                match user_key(spec, supplied) {
                    Err(d) => return Ok(Err(d)),
                    Ok(Err(d)) => return dead(d),
                    Ok(Ok(k)) => k,
                }
            } else {
                match supplied {
                    Some(k) => k,
                    None => {
                        return dead(Decoded::Dead {
                            reason: "missing_key_field",
                            text: format!(
                                "topic {}: a delete needs data, keys or a filter",
                                spec.name_repr
                            ),
                        })
                    }
                }
            };
            op.rekey = kafka_key.is_none();
            op.sow_key = sow_key;
            return Ok(Ok((Decoded::Op(op), offset)));
        }
    }
    if value_bytes.is_empty() {
        return Ok(Err(Decline)); // empty body: Python's dead letter
    }
    let body = match parse_object(value_bytes) {
        Ok(b) => b,
        Err(d) => return Ok(Err(d)),
    };
    let sow_key = if spec.user_keys {
        let supplied = match &kafka_key {
            Some(k) => Some(k.clone()),
            None => header(headers, SOW_KEY)?,
        };
        user_key(spec, supplied)
    } else {
        generated_key(spec, &body)
    };
    let sow_key = match sow_key {
        Err(d) => return Ok(Err(d)),
        Ok(Err(d)) => return dead(d),
        Ok(Ok(k)) => k,
    };
    op.rekey = kafka_key.as_deref() != Some(sow_key.as_str());
    op.sow_key = sow_key;
    if cmd != Cmd::Delete {
        op.expiration_ms = match expiration_header(header(headers, EXPIRATION)?) {
            Ok(e) => e,
            Err(d) => return Ok(Err(d)),
        };
    }
    op.body = Some(Value::Object(body));
    op.value = value;
    Ok(Ok((Decoded::Op(op), offset)))
}

/// `merge_delta` of `sowstream.messagetypes.changes`: objects merge field by field, anything
/// else is replaced whole; stored fields keep their places, new ones follow in update order.
fn merge(stored: &mut Map<String, Value>, update: &Map<String, Value>) {
    for (field, value) in update {
        match (stored.get_mut(field), value) {
            (Some(Value::Object(current)), Value::Object(inner)) => merge(current, inner),
            (Some(slot), _) => *slot = value.clone(),
            (None, _) => {
                stored.insert(field.clone(), value.clone());
            }
        }
    }
}

/// JSON text as `orjson.dumps` writes it, byte for byte (declines what it cannot be sure of).
fn dumps(value: &Value, out: &mut Vec<u8>) -> Result<(), Decline> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else {
                let f = n.as_f64().ok_or(Decline)?;
                float_text(f, out)?;
            }
        }
        Value::String(s) => string_text(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                dumps(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string_text(k, out);
                out.push(b':');
                dumps(v, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn string_text(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0..=0x1f => {
                let mut t = String::new();
                let _ = write!(t, "\\u{:04x}", b);
                out.extend_from_slice(t.as_bytes());
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// A float as orjson spells it: the shortest digits that read back the same, in fixed notation
/// for decimal exponents -5..15 (with ".0" when integral), else `d.ddde+N` / `d.ddde-N`.
fn float_text(f: f64, out: &mut Vec<u8>) -> Result<(), Decline> {
    if !f.is_finite() || (f == 0.0 && f.is_sign_negative()) {
        // -0.0 may have been "-0" (orjson: the integer 0) or "-0.0": declined either way.
        return Err(Decline);
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').ok_or(Decline)?;
    let exp: i32 = exp.parse().map_err(|_| Decline)?;
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let mut t = String::new();
    if f < 0.0 {
        t.push('-');
    }
    if (-5..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp + 1;
            if n <= int_len {
                t.push_str(&digits);
                t.extend(std::iter::repeat_n('0', (int_len - n) as usize));
                t.push_str(".0");
            } else {
                t.push_str(&digits[..int_len as usize]);
                t.push('.');
                t.push_str(&digits[int_len as usize..]);
            }
        } else {
            t.push_str("0.");
            t.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            t.push_str(&digits);
        }
    } else {
        t.push_str(&digits[..1]);
        if n > 1 {
            t.push('.');
            t.push_str(&digits[1..]);
        }
        let _ = write!(t, "e{}{}", if exp >= 0 { "+" } else { "-" }, exp.abs());
    }
    out.extend_from_slice(t.as_bytes());
    Ok(())
}

/// The record's expiry as `expiration_time` makes it: the header (0 = never) or the topic's
/// default, from the log time; a sum beyond 64 bits is declined.
fn expiration_of(op: &Op, default_ms: Option<i64>) -> Result<Option<i64>, Decline> {
    if op.cmd == Cmd::Delete {
        return Ok(None);
    }
    match op.expiration_ms.or(default_ms) {
        None => Ok(None),
        Some(0) if op.expiration_ms.is_some() => Ok(None),
        Some(ms) => op.timestamp.checked_add(ms).map(Some).ok_or(Decline),
    }
}

/// The stored form of a record (format 1 of `sowstream.sow.record`).
fn stored_form(
    sow_key: &str,
    data: &[u8],
    offset: i64,
    timestamp: i64,
    exp: Option<i64>,
) -> Vec<u8> {
    let key = sow_key.as_bytes();
    let mut out = Vec::with_capacity(29 + key.len() + data.len());
    out.push(if exp.is_some() { 0x03 } else { 0x01 });
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    if let Some(e) = exp {
        out.extend_from_slice(&e.to_be_bytes());
    }
    out.extend_from_slice(key);
    out.extend_from_slice(data);
    out
}

impl Chunk {
    /// The parsed body of decoded record ``j``, when it is an object.
    fn op_body(&self, j: usize) -> Option<&Map<String, Value>> {
        match &self.decoded[j] {
            Decoded::Op(Op {
                body: Some(Value::Object(m)),
                ..
            }) => Some(m),
            _ => None,
        }
    }

    /// Whether the record found (``first``) and the final ``state`` hold the very same values
    /// at every indexed path, as `sowstream.sow.keys.same_values` tells (False when unsure).
    fn same_indexed(
        &self,
        py: Python<'_>,
        paths: &[Vec<String>],
        first: &Option<Py<PyBytes>>,
        first_map: Option<&Map<String, Value>>,
        state: &Option<State>,
    ) -> bool {
        let (Some(first), Some(state)) = (first, state) else {
            return first.is_none() && state.is_none();
        };
        let parsed_first;
        let old = match first_map {
            Some(m) => m,
            None => match parse_object(first.as_bytes(py)) {
                Ok(m) => {
                    parsed_first = m;
                    &parsed_first
                }
                Err(_) => return false,
            },
        };
        let parsed;
        let new = match (&state.parsed, state.body_of) {
            (Some(p), _) => p,
            (None, Some(j)) => match self.op_body(j) {
                Some(m) => m,
                None => return false,
            },
            (None, None) => match parse_object(state.data.as_bytes(py)) {
                Ok(p) => {
                    parsed = p;
                    &parsed
                }
                Err(_) => return false,
            },
        };
        paths.iter().all(
            |steps| match (scalar_at(old, steps), scalar_at(new, steps)) {
                (Some(a), Some(b)) => same_scalar(a, b),
                _ => false,
            },
        )
    }
}

/// The value at ``steps`` through objects only: Some(None) when absent or null, None when the
/// walk meets an array or a scalar on the way, or ends on an array or object (not comparable).
fn scalar_at<'a>(body: &'a Map<String, Value>, steps: &[String]) -> Option<Option<&'a Value>> {
    let mut map = body;
    for (i, step) in steps.iter().enumerate() {
        match map.get(step) {
            None | Some(Value::Null) => return Some(None),
            Some(Value::Object(inner)) if i + 1 < steps.len() => map = inner,
            Some(Value::Object(_)) | Some(Value::Array(_)) => return None,
            Some(v) if i + 1 == steps.len() => return Some(Some(v)),
            Some(_) => return None,
        }
    }
    None
}

/// The values at ``paths`` as `FilterIndex.candidates` reads a body: one per path, the scalar
/// there (None when absent, null, or not a scalar: no subscription key matches those), or None
/// for the whole when a path meets an array (the caller parses the body itself).
fn watched_values<'py>(
    py: Python<'py>,
    body: &Map<String, Value>,
    paths: &[Vec<String>],
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let mut values: Vec<Bound<'py, PyAny>> = Vec::with_capacity(paths.len());
    for steps in paths {
        let mut map = body;
        let mut found: Option<&Value> = None;
        for (i, step) in steps.iter().enumerate() {
            match map.get(step) {
                Some(Value::Array(_)) => return Ok(None),
                Some(Value::Object(inner)) if i + 1 < steps.len() => map = inner,
                Some(v) if i + 1 == steps.len() => {
                    found = Some(v);
                    break;
                }
                _ => break,
            }
        }
        values.push(match found {
            Some(Value::String(text)) => PyString::new(py, text).into_any(),
            Some(Value::Bool(flag)) => pyo3::types::PyBool::new(py, *flag).to_owned().into_any(),
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    i.into_pyobject(py)?.into_any()
                } else if let Some(u) = n.as_u64() {
                    u.into_pyobject(py)?.into_any()
                } else {
                    n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
                }
            }
            _ => py.None().into_bound(py),
        });
    }
    Ok(Some(PyTuple::new(py, values)?))
}

/// Same type and value, floats bit for bit; a zero float is never the same (serde reads -0 as
/// -0.0 where orjson reads the integer 0).
fn same_scalar(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(Value::String(x)), Some(Value::String(y))) => x == y,
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x == y,
        (Some(Value::Number(x)), Some(Value::Number(y))) => {
            if let (Some(i), Some(j)) = (x.as_i64(), y.as_i64()) {
                i == j
            } else if let (Some(i), Some(j)) = (x.as_u64(), y.as_u64()) {
                i == j
            } else if x.is_f64() && y.is_f64() {
                let (i, j) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
                i != 0.0 && i.to_bits() == j.to_bits()
            } else {
                false
            }
        }
        _ => false,
    }
}

/// The header of a record in its stored form (format 1): marker `0x01` (or `0x03` with an
/// expiration after the header), log offset and log timestamp (i64), the SowKey's length (u32),
/// [expiration (i64)], the SowKey, then the body to the end.
pub(crate) struct StoredHead {
    pub offset: i64,
    pub timestamp: i64,
    pub expiration: Option<i64>,
    pub key: std::ops::Range<usize>, // the SowKey's bytes; the body follows to the end
}

/// `raw`'s header as `SowRecord.from_bytes` reads it; None when `raw` is no such record.
pub(crate) fn stored_head(raw: &[u8]) -> Option<StoredHead> {
    let at = match *raw.first()? {
        0x01 => 21,
        0x03 => 29,
        _ => return None,
    };
    if raw.len() < at {
        return None;
    }
    let int = |i: usize| i64::from_be_bytes(raw[i..i + 8].try_into().unwrap_or([0; 8]));
    let size = u32::from_be_bytes(raw[17..21].try_into().unwrap_or([0; 4])) as usize;
    let end = at.checked_add(size).filter(|e| *e <= raw.len())?;
    Some(StoredHead {
        offset: int(1),
        timestamp: int(9),
        expiration: (at == 29).then(|| int(21)),
        key: at..end,
    })
}

/// A record in its stored form (format 1), as `SowRecord.from_bytes` reads it.
fn from_stored_form(py: Python<'_>, raw: &[u8]) -> PyResult<State> {
    let head = stored_head(raw).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err("not a stored record of format 1")
    })?;
    Ok(State {
        data: PyBytes::new(py, &raw[head.key.end..]).unbind(),
        offset: head.offset,
        timestamp: head.timestamp,
        expiration: head.expiration,
        parsed: None,
        body_of: None,
    })
}

#[pymodule]
fn _fold(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Chunk>()?;
    m.add_function(wrap_pyfunction!(rawscan::raw_records, m)?)?;
    Ok(())
}

#[pymethods]
impl Chunk {
    /// Decode ``records`` (RawRecord objects of one partition, in log order) for the topic
    /// ``spec``; records at or below ``folded`` are skipped as the Python fold skips them.
    #[new]
    fn new(
        py: Python<'_>,
        spec: &Bound<'_, PyTuple>,
        records: &Bound<'_, PyList>,
        folded: i64,
    ) -> PyResult<Self> {
        let spec = extract_spec(spec)?;
        let mut decoded = Vec::with_capacity(records.len());
        let mut slots: HashMap<String, usize> = HashMap::new();
        let mut keys: Vec<Py<PyBytes>> = Vec::new();
        let mut declined_at = records.len();
        for (i, rec) in records.iter().enumerate() {
            match decode_one(py, &spec, &rec, folded)? {
                Err(Decline) => {
                    declined_at = i;
                    break;
                }
                Ok((Decoded::Op(mut op), _)) => {
                    let next = keys.len();
                    let slot = *slots.entry(op.sow_key.clone()).or_insert(next);
                    if slot == next {
                        keys.push(PyBytes::new(py, op.sow_key.as_bytes()).unbind());
                    }
                    op.key_slot = slot;
                    decoded.push(Decoded::Op(op));
                }
                Ok((d, _)) => decoded.push(d),
            }
        }
        Ok(Chunk {
            spec_panic_at: spec.panic_at,
            default_expiration_ms: spec.default_expiration_ms,
            decoded,
            declined_at,
            keys,
        })
    }

    /// The store keys whose current records the fold reads, each once, in first-use order.
    fn reads<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.keys.iter().map(|k| k.bind(py)))
    }

    /// Fold the decoded records over ``olds`` (per key of :meth:`reads`, its record as the fold
    /// finds it: None or an object with data, log_offset, log_timestamp and expiration).
    ///
    /// Returns ``(declined_at, ops, writes)``: the index of the first record left to Python
    /// (the chunk's length if none), one tuple per record folded (see the module's stub), and
    /// ``(key, stored form or None, indexed values unchanged)`` per key touched, its final
    /// state, in first-touch order (``index_paths``: the hash and memo index paths).
    #[pyo3(signature = (olds, index_paths, watch_paths=Vec::new()))]
    fn fold<'py>(
        &self,
        py: Python<'py>,
        olds: &Bound<'py, PyList>,
        index_paths: Vec<String>,
        watch_paths: Vec<String>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let steps_of = |paths: &[String]| -> Vec<Vec<String>> {
            paths
                .iter()
                .map(|p| {
                    p.strip_prefix('/')
                        .unwrap_or(p)
                        .split('/')
                        .map(str::to_owned)
                        .collect()
                })
                .collect()
        };
        let index_steps = steps_of(&index_paths);
        let watch_steps = steps_of(&watch_paths);
        let watching = !watch_steps.is_empty();
        // Per op (aligned with ``ops``): the values at ``watch_paths`` before and after it.
        let watched = PyList::empty(py);
        let unwatched = || -> PyResult<()> {
            if watching {
                watched.append(py.None())?;
            }
            Ok(())
        };
        let mut states: Vec<Option<State>> = Vec::with_capacity(olds.len());
        for old in olds.iter() {
            if old.is_none() {
                states.push(None);
                continue;
            }
            if let Ok(raw) = old.cast::<PyBytes>() {
                states.push(Some(from_stored_form(py, raw.as_bytes())?));
                continue;
            }
            states.push(Some(State {
                data: old
                    .getattr(pyo3::intern!(py, "data"))?
                    .cast::<PyBytes>()?
                    .clone()
                    .unbind(),
                offset: old.getattr(pyo3::intern!(py, "log_offset"))?.extract()?,
                timestamp: old.getattr(pyo3::intern!(py, "log_timestamp"))?.extract()?,
                expiration: old.getattr(pyo3::intern!(py, "expiration"))?.extract()?,
                parsed: None,
                body_of: None,
            }));
        }
        // The records as the fold found them, for telling whether an indexed value changed.
        let firsts: Vec<Option<Py<PyBytes>>> = states
            .iter()
            .map(|s| s.as_ref().map(|s| s.data.clone_ref(py)))
            .collect();
        // The records as found, parsed where the watched values needed them.
        let mut first_maps: Vec<Option<Map<String, Value>>> = vec![None; states.len()];
        let mut touched: Vec<usize> = Vec::new();
        let mut seen = vec![false; states.len()];
        let ops = PyList::empty(py);
        let mut declined_at = self.declined_at;
        for (i, d) in self.decoded.iter().enumerate() {
            let op = match d {
                Decoded::Skip => continue,
                Decoded::Dead { reason, text } => {
                    ops.append((DEAD, i, *reason, text.as_str()))?;
                    unwatched()?;
                    continue;
                }
                Decoded::Op(op) => op,
            };
            if self.spec_panic_at == Some(-op.offset) {
                panic!("test hook: panic folding offset {}", op.offset);
            }
            if op.rekey {
                ops.append((REKEY, i, op.sow_key.as_str()))?;
                unwatched()?;
                continue;
            }
            let key = self.keys[op.key_slot].bind(py);
            let slot = op.key_slot;
            let stored = &mut states[slot];
            if let Some(s) = stored.as_ref() {
                if s.offset >= op.offset {
                    if !seen[slot] {
                        seen[slot] = true;
                        touched.push(slot);
                    }
                    ops.append((UNCHANGED, i, key, op.sow_key.as_str()))?;
                    unwatched()?;
                    continue;
                }
            }
            let before_values = match stored.as_ref() {
                Some(s) if watching => {
                    let body = match (&s.parsed, s.body_of) {
                        (Some(p), _) => Some(p),
                        (None, Some(j)) => self.op_body(j),
                        // The record as found: parsed once, and kept for the index check.
                        (None, None) => {
                            if first_maps[slot].is_none() {
                                first_maps[slot] = parse_object(s.data.as_bytes(py)).ok();
                            }
                            first_maps[slot].as_ref()
                        }
                    };
                    match body {
                        Some(b) => watched_values(py, b, &watch_steps)?,
                        None => None,
                    }
                }
                _ => None,
            };
            let (data, parsed): (Option<Py<PyBytes>>, Option<Map<String, Value>>) = match op.cmd {
                Cmd::Delete => (None, None),
                Cmd::Publish => (op.value.as_ref().map(|v| v.clone_ref(py)), None),
                Cmd::Delta => match stored.as_mut() {
                    None => (op.value.as_ref().map(|v| v.clone_ref(py)), None),
                    Some(s) => {
                        let from_op = s.body_of.and_then(|j| self.op_body(j).cloned());
                        let mut base = match s.parsed.take().or(from_op) {
                            Some(p) => p,
                            None => match parse_object(s.data.as_bytes(py)) {
                                Ok(p) => p,
                                Err(Decline) => {
                                    declined_at = i;
                                    break;
                                }
                            },
                        };
                        if let Some(Value::Object(update)) = &op.body {
                            merge(&mut base, update);
                        }
                        let mut text = Vec::new();
                        let merged = Value::Object(base);
                        if dumps(&merged, &mut text).is_err() {
                            declined_at = i;
                            break;
                        }
                        let Value::Object(base) = merged else {
                            unreachable!()
                        };
                        (Some(PyBytes::new(py, &text).unbind()), Some(base))
                    }
                },
            };
            let count: u8 = if op.cmd != Cmd::Delete || stored.is_some() {
                1
            } else {
                0
            };
            let expiration = expiration_of(op, self.default_expiration_ms);
            let Ok(expiration) = expiration else {
                declined_at = i;
                break;
            };
            if !seen[slot] {
                seen[slot] = true;
                touched.push(slot);
            }
            if watching {
                let body = match (&data, &parsed) {
                    (None, _) => None,
                    (Some(_), Some(p)) => Some(p),
                    (Some(_), None) => self.op_body(i),
                };
                let after = match body {
                    Some(b) => watched_values(py, b, &watch_steps)?,
                    None => None,
                };
                watched.append((before_values, after))?;
            }
            match data {
                None => {
                    *stored = None;
                    ops.append((APPLIED, i, key, op.sow_key.as_str(), py.None(), count))?;
                }
                Some(data) => {
                    let item = (
                        APPLIED,
                        i,
                        key,
                        op.sow_key.as_str(),
                        data.clone_ref(py),
                        count,
                        op.offset,
                        op.timestamp,
                        expiration,
                    );
                    ops.append(item)?;
                    *stored = Some(State {
                        data,
                        offset: op.offset,
                        timestamp: op.timestamp,
                        expiration,
                        body_of: if parsed.is_none() { Some(i) } else { None },
                        parsed,
                    });
                }
            }
        }
        let writes = PyList::empty(py);
        for slot in touched {
            let key = self.keys[slot].bind(py);
            let same = index_steps.is_empty()
                || self.same_indexed(
                    py,
                    &index_steps,
                    &firsts[slot],
                    first_maps[slot].as_ref(),
                    &states[slot],
                );
            match &states[slot] {
                None => writes.append((key, py.None(), same))?,
                Some(s) => {
                    let sow_key = std::str::from_utf8(key.as_bytes()).unwrap_or_default();
                    let form = stored_form(
                        sow_key,
                        s.data.as_bytes(py),
                        s.offset,
                        s.timestamp,
                        s.expiration,
                    );
                    writes.append((key, PyBytes::new(py, &form), same))?;
                }
            }
        }
        PyTuple::new(
            py,
            [
                declined_at.into_pyobject(py)?.into_any(),
                ops.into_any(),
                writes.into_any(),
                watched.into_any(),
            ],
        )
    }
}
