//! The sim host processes as the driver sees them: starting them, and reading their
//! CPU time (by thread label: "hosts", "level1", ..., "other", plus the client's) and
//! their memory.

use std::collections::BTreeMap;
use std::time::Duration;

use hyperactor::ProcId;
use tokio::io::AsyncBufReadExt;

use crate::actor::Res;
use crate::options::Options;
use crate::procfs::{process_cpu_ns, rss_kib, thread_cpu_ns};

/// A sim host process as the driver sees it.
pub(crate) struct Sim {
    pub(crate) child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) stdin: tokio::process::ChildStdin,
    pub(crate) lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// Its threads: "hosts", "level1", ...
    pub(crate) threads: Vec<(String, u32)>,
}

impl Sim {
    fn cpu_by_label(&self) -> BTreeMap<String, u64> {
        let mut by = BTreeMap::new();
        for (label, tid) in &self.threads {
            *by.entry(label.clone()).or_insert(0) += thread_cpu_ns(self.pid, *tid);
        }
        let total = process_cpu_ns(self.pid);
        let known: u64 = by.values().sum();
        by.insert("other".to_string(), total.saturating_sub(known));
        by
    }
}

/// CPU time by thread label, summed over every sim host process, plus the client's.
pub(crate) fn cpu_snapshot(sims: &[Sim]) -> BTreeMap<String, u64> {
    let mut by = BTreeMap::new();
    for sim in sims {
        for (label, ns) in sim.cpu_by_label() {
            *by.entry(label).or_insert(0) += ns;
        }
    }
    by.insert("client".to_string(), process_cpu_ns(std::process::id()));
    by
}

pub(crate) fn cpu_delta(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

pub(crate) async fn start_sims(opts: &Options) -> Res<(Vec<Sim>, Vec<ProcId>)> {
    let exe = std::env::current_exe()?;
    let per_sim = opts.hosts.div_ceil(opts.sim_procs);
    let mut sims = Vec::new();
    let mut hosts: Vec<Option<ProcId>> = vec![None; opts.hosts];
    let mut first = 0;
    while first < opts.hosts {
        let count = per_sim.min(opts.hosts - first);
        let mut child = tokio::process::Command::new(&exe)
            .args([
                "--sim-host".to_string(),
                "--first-host".to_string(),
                first.to_string(),
                "--hosts".to_string(),
                count.to_string(),
                "--total-hosts".to_string(),
                opts.hosts.to_string(),
                "--per-host".to_string(),
                opts.per_host.to_string(),
                "--fanout".to_string(),
                opts.fanout.to_string(),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("a sim host exited at once")?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        sims.push(Sim {
            child,
            pid,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
            threads: Vec::new(),
        });
        first += count;
    }
    for sim in &mut sims {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(120), sim.lines.next_line())
                .await
                .map_err(|_| format!("sim host {} did not start within 120 s", sim.pid))??
                .ok_or_else(|| format!("sim host {} exited while starting", sim.pid))?;
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["host", index, id] => {
                    let index: usize = index.parse()?;
                    hosts[index] = Some(id.parse()?);
                }
                ["thread", label, tid] => sim.threads.push((label.to_string(), tid.parse()?)),
                ["ready"] => break,
                _ => eprintln!("sim host {}: {line}", sim.pid),
            }
        }
    }
    let hosts = hosts
        .into_iter()
        .enumerate()
        .map(|(i, h)| h.ok_or_else(|| format!("no sim host reported host {i}").into()))
        .collect::<Res<Vec<ProcId>>>()?;
    Ok((sims, hosts))
}

pub(crate) fn sims_rss_mib(sims: &[Sim]) -> f64 {
    sims.iter().map(|s| rss_kib(s.pid)).sum::<u64>() as f64 / 1024.0
}
