//! openraft's metrics, watched: since 0.10 `Raft::metrics()` hands out the
//! runtime's own receiver (`TokioWatchReceiver`), whose methods come from
//! openraft's `WatchReceiver` trait and differ from tokio's. [`MetricsWatch`]
//! gives the node, its services and its tests tokio's names on it again:
//! `borrow`, `changed`, `wait_for`.

use std::future::Future;
use std::ops::Deref;

use openraft::alias::WatchReceiverOf;
use openraft::async_runtime::WatchReceiver;
use openraft::async_runtime::watch::RecvError;

use crate::raft::types::{NodeMetrics, TypeConfig};

/// The receiver `Raft::metrics()` returns.
pub type NodeMetricsWatch = WatchReceiverOf<TypeConfig, NodeMetrics>;

/// tokio's watch-receiver names on openraft's metrics receiver.
pub trait MetricsWatch {
    /// The latest metrics (hold the guard briefly: it blocks openraft's
    /// next update).
    fn borrow(&self) -> impl Deref<Target = NodeMetrics> + '_;

    /// Waits for the next change; an error once openraft has stopped.
    fn changed(&mut self) -> impl Future<Output = Result<(), RecvError>> + Send + '_;

    /// Waits until `until` holds for the metrics (checked on the current
    /// value first) and returns them; an error once openraft has stopped.
    fn wait_for<'a, F>(
        &'a mut self,
        until: F,
    ) -> impl Future<Output = Result<NodeMetrics, RecvError>> + Send + 'a
    where
        F: Fn(&NodeMetrics) -> bool + Send + 'a;
}

impl MetricsWatch for NodeMetricsWatch {
    fn borrow(&self) -> impl Deref<Target = NodeMetrics> + '_ {
        self.borrow_watched()
    }

    fn changed(&mut self) -> impl Future<Output = Result<(), RecvError>> + Send + '_ {
        WatchReceiver::changed(self)
    }

    fn wait_for<'a, F>(
        &'a mut self,
        until: F,
    ) -> impl Future<Output = Result<NodeMetrics, RecvError>> + Send + 'a
    where
        F: Fn(&NodeMetrics) -> bool + Send + 'a,
    {
        self.wait_until(until)
    }
}
