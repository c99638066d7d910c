//! The RESP wire format: requests in (multibulk arrays of bulk strings, or
//! inline lines as `telnet` and `nc` send them) and replies out, in RESP2
//! or RESP3 (`HELLO 3`).
//!
//! Requests are decoded incrementally ([`Decoder`] keeps the arguments of
//! a multibulk request read so far), so a large request arriving in many
//! small reads costs no re-parsing. Every size is bounded by a named
//! constant; a request over one is a [`ProtocolError`], after which the
//! connection answers it and closes, as Redis does (the rest of the stream
//! cannot be trusted to be at a request boundary).

use std::fmt::Write as _;

/// Longest inline request line, and longest multibulk or bulk header line
/// (Redis's `PROTO_INLINE_MAX_SIZE`).
pub const INLINE_BYTES_MAX: usize = 64 * 1024;
/// Arguments of one request at most (Redis allows up to `INT_MAX`; here a
/// request is one Raft write at most, far below this).
pub const REQUEST_ARGUMENTS_MAX: usize = 1024 * 1024;
/// Bytes of one argument at most: the largest client message of the
/// native port (a value is limited further, to `VALUE_SIZE_BYTES_MAX`).
pub const ARGUMENT_BYTES_MAX: usize = crate::server::kv::CLIENT_MESSAGE_BYTES_MAX;
/// Bytes of all the arguments of one request at most.
pub const REQUEST_BYTES_MAX: usize = crate::server::kv::CLIENT_MESSAGE_BYTES_MAX;
/// Arguments a client that has not authenticated yet may send in one
/// request (Redis's own limit for unauthenticated clients).
pub const UNAUTHENTICATED_ARGUMENTS_MAX: usize = 10;
/// Bytes of one argument of a client that has not authenticated yet
/// (Redis's own limit for unauthenticated clients).
pub const UNAUTHENTICATED_ARGUMENT_BYTES_MAX: usize = 16 * 1024;
/// Arguments allocated up front for a multibulk request (its announced
/// count is only a claim until the arguments arrive).
const ARGUMENTS_PREALLOCATED_MAX: usize = 1024;

/// A request that cannot be decoded: answered with `-ERR <message>`, then
/// the connection closes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(message: impl Into<String>) -> ProtocolError {
        ProtocolError(format!("Protocol error: {}", message.into()))
    }
}

/// The RESP version a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2 (the default).
    Resp2,
    /// RESP3 (after `HELLO 3`).
    Resp3,
}

impl Protocol {
    /// The number `HELLO` reports.
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// An incremental request decoder for one connection.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The multibulk request being read: its arguments so far, how many
    /// more are announced, and their bytes so far.
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    arguments: Vec<Vec<u8>>,
    remaining: usize,
    bytes: usize,
}

/// The position of the first `\r\n` in `buf`.
fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// A strict decimal integer, as Redis's `string2ll` reads one (no sign
/// but `-`, no spaces, no leading zeros but `0` itself).
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    let (negative, digits) = match bytes[0] {
        b'-' => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return None;
    }
    if negative && digits == b"0" {
        return None;
    }
    let mut value: i64 = 0;
    for digit in digits {
        let d = i64::from(digit - b'0');
        value = if negative {
            value.checked_mul(10)?.checked_sub(d)?
        } else {
            value.checked_mul(10)?.checked_add(d)?
        };
    }
    Some(value)
}

impl Decoder {
    /// Whether a multibulk request is partly read.
    pub fn in_request(&self) -> bool {
        self.pending.is_some()
    }

    /// Decodes the next request from `buf[*pos..]`, advancing `pos` past
    /// what it consumed. `Ok(None)`: more bytes are needed. An empty
    /// request (a blank inline line, `*0`) is `Some` of no arguments, which
    /// the caller skips. `authenticated`: whether the client's limits are
    /// the full ones or the unauthenticated ones.
    pub fn decode(
        &mut self,
        buf: &[u8],
        pos: &mut usize,
        authenticated: bool,
    ) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
        if self.pending.is_none() {
            let Some(&first) = buf.get(*pos) else {
                return Ok(None);
            };
            if first != b'*' {
                return decode_inline(buf, pos);
            }
            let rest = &buf[*pos..];
            let Some(end) = find_crlf(rest) else {
                if rest.len() > INLINE_BYTES_MAX {
                    return Err(ProtocolError::new("too big mbulk count string"));
                }
                return Ok(None);
            };
            if end > INLINE_BYTES_MAX {
                return Err(ProtocolError::new("too big mbulk count string"));
            }
            let count = parse_i64(&rest[1..end])
                .ok_or_else(|| ProtocolError::new("invalid multibulk length"))?;
            let limit = if authenticated {
                REQUEST_ARGUMENTS_MAX
            } else {
                UNAUTHENTICATED_ARGUMENTS_MAX
            };
            if count > limit as i64 {
                return Err(ProtocolError::new(format!(
                    "invalid multibulk length ({count} arguments, over {} {limit})",
                    if authenticated {
                        "REQUEST_ARGUMENTS_MAX"
                    } else {
                        "UNAUTHENTICATED_ARGUMENTS_MAX (AUTH first)"
                    }
                )));
            }
            *pos += end + 2;
            if count <= 0 {
                return Ok(Some(Vec::new()));
            }
            let count = count as usize;
            self.pending = Some(Pending {
                arguments: Vec::with_capacity(count.min(ARGUMENTS_PREALLOCATED_MAX)),
                remaining: count,
                bytes: 0,
            });
        }
        let Some(pending) = self.pending.as_mut() else {
            return Ok(None);
        };
        while pending.remaining > 0 {
            let rest = &buf[*pos..];
            let Some(end) = find_crlf(rest) else {
                if rest.len() > INLINE_BYTES_MAX {
                    return Err(ProtocolError::new("too big bulk count string"));
                }
                return Ok(None);
            };
            if rest[0] != b'$' {
                return Err(ProtocolError::new(format!(
                    "expected '$', got '{}'",
                    char::from(rest[0])
                )));
            }
            let len = parse_i64(&rest[1..end])
                .filter(|len| *len >= 0)
                .ok_or_else(|| ProtocolError::new("invalid bulk length"))?
                as u64;
            let (limit, name) = if authenticated {
                (ARGUMENT_BYTES_MAX, "ARGUMENT_BYTES_MAX")
            } else {
                (
                    UNAUTHENTICATED_ARGUMENT_BYTES_MAX,
                    "UNAUTHENTICATED_ARGUMENT_BYTES_MAX (AUTH first)",
                )
            };
            if len > limit as u64 {
                return Err(ProtocolError::new(format!(
                    "invalid bulk length ({len} bytes, over {name} {limit})"
                )));
            }
            let len = len as usize;
            if pending.bytes + len > REQUEST_BYTES_MAX {
                return Err(ProtocolError::new(format!(
                    "the request's arguments are over REQUEST_BYTES_MAX ({REQUEST_BYTES_MAX} bytes)"
                )));
            }
            let start = end + 2;
            if rest.len() < start + len + 2 {
                return Ok(None);
            }
            pending.arguments.push(rest[start..start + len].to_vec());
            pending.bytes += len;
            pending.remaining -= 1;
            *pos += start + len + 2;
        }
        Ok(self.pending.take().map(|pending| pending.arguments))
    }
}

/// An inline request: one line, split as Redis's `sdssplitargs` splits it.
fn decode_inline(buf: &[u8], pos: &mut usize) -> Result<Option<Vec<Vec<u8>>>, ProtocolError> {
    let rest = &buf[*pos..];
    let Some(newline) = rest.iter().position(|b| *b == b'\n') else {
        if rest.len() > INLINE_BYTES_MAX {
            return Err(ProtocolError::new("too big inline request"));
        }
        return Ok(None);
    };
    if newline > INLINE_BYTES_MAX {
        return Err(ProtocolError::new("too big inline request"));
    }
    let mut line = &rest[..newline];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    let arguments =
        split_args(line).ok_or_else(|| ProtocolError::new("unbalanced quotes in request"))?;
    *pos += newline + 1;
    Ok(Some(arguments))
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Splits a line into arguments as Redis's `sdssplitargs` does: spaces
/// separate, `"..."` takes `\n \r \t \b \a \\ \" \xHH` escapes, `'...'`
/// takes `\'`; a closing quote must be followed by a space or the end.
/// `None`: unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut arguments = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            return Some(arguments);
        }
        let mut current = Vec::new();
        let mut in_double = false;
        let mut in_single = false;
        loop {
            let c = line.get(i).copied();
            if in_double {
                match c {
                    None => return None,
                    Some(b'\\')
                        if line.get(i + 1) == Some(&b'x')
                            && line.get(i + 2).copied().and_then(hex_digit).is_some()
                            && line.get(i + 3).copied().and_then(hex_digit).is_some() =>
                    {
                        let high = hex_digit(line[i + 2]).unwrap_or(0);
                        let low = hex_digit(line[i + 3]).unwrap_or(0);
                        current.push(high * 16 + low);
                        i += 3;
                    }
                    Some(b'\\') if i + 1 < line.len() => {
                        i += 1;
                        current.push(match line[i] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                    }
                    Some(b'"') => {
                        // The closing quote must be followed by a space
                        // or the end of the line.
                        if let Some(next) = line.get(i + 1)
                            && !next.is_ascii_whitespace()
                        {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    Some(other) => current.push(other),
                }
            } else if in_single {
                match c {
                    None => return None,
                    Some(b'\\') if line.get(i + 1) == Some(&b'\'') => {
                        i += 1;
                        current.push(b'\'');
                    }
                    Some(b'\'') => {
                        if let Some(next) = line.get(i + 1)
                            && !next.is_ascii_whitespace()
                        {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    Some(other) => current.push(other),
                }
            } else {
                match c {
                    None => break,
                    Some(b' ' | b'\n' | b'\r' | b'\t' | 0) => break,
                    Some(b'"') => in_double = true,
                    Some(b'\'') => in_single = true,
                    Some(other) => current.push(other),
                }
            }
            i += 1;
        }
        arguments.push(current);
    }
}

/// A reply, before it is encoded for the connection's protocol.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+text` (`OK`, `PONG`, `QUEUED`).
    Simple(String),
    /// `-text`: the text starts with the error code (`ERR`, `WRONGTYPE`).
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$len` and bytes.
    Bulk(Vec<u8>),
    /// A missing value: RESP2 `$-1`, RESP3 `_`.
    Nil,
    /// A missing array (EXEC of a failed WATCH): RESP2 `*-1`, RESP3 `_`.
    NilArray,
    /// `*n` and the elements.
    Array(Vec<Reply>),
    /// RESP3 `%n` and the pairs; RESP2 an array of 2n elements.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `~n`; RESP2 an array.
    Set(Vec<Reply>),
    /// RESP3 `,d`; RESP2 a bulk string of the number.
    Double(f64),
    /// RESP3 `=len\r\ntxt:...`; RESP2 a bulk string.
    Verbatim(String),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".to_string())
    }

    /// `-ERR message`.
    pub fn err(message: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {message}"))
    }

    /// A bulk string from text.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Bulk(text.into().into_bytes())
    }

    /// Whether it is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

/// A double as Redis prints one (`%.17g`, `inf`, `-inf`).
pub fn format_double(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if value.is_nan() {
        return "nan".to_string();
    }
    // Redis prints `%.17g`; the shortest text that reads back as the same
    // double is printed here: clients parse both to the same number.
    format!("{value}")
}

/// Simple strings and errors may not hold a line break: each becomes a space.
fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

/// Appends `reply` to `out`, encoded for `protocol`.
pub fn encode(reply: &Reply, protocol: Protocol, out: &mut Vec<u8>) {
    match reply {
        Reply::Simple(text) => {
            out.push(b'+');
            out.extend_from_slice(one_line(text).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Reply::Error(text) => {
            out.push(b'-');
            out.extend_from_slice(one_line(text).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Reply::Integer(n) => header(out, b':', *n),
        Reply::Bulk(bytes) => bulk(out, bytes),
        Reply::Nil => match protocol {
            Protocol::Resp2 => out.extend_from_slice(b"$-1\r\n"),
            Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
        },
        Reply::NilArray => match protocol {
            Protocol::Resp2 => out.extend_from_slice(b"*-1\r\n"),
            Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
        },
        Reply::Array(items) => {
            header(out, b'*', items.len() as i64);
            for item in items {
                encode(item, protocol, out);
            }
        }
        Reply::Set(items) => {
            let kind = match protocol {
                Protocol::Resp2 => b'*',
                Protocol::Resp3 => b'~',
            };
            header(out, kind, items.len() as i64);
            for item in items {
                encode(item, protocol, out);
            }
        }
        Reply::Map(pairs) => {
            match protocol {
                Protocol::Resp2 => header(out, b'*', 2 * pairs.len() as i64),
                Protocol::Resp3 => header(out, b'%', pairs.len() as i64),
            }
            for (key, value) in pairs {
                encode(key, protocol, out);
                encode(value, protocol, out);
            }
        }
        Reply::Double(value) => match protocol {
            Protocol::Resp2 => bulk(out, format_double(*value).as_bytes()),
            Protocol::Resp3 => {
                out.push(b',');
                out.extend_from_slice(format_double(*value).as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        },
        Reply::Verbatim(text) => match protocol {
            Protocol::Resp2 => bulk(out, text.as_bytes()),
            Protocol::Resp3 => {
                header(out, b'=', text.len() as i64 + 4);
                out.extend_from_slice(b"txt:");
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        },
    }
}

fn header(out: &mut Vec<u8>, kind: u8, n: i64) {
    let mut text = String::with_capacity(24);
    let _ = write!(text, "{n}");
    out.push(kind);
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    header(out, b'$', bytes.len() as i64);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut decoder = Decoder::default();
        let mut pos = 0;
        let mut out = Vec::new();
        while let Some(request) = decoder.decode(input, &mut pos, true)? {
            out.push(request);
        }
        Ok(out)
    }

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn multibulk_and_inline_requests_decode() {
        let input = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\nset a \"b c\"\r\n\r\n*0\r\n";
        assert_eq!(
            decode_all(input).unwrap(),
            vec![
                args(&["GET", "k"]),
                args(&["PING"]),
                args(&["set", "a", "b c"]),
                vec![],
                vec![]
            ]
        );
    }

    #[test]
    fn a_request_split_anywhere_decodes_the_same() {
        let input = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nva\r\nl\r\n";
        for cut in 0..input.len() {
            let mut decoder = Decoder::default();
            let mut buf = input[..cut].to_vec();
            let mut pos = 0;
            let first = decoder.decode(&buf, &mut pos, true).unwrap();
            assert!(first.is_none(), "cut {cut}");
            buf.extend_from_slice(&input[cut..]);
            let request = decoder.decode(&buf, &mut pos, true).unwrap().unwrap();
            assert_eq!(request, args(&["SET", "key", "va\r\nl"]), "cut {cut}");
            assert_eq!(pos, input.len());
        }
    }

    #[test]
    fn limits_are_named_and_malformed_requests_refused() {
        let err = decode_all(b"*2\r\n$3\r\nGET\r\n$999999999\r\n").unwrap_err();
        assert!(err.0.contains("ARGUMENT_BYTES_MAX"), "{err:?}");
        let err = decode_all(b"*99999999\r\n").unwrap_err();
        assert!(err.0.contains("REQUEST_ARGUMENTS_MAX"), "{err:?}");
        let err = decode_all(b"*x\r\n").unwrap_err();
        assert_eq!(err.0, "Protocol error: invalid multibulk length");
        let err = decode_all(b"*1\r\n+GET\r\n").unwrap_err();
        assert_eq!(err.0, "Protocol error: expected '$', got '+'");
        let err = decode_all(b"*1\r\n$-3\r\n").unwrap_err();
        assert_eq!(err.0, "Protocol error: invalid bulk length");
        let err = decode_all(b"set a \"b\r\n").unwrap_err();
        assert_eq!(err.0, "Protocol error: unbalanced quotes in request");
        let long = vec![b'a'; INLINE_BYTES_MAX + 1];
        let err = decode_all(&long).unwrap_err();
        assert_eq!(err.0, "Protocol error: too big inline request");
        let mut decoder = Decoder::default();
        let mut pos = 0;
        let err = decoder.decode(b"*11\r\n", &mut pos, false).unwrap_err();
        assert!(err.0.contains("UNAUTHENTICATED_ARGUMENTS_MAX"), "{err:?}");
    }

    #[test]
    fn inline_quotes_follow_sdssplitargs() {
        assert_eq!(
            split_args(br#"set "a\x41\n" 'it\'s' x"#).unwrap(),
            vec![
                b"set".to_vec(),
                b"aA\n".to_vec(),
                b"it's".to_vec(),
                b"x".to_vec()
            ]
        );
        assert!(split_args(br#""a"b"#).is_none());
        assert!(split_args(b"'a").is_none());
        assert_eq!(split_args(b"   ").unwrap(), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn integers_are_strict() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"01",
            b"-0",
            b"+1",
            b" 1",
            b"1x",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn replies_encode_for_both_protocols() {
        let reply = Reply::Array(vec![
            Reply::ok(),
            Reply::Integer(-3),
            Reply::Bulk(b"v".to_vec()),
            Reply::Nil,
            Reply::Map(vec![(Reply::text("k"), Reply::Integer(1))]),
            Reply::Set(vec![Reply::text("m")]),
            Reply::err("bad\r\nline"),
        ]);
        let mut two = Vec::new();
        encode(&reply, Protocol::Resp2, &mut two);
        assert_eq!(
            two,
            b"*7\r\n+OK\r\n:-3\r\n$1\r\nv\r\n$-1\r\n*2\r\n$1\r\nk\r\n:1\r\n*1\r\n$1\r\nm\r\n-ERR bad  line\r\n"
        );
        let mut three = Vec::new();
        encode(&reply, Protocol::Resp3, &mut three);
        assert_eq!(
            three,
            b"*7\r\n+OK\r\n:-3\r\n$1\r\nv\r\n_\r\n%1\r\n$1\r\nk\r\n:1\r\n~1\r\n$1\r\nm\r\n-ERR bad  line\r\n"
        );
        let mut nil = Vec::new();
        encode(&Reply::NilArray, Protocol::Resp2, &mut nil);
        assert_eq!(nil, b"*-1\r\n");
        let mut verbatim = Vec::new();
        encode(&Reply::Verbatim("a".into()), Protocol::Resp3, &mut verbatim);
        assert_eq!(verbatim, b"=5\r\ntxt:a\r\n");
    }
}
