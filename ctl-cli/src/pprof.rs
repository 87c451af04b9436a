//! A heap profile in pprof's format (`profile --format pprof`): the
//! `perftools.profiles.Profile` protobuf message of pprof's
//! `proto/profile.proto`, gzipped, as `go tool pprof` and pprof-rs read it.
//!
//! Two sample values per stack, `inuse_objects/count` and
//! `inuse_space/bytes` (the names pprof gives a Go heap profile's live
//! figures), period `space/bytes` = the sampling interval. One location per
//! distinct frame, each one line of one function whose file name is the
//! library (addresses are not kept after symbolization). Written by hand:
//! protobuf's wire format for the few field kinds used, and gzip with
//! stored (uncompressed) deflate blocks.

use crate::heapprof::Profile;
use crate::symbols::Frame;
use std::collections::HashMap;

/// The gzipped message.
pub fn encode(p: &Profile) -> Vec<u8> {
    gzip(&message(p))
}

struct Strings {
    table: Vec<String>,
    index: HashMap<String, u64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings {
            table: vec![],
            index: HashMap::new(),
        };
        s.get(""); // string_table[0] must be ""
        s
    }

    fn get(&mut self, v: &str) -> u64 {
        if let Some(&i) = self.index.get(v) {
            return i;
        }
        let i = self.table.len() as u64;
        self.table.push(v.to_string());
        self.index.insert(v.to_string(), i);
        i
    }
}

fn message(p: &Profile) -> Vec<u8> {
    let mut s = Strings::new();
    let mut out = Vec::new();
    // sample_type = 1: ValueType { type = 1, unit = 2 }
    for (t, u) in [("inuse_objects", "count"), ("inuse_space", "bytes")] {
        let mut vt = Vec::new();
        field_varint(&mut vt, 1, s.get(t));
        field_varint(&mut vt, 2, s.get(u));
        field_bytes(&mut out, 1, &vt);
    }
    let mut locations: HashMap<&Frame, u64> = HashMap::new();
    let mut functions: HashMap<(&str, &str), u64> = HashMap::new();
    let mut loc_msgs = Vec::new();
    let mut fn_msgs = Vec::new();
    for st in &p.stacks {
        // sample = 2: Sample { location_id = 1 (packed), value = 2 (packed) }
        let mut ids = Vec::new();
        for f in &st.frames {
            let next = locations.len() as u64 + 1;
            let id = *locations.entry(f).or_insert(next);
            if id == next {
                let fnext = functions.len() as u64 + 1;
                let fid = *functions
                    .entry((f.function.as_str(), f.library.as_str()))
                    .or_insert(fnext);
                if fid == fnext {
                    // Function { id = 1, name = 2, system_name = 3, filename = 4 }
                    let mut m = Vec::new();
                    field_varint(&mut m, 1, fid);
                    field_varint(&mut m, 2, s.get(&f.function));
                    field_varint(&mut m, 3, s.get(&f.function));
                    field_varint(&mut m, 4, s.get(&f.library));
                    fn_msgs.push(m);
                }
                // Location { id = 1, line = 4: Line { function_id = 1 } }
                let mut line = Vec::new();
                field_varint(&mut line, 1, fid);
                let mut m = Vec::new();
                field_varint(&mut m, 1, id);
                field_bytes(&mut m, 4, &line);
                loc_msgs.push(m);
            }
            ids.push(id);
        }
        let mut ids_packed = Vec::new();
        for id in ids {
            varint(&mut ids_packed, id);
        }
        let mut vals = Vec::new();
        varint(&mut vals, st.objects as u64);
        varint(&mut vals, st.bytes as u64);
        let mut m = Vec::new();
        field_bytes(&mut m, 1, &ids_packed);
        field_bytes(&mut m, 2, &vals);
        field_bytes(&mut out, 2, &m);
    }
    for m in &loc_msgs {
        field_bytes(&mut out, 4, m);
    }
    for m in &fn_msgs {
        field_bytes(&mut out, 5, m);
    }
    // period_type = 11, period = 12
    let mut pt = Vec::new();
    field_varint(&mut pt, 1, s.get("space"));
    field_varint(&mut pt, 2, s.get("bytes"));
    field_bytes(&mut out, 11, &pt);
    field_varint(&mut out, 12, 1u64 << p.lg_sample.min(62));
    // default_sample_type = 14: inuse_space
    field_varint(&mut out, 14, s.get("inuse_space"));
    // string_table = 6 (after every string is in).
    for t in &s.table {
        field_bytes(&mut out, 6, t.as_bytes());
    }
    out
}

/// A base-128 varint (negative int64 values are written as their 64-bit
/// two's complement, as protobuf does).
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u32, v: u64) {
    varint(out, u64::from(field) << 3);
    varint(out, v);
}

fn field_bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    varint(out, (u64::from(field) << 3) | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// gzip (RFC 1952) of `data` in stored deflate blocks (RFC 1951, BTYPE 00).
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    let mut chunks = data.chunks(0xffff).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        out.push(u8::from(chunks.peek().is_none()));
        let n = c.len() as u16;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&(!n).to_le_bytes());
        out.extend_from_slice(c);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_and_varints_are_the_standard_ones() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        let g = gzip(b"");
        assert_eq!(&g[..2], &[0x1f, 0x8b]);
        assert_eq!(g.len(), 10 + 5 + 8);
    }
}
