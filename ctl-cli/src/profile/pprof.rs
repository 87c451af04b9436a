//! A heap profile in pprof's format (`profile --format pprof`): the
//! `perftools.profiles.Profile` message of pprof's `proto/profile.proto`,
//! encoded by prost and gzipped by flate2, as `go tool pprof` and pprof-rs
//! read it.
//!
//! Two sample values per stack, `inuse_objects/count` and
//! `inuse_space/bytes` (the names pprof gives a Go heap profile's live
//! figures), period `space/bytes` = the sampling interval. One mapping per
//! library (its file name; the profile is symbolized already, so
//! `has_functions` is set), one location per distinct frame, each one line
//! of one function. A function's file name is its source file where the
//! library's debug information names one (and the line is the frame's:
//! `go tool pprof -lines`, `list`), else the library.

use crate::profile::heap::Profile;
use crate::profile::symbols::Frame;
use prost::Message;
use std::collections::HashMap;
use std::io::Write;

/// The messages of `profile.proto` that a heap profile uses, field numbers
/// as there (the fields left out are optional and absent).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The gzipped message.
pub fn encode(p: &Profile) -> Vec<u8> {
    let body = message(p).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&body);
    gz.finish().unwrap_or_default()
}

/// `string_table`, its indices handed out in order of first use.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn get(&mut self, v: &str) -> i64 {
        if let Some(&i) = self.index.get(v) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(v.to_string());
        self.index.insert(v.to_string(), i);
        i
    }
}

/// Ids from 1 in order of first use, for mappings, locations and functions.
struct Ids<K>(HashMap<K, u64>);

impl<K: std::hash::Hash + Eq> Ids<K> {
    /// The key's id, and whether it is new.
    fn get(&mut self, k: K) -> (u64, bool) {
        let next = self.0.len() as u64 + 1;
        let id = *self.0.entry(k).or_insert(next);
        (id, id == next)
    }
}

fn message(p: &Profile) -> proto::Profile {
    let mut s = Strings::default();
    s.get(""); // string_table[0] must be ""
    let mut out = proto::Profile::default();
    let vt = |s: &mut Strings, t: &str, u: &str| proto::ValueType {
        r#type: s.get(t),
        unit: s.get(u),
    };
    out.sample_type = vec![
        vt(&mut s, "inuse_objects", "count"),
        vt(&mut s, "inuse_space", "bytes"),
    ];
    let (mut mappings, mut locations, mut functions) = (
        Ids(HashMap::new()),
        Ids(HashMap::new()),
        Ids(HashMap::new()),
    );
    for st in &p.stacks {
        let mut ids = Vec::with_capacity(st.frames.len());
        for f in &st.frames {
            let (id, new) = locations.get(f);
            if new {
                let loc = location(&mut s, &mut out, id, f, &mut mappings, &mut functions);
                out.location.push(loc);
            }
            ids.push(id);
        }
        out.sample.push(proto::Sample {
            location_id: ids,
            value: vec![st.objects, st.bytes],
        });
    }
    out.period_type = Some(vt(&mut s, "space", "bytes"));
    out.period = 1i64 << p.lg_sample.min(62);
    out.default_sample_type = s.get("inuse_space");
    out.time_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    out.string_table = s.table;
    out
}

/// The location of frame `f`, adding its function and its library's
/// mapping to `out` the first time each is seen.
fn location<'a>(
    s: &mut Strings,
    out: &mut proto::Profile,
    id: u64,
    f: &'a Frame,
    mappings: &mut Ids<&'a str>,
    functions: &mut Ids<(&'a str, &'a str)>,
) -> proto::Location {
    let (mapping_id, new) = mappings.get(f.library.as_str());
    if new {
        out.mapping.push(proto::Mapping {
            id: mapping_id,
            filename: s.get(&f.library),
            has_functions: true,
        });
    }
    let (function_id, new) = functions.get((f.function.as_str(), f.library.as_str()));
    let (file, line) = f.file_line().unwrap_or((&f.library, 0));
    if new {
        out.function.push(proto::Function {
            id: function_id,
            name: s.get(&f.function),
            system_name: s.get(&f.function),
            filename: s.get(file),
        });
    }
    proto::Location {
        id,
        mapping_id,
        line: vec![proto::Line {
            function_id,
            line: i64::from(line),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::heap::sample_profile;
    use std::io::Read;

    /// `p` encoded, then gunzipped and decoded.
    fn decoded(p: &Profile) -> proto::Profile {
        let mut body = vec![];
        flate2::read::GzDecoder::new(&encode(p)[..])
            .read_to_end(&mut body)
            .unwrap();
        proto::Profile::decode(&body[..]).unwrap()
    }

    #[test]
    fn the_gzipped_message_decodes_to_the_stacks_functions_and_libraries() {
        let p = sample_profile();
        assert_eq!(&encode(&p)[..2], &[0x1f, 0x8b]);
        let m = decoded(&p);
        let st = |i: i64| m.string_table[i as usize].as_str();
        assert_eq!(st(0), "");
        assert_eq!(m.sample.len(), 3);
        assert_eq!(m.sample[2].value, [-1, -(1 << 20)]);
        assert_eq!(m.period, 1 << 19);
        assert_eq!(st(m.default_sample_type), "inuse_space");
        assert_eq!(
            (m.location.len(), m.function.len(), m.mapping.len()),
            (4, 4, 2)
        );
        let name_of = |loc: u64| {
            let l = &m.location[loc as usize - 1];
            let func = &m.function[l.line[0].function_id as usize - 1];
            let map = &m.mapping[l.mapping_id as usize - 1];
            (st(func.name).to_string(), st(map.filename).to_string())
        };
        let first: Vec<_> = m.sample[0]
            .location_id
            .iter()
            .map(|&i| name_of(i))
            .collect();
        assert_eq!(
            first,
            [
                ("leaf;odd".into(), "app".into()),
                ("main".into(), "app".into())
            ]
        );
        assert_eq!(name_of(m.sample[2].location_id[0]).1, "libc10.so");
    }

    /// A frame with a source line: its function's file is the source file
    /// and its location's line the line (`go tool pprof -lines`); one
    /// without keeps the library as the file and line 0.
    #[test]
    fn a_frame_with_a_source_line_is_a_pprof_line() {
        let mut p = sample_profile();
        p.stacks[0].frames[0].source = "inl.c:9".into();
        let m = decoded(&p);
        let st = |i: i64| m.string_table[i as usize].as_str();
        let line_of = |loc: u64| {
            let l = &m.location[loc as usize - 1].line[0];
            let func = &m.function[l.function_id as usize - 1];
            (
                st(func.name).to_string(),
                st(func.filename).to_string(),
                l.line,
            )
        };
        let stack: Vec<_> = m.sample[0]
            .location_id
            .iter()
            .map(|&i| line_of(i))
            .collect();
        assert_eq!(
            stack,
            [
                ("leaf;odd".into(), "inl.c".into(), 9),
                ("main".into(), "app".into(), 0)
            ]
        );
    }
}
