//! The sorted index of [`Slots`] against ggml's scan.

use super::*;
use proptest::prelude::*;

/// ggml's loop over the slots: smallest excess below `max_excess`, ties to the first, an
/// exact fit ending the scan; the position in `candidates`.
fn scan(slots: &Slots, candidates: &[usize], size: usize) -> Option<usize> {
    let mut best = None;
    let mut best_diff = slots.config.max_excess;
    for (pos, &i) in candidates.iter().enumerate() {
        let s = slots.size[i];
        if s >= size && s - size < best_diff {
            best_diff = s - size;
            best = Some(pos);
            if best_diff == 0 {
                break;
            }
        }
    }
    best
}

#[derive(Clone, Debug)]
enum Op {
    Free(usize),
    Take(usize),
    Keep(Vec<usize>),
    /// Removes the idle buffer at this position among the occupied slots (a purge).
    Remove(usize),
}

fn op() -> impl Strategy<Value = Op> {
    // Few distinct sizes, so that ties and exact fits are common.
    let size = (1usize..12).prop_map(|s| s * 1000);
    prop_oneof![
        3 => size.clone().prop_map(Op::Free),
        2 => size.clone().prop_map(Op::Take),
        1 => proptest::collection::vec(size, 0..6).prop_map(Op::Keep),
        1 => (0usize..10).prop_map(Op::Remove),
    ]
}

proptest! {
    /// The sorted index chooses what ggml's scan chooses, for a request and for what an
    /// auto purge keeps, with the table full or not and a `max_excess` that refuses some.
    #[test]
    fn the_index_chooses_as_the_scan(
        ops in proptest::collection::vec(op(), 1..200),
        slots in 1usize..10,
        max_excess in prop_oneof![Just(1usize << 36), 1000usize..6000],
    ) {
        let mut t = Slots::new(SlotsConfig { slots, max_excess, ..SlotsConfig::default() });
        let mut next = 1u64;
        for op in ops {
            match op {
                Op::Free(size) => {
                    let expected_slot = t.first_empty();
                    let back = t.give_back(Fit { addr: next, capacity: size }, next);
                    prop_assert_eq!(back.is_some(), expected_slot.is_none());
                    next += 1;
                }
                Op::Take(size) => {
                    let occupied: Vec<usize> = t.iter().collect();
                    let expected = scan(&t, &occupied, size).map(|p| t.ptr[occupied[p]]);
                    prop_assert_eq!(t.take(size).map(|f| f.addr), expected);
                }
                Op::Remove(k) => {
                    let occupied: Vec<usize> = t.iter().collect();
                    if let Some(&i) = occupied.get(k) {
                        let seg = t.idle_at(i).seg;
                        t.remove(&seg);
                        prop_assert!(t.iter().all(|j| j != i), "slot {} emptied", i);
                    }
                }
                Op::Keep(requests) => {
                    let mut unclaimed: Vec<usize> = t.iter().collect();
                    for &r in &requests {
                        if let Some(p) = scan(&t, &unclaimed, r.max(1)) {
                            unclaimed.remove(p);
                        }
                    }
                    let expected: Vec<u64> = unclaimed.iter().map(|&i| t.ptr[i]).collect();
                    let what = Purge::KeepFor(requests);
                    let got: Vec<u64> = t.idle(&what).iter().map(|i| i.seg.ptr).collect();
                    prop_assert_eq!(got, expected);
                    // What `idle_bytes` sums is what `idle` lists, for every kind of purge.
                    for what in [what, Purge::All, Purge::SmallerThan(5000)] {
                        let listed: usize = t.idle(&what).iter().map(|i| i.seg.len).sum();
                        prop_assert_eq!(t.idle_bytes(&what, &mut |s| s.len), listed);
                    }
                }
            }
            // The live entries are the occupied slots, each once.
            let mut live: Vec<(usize, u32)> = t.live_entries().collect();
            let mut want: Vec<(usize, u32)> = t.iter().map(|i| (t.size[i], i as u32)).collect();
            want.sort_unstable();
            prop_assert_eq!(&live, &want);
            live.dedup();
            prop_assert_eq!(live.len(), t.live);
            prop_assert!(t.by_size.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
