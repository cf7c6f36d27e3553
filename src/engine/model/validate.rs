//! Structural checks of GGUF and safetensors files, in Rust, before MLX's C++ readers see
//! them. Those readers trust the file: a GGUF cut short, a string length that runs past the
//! end or a safetensors header whose shapes lie make them read out of bounds or abort the
//! whole process. Here every length, count and offset is checked against the file size, so
//! a bad file becomes a clear error at load and the server keeps serving `/health`.
//!
//! Only headers are read (a few MB at most, for the vocabulary); tensor data is never
//! touched, so checking costs milliseconds even for large models.
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// What a GGUF header holds, once checked.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufSummary {
    pub version: u32,
    pub metadata_entries: u64,
    pub tensors: u64,
    pub alignment: u64,
    /// Where tensor data begins (tensor offsets count from here).
    pub data_start: u64,
    /// Every metadata entry: scalars and strings by value, arrays by length, and their
    /// elements too where the walk was asked to keep them (the loader keeps the
    /// vocabulary's; the library, listing many files, keeps none), so the hyper-parameters
    /// and the tokenizer can be read without MLX.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Every tensor's name, shape and type, in file order.
    pub tensor_infos: Vec<GgufTensorInfo>,
}

/// A GGUF metadata value as the header walk keeps it.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    Int(i64),
    /// uint64 values above `i64::MAX` (no converter writes them).
    UInt(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array {
        len: u64,
        /// The elements, when kept (flat arrays of numbers or strings only).
        values: Option<GgufArray>,
    },
}

/// A kept metadata array's elements.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    Numbers(Vec<f64>),
    Strings(Vec<String>),
}

impl GgufValue {
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::Int(v) => Some(v as f64),
            GgufValue::UInt(v) => Some(v as f64),
            GgufValue::Float(v) => Some(v),
            GgufValue::Bool(b) => Some(f64::from(u8::from(b))),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGML order: the innermost (row) dimension first.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset into the data section.
    pub offset: u64,
    pub bytes: u64,
}

impl GgufSummary {
    /// A metadata number (any numeric type or bool), as f64.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.metadata.get(key).and_then(GgufValue::as_f64)
    }

    pub fn string(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).and_then(GgufValue::as_str)
    }

    /// The element count of a metadata array (e.g. `tokenizer.ggml.tokens`).
    pub fn array_len(&self, key: &str) -> Option<u64> {
        match self.metadata.get(key) {
            Some(GgufValue::Array { len, .. }) => Some(*len),
            _ => None,
        }
    }

    /// A kept array of strings.
    pub fn strings(&self, key: &str) -> Option<&[String]> {
        match self.metadata.get(key) {
            Some(GgufValue::Array { values: Some(GgufArray::Strings(v)), .. }) => Some(v),
            _ => None,
        }
    }

    /// A kept array of numbers (any numeric type or bool), as f64.
    pub fn numbers(&self, key: &str) -> Option<&[f64]> {
        match self.metadata.get(key) {
            Some(GgufValue::Array { values: Some(GgufArray::Numbers(v)), .. }) => Some(v),
            _ => None,
        }
    }
}

/// What a safetensors header holds, once checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SafetensorsSummary {
    pub header_bytes: u64,
    pub tensors: usize,
    /// Bytes of the data section that tensors use.
    pub data_bytes: u64,
    /// Each tensor's shape, by name (the library's memory estimate reads them).
    pub shapes: BTreeMap<String, Vec<u64>>,
    /// Each tensor's dtype and where its bytes lie in the file (expert streaming reads them).
    pub ranges: BTreeMap<String, TensorRange>,
}

/// One safetensors tensor's dtype (as the header names it) and bytes, from the file's start.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRange {
    pub dtype: String,
    pub offset: u64,
    pub len: u64,
}

/// Checks the GGUF file at `path`; errors name the file.
pub fn gguf_file(path: &Path) -> Result<GgufSummary> {
    gguf_file_keeping(path, &|_| false)
}

/// Checks the GGUF file at `path`, keeping the elements of the metadata arrays whose keys
/// `keep` picks.
pub fn gguf_file_keeping(path: &Path, keep: &dyn Fn(&str) -> bool) -> Result<GgufSummary> {
    let (reader, len) = open(path)?;
    gguf_keeping(reader, len, keep).with_context(|| path.display().to_string())
}

/// Checks the safetensors file at `path`; errors name the file.
pub fn safetensors_file(path: &Path) -> Result<SafetensorsSummary> {
    let (reader, len) = open(path)?;
    safetensors(reader, len).with_context(|| path.display().to_string())
}

fn open(path: &Path) -> Result<(BufReader<File>, u64)> {
    let file = File::open(path).with_context(|| format!("cannot open model file {}", path.display()))?;
    let len = file.metadata().with_context(|| format!("cannot stat {}", path.display()))?.len();
    Ok((BufReader::with_capacity(1 << 16, file), len))
}

/// A reader that knows the file length, so every read is checked before it is attempted
/// (a lying length never becomes a huge allocation).
struct Bounded<R> {
    inner: R,
    pos: u64,
    len: u64,
    format: &'static str,
}

impl<R: Read> Bounded<R> {
    fn need(&self, n: u64, what: &dyn Fn() -> String) -> Result<()> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            end => {
                let end = end.map_or_else(|| "beyond 2^64".to_string(), |e| e.to_string());
                bail!("{} truncated: {} needs bytes {}..{end} but the file has {}", self.format, what(), self.pos, self.len)
            }
        }
    }

    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        self.need(n, what)?;
        let mut buf = vec![0; n as usize];
        self.inner.read_exact(&mut buf).with_context(|| format!("reading {}", what()))?;
        self.pos += n;
        Ok(buf)
    }

    fn skip(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<()> {
        self.need(n, what)?;
        let copied = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink()).with_context(|| format!("reading {}", what()))?;
        if copied != n {
            bail!("{} truncated while reading {} (the file shrank?)", self.format, what());
        }
        self.pos += n;
        Ok(())
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(4, what)?.try_into().unwrap()))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(8, what)?.try_into().unwrap()))
    }

    fn remaining(&self) -> u64 {
        self.len - self.pos
    }
}

// ---------------------------------------------------------------------------------- GGUF

const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// GGML_MAX_DIMS; MLX's reader asserts (aborts) beyond it.
const GGUF_MAX_DIMS: u32 = 4;
/// Arrays of arrays: MLX reads one level of nesting; deeper ones are refused here.
const GGUF_MAX_ARRAY_DEPTH: u32 = 2;
/// The smallest metadata entry: empty key (8) + type (4) + u8 value (1).
const GGUF_MIN_KV_BYTES: u64 = 13;
/// The smallest tensor info: empty name (8) + n_dims (4) + type (4) + offset (8).
const GGUF_MIN_TENSOR_INFO_BYTES: u64 = 24;

// Metadata value types (GGUF spec).
const T_UINT8: u32 = 0;
const T_INT8: u32 = 1;
const T_UINT16: u32 = 2;
const T_INT16: u32 = 3;
const T_UINT32: u32 = 4;
const T_INT32: u32 = 5;
const T_FLOAT32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_UINT64: u32 = 10;
const T_INT64: u32 = 11;
const T_FLOAT64: u32 = 12;

fn scalar_size(t: u32) -> Option<u64> {
    match t {
        T_UINT8 | T_INT8 | T_BOOL => Some(1),
        T_UINT16 | T_INT16 => Some(2),
        T_UINT32 | T_INT32 | T_FLOAT32 => Some(4),
        T_UINT64 | T_INT64 | T_FLOAT64 => Some(8),
        _ => None,
    }
}

/// A GGML tensor type: `block` elements take `bytes` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub name: &'static str,
    pub block: u64,
    pub bytes: u64,
}

/// The GGML type with this id, or why it cannot be loaded. Sizes are ggml's
/// (`ggml_type_traits`); the ids MLX's bundled gguflib has no entry for are refused,
/// because it dereferences a null table entry (or divides by a zero block size) on them,
/// except MXFP4, which mlxbar reads itself (`gguf_read`; gguflib just returns no tensor
/// from the first one on).
pub fn ggml_type(id: u32) -> std::result::Result<GgmlType, String> {
    let t = |name, block, bytes| Ok(GgmlType { name, block, bytes });
    match id {
        0 => t("F32", 1, 4),
        1 => t("F16", 1, 2),
        2 => t("Q4_0", 32, 18),
        3 => t("Q4_1", 32, 20),
        6 => t("Q5_0", 32, 22),
        7 => t("Q5_1", 32, 24),
        8 => t("Q8_0", 32, 34),
        10 => t("Q2_K", 256, 84),
        11 => t("Q3_K", 256, 110),
        12 => t("Q4_K", 256, 144),
        13 => t("Q5_K", 256, 176),
        14 => t("Q6_K", 256, 210),
        15 => t("Q8_K", 256, 292),
        16 => t("IQ2_XXS", 256, 66),
        17 => t("IQ2_XS", 256, 74),
        18 => t("IQ3_XXS", 256, 98),
        19 => t("IQ1_S", 256, 50),
        20 => t("IQ4_NL", 32, 18),
        21 => t("IQ3_S", 256, 110),
        22 => t("IQ2_S", 256, 82),
        23 => t("IQ4_XS", 256, 136),
        24 => t("I8", 1, 1),
        25 => t("I16", 1, 2),
        26 => t("I32", 1, 4),
        27 => t("I64", 1, 8),
        28 => t("F64", 1, 8),
        29 => t("IQ1_M", 256, 56),
        30 => t("BF16", 1, 2),
        4 | 5 => Err(format!("GGML type {id} (Q4_2/Q4_3) was removed from GGML; re-convert the model")),
        31..=33 | 36..=38 => Err(format!("GGML type {id} (a repacked Q4_0/IQ4_NL layout) was removed from GGML; re-convert the model")),
        // gguflib's size for Q8_1 (40) is not ggml's (36); no converter writes it to files.
        9 => Err("GGML type Q8_1 is not supported by MLX's GGUF reader".into()),
        // MLX's gguflib has no MXFP4 either; mlxbar reads such files itself (gguf_read).
        39 => t("MXFP4", 32, 17),
        34 | 35 => {
            let name = ["TQ1_0", "TQ2_0"][id as usize - 34];
            Err(format!("GGML type {name} is not supported by MLX's GGUF reader"))
        }
        other => Err(format!("unknown GGML tensor type {other}")),
    }
}

/// Checks a GGUF stream of `len` bytes: header, every metadata entry, every tensor info,
/// and that every tensor's data lies inside the file.
pub fn gguf<R: Read>(reader: R, len: u64) -> Result<GgufSummary> {
    gguf_keeping(reader, len, &|_| false)
}

/// [`gguf`], keeping the elements of the metadata arrays whose keys `keep` picks.
pub fn gguf_keeping<R: Read>(reader: R, len: u64, keep: &dyn Fn(&str) -> bool) -> Result<GgufSummary> {
    let mut r = Bounded { inner: reader, pos: 0, len, format: "GGUF" };
    if len < 4 {
        bail!("not a GGUF file: only {len} bytes");
    }
    let magic = r.bytes(4, &|| "the magic".into())?;
    if magic != b"GGUF" {
        bail!("not a GGUF file: it starts with {magic:02x?}, not \"GGUF\"");
    }
    let version = r.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => bail!("GGUF version 1 is not supported (re-convert the model with a current llama.cpp)"),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => bail!("big-endian GGUF files are not supported"),
        v => bail!("unknown GGUF version {v} (supported: 2, 3)"),
    }
    let tensors = r.u64(&|| "the tensor count".into())?;
    let kvs = r.u64(&|| "the metadata count".into())?;
    if kvs > r.remaining() / GGUF_MIN_KV_BYTES {
        bail!("GGUF header claims {kvs} metadata entries but only {} bytes follow", r.remaining());
    }
    if tensors > r.remaining() / GGUF_MIN_TENSOR_INFO_BYTES {
        bail!("GGUF header claims {tensors} tensors but only {} bytes follow", r.remaining());
    }

    let mut alignment = GGUF_DEFAULT_ALIGNMENT;
    let mut metadata = BTreeMap::new();
    for i in 0..kvs {
        let key = gguf_string(&mut r, &|| format!("metadata key #{i}"))?;
        let vtype = r.u32(&|| format!("the type of metadata {key}"))?;
        if key == "general.alignment" {
            if vtype != T_UINT32 {
                bail!("general.alignment has value type {vtype}, not uint32");
            }
            let a = r.u32(&|| "general.alignment".into())?;
            if a == 0 || !a.is_power_of_two() {
                bail!("general.alignment is {a}, not a power of two");
            }
            alignment = u64::from(a);
            metadata.insert(key.clone(), GgufValue::Int(i64::from(a)));
        } else {
            let value = gguf_value(&mut r, vtype, &key, 0, keep(&key))?;
            if metadata.insert(key.clone(), value).is_some() {
                bail!("metadata key {key} appears twice");
            }
        }
    }

    let mut infos = Vec::with_capacity(tensors.min(1 << 16) as usize);
    let mut names = HashSet::new();
    for i in 0..tensors {
        let name = gguf_string(&mut r, &|| format!("the name of tensor #{i}"))?;
        let n_dims = r.u32(&|| format!("the dimension count of tensor {name}"))?;
        if n_dims > GGUF_MAX_DIMS {
            bail!("tensor {name} has {n_dims} dimensions (at most {GGUF_MAX_DIMS})");
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let dim = r.u64(&|| format!("dimension {d} of tensor {name}"))?;
            if dim > i64::MAX as u64 {
                bail!("tensor {name} has dimension {d} of {dim}");
            }
            dims.push(dim);
        }
        let type_id = r.u32(&|| format!("the type of tensor {name}"))?;
        let offset = r.u64(&|| format!("the offset of tensor {name}"))?;
        let ty = ggml_type(type_id).map_err(|why| anyhow::anyhow!("tensor {name}: {why}"))?;
        let numel = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let Some(numel) = numel.filter(|&n| n <= i64::MAX as u64) else { bail!("tensor {name} has shape {dims:?}: too many elements") };
        // ggml stores whole blocks along the innermost dimension.
        if dims.first().is_some_and(|&d0| d0 % ty.block != 0) {
            bail!("tensor {name} is {} with a row of {} elements, not a multiple of its block size {}", ty.name, dims[0], ty.block);
        }
        let bytes = (numel / ty.block).checked_mul(ty.bytes).with_context(|| format!("tensor {name} is too large"))?;
        if offset % alignment != 0 {
            bail!("tensor {name} starts at data offset {offset}, not a multiple of the alignment {alignment}");
        }
        if !names.insert(name.clone()) {
            bail!("tensor {name} appears twice");
        }
        infos.push(GgufTensorInfo { name, dims, ggml_type: ty, offset, bytes });
    }

    let header_end = r.pos;
    let data_start = header_end.div_ceil(alignment) * alignment;
    for t in &infos {
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.bytes));
        match (start, end) {
            (Some(_), Some(e)) if e <= len => {}
            (Some(s), Some(e)) => bail!("GGUF truncated: tensor {} needs bytes {s}..{e} but the file has {len}", t.name),
            _ => bail!("tensor {} has offset {} beyond any file", t.name, t.offset),
        }
    }
    // By start, then size: a zero-size tensor sharing an offset overlaps nothing.
    let mut by_offset: Vec<&GgufTensorInfo> = infos.iter().collect();
    by_offset.sort_by_key(|t| (t.offset, t.bytes));
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].bytes > pair[1].offset {
            bail!("tensors {} and {} overlap", pair[0].name, pair[1].name);
        }
    }
    Ok(GgufSummary { version, metadata_entries: kvs, tensors, alignment, data_start, metadata, tensor_infos: infos })
}

fn gguf_string<R: Read>(r: &mut Bounded<R>, what: &dyn Fn() -> String) -> Result<String> {
    let n = r.u64(&|| format!("the length of {}", what()))?;
    let bytes = r.bytes(n, what)?;
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{} is not valid UTF-8", what()))
}

/// Reads one metadata value of type `vtype` (arrays walked recursively, to a bounded
/// depth, and kept by length only unless `keep`, which keeps a flat array's elements).
fn gguf_value<R: Read>(r: &mut Bounded<R>, vtype: u32, key: &str, depth: u32, keep: bool) -> Result<GgufValue> {
    if let Some(size) = scalar_size(vtype) {
        let b = r.bytes(size, &|| format!("metadata {key}"))?;
        let int = |n: usize| -> [u8; 8] {
            // Sign-extend the signed types, zero-extend the rest.
            let fill = if matches!(vtype, T_INT8 | T_INT16 | T_INT32) && b[n - 1] & 0x80 != 0 { 0xff } else { 0 };
            let mut out = [fill; 8];
            out[..n].copy_from_slice(&b[..n]);
            out
        };
        return Ok(match vtype {
            T_BOOL => GgufValue::Bool(b[0] != 0),
            T_FLOAT32 => GgufValue::Float(f64::from(f32::from_le_bytes(b[..4].try_into().unwrap()))),
            T_FLOAT64 => GgufValue::Float(f64::from_le_bytes(b[..8].try_into().unwrap())),
            T_UINT64 => match u64::from_le_bytes(int(8)) {
                v if v > i64::MAX as u64 => GgufValue::UInt(v),
                v => GgufValue::Int(v as i64),
            },
            _ => GgufValue::Int(i64::from_le_bytes(int(size as usize))),
        });
    }
    match vtype {
        T_STRING => gguf_string(r, &|| format!("metadata {key}")).map(GgufValue::Str),
        T_ARRAY => {
            if depth >= GGUF_MAX_ARRAY_DEPTH {
                bail!("metadata {key} nests arrays deeper than {GGUF_MAX_ARRAY_DEPTH} levels");
            }
            let etype = r.u32(&|| format!("the element type of metadata {key}"))?;
            let n = r.u64(&|| format!("the length of metadata {key}"))?;
            if let Some(size) = scalar_size(etype) {
                let total = n.checked_mul(size).filter(|&t| t <= r.remaining());
                let Some(total) = total else {
                    bail!("GGUF truncated: metadata {key} claims {n} elements of {size} bytes but only {} bytes follow", r.remaining())
                };
                if !keep {
                    r.skip(total, &|| format!("metadata {key}"))?;
                    return Ok(GgufValue::Array { len: n, values: None });
                }
                let numbers = (0..n)
                    .map(|_| Ok(gguf_value(r, etype, key, depth + 1, false)?.as_f64().expect("a scalar is a number")))
                    .collect::<Result<Vec<f64>>>()?;
                return Ok(GgufValue::Array { len: n, values: Some(GgufArray::Numbers(numbers)) });
            }
            // Every string or array element takes at least 8 bytes (its length).
            if n > r.remaining() / 8 {
                bail!("GGUF truncated: metadata {key} claims {n} elements but only {} bytes follow", r.remaining());
            }
            let values = match etype {
                T_STRING if keep => Some(GgufArray::Strings(
                    (0..n).map(|i| gguf_string(r, &|| format!("element {i} of metadata {key}"))).collect::<Result<_>>()?,
                )),
                T_STRING => {
                    (0..n).try_for_each(|i| gguf_string(r, &|| format!("element {i} of metadata {key}")).map(drop))?;
                    None
                }
                T_ARRAY => {
                    (0..n).try_for_each(|_| gguf_value(r, T_ARRAY, key, depth + 1, false).map(drop))?;
                    None
                }
                other => bail!("metadata {key} is an array of unknown value type {other}"),
            };
            Ok(GgufValue::Array { len: n, values })
        }
        other => bail!("metadata {key} has unknown value type {other}"),
    }
}

// --------------------------------------------------------------------------- safetensors

/// The safetensors crate's limit; real headers are far smaller.
const SAFETENSORS_MAX_HEADER: u64 = 100_000_000;

/// Bytes per element of a safetensors dtype (the sub-byte F4/F6 types MLX cannot read).
fn safetensors_dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

#[derive(serde::Deserialize)]
struct SafetensorsEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Checks a safetensors stream of `len` bytes: the header length, the JSON header, and
/// for each tensor that its dtype and shape match its byte range, which lies inside the
/// data section and overlaps no other.
pub fn safetensors<R: Read>(reader: R, len: u64) -> Result<SafetensorsSummary> {
    let mut r = Bounded { inner: reader, pos: 0, len, format: "safetensors" };
    let n = r.u64(&|| "the header length".into())?;
    if n > SAFETENSORS_MAX_HEADER {
        bail!("safetensors header claims {n} bytes (at most {SAFETENSORS_MAX_HEADER})");
    }
    let header = r.bytes(n, &|| "the JSON header".into())?;
    if header.first() != Some(&b'{') {
        bail!("safetensors header is not a JSON object");
    }
    let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header).context("safetensors header is not valid JSON")?;
    let data_start = 8 + n;
    let data_len = len - data_start;
    let mut ranges = Vec::with_capacity(header.len());
    let mut shapes = BTreeMap::new();
    let mut located = BTreeMap::new();
    for (name, entry) in header {
        if name == "__metadata__" {
            // MLX writes null when there is none.
            let ok = entry.is_null() || entry.as_object().is_some_and(|m| m.values().all(|v| v.is_string()));
            if !ok {
                bail!("safetensors __metadata__ is not an object of strings");
            }
            continue;
        }
        let e: SafetensorsEntry = serde_json::from_value(entry).with_context(|| format!("tensor {name}: bad header entry"))?;
        let size = safetensors_dtype_size(&e.dtype).with_context(|| format!("tensor {name} has unknown dtype {}", e.dtype))?;
        let nbytes = e.shape.iter().try_fold(size, |acc, &d| acc.checked_mul(d));
        let Some(nbytes) = nbytes else { bail!("tensor {name} has shape {:?}: too many bytes", e.shape) };
        let [begin, end] = e.data_offsets;
        if end < begin {
            bail!("tensor {name} has data_offsets {begin}..{end}, which run backwards");
        }
        if end - begin != nbytes {
            bail!(
                "tensor {name} is {} {:?} ({nbytes} bytes) but its data_offsets {begin}..{end} span {} bytes",
                e.dtype,
                e.shape,
                end - begin
            );
        }
        if end > data_len {
            let (s, e) = (data_start.saturating_add(begin), data_start.saturating_add(end));
            bail!("safetensors truncated: tensor {name} needs bytes {s}..{e} but the file has {len}");
        }
        shapes.insert(name.clone(), e.shape);
        located.insert(name.clone(), TensorRange { dtype: e.dtype, offset: data_start + begin, len: nbytes });
        ranges.push((begin, end, name));
    }
    ranges.sort();
    for pair in ranges.windows(2) {
        if pair[0].1 > pair[1].0 {
            bail!("tensors {} and {} overlap", pair[0].2, pair[1].2);
        }
    }
    Ok(SafetensorsSummary {
        header_bytes: n,
        tensors: ranges.len(),
        data_bytes: ranges.iter().map(|r| r.1 - r.0).sum(),
        shapes,
        ranges: located,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 with one string, one array of strings and `tensors` F32 tensors of `[4, 2]`.
    fn tiny_gguf(alignment: Option<u32>) -> Vec<u8> {
        let s = |out: &mut Vec<u8>, t: &str| {
            out.extend((t.len() as u64).to_le_bytes());
            out.extend(t.as_bytes());
        };
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(2u64.to_le_bytes()); // tensors
        out.extend((2 + u64::from(alignment.is_some())).to_le_bytes());
        s(&mut out, "general.architecture");
        out.extend(T_STRING.to_le_bytes());
        s(&mut out, "llama");
        s(&mut out, "tokenizer.ggml.tokens");
        out.extend(T_ARRAY.to_le_bytes());
        out.extend(T_STRING.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        s(&mut out, "a");
        s(&mut out, "b");
        if let Some(a) = alignment {
            s(&mut out, "general.alignment");
            out.extend(T_UINT32.to_le_bytes());
            out.extend(a.to_le_bytes());
        }
        let align = u64::from(alignment.unwrap_or(32)).max(1);
        for (i, name) in ["a.weight", "b.weight"].iter().enumerate() {
            s(&mut out, name);
            out.extend(2u32.to_le_bytes());
            out.extend(4u64.to_le_bytes());
            out.extend(2u64.to_le_bytes());
            out.extend(0u32.to_le_bytes());
            out.extend((i as u64 * 32u64.div_ceil(align) * align).to_le_bytes());
        }
        while !(out.len() as u64).is_multiple_of(align) {
            out.push(0);
        }
        let data = 32u64.div_ceil(align) * align + 32;
        out.extend(std::iter::repeat_n(0u8, data as usize));
        out
    }

    fn check_gguf(b: &[u8]) -> Result<GgufSummary> {
        gguf(b, b.len() as u64)
    }

    #[test]
    fn accepts_a_well_formed_gguf() {
        let s = check_gguf(&tiny_gguf(None)).unwrap();
        assert_eq!((s.version, s.tensors, s.metadata_entries, s.alignment), (3, 2, 2, 32));
        assert_eq!(s.data_start % 32, 0);
        assert_eq!(check_gguf(&tiny_gguf(Some(64))).unwrap().alignment, 64);
        // The header walk keeps what the model library reads: values, array lengths, tensor infos.
        assert_eq!(s.string("general.architecture"), Some("llama"));
        assert_eq!(s.array_len("tokenizer.ggml.tokens"), Some(2));
        assert_eq!(check_gguf(&tiny_gguf(Some(64))).unwrap().number("general.alignment"), Some(64.0));
        let names: Vec<&str> = s.tensor_infos.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a.weight", "b.weight"]);
        assert_eq!(
            (s.tensor_infos[1].dims.as_slice(), s.tensor_infos[1].ggml_type.name, s.tensor_infos[1].bytes),
            (&[4u64, 2][..], "F32", 32)
        );
    }

    #[test]
    fn a_gguf_cut_short_names_the_tensor_and_the_bytes() {
        let b = tiny_gguf(None);
        let err = check_gguf(&b[..b.len() - 1]).unwrap_err().to_string();
        assert!(err.starts_with("GGUF truncated: tensor b.weight needs bytes"), "{err}");
        assert!(err.ends_with(&format!("but the file has {}", b.len() - 1)), "{err}");
        // Cut inside the header: what was being read is named.
        let in_offset = b.windows(8).position(|w| w == b"b.weight").unwrap() + 8 + 4 + 16 + 4 + 3;
        let err = check_gguf(&b[..in_offset]).unwrap_err().to_string();
        assert!(err.starts_with("GGUF truncated: the offset of tensor b.weight needs bytes"), "{err}");
        // Counts that cannot fit are refused before anything is walked.
        let err = check_gguf(&b[..60]).unwrap_err().to_string();
        assert!(err.contains("claims 2 tensors but only 36 bytes follow"), "{err}");
    }

    #[test]
    fn refuses_bad_headers() {
        let base = tiny_gguf(None);
        let with = |at: usize, bytes: &[u8]| {
            let mut b = base.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            check_gguf(&b).unwrap_err().to_string()
        };
        assert!(with(0, b"GGUX").contains("not a GGUF file"));
        assert!(with(4, &1u32.to_le_bytes()).contains("version 1"));
        assert!(with(4, &3u32.to_be_bytes()).contains("big-endian"));
        assert!(with(8, &u64::MAX.to_le_bytes()).contains("claims"));
        assert!(with(16, &(1u64 << 40).to_le_bytes()).contains("claims"));
        // The string length of the architecture value runs past the end.
        let at = 24 + 8 + "general.architecture".len() + 4;
        assert!(with(at, &(1u64 << 50).to_le_bytes()).contains("GGUF truncated: metadata general.architecture"));
        assert!(check_gguf(&tiny_gguf(Some(48))).unwrap_err().to_string().contains("power of two"));
        assert!(check_gguf(&tiny_gguf(Some(0))).unwrap_err().to_string().contains("power of two"));
    }

    #[test]
    fn refuses_bad_tensor_infos() {
        let base = tiny_gguf(None);
        // The first tensor info follows the metadata: find it by its name.
        let at = base.windows(8).position(|w| w == b"a.weight").unwrap() + 8;
        let with = |off: usize, bytes: &[u8]| {
            let mut b = base.clone();
            b[at + off..at + off + bytes.len()].copy_from_slice(bytes);
            check_gguf(&b).unwrap_err().to_string()
        };
        assert!(with(0, &5u32.to_le_bytes()).contains("5 dimensions"));
        assert!(with(4, &8u64.to_le_bytes()).contains("overlap"), "an [8, 2] F32 tensor runs into the next");
        assert!(with(4, &u64::MAX.to_le_bytes()).contains("dimension 0"));
        assert!(with(20, &4u32.to_le_bytes()).contains("Q4_2"));
        assert!(with(20, &99u32.to_le_bytes()).contains("unknown GGML tensor type 99"));
        assert!(with(20, &2u32.to_le_bytes()).contains("not a multiple of its block size 32"));
        assert!(with(24, &8u64.to_le_bytes()).contains("not a multiple of the alignment 32"));
        assert!(with(24, &(1u64 << 62).to_le_bytes()).contains("GGUF truncated: tensor a.weight"));
        assert!(with(24, &32u64.to_le_bytes()).contains("overlap"));
    }

    fn tiny_safetensors(entries: serde_json::Value, data: usize) -> Vec<u8> {
        let header = entries.to_string();
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(std::iter::repeat_n(0u8, data));
        out
    }

    fn check_st(b: &[u8]) -> Result<SafetensorsSummary> {
        safetensors(b, b.len() as u64)
    }

    #[test]
    fn safetensors_headers_must_match_their_data() {
        use serde_json::json;
        let ok = json!({"__metadata__": {"format": "mlx"},
            "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}});
        let s = check_st(&tiny_safetensors(ok.clone(), 22)).unwrap();
        assert_eq!((s.tensors, s.data_bytes), (2, 22));
        let mlx = json!({"__metadata__": null, "a": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}});
        assert_eq!(check_st(&tiny_safetensors(mlx, 8)).unwrap().tensors, 1);
        let bad_meta = json!({"__metadata__": {"n": 1}});
        assert!(check_st(&tiny_safetensors(bad_meta, 0)).unwrap_err().to_string().contains("__metadata__"));

        let err = check_st(&tiny_safetensors(ok, 20)).unwrap_err().to_string();
        assert!(err.starts_with("safetensors truncated: tensor b needs bytes"), "{err}");
        let lying = json!({"a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 16]}});
        let err = check_st(&tiny_safetensors(lying, 16)).unwrap_err().to_string();
        assert!(err.contains("(64 bytes) but its data_offsets 0..16 span 16 bytes"), "{err}");
        let overlap =
            json!({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}});
        assert!(check_st(&tiny_safetensors(overlap, 8)).unwrap_err().to_string().contains("overlap"));
        let dtype = json!({"a": {"dtype": "Q4", "shape": [8], "data_offsets": [0, 8]}});
        assert!(check_st(&tiny_safetensors(dtype, 8)).unwrap_err().to_string().contains("unknown dtype Q4"));
        let huge = json!({"a": {"dtype": "F64", "shape": [u64::MAX, 2], "data_offsets": [0, 8]}});
        assert!(check_st(&tiny_safetensors(huge, 8)).unwrap_err().to_string().contains("too many bytes"));

        let mut b = tiny_safetensors(json!({}), 0);
        b[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(check_st(&b).unwrap_err().to_string().starts_with("safetensors truncated: the JSON header"));
        assert!(check_st(&b[..5]).unwrap_err().to_string().contains("header length"));
        assert!(check_st(&tiny_safetensors(json!([1]), 0)).unwrap_err().to_string().contains("not a JSON object"));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        let b = tiny_gguf(None);
        std::fs::write(&p, &b[..b.len() / 2]).unwrap();
        let err = format!("{:#}", gguf_file(&p).unwrap_err());
        assert!(err.starts_with(&format!("{}: GGUF truncated", p.display())), "{err}");
        let err = format!("{:#}", gguf_file(&dir.path().join("nope.gguf")).unwrap_err());
        assert!(err.contains("nope.gguf") && err.contains("No such file"), "{err}");
    }
}
