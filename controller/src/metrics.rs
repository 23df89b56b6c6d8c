//! Prometheus metrics, all prefixed `bootplate_`. Labels are bounded: controller, result,
//! reason, template (one value per template object), generator (one per BootstrapGenerator),
//! state; never a machine or a secret value.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use crate::core::outcome::ConfigState;

/// Every metric bootplate exports.
pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    reconcile_duration: HistogramVec,
    render_duration: HistogramVec,
    render_failures: IntCounterVec,
    secrets_written: IntCounter,
    events: IntCounterVec,
    events_queued: IntGauge,
    tokens: IntCounterVec,
    configs: IntGaugeVec,
    templates: IntGaugeVec,
    time_to_ready: Histogram,
    oldest_waiting: IntGauge,
    leader: IntGauge,
    generator_requests: IntCounterVec,
    generator_duration: HistogramVec,
    inplace_updates: IntCounterVec,
    oldest_inplace_update: IntGauge,
    hook_requests: IntCounterVec,
    boot_duration: HistogramVec,
    boot_failures: IntCounterVec,
    boot_reports_unreadable: IntCounterVec,
    network_ignored: IntCounterVec,
    /// Per-config state and creation time, to derive the gauges. Keyed by namespace/name;
    /// this map is memory, not label values.
    config_states: Mutex<HashMap<String, (ConfigState, Option<Timestamp>)>>,
    template_validity: Mutex<HashMap<String, bool>>,
    /// When each config under an in-place update started it, keyed by namespace/name.
    inplace_since: Mutex<HashMap<String, Timestamp>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    /// Creates and registers every metric.
    #[rustfmt::skip]
    pub fn new() -> Self {
        let r = Registry::new();
        let reconciles = counter_vec(&r, "bootplate_reconciles_total", "Reconciles by controller (config, template) and result (ready, waiting, failed, error).", &["controller", "result"]);
        let reconcile_duration = histogram_vec(&r, "bootplate_reconcile_duration_seconds", "Time one reconcile took, by controller.", vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0], &["controller"]);
        let render_duration = histogram_vec(&r, "bootplate_render_duration_seconds", "Time to render one config's user-data, by template.", vec![0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0], &["template"]);
        let render_failures = counter_vec(&r, "bootplate_render_failures_total", "Failed renders by template and condition reason.", &["template", "reason"]);
        let secrets_written = IntCounter::new("bootplate_data_secrets_written_total", "Data Secrets created or updated.").expect("valid metric");
        let events = counter_vec(&r, "bootplate_events_total", "Kubernetes Events by outcome: published, failed (refused by the apiserver), dropped (the delivery queue was full), limited (a Normal Event past --event-qps and --event-burst).", &["result"]);
        let events_queued = IntGauge::new("bootplate_events_queued", "Events waiting for delivery.").expect("valid metric");
        let tokens = counter_vec(&r, "bootplate_bootstrap_tokens_total", "Bootstrap tokens by action (created, refreshed, rotated, deleted) and errors managing them (error).", &["action"]);
        let configs = gauge_vec(&r, "bootplate_configs", "Configs by state (ready, waiting, failed).", &["state"]);
        let templates = gauge_vec(&r, "bootplate_templates", "Templates by validity (valid, invalid).", &["validity"]);
        let time_to_ready = Histogram::with_opts(HistogramOpts::new("bootplate_config_time_to_ready_seconds", "Time from a config's creation until its data Secret was first written.").buckets(vec![1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0])).expect("valid metric");
        let oldest_waiting = IntGauge::new("bootplate_oldest_waiting_config_age_seconds", "Age of the oldest config that is not ready (waiting or failed); 0 when none.").expect("valid metric");
        let generator_requests = counter_vec(&r, "bootplate_generator_requests_total", "Requests to BootstrapGenerators by generator and result (success, refused, http_error, timeout, unreachable, too_large, invalid), and calls not made because the config's namespace may not use the generator (not_allowed).", &["generator", "result"]);
        let generator_duration = histogram_vec(&r, "bootplate_generator_request_duration_seconds", "Time one request to a BootstrapGenerator took, answer read and checked, by generator.", vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0], &["generator"]);
        let inplace_updates = counter_vec(&r, "bootplate_inplace_updates_total", "In-place updates of booted machines by result: started, succeeded, failed (the node reported a failed step).", &["result"]);
        let oldest_inplace_update = IntGauge::new("bootplate_oldest_inplace_update_age_seconds", "Age of the oldest in-place update still in progress (Cluster API marked the machine, its node has not reported the payload applied); 0 when none.").expect("valid metric");
        let hook_requests = counter_vec(&r, "bootplate_extension_requests_total", "Cluster API Runtime SDK calls served by hook (discovery, can_update_machine_set, can_update_machine, update_machine) and answer (in_place, rollout, unchanged, in_progress, done, failure, error).", &["hook", "answer"]);
        let boot_duration = histogram_vec(&r, "bootplate_boot_duration_seconds", "Time each part of a machine's boot took, as the machine reported it, by template and part (a part the template does not have counts as `other`).", vec![1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0], &["template", "part"]);
        let boot_failures = counter_vec(&r, "bootplate_boot_failures_total", "Machines that reported a failed boot, by template and the part that failed.", &["template", "part"]);
        let boot_reports_unreadable = counter_vec(&r, "bootplate_boot_reports_unreadable_total", "Boot reports that could not be read (too large, malformed), by template.", &["template"]);
        let network_ignored = counter_vec(&r, "bootplate_network_ignored_total", "Configs found setting network input (spec.network) their template never reads, counted once per change (with the NetworkIgnored Event), by template.", &["template"]);
        let leader = IntGauge::new("bootplate_leader", "1 while this instance holds the leader Lease (or runs without leader election).").expect("valid metric");
        for collector in [
            Box::new(secrets_written.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(events_queued.clone()),
            Box::new(time_to_ready.clone()),
            Box::new(oldest_waiting.clone()),
            Box::new(leader.clone()),
            Box::new(oldest_inplace_update.clone()),
        ] {
            r.register(collector).expect("unique metric names");
        }
        for state in [ConfigState::Ready, ConfigState::Waiting, ConfigState::Failed] {
            configs.with_label_values(&[state.as_str()]).set(0);
        }
        for validity in ["valid", "invalid"] {
            templates.with_label_values(&[validity]).set(0);
        }
        for result in ["published", "failed", "dropped", "limited"] {
            events.with_label_values(&[result]).reset();
        }
        Metrics {
            registry: r, reconciles, reconcile_duration, render_duration, render_failures,
            secrets_written, events, events_queued, tokens, configs, templates, time_to_ready,
            oldest_waiting, leader, generator_requests, generator_duration, inplace_updates,
            oldest_inplace_update, hook_requests, boot_duration, boot_failures,
            boot_reports_unreadable, network_ignored,
            config_states: Mutex::default(),
            template_validity: Mutex::default(),
            inplace_since: Mutex::default(),
        }
    }

    /// Counts a step of an in-place update (`started`, `succeeded`, `failed`).
    pub fn inplace_update(&self, result: &str) {
        self.inplace_updates.with_label_values(&[result]).inc();
    }

    /// Records whether a config is under an in-place update, and since when.
    pub fn inplace_updating(&self, key: &str, since: Option<Timestamp>) {
        let mut updating = self.inplace_since.lock().expect("metrics lock");
        match since {
            Some(since) => updating.insert(key.to_owned(), since),
            None => updating.remove(key),
        };
    }

    /// Records how long part `part` of a machine's boot took.
    pub fn boot_part(&self, template: &str, part: &str, seconds: f64) {
        self.boot_duration
            .with_label_values(&[template, part])
            .observe(seconds);
    }

    /// Counts a machine whose boot failed in part `part`.
    pub fn boot_failed(&self, template: &str, part: &str) {
        self.boot_failures
            .with_label_values(&[template, part])
            .inc();
    }

    /// Counts a boot report that could not be read.
    pub fn boot_report_unreadable(&self, template: &str) {
        self.boot_reports_unreadable
            .with_label_values(&[template])
            .inc();
    }

    /// Counts a Runtime SDK call by hook and answer.
    pub fn hook_request(&self, hook: &str, answer: &str) {
        self.hook_requests.with_label_values(&[hook, answer]).inc();
    }

    /// Counts a reconcile and its duration.
    pub fn reconciled(&self, controller: &str, result: &str, took: Duration) {
        self.reconciles
            .with_label_values(&[controller, result])
            .inc();
        self.reconcile_duration
            .with_label_values(&[controller])
            .observe(took.as_secs_f64());
    }

    /// Records one render's duration.
    pub fn rendered(&self, template: &str, took: Duration) {
        self.render_duration
            .with_label_values(&[template])
            .observe(took.as_secs_f64());
    }

    /// Counts a failed render.
    pub fn render_failed(&self, template: &str, reason: &str) {
        self.render_failures
            .with_label_values(&[template, reason])
            .inc();
    }

    /// Counts a request to generator `generator` and its duration; `result` is `success` or a
    /// `CallError::result`.
    pub fn generator_request(&self, generator: &str, result: &str, took: Duration) {
        self.generator_requests
            .with_label_values(&[generator, result])
            .inc();
        self.generator_duration
            .with_label_values(&[generator])
            .observe(took.as_secs_f64());
    }

    /// Counts a call to generator `generator` refused before it was made: the config's
    /// namespace is not in its `spec.allowedNamespaces` (result `not_allowed`).
    pub fn generator_refused(&self, generator: &str) {
        self.generator_requests
            .with_label_values(&[generator, "not_allowed"])
            .inc();
    }

    /// Counts a data Secret write.
    pub fn secret_written(&self) {
        self.secrets_written.inc();
    }

    /// Counts an Event put in the delivery queue.
    pub fn event_queued(&self) {
        self.events_queued.inc();
    }

    /// Events queued and not yet delivered (or given up on).
    pub fn events_waiting(&self) -> i64 {
        self.events_queued.get()
    }

    /// Counts an Event dropped because the queue was full; returns how many were dropped so far.
    pub fn event_dropped(&self) -> u64 {
        let dropped = self.events.with_label_values(&["dropped"]);
        dropped.inc();
        dropped.get()
    }

    /// Counts a Normal Event dropped by the pace (`core::pace`).
    pub fn event_limited(&self) {
        self.events.with_label_values(&["limited"]).inc();
    }

    /// Counts an Event taken from the queue and published (or refused by the apiserver).
    pub fn event_delivered(&self, published: bool) {
        self.events_queued.dec();
        self.events
            .with_label_values(&[if published { "published" } else { "failed" }])
            .inc();
    }

    /// Counts a token action: created, refreshed, deleted, error.
    pub fn token(&self, action: &str) {
        self.tokens.with_label_values(&[action]).inc();
    }

    /// Records a config's state; the first transition to ready observes its time to ready.
    pub fn config_state(&self, key: &str, state: ConfigState, created: Option<Timestamp>) {
        let mut states = self.config_states.lock().expect("metrics lock");
        let previous = states.insert(key.to_owned(), (state, created));
        self.move_config_gauge(previous.map(|(s, _)| s), Some(state));
        if state == ConfigState::Ready
            && previous.is_none_or(|(s, _)| s != ConfigState::Ready)
            && let Some(created) = created
        {
            let seconds = Timestamp::now()
                .duration_since(created)
                .as_secs_f64()
                .max(0.0);
            self.time_to_ready.observe(seconds);
        }
    }

    /// Forgets a deleted config.
    pub fn config_deleted(&self, key: &str) {
        let mut states = self.config_states.lock().expect("metrics lock");
        let previous = states.remove(key);
        self.move_config_gauge(previous.map(|(s, _)| s), None);
        self.inplace_updating(key, None);
    }

    /// Moves one config between the per-state gauges (called under the states lock, so the
    /// gauges always add up to the states held; counting them all again on every reconcile
    /// would cost time in the number of configs).
    fn move_config_gauge(&self, from: Option<ConfigState>, to: Option<ConfigState>) {
        if from == to {
            return;
        }
        if let Some(from) = from {
            self.configs.with_label_values(&[from.as_str()]).dec();
        }
        if let Some(to) = to {
            self.configs.with_label_values(&[to.as_str()]).inc();
        }
    }

    /// Counts a config whose network input `template` ignores (once per change).
    pub fn network_ignored(&self, template: &str) {
        self.network_ignored.with_label_values(&[template]).inc();
    }

    /// Records a template's validity.
    pub fn template_validity(&self, key: &str, valid: Option<bool>) {
        let mut validity = self.template_validity.lock().expect("metrics lock");
        match valid {
            Some(v) => validity.insert(key.to_owned(), v),
            None => validity.remove(key),
        };
        let valid_count = validity.values().filter(|v| **v).count() as i64;
        self.templates
            .with_label_values(&["valid"])
            .set(valid_count);
        self.templates
            .with_label_values(&["invalid"])
            .set(validity.len() as i64 - valid_count);
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let now = Timestamp::now();
        let oldest = self
            .config_states
            .lock()
            .expect("metrics lock")
            .values()
            .filter(|(s, _)| *s != ConfigState::Ready)
            .filter_map(|(_, created)| *created)
            .map(|created| now.duration_since(created).as_secs())
            .max()
            .unwrap_or(0);
        self.oldest_waiting.set(oldest.max(0));
        let oldest_update = (self.inplace_since.lock().expect("metrics lock").values())
            .map(|since| now.duration_since(*since).as_secs())
            .max()
            .unwrap_or(0);
        self.oldest_inplace_update.set(oldest_update.max(0));
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

/// A counter family registered in `registry`.
fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric names");
    metric
}

/// A gauge family registered in `registry`.
fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric names");
    metric
}

/// A histogram family with `buckets` registered in `registry`.
fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    let metric = HistogramVec::new(opts, labels).expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric names");
    metric
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge(metrics: &Metrics, state: &str) -> String {
        metrics
            .configs
            .with_label_values(&[state])
            .get()
            .to_string()
    }

    #[test]
    fn oldest_inplace_update_is_the_age_of_the_earliest_update_still_running() {
        let metrics = Metrics::new();
        // The gauge as a scrape leaves it.
        let age = |metrics: &Metrics| {
            metrics.encode();
            metrics.oldest_inplace_update.get()
        };
        assert_eq!(age(&metrics), 0);
        let now = Timestamp::now();
        let ago = |secs: i64| now - k8s_openapi::jiff::SignedDuration::from_secs(secs);
        metrics.inplace_updating("ns/a", Some(ago(600)));
        metrics.inplace_updating("ns/b", Some(ago(4000)));
        assert!((4000..4060).contains(&age(&metrics)));
        // b's update ended; a config deleted mid-update is forgotten too.
        metrics.inplace_updating("ns/b", None);
        assert!((600..660).contains(&age(&metrics)));
        metrics.config_deleted("ns/a");
        assert_eq!(age(&metrics), 0);
    }

    #[test]
    fn config_gauges_follow_each_config_between_states() {
        let metrics = Metrics::new();
        assert_eq!(
            gauge(&metrics, "failed"),
            "0",
            "every state shows from the start"
        );
        metrics.config_state("ns/a", ConfigState::Waiting, None);
        metrics.config_state("ns/b", ConfigState::Waiting, None);
        metrics.config_state("ns/a", ConfigState::Waiting, None);
        assert_eq!(gauge(&metrics, "waiting"), "2");
        metrics.config_state("ns/a", ConfigState::Ready, None);
        metrics.config_state("ns/b", ConfigState::Failed, None);
        assert_eq!(
            [
                gauge(&metrics, "ready"),
                gauge(&metrics, "waiting"),
                gauge(&metrics, "failed")
            ],
            ["1", "0", "1"]
        );
        metrics.config_deleted("ns/b");
        metrics.config_deleted("ns/never-seen");
        assert_eq!(gauge(&metrics, "failed"), "0");
        assert_eq!(gauge(&metrics, "ready"), "1");
    }
}
