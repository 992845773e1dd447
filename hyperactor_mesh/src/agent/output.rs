//! Proc output at the agents (see [`crate::output`]).
//!
//! - A **host agent** takes its host's events in order, on one task: output
//!   lines are batched per destination (per [`BATCH_WINDOW`] or [`BATCH_LINES`] lines)
//!   and sent as [`Control::Output`]; a proc's exit first sends every pending batch,
//!   then the death reports, all from this agent to control ports, so an owner that
//!   watches the proc gets its last lines first (LOG-2).
//! - **Any agent** hands the batches it receives to its output sink
//!   ([`super::ProcAgent::set_output_sink`]); without one it prints them, prefixed,
//!   on its process's stdout and stderr.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use hyperactor::PortId;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::control::{Control, HostService};
use super::lock::{Rank, Ranked};
use super::{Inner, ProcAgent};
use crate::host::{HostEvent, ProcOutput};
use crate::output::OutputBatch;

/// How long a host agent holds output lines to batch them.
pub const BATCH_WINDOW: Duration = Duration::from_millis(10);

/// The most lines a host agent puts in one batch.
pub const BATCH_LINES: usize = 1000;

/// How long [`ProcAgent::flush_output`] waits for the host's event task.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// What an agent does with the output batches it receives.
pub type OutputSink = Arc<dyn Fn(OutputBatch) + Send + Sync>;

/// Where the output batches this agent receives go: the output component. It owns the
/// sink behind one lock, which only its methods take; the sink is called after the lock
/// is released (see [`super::lock`]).
pub(super) struct OutputForward {
    sink: Ranked<Option<OutputSink>>,
}

impl Default for OutputForward {
    fn default() -> Self {
        Self {
            sink: Ranked::new(Rank::Component),
        }
    }
}

impl OutputForward {
    /// Hands the batches to `sink` from now on.
    fn set(&self, sink: OutputSink) {
        *self.sink.lock() = Some(sink);
    }

    /// The sink, if one was set.
    fn sink(&self) -> Option<OutputSink> {
        self.sink.lock().clone()
    }
}

/// Output lines waiting to be sent, by destination and proc mesh, in arrival order.
#[derive(Debug, Default)]
struct Pending {
    batches: Vec<(PortId, OutputBatch)>,
    index: HashMap<(PortId, u64), usize>,
    lines: usize,
    since: Option<Instant>,
}

impl Pending {
    fn add(&mut self, output: ProcOutput) {
        let Some(to) = output.options.forward_to.clone() else {
            return;
        };
        self.since.get_or_insert_with(Instant::now);
        self.lines += output.lines.len();
        let key = (to.clone(), output.options.mesh_id);
        match self.index.get(&key) {
            Some(&i) => self.batches[i].1.lines.extend(output.lines),
            None => {
                self.index.insert(key, self.batches.len());
                self.batches.push((to, output.into_batch()));
            }
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.since.map(|s| s + BATCH_WINDOW)
    }

    fn take(&mut self) -> Vec<(PortId, OutputBatch)> {
        self.index.clear();
        self.lines = 0;
        self.since = None;
        std::mem::take(&mut self.batches)
    }
}

/// The flush requests of a host agent's event task.
pub(super) type FlushRequests = mpsc::UnboundedReceiver<oneshot::Sender<()>>;

/// A host agent's task over its host's events: see the [module docs](self).
pub(super) async fn run_host_events(
    service: Arc<HostService>,
    agent: Weak<Inner>,
    mut flushes: FlushRequests,
) {
    let mut pending = Pending::default();
    loop {
        let deadline = pending.deadline();
        let event = tokio::select! {
            biased;
            event = service.host().next_event() => Some(event),
            Some(done) = flushes.recv() => {
                // Everything the host put on its stream so far goes out first.
                while let Some(event) = service.host().try_next_event() {
                    let Some(agent) = agent.upgrade() else { return };
                    handle(&service, &agent, &mut pending, event);
                }
                let Some(agent) = agent.upgrade() else { return };
                send(&agent, pending.take());
                let _ = done.send(());
                continue;
            }
            () = sleep_until(deadline), if deadline.is_some() => None,
        };
        let Some(agent) = agent.upgrade() else { return };
        match event {
            Some(event) => handle(&service, &agent, &mut pending, event),
            None => send(&agent, pending.take()),
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn handle(service: &HostService, agent: &Arc<Inner>, pending: &mut Pending, event: HostEvent) {
    match event {
        HostEvent::Output(output) => {
            pending.add(output);
            if pending.lines >= BATCH_LINES {
                send(agent, pending.take());
            }
        }
        HostEvent::Exit(exit) => {
            // LOG-2: the proc's last lines before its death report.
            send(agent, pending.take());
            service.on_exit(agent, exit);
        }
    }
}

fn send(agent: &Inner, batches: Vec<(PortId, OutputBatch)>) {
    for (to, batch) in batches {
        agent.send_control_to(to, &Control::Output(batch));
    }
}

impl HostService {
    /// Sends every output line its host has read so far (bounded by a timeout).
    pub(super) async fn flush_output(&self) {
        let (done, wait) = oneshot::channel();
        if self.flush_requests.send(done).is_ok() {
            let _ = tokio::time::timeout(FLUSH_LIMIT, wait).await;
        }
    }
}

impl Inner {
    /// A batch of output arrived (on the delivering task).
    pub(super) fn on_output(&self, batch: OutputBatch) {
        self.keep_output(&batch);
        let sink = self.output.sink();
        match sink {
            Some(sink) => sink(batch),
            None => batch.write_to_terminal(),
        }
    }
}

impl Inner {
    /// Keeps `batch`'s lines in the logs ring (see [`crate::monitor::logs`]), each with
    /// the id of the proc that wrote it when this process spawned it.
    fn keep_output(&self, batch: &OutputBatch) {
        let procs = self.supervisor.mesh_procs(batch.mesh_id);
        let time = crate::monitor::unix_now();
        crate::monitor::logs::record(batch.lines.iter().map(|line| {
            let proc = procs
                .get(line.rank)
                .cloned()
                .unwrap_or_else(|| format!("{}[{}]", batch.mesh, line.rank));
            crate::monitor::LogRecord {
                time,
                proc,
                rank: line.rank,
                stream: match line.stream {
                    crate::output::OutputStream::Stdout => "stdout",
                    crate::output::OutputStream::Stderr => "stderr",
                }
                .to_string(),
                line: line.text.trim_end_matches('\n').to_string(),
            }
        }));
    }
}

impl ProcAgent {
    /// Hands the output batches this agent receives (the output of procs spawned from
    /// this process) to `sink` from now on, instead of printing them on this process's
    /// stdout and stderr. The sink runs on the task that delivers each batch: it must
    /// not block.
    pub fn set_output_sink(&self, sink: OutputSink) {
        self.inner.output.set(sink);
    }

    /// Sends on the output lines this host agent's host has read so far (pending
    /// batches are not held for the rest of their window); returns once they are sent,
    /// or after two seconds. Does nothing on an agent without a host.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the flush goes on.
    pub async fn flush_output(&self) {
        if let Some(host) = &self.inner.host {
            host.flush_output().await;
        }
    }
}
