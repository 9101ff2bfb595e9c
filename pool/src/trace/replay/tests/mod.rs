//! The replay's own tests: the keep lists of the next phase, and recorded purges.

mod next_requests_tests {
    use super::super::*;

    fn alloc(id: u64, size: usize, stream: u64) -> Op {
        Op::Alloc {
            id,
            size,
            stream,
            name: None,
        }
    }

    #[test]
    fn each_stream_keeps_what_is_live_together_at_the_next_phase_start() {
        let begin = || Op::PhaseBegin { name: "p".into() };
        let end = || Op::PhaseEnd {
            name: "p".into(),
            prefill: true,
        };
        let ops = vec![
            end(),
            alloc(9, 1, 0), // between phases: not part of the next one
            begin(),
            alloc(1, 10, 0),
            alloc(2, 20, 0),
            Op::Free { id: 1 }, // closes stream 0; stream 1 has not started
            alloc(3, 30, 1),
            alloc(4, 40, 0),
            alloc(5, 50, 1),
            end(),
            begin(),
            alloc(6, 60, 2),
        ];
        let next = next_requests(&ops, 1);
        assert_eq!(next.get(&0), Some(&vec![10, 20]));
        assert_eq!(next.get(&1), Some(&vec![30, 50]));
        assert_eq!(next.get(&2), None, "the phase after that is not the next");
        // Phase ends with no phase between them: nothing to keep, and the scan stops at once.
        let ends: Vec<Op> = std::iter::repeat_with(end).take(3).collect();
        assert!(next_requests(&ends, 1).is_empty());
    }
}

mod recorded_purge_tests {
    use super::super::*;
    use crate::trace::parse;

    const MIB: usize = 1 << 20;

    #[test]
    fn names_and_keep_lists_parse_and_print_back() {
        let text = r#"{"op":"alloc","id":0,"size":4096,"stream":1,"name":"K_f16"}
{"op":"keep","stream":1,"sizes":[4096,512]}
{"op":"alloc","id":1,"size":8,"stream":0}
{"op":"keep","stream":0,"all":true}"#;
        let ops = parse(text).unwrap();
        assert_eq!(
            ops[0],
            Op::Alloc {
                id: 0,
                size: 4096,
                stream: 1,
                name: Some("K_f16".into())
            }
        );
        assert_eq!(
            ops[1],
            Op::Keep {
                stream: 1,
                sizes: Some(vec![4096, 512])
            }
        );
        assert_eq!(
            ops[3],
            Op::Keep {
                stream: 0,
                sizes: None
            }
        );
        let printed: Vec<String> = ops.iter().map(Op::to_json).collect();
        assert_eq!(printed.join("\n"), text);
        for bad in [
            r#"{"op":"keep","stream":0}"#,
            r#"{"op":"keep","sizes":[1,-2]}"#,
            r#"{"op":"keep","stream":0,"all":false}"#,
            r#"{"op":"alloc","id":0,"size":1,"name":7}"#,
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("line 1:"), "{e}");
        }
    }

    /// A legacy pool holding an outgrown 4 MiB buffer and a reused 1 MiB one at a boundary.
    fn trace(keep: Option<Option<Vec<usize>>>) -> Vec<Op> {
        let alloc = |id, size| Op::Alloc {
            id,
            size,
            stream: 0,
            name: None,
        };
        let mut ops = vec![
            Op::PhaseBegin { name: "u0".into() },
            alloc(0, 4 * MIB),
            alloc(1, MIB),
            Op::Free { id: 0 },
            Op::Free { id: 1 },
        ];
        if let Some(sizes) = keep {
            ops.push(Op::Keep { stream: 0, sizes });
        }
        ops.push(Op::PhaseEnd {
            name: "u0".into(),
            prefill: true,
        });
        ops.push(Op::PhaseBegin { name: "u1".into() });
        ops.push(alloc(2, 8 * MIB));
        ops.push(alloc(3, MIB));
        ops
    }

    fn run(ops: &[Op]) -> ReplayReport {
        let config = PoolConfig::default().kind(crate::PoolKind::Legacy);
        replay(ops, &config, PurgePolicy::Auto, None).unwrap()
    }

    #[test]
    fn a_recorded_keep_list_decides_what_the_auto_purge_keeps() {
        // Without a keep list, auto keeps what the next phase asks for first (8 MiB and 1 MiB,
        // live together): the 1 MiB buffer stays, the outgrown 4 MiB one goes.
        let oracle = run(&trace(None));
        assert_eq!((oracle.driver_mallocs, oracle.driver_frees), (3, 1));
        // The run's own list is followed even where the oracle would differ: [4 MiB] keeps the
        // outgrown buffer (which then serves the 1 MiB request), [] keeps nothing.
        let kept = run(&trace(Some(Some(vec![4 * MIB]))));
        assert_eq!((kept.driver_mallocs, kept.driver_frees), (3, 1));
        assert!(kept.end_reserved_bytes > oracle.end_reserved_bytes + 2 * MIB);
        let none = run(&trace(Some(Some(vec![]))));
        assert_eq!((none.driver_mallocs, none.driver_frees), (4, 2));
        // "all": the run kept everything (its device had room), and so does the replay: the
        // outgrown 4 MiB buffer stays, nothing goes back.
        let all = run(&trace(Some(None)));
        assert_eq!((all.driver_mallocs, all.driver_frees), (3, 0));
    }
}

mod card_tests {
    use super::super::*;
    use crate::PoolKind;

    const MIB: usize = 1 << 20;

    /// `sizes` allocated in turn and held, through a legacy pool never purged.
    fn held(sizes: &[usize], card: Card) -> ReplayReport {
        let ops: Vec<Op> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| Op::Alloc {
                id: i as u64,
                size,
                stream: 0,
                name: None,
            })
            .collect();
        let legacy = PoolConfig::default().kind(PoolKind::Legacy);
        replay_on_card(&ops, &legacy, PurgePolicy::Never, card).unwrap()
    }

    #[test]
    fn a_gpu_s_pages_count_and_an_engine_s_run_ends_at_its_first_failure() {
        // Blocks of 3 MiB (3.15 with ggml's look-ahead) on a 14 MiB card: four fit by their
        // bytes, three in whole 2 MiB pages (4 MiB each).
        let sizes = [3 * MIB, 3 * MIB, 3 * MIB, 3 * MIB, MIB / 2];
        let bytes = held(&sizes, Card::of(Some(14 * MIB)));
        assert_eq!((bytes.driver_mallocs, bytes.ooms), (5, 0));
        let paged = Card {
            bytes: Some(14 * MIB),
            malloc_page: 2 * MIB,
            stop_at_first_oom: false,
        };
        let r = held(&sizes, paged);
        // The fourth fails; the half-MiB block after it still fits the 2 MiB left.
        assert_eq!(
            (r.driver_mallocs, r.ooms, r.first_oom_event),
            (4, 1, Some(4))
        );
        let stopped = held(
            &sizes,
            Card {
                stop_at_first_oom: true,
                ..paged
            },
        );
        assert_eq!((stopped.driver_mallocs, stopped.ooms), (3, 1));
        assert_eq!(stopped.first_oom_event, Some(4));
        assert!(stopped.peak_reserved_bytes < r.peak_reserved_bytes);
        assert_eq!(
            stopped.events,
            sizes.len(),
            "the trace's length, not what ran"
        );
    }
}
