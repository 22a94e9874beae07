//! Prometheus text exposition (format 0.0.4) of the server's counters; no external registry.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Default)]
struct Histogram {
    /// Count per bucket of [`LATENCY_BUCKETS`] (not cumulative), plus +Inf last.
    counts: [u64; LATENCY_BUCKETS.len() + 1],
    sum: f64,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    errors: BTreeMap<u16, u64>,
    latency: BTreeMap<String, Histogram>,
    rows: u64,
    tokens: u64,
    decisions: u64,
    batches: u64,
    batch_plans: u64,
    batch_rows: u64,
    engine_seconds: f64,
}

/// The server's counters.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// One finished request: route template (or `other`), status, latency, rows and tokens scored.
    pub fn request(
        &self,
        route: &str,
        status: u16,
        seconds: f64,
        rows: u64,
        tokens: u64,
        decisions: u64,
    ) {
        self.with(|m| {
            *m.requests.entry((route.to_string(), status)).or_default() += 1;
            if status >= 400 {
                *m.errors.entry(status).or_default() += 1;
            }
            let h = m.latency.entry(route.to_string()).or_default();
            let i = LATENCY_BUCKETS
                .iter()
                .position(|&b| seconds <= b)
                .unwrap_or(LATENCY_BUCKETS.len());
            h.counts[i] += 1;
            h.sum += seconds;
            m.rows += rows;
            m.tokens += tokens;
            m.decisions += decisions;
        })
    }

    /// One engine call holding `plans` requests and `rows` rows.
    pub fn batch(&self, plans: usize, rows: usize) {
        self.with(|m| {
            m.batches += 1;
            m.batch_plans += plans as u64;
            m.batch_rows += rows as u64;
        })
    }

    pub fn engine_seconds(&self, s: f64) {
        self.with(|m| m.engine_seconds += s)
    }

    /// The exposition text; `queue_rows` is the admission gauge, `up` whether the batcher runs.
    pub fn render(&self, queue_rows: usize, max_queue_rows: usize, up: bool) -> String {
        self.with(|m| {
            let mut s = String::new();
            let w = &mut s;
            let _ = writeln!(w, "# HELP onepass_requests_total HTTP requests answered, by route and status.");
            let _ = writeln!(w, "# TYPE onepass_requests_total counter");
            for ((route, status), n) in &m.requests {
                let _ = writeln!(w, "onepass_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
            }
            let _ = writeln!(w, "# HELP onepass_errors_total HTTP answers with status >= 400, by status.");
            let _ = writeln!(w, "# TYPE onepass_errors_total counter");
            for (status, n) in &m.errors {
                let _ = writeln!(w, "onepass_errors_total{{status=\"{status}\"}} {n}");
            }
            let _ = writeln!(w, "# HELP onepass_request_duration_seconds Time from request head to response, by route.");
            let _ = writeln!(w, "# TYPE onepass_request_duration_seconds histogram");
            for (route, h) in &m.latency {
                let mut cum = 0u64;
                for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
                    cum += h.counts[i];
                    let _ = writeln!(w, "onepass_request_duration_seconds_bucket{{route=\"{route}\",le=\"{b}\"}} {cum}");
                }
                cum += h.counts[LATENCY_BUCKETS.len()];
                let _ = writeln!(w, "onepass_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {cum}");
                let _ = writeln!(w, "onepass_request_duration_seconds_sum{{route=\"{route}\"}} {}", h.sum);
                let _ = writeln!(w, "onepass_request_duration_seconds_count{{route=\"{route}\"}} {cum}");
            }
            let counters: [(&str, &str, String); 7] = [
                ("onepass_rows_total", "Rows scored by successful requests.", m.rows.to_string()),
                ("onepass_tokens_total", "Tokens in the rows scored by successful requests.", m.tokens.to_string()),
                ("onepass_decisions_total", "Questions answered by successful requests.", m.decisions.to_string()),
                ("onepass_batches_total", "Engine score calls.", m.batches.to_string()),
                ("onepass_batch_requests_total", "Requests summed over engine score calls.", m.batch_plans.to_string()),
                ("onepass_batch_rows_total", "Rows summed over engine score calls.", m.batch_rows.to_string()),
                ("onepass_engine_seconds_total", "Seconds spent inside engine score calls.", m.engine_seconds.to_string()),
            ];
            for (name, help, v) in counters {
                let _ = writeln!(w, "# HELP {name} {help}");
                let _ = writeln!(w, "# TYPE {name} counter");
                let _ = writeln!(w, "{name} {v}");
            }
            let gauges: [(&str, &str, usize); 3] = [
                ("onepass_queue_rows", "Rows admitted and not yet answered (DECIDER_MAX_QUEUE_ROWS applies).", queue_rows),
                ("onepass_queue_rows_limit", "The admission limit in rows.", max_queue_rows),
                ("onepass_up", "1 while the batching worker runs.", up as usize),
            ];
            for (name, help, v) in gauges {
                let _ = writeln!(w, "# HELP {name} {help}");
                let _ = writeln!(w, "# TYPE {name} gauge");
                let _ = writeln!(w, "{name} {v}");
            }
            s
        })
    }
}
