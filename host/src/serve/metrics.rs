//! The server's counters, gauges and latency histograms, shown in the Prometheus text format
//! (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (c, b) in self.counts.iter_mut().zip(BUCKETS) {
            if seconds <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

#[derive(Default)]
struct Counts {
    /// (route, status) -> requests answered.
    requests: BTreeMap<(&'static str, u16), u64>,
    /// route -> time from the request to its response's head.
    latency: BTreeMap<&'static str, Histogram>,
    /// Time a request waited in the queue for a worker.
    queue_wait: Histogram,
    /// Time from a chat request to its first streamed text.
    first_text: Histogram,
    /// agent -> (prompt tokens, generated tokens).
    tokens: BTreeMap<usize, (u64, u64)>,
    /// Requests refused because the queue was full.
    rejected_busy: u64,
    /// Requests whose client went away before they were done.
    cancelled: u64,
}

/// Everything `/metrics` reports.
#[derive(Default)]
pub struct Metrics {
    counts: Mutex<Counts>,
    /// Requests waiting for a worker.
    pub queued: AtomicUsize,
    /// Workers busy with a request.
    pub busy: AtomicUsize,
    pub workers: AtomicUsize,
    /// Connections being served (the reserve for `/health` not included).
    pub open: AtomicUsize,
    /// Connections over `--max-connections` (answered from the reserve, or closed).
    pub over_cap: AtomicU64,
    /// Connections closed for a head not sent within `--header-timeout`.
    pub head_timeouts: AtomicU64,
    /// Requests answered 408 for a body that stalled for `--body-timeout`.
    pub body_timeouts: AtomicU64,
    /// Requests answered 408 for not being read whole within `--request-timeout`.
    pub request_timeouts: AtomicU64,
    /// Requests answered 503 for a body that did not fit `--max-buffered-body-bytes`.
    pub budget_refusals: AtomicU64,
    /// Requests still queued at shutdown, answered 503.
    pub refused_at_shutdown: AtomicU64,
    /// The buffered-body budget and its size, for the bytes it holds.
    pub body_budget: OnceLock<(Arc<tokio::sync::Semaphore>, usize)>,
}

impl Metrics {
    pub fn answered(&self, route: &'static str, status: u16, took: Duration) {
        let mut c = self.counts.lock().unwrap();
        *c.requests.entry((route, status)).or_default() += 1;
        c.latency
            .entry(route)
            .or_default()
            .observe(took.as_secs_f64());
        if status == 429 {
            c.rejected_busy += 1;
        }
    }

    pub fn waited(&self, took: Duration) {
        self.counts
            .lock()
            .unwrap()
            .queue_wait
            .observe(took.as_secs_f64());
    }

    pub fn first_text(&self, took: Duration) {
        self.counts
            .lock()
            .unwrap()
            .first_text
            .observe(took.as_secs_f64());
    }

    pub fn tokens(&self, agent: usize, prompt: usize, generated: usize) {
        let mut c = self.counts.lock().unwrap();
        let t = c.tokens.entry(agent).or_default();
        t.0 += prompt as u64;
        t.1 += generated as u64;
    }

    pub fn cancelled(&self) {
        self.counts.lock().unwrap().cancelled += 1;
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let c = self.counts.lock().unwrap();
        let mut out = String::new();
        let o = &mut out;
        header(
            o,
            "maporl_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
        );
        for ((route, status), n) in &c.requests {
            let _ = writeln!(
                o,
                "maporl_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        header(
            o,
            "maporl_request_duration_seconds",
            "histogram",
            "Time from a request to its response's head, by route.",
        );
        for (route, h) in &c.latency {
            histogram(
                o,
                "maporl_request_duration_seconds",
                &format!("route=\"{route}\""),
                h,
            );
        }
        header(
            o,
            "maporl_queue_wait_seconds",
            "histogram",
            "Time a request waited for a worker.",
        );
        histogram(o, "maporl_queue_wait_seconds", "", &c.queue_wait);
        header(
            o,
            "maporl_time_to_first_text_seconds",
            "histogram",
            "Time from a streamed chat request to its first text.",
        );
        histogram(o, "maporl_time_to_first_text_seconds", "", &c.first_text);
        header(
            o,
            "maporl_prompt_tokens_total",
            "counter",
            "Prompt tokens read, by agent.",
        );
        for (agent, (p, _)) in &c.tokens {
            let _ = writeln!(o, "maporl_prompt_tokens_total{{agent=\"{agent}\"}} {p}");
        }
        header(
            o,
            "maporl_generated_tokens_total",
            "counter",
            "Tokens generated, by agent.",
        );
        for (agent, (_, g)) in &c.tokens {
            let _ = writeln!(o, "maporl_generated_tokens_total{{agent=\"{agent}\"}} {g}");
        }
        header(
            o,
            "maporl_rejected_busy_total",
            "counter",
            "Requests refused because the queue was full.",
        );
        let _ = writeln!(o, "maporl_rejected_busy_total {}", c.rejected_busy);
        header(
            o,
            "maporl_cancelled_total",
            "counter",
            "Requests whose client went away before the answer was done.",
        );
        let _ = writeln!(o, "maporl_cancelled_total {}", c.cancelled);
        drop(c);
        for (name, help, v) in [
            (
                "maporl_connections_over_cap_total",
                "Connections over --max-connections: answered from the reserve (/health, \
                 /metrics; 503 otherwise) or closed.",
                &self.over_cap,
            ),
            (
                "maporl_head_timeouts_total",
                "Connections closed because no whole request head came within \
                 --header-timeout (slow clients, idle kept-alive connections).",
                &self.head_timeouts,
            ),
            (
                "maporl_body_timeouts_total",
                "Requests answered 408: their body stalled for --body-timeout.",
                &self.body_timeouts,
            ),
            (
                "maporl_request_timeouts_total",
                "Requests answered 408: not read whole within --request-timeout.",
                &self.request_timeouts,
            ),
            (
                "maporl_body_budget_refused_total",
                "Requests answered 503: their body did not fit --max-buffered-body-bytes.",
                &self.budget_refusals,
            ),
            (
                "maporl_refused_at_shutdown_total",
                "Requests still queued when the server began to stop, answered 503.",
                &self.refused_at_shutdown,
            ),
        ] {
            header(o, name, "counter", help);
            let _ = writeln!(o, "{name} {}", v.load(Ordering::Relaxed));
        }
        if let Some((budget, size)) = self.body_budget.get() {
            header(
                o,
                "maporl_body_bytes_buffered",
                "gauge",
                "Bytes of request bodies being read, held against --max-buffered-body-bytes.",
            );
            let _ = writeln!(
                o,
                "maporl_body_bytes_buffered {}",
                size.saturating_sub(budget.available_permits())
            );
        }
        for (name, help, v) in [
            (
                "maporl_open_connections",
                "Connections being served (the reserve for /health not included).",
                &self.open,
            ),
            (
                "maporl_queue_depth",
                "Requests waiting for a worker.",
                &self.queued,
            ),
            (
                "maporl_busy_workers",
                "Workers busy with a request.",
                &self.busy,
            ),
            ("maporl_workers", "Model worker threads.", &self.workers),
        ] {
            header(o, name, "gauge", help);
            let _ = writeln!(o, "{name} {}", v.load(Ordering::Relaxed));
        }
        out
    }
}

fn header(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn histogram(o: &mut String, name: &str, labels: &str, h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (b, n) in BUCKETS.iter().zip(h.counts) {
        let _ = writeln!(o, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {n}");
    }
    let _ = writeln!(o, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(o, "{name}_sum{braces} {}", h.sum);
    let _ = writeln!(o, "{name}_count{braces} {}", h.count);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counters_add_up() {
        let m = Metrics::default();
        m.answered("/v1/chat/completions", 200, Duration::from_millis(30));
        m.answered("/v1/chat/completions", 200, Duration::from_secs(3));
        m.answered("/v1/chat/completions", 400, Duration::from_millis(1));
        m.tokens(1, 10, 4);
        m.tokens(1, 5, 2);
        let text = m.render();
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        let r = "route=\"/v1/chat/completions\"";
        assert_eq!(
            line(&format!("maporl_requests_total{{{r},status=\"200\"}}")),
            "2"
        );
        assert_eq!(
            line(&format!("maporl_requests_total{{{r},status=\"400\"}}")),
            "1"
        );
        assert_eq!(
            line(&format!(
                "maporl_request_duration_seconds_bucket{{{r},le=\"0.005\"}}"
            )),
            "1"
        );
        assert_eq!(
            line(&format!(
                "maporl_request_duration_seconds_bucket{{{r},le=\"0.05\"}}"
            )),
            "2"
        );
        assert_eq!(
            line(&format!(
                "maporl_request_duration_seconds_bucket{{{r},le=\"2.5\"}}"
            )),
            "2"
        );
        assert_eq!(
            line(&format!(
                "maporl_request_duration_seconds_bucket{{{r},le=\"5\"}}"
            )),
            "3"
        );
        assert_eq!(
            line(&format!("maporl_request_duration_seconds_count{{{r}}}")),
            "3"
        );
        assert_eq!(line("maporl_prompt_tokens_total{agent=\"1\"}"), "15");
        assert_eq!(line("maporl_generated_tokens_total{agent=\"1\"}"), "6");
        assert_eq!(line("maporl_queue_wait_seconds_count"), "0");
    }
}
