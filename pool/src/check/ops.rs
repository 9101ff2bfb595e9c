//! The operations the checker runs, and their decoding from fuzz input.

use crate::driver::CallKind;

const MIB: usize = 1 << 20;

/// One step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate this many bytes on the current stream.
    Alloc(usize),
    /// Free the live block at this index (modulo the count).
    Free(usize),
    /// Synchronize and purge everything.
    PurgeAll,
    /// Synchronize and purge cached buffers smaller than this.
    PurgeSmaller(usize),
    /// Synchronize and keep only what these requests would reuse.
    PurgeKeepFor(Vec<usize>),
    /// Synchronize the device.
    Sync,
    /// End the open phase (checking it) and begin another.
    Phase,
    /// Switch to stream 0 or 1.
    Stream(u8),
    /// Arm a fault on a driver call (only when faults are enabled).
    Fault(u8),
}

/// Decodes fuzz input into operations: one opcode byte, then its operands.
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut i = 0;
    let take = |n: usize, i: &mut usize| -> u64 {
        let mut v = 0u64;
        for k in 0..n {
            v |= (*data.get(*i + k).unwrap_or(&0) as u64) << (8 * k);
        }
        *i += n;
        v
    };
    while i < data.len() && ops.len() < 4096 {
        let code = data[i];
        i += 1;
        let op = match code % 10 {
            0..=2 => {
                // Sizes from 0 to beyond any card, biased to the interesting range.
                let raw = take(4, &mut i);
                Op::Alloc(match code / 10 % 4 {
                    0 => (raw % 4096) as usize,
                    1 => (raw % (16 * MIB as u64)) as usize,
                    2 => raw as usize,
                    _ => (raw as usize) << 16,
                })
            }
            3 | 4 => Op::Free(take(2, &mut i) as usize),
            5 => Op::PurgeAll,
            6 => Op::PurgeSmaller((take(3, &mut i) as usize) * 64),
            7 => {
                let n = (take(1, &mut i) % 5) as usize;
                Op::PurgeKeepFor((0..n).map(|_| (take(3, &mut i) as usize) * 16).collect())
            }
            8 => match code / 10 % 3 {
                0 => Op::Sync,
                1 => Op::Phase,
                _ => Op::Stream((take(1, &mut i) % 2) as u8),
            },
            _ => Op::Fault(take(1, &mut i) as u8),
        };
        ops.push(op);
    }
    ops
}

/// The driver calls a pool makes while it runs, so the calls a fault is armed on: every kind
/// but initialisation and the address free that only a pool's drop makes.
pub fn fault_kinds() -> Vec<CallKind> {
    CallKind::ALL
        .into_iter()
        .filter(|k| !matches!(k, CallKind::Init | CallKind::ReleaseReservation))
        .collect()
}
