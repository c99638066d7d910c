//! Where the other members' etcd ports are. Each member tells its own in
//! its answer to the peer `Identify` (`IdentifyResponse.etcd_addr`,
//! [`advertised`]); MemberList and a follower's Defragment ask the members
//! they name ([`EtcdPeers::etcd_addrs`]), all at once and each within
//! [`ETCD_ADDR_ASK_TIMEOUT`], and keep each answer for
//! [`ETCD_ADDR_FRESH`]. A member that does not answer is named by its
//! last answer, however old, while its peer address is the same; one that
//! never answered, or answers with no address (a build before the field,
//! or no etcd port), by the guess that its etcd port sits at the same
//! offset from its client port as this member's
//! ([`EtcdFrontEnd::guessed_etcd_addr`](super::EtcdFrontEnd)).
//!
//! The addresses are not in the stored membership (ARCHITECTURE.md, "The
//! etcd v3 API", says why): a member's etcd address is what the member
//! itself serves now, so the member is asked.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::raft::network::Network;
use crate::raft::types::NodeInfo;

/// How long one member may take to answer `Identify` for its etcd address
/// before MemberList names it by its last answer or the guess (room for a
/// new peer channel's TLS handshake on a loaded machine).
pub const ETCD_ADDR_ASK_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a member's answer is used without asking again.
pub const ETCD_ADDR_FRESH: Duration = Duration::from_secs(10);

/// The etcd address a member listening on `listen` tells the others,
/// given its own client address from the membership (`own_client_addr`,
/// what `--initial-cluster` or `member add-learner` named): its host with
/// the etcd port when that host is a name (the name clients were given
/// and certificates carry); else `listen` itself when it names an
/// address; else the client address's IP with the etcd port. `None` when
/// none of them names a host.
pub fn advertised(listen: SocketAddr, own_client_addr: Option<&str>) -> Option<String> {
    let host = own_client_addr
        .and_then(|addr| addr.rsplit_once(':'))
        .map(|(host, _)| host)
        .filter(|host| !host.is_empty());
    let ip = |host: &str| {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .ok()
    };
    match host {
        Some(name) if ip(name).is_none() => Some(format!("{name}:{}", listen.port())),
        _ if !listen.ip().is_unspecified() => Some(listen.to_string()),
        Some(host) if ip(host).is_some_and(|ip| !ip.is_unspecified()) => {
            Some(format!("{host}:{}", listen.port()))
        }
        _ => None,
    }
}

/// One member's last answer.
#[derive(Clone, Debug)]
struct Answer {
    /// The peer address it was asked at.
    peer_addr: String,
    /// Its etcd address.
    etcd_addr: String,
    /// When it answered.
    at: Instant,
}

/// The other members' etcd addresses, as they last told them.
#[derive(Clone, Debug)]
pub struct EtcdPeers {
    network: Network,
    answers: Arc<Mutex<HashMap<u64, Answer>>>,
}

impl EtcdPeers {
    /// Asks over `network` (the member's peer channels).
    pub fn new(network: Network) -> EtcdPeers {
        EtcdPeers {
            network,
            answers: Arc::default(),
        }
    }

    /// The etcd address each of `members` told, by id: a fresh answer as
    /// it is, the others asked at once; a member with no answer to use is
    /// left out (the caller guesses).
    pub async fn etcd_addrs(&self, members: &[(u64, NodeInfo)]) -> HashMap<u64, String> {
        let now = Instant::now();
        let mut known = HashMap::new();
        let mut asks = tokio::task::JoinSet::new();
        {
            let answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
            for (id, node) in members {
                match answers.get(id) {
                    Some(answer)
                        if answer.peer_addr == node.peer_addr
                            && now.duration_since(answer.at) < ETCD_ADDR_FRESH =>
                    {
                        known.insert(*id, answer.etcd_addr.clone());
                    }
                    _ => {
                        let (network, id, node) = (self.network.clone(), *id, node.clone());
                        asks.spawn(async move {
                            let told = network
                                .identify_etcd_addr(id, &node, ETCD_ADDR_ASK_TIMEOUT)
                                .await;
                            (id, node.peer_addr, told)
                        });
                    }
                }
            }
        }
        while let Some(joined) = asks.join_next().await {
            let Ok((id, peer_addr, told)) = joined else {
                continue;
            };
            let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
            match told {
                Ok(Some(etcd_addr)) => {
                    known.insert(id, etcd_addr.clone());
                    let at = Instant::now();
                    answers.insert(
                        id,
                        Answer {
                            peer_addr,
                            etcd_addr,
                            at,
                        },
                    );
                }
                // It answered, with no address: nothing to remember.
                Ok(None) => {
                    answers.remove(&id);
                }
                // No answer: its last one while it is at the same place.
                Err(_) => {
                    if let Some(answer) = answers.get(&id).filter(|a| a.peer_addr == peer_addr) {
                        known.insert(id, answer.etcd_addr.clone());
                    }
                }
            }
        }
        known
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_tells_its_listen_address_or_its_client_host() {
        let listen: SocketAddr = "127.0.0.2:2379".parse().unwrap();
        assert_eq!(advertised(listen, None).as_deref(), Some("127.0.0.2:2379"));
        // A client address by name wins over the bound address.
        let named = advertised(listen, Some("node-2:7001"));
        assert_eq!(named.as_deref(), Some("node-2:2379"));
        let by_ip = advertised(listen, Some("10.9.9.9:7001"));
        assert_eq!(by_ip.as_deref(), Some("127.0.0.2:2379"));
        let every: SocketAddr = "0.0.0.0:2379".parse().unwrap();
        let told = |client| advertised(every, Some(client));
        assert_eq!(told("node-2:7001").as_deref(), Some("node-2:2379"));
        assert_eq!(told("10.1.2.3:7001").as_deref(), Some("10.1.2.3:2379"));
        assert_eq!(told("[fd00::2]:7001").as_deref(), Some("[fd00::2]:2379"));
        assert_eq!(told("0.0.0.0:7001"), None);
        assert_eq!(told("[::]:7001"), None);
        assert_eq!(told("no-port"), None);
        assert_eq!(advertised(every, None), None);
    }
}
