//! `GET /metrics`: a snapshot and the event counts as Prometheus text format 0.0.4
//! (spec section 3).

use std::collections::BTreeMap;
use std::fmt::Write;

use hyperactor_mesh::monitor::{
    ActorRecord, Event, GpuRecord, HostRecord, ProcRecord, ProcStatus, Snapshot,
};

/// The event kinds always reported by `monarch_events_total`, even at 0.
const EVENT_KINDS: [&str; 7] = [
    "mesh_spawned",
    "mesh_stopped",
    "actor_failed",
    "proc_exited",
    "proc_lost",
    "host_lost",
    "breakpoint",
];

/// Writes `value` as a label value: `\`, `"` and newlines escaped.
fn escape_into(out: &mut String, value: &str) {
    if !value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Writes a sample value as the format writes floats.
fn write_number(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value == value.trunc() && value.abs() < 1e15 {
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

/// A sample value as the format writes floats.
fn number(value: f64) -> String {
    let mut out = String::new();
    write_number(&mut out, value);
    out
}

/// An optional field as a label value: printed, or empty when there is none.
fn label_text<T: ToString>(value: Option<&T>) -> String {
    value.map_or_else(String::new, ToString::to_string)
}

/// A family computed per record: name, type, help, and the value of one record.
type Family<R> = (&'static str, &'static str, &'static str, fn(&R) -> f64);
/// A gauge family: name, help, and the value of one record.
type Gauge<R> = (&'static str, &'static str, fn(&R) -> f64);
/// Endpoint histograms by (mesh, class, endpoint): buckets, sum in seconds, count.
type Histograms<'a> = BTreeMap<(&'a str, &'a str, &'a str), (Vec<u64>, f64, u64)>;

struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (key, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(key);
                self.out.push_str("=\"");
                escape_into(&mut self.out, val);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        write_number(&mut self.out, value);
        self.out.push('\n');
    }
}

/// Renders `snapshot` and `events` (for the per-kind counts) as Prometheus text
/// format 0.0.4 (spec section 3). Every family has HELP and TYPE.
pub fn render_metrics(snapshot: &Snapshot, events: &[Event]) -> String {
    let mut w = Writer {
        out: String::with_capacity(64 * 1024),
    };
    let actors = &snapshot.actors;
    let procs = &snapshot.procs;
    let hosts = &snapshot.hosts;
    let mesh_names: BTreeMap<&str, &str> = snapshot
        .meshes
        .iter()
        .map(|m| (m.id.as_str(), m.name.as_str()))
        .collect();
    let actor_labels: Vec<[String; 4]> = actors
        .iter()
        .map(|a| {
            let mesh = match a.mesh.as_deref() {
                None => a.name.clone(),
                Some(id) => mesh_names.get(id).copied().unwrap_or(id).to_string(),
            };
            [
                mesh,
                label_text(a.class.as_ref()),
                label_text(a.rank.as_ref()),
                a.id.clone(),
            ]
        })
        .collect();

    let per_actor: [Family<ActorRecord>; 4] = [
        (
            "monarch_actor_messages_total",
            "counter",
            "Messages handled by the actor.",
            |a| a.handled as f64,
        ),
        (
            "monarch_actor_errors_total",
            "counter",
            "Messages whose handler failed.",
            |a| a.errors as f64,
        ),
        (
            "monarch_actor_busy_seconds_total",
            "counter",
            "Time spent in handlers, in seconds.",
            |a| a.busy_ms / 1000.0,
        ),
        (
            "monarch_actor_queue_depth",
            "gauge",
            "Messages waiting in the actor's queue.",
            |a| a.queue as f64,
        ),
    ];
    for (name, kind, help, value) in per_actor {
        w.family(name, kind, help);
        for (actor, l) in actors.iter().zip(&actor_labels) {
            let labels = [
                ("mesh", l[0].as_str()),
                ("class", &l[1]),
                ("rank", &l[2]),
                ("actor", &l[3]),
            ];
            w.sample(name, &labels, value(actor));
        }
    }

    // Endpoint histograms, summed over ranks per (mesh, class, endpoint).
    let bounds: Vec<f64> = snapshot
        .bucket_bounds_us
        .iter()
        .map(|&b| b as f64 / 1e6)
        .collect();
    let mut histograms: Histograms = BTreeMap::new();
    for (actor, l) in actors.iter().zip(&actor_labels) {
        for (endpoint, stats) in &actor.endpoints {
            let entry = histograms
                .entry((l[0].as_str(), l[1].as_str(), endpoint.as_str()))
                .or_insert_with(|| (vec![0; bounds.len() + 1], 0.0, 0));
            for (slot, count) in entry.0.iter_mut().zip(&stats.buckets) {
                *slot += count;
            }
            entry.1 += stats.total_ms / 1000.0;
            entry.2 += stats.count;
        }
    }
    let name = "monarch_endpoint_duration_seconds";
    w.family(
        name,
        "histogram",
        "Handler durations per endpoint, summed over ranks.",
    );
    let les: Vec<String> = bounds.iter().map(|b| number(*b)).collect();
    for ((mesh, class, endpoint), (buckets, sum, count)) in &histograms {
        // `+Inf` and `_count` are the buckets' total, so the family is consistent even
        // if a source's count and buckets disagree.
        let total: u64 = buckets.iter().sum();
        let count = if total == 0 { *count } else { total };
        let mut cumulative = 0;
        for (i, le) in les.iter().enumerate() {
            cumulative += buckets.get(i).copied().unwrap_or(0);
            let labels = [
                ("mesh", *mesh),
                ("class", class),
                ("endpoint", endpoint),
                ("le", le),
            ];
            w.sample(
                "monarch_endpoint_duration_seconds_bucket",
                &labels,
                cumulative as f64,
            );
        }
        let labels = [("mesh", *mesh), ("class", class), ("endpoint", endpoint)];
        let inf = [
            ("mesh", *mesh),
            ("class", class),
            ("endpoint", endpoint),
            ("le", "+Inf"),
        ];
        w.sample(
            "monarch_endpoint_duration_seconds_bucket",
            &inf,
            count as f64,
        );
        w.sample("monarch_endpoint_duration_seconds_sum", &labels, *sum);
        w.sample(
            "monarch_endpoint_duration_seconds_count",
            &labels,
            count as f64,
        );
    }

    let proc_labels: Vec<[String; 4]> = procs
        .iter()
        .map(|p| {
            [
                p.id.clone(),
                label_text(p.host.as_ref()),
                label_text(p.mesh.as_ref()),
                label_text(p.rank.as_ref()),
            ]
        })
        .collect();
    let per_proc: [Family<ProcRecord>; 7] = [
        (
            "monarch_proc_up",
            "gauge",
            "1 while the proc runs, else 0.",
            |p| f64::from(u8::from(p.status == ProcStatus::Running)),
        ),
        (
            "monarch_proc_resident_memory_bytes",
            "gauge",
            "Resident memory of the proc's process.",
            |p| p.rss as f64,
        ),
        (
            "monarch_proc_cpu_seconds_total",
            "counter",
            "CPU time of the proc's process, in seconds.",
            |p| p.cpu_s,
        ),
        (
            "monarch_proc_threads",
            "gauge",
            "Threads of the proc's process.",
            |p| p.threads as f64,
        ),
        (
            "monarch_proc_link_sent_bytes_total",
            "counter",
            "Bytes the proc sent over its links.",
            |p| p.link_sent as f64,
        ),
        (
            "monarch_proc_link_received_bytes_total",
            "counter",
            "Bytes the proc received over its links.",
            |p| p.link_received as f64,
        ),
        (
            "monarch_proc_log_lines_dropped_total",
            "counter",
            "Log lines of the proc dropped on the way to the client.",
            |p| p.log_lines_dropped as f64,
        ),
    ];
    for (name, kind, help, value) in per_proc {
        w.family(name, kind, help);
        for (proc, l) in procs.iter().zip(&proc_labels) {
            let labels = [
                ("proc", l[0].as_str()),
                ("host", &l[1]),
                ("mesh", &l[2]),
                ("rank", &l[3]),
            ];
            w.sample(name, &labels, value(proc));
        }
    }

    let per_host: [Gauge<HostRecord>; 3] = [
        ("monarch_host_load1", "Load average over one minute.", |h| {
            h.load[0]
        }),
        (
            "monarch_host_memory_available_bytes",
            "Memory available on the host.",
            |h| h.mem_available as f64,
        ),
        (
            "monarch_host_heartbeat_age_seconds",
            "Seconds since the host's last heartbeat.",
            |h| h.heartbeat_age_ms.unwrap_or(0.0) / 1000.0,
        ),
    ];
    for (name, help, value) in per_host {
        w.family(name, "gauge", help);
        for host in hosts {
            w.sample(name, &[("host", &host.id)], value(host));
        }
    }

    let per_gpu: [Gauge<GpuRecord>; 2] = [
        ("monarch_gpu_memory_used_bytes", "GPU memory in use.", |g| {
            g.mem_used as f64
        }),
        (
            "monarch_gpu_utilization_ratio",
            "GPU utilization, 0 to 1.",
            |g| g.util_pct / 100.0,
        ),
    ];
    for (name, help, value) in per_gpu {
        w.family(name, "gauge", help);
        for host in hosts {
            for gpu in &host.gpus {
                let labels = [("host", host.id.as_str()), ("gpu", &gpu.index.to_string())];
                w.sample(name, &labels, value(gpu));
            }
        }
    }

    let mut kinds: BTreeMap<&str, u64> = EVENT_KINDS.iter().map(|&k| (k, 0)).collect();
    for event in events {
        *kinds.entry(event.kind.as_str()).or_insert(0) += 1;
    }
    w.family(
        "monarch_events_total",
        "counter",
        "Events of the job, by kind.",
    );
    for (kind, count) in &kinds {
        w.sample("monarch_events_total", &[("kind", kind)], *count as f64);
    }
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_labels_and_formats_numbers() {
        let mut s = String::new();
        escape_into(&mut s, "a\\b\"c\nd");
        assert_eq!(s, "a\\\\b\\\"c\\nd");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.000001), "0.000001");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }
}
