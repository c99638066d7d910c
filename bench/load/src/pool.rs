//! The gRPC channels every client shares: lazily connected, a fixed
//! number per endpoint address, handed out round-robin by client number.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Deadline of one RPC and of one connection attempt.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);

fn url(endpoint: &str) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// Lazily connected channels per endpoint address, shared by every client.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) connections: usize,
    channels: Mutex<BTreeMap<String, Vec<Channel>>>,
}

impl Pool {
    /// An empty pool that opens `connections` channels per endpoint.
    pub(crate) fn new(connections: usize) -> Pool {
        Pool {
            connections,
            channels: Mutex::new(BTreeMap::new()),
        }
    }

    /// The channel of `client` to `addr` (opened lazily with the others of
    /// that endpoint on first use).
    pub(crate) fn channel(&self, addr: &str, client: usize) -> Result<Channel, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if !channels.contains_key(addr) {
            let endpoint = Endpoint::from_shared(url(addr))
                .map_err(|err| {
                    tonic::Status::invalid_argument(format!("endpoint {addr:?}: {err}"))
                })?
                .connect_timeout(RPC_TIMEOUT)
                .timeout(RPC_TIMEOUT)
                .tcp_nodelay(true);
            let list = (0..self.connections)
                .map(|_| endpoint.connect_lazy())
                .collect();
            channels.insert(addr.to_string(), list);
        }
        let list = &channels[addr];
        Ok(list[client % list.len()].clone())
    }
}
