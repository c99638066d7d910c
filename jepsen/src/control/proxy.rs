//! The no-root fallback for partitions: a userspace TCP proxy in front of
//! every member's peer port.
//!
//! Without root there is no private network namespace and no iptables.
//! Members then run on the host's loopback (still each on its own
//! 127.0.0.(10+i), which needs no privilege) and advertise, as their peer
//! address, a proxy port on their own address ([`PROXY_PORT`]) instead of
//! their real peer port. Every Raft connection to member j therefore goes
//! through j's proxy, which tells the sending member by the connection's
//! source address (kvnode binds its outgoing peer connections to its own
//! address). A cut link (from → to) refuses new connections from `from`
//! at `to`'s proxy and shuts the open ones down (forwarding stops at once).
//!
//! Why one proxy per destination and not one per (from, to) pair: kvnode's
//! peer addresses live in the replicated membership, so every member sees
//! the same address for j; a member cannot be given its own view. Telling
//! the sender apart by its source address gives the same per-pair control.
//!
//! Not available this way: packet loss and delay (the proxy forwards whole
//! streams; dropping bytes would corrupt them rather than lose packets),
//! and clock faults (libfaketime works without root, but the harness keeps
//! the fallback to partitions, kills and pauses). `jepsen run` refuses
//! them in proxy mode.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;

use super::cluster::{NODES_MAX, PEER_PORT, node_ip};

/// Port of each member's peer proxy (on the member's own address).
pub const PROXY_PORT: u16 = 7201;
/// Open connections one link may hold at most (kvnode keeps a few per
/// peer; more means a leak, and the newest are refused).
pub const CONNECTIONS_PER_LINK_MAX: usize = 64;
/// Bytes one forwarding step copies at most.
const COPY_BUFFER_BYTES: usize = 64 * 1024;
/// How long connecting to a member's real peer port may take.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often an idle accept loop checks whether the proxies stop.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// The proxy address member `id` advertises as its peer address.
pub fn proxy_addr(id: u64) -> String {
    format!("{}:{PROXY_PORT}", node_ip(id))
}

/// The member whose address is `ip`, if any.
fn member_of(ip: IpAddr) -> Option<u64> {
    (1..=NODES_MAX).find(|&id| IpAddr::V4(node_ip(id)) == ip)
}

/// One forwarded connection: (sender side, member side, ended).
type Connection = (TcpStream, TcpStream, Arc<AtomicBool>);

#[derive(Debug, Default)]
struct State {
    cut: BTreeSet<(u64, u64)>,
    /// Open connections per link: both sockets, to shut down on a cut,
    /// and a flag the copying threads set when the connection ended.
    open: BTreeMap<(u64, u64), Vec<Connection>>,
}

/// Every member's peer proxy, and which links are cut.
#[derive(Debug)]
pub struct ProxyNet {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ProxyNet {
    /// Starts a proxy for each of `slots` members (ids 1 ..= slots).
    pub fn start(slots: u64) -> anyhow::Result<Self> {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut net = Self {
            state,
            stop,
            threads: Vec::new(),
        };
        for to in 1..=slots.min(NODES_MAX) {
            let listener = TcpListener::bind(proxy_addr(to))
                .with_context(|| format!("binding member {to}'s peer proxy {}", proxy_addr(to)))?;
            listener.set_nonblocking(true)?;
            let (state, stop) = (net.state.clone(), net.stop.clone());
            net.threads.push(
                std::thread::Builder::new()
                    .name(format!("proxy-{to}"))
                    .spawn(move || accept_loop(to, &listener, &state, &stop))
                    .context("starting a proxy thread")?,
            );
        }
        Ok(net)
    }

    /// Cuts the link from → to: new connections refused, open ones shut.
    pub fn cut(&self, from: u64, to: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.cut.insert((from, to));
        for (a, b, _) in state.open.remove(&(from, to)).unwrap_or_default() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cut
            .clear();
    }
}

impl Drop for ProxyNet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for (a, b, _) in std::mem::take(&mut state.open).into_values().flatten() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        drop(state);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn accept_loop(to: u64, listener: &TcpListener, state: &Arc<Mutex<State>>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((client, from_addr)) => {
                let _ = client.set_nonblocking(false);
                handle(to, client, from_addr, state);
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL);
            }
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Forwards one accepted connection to member `to`'s real peer port,
/// unless its link is cut (then it is dropped: the sender sees a reset).
fn handle(to: u64, client: TcpStream, from_addr: SocketAddr, state: &Arc<Mutex<State>>) {
    let from = member_of(from_addr.ip()).unwrap_or(0);
    {
        let state = state.lock().unwrap_or_else(|p| p.into_inner());
        let open = state.open.get(&(from, to)).map_or(0, |v| {
            v.iter().filter(|c| !c.2.load(Ordering::Relaxed)).count()
        });
        if state.cut.contains(&(from, to)) || open >= CONNECTIONS_PER_LINK_MAX {
            return;
        }
    }
    let upstream_addr = SocketAddr::new(IpAddr::V4(node_ip(to)), PEER_PORT);
    let Ok(upstream) = TcpStream::connect_timeout(&upstream_addr, UPSTREAM_CONNECT_TIMEOUT) else {
        return;
    };
    let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
    let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = (
        client.try_clone(),
        upstream.try_clone(),
        client.try_clone(),
        upstream.try_clone(),
    ) else {
        return;
    };
    let ended = Arc::new(AtomicBool::new(false));
    {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        // Cut between the check and now: do not forward.
        if state.cut.contains(&(from, to)) {
            return;
        }
        let open = state.open.entry((from, to)).or_default();
        // Forget connections whose copies ended.
        open.retain(|c| !c.2.load(Ordering::Relaxed));
        open.push((c3, u3, ended.clone()));
    }
    let ended_too = ended.clone();
    let _ = std::thread::Builder::new()
        .name(format!("proxy-{from}-{to}-up"))
        .spawn(move || copy(client, upstream, &ended));
    let _ = std::thread::Builder::new()
        .name(format!("proxy-{from}-{to}-down"))
        .spawn(move || copy(u2, c2, &ended_too));
}

/// Copies `from` to `to` until either side closes, then shuts both and
/// marks the connection ended.
fn copy(mut from: TcpStream, mut to: TcpStream, ended: &AtomicBool) {
    let mut buffer = vec![0u8; COPY_BUFFER_BYTES];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    ended.store(true, Ordering::Relaxed);
}
