//! Result tables, rendered as Markdown (what the BENCHMARKS.md files hold),
//! and the count format they use. The load report renders into one; so do
//! kvbench's storage and comparison tables (kvbench's `report` re-exports
//! these next to its own number formats).

use std::fmt::Write as _;

/// One table of results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// Heading line above the table.
    pub title: String,
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows, one cell per header.
    pub rows: Vec<Vec<String>>,
    /// Notes printed under the table.
    pub notes: Vec<String>,
}

impl Table {
    /// An empty table with these headers.
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            ..Table::default()
        }
    }

    /// Adds a row (padded or cut to the number of headers).
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// Adds a note line.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Markdown: a `####` title, the table, then the notes.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "#### {}\n", self.title);
        let _ = writeln!(out, "| {} |", self.headers.join(" | "));
        let _ = writeln!(out, "|{}", " --- |".repeat(self.headers.len()));
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                let _ = writeln!(out, "{note}");
            }
        }
        out
    }
}

/// A count with thin thousands separators: `1 234 567`.
pub fn count(value: f64) -> String {
    if !value.is_finite() {
        return "n/a".to_string();
    }
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    if value < -0.5 { format!("-{out}") } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(count(1_234_567.4), "1 234 567");
        assert_eq!(count(999.0), "999");
        assert_eq!(count(-1000.0), "-1 000");
    }

    #[test]
    fn markdown_table() {
        let mut table = Table::new("reads", &["engine", "ops/s"]);
        table.row(vec!["bitcask".into(), "10".into()]);
        table.row(vec!["redb".into()]);
        table.note("note");
        assert_eq!(
            table.to_markdown(),
            "#### reads\n\n| engine | ops/s |\n| --- | --- |\n| bitcask | 10 |\n| redb |  |\n\nnote\n"
        );
    }
}
