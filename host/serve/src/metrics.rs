//! `/metrics`: Prometheus counters and histograms of the API's operations, errors, swaps,
//! migrations, refused reloads, traps and the depth of the queues served.

use std::time::Instant;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The gateway's metrics.
pub struct Metrics {
    registry: Registry,
    operations: IntCounterVec,
    latency: HistogramVec,
    /// Adapter swaps applied by a reload.
    pub swaps: IntCounter,
    /// Broker migrations applied by a reload.
    pub migrations: IntCounter,
    /// Reloads refused (the running config stayed).
    pub reloads_refused: IntCounter,
    /// Calls that failed because the adapter trapped.
    pub traps: IntCounter,
    /// Depth of each queue served, sampled at scrape time.
    pub queue_depth: IntGaugeVec,
}

impl Metrics {
    /// Fresh metrics.
    pub fn new() -> Self {
        let registry = Registry::new();
        let operations = IntCounterVec::new(
            Opts::new("wrpc_serve_operations_total", "API operations by outcome"),
            &["capability", "operation", "outcome"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new("wrpc_serve_operation_seconds", "API operation latency")
                .buckets(prometheus::exponential_buckets(0.000_05, 2.0, 18).expect("buckets")),
            &["capability", "operation"],
        )
        .expect("valid metric");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        let swaps = counter(
            "wrpc_serve_swaps_total",
            "adapter swaps applied by a reload",
        );
        let migrations = counter("wrpc_serve_migrations_total", "broker migrations applied");
        let reloads_refused = counter("wrpc_serve_reloads_refused_total", "reloads refused");
        let traps = counter("wrpc_serve_traps_total", "calls failed by an adapter trap");
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "wrpc_serve_queue_depth",
                "messages waiting in a queue served",
            ),
            &["queue"],
        )
        .expect("valid metric");
        for c in [&swaps, &migrations, &reloads_refused, &traps] {
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
        }
        registry
            .register(Box::new(operations.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(latency.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(queue_depth.clone()))
            .expect("unique metric");
        Self {
            registry,
            operations,
            latency,
            swaps,
            migrations,
            reloads_refused,
            traps,
            queue_depth,
        }
    }

    /// Count one operation that started at `started`, by its outcome.
    pub fn observe<T>(
        &self,
        capability: &str,
        operation: &str,
        started: Instant,
        outcome: &Result<T, wrpc_broker::Error>,
    ) {
        let label = match outcome {
            Ok(_) => "ok",
            Err(e) => {
                if matches!(e, wrpc_broker::Error::Trapped(_)) {
                    self.traps.inc();
                }
                "error"
            }
        };
        self.operations
            .with_label_values(&[capability, operation, label])
            .inc();
        self.latency
            .with_label_values(&[capability, operation])
            .observe(started.elapsed().as_secs_f64());
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
