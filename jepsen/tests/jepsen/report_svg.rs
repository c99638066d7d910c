//! Proves the report's picture is a well-formed SVG with a point per
//! operation and a shaded window per fault, on a hand-built history (no
//! root needed); `svg_is_well_formed` is shared with the run tests.

use jepsen::report::{Table, write_latency_svg};
use jepsen::workload::{Function, NemesisEvent, Op, Outcome, Phase, Record};

/// Checks that `text` is one `<svg>` element whose tags all nest and close
/// (a small XML well-formedness check: no dependency needed for it).
pub fn svg_is_well_formed(text: &str) -> Result<(), String> {
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = text;
    let mut seen_root = false;
    while let Some(open) = rest.find('<') {
        let after = &rest[open + 1..];
        let close = after
            .find('>')
            .ok_or_else(|| format!("unclosed tag near {:?}", &after[..after.len().min(40)]))?;
        let tag = &after[..close];
        rest = &after[close + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let name = name.trim();
            match stack.pop() {
                Some(top) if top == name => {}
                other => return Err(format!("</{name}> closes {other:?}")),
            }
            continue;
        }
        let name = tag
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('/');
        if stack.is_empty() {
            if seen_root || name != "svg" {
                return Err(format!("top-level element <{name}>: expected one <svg>"));
            }
            seen_root = true;
        }
        if !tag.ends_with('/') {
            stack.push(name);
        }
    }
    if !seen_root {
        return Err("no <svg> element".into());
    }
    if !stack.is_empty() {
        return Err(format!("unclosed elements {stack:?}"));
    }
    Ok(())
}

fn op(id: u64, f: Function, outcome: Outcome, at_ms: u64, latency_ms: u64) -> Record {
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
        complete_wall_us: (at_ms + latency_ms) * 1000,
        complete_ns: (at_ms + latency_ms) * 1_000_000,
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
        fault: "partition-leader".into(),
        phase,
        detail: String::new(),
        wall_us: at_ms * 1000,
        time_ns: at_ms * 1_000_000,
    })
}

#[test]
fn the_latency_svg_is_well_formed_and_draws_every_op_and_fault() {
    let mut records = vec![fault(Phase::Start, 1000), fault(Phase::Stop, 4000)];
    for i in 0..60 {
        let (f, outcome) = match i % 4 {
            0 => (Function::Read, Outcome::Ok),
            1 => (Function::Write, Outcome::Info),
            2 => (Function::Cas, Outcome::Fail),
            _ => (Function::Add, Outcome::Ok),
        };
        records.push(op(i, f, outcome, i * 100, 1 + i % 7));
    }
    let dir = std::env::temp_dir().join(format!("jepsen-report-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("latency.svg");
    write_latency_svg(&path, &records).expect("drawn");
    let text = std::fs::read_to_string(&path).expect("written");
    svg_is_well_formed(&text).expect("well-formed SVG");
    // 30 circles (reads), 30 triangles/crosses; legend markers on top.
    assert!(text.matches("<circle").count() >= 15, "reads drawn");
    assert!(
        text.contains("partition-leader"),
        "the fault window is labelled"
    );
    assert!(svg_is_well_formed("<svg><g></svg>").is_err());
    assert!(svg_is_well_formed("<svg/><svg/>").is_err());
    let table = Table::new(&records, &serde_json::json!({}));
    assert_eq!(table.invoked, 60);
    assert_eq!(table.faults.get("partition-leader"), Some(&1));
    let _ = std::fs::remove_dir_all(&dir);
}
