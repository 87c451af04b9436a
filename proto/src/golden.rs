//! Golden encodings: these exact bytes are the wire contract. A change here
//! is a protocol change (docs/protocol.md, "Compatibility").

use crate::*;

fn line<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

#[test]
fn requests_encode_exactly() {
    let cases: &[(Request, &str)] = &[
        (
            Request::Hello {
                version: 1,
                client: None,
            },
            r#"{"op":"hello","version":1}"#,
        ),
        (
            Request::Hello {
                version: 1,
                client: Some("memshim-ctl 0.1.0".into()),
            },
            r#"{"op":"hello","version":1,"client":"memshim-ctl 0.1.0"}"#,
        ),
        (
            Request::Stats {
                arenas: false,
                pss: false,
            },
            r#"{"op":"stats","arenas":false,"pss":false}"#,
        ),
        (Request::Purge, r#"{"op":"purge"}"#),
        (
            Request::Decay {
                dirty_ms: Some(-1),
                muzzy_ms: None,
            },
            r#"{"op":"decay","dirty_ms":-1}"#,
        ),
        (Request::Gc, r#"{"op":"gc"}"#),
        (Request::EmptyCache, r#"{"op":"empty_cache"}"#),
        (Request::Release, r#"{"op":"release"}"#),
    ];
    for (req, want) in cases {
        assert_eq!(line(req), *want);
        assert_eq!(req.to_line(), format!("{want}\n").into_bytes());
        assert_eq!(&parse_request(want.as_bytes()).unwrap(), req);
    }
    // Optional request fields may be left out.
    assert_eq!(
        parse_request(br#"{"op":"stats"}"#).unwrap(),
        Request::Stats {
            arenas: false,
            pss: false
        }
    );
}

#[test]
fn replies_encode_exactly() {
    let purge = Response::Ok(Reply::Purge(PurgeResult {
        rss_before: 1_200_000_000,
        rss_after: 140_000_000,
        released: 1_060_000_000,
        resident_before: 1_100_000_000,
        resident_after: 40_000_000,
        purgeable_before: 1_060_000_000,
        elapsed_ms: 41.5,
    }));
    assert_eq!(
        line(&purge),
        r#"{"ok":{"kind":"purge","rss_before":1200000000,"rss_after":140000000,"released":1060000000,"resident_before":1100000000,"resident_after":40000000,"purgeable_before":1060000000,"elapsed_ms":41.5}}"#
    );
    let decay = Response::Ok(Reply::Decay(DecayResult {
        dirty_decay_ms: 1000,
        muzzy_decay_ms: 0,
    }));
    assert_eq!(
        line(&decay),
        r#"{"ok":{"kind":"decay","dirty_decay_ms":1000,"muzzy_decay_ms":0}}"#
    );
    let release = Response::Ok(Reply::Release(ReleaseResult {
        rss_before: 10,
        rss_after: 4,
        released: 6,
        elapsed_ms: 3.0,
        steps: vec![
            ReleaseStep {
                step: ReleaseStepKind::Gc,
                measure: "rss".into(),
                before: 10,
                after: 10,
                elapsed_ms: 1000.0,
                outcome: StepOutcome::Failed,
                skipped: None,
                error: Some(
                    "CPython was busy: the GIL could not be had within 1000 ms; try again".into(),
                ),
                python: Some(PythonUnavailable::Busy { waited_ms: 1000 }),
                devices: vec![],
            },
            ReleaseStep {
                step: ReleaseStepKind::EmptyCache,
                measure: "cuda_reserved".into(),
                before: 0,
                after: 0,
                elapsed_ms: 0.0,
                outcome: StepOutcome::NothingToDo,
                skipped: Some("torch is not imported".into()),
                error: None,
                python: None,
                devices: vec![DeviceChange {
                    index: 0,
                    before: 0,
                    after: 0,
                }],
            },
        ],
    }));
    assert_eq!(
        line(&release),
        r#"{"ok":{"kind":"release","rss_before":10,"rss_after":4,"released":6,"elapsed_ms":3.0,"steps":[{"step":"gc","measure":"rss","before":10,"after":10,"elapsed_ms":1000.0,"outcome":"failed","skipped":null,"error":"CPython was busy: the GIL could not be had within 1000 ms; try again","python":{"reason":"busy","waited_ms":1000}},{"step":"empty_cache","measure":"cuda_reserved","before":0,"after":0,"elapsed_ms":0.0,"outcome":"nothing_to_do","skipped":"torch is not imported","devices":[{"index":0,"before":0,"after":0}]}]}}"#
    );
    // A step from a 0.1 server (no `outcome`) reads as done.
    let old =
        r#"{"step":"purge","measure":"rss","before":2,"after":1,"elapsed_ms":1.0,"skipped":null}"#;
    let s: ReleaseStep = serde_json::from_str(old).unwrap();
    assert_eq!((s.outcome, s.error), (StepOutcome::Done, None));
}

#[test]
fn errors_encode_exactly() {
    let e = Response::Error(ErrorReply::new(
        ErrorCode::TooLarge,
        "request line longer than 65536 bytes",
    ));
    assert_eq!(
        line(&e),
        r#"{"error":{"code":"too_large","message":"request line longer than 65536 bytes"}}"#
    );
    let p = Response::Error(ErrorReply::python(PythonUnavailable::Busy {
        waited_ms: 1000,
    }));
    assert_eq!(
        line(&p),
        r#"{"error":{"code":"python_unavailable","message":"CPython was busy: the GIL could not be had within 1000 ms; try again","python":{"reason":"busy","waited_ms":1000}}}"#
    );
    assert_eq!(
        line(&PythonUnavailable::NoPython),
        r#"{"reason":"no_python"}"#
    );
    // A code from a newer server still decodes.
    let r = Response::from_line(br#"{"error":{"code":"shiny_new","message":"x"}}"#).unwrap();
    assert!(matches!(
        r,
        Response::Error(ErrorReply {
            code: ErrorCode::Unknown,
            ..
        })
    ));
}

#[test]
fn stats_field_names_are_stable() {
    let s = StatsReport {
        python: Some(PythonSection::default()),
        torch: Some(TorchSection {
            devices: vec![TorchDevice::default()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let v: serde_json::Value =
        serde_json::to_value(Response::Ok(Reply::Stats(Box::new(s)))).unwrap();
    // serde_json's map is sorted; compare as sorted sets of names.
    let keys =
        |v: &serde_json::Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let want = |names: &str| -> Vec<String> {
        let mut v: Vec<String> = names.split_whitespace().map(str::to_string).collect();
        v.sort();
        v
    };
    let ok = &v["ok"];
    assert_eq!(
        keys(ok),
        want(
            "kind pid allocator arenas process cgroup config python torch python_unavailable purges elapsed_ms"
        )
    );
    assert_eq!(
        keys(&ok["allocator"]),
        want("allocated active resident mapped retained metadata dirty muzzy tcache purgeable")
    );
    assert_eq!(
        keys(&ok["process"]),
        want("rss pss anon file shmem swap unmanaged")
    );
    assert_eq!(
        keys(&ok["config"]),
        want(
            "dirty_decay_ms muzzy_decay_ms narenas background_purge jemalloc_background_thread jemalloc_version shim_version interposed control uptime_ms fork_child deepbind_cleared thread_starts"
        )
    );
    assert_eq!(
        keys(&ok["python"]),
        want(
            "version free_threaded gc_enabled gc_counts gc_thresholds gc_collections allocated_blocks threads pymalloc_arena_bytes"
        )
    );
    assert_eq!(keys(&ok["torch"]), want("version cuda_initialized devices"));
    assert_eq!(
        keys(&ok["torch"]["devices"][0]),
        want(
            "index allocated reserved active inactive_split peak_allocated num_alloc_retries num_ooms fragmentation allocations"
        )
    );
    // The optional CUDA figures, once CUDA is initialised.
    let t = TorchSection {
        allocator_backend: Some("native".into()),
        alloc_conf: Some("expandable_segments:True".into()),
        host_pinned: Some(HostPinned::default()),
        devices: vec![TorchDevice {
            uuid: Some("GPU-0".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(
        keys(&v),
        want("version cuda_initialized devices allocator_backend alloc_conf host_pinned")
    );
    assert_eq!(keys(&v["host_pinned"]), want("allocated active cached"));
    assert!(v["devices"][0]["uuid"].is_string());
}

#[test]
fn pressure_section_names_are_stable_and_optional() {
    let p = PressureStats {
        mode: "on".into(),
        source: "v1".into(),
        watching: vec!["usage_threshold".into()],
        limit: Some(700 << 20),
        threshold: Some(630 << 20),
        ..Default::default()
    };
    let s = StatsReport {
        pressure: Some(p.clone()),
        ..Default::default()
    };
    let v = serde_json::to_value(&s).unwrap();
    let mut names: Vec<String> = v["pressure"].as_object().unwrap().keys().cloned().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "active",
            "bytes_returned",
            "events",
            "gc_runs",
            "ignored",
            "last_purge_ms",
            "limit",
            "mode",
            "purges",
            "source",
            "threshold",
            "watching"
        ]
    );
    // A report from a shim that predates the section decodes with none,
    // and a report without it is encoded without the key.
    let mut old = v.clone();
    old.as_object_mut().unwrap().remove("pressure");
    let back: StatsReport = serde_json::from_value(old).unwrap();
    assert_eq!(back.pressure, None);
    let none = serde_json::to_value(StatsReport::default()).unwrap();
    assert!(none.get("pressure").is_none());
    // The four figures of a minimal section are enough to decode it.
    let min: PressureStats = serde_json::from_str(
        r#"{"mode":"off","source":"none","active":false,"events":0,"purges":0,"bytes_returned":0}"#,
    )
    .unwrap();
    assert_eq!(min.mode, "off");
}
