//! The member's background tasks besides the ports: the leader's tick loop
//! (cluster time advances without client writes) and learning who the
//! other members are (cluster id, incarnations) at and after start-up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::node::StartError;
use crate::node::clock::ClusterClock;
use crate::node::identity::Identity;
use crate::raft::network::Network;
use crate::raft::propose::leader_caught_up;
use crate::raft::types::{NodeInfo, NodeRaft};
use crate::raft::watch::MetricsWatch;
use crate::state_machine::StateMachine;
use kvstate::command::{Command, Proposal};
use kvstate::history::HistoryWindow;

/// How often the leader checks whether cluster time must advance without
/// client writes (DESIGN §3): at most one tick entry per interval, while
/// some key, lease or hash may still expire and no other entry was applied
/// in the last interval, or while expired ones wait behind a backlog.
pub const TICK_INTERVAL: Duration = Duration::from_millis(250);

/// The leader's tick loop: proposes `Command::Advance` entries so TTL keys
/// expire on time when no client writes arrive (and Redis hashes that
/// expired or were deleted lose their fields), and `Command::Compact`
/// entries when the change history outgrows `window` by an eighth (etcd's
/// auto-compaction, by revisions, bytes and records rather than by time),
/// back to `window`.
pub(crate) async fn tick_loop(
    id: u64,
    raft: NodeRaft,
    state_machine: StateMachine,
    clock: Arc<ClusterClock>,
    window: HistoryWindow,
    mut stop: watch::Receiver<bool>,
) {
    let mut interval = tokio::time::interval(TICK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_seen_applied = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (leader, applied) = {
            let m = raft.metrics().borrow().clone();
            (m.current_leader, m.last_applied.map(|l| l.index))
        };
        let idle = applied == last_seen_applied;
        last_seen_applied = applied;
        if leader != Some(id) {
            continue;
        }
        // Never blocks the runtime: a busy index is checked next tick.
        let target = match state_machine.history().try_read() {
            Ok(history) if history.is_over(window) => history.compaction_target(window),
            _ => None,
        };
        if let Some(revision) = target
            && let Ok(term) = leader_caught_up(&raft).await
        {
            let compact = Proposal {
                time_ms: clock.stamp(term),
                command: Command::Compact { revision },
            };
            if let Err(err) = raft.client_write(compact).await {
                tracing::debug!(error = %err, "compaction not proposed");
            }
        }
        // Tick while a key or a lease may still expire, or while expired
        // keys or leases wait for their deletes (a burst larger than one
        // entry deletes): an idle cluster would otherwise leave them until
        // the next write. A backlog seen ticks every interval, busy or not,
        // so a burst of expiries drains at one entry's worth per tick at
        // least (while an entry applies the check is skipped: that entry
        // deletes some itself).
        // Redis hashes whose TTL ran out, or deleted ones whose fields are
        // still stored, are removed by each entry's housekeeping (a bounded
        // number of records per entry, kvstate::redis): while some wait,
        // tick as for a backlog of expiries.
        let redis_housekeeping = kvstate::redis::housekeeping_due(
            &state_machine.engine(),
            state_machine.cluster_time_ms(),
        )
        .unwrap_or(false);
        let backlog = state_machine.expiry_backlog() == Some(true) || redis_housekeeping;
        if !idle && !backlog {
            continue;
        }
        let pending = state_machine.engine().expiry_high_water_ms();
        // Every lease expires unless renewed.
        let leases = state_machine.lease_counts().0 > 0;
        if !backlog && !leases && (pending == 0 || pending <= state_machine.cluster_time_ms()) {
            continue;
        }
        let Ok(term) = leader_caught_up(&raft).await else {
            continue;
        };
        let tick = Proposal {
            time_ms: clock.stamp(term),
            command: Command::Advance,
        };
        if let Err(err) = raft.client_write(tick).await {
            tracing::debug!(error = %err, "tick not proposed");
        }
    }
}

/// How long a peer may take to answer `Identify` at startup.
pub const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a member that does not know its cluster id or an initial
/// member's incarnation yet asks again.
pub const LEARN_IDENTITY_INTERVAL: Duration = Duration::from_secs(1);

/// Asks every other initial member who it is (concurrently, each within
/// [`IDENTIFY_TIMEOUT`]; silent members are skipped) and learns what it
/// can (see [`learn_from`]). A peer in another cluster than this
/// directory's refuses the start. Returns a member that reported an
/// existing cluster, if any.
pub(crate) async fn check_peers_cluster(
    network: &Network,
    identity: &Identity,
    initial: &BTreeMap<u64, NodeInfo>,
) -> Result<Option<(u64, u64)>, StartError> {
    let mut existing = None;
    let me = identity.member_id();
    let asks = initial
        .iter()
        .filter(|(peer, _)| **peer != me)
        .map(|(peer, info)| {
            let (network, peer, info) = (network.clone(), *peer, info.clone());
            async move { (peer, network.identify(peer, &info, IDENTIFY_TIMEOUT).await) }
        });
    for (peer, answer) in futures_join_all(asks).await {
        let Ok((theirs, member, incarnation)) = answer else {
            continue;
        };
        let mine = identity.cluster_id();
        if member == peer && theirs != 0 && mine != 0 && mine != theirs {
            return Err(StartError::ForeignCluster { peer, theirs, mine });
        }
        if member == peer && theirs != 0 {
            existing.get_or_insert((peer, theirs));
        }
        learn_from(identity, peer, (theirs, member, incarnation)).await;
    }
    Ok(existing)
}

/// Records an initial member's answer to `Identify`: its incarnation on
/// first contact and, while this member does not know one, its cluster id.
async fn learn_from(
    identity: &Identity,
    peer: u64,
    (cluster_id, member, incarnation): (u64, u64, u64),
) {
    if member != peer || incarnation == 0 {
        return;
    }
    let identity = identity.clone();
    let learned = tokio::task::spawn_blocking(move || {
        identity.learn_from_peer(peer, incarnation, cluster_id)
    })
    .await;
    if let Ok(Err(err)) = learned {
        tracing::warn!(error = %err, peer, "identify");
    }
}

/// Runs `futures` concurrently and collects their outputs in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, fut) in futures.enumerate() {
        set.spawn(async move { (i, fut.await) });
    }
    let mut out: Vec<(usize, F::Output)> = Vec::new();
    while let Some(joined) = set.join_next().await {
        if let Ok(item) = joined {
            out.push(item);
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, o)| o).collect()
}

/// Until this member knows its cluster id and every initial member's
/// incarnation, asks the ones it does not know every
/// [`LEARN_IDENTITY_INTERVAL`] (a leader's AppendEntries also teaches the
/// cluster id, and any peer request its sender's incarnation).
pub(crate) async fn learn_identities(
    network: Network,
    identity: Identity,
    state_machine: StateMachine,
    initial: BTreeMap<u64, NodeInfo>,
    mut stop: watch::Receiver<bool>,
) {
    let me = identity.member_id();
    while !identity.knows_all(initial.keys().copied()) {
        for (peer, info) in initial.iter().filter(|(peer, _)| **peer != me) {
            if identity.cluster_id() != 0 && identity.peer_incarnation(*peer) != 0 {
                continue;
            }
            if let Ok(answer) = network.identify(*peer, info, IDENTIFY_TIMEOUT).await {
                learn_from(&identity, *peer, answer).await;
            }
        }
        state_machine.set_cluster_id(identity.cluster_id());
        tokio::select! {
            _ = tokio::time::sleep(LEARN_IDENTITY_INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
