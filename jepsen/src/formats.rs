//! Foreign history formats: readers for Jepsen's log lines (the jepsen-etcd
//! `.log` files of `../shared/testdata/`) and for EDN operation maps (the kv
//! `.txt` files), the export of our histories as Jepsen log lines, and the
//! detection of a file's format.
//!
//! The EDN reader is a small hand parser for the subset those files use:
//! maps, vectors, keywords, strings (with `\"`, `\\`, `\n`, `\t` escapes),
//! integers and `nil`.

use std::fmt::Write as _;

use crate::Error;
use crate::history::{Event, EventType, Function};

/// The marker before the process number on a Jepsen log line.
const JEPSEN_LOG_MARKER: &str = "jepsen.util - ";

/// The deepest nesting of EDN collections the reader follows (the formats
/// nest two levels; this bounds the recursion on a corrupt file).
pub const EDN_DEPTH_MAX: usize = 16;

/// A history file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Our JSON lines (one [`Event`] per line).
    Json,
    /// Jepsen log lines (`INFO  jepsen.util - 3\t:invoke\t:cas\t[1 2]`).
    JepsenLog,
    /// EDN operation maps, one per line (`{:process 0, :type :invoke, ...}`).
    Edn,
}

/// Guesses the format from the first non-blank line (an empty file reads as
/// an empty JSON-lines history).
pub fn detect(text: &str) -> Format {
    let first = text.lines().map(str::trim).find(|line| !line.is_empty());
    match first {
        Some(line) if line.starts_with("{:") => Format::Edn,
        Some(line) if line.contains(JEPSEN_LOG_MARKER) => Format::JepsenLog,
        _ => Format::Json,
    }
}

/// Reads a history in the given format.
pub fn read(text: &str, format: Format) -> Result<Vec<Event>, Error> {
    match format {
        Format::Json => crate::history::read_json_lines(text.as_bytes()),
        Format::JepsenLog => read_jepsen_log(text),
        Format::Edn => read_edn(text),
    }
}

/// An EDN value of the subset the formats use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edn {
    /// `nil`.
    Nil,
    /// An integer, kept as written.
    Integer(String),
    /// A string, unescaped.
    Str(String),
    /// A keyword, without the colon.
    Keyword(String),
    /// `[a b ...]`.
    Vector(Vec<Edn>),
    /// `{k v, ...}`, in file order.
    Map(Vec<(Edn, Edn)>),
}

impl Edn {
    /// The scalar as a register value: `nil` is `None`; an integer, string or
    /// keyword is its text.
    fn scalar(&self) -> Result<Option<String>, String> {
        match self {
            Edn::Nil => Ok(None),
            Edn::Integer(text) | Edn::Str(text) | Edn::Keyword(text) => Ok(Some(text.clone())),
            other => Err(format!("expected a scalar value, found {other:?}")),
        }
    }
}

/// Parses one EDN value from the whole of `text` (trailing blanks allowed).
pub fn parse_edn(text: &str) -> Result<Edn, String> {
    let mut parser = EdnParser {
        bytes: text.as_bytes(),
        text,
        position: 0,
    };
    let value = parser.value(0)?;
    parser.skip_blank();
    if parser.position != parser.bytes.len() {
        return Err(format!("trailing text at byte {}", parser.position));
    }
    Ok(value)
}

struct EdnParser<'a> {
    bytes: &'a [u8],
    text: &'a str,
    position: usize,
}

impl EdnParser<'_> {
    fn skip_blank(&mut self) {
        // Commas are whitespace in EDN.
        while self
            .bytes
            .get(self.position)
            .is_some_and(|&b| b.is_ascii_whitespace() || b == b',')
        {
            self.position += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Result<Edn, String> {
        if depth > EDN_DEPTH_MAX {
            return Err(format!(
                "nesting deeper than EDN_DEPTH_MAX = {EDN_DEPTH_MAX}"
            ));
        }
        self.skip_blank();
        let Some(&first) = self.bytes.get(self.position) else {
            return Err("unexpected end of text".to_string());
        };
        match first {
            b'[' => {
                self.position += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_blank();
                    match self.bytes.get(self.position) {
                        Some(b']') => {
                            self.position += 1;
                            return Ok(Edn::Vector(items));
                        }
                        Some(_) => items.push(self.value(depth + 1)?),
                        None => return Err("unclosed vector".to_string()),
                    }
                }
            }
            b'{' => {
                self.position += 1;
                let mut entries = Vec::new();
                loop {
                    self.skip_blank();
                    match self.bytes.get(self.position) {
                        Some(b'}') => {
                            self.position += 1;
                            return Ok(Edn::Map(entries));
                        }
                        Some(_) => {
                            let key = self.value(depth + 1)?;
                            let value = self.value(depth + 1)?;
                            entries.push((key, value));
                        }
                        None => return Err("unclosed map".to_string()),
                    }
                }
            }
            b'"' => {
                self.position += 1;
                let mut out = String::new();
                let mut chars = self.text[self.position..].char_indices();
                loop {
                    let Some((offset, c)) = chars.next() else {
                        return Err("unclosed string".to_string());
                    };
                    match c {
                        '"' => {
                            self.position += offset + 1;
                            return Ok(Edn::Str(out));
                        }
                        '\\' => match chars.next() {
                            Some((_, 'n')) => out.push('\n'),
                            Some((_, 't')) => out.push('\t'),
                            Some((_, other)) => out.push(other),
                            None => return Err("unclosed string".to_string()),
                        },
                        other => out.push(other),
                    }
                }
            }
            _ => {
                let start = self.position;
                while self.bytes.get(self.position).is_some_and(|&b| {
                    !(b.is_ascii_whitespace() || matches!(b, b',' | b']' | b'}' | b'[' | b'{'))
                }) {
                    self.position += 1;
                }
                let token = &self.text[start..self.position];
                if token == "nil" {
                    Ok(Edn::Nil)
                } else if let Some(name) = token.strip_prefix(':') {
                    Ok(Edn::Keyword(name.to_string()))
                } else if token.parse::<i64>().is_ok() {
                    Ok(Edn::Integer(token.to_string()))
                } else {
                    Err(format!("unsupported token {token:?} at byte {start}"))
                }
            }
        }
    }
}

fn event_type(name: &str) -> Result<EventType, String> {
    match name {
        "invoke" => Ok(EventType::Invoke),
        "ok" => Ok(EventType::Ok),
        "fail" => Ok(EventType::Fail),
        "info" => Ok(EventType::Info),
        other => Err(format!("unknown event type :{other}")),
    }
}

fn function(name: &str) -> Result<Function, String> {
    match name {
        "read" => Ok(Function::Read),
        "write" => Ok(Function::Write),
        "cas" => Ok(Function::Cas),
        "get" => Ok(Function::Get),
        "put" => Ok(Function::Put),
        "append" => Ok(Function::Append),
        "add" => Ok(Function::Add),
        other => Err(format!("unknown function :{other}")),
    }
}

fn function_name(f: Function) -> &'static str {
    match f {
        Function::Read => "read",
        Function::Write => "write",
        Function::Cas => "cas",
        Function::Get => "get",
        Function::Put => "put",
        Function::Append => "append",
        Function::Add => "add",
    }
}

fn type_name(event_type: EventType) -> &'static str {
    match event_type {
        EventType::Invoke => "invoke",
        EventType::Ok => "ok",
        EventType::Fail => "fail",
        EventType::Info => "info",
    }
}

/// Reads Jepsen log lines. Lines without the `jepsen.util - ` marker or whose
/// process is not a number (nemesis, setup) are ignored.
pub fn read_jepsen_log(text: &str) -> Result<Vec<Event>, Error> {
    let mut events = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let Some(at) = line.find(JEPSEN_LOG_MARKER) else {
            continue;
        };
        let rest = &line[at + JEPSEN_LOG_MARKER.len()..];
        let fields: Vec<&str> = rest.splitn(4, '\t').collect();
        let Ok(process) = fields[0].trim().parse::<u64>() else {
            continue;
        };
        let parsed = (|| -> Result<Event, String> {
            if fields.len() < 3 {
                return Err("expected process, type, function and value".to_string());
            }
            let type_name = fields[1]
                .trim()
                .strip_prefix(':')
                .ok_or("type is not a keyword")?;
            let f_name = fields[2]
                .trim()
                .strip_prefix(':')
                .ok_or("function is not a keyword")?;
            let value = parse_edn(fields.get(3).copied().unwrap_or("nil"))?;
            let mut event = Event::new(process, event_type(type_name)?, function(f_name)?, "");
            fill_value(&mut event, value)?;
            Ok(event)
        })();
        events.push(parsed.map_err(|reason| Error::Parse {
            line: number + 1,
            reason,
        })?);
    }
    Ok(events)
}

/// Puts a Jepsen value into an event: `[from to]` of a cas, a keyword
/// (`:timed-out`) as the error, anything else as the value.
fn fill_value(event: &mut Event, value: Edn) -> Result<(), String> {
    match (event.f, value) {
        (_, Edn::Keyword(reason)) if event.event_type != EventType::Invoke => {
            event.error = Some(reason);
        }
        (Function::Cas, Edn::Vector(pair)) if pair.len() == 2 => {
            event.expected = pair[0].scalar()?;
            event.value = pair[1].scalar()?;
        }
        (_, Edn::Vector(items)) => {
            let values: Result<Vec<Option<String>>, String> =
                items.iter().map(Edn::scalar).collect();
            event.values = Some(values?.into_iter().flatten().collect());
        }
        (_, other) => event.value = other.scalar()?,
    }
    Ok(())
}

/// Reads EDN operation maps, one per line (keys `:process`, `:type`, `:f`,
/// `:key`, `:value`; other keys ignored).
pub fn read_edn(text: &str) -> Result<Vec<Event>, Error> {
    let mut events = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = (|| -> Result<Event, String> {
            let Edn::Map(entries) = parse_edn(line)? else {
                return Err("expected a map".to_string());
            };
            let mut process = None;
            let mut event_type_found = None;
            let mut f = None;
            let mut key = String::new();
            let mut value = Edn::Nil;
            for (name, field) in entries {
                let Edn::Keyword(name) = name else {
                    return Err("map key is not a keyword".to_string());
                };
                match (name.as_str(), field) {
                    ("process", Edn::Integer(n)) => {
                        process = Some(n.parse::<u64>().map_err(|e| format!(":process: {e}"))?);
                    }
                    ("type", Edn::Keyword(t)) => event_type_found = Some(event_type(&t)?),
                    ("f", Edn::Keyword(name)) => f = Some(function(&name)?),
                    ("key", k) => key = k.scalar()?.unwrap_or_default(),
                    ("value", v) => value = v,
                    (field @ ("process" | "type" | "f"), other) => {
                        return Err(format!(":{field} has unexpected value {other:?}"));
                    }
                    _ => {}
                }
            }
            let mut event = Event::new(
                process.ok_or("missing :process")?,
                event_type_found.ok_or("missing :type")?,
                f.ok_or("missing :f")?,
                &key,
            );
            fill_value(&mut event, value)?;
            Ok(event)
        })();
        events.push(parsed.map_err(|reason| Error::Parse {
            line: number + 1,
            reason,
        })?);
    }
    Ok(events)
}

/// An EDN rendering of a value: `nil`, a bare integer, or a quoted string.
fn edn_scalar(value: Option<&str>) -> String {
    match value {
        None => "nil".to_string(),
        Some(text) if text.parse::<i64>().is_ok() => text.to_string(),
        Some(text) => {
            let mut out = String::with_capacity(text.len() + 2);
            out.push('"');
            for c in text.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\t' => out.push_str("\\t"),
                    other => out.push(other),
                }
            }
            out.push('"');
            out
        }
    }
}

/// Exports a history as Jepsen log lines, the format of
/// `../shared/testdata/jepsen-etcd/`. The value column is `[from to]` for a
/// cas-register cas, `:reason` for an error, the set's elements as a vector,
/// else the value; on a keyed history it is wrapped as `[key value]` (Jepsen's
/// independent-key tuples). Versions, indexes and times are not part of
/// that format and are left out.
pub fn export_jepsen_log(events: &[Event]) -> String {
    let mut out = String::new();
    for event in events {
        let value = if let Some(reason) = &event.error {
            format!(":{reason}")
        } else if let Some(values) = &event.values {
            let items: Vec<String> = values.iter().map(|v| edn_scalar(Some(v))).collect();
            format!("[{}]", items.join(" "))
        } else if event.f == Function::Cas && event.expected.is_some() {
            format!(
                "[{} {}]",
                edn_scalar(event.expected.as_deref()),
                edn_scalar(event.value.as_deref())
            )
        } else {
            edn_scalar(event.value.as_deref())
        };
        let value = if event.key.is_empty() {
            value
        } else {
            format!("[{} {value}]", edn_scalar(Some(&event.key)))
        };
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "INFO  jepsen.util - {}\t:{}\t:{}\t{value}",
            event.process,
            type_name(event.event_type),
            function_name(event.f)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_subset() {
        let value = parse_edn(r#"{:process 0, :type :ok, :f :get, :key "5", :value "a \"b\""}"#)
            .expect("parses");
        let Edn::Map(entries) = value else {
            panic!("not a map")
        };
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[4].1, Edn::Str("a \"b\"".to_string()));
        assert_eq!(
            parse_edn("[1 nil]"),
            Ok(Edn::Vector(vec![Edn::Integer("1".into()), Edn::Nil]))
        );
        assert!(parse_edn("[1 2").is_err());
        assert!(parse_edn("{:a").is_err());
        assert!(parse_edn("foo").is_err());
        assert!(parse_edn(&"[".repeat(EDN_DEPTH_MAX + 2)).is_err());
    }

    #[test]
    fn jepsen_log_round_trips() {
        let text = "INFO  jepsen.util - 3\t:invoke\t:cas\t[1 2]\n\
                    INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n\
                    INFO  jepsen.util - 3\t:fail\t:cas\t[1 2]\n\
                    INFO  jepsen.util - 4\t:invoke\t:read\tnil\n\
                    INFO  jepsen.util - 4\t:fail\t:read\t:timed-out\n";
        let events = read_jepsen_log(text).expect("reads");
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].expected.as_deref(), Some("1"));
        assert_eq!(events[0].value.as_deref(), Some("2"));
        assert_eq!(events[3].error.as_deref(), Some("timed-out"));
        let again = read_jepsen_log(&export_jepsen_log(&events)).expect("reads export");
        assert_eq!(events, again);
        assert_eq!(detect(text), Format::JepsenLog);
    }
}
