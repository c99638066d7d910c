//! Per-key linearizability: the Wing–Gong search with Lowe's memoization of
//! (linearized set, state), keys checked independently and in parallel.
//!
//! Semantics:
//! - an ok operation must take effect between its invocation and its
//!   completion, with the result it returned;
//! - a failed operation never took effect and is left out, as is a read of
//!   unknown outcome (it constrains nothing);
//! - an operation of unknown outcome may take effect at any time after its
//!   invocation, or never (its completion is placed after the end of the
//!   history, and "no effect" is always one of its choices).
//!
//! The search is bounded by a step budget per key; a key that exhausts it is
//! reported as unknown, never as linearizable. For a key that is not
//! linearizable the report gives the shortest failing prefix (a binary search
//! over prefixes, in which operations still running at the cut are of unknown
//! outcome) and the operations involved.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde::Serialize;

use crate::Error;
use crate::history::{Operation, Outcome, by_key};
use crate::model::{Interner, Model};

/// Search steps (entries visited) allowed per key before the verdict is
/// "unknown (budget exhausted)". The etcd test histories need well under a
/// million; this leaves room while keeping a hopeless key to seconds.
pub const STEP_BUDGET_DEFAULT: u64 = 20_000_000;

/// Memoized (linearized set, state) pairs allowed per key, so a hard key
/// cannot exhaust memory before it exhausts the step budget.
pub const CACHE_ENTRIES_MAX: usize = 4_000_000;

/// Operations completed just before the failing one that a failure report
/// lists, besides the ones concurrent with it.
pub const REPORT_CONTEXT_OPERATIONS: usize = 6;

/// The most operations a failure report lists.
pub const REPORT_OPERATIONS_MAX: usize = 24;

/// How to run the search.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Search steps allowed per key (see [`STEP_BUDGET_DEFAULT`]).
    pub step_budget: u64,
    /// Stop the other keys once one key is not linearizable (the history's
    /// verdict is then known); they are reported as `cancelled`.
    pub stop_at_first_failure: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            step_budget: STEP_BUDGET_DEFAULT,
            stop_at_first_failure: true,
        }
    }
}

/// A key's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Some order of the operations satisfies the model.
    Linearizable,
    /// No order does.
    NotLinearizable,
    /// The step budget (or the memo bound) ran out first, or the key was
    /// cancelled because another key already failed.
    Unknown,
}

/// Why a key is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// The length (in events of the whole history) of the shortest prefix
    /// that is already not linearizable.
    pub prefix_events: usize,
    /// The operation whose completion ends that prefix.
    pub failing: String,
    /// The operations involved: concurrent with the failing one, and the
    /// last few that completed before it started.
    pub involved: Vec<String>,
}

/// The result for one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyResult {
    /// The key.
    pub key: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Operations checked (after leaving out failed ones and unknown reads).
    pub operations: usize,
    /// Search steps used.
    pub steps: u64,
    /// Whether the search stopped because another key failed first.
    pub cancelled: bool,
    /// For a non-linearizable key: where and why.
    pub failure: Option<Failure>,
}

/// The result for a whole history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The model's name.
    pub model: &'static str,
    /// Not linearizable if any key is not; else unknown if any key is unknown.
    pub verdict: Verdict,
    /// One result per key, in order of first appearance.
    pub keys: Vec<KeyResult>,
}

/// An operation as the search sees it.
#[derive(Debug)]
struct Prepared<I> {
    call: usize,
    /// `usize::MAX` = unknown outcome (after the end of the history).
    ret: usize,
    input: I,
    unknown: bool,
}

/// Checks every key of a history independently, in parallel.
pub fn check<M: Model>(
    model: &M,
    operations: &[Operation],
    settings: Settings,
) -> Result<Report, Error> {
    let keys = by_key(operations);
    let results: Mutex<Vec<Option<Result<KeyResult, Error>>>> =
        Mutex::new((0..keys.len()).map(|_| None).collect());
    // Biggest keys first, so one long key does not start last.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(keys[i].1.len()));
    let next = AtomicUsize::new(0);
    let cancel = AtomicBool::new(false);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(keys.len())
        .max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let slot = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&index) = order.get(slot) else {
                        break;
                    };
                    let (key, key_operations) = &keys[index];
                    let result = check_key(model, key, key_operations, settings, &cancel);
                    let mut guard = results.lock().unwrap_or_else(|e| e.into_inner());
                    guard[index] = Some(result);
                }
            });
        }
    });
    let mut key_results = Vec::with_capacity(keys.len());
    for result in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        match result {
            Some(result) => key_results.push(result?),
            None => unreachable!("every key is checked by some thread"),
        }
    }
    let verdict = if key_results
        .iter()
        .any(|k| k.verdict == Verdict::NotLinearizable)
    {
        Verdict::NotLinearizable
    } else if key_results.iter().any(|k| k.verdict == Verdict::Unknown) {
        Verdict::Unknown
    } else {
        Verdict::Linearizable
    };
    Ok(Report {
        model: model.name(),
        verdict,
        keys: key_results,
    })
}

/// The operations of one key as they stand after the first `cut` events of
/// the history (`usize::MAX` = the whole history): operations invoked later
/// are left out, and those still running at the cut are of unknown outcome.
fn prepare<M: Model>(
    model: &M,
    operations: &[Operation],
    cut: usize,
) -> Result<Vec<Prepared<M::Input>>, Error> {
    let mut values = Interner::default();
    let mut prepared = Vec::new();
    for operation in operations {
        if operation.invoke_position >= cut {
            continue;
        }
        let mut operation = operation.clone();
        if operation.complete_position.is_some_and(|done| done >= cut) {
            operation.outcome = Outcome::Unknown;
            operation.complete_position = None;
        }
        match operation.outcome {
            Outcome::Fail => continue,
            Outcome::Unknown if operation.is_read() => continue,
            _ => {}
        }
        let Some(input) = model.prepare(&operation, &mut values)? else {
            continue;
        };
        prepared.push(Prepared {
            call: operation.invoke_position,
            ret: operation.complete_position.unwrap_or(usize::MAX),
            input,
            unknown: operation.outcome == Outcome::Unknown,
        });
    }
    Ok(prepared)
}

/// The outcome of one search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Search {
    Linearizable,
    NotLinearizable,
    Exhausted,
}

/// Wing–Gong search with Lowe's memoization over one key's operations.
///
/// `furthest` receives the latest completion at which some branch got stuck;
/// `cancel` stops the search early (reported as exhausted).
fn search<M: Model>(
    model: &M,
    operations: &[Prepared<M::Input>],
    step_budget: u64,
    cancel: &AtomicBool,
    steps: &mut u64,
    furthest: &mut usize,
) -> Search {
    const NIL: usize = usize::MAX;
    let count = operations.len();
    if count == 0 {
        return Search::Linearizable;
    }
    // Entries: (time, is_return, operation); calls sort before returns.
    let mut entries: Vec<(usize, bool, usize)> = Vec::with_capacity(2 * count);
    for (index, operation) in operations.iter().enumerate() {
        entries.push((operation.call, false, index));
        entries.push((operation.ret, true, index));
    }
    entries.sort_unstable_by_key(|&(time, is_return, index)| (time, is_return, index));
    // Doubly linked list over nodes 1..=2n, head sentinel 0.
    let nodes = 2 * count + 1;
    let mut next = vec![NIL; nodes];
    let mut prev = vec![NIL; nodes];
    let mut return_node = vec![0usize; count];
    for (position, &(_, is_return, index)) in entries.iter().enumerate() {
        let node = position + 1;
        prev[node] = position;
        next[position] = node;
        if is_return {
            return_node[index] = node;
        }
    }
    let entry = |node: usize| entries[node - 1];
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        let (p, n) = (prev[node], next[node]);
        next[p] = n;
        if n != NIL {
            prev[n] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        let (p, n) = (prev[node], next[node]);
        next[p] = node;
        if n != NIL {
            prev[n] = node;
        }
    };

    let words = count.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut context = M::Context::default();
    let mut state = model.init();
    let mut cache: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    // (call node, state before, alternative taken).
    let mut stack: Vec<(usize, M::State, usize)> = Vec::new();
    let mut alternatives: Vec<M::State> = Vec::new();
    let mut node = next[0];
    let mut first_alternative = 0usize;
    loop {
        if next[0] == NIL {
            return Search::Linearizable;
        }
        *steps += 1;
        if *steps > step_budget || cache.len() > CACHE_ENTRIES_MAX || cancel.load(Ordering::Relaxed)
        {
            return Search::Exhausted;
        }
        let is_call = node != NIL && !entry(node).1;
        if is_call {
            let index = entry(node).2;
            let operation = &operations[index];
            alternatives.clear();
            model.step(&mut context, &state, &operation.input, &mut alternatives);
            if operation.unknown && !alternatives.contains(&state) {
                alternatives.push(state.clone());
            }
            let mut lifted = false;
            for (alternative, candidate) in alternatives.iter().enumerate().skip(first_alternative)
            {
                let mut set = linearized.clone();
                set[index / 64] |= 1 << (index % 64);
                if cache.insert((set.clone(), candidate.clone())) {
                    stack.push((
                        node,
                        std::mem::replace(&mut state, candidate.clone()),
                        alternative,
                    ));
                    linearized = set;
                    unlink(&mut next, &mut prev, node);
                    unlink(&mut next, &mut prev, return_node[index]);
                    lifted = true;
                    break;
                }
            }
            first_alternative = 0;
            node = if lifted { next[0] } else { next[node] };
        } else {
            // A return reached (or the end): the operation it closes was not
            // linearized in time. Undo the last choice and try the next one.
            if node != NIL {
                *furthest = (*furthest).max(entry(node).0);
            }
            let Some((call, before, alternative)) = stack.pop() else {
                return Search::NotLinearizable;
            };
            let index = entry(call).2;
            linearized[index / 64] &= !(1 << (index % 64));
            state = before;
            relink(&mut next, &mut prev, return_node[index]);
            relink(&mut next, &mut prev, call);
            node = call;
            first_alternative = alternative + 1;
        }
    }
}

/// Checks one key; for a non-linearizable key, finds the shortest failing
/// prefix. `cancel` is set when this key fails (if the settings say so) and
/// stops this key's search when another key set it.
pub fn check_key<M: Model>(
    model: &M,
    key: &str,
    operations: &[Operation],
    settings: Settings,
    cancel: &AtomicBool,
) -> Result<KeyResult, Error> {
    let prepared = prepare(model, operations, usize::MAX)?;
    let mut steps = 0;
    let mut furthest = 0;
    let outcome = search(
        model,
        &prepared,
        settings.step_budget,
        cancel,
        &mut steps,
        &mut furthest,
    );
    let verdict = match outcome {
        Search::Linearizable => Verdict::Linearizable,
        Search::NotLinearizable => Verdict::NotLinearizable,
        Search::Exhausted => Verdict::Unknown,
    };
    let cancelled = outcome == Search::Exhausted
        && steps <= settings.step_budget
        && cancel.load(Ordering::Relaxed);
    let failure = if verdict == Verdict::NotLinearizable {
        if settings.stop_at_first_failure {
            cancel.store(true, Ordering::Relaxed);
        }
        // Probes get a few times the steps the whole key needed.
        let probe_budget = settings
            .step_budget
            .min(steps.saturating_mul(4).saturating_add(100_000));
        Some(shortest_failing_prefix(
            model,
            operations,
            probe_budget,
            furthest,
        )?)
    } else {
        None
    };
    Ok(KeyResult {
        key: key.to_string(),
        verdict,
        operations: prepared.len(),
        steps,
        cancelled,
        failure,
    })
}

/// Binary search for the shortest non-linearizable prefix (a prefix of a
/// linearizable history is linearizable, so failing is monotone in the cut),
/// up to the furthest completion the full search got stuck at. If a probe
/// runs out of budget, the prefix reported ends at that completion.
fn shortest_failing_prefix<M: Model>(
    model: &M,
    operations: &[Operation],
    probe_budget: u64,
    furthest: usize,
) -> Result<Failure, Error> {
    let never = AtomicBool::new(false);
    let probe = |cut: usize| -> Result<Search, Error> {
        let prepared = prepare(model, operations, cut)?;
        let (mut steps, mut ignored) = (0, 0);
        Ok(search(
            model,
            &prepared,
            probe_budget,
            &never,
            &mut steps,
            &mut ignored,
        ))
    };
    let mut cuts: Vec<usize> = operations
        .iter()
        .flat_map(|o| [Some(o.invoke_position), o.complete_position])
        .flatten()
        .map(|position| position + 1)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let whole = cuts.len().saturating_sub(1);
    // Invariant: cuts[high] fails; cuts[low - 1] (if any) passes.
    let mut high = cuts.partition_point(|&cut| cut <= furthest + 1).min(whole);
    if probe(cuts[high])? != Search::NotLinearizable {
        high = whole;
    }
    let mut low = 0usize;
    while low < high {
        let middle = low + (high - low) / 2;
        match probe(cuts[middle])? {
            Search::NotLinearizable => high = middle,
            Search::Linearizable => low = middle + 1,
            Search::Exhausted => break,
        }
    }
    let cut = cuts[high];
    let last_position = cut - 1;
    let failing = operations
        .iter()
        .find(|o| o.complete_position == Some(last_position) || o.invoke_position == last_position)
        .unwrap_or(&operations[0]);
    let mut involved: Vec<&Operation> = operations
        .iter()
        .filter(|o| {
            o.id != failing.id
                && o.invoke_position < cut
                && o.complete_position
                    .is_none_or(|done| done > failing.invoke_position)
        })
        .collect();
    let mut before: Vec<&Operation> = operations
        .iter()
        .filter(|o| {
            o.complete_position
                .is_some_and(|done| done < failing.invoke_position)
        })
        .collect();
    before.sort_by_key(|o| o.complete_position);
    let context = before.len().saturating_sub(REPORT_CONTEXT_OPERATIONS);
    involved.extend(&before[context..]);
    involved.sort_by_key(|o| o.invoke_position);
    involved.truncate(REPORT_OPERATIONS_MAX);
    Ok(Failure {
        prefix_events: cut,
        failing: failing.describe(),
        involved: involved.iter().map(|o| o.describe()).collect(),
    })
}
