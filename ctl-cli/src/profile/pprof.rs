//! A heap profile in pprof's format (`profile --format pprof`): the
//! `perftools.profiles.Profile` message of pprof's `proto/profile.proto`,
//! encoded by prost and gzipped by flate2, as `go tool pprof` and pprof-rs
//! read it.
//!
//! Two sample values per stack, `inuse_objects/count` and
//! `inuse_space/bytes` (the names pprof gives a Go heap profile's live
//! figures), period `space/bytes` = the sampling interval.
//!
//! The profile is symbolized already (`has_functions` is set), and keeps
//! what pprof needs to do it again from the files (`-symbolize=force`,
//! `PPROF_BINARY_PATH`): one mapping per executable mapping of the process
//! with its addresses, file offset, full path and build id, and one
//! location per address looked up, in that mapping, whose lines are the
//! frames found there, the functions inlined at that address first (as
//! pprof orders them). A frame without an address (a difference's) is a
//! location of its own, in a mapping named after its library. A function's
//! file name is its source file where the library's debug information
//! names one (and the line is the frame's: `go tool pprof -lines`, `list`),
//! else the library.

use crate::profile::heap::Profile;
use crate::profile::symbols::{Frame, holding};
use memshim_proto::Mapping;
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
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
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

/// Mappings, locations and functions of the message, each added the first
/// time it is used.
struct Builder<'a> {
    s: Strings,
    out: proto::Profile,
    /// The process's mappings, by address.
    maps: &'a [Mapping],
    /// A mapping's id by its index in `maps`, or by a library's name.
    mappings: Ids<MappingKey<'a>>,
    /// A location's id by its address and frames (0 and one frame: a frame
    /// without an address).
    locations: Ids<(u64, &'a [Frame])>,
    /// A function by its name, library and source file: two Python
    /// functions of one name in two files (`make`, `forward`, `<module>`)
    /// are two functions, though their library (`[python]`) is one.
    functions: Ids<(&'a str, &'a str, &'a str)>,
}

#[derive(Hash, PartialEq, Eq)]
enum MappingKey<'a> {
    Process(usize),
    Library(&'a str),
}

fn message(p: &Profile) -> proto::Profile {
    let mut b = Builder {
        s: Strings::default(),
        out: proto::Profile::default(),
        maps: &p.maps,
        mappings: Ids(HashMap::new()),
        locations: Ids(HashMap::new()),
        functions: Ids(HashMap::new()),
    };
    b.s.get(""); // string_table[0] must be ""
    let vt = |s: &mut Strings, t: &str, u: &str| proto::ValueType {
        r#type: s.get(t),
        unit: s.get(u),
    };
    b.out.sample_type = vec![
        vt(&mut b.s, "inuse_objects", "count"),
        vt(&mut b.s, "inuse_space", "bytes"),
    ];
    for st in &p.stacks {
        let mut ids = Vec::with_capacity(st.frames.len());
        // The frames found at one address (those inlined there, then the
        // function holding the code) are one location.
        let mut rest = &st.frames[..];
        while let Some(first) = rest.first() {
            let n = match first.address {
                0 => 1,
                a => rest.iter().take_while(|f| f.address == a).count(),
            };
            let (here, next) = rest.split_at(n);
            ids.push(b.location(first.address, here));
            rest = next;
        }
        b.out.sample.push(proto::Sample {
            location_id: ids,
            value: vec![st.objects, st.bytes],
        });
    }
    let mut out = b.out;
    out.period_type = Some(vt(&mut b.s, "space", "bytes"));
    out.period = 1i64 << p.lg_sample.min(62);
    out.default_sample_type = b.s.get("inuse_space");
    out.time_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    out.string_table = b.s.table;
    out
}

impl<'a> Builder<'a> {
    /// The id of the location of `frames` (innermost first) at `address`,
    /// adding it, its functions and its mapping the first time.
    fn location(&mut self, address: u64, frames: &'a [Frame]) -> u64 {
        let (id, new) = self.locations.get((address, frames));
        if !new {
            return id;
        }
        let mapping_id = self.mapping(address, &frames[0].library);
        let line = frames
            .iter()
            .map(|f| {
                let (file, line) = f.file_line().unwrap_or((&f.library, 0));
                let (function_id, new) = self.functions.get((&f.function, &f.library, file));
                if new {
                    // pprof's demangler takes `<...>` for C++ template
                    // arguments and drops them: `<module>` would lose its
                    // whole name. A Python frame's brackets are shown as
                    // single guillemets there.
                    let name = if f.is_python() {
                        self.s
                            .get(&f.function.replace('<', "\u{2039}").replace('>', "\u{203a}"))
                    } else {
                        self.s.get(&f.function)
                    };
                    self.out.function.push(proto::Function {
                        id: function_id,
                        name,
                        system_name: name,
                        filename: self.s.get(file),
                    });
                }
                proto::Line {
                    function_id,
                    line: i64::from(line),
                }
            })
            .collect();
        self.out.location.push(proto::Location {
            id,
            mapping_id,
            address,
            line,
        });
        id
    }

    /// The id of the process's mapping that holds `address`, else of one
    /// named after `library`, adding it the first time.
    fn mapping(&mut self, address: u64, library: &'a str) -> u64 {
        let held = (address != 0)
            .then(|| holding(self.maps, address))
            .flatten();
        let key = held.map_or(MappingKey::Library(library), MappingKey::Process);
        let (id, new) = self.mappings.get(key);
        if new {
            let mut m = proto::Mapping {
                id,
                filename: self.s.get(library),
                has_functions: true,
                ..Default::default()
            };
            if let Some(i) = held {
                let pm = &self.maps[i];
                let path = pm.path.strip_suffix(" (deleted)").unwrap_or(&pm.path);
                m.memory_start = pm.start;
                m.memory_limit = pm.end;
                m.file_offset = pm.offset;
                m.filename = self.s.get(path);
                m.build_id = self.s.get(&pm.build_id);
                m.has_filenames = true;
                m.has_line_numbers = true;
                m.has_inline_frames = true;
            }
            self.out.mapping.push(m);
        }
        id
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

    /// Two Python functions of one name in two files are two pprof
    /// functions, each with its own file (they were one, with the first
    /// file seen, and `go tool pprof -list make` put both on it).
    #[test]
    fn functions_of_one_name_in_two_files_stay_apart() {
        let mut p = sample_profile();
        p.stacks[0].frames[0] = Frame {
            source: "/srv/moda.py:2".into(),
            ..Frame::new("make", "[python]")
        };
        p.stacks[1].frames[0] = Frame {
            source: "/srv/modb.py:2".into(),
            ..Frame::new("make", "[python]")
        };
        let m = decoded(&p);
        let st = |i: i64| m.string_table[i as usize].as_str();
        let files: Vec<_> = m
            .function
            .iter()
            .filter(|f| st(f.name) == "make")
            .map(|f| st(f.filename))
            .collect();
        assert_eq!(files, ["/srv/moda.py", "/srv/modb.py"]);
    }

    /// A profile with the process's mappings: each address is one location
    /// in the mapping that holds it (path, range, offset, build id), the
    /// frames inlined there its lines, innermost first; a frame without an
    /// address keeps a mapping named after its library.
    #[test]
    fn addresses_and_mappings_are_kept_for_pprof_to_symbolize_again() {
        let mut p = sample_profile();
        p.maps = vec![Mapping {
            start: 0x1000,
            end: 0x9000,
            offset: 0x800,
            path: "/opt/app/bin/app (deleted)".into(),
            build_id: "ab".repeat(20),
        }];
        let at = |a: u64, f: &str| Frame {
            address: a,
            ..Frame::new(f, "app")
        };
        p.stacks[0].frames = vec![
            at(0x2000, "inlined"),
            at(0x2000, "outer"),
            at(0x3000, "main"),
        ];
        p.stacks[1].frames = vec![
            at(0x2000, "inlined"),
            at(0x2000, "outer"),
            at(0x3000, "main"),
        ];
        let m = decoded(&p);
        let st = |i: i64| m.string_table[i as usize].as_str();
        assert_eq!(m.sample[0].location_id, m.sample[1].location_id);
        let locs: Vec<&proto::Location> = m.sample[0]
            .location_id
            .iter()
            .map(|&i| &m.location[i as usize - 1])
            .collect();
        assert_eq!(
            locs.iter()
                .map(|l| (l.address, l.line.len()))
                .collect::<Vec<_>>(),
            [(0x2000, 2), (0x3000, 1)]
        );
        let fname = |l: &proto::Line| st(m.function[l.function_id as usize - 1].name);
        assert_eq!(
            locs[0].line.iter().map(fname).collect::<Vec<_>>(),
            ["inlined", "outer"]
        );
        let map = &m.mapping[locs[0].mapping_id as usize - 1];
        assert_eq!(locs[1].mapping_id, locs[0].mapping_id);
        assert_eq!(
            (map.memory_start, map.memory_limit, map.file_offset),
            (0x1000, 0x9000, 0x800)
        );
        assert_eq!(st(map.filename), "/opt/app/bin/app");
        assert_eq!(st(map.build_id), "ab".repeat(20));
        assert!(map.has_functions && map.has_inline_frames);
        // The freed stack's frames have no address: a mapping by library.
        let freed = &m.location[m.sample[2].location_id[0] as usize - 1];
        assert_eq!(freed.address, 0);
        assert_eq!(
            st(m.mapping[freed.mapping_id as usize - 1].filename),
            "libc10.so"
        );
    }
}
