//! Host liveness: heartbeats between an agent and the hosts of the procs it uses, and
//! leases on the procs a host spawned for a client on another machine.
//!
//! An agent that casts to procs of a host, or spawned procs there, **monitors** that
//! host (never its own proc): every [`Liveness::interval`] it sends the host agent a
//! [`Control::Heartbeat`], which the host answers with [`Control::HeartbeatAck`]. The
//! host is given up for lost when
//!
//! - no answer came for [`Liveness::timeout`] (a host whose network was cut, or whose
//!   agent is frozen: TCP connections go silent, they are not reset), or
//! - the connection to it failed and a new one failed too before any answer (a host
//!   agent that was killed: its socket refuses connections at once).
//!
//! Then every proc of that host this agent knows of is recorded dead ("its host ... was
//! lost: ..."), as if its host had reported it: calls waiting on it fail at once and the
//! owners of meshes on it get a failure (LIVE-1). The procs this agent owns there are
//! also told to exit ([`Control::Abandon`]), so that a proc of a frozen host does not
//! keep running unseen; a host that comes back is monitored afresh when used again.
//!
//! A lost host is remembered as lost until then: stopping procs there and ending it
//! ([`super::ProcAgent::end_host`]) do not wait for an answer from it, and a wait for
//! one ends as soon as the host is found lost (LIVE-3), so a host that stops answering
//! holds them up for at most [`Liveness::timeout`].
//!
//! On the host side, a heartbeat renews the **lease** of the sender's proc. When a proc
//! that owns procs of this host, but is not one of them (a client on another machine),
//! sends no heartbeat for [`Liveness::lease`], the host kills the procs it owns there
//! (LIVE-2): a client that dies or is cut off leaves no orphans behind, and the host
//! serves the next client.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hyperactor::{PortId, ProcId};

use super::control::HostService;
use super::lock::{Rank, Ranked};
use super::{Control, Inner};
use crate::supervision::{ProcDeath, ProcEnd};

/// Default [`Liveness::interval`].
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(250);
/// Default [`Liveness::timeout`].
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default [`Liveness::lease`].
pub const DEFAULT_CLIENT_LEASE: Duration = Duration::from_secs(10);

/// The timing of heartbeats and leases (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// How often an agent sends a heartbeat to each host it monitors.
    pub interval: Duration,
    /// How long a host may leave heartbeats unanswered before it is lost.
    pub timeout: Duration,
    /// How long a host keeps the procs of a client that sends no heartbeat.
    pub lease: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            interval: DEFAULT_HEARTBEAT_INTERVAL,
            timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            lease: DEFAULT_CLIENT_LEASE,
        }
    }
}

/// The hosts an agent monitors, and those it gave up for lost or asked to end: the host
/// liveness component. It owns its state behind one lock, which only its methods take;
/// none calls anything else while holding it (see [`super::lock`]).
pub(super) struct HostLiveness {
    config: Liveness,
    state: Ranked<HostsState>,
    /// Bumped after each host loss, for those who wait on one.
    lost_events: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct HostsState {
    /// Hosts this agent monitors, and when each last answered a heartbeat.
    monitored: HashMap<ProcId, Instant>,
    /// Hosts given up for lost, and why, until they are monitored afresh (see the
    /// [module docs](self)): stopping and ending never wait on them.
    lost: HashMap<ProcId, String>,
    /// Hosts asked to end ([`super::ProcAgent::end_host`]), until monitored afresh:
    /// their loss fails none of their procs.
    ending: HashSet<ProcId>,
}

impl HostLiveness {
    pub(super) fn new(config: Liveness) -> Self {
        Self {
            config,
            state: Ranked::new(Rank::Component),
            lost_events: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The timing of heartbeats and leases.
    pub(super) fn config(&self) -> Liveness {
        self.config
    }

    /// Starts monitoring `host`; false if it is monitored already. Monitored afresh, a
    /// host lost before (or ended) is in use again.
    fn start_monitoring(&self, host: &ProcId) -> bool {
        let mut state = self.state.lock();
        if state.monitored.contains_key(host) {
            return false;
        }
        state.lost.remove(host);
        state.ending.remove(host);
        state.monitored.insert(host.clone(), Instant::now());
        true
    }

    /// Stops monitoring `host`.
    fn stop_monitoring(&self, host: &ProcId) {
        self.state.lock().monitored.remove(host);
    }

    /// `host` answered a heartbeat (if it is monitored).
    fn acked(&self, host: &ProcId) {
        if let Some(at) = self.state.lock().monitored.get_mut(host) {
            *at = Instant::now();
        }
    }

    /// When `host` last answered, if it is monitored.
    fn last_ack(&self, host: &ProcId) -> Option<Instant> {
        self.state.lock().monitored.get(host).copied()
    }

    /// When each monitored host last answered.
    pub(super) fn acks(&self) -> HashMap<ProcId, Instant> {
        self.state.lock().monitored.clone()
    }

    /// The hosts monitored or given up for lost.
    pub(super) fn known_hosts(&self) -> Vec<ProcId> {
        let state = self.state.lock();
        state
            .monitored
            .keys()
            .chain(state.lost.keys())
            .cloned()
            .collect()
    }

    /// Why `host` was given up for lost, if it was (and is not monitored afresh since).
    pub(super) fn lost_reason(&self, host: &ProcId) -> Option<String> {
        self.state.lock().lost.get(host).cloned()
    }

    /// `host` is asked to end: its loss fails none of its procs.
    pub(super) fn mark_ending(&self, host: &ProcId) {
        self.state.lock().ending.insert(host.clone());
    }

    /// Whether `host` was asked to end.
    pub(super) fn is_ending(&self, host: &ProcId) -> bool {
        self.state.lock().ending.contains(host)
    }

    /// Records `host` as lost (`reason`) and wakes those who wait for it.
    fn record_lost(&self, host: &ProcId, reason: &str) {
        self.state
            .lock()
            .lost
            .insert(host.clone(), reason.to_string());
        self.lost_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Completes, with the reason, once `host` is given up for lost (at once if it is).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(super) async fn lost_wait(&self, host: &ProcId) -> String {
        let mut events = self.lost_events.subscribe();
        loop {
            if let Some(why) = self.lost_reason(host) {
                return why;
            }
            if events.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

impl Inner {
    /// Starts monitoring `host` (once; never this agent's own proc).
    pub(super) fn monitor_host(self: &Arc<Self>, host: &ProcId) {
        if host == self.proc.proc_id() {
            return;
        }
        if !self.liveness.start_monitoring(host) {
            return;
        }
        tokio::spawn(monitor(Arc::downgrade(self), host.clone()));
    }

    fn send_heartbeat(&self, host: &ProcId) {
        self.send_control(
            host,
            &Control::Heartbeat {
                from: self.id.port_id(super::CONTROL_PORT),
            },
        );
    }

    pub(super) fn on_heartbeat(&self, from: PortId) {
        if let Some(host) = &self.host {
            host.renew_lease(from.actor().proc_id(), self.proc.proc_id());
        }
        self.send_control_to(
            from,
            &Control::HeartbeatAck {
                proc: self.proc.proc_id().clone(),
            },
        );
    }

    pub(super) fn on_heartbeat_ack(&self, proc: &ProcId) {
        self.liveness.acked(proc);
    }

    pub(super) fn on_abandon(&self, reason: &str, from: &hyperactor::ActorId) {
        if self.spawned_by.is_none() {
            tracing::warn!(agent = %self.id, "ignoring a request from {from} to exit: this proc has no host");
            return;
        }
        tracing::error!(agent = %self.id, "exiting: {reason} (as {from} said)");
        // SAFETY: _exit ends the process at once, which is the point: its host is gone
        // and nothing of it may keep running.
        unsafe { libc::_exit(75) };
    }

    /// Stops monitoring `host` (its monitor task ends at its next tick).
    pub(super) fn unmonitor_host(&self, host: &ProcId) {
        self.liveness.stop_monitoring(host);
    }

    /// Why `host` was given up for lost, if it was (and is not monitored afresh since).
    pub(super) fn lost_reason(&self, host: &ProcId) -> Option<String> {
        self.liveness.lost_reason(host)
    }

    /// Completes, with the reason, once `host` is given up for lost (at once if it is).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(super) async fn host_lost_wait(&self, host: &ProcId) -> String {
        self.liveness.lost_wait(host).await
    }

    /// `host` is lost: every proc of it that this agent knows of is dead (LIVE-1),
    /// unless the host is being ended (then its procs are being stopped, not failed).
    fn host_lost(self: &Arc<Self>, host: &ProcId, reason: &str) {
        self.unmonitor_host(host);
        if self.liveness.is_ending(host) {
            tracing::info!(agent = %self.id, "host {host}, which was asked to end, is lost ({reason})");
            self.liveness.record_lost(host, reason);
            return;
        }
        // (proc, pid, owned here): only an owner tells its procs to exit.
        let mut procs = self.supervisor.procs_of_host(host);
        procs.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.cmp(&a.2)));
        procs.dedup_by(|a, b| a.0 == b.0);
        tracing::warn!(agent = %self.id, "host {host} is lost ({reason}); {} of its procs are failed", procs.len());
        let mut event = crate::monitor::Event::new(
            "host_lost",
            format!(
                "host {host} is lost ({reason}); {} of its procs are failed",
                procs.len()
            ),
        );
        event.host = Some(host.to_string());
        event.class = Some("infrastructure".to_string());
        event.cause = vec![reason.to_string()];
        crate::monitor::events::record(event);
        let why = format!("its host {host} was lost: {reason}");
        for (proc, pid, owned) in procs {
            if self.supervisor.is_confirmed_dead(&proc) {
                continue;
            }
            if owned {
                let abandon = Control::Abandon {
                    reason: why.clone(),
                };
                self.send_control(&proc, &abandon);
            }
            self.on_proc_died(ProcDeath {
                proc_id: proc,
                pid,
                end: ProcEnd::Lost {
                    reason: why.clone(),
                },
                expected: false,
            });
        }
        // Recorded last: whoever sees the host lost sees its procs' deaths handled.
        self.liveness.record_lost(host, reason);
    }
}

/// The monitor of one host (see the [module docs](self)).
async fn monitor(weak: Weak<Inner>, host: ProcId) {
    let (proc, liveness) = match weak.upgrade() {
        Some(inner) => (inner.proc.clone(), inner.liveness.config()),
        None => return,
    };
    let mut ticker = tokio::time::interval(liveness.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the connection failed, and the last answer seen then.
    let mut broken: Option<Instant> = None;
    loop {
        let failed = tokio::select! {
            _ = ticker.tick() => None,
            error = proc.link_failed(&host) => Some(error),
        };
        let Some(inner) = weak.upgrade() else { return };
        // Not monitored any more: this monitor ends.
        let Some(last_ack) = inner.liveness.last_ack(&host) else {
            return;
        };
        if let Some(error) = failed {
            match broken {
                // A second failure with no answer since the first: it is gone.
                Some(at) if last_ack <= at => {
                    return inner.host_lost(&host, &format!("its connection failed: {error}"));
                }
                _ => {
                    broken = Some(Instant::now());
                    inner.send_heartbeat(&host);
                    continue;
                }
            }
        }
        if last_ack.elapsed() > liveness.timeout {
            return inner.host_lost(
                &host,
                &format!(
                    "it answered no heartbeat for {:?} (its network may be cut, or its \
                     agent frozen)",
                    liveness.timeout
                ),
            );
        }
        inner.send_heartbeat(&host);
    }
}

impl HostService {
    /// `client` (a proc) showed it is alive; if it is not one of this host's procs and
    /// owns procs here, its lease starts or is renewed.
    pub(super) fn renew_lease(&self, client: &ProcId, host: &ProcId) {
        if client == host {
            return;
        }
        let mut state = self.state.lock();
        if state.handles.contains_key(client) {
            return;
        }
        state.leases.insert(client.clone(), Instant::now());
    }

    /// Starts the task that kills the procs of clients whose lease ran out (LIVE-2).
    pub(super) fn start_leases(self: &Arc<Self>, lease: Duration) {
        let service = Arc::downgrade(self);
        let period = (lease / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            loop {
                ticker.tick().await;
                let Some(service) = service.upgrade() else {
                    return;
                };
                let doomed = {
                    let mut state = service.state.lock();
                    let expired: Vec<ProcId> = state
                        .leases
                        .iter()
                        .filter(|(_, at)| at.elapsed() > lease)
                        .map(|(p, _)| p.clone())
                        .collect();
                    let mut doomed = Vec::new();
                    for client in expired {
                        state.leases.remove(&client);
                        for (proc, owner) in &state.owners {
                            if owner.proc_id() == &client {
                                if let Some(handle) = state.handles.get(proc) {
                                    doomed.push((client.clone(), handle.clone()));
                                }
                            }
                        }
                    }
                    doomed
                };
                for (client, handle) in doomed {
                    let reason = format!(
                        "its owner's proc {client} sent no heartbeat for {lease:?} (the \
                         client went away)"
                    );
                    if handle.kill_lost(reason) {
                        tracing::warn!(
                            "killed proc {} of client {client}: its lease ran out",
                            handle.proc_id()
                        );
                    }
                }
            }
        });
    }
}
