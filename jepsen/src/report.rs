//! A run's report beyond the checker's verdict: the summary table (ops
//! invoked / ok / failed / unknown, faults injected, anomalies by kind,
//! acknowledged writes lost) appended to `summary.txt`, and `latency.svg`:
//! every operation as a point (x = invoke time on the run's monotonic
//! clock, y = latency on a log scale; colour = outcome, shape = function)
//! over shaded fault windows (from the nemesis start / stop records).
//!
//! The checker's report is read as JSON (`checker.json`), so one table
//! serves every checker: the register / set checkers' `anomalies`,
//! `linearizability`, `lost_writes`, `sets` and `revisions`, and the TTL
//! checker's `anomalies_by_kind`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use crate::workload::{Function, Op, Outcome, Phase, Record};

/// Size of the latency picture in pixels (width, height).
pub const PLOT_SIZE_PIXELS: (u32, u32) = (1200, 600);
/// Points drawn at most: beyond it, ok operations are thinned evenly (every
/// failed and unknown one is kept), so a 10-minute run stays a few MB.
pub const POINTS_MAX: usize = 20_000;
/// Lowest latency on the log axis, in ms (faster operations sit on it).
const LATENCY_FLOOR_MS: f64 = 0.1;
/// The file name of the picture in the run directory.
pub const LATENCY_SVG: &str = "latency.svg";

/// Counts of the summary table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Operations invoked.
    pub invoked: usize,
    /// Operations ok.
    pub ok: usize,
    /// Operations failed (did not take effect).
    pub failed: usize,
    /// Operations of unknown outcome.
    pub unknown: usize,
    /// Faults injected, by fault name.
    pub faults: BTreeMap<String, usize>,
    /// Anomalies the checker found, by kind.
    pub anomalies: BTreeMap<String, usize>,
    /// Acknowledged writes missing at the end.
    pub lost_writes: usize,
}

impl Table {
    /// The table from a run's records and its checker's JSON report.
    pub fn new(records: &[Record], checker: &Value) -> Self {
        let mut table = Self::default();
        for record in records {
            match record {
                Record::Op(op) => {
                    table.invoked += 1;
                    match op.outcome {
                        Outcome::Ok => table.ok += 1,
                        Outcome::Fail => table.failed += 1,
                        Outcome::Info => table.unknown += 1,
                    }
                }
                Record::Nemesis(event) if event.phase == Phase::Start => {
                    *table.faults.entry(event.fault.clone()).or_default() += 1;
                }
                Record::Nemesis(_) => {}
            }
        }
        table.read_checker(checker);
        table
    }

    fn add_anomaly(&mut self, kind: &str, count: usize) {
        if count > 0 {
            *self.anomalies.entry(kind.to_string()).or_default() += count;
        }
    }

    fn read_checker(&mut self, checker: &Value) {
        let len = |v: &Value| v.as_array().map_or(0, Vec::len);
        for anomaly in checker["anomalies"].as_array().into_iter().flatten() {
            // Index checks name a `kind` string; the TTL checker's listed
            // anomalies are counted through `anomalies_by_kind` instead.
            if checker.get("anomalies_by_kind").is_none()
                && let Some(kind) = anomaly["kind"].as_str()
            {
                self.add_anomaly(kind, 1);
            }
        }
        let not_linearizable = checker["linearizability"]["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|key| key["verdict"] == "not-linearizable")
            .count();
        self.add_anomaly("not-linearizable-key", not_linearizable);
        let lost = len(&checker["lost_writes"]["lost"]);
        self.add_anomaly("lost-write", lost);
        self.lost_writes += lost;
        for set in checker["sets"].as_array().into_iter().flatten() {
            let lost = len(&set["lost"]);
            self.add_anomaly("set-lost", lost);
            self.lost_writes += lost;
            self.add_anomaly("set-unexpected", len(&set["unexpected"]));
        }
        if let Some(kinds) = checker["anomalies_by_kind"].as_object() {
            for (kind, count) in kinds {
                self.add_anomaly(kind, count.as_u64().unwrap_or(0) as usize);
            }
        }
        // The revision checks count every kind (zeros too) and keep only
        // the first examples, so the counts are read, not the examples.
        if let Some(kinds) = checker["revisions"]["anomalies_by_kind"].as_object() {
            for (kind, count) in kinds {
                self.add_anomaly(kind, count.as_u64().unwrap_or(0) as usize);
            }
        }
    }

    /// The table as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "\nsummary table:");
        let _ = writeln!(
            out,
            "  ops invoked / ok / failed / unknown:  {} / {} / {} / {}",
            self.invoked, self.ok, self.failed, self.unknown
        );
        let joined = |map: &BTreeMap<String, usize>| {
            if map.is_empty() {
                "none".to_string()
            } else {
                map.iter()
                    .map(|(name, n)| format!("{name} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let _ = writeln!(
            out,
            "  faults injected:                      {} ({})",
            self.faults.values().sum::<usize>(),
            joined(&self.faults)
        );
        let _ = writeln!(
            out,
            "  anomalies by kind:                    {} ({})",
            self.anomalies.values().sum::<usize>(),
            joined(&self.anomalies)
        );
        let _ = writeln!(
            out,
            "  acknowledged writes lost:             {}",
            self.lost_writes
        );
        out
    }
}

/// Writes `latency.svg` into `dir` and returns the summary table's text.
pub fn write(dir: &Path, records: &[Record], checker: &Value) -> anyhow::Result<String> {
    let path = dir.join(LATENCY_SVG);
    write_latency_svg(&path, records)
        .map_err(|err| anyhow::anyhow!("drawing {}: {err}", path.display()))?;
    Ok(Table::new(records, checker).text())
}

/// Fault windows `(fault, start s, stop s)`; one never stopped ends at
/// `end_s`.
pub fn fault_windows(records: &[Record], end_s: f64) -> Vec<(String, f64, f64)> {
    let mut open: BTreeMap<&str, f64> = BTreeMap::new();
    let mut windows = Vec::new();
    for record in records {
        if let Record::Nemesis(event) = record {
            let at = event.time_ns as f64 / 1e9;
            match event.phase {
                Phase::Start => {
                    open.insert(event.fault.as_str(), at);
                }
                Phase::Stop => {
                    if let Some(start) = open.remove(event.fault.as_str()) {
                        windows.push((event.fault.clone(), start, at));
                    }
                }
            }
        }
    }
    for (fault, start) in open {
        windows.push((fault.to_string(), start, end_s));
    }
    windows
}

fn outcome_colour(outcome: Outcome) -> RGBColor {
    match outcome {
        Outcome::Ok => RGBColor(30, 130, 60),
        Outcome::Fail => RGBColor(220, 40, 40),
        Outcome::Info => RGBColor(130, 60, 200),
    }
}

/// The operations to draw: all of them up to [`POINTS_MAX`], else every
/// non-ok one and an even sample of the ok ones.
fn sample(ops: &[&Op]) -> Vec<usize> {
    if ops.len() <= POINTS_MAX {
        return (0..ops.len()).collect();
    }
    let not_ok = ops.iter().filter(|op| op.outcome != Outcome::Ok).count();
    let room = POINTS_MAX.saturating_sub(not_ok).max(1);
    let ok_total = ops.len() - not_ok;
    let step = ok_total.div_ceil(room).max(1);
    let mut ok_seen = 0;
    (0..ops.len())
        .filter(|&i| {
            if ops[i].outcome != Outcome::Ok {
                return true;
            }
            ok_seen += 1;
            (ok_seen - 1) % step == 0
        })
        .collect()
}

/// Draws the latency picture.
pub fn write_latency_svg(
    path: &Path,
    records: &[Record],
) -> Result<(), Box<dyn std::error::Error>> {
    let ops: Vec<&Op> = records
        .iter()
        .filter_map(|r| match r {
            Record::Op(op) => Some(op),
            Record::Nemesis(_) => None,
        })
        .collect();
    let latency_ms =
        |op: &Op| (op.complete_ns.saturating_sub(op.invoke_ns) as f64 / 1e6).max(LATENCY_FLOOR_MS);
    let last_ns = records
        .iter()
        .map(|r| match r {
            Record::Op(op) => op.complete_ns,
            Record::Nemesis(event) => event.time_ns,
        })
        .max()
        .unwrap_or(0);
    let time_max = (last_ns as f64 / 1e9 * 1.02).max(1.0);
    let latency_max = ops.iter().map(|op| latency_ms(op)).fold(1.0f64, f64::max) * 2.0;
    let root = SVGBackend::new(path, PLOT_SIZE_PIXELS).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "latency over time ({} operations; shaded: faults)",
                ops.len()
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..time_max, (LATENCY_FLOOR_MS..latency_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("invoke time since the run started (s)")
        .y_desc("latency (ms, log)")
        .draw()?;
    let shade = RGBColor(255, 200, 120);
    for (fault, start, stop) in fault_windows(records, time_max) {
        chart.draw_series(std::iter::once(Rectangle::new(
            [(start, LATENCY_FLOOR_MS), (stop, latency_max)],
            shade.mix(0.35).filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            fault,
            (start, latency_max / 1.5),
            ("sans-serif", 12),
        )))?;
    }
    let drawn = sample(&ops);
    // One series per (function, outcome), so the legend names each.
    let mut groups: BTreeMap<(Function, Outcome), Vec<(f64, f64)>> = BTreeMap::new();
    for &i in &drawn {
        let op = ops[i];
        groups
            .entry((op.f, op.outcome))
            .or_default()
            .push((op.invoke_ns as f64 / 1e9, latency_ms(op)));
    }
    for ((f, outcome), points) in groups {
        let colour = outcome_colour(outcome);
        let label = format!(
            "{} {}",
            serde_json::to_value(f)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            match outcome {
                Outcome::Ok => "ok",
                Outcome::Fail => "fail",
                Outcome::Info => "unknown",
            }
        );
        let style = colour.filled();
        match f {
            Function::Read
            | Function::ReadAll
            | Function::WatchOpen
            | Function::Watch
            | Function::LeaseRead => {
                chart
                    .draw_series(points.into_iter().map(|p| Circle::new(p, 2, style)))?
                    .label(label)
                    .legend(move |(x, y)| Circle::new((x + 10, y), 3, style));
            }
            Function::Write
            | Function::Add
            | Function::Delete
            | Function::LeaseGrant
            | Function::LeaseKeepAlive
            | Function::LeaseRevoke => {
                chart
                    .draw_series(points.into_iter().map(|p| TriangleMarker::new(p, 3, style)))?
                    .label(label)
                    .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 4, style));
            }
            Function::Cas => {
                chart
                    .draw_series(points.into_iter().map(|p| Cross::new(p, 3, colour)))?
                    .label(label)
                    .legend(move |(x, y)| Cross::new((x + 10, y), 4, colour));
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::NemesisEvent;

    fn op(id: u64, f: Function, outcome: Outcome, at_ms: u64) -> Record {
        Record::Op(Op {
            id,
            process: id,
            f,
            key: "k".into(),
            value: None,
            expected_version: None,
            values: None,
            outcome,
            version: None,
            index: None,
            revision: None,
            mod_revision: None,
            expected_mod_revision: None,
            error: None,
            invoke_wall_us: at_ms * 1000,
            invoke_ns: at_ms * 1_000_000,
            complete_wall_us: at_ms * 1000 + 3000,
            complete_ns: at_ms * 1_000_000 + 3_000_000,
            ttl_ms: None,
            stale_min_index: None,
            member: None,
            versions: None,
            final_read: false,
            found: None,
            watch: None,
            lease: None,
            expected: None,
        })
    }

    fn fault(phase: Phase, at_ms: u64) -> Record {
        Record::Nemesis(NemesisEvent {
            fault: "kill".into(),
            phase,
            detail: String::new(),
            wall_us: at_ms * 1000,
            time_ns: at_ms * 1_000_000,
        })
    }

    #[test]
    fn the_table_counts_ops_faults_and_anomalies() {
        let records = vec![
            op(0, Function::Write, Outcome::Ok, 0),
            fault(Phase::Start, 5),
            op(1, Function::Read, Outcome::Fail, 10),
            op(2, Function::Cas, Outcome::Info, 20),
            fault(Phase::Stop, 30),
        ];
        let checker = serde_json::json!({
            "anomalies": [{"kind": "stale-read"}, {"kind": "stale-read"}],
            "linearizability": {"keys": [{"verdict": "not-linearizable"}, {"verdict": "linearizable"}]},
            "lost_writes": {"lost": [{"kind": "lost-write"}]},
            "revisions": {"anomalies_by_kind": {"revision-order": 3, "duplicate-revision": 0},
                          "examples": [{"kind": "revision-order"}]},
        });
        let table = Table::new(&records, &checker);
        assert_eq!(
            (table.invoked, table.ok, table.failed, table.unknown),
            (3, 1, 1, 1)
        );
        assert_eq!(table.faults.get("kill"), Some(&1));
        assert_eq!(table.anomalies.get("stale-read"), Some(&2));
        assert_eq!(table.anomalies.get("not-linearizable-key"), Some(&1));
        assert_eq!(table.anomalies.get("revision-order"), Some(&3));
        assert_eq!(table.anomalies.get("duplicate-revision"), None);
        assert_eq!(table.lost_writes, 1);
        let ttl = serde_json::json!({"anomalies": [{"kind": "resurrection"}], "anomalies_by_kind": {"resurrection": 1}});
        assert_eq!(
            Table::new(&records, &ttl).anomalies.get("resurrection"),
            Some(&1)
        );
        assert_eq!(
            fault_windows(&records, 9.0),
            vec![("kill".to_string(), 0.005, 0.03)]
        );
    }
}
