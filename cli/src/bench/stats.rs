//! Latency samples and the table the bench prints.

use std::time::Duration;

pub use wrpc_broker::runtime::bench::Sample;

/// One row: an operation measured through the component and natively.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured.
    pub operation: String,
    /// The unit counted (ops, msgs, entries).
    pub unit: &'static str,
    /// Through the adapter component.
    pub component: Sample,
    /// The same work on the native side.
    pub native: Option<Sample>,
}

fn micros(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e6))
}

/// The table: ops/s, p50 and p99 in µs for both sides, and the ratio component / native
/// (of throughput: below 1 means the component is slower).
pub fn table(rows: &[Row]) -> String {
    let width = rows
        .iter()
        .map(|r| r.operation.len())
        .max()
        .unwrap_or(9)
        .max(9);
    let mut out = format!(
        "| {:<width$} | {:>13} | {:>9} | {:>9} | {:>13} | {:>9} | {:>9} | {:>6} |\n",
        "operation", "component/s", "p50 µs", "p99 µs", "native/s", "p50 µs", "p99 µs", "ratio"
    );
    out += &format!(
        "|{}|{}|{}|{}|{}|{}|{}|{}|\n",
        "-".repeat(width + 2),
        "-".repeat(15),
        "-".repeat(11),
        "-".repeat(11),
        "-".repeat(15),
        "-".repeat(11),
        "-".repeat(11),
        "-".repeat(8)
    );
    for row in rows {
        let c = &row.component;
        let (native_rate, native_p50, native_p99, ratio) = match &row.native {
            Some(n) => (
                format!("{:.0} {}", n.rate(), row.unit),
                micros(n.quantile(0.5)),
                micros(n.quantile(0.99)),
                format!("{:.2}", c.rate() / n.rate().max(1e-9)),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        out += &format!(
            "| {:<width$} | {:>13} | {:>9} | {:>9} | {:>13} | {:>9} | {:>9} | {:>6} |\n",
            row.operation,
            format!("{:.0} {}", c.rate(), row.unit),
            micros(c.quantile(0.5)),
            micros(c.quantile(0.99)),
            native_rate,
            native_p50,
            native_p99,
            ratio
        );
    }
    out
}
