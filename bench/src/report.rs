//! Result tables, rendered as Markdown (what BENCHMARKS.md holds), and the
//! number formats they use. [`Table`] and [`count`] are kvload's (the load
//! report renders into them too); the formats below are the storage
//! benchmarks' own.

pub use kvload::table::{Table, count};

/// `a / b` as `1.52×`, or `n/a` when either side is missing or zero.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => format!("{:.2}×", a / b),
        _ => "n/a".to_string(),
    }
}

/// Bytes in binary units: `812.3 MiB`.
pub fn bytes(value: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut scaled = value as f64;
    let mut unit = 0;
    while scaled >= 1024.0 && unit < UNITS.len() - 1 {
        scaled /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value} B")
    } else {
        format!("{scaled:.1} {}", UNITS[unit])
    }
}

/// Seconds with millisecond precision.
pub fn seconds(value: std::time::Duration) -> String {
    format!("{:.3} s", value.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), "1.50×");
        assert_eq!(ratio(Some(3.0), None), "n/a");
        assert_eq!(ratio(Some(3.0), Some(0.0)), "n/a");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
    }
}
