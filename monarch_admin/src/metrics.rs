//! `GET /metrics`: a snapshot and the event counts as Prometheus text format 0.0.4
//! (spec section 3).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

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

/// A JSON value as a label value: strings as they are, numbers printed, null empty.
fn label_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A family computed per record: name, type, help, and the value of one record.
type Family = (&'static str, &'static str, &'static str, fn(&Value) -> f64);
/// A gauge family: name, help, and the value of one record.
type Gauge = (&'static str, &'static str, fn(&Value) -> f64);
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

fn f(value: &Value) -> f64 {
    value.as_f64().unwrap_or(0.0)
}

fn items<'a>(snapshot: &'a Value, key: &str) -> &'a [Value] {
    snapshot[key].as_array().map_or(&[], |v| v.as_slice())
}

/// Renders `snapshot` (spec section 1 shape) and `events` (event records, for the
/// per-kind counts) as Prometheus text format 0.0.4. Every family has HELP and TYPE.
pub fn render_metrics(snapshot: &Value, events: &[Value]) -> String {
    let mut w = Writer {
        out: String::with_capacity(64 * 1024),
    };
    let actors = items(snapshot, "actors");
    let procs = items(snapshot, "procs");
    let hosts = items(snapshot, "hosts");
    let mesh_names: BTreeMap<String, String> = items(snapshot, "meshes")
        .iter()
        .map(|m| (label_text(&m["id"]), label_text(&m["name"])))
        .collect();
    let actor_labels: Vec<[String; 4]> = actors
        .iter()
        .map(|a| {
            let mesh = match &a["mesh"] {
                Value::Null => label_text(&a["name"]),
                id => {
                    let id = label_text(id);
                    mesh_names.get(&id).cloned().unwrap_or(id)
                }
            };
            [
                mesh,
                label_text(&a["class"]),
                label_text(&a["rank"]),
                label_text(&a["id"]),
            ]
        })
        .collect();

    let per_actor: [Family; 4] = [
        (
            "monarch_actor_messages_total",
            "counter",
            "Messages handled by the actor.",
            |a| f(&a["handled"]),
        ),
        (
            "monarch_actor_errors_total",
            "counter",
            "Messages whose handler failed.",
            |a| f(&a["errors"]),
        ),
        (
            "monarch_actor_busy_seconds_total",
            "counter",
            "Time spent in handlers, in seconds.",
            |a| f(&a["busy_ms"]) / 1000.0,
        ),
        (
            "monarch_actor_queue_depth",
            "gauge",
            "Messages waiting in the actor's queue.",
            |a| f(&a["queue"]),
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
    let bounds: Vec<f64> = items(snapshot, "bucket_bounds_us")
        .iter()
        .map(|b| f(b) / 1e6)
        .collect();
    let mut histograms: Histograms = BTreeMap::new();
    for (actor, l) in actors.iter().zip(&actor_labels) {
        let Some(endpoints) = actor["endpoints"].as_object() else {
            continue;
        };
        for (endpoint, stats) in endpoints {
            let entry = histograms
                .entry((l[0].as_str(), l[1].as_str(), endpoint.as_str()))
                .or_insert_with(|| (vec![0; bounds.len() + 1], 0.0, 0));
            if let Some(buckets) = stats["buckets"].as_array() {
                for (slot, count) in entry.0.iter_mut().zip(buckets) {
                    *slot += count.as_u64().unwrap_or(0);
                }
            }
            entry.1 += f(&stats["total_ms"]) / 1000.0;
            entry.2 += stats["count"].as_u64().unwrap_or(0);
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
                label_text(&p["id"]),
                label_text(&p["host"]),
                label_text(&p["mesh"]),
                label_text(&p["rank"]),
            ]
        })
        .collect();
    let per_proc: [Family; 7] = [
        (
            "monarch_proc_up",
            "gauge",
            "1 while the proc runs, else 0.",
            |p| f64::from(u8::from(p["status"] == "running")),
        ),
        (
            "monarch_proc_resident_memory_bytes",
            "gauge",
            "Resident memory of the proc's process.",
            |p| f(&p["rss"]),
        ),
        (
            "monarch_proc_cpu_seconds_total",
            "counter",
            "CPU time of the proc's process, in seconds.",
            |p| f(&p["cpu_s"]),
        ),
        (
            "monarch_proc_threads",
            "gauge",
            "Threads of the proc's process.",
            |p| f(&p["threads"]),
        ),
        (
            "monarch_proc_link_sent_bytes_total",
            "counter",
            "Bytes the proc sent over its links.",
            |p| f(&p["link_sent"]),
        ),
        (
            "monarch_proc_link_received_bytes_total",
            "counter",
            "Bytes the proc received over its links.",
            |p| f(&p["link_received"]),
        ),
        (
            "monarch_proc_log_lines_dropped_total",
            "counter",
            "Log lines of the proc dropped on the way to the client.",
            |p| f(&p["log_lines_dropped"]),
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

    let per_host: [Gauge; 3] = [
        ("monarch_host_load1", "Load average over one minute.", |h| {
            f(&h["load"][0])
        }),
        (
            "monarch_host_memory_available_bytes",
            "Memory available on the host.",
            |h| f(&h["mem_available"]),
        ),
        (
            "monarch_host_heartbeat_age_seconds",
            "Seconds since the host's last heartbeat.",
            |h| f(&h["heartbeat_age_ms"]) / 1000.0,
        ),
    ];
    for (name, help, value) in per_host {
        w.family(name, "gauge", help);
        for host in hosts {
            w.sample(name, &[("host", &label_text(&host["id"]))], value(host));
        }
    }

    let per_gpu: [Gauge; 2] = [
        ("monarch_gpu_memory_used_bytes", "GPU memory in use.", |g| {
            f(&g["mem_used"])
        }),
        (
            "monarch_gpu_utilization_ratio",
            "GPU utilization, 0 to 1.",
            |g| f(&g["util_pct"]) / 100.0,
        ),
    ];
    for (name, help, value) in per_gpu {
        w.family(name, "gauge", help);
        for host in hosts {
            let host_id = label_text(&host["id"]);
            for gpu in host["gpus"].as_array().map_or(&[][..], |g| g.as_slice()) {
                let labels = [
                    ("host", host_id.as_str()),
                    ("gpu", &label_text(&gpu["index"])),
                ];
                w.sample(name, &labels, value(gpu));
            }
        }
    }

    let mut kinds: BTreeMap<String, u64> = EVENT_KINDS.iter().map(|k| (k.to_string(), 0)).collect();
    for event in events {
        *kinds.entry(label_text(&event["kind"])).or_insert(0) += 1;
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
