//! The etcd port's `:authority` repair: etcdctl 3.4 and clientv3 given an
//! endpoint written as a URL (`--endpoints http://127.0.0.1:2379`, and
//! every `--cluster` command, which takes MemberList's URLs) send the whole
//! URL as the HTTP/2 `:authority`. etcd's gRPC server ignores it; hyper's
//! HTTP/2 stack (h2) refuses a request whose authority does not parse and
//! resets the stream with PROTOCOL_ERROR, and has no lenient mode. So this
//! port reads each connection through [`AuthorityRepair`], which sits
//! between the socket and h2 and rewrites that one header before h2 sees
//! it.
//!
//! How, in the client-to-server bytes only (what the server sends passes
//! untouched):
//! - Bytes that do not begin with HTTP/2's connection preface (HTTP/1.1,
//!   the `/health` and `/version` GETs; a TLS handshake, which this layer
//!   sits under) pass through as they are.
//! - After the preface, frames pass through until the first complete
//!   header block (a HEADERS frame and its CONTINUATIONs), which is
//!   decoded (HPACK, `loona-hpack`). A client keeps one authority for a
//!   connection, so the first block decides: if its `:authority` parses
//!   (or it has none), that block and everything after it pass through
//!   unchanged, and the layer only copies bytes from then on.
//! - Otherwise the connection is rewritten: every header block from then
//!   on is decoded with the client's HPACK state and re-encoded with this
//!   layer's own encoder (whose dynamic table h2's decoder mirrors), the
//!   bad `:authority` replaced by the URL's `host:port`, or dropped when
//!   nothing usable is in it (HTTP/2 lets a request omit it). Padding is
//!   dropped; a priority is kept; a block is re-split into frames of at
//!   most [`FRAME_PAYLOAD_OUT_MAX`] bytes, the size every HTTP/2 peer
//!   accepts.
//! - A header block over [`HEADER_BLOCK_BYTES_MAX`], one with more than
//!   [`HEADER_FIELDS_MAX`] fields (counted before decoding) or that decodes
//!   to a list over [`HEADER_LIST_BYTES_MAX`], or one that does not decode
//!   (a table size update above [`HPACK_TABLE_BYTES_MAX`] among the
//!   reasons), is passed through as it came while nothing was rewritten yet
//!   (h2 then answers it as it would have); once rewriting began it ends
//!   the connection, as the two HPACK states could no longer agree.
//!
//! Limit: under TLS the layer sees ciphertext and passes it through, so an
//! `https://` URL endpoint still meets h2's refusal.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// HTTP/2's client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An HTTP/2 frame header's length.
const FRAME_HEADER_BYTES: usize = 9;
/// Frame types this layer looks into (RFC 9113 §6.2, §6.10).
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
/// HEADERS flags.
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// A HEADERS frame's priority fields (stream dependency and weight).
const PRIORITY_BYTES: usize = 5;
/// The largest header block (all its frames, as they came) this layer
/// holds and decodes: four times the port's 16 KiB header list cap (a
/// Huffman code is at most 30 bits an octet), so any block h2 would accept
/// fits; a connection holds about three copies of it while it comes.
pub const HEADER_BLOCK_BYTES_MAX: usize = 64 * 1024;
/// The largest frame payload this layer writes: HTTP/2's initial
/// SETTINGS_MAX_FRAME_SIZE, which no peer may lower.
pub const FRAME_PAYLOAD_OUT_MAX: usize = 16_384;
/// The largest header list (RFC 9113 §6.5.2 sizes: name, value and 32
/// octets per field) this layer decodes into fields: the port's own h2 cap,
/// so a block over it is one h2 refuses anyway. Without it a small block of
/// one-byte references to a large dynamic table entry decodes to
/// gigabytes.
pub const HEADER_LIST_BYTES_MAX: usize = crate::server::limits::HEADER_LIST_BYTES_MAX as usize;
/// The HPACK dynamic table size h2 advertises (SETTINGS_HEADER_TABLE_SIZE's
/// initial value, which the port does not change): a client's table size
/// update above it does not decode, as h2 would refuse it.
pub const HPACK_TABLE_BYTES_MAX: usize = 4096;
/// The most fields a block this layer decodes may have: each counts at
/// least 32 octets towards [`HEADER_LIST_BYTES_MAX`], so a block with more
/// is over it. Counted before decoding, because decoding costs per field
/// (loona-hpack builds a Huffman table for every Huffman-coded string, ~10
/// µs each, on the runtime thread that polls the connection).
pub const HEADER_FIELDS_MAX: usize = HEADER_LIST_BYTES_MAX / 32;
/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Where the rewriter is in the client's byte stream.
#[derive(Debug)]
enum Phase {
    /// Matching the preface; `seen` bytes matched so far.
    Preface { seen: usize },
    /// Between frames, or inside a frame's payload being passed through
    /// (`passing` bytes of it left).
    Frames { passing: usize },
    /// Everything passes through from here on.
    Through,
}

/// A header block being collected: its stream, its HEADERS flags and
/// priority, its fragments, and its frames as they came.
#[derive(Debug, Default)]
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_BYTES]>,
    fragment: Vec<u8>,
    raw: Vec<u8>,
}

/// The byte-stream rewriter (no I/O; [`AuthorityRepair`] drives it).
pub struct Rewriter {
    phase: Phase,
    /// True once the first header block needed a repair: every block is
    /// re-encoded from then on.
    rewriting: bool,
    block: Option<OpenBlock>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("phase", &self.phase)
            .field("rewriting", &self.rewriting)
            .finish_non_exhaustive()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE_BYTES_MAX);
        Rewriter {
            phase: Phase::Preface { seen: 0 },
            rewriting: false,
            block: None,
            decoder,
            encoder: loona_hpack::Encoder::new(),
        }
    }
}

/// What an `:authority` value becomes: `None` when it parses as it is;
/// `Some(None)` when it is dropped; `Some(Some(v))` when replaced by `v`.
fn repaired(value: &[u8]) -> Option<Option<Vec<u8>>> {
    if axum::http::uri::Authority::try_from(value).is_ok() {
        return None;
    }
    let from_url = axum::http::Uri::try_from(value)
        .ok()
        .and_then(|uri| uri.authority().map(|a| a.as_str().as_bytes().to_vec()));
    Some(from_url)
}

impl Rewriter {
    /// Whether the stream has been found to be something other than
    /// HTTP/2, or passes through for good: then [`Rewriter::feed`] only
    /// copies.
    pub fn passing_through(&self) -> bool {
        matches!(self.phase, Phase::Through)
    }

    /// Moves what can be judged of `input` to `out` (rewritten where it
    /// must be); what is left in `input` waits for more bytes. An error
    /// ends the connection.
    pub fn feed(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> io::Result<()> {
        loop {
            match &mut self.phase {
                Phase::Through => {
                    out.extend_from_slice(input);
                    input.clear();
                    return Ok(());
                }
                Phase::Preface { seen } => {
                    let wanted = &PREFACE[*seen..];
                    let n = wanted.len().min(input.len());
                    if input[..n] != wanted[..n] {
                        // Not HTTP/2 with prior knowledge: what was held
                        // back of the preface, then the rest, as it came.
                        out.extend_from_slice(&PREFACE[..*seen]);
                        self.phase = Phase::Through;
                        continue;
                    }
                    *seen += n;
                    input.advance(n);
                    if *seen < PREFACE.len() {
                        return Ok(());
                    }
                    out.extend_from_slice(PREFACE);
                    self.phase = Phase::Frames { passing: 0 };
                }
                Phase::Frames { passing } if *passing > 0 => {
                    let n = (*passing).min(input.len());
                    if n == 0 {
                        return Ok(());
                    }
                    out.extend_from_slice(&input[..n]);
                    input.advance(n);
                    *passing -= n;
                }
                Phase::Frames { .. } => {
                    if input.len() < FRAME_HEADER_BYTES {
                        return Ok(());
                    }
                    let length = usize::from(input[0]) << 16
                        | usize::from(input[1]) << 8
                        | usize::from(input[2]);
                    let kind = input[3];
                    if kind != FRAME_HEADERS && kind != FRAME_CONTINUATION {
                        if let Some(block) = self.block.take() {
                            // Only CONTINUATION may follow an unfinished
                            // block: h2 will refuse this connection.
                            self.give_up(block, out)?;
                            continue;
                        }
                        out.extend_from_slice(&input[..FRAME_HEADER_BYTES]);
                        input.advance(FRAME_HEADER_BYTES);
                        self.phase = Phase::Frames { passing: length };
                        continue;
                    }
                    let held = self.block.as_ref().map_or(0, |b| b.raw.len());
                    if held + FRAME_HEADER_BYTES + length > HEADER_BLOCK_BYTES_MAX {
                        let block = self.block.take().unwrap_or_default();
                        self.give_up(block, out)?;
                        continue;
                    }
                    if input.len() < FRAME_HEADER_BYTES + length {
                        input.reserve(FRAME_HEADER_BYTES + length - input.len());
                        return Ok(());
                    }
                    let frame = input.split_to(FRAME_HEADER_BYTES + length);
                    self.frame(&frame, out)?;
                }
            }
        }
    }

    /// One HEADERS or CONTINUATION frame, whole.
    fn frame(&mut self, frame: &[u8], out: &mut BytesMut) -> io::Result<()> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER_BYTES..];
        if kind == FRAME_HEADERS {
            if let Some(block) = self.block.take() {
                self.give_up(block, out)?;
                out.extend_from_slice(frame);
                return Ok(());
            }
            let Some((priority, fragment)) = headers_fragment(flags, payload) else {
                // Malformed padding or priority: h2's to refuse.
                return self.give_up(
                    OpenBlock {
                        raw: frame.to_vec(),
                        ..OpenBlock::default()
                    },
                    out,
                );
            };
            self.block = Some(OpenBlock {
                stream,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
                raw: frame.to_vec(),
            });
        } else {
            let Some(block) = self.block.as_mut().filter(|b| b.stream == stream) else {
                let block = self.block.take().unwrap_or_default();
                self.give_up(block, out)?;
                out.extend_from_slice(frame);
                return Ok(());
            };
            block.fragment.extend_from_slice(payload);
            block.raw.extend_from_slice(frame);
        }
        if flags & FLAG_END_HEADERS != 0 {
            let block = self.block.take().expect("set above");
            self.finish(block, out)?;
        }
        Ok(())
    }

    /// A block this layer cannot judge: as it came, and through from now
    /// on; an error once rewriting began.
    fn give_up(&mut self, block: OpenBlock, out: &mut BytesMut) -> io::Result<()> {
        if self.rewriting {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "etcd port: a header block this connection's :authority repair cannot decode",
            ));
        }
        out.extend_from_slice(&block.raw);
        self.phase = Phase::Through;
        Ok(())
    }

    /// A complete header block: judged (the first), or re-encoded.
    fn finish(&mut self, block: OpenBlock, out: &mut BytesMut) -> io::Result<()> {
        if !fields_within(&block.fragment, HEADER_FIELDS_MAX) {
            return self.give_up(block, out);
        }
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut repair = false;
        // The decoded list's size; past HEADER_LIST_BYTES_MAX nothing more
        // is kept (the decoder still runs to the end of the block).
        let mut list_bytes = 0_usize;
        let decoded = self.decoder.decode_with_cb(
            &block.fragment,
            |name: Cow<'_, [u8]>, value: Cow<'_, [u8]>| {
                list_bytes = list_bytes.saturating_add(name.len() + value.len() + 32);
                if list_bytes > HEADER_LIST_BYTES_MAX {
                    fields = Vec::new();
                    return;
                }
                if name.as_ref() == b":authority" {
                    match repaired(&value) {
                        None => fields.push((name.into_owned(), value.into_owned())),
                        Some(Some(fixed)) => {
                            repair = true;
                            fields.push((name.into_owned(), fixed));
                        }
                        Some(None) => repair = true,
                    }
                } else {
                    fields.push((name.into_owned(), value.into_owned()));
                }
            },
        );
        if decoded.is_err() || list_bytes > HEADER_LIST_BYTES_MAX {
            return self.give_up(block, out);
        }
        if !self.rewriting {
            if !repair {
                out.extend_from_slice(&block.raw);
                self.phase = Phase::Through;
                return Ok(());
            }
            self.rewriting = true;
        }
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        write_block(&block, &encoded, out);
        Ok(())
    }
}

/// Whether the HPACK `fragment` holds at most `max` fields, read from the
/// representations' integers and string lengths alone (RFC 7541 §6); a
/// fragment that does not parse counts as within (the decoder refuses it).
fn fields_within(fragment: &[u8], max: usize) -> bool {
    /// An HPACK integer with a `prefix`-bit prefix at `at`: its value and
    /// the position after it; `None` when cut short or over 2^28.
    fn integer(bytes: &[u8], at: usize, prefix: u32) -> Option<(usize, usize)> {
        let mask = (1_usize << prefix) - 1;
        let mut value = usize::from(*bytes.get(at)?) & mask;
        let mut at = at + 1;
        if value < mask {
            return Some((value, at));
        }
        for shift in (0..28).step_by(7) {
            let byte = *bytes.get(at)?;
            at += 1;
            value += usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some((value, at));
            }
        }
        None
    }
    /// The position after the string literal at `at`.
    fn string(bytes: &[u8], at: usize) -> Option<usize> {
        let (len, at) = integer(bytes, at, 7)?;
        at.checked_add(len).filter(|end| *end <= bytes.len())
    }
    let mut fields = 0;
    let mut at = 0;
    while at < fragment.len() {
        let first = fragment[at];
        let next = if first & 0x80 != 0 {
            integer(fragment, at, 7).map(|(_, at)| at)
        } else if first & 0xe0 == 0x20 {
            // A dynamic table size update: not a field.
            match integer(fragment, at, 5) {
                Some((_, after)) => {
                    at = after;
                    continue;
                }
                None => return true,
            }
        } else {
            let prefix = if first & 0x40 != 0 { 6 } else { 4 };
            integer(fragment, at, prefix).and_then(|(index, at)| {
                let at = if index == 0 {
                    string(fragment, at)?
                } else {
                    at
                };
                string(fragment, at)
            })
        };
        let Some(next) = next else {
            return true;
        };
        fields += 1;
        if fields > max {
            return false;
        }
        at = next;
    }
    true
}

/// A HEADERS payload's priority (when flagged) and header block fragment;
/// `None` when the padding or priority do not fit the payload.
fn headers_fragment(flags: u8, payload: &[u8]) -> Option<(Option<[u8; PRIORITY_BYTES]>, &[u8])> {
    let mut body = payload;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        pad = usize::from(*body.first()?);
        body = &body[1..];
    }
    let priority = if flags & FLAG_PRIORITY != 0 {
        let fields: [u8; PRIORITY_BYTES] = body.get(..PRIORITY_BYTES)?.try_into().ok()?;
        body = &body[PRIORITY_BYTES..];
        Some(fields)
    } else {
        None
    };
    let end = body.len().checked_sub(pad)?;
    Some((priority, &body[..end]))
}

/// Writes `encoded` as `block`'s HEADERS frame and CONTINUATIONs.
fn write_block(block: &OpenBlock, encoded: &[u8], out: &mut BytesMut) {
    let room = FRAME_PAYLOAD_OUT_MAX - block.priority.map_or(0, |_| PRIORITY_BYTES);
    let first_len = encoded.len().min(room);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = if block.end_stream { FLAG_END_STREAM } else { 0 };
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    let priority = block.priority.as_ref().map_or(&[][..], |p| &p[..]);
    frame_header(
        out,
        priority.len() + first.len(),
        FRAME_HEADERS,
        flags,
        block.stream,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let n = rest.len().min(FRAME_PAYLOAD_OUT_MAX);
        let (chunk, tail) = rest.split_at(n);
        let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
        frame_header(out, chunk.len(), FRAME_CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
        rest = tail;
    }
}

fn frame_header(out: &mut BytesMut, length: usize, kind: u8, flags: u8, stream: u32) {
    let length = u32::try_from(length).expect("at most FRAME_PAYLOAD_OUT_MAX");
    out.extend_from_slice(&length.to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
}

/// A connection read through a [`Rewriter`] (see the module doc).
#[derive(Debug)]
pub struct AuthorityRepair<IO> {
    inner: IO,
    rewriter: Rewriter,
    /// Read from `inner`, not judged yet.
    input: BytesMut,
    /// Judged, not yet handed to the reader.
    output: BytesMut,
}

impl<IO> AuthorityRepair<IO> {
    /// Reads `inner` through a fresh rewriter.
    pub fn new(inner: IO) -> Self {
        AuthorityRepair {
            inner,
            rewriter: Rewriter::default(),
            input: BytesMut::new(),
            output: BytesMut::new(),
        }
    }
}

impl<IO: Connected> Connected for AuthorityRepair<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityRepair<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.passing_through() && this.input.is_empty() {
                // Nothing held back: read straight into the caller's buffer.
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut chunk = [0_u8; READ_CHUNK_BYTES];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // End of stream: an unfinished frame goes as it came;
                    // h2 reports the truncation.
                    let rest = this.input.split();
                    this.output.extend_from_slice(&rest);
                    if this.output.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                }
                Poll::Ready(Ok(())) => {
                    this.input.extend_from_slice(read.filled());
                    this.rewriter.feed(&mut this.input, &mut this.output)?;
                }
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityRepair<IO> {
    crate::server::limits::delegate_async_write!(inner);
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &[u8] = b"127.0.0.1:2379";
    const URL: &[u8] = b"http://127.0.0.1:2379";

    fn request(authority: &[u8], path: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), path.to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    /// A client's bytes: the preface, a SETTINGS frame, then for each
    /// request a HEADERS frame (padded and with a priority, its block split
    /// over a CONTINUATION) and a DATA frame; encoded by one HPACK encoder,
    /// so later blocks refer to the dynamic table.
    fn client_bytes(requests: &[Vec<(Vec<u8>, Vec<u8>)>]) -> Vec<u8> {
        let mut encoder = loona_hpack::Encoder::new();
        let mut out = BytesMut::new();
        out.extend_from_slice(PREFACE);
        frame_header(&mut out, 6, 0x4, 0, 0);
        out.extend_from_slice(&[0, 4, 0, 0, 0xff, 0xff]);
        for (i, fields) in requests.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            let block = encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
            let (first, second) = block.split_at(block.len() / 2);
            let pad = 3;
            frame_header(
                &mut out,
                1 + PRIORITY_BYTES + first.len() + pad,
                FRAME_HEADERS,
                FLAG_PADDED | FLAG_PRIORITY,
                stream,
            );
            out.put_u8(pad as u8);
            out.extend_from_slice(&[0, 0, 0, 0, 15]);
            out.extend_from_slice(first);
            out.extend_from_slice(&[0; 3]);
            frame_header(
                &mut out,
                second.len(),
                FRAME_CONTINUATION,
                FLAG_END_HEADERS,
                stream,
            );
            out.extend_from_slice(second);
            frame_header(&mut out, 5, 0x0, FLAG_END_STREAM, stream);
            out.extend_from_slice(&[0, 0, 0, 0, 0]);
        }
        out.to_vec()
    }

    /// Runs `bytes` through a rewriter `step` bytes at a time.
    fn rewrite(bytes: &[u8], step: usize) -> io::Result<Vec<u8>> {
        let mut rewriter = Rewriter::default();
        let (mut input, mut out) = (BytesMut::new(), BytesMut::new());
        for chunk in bytes.chunks(step) {
            input.extend_from_slice(chunk);
            rewriter.feed(&mut input, &mut out)?;
        }
        assert!(input.is_empty(), "everything judged");
        Ok(out.to_vec())
    }

    /// Parses a server's view of `bytes`: each header block, decoded.
    fn header_blocks(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        assert!(bytes.starts_with(PREFACE));
        let mut rest = &bytes[PREFACE.len()..];
        let mut decoder = loona_hpack::Decoder::new();
        let (mut blocks, mut fragment) = (Vec::new(), Vec::new());
        while !rest.is_empty() {
            let length =
                usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let payload = &rest[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + length];
            assert!(length <= FRAME_PAYLOAD_OUT_MAX);
            if kind == FRAME_HEADERS {
                fragment.extend_from_slice(headers_fragment(flags, payload).expect("valid").1);
            } else if kind == FRAME_CONTINUATION {
                fragment.extend_from_slice(payload);
            }
            if (kind == FRAME_HEADERS || kind == FRAME_CONTINUATION)
                && flags & FLAG_END_HEADERS != 0
            {
                blocks.push(decoder.decode(&fragment).expect("decodes"));
                fragment.clear();
            }
            rest = &rest[FRAME_HEADER_BYTES + length..];
        }
        blocks
    }

    #[test]
    fn a_url_authority_becomes_host_and_port_in_every_block() {
        let requests: Vec<_> = (0..4)
            .map(|i| request(URL, format!("/etcdserverpb.KV/Range{i}").as_bytes()))
            .collect();
        let bytes = client_bytes(&requests);
        for step in [1, 7, 4096, bytes.len()] {
            let out = rewrite(&bytes, step).expect("rewrites");
            let blocks = header_blocks(&out);
            assert_eq!(blocks.len(), requests.len());
            for (block, sent) in blocks.iter().zip(&requests) {
                let mut expected = sent.clone();
                expected[3].1 = GOOD.to_vec();
                assert_eq!(block, &expected, "step {step}");
            }
        }
    }

    #[test]
    fn an_authority_with_nothing_usable_is_dropped() {
        let bytes = client_bytes(&[request(b"not a uri at all", b"/p")]);
        let blocks = header_blocks(&rewrite(&bytes, 5).expect("rewrites"));
        let mut expected = request(b"", b"/p");
        expected.remove(3);
        assert_eq!(blocks, vec![expected]);
    }

    #[test]
    fn a_good_first_block_passes_the_connection_through_unchanged() {
        let bytes = client_bytes(&[request(GOOD, b"/a"), request(URL, b"/b")]);
        for step in [1, 13, bytes.len()] {
            assert_eq!(rewrite(&bytes, step).expect("passes"), bytes);
        }
    }

    #[test]
    fn not_http2_passes_through() {
        let http1 = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(rewrite(&http1, 3).expect("passes"), http1);
        // A TLS ClientHello's first bytes.
        let tls = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
        assert_eq!(rewrite(&tls, 1).expect("passes"), tls);
    }

    /// One header block on `stream` as a single HEADERS frame.
    fn headers_frame(stream: u32, block: &[u8]) -> Vec<u8> {
        let mut frame = BytesMut::new();
        frame_header(
            &mut frame,
            block.len(),
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            stream,
        );
        frame.extend_from_slice(block);
        frame.to_vec()
    }

    /// An HPACK bomb: a request with a URL authority whose last field is a
    /// ~4 KB literal added to the dynamic table, then `refs` one-byte
    /// references to it (index 62). The block is about `refs` bytes; it
    /// decodes to about `refs` * 4 KB, far over any header list h2 accepts
    /// (limits::HEADER_LIST_BYTES_MAX, 16 KiB).
    fn bomb(refs: usize) -> Vec<u8> {
        let mut fields = request(URL, b"/etcdserverpb.KV/Range");
        fields.push((b"x-bomb".to_vec(), vec![b'a'; 4000]));
        let mut block = loona_hpack::Encoder::new()
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        block.extend(std::iter::repeat_n(0x80 | 62, refs));
        block
    }

    /// A first block that decodes to far more than h2's header list cap is
    /// not collected field by field (100 references here decode to 400 KB;
    /// before the caps, a 1 MiB block of them was ~4 GB of decoded fields):
    /// it passes through as it came and h2 refuses it as too large.
    #[test]
    fn a_first_block_decoding_past_the_header_list_cap_passes_through() {
        let mut bytes = client_bytes(&[]);
        bytes.extend_from_slice(&headers_frame(1, &bomb(100)));
        assert_eq!(rewrite(&bytes, bytes.len()).expect("passes"), bytes);
    }

    #[test]
    fn fields_are_counted_from_the_representations() {
        let mut encoder = loona_hpack::Encoder::new();
        let fields = request(URL, b"/p");
        let block = encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        // A size update first, then the six fields; then again, indexed.
        let mut fragment = vec![0x3f, 0xe1, 0x1f];
        fragment.extend_from_slice(&block);
        assert!(fields_within(&fragment, 6));
        assert!(!fields_within(&fragment, 5));
        let again = encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        assert!(fields_within(&again, 6) && !fields_within(&again, 5));
        // Two-octet fields (:method, an empty Huffman value): 600 of them.
        let tiny: Vec<u8> = std::iter::repeat_n([0x02, 0x80], 600).flatten().collect();
        assert!(!fields_within(&tiny, HEADER_FIELDS_MAX));
        assert!(fields_within(
            &tiny[..2 * HEADER_FIELDS_MAX],
            HEADER_FIELDS_MAX
        ));
        // Cut short: left to the decoder.
        assert!(fields_within(&[0x40, 0x05, b'a'], 0));
    }

    /// Once rewriting, a client's dynamic table size update above the
    /// 4096 bytes h2 advertises (h2 would answer COMPRESSION_ERROR) must not
    /// grow this layer's decoder table: h2 never sees the update, and the
    /// table would hold up to ~256 MiB per connection.
    #[test]
    fn a_table_size_update_above_h2s_ends_a_rewritten_connection() {
        let mut bytes = client_bytes(&[request(URL, b"/a")]);
        // Size update to 2^20 (prefix 5 bits: 0x3f then 2^20 - 31 in 7-bit groups),
        // then an indexed :method POST.
        let mut size = (1_usize << 20) - 31;
        let mut block = vec![0x3f];
        while size >= 0x80 {
            block.push((size as u8 & 0x7f) | 0x80);
            size >>= 7;
        }
        block.push(size as u8);
        block.push(0x83);
        bytes.extend_from_slice(&headers_frame(3, &block));
        assert!(rewrite(&bytes, bytes.len()).is_err());
    }

    #[test]
    fn an_undecodable_first_block_passes_through_but_ends_a_rewritten_connection() {
        // 0xff opens an indexed field whose index never ends.
        let undecodable = |stream| {
            let mut frame = BytesMut::new();
            frame_header(&mut frame, 2, FRAME_HEADERS, FLAG_END_HEADERS, stream);
            frame.extend_from_slice(&[0xff, 0xff]);
            frame.to_vec()
        };
        let mut garbage = client_bytes(&[]);
        garbage.extend_from_slice(&undecodable(1));
        assert_eq!(rewrite(&garbage, 4).expect("passes"), garbage);
        let mut after_repair = client_bytes(&[request(URL, b"/a")]);
        after_repair.extend_from_slice(&undecodable(3));
        assert!(rewrite(&after_repair, 4).is_err());
    }
}
