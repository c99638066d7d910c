//! Output: binary-safe renderings of keys and values (escaped text, hex,
//! base64 in JSON), aligned tables, JSON objects, and colours (only on a
//! terminal, and never with `NO_COLOR` set).

use std::io::{IsTerminal, Write};

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::cli::Format;
use crate::exit::Failure;

/// How a command prints.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    /// Table or JSON.
    pub format: Format,
    /// Keys and values as hex in table output.
    pub hex: bool,
    /// Whether standard output is a terminal.
    pub stdout_terminal: bool,
    /// Colours on standard output.
    pub color_stdout: bool,
    /// Colours on standard error.
    pub color_stderr: bool,
}

/// ANSI styles used (only when colours are on).
#[derive(Debug, Clone, Copy)]
pub enum Style {
    /// Bold green: the leader, success.
    Good,
    /// Bold red: errors.
    Bad,
    /// Dim: absent fields.
    Dim,
    /// Bold: headers.
    Bold,
}

impl Style {
    fn code(self) -> &'static str {
        match self {
            Style::Good => "\x1b[1;32m",
            Style::Bad => "\x1b[1;31m",
            Style::Dim => "\x1b[2m",
            Style::Bold => "\x1b[1m",
        }
    }
}

fn colours_allowed() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

impl Printer {
    /// A printer for this format that looks at the real standard streams.
    pub fn new(format: Format, hex: bool) -> Printer {
        let stdout_terminal = std::io::stdout().is_terminal();
        Printer {
            format,
            hex,
            stdout_terminal,
            color_stdout: stdout_terminal && colours_allowed(),
            color_stderr: std::io::stderr().is_terminal() && colours_allowed(),
        }
    }

    /// Whether output is JSON.
    pub fn json(&self) -> bool {
        self.format == Format::Json
    }

    /// `text` in `style` on standard output (plain without colours).
    pub fn paint(&self, style: Style, text: &str) -> String {
        paint(self.color_stdout, style, text)
    }

    /// Key or value bytes for a table: hex with `--hex`, else UTF-8 with
    /// non-printable bytes escaped as `\xNN` (and `\` as `\\`).
    pub fn bytes(&self, bytes: &[u8]) -> String {
        if self.hex { hex(bytes) } else { escape(bytes) }
    }

    /// Prints one JSON object (a line) on standard output.
    pub fn print_json(&self, value: &Value) {
        println!("{value}");
    }

    /// Prints a failure: the message on standard error, and with `-o json`
    /// also an `{"error": ...}` object on standard output.
    pub fn print_failure(&self, failure: &Failure) {
        eprintln!(
            "{} {}",
            paint(self.color_stderr, Style::Bad, "Error:"),
            failure.message
        );
        if self.json() && !failure.json_printed {
            let error = serde_json::json!({
                "error": {
                    "exit_code": failure.exit.code(),
                    "kind": failure.exit.kind(),
                    "message": failure.message,
                }
            });
            self.print_json(&error);
        }
    }

    /// Prints raw bytes on standard output (a newline after them only on a
    /// terminal, so redirected output is exactly the bytes).
    pub fn print_raw(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        if self.stdout_terminal {
            out.write_all(b"\n")?;
        }
        out.flush()
    }

    /// Prints keys as etcdctl's simple output does: the key on a line,
    /// then the value on a line (an empty one with keys only), bytes as
    /// they are (hex with `--hex`).
    pub fn print_kvs(&self, kvs: &[kvclient::KeyValue]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        for kv in kvs {
            for bytes in [&kv.key, &kv.value] {
                if self.hex {
                    out.write_all(hex(bytes).as_bytes())?;
                } else {
                    out.write_all(bytes)?;
                }
                out.write_all(b"\n")?;
            }
        }
        out.flush()
    }

    /// Prints an aligned table (headers in bold on a terminal).
    pub fn print_table(&self, headers: &[&str], rows: &[Vec<String>]) {
        print!("{}", self.render_table(headers, rows));
    }

    /// An aligned table: columns separated by two spaces.
    pub fn render_table(&self, headers: &[&str], rows: &[Vec<String>]) -> String {
        let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
        for row in rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(visible_width(cell));
                }
            }
        }
        let mut out = String::new();
        let line = |cells: Vec<String>, out: &mut String| {
            let last = cells.len().saturating_sub(1);
            for (i, cell) in cells.into_iter().enumerate() {
                out.push_str(&cell);
                if i < last {
                    let pad = widths[i].saturating_sub(visible_width(&cell)) + 2;
                    out.push_str(&" ".repeat(pad));
                }
            }
            out.push('\n');
        };
        line(
            headers
                .iter()
                .map(|h| self.paint(Style::Bold, &h.to_uppercase()))
                .collect(),
            &mut out,
        );
        for row in rows {
            line(row.clone(), &mut out);
        }
        out
    }
}

/// `text` wrapped in `style` when `on`.
pub fn paint(on: bool, style: Style, text: &str) -> String {
    if on {
        format!("{}{text}\x1b[0m", style.code())
    } else {
        text.to_string()
    }
}

/// Width of a cell without its ANSI escapes.
fn visible_width(text: &str) -> usize {
    let mut width = 0;
    let mut in_escape = false;
    for c in text.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, _) => width += 1,
        }
    }
    width
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// UTF-8 text with control characters, invalid bytes and `\` escaped.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buffer = [0; 4];
                    for b in c.encode_utf8(&mut buffer).bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Adds `name_base64` (always) and `name` (when UTF-8) for `bytes`.
pub fn insert_bytes(object: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        object.insert(name.to_string(), Value::String(text.to_string()));
    }
    object.insert(
        format!("{name}_base64"),
        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
    );
}

/// Adds a key's `create_revision`, `mod_revision`, `version` and `lease`
/// under etcd's names.
pub fn insert_revisions(object: &mut Map<String, Value>, revisions: &kvclient::Revisions) {
    object.insert("create_revision".into(), revisions.create_revision.into());
    object.insert("mod_revision".into(), revisions.mod_revision.into());
    object.insert("version".into(), revisions.version.into());
    object.insert("lease".into(), revisions.lease.into());
}

/// A key of a range or transaction answer as JSON: key and value (with
/// their base64) and the key's revisions under etcd's names.
pub fn kv_json(kv: &kvclient::KeyValue) -> Value {
    let mut object = Map::new();
    insert_bytes(&mut object, "key", &kv.key);
    insert_bytes(&mut object, "value", &kv.value);
    insert_revisions(&mut object, &kv.revisions);
    Value::Object(object)
}

/// A duration in ms for JSON (`null` for none).
pub fn millis(duration: Option<std::time::Duration>) -> Value {
    duration.map_or(Value::Null, |d| {
        Value::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

/// A TTL for a table: `-` for none, else seconds with ms precision.
pub fn ttl_text(duration: Option<std::time::Duration>) -> String {
    duration.map_or_else(|| "-".to_string(), |d| format!("{:.3}s", d.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_render_safely() {
        assert_eq!(escape(b"plain text"), "plain text");
        assert_eq!(escape(b"a\nb\\c\x00\xff"), "a\\x0ab\\\\c\\x00\\xff");
        assert_eq!(escape("é".as_bytes()), "é");
        assert_eq!(hex(b"\x00\xffA"), "00ff41");
        let mut object = Map::new();
        insert_bytes(&mut object, "value", b"\xff\x00");
        assert!(!object.contains_key("value"));
        assert_eq!(object["value_base64"], "/wA=");
        insert_bytes(&mut object, "key", b"k");
        assert_eq!(object["key"], "k");
        assert_eq!(object["key_base64"], "aw==");
    }

    #[test]
    fn tables_align_without_counting_colours() {
        let printer = Printer {
            format: Format::Table,
            hex: false,
            stdout_terminal: false,
            color_stdout: false,
            color_stderr: false,
        };
        let coloured = paint(true, Style::Good, "1*");
        let text = printer.render_table(
            &["id", "role"],
            &[
                vec![coloured, "leader".into()],
                vec!["22".into(), "follower".into()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ID  ROLE");
        assert!(lines[1].ends_with("  leader") && lines[1].contains("1*\x1b[0m  "));
        assert_eq!(lines[2], "22  follower");
    }
}
