//! What a run did: the "did enough" minimums ([`check_minimums`]) and the
//! human summary (`summary.txt`).

use std::fmt::Write as _;

use super::RunArgs;
use crate::workload::{Function, Outcome, Phase, Record};

/// Item 7 of the fault suite: a run proves something only if it did
/// something **during the fault schedule**. Only operations invoked before
/// the final reads count (an op marked `final_read` does not, nor does
/// anything invoked after the first of them; a watcher's records are
/// neither reads nor writes). Returns the shortfalls:
/// fewer than `min_ok_writes` acknowledged writes or `min_ok_reads` ok
/// reads (the caller scales them to the run's length: [`super::minimum_for`]);
/// or a heal — a fault stop that leaves no fault active — with no ok read
/// and no ok write invoked between it and the next fault's start (or the
/// end of the schedule).
pub fn check_minimums(
    records: &[Record],
    min_ok_writes: usize,
    min_ok_reads: usize,
) -> Vec<String> {
    let schedule_end = records
        .iter()
        .filter_map(|r| match r {
            Record::Op(op) if op.final_read => Some(op.invoke_ns),
            _ => None,
        })
        .min()
        .unwrap_or(u64::MAX);
    let ok_ops: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Op(op)
                if op.outcome == Outcome::Ok
                    && !op.final_read
                    && !op.f.is_watch()
                    && op.invoke_ns < schedule_end =>
            {
                Some(op)
            }
            _ => None,
        })
        .collect();
    let ok_writes = ok_ops.iter().filter(|op| op.f.is_write()).count();
    let ok_reads = ok_ops.len() - ok_writes;
    let mut problems = Vec::new();
    if ok_writes < min_ok_writes {
        problems.push(format!(
            "{ok_writes} ok writes invoked during the schedule, fewer than min_ok_writes \
             ({min_ok_writes})"
        ));
    }
    if ok_reads < min_ok_reads {
        problems.push(format!(
            "{ok_reads} ok reads invoked during the schedule, fewer than min_ok_reads \
             ({min_ok_reads})"
        ));
    }
    // The calm gaps: from a stop that leaves no fault active to the next
    // start (or the schedule's end).
    let mut active: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut gaps: Vec<(String, u64, u64)> = Vec::new();
    for record in records {
        let Record::Nemesis(event) = record else {
            continue;
        };
        match event.phase {
            Phase::Start => {
                if active.values().all(|&n| n == 0)
                    && let Some(gap) = gaps.last_mut()
                    && gap.2 == u64::MAX
                {
                    gap.2 = event.time_ns;
                }
                *active.entry(event.fault.as_str()).or_default() += 1;
            }
            Phase::Stop => {
                let open = active.entry(event.fault.as_str()).or_default();
                *open = open.saturating_sub(1);
                if active.values().all(|&n| n == 0) {
                    gaps.push((event.fault.clone(), event.time_ns, u64::MAX));
                }
            }
        }
    }
    for (fault, from, to) in gaps {
        let to = to.min(schedule_end);
        let in_gap = |write: bool| {
            ok_ops
                .iter()
                .any(|op| op.f.is_write() == write && op.invoke_ns >= from && op.invoke_ns < to)
        };
        for (write, what) in [(false, "read"), (true, "write")] {
            if !in_gap(write) {
                problems.push(format!(
                    "no ok {what} invoked between the heal of {fault} at +{:.2} s and the next \
                     fault{}",
                    seconds(from),
                    if to == u64::MAX || to == schedule_end {
                        " (the end of the schedule)".to_string()
                    } else {
                        format!(" at +{:.2} s", seconds(to))
                    }
                ));
            }
        }
    }
    problems
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The human summary: operations per function and outcome, faults with
/// times, and the shortfalls.
pub(super) fn summary(
    args: &RunArgs,
    nodes: u64,
    seed: u64,
    records: &[Record],
    problems: &[String],
) -> String {
    let mut out = String::new();
    let mut faults: Vec<_> = args.nemesis.0.iter().map(|f| f.name()).collect();
    // A combined schedule repeats names: list each once.
    let mut seen = std::collections::HashSet::new();
    faults.retain(|name| seen.insert(*name));
    let _ = writeln!(
        out,
        "jepsen run: workload {:?}, nemesis {}, nodes {nodes}, time {} s, concurrency {}, rate {}/s, seed {seed}",
        args.workload,
        if faults.is_empty() {
            "none".to_string()
        } else {
            faults.join(",")
        },
        args.time.as_secs_f64(),
        args.concurrency,
        args.rate,
    );
    let _ = writeln!(
        out,
        "\n{:<16} {:>8} {:>8} {:>8} {:>8}",
        "f", "invoked", "ok", "fail", "unknown"
    );
    for f in [
        Function::Read,
        Function::Write,
        Function::Cas,
        Function::Add,
        Function::ReadAll,
        Function::Delete,
        Function::WatchOpen,
        Function::Watch,
        Function::LeaseGrant,
        Function::LeaseKeepAlive,
        Function::LeaseRevoke,
        Function::LeaseRead,
    ] {
        let ops: Vec<_> = records
            .iter()
            .filter_map(|r| match r {
                Record::Op(op) if op.f == f && !op.final_read => Some(op),
                _ => None,
            })
            .collect();
        if ops.is_empty() {
            continue;
        }
        let count = |o: Outcome| ops.iter().filter(|op| op.outcome == o).count();
        let name = serde_json::to_value(f)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{name:<16} {:>8} {:>8} {:>8} {:>8}",
            ops.len(),
            count(Outcome::Ok),
            count(Outcome::Fail),
            count(Outcome::Info)
        );
    }
    let finals: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Op(op) if op.final_read => Some(op),
            _ => None,
        })
        .collect();
    if !finals.is_empty() {
        let _ = writeln!(
            out,
            "{:<16} {:>8} {:>8} {:>8} {:>8}   (after the schedule; not counted as work)",
            "final-read",
            finals.len(),
            finals.iter().filter(|op| op.outcome == Outcome::Ok).count(),
            finals
                .iter()
                .filter(|op| op.outcome == Outcome::Fail)
                .count(),
            finals
                .iter()
                .filter(|op| op.outcome == Outcome::Info)
                .count()
        );
    }
    let _ = writeln!(out, "\nfaults (seconds since the workload started):");
    let mut any_fault = false;
    for record in records {
        if let Record::Nemesis(event) = record {
            any_fault = true;
            let phase = if event.phase == Phase::Start {
                "start"
            } else {
                "stop "
            };
            let _ = writeln!(
                out,
                "  +{:>7.2}  {phase} {:<18} {}",
                seconds(event.time_ns),
                event.fault,
                event.detail
            );
        }
    }
    if !any_fault {
        let _ = writeln!(out, "  none");
    }
    if problems.is_empty() {
        let _ = writeln!(
            out,
            "\nenough: yes (minimums met during the schedule, an ok read and write after every heal, history well-formed)"
        );
    } else {
        let _ = writeln!(out, "\nenough: NO");
        for problem in problems {
            let _ = writeln!(out, "  - {problem}");
        }
    }
    out
}
