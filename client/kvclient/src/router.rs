//! Where each attempt goes: the known members (with a lazily opened gRPC
//! channel each and a "recently failed" mark), the cached leader (refreshed
//! from not-leader hints), round-robin over healthy members for reads, and
//! the bounded retry loop with exponential backoff and jitter that every
//! call runs through.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;
use tonic::Status;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::builder::Settings;
use crate::error::{Error, Result, Verdict, classify};

/// How long a member that failed at the transport level is skipped when
/// another one can be tried.
pub const UNHEALTHY_PAUSE: Duration = Duration::from_secs(1);
/// Upper bound on the members the client remembers (given plus learned from
/// not-leader hints).
pub const MEMBERS_MAX: usize = 1024;

/// A member's channel as the calls use it: the bearer token, when set, is
/// added to every request.
pub(crate) type Channel = InterceptedService<tonic::transport::Channel, Auth>;

/// Adds `authorization: Bearer <token>` to each request (nothing without
/// a token).
#[derive(Clone, Debug)]
pub(crate) struct Auth {
    header: Option<AsciiMetadataValue>,
}

impl tonic::service::Interceptor for Auth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

/// A backoff pause jittered between half and all of `backoff`.
pub(crate) fn jittered(backoff: Duration) -> Duration {
    let half = backoff / 2;
    half + rand::rng().random_range(Duration::ZERO..=half)
}

/// Which member an attempt needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The leader (writes, membership).
    Leader,
    /// Any healthy member, round-robin (reads).
    Any,
    /// The member at this index of the list (a watch's first member).
    Member(usize),
}

#[derive(Debug)]
struct Member {
    addr: String,
    channel: Option<Channel>,
    unhealthy_until: Option<Instant>,
}

#[derive(Debug)]
struct Members {
    list: Vec<Member>,
    leader: Option<String>,
}

/// Members, leader cache and the retry loop.
#[derive(Debug)]
pub(crate) struct Router {
    settings: Settings,
    /// Channel TLS (from the settings, checked by the builder).
    tls: Option<ClientTlsConfig>,
    auth: Auth,
    members: Mutex<Members>,
    next_any: AtomicUsize,
    next_probe: AtomicUsize,
}

impl Router {
    pub(crate) fn new(settings: Settings) -> Self {
        let list = settings
            .endpoints
            .iter()
            .map(|addr| Member {
                addr: addr.clone(),
                channel: None,
                unhealthy_until: None,
            })
            .collect();
        // The builder checked both; a failure here leaves plain settings
        // that the first call reports.
        let tls = (settings.tls.as_ref()).and_then(|tls| tls.channel_config().ok());
        let header = (settings.token.as_ref())
            .and_then(|token| MetadataValue::try_from(format!("Bearer {}", token.0)).ok());
        Router {
            tls,
            auth: Auth { header },
            settings,
            members: Mutex::new(Members { list, leader: None }),
            next_any: AtomicUsize::new(0),
            next_probe: AtomicUsize::new(0),
        }
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached leader's address, if any.
    pub(crate) fn leader(&self) -> Option<String> {
        self.lock().leader.clone()
    }

    /// Records `addr` as the leader (learning it as a member if new).
    pub(crate) fn set_leader(&self, addr: &str) {
        let mut members = self.lock();
        if !members.list.iter().any(|m| m.addr == addr) && members.list.len() < MEMBERS_MAX {
            members.list.push(Member {
                addr: addr.to_string(),
                channel: None,
                unhealthy_until: None,
            });
        }
        members.leader = Some(addr.to_string());
    }

    fn forget_leader(&self, addr: &str) {
        let mut members = self.lock();
        if members.leader.as_deref() == Some(addr) {
            members.leader = None;
        }
    }

    /// Takes what a failed attempt on `addr` says about the members: a
    /// leader hint is followed, a member that is not the leader (or failed)
    /// is forgotten as the leader, one that failed at the transport level is
    /// skipped for a while. Whether to back off before the next attempt
    /// (not when a hint names another member to try at once).
    pub(crate) fn learn(&self, addr: &str, verdict: &Verdict) -> bool {
        match verdict {
            Verdict::NotLeader(Some(leader)) if leader != addr => {
                self.set_leader(leader);
                false
            }
            Verdict::NotLeader(_) => {
                self.forget_leader(addr);
                true
            }
            Verdict::MaybeApplied | Verdict::Unreachable => {
                self.forget_leader(addr);
                self.mark(addr, false);
                true
            }
            Verdict::Retry => true,
            Verdict::Fatal(_) => false,
        }
    }

    pub(crate) fn mark(&self, addr: &str, healthy: bool) {
        let mut members = self.lock();
        if let Some(m) = members.list.iter_mut().find(|m| m.addr == addr) {
            m.unhealthy_until = (!healthy).then(|| Instant::now() + UNHEALTHY_PAUSE);
        }
    }

    /// The member for the next attempt and its channel.
    pub(crate) fn pick(&self, target: Target) -> Result<(String, Channel)> {
        let mut members = self.lock();
        let index = match (target, members.leader.clone()) {
            (Target::Leader, Some(leader)) => members.list.iter().position(|m| m.addr == leader),
            (Target::Member(index), _) if index < members.list.len() => Some(index),
            _ => None,
        };
        let index = match index {
            Some(index) => index,
            None => {
                let counter = match target {
                    Target::Leader => &self.next_probe,
                    Target::Any | Target::Member(_) => &self.next_any,
                };
                let now = Instant::now();
                let len = members.list.len();
                let start = counter.fetch_add(1, Ordering::Relaxed);
                (0..len)
                    .map(|i| (start + i) % len)
                    .find(|&i| members.list[i].unhealthy_until.is_none_or(|t| t <= now))
                    .unwrap_or(start % len)
            }
        };
        let member = &mut members.list[index];
        let channel = match &member.channel {
            Some(channel) => channel.clone(),
            None => {
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", member.addr))
                    .map_err(|err| {
                        Error::InvalidConfig(format!("endpoint {:?}: {err}", member.addr))
                    })?
                    .connect_timeout(self.settings.connect_timeout)
                    .tcp_nodelay(true);
                if let Some(tls) = &self.tls {
                    endpoint = endpoint.tls_config(tls.clone()).map_err(|err| {
                        Error::InvalidConfig(format!("endpoint {:?} tls: {err}", member.addr))
                    })?;
                }
                let channel = InterceptedService::new(endpoint.connect_lazy(), self.auth.clone());
                member.channel = Some(channel.clone());
                channel
            }
        };
        Ok((member.addr.clone(), channel))
    }

    /// `addr`'s channel, learning it as a member if new (a watch started
    /// on a member of the caller's choice).
    pub(crate) fn channel_to(&self, addr: &str) -> Result<(String, Channel)> {
        let index = {
            let mut members = self.lock();
            match members.list.iter().position(|m| m.addr == addr) {
                Some(index) => index,
                None if members.list.len() < MEMBERS_MAX => {
                    members.list.push(Member {
                        addr: addr.to_string(),
                        channel: None,
                        unhealthy_until: None,
                    });
                    members.list.len() - 1
                }
                None => {
                    return Err(Error::InvalidConfig(format!(
                        "{addr}: the client knows {MEMBERS_MAX} members (the limit MEMBERS_MAX)"
                    )));
                }
            }
        };
        self.pick(Target::Member(index))
    }

    /// Runs `call` against `target` until it answers, a fatal error comes,
    /// or the retry budget (attempts, operation timeout) is spent. `write`:
    /// the call changes state, so an attempt that may have reached the
    /// leader makes a later failure "outcome unknown", never a failure.
    pub(crate) async fn run<T, F, Fut>(&self, target: Target, write: bool, call: F) -> Result<T>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let s = &self.settings;
        self.run_for(target, write, s.request_timeout, s.operation_timeout, call)
            .await
    }

    /// [`Router::run`] with this call's own per-attempt and overall
    /// timeouts (for calls the server may legitimately hold long).
    pub(crate) async fn run_for<T, F, Fut>(
        &self,
        target: Target,
        write: bool,
        request_timeout: Duration,
        operation_timeout: Duration,
        mut call: F,
    ) -> Result<T>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let s = &self.settings;
        let started = Instant::now();
        let mut maybe_applied = false;
        let mut last = String::from("no attempt made");
        let mut backoff = s.backoff_base;
        let mut attempts = 0;
        while attempts < s.attempts {
            let Some(remaining) = operation_timeout.checked_sub(started.elapsed()) else {
                break;
            };
            attempts += 1;
            let (addr, channel) = self.pick(target)?;
            let limit = request_timeout.min(remaining);
            let status = match tokio::time::timeout(limit, call(channel)).await {
                Ok(Ok(response)) => {
                    self.mark(&addr, true);
                    if target == Target::Leader {
                        self.set_leader(&addr);
                    }
                    return Ok(response.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!("no answer within {limit:?}")),
            };
            last = format!("{addr}: {:?}: {}", status.code(), status.message());
            let verdict = classify(&status);
            if let Verdict::Fatal(err) = verdict {
                if maybe_applied && !matches!(err, Error::OutcomeUnknown { .. }) {
                    return Err(Error::OutcomeUnknown {
                        message: format!("an earlier attempt may have applied; then: {err}"),
                    });
                }
                return Err(err);
            }
            maybe_applied |= write && matches!(verdict, Verdict::MaybeApplied);
            if self.learn(&addr, &verdict) {
                let sleep =
                    jittered(backoff).min(operation_timeout.saturating_sub(started.elapsed()));
                tokio::time::sleep(sleep).await;
                backoff = (backoff * 2).min(s.backoff_cap);
            }
        }
        if maybe_applied {
            Err(Error::OutcomeUnknown {
                message: format!("retry budget spent after {attempts} attempts; last: {last}"),
            })
        } else {
            Err(Error::Unavailable {
                attempts,
                message: last,
            })
        }
    }
}
