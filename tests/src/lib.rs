//! The contract suite every wrpc-broker adapter must pass: one module per capability, each test a
//! function over a [`Factory`] that makes host instances sharing one broker (like Watermill's
//! universal pub/sub tests). The cargo tests run it against every adapter component the
//! workspace builds; `wrpc-broker check` runs it against any component file.

pub mod backplane;
pub mod components;
pub mod direct;
pub mod log;
pub mod queue;
pub mod support;
pub mod workload;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wrpc_broker::{Broker, Capabilities};

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Opens a host instance with extra `init` options.
type OpenFn = dyn Fn(Vec<(String, String)>) -> BoxFuture<anyhow::Result<Broker>> + Send + Sync;

/// Opens host instances on one broker. Every call is a new host instance (its own component
/// instance); all of them share the broker, like processes of one deployment.
#[derive(Clone)]
pub struct Factory {
    open: Arc<OpenFn>,
    refuse_settlements: Option<Arc<RefuseFn>>,
}

/// Makes the broker refuse the next `count` settlements on a queue (a fault-injecting driver).
type RefuseFn = dyn Fn(&str, u32) + Send + Sync;

impl Factory {
    /// A factory from a function of the extra `init` options a test asks for.
    pub fn new<F, Fut>(open: F) -> Self
    where
        F: Fn(Vec<(String, String)>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Broker>> + Send + 'static,
    {
        Self {
            open: Arc::new(move |options| Box::pin(open(options))),
            refuse_settlements: None,
        }
    }

    /// Let tests make the broker refuse settlements: `refuse(queue, count)` refuses the next
    /// `count` settlements on the queue of that name.
    pub fn with_settlement_refusals(
        mut self,
        refuse: impl Fn(&str, u32) + Send + Sync + 'static,
    ) -> Self {
        self.refuse_settlements = Some(Arc::new(refuse));
        self
    }

    /// Refuse the next `count` settlements on `queue`; `false` when this broker has no fault
    /// injection.
    pub fn refuse_settlements(&self, queue: &str, count: u32) -> bool {
        match &self.refuse_settlements {
            Some(refuse) => {
                refuse(queue, count);
                true
            }
            None => false,
        }
    }

    /// A new host instance with the adapter's default options.
    pub async fn instance(&self) -> anyhow::Result<Broker> {
        (self.open)(Vec::new()).await
    }

    /// A new host instance with extra `init` options (e.g. `retention.maxEntries`).
    pub async fn instance_with(&self, options: &[(&str, &str)]) -> anyhow::Result<Broker> {
        (self.open)(
            options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .await
    }
}

/// The capability a contract test checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Capability {
    /// At-most-once fan-out.
    Backplane,
    /// Ordered, replayable feeds.
    Log,
    /// At-least-once work queues.
    Queue,
    /// Addressable inboxes.
    Direct,
}

impl Capability {
    /// Its name, as in the WIT.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Backplane => "backplane",
            Capability::Log => "log",
            Capability::Queue => "queue",
            Capability::Direct => "direct",
        }
    }

    fn offered_by(self, capabilities: &Capabilities) -> bool {
        match self {
            Capability::Backplane => capabilities.backplane,
            Capability::Log => capabilities.log,
            Capability::Queue => capabilities.queue,
            Capability::Direct => capabilities.direct,
        }
    }
}

/// One contract test.
#[derive(Clone, Copy)]
pub struct Test {
    /// The capability it checks.
    pub capability: Capability,
    /// Its name: the contract sentence it checks, in snake case.
    pub name: &'static str,
    /// The test itself: `Err` says which assertion broke.
    pub run: fn(Factory) -> BoxFuture<anyhow::Result<()>>,
}

/// Every contract test, capability by capability.
pub fn all() -> Vec<Test> {
    let mut tests = log::tests();
    tests.extend(backplane::tests());
    tests.extend(queue::tests());
    tests.extend(direct::tests());
    tests
}

/// How one test went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It passed.
    Pass,
    /// It failed; the message says what broke.
    Fail(String),
    /// The adapter does not export the capability.
    Skipped(String),
}

/// The result of one test.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The capability.
    pub capability: Capability,
    /// The test name.
    pub name: &'static str,
    /// Pass, fail or skipped.
    pub verdict: Verdict,
    /// How long it took.
    pub elapsed: Duration,
}

/// How long one test may take before it counts as failed.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Which tests to run, and how.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions<'a> {
    /// Only tests whose `capability/name` contains this.
    pub filter: Option<&'a str>,
    /// Stop after the first failure (enough to show a mutant is caught).
    pub stop_on_failure: bool,
}

/// Run the selected tests against the broker `factory` opens, one after another; `progress` is
/// told before each test.
pub async fn run(
    factory: &Factory,
    options: RunOptions<'_>,
    mut progress: impl FnMut(usize, usize, &Test),
) -> anyhow::Result<Vec<Outcome>> {
    let filter = options.filter;
    let capabilities = factory.instance().await?.capabilities();
    let tests: Vec<Test> = all()
        .into_iter()
        .filter(|t| {
            filter.is_none_or(|f| format!("{}/{}", t.capability.name(), t.name).contains(f))
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tests.len());
    for (i, test) in tests.iter().enumerate() {
        progress(i, tests.len(), test);
        let started = Instant::now();
        let verdict = if !test.capability.offered_by(&capabilities) {
            Verdict::Skipped(format!(
                "the component does not export `{}`",
                test.capability.name()
            ))
        } else {
            match tokio::time::timeout(TEST_TIMEOUT, (test.run)(factory.clone())).await {
                Ok(Ok(())) => Verdict::Pass,
                Ok(Err(e)) => Verdict::Fail(format!("{e:#}")),
                Err(_) => Verdict::Fail(format!("did not finish within {TEST_TIMEOUT:?}")),
            }
        };
        let failed = matches!(verdict, Verdict::Fail(_));
        outcomes.push(Outcome {
            capability: test.capability,
            name: test.name,
            verdict,
            elapsed: started.elapsed(),
        });
        if failed && options.stop_on_failure {
            break;
        }
    }
    Ok(outcomes)
}

/// A table of outcomes: capability, test, verdict, time, and for a failure what broke.
pub fn report(outcomes: &[Outcome]) -> String {
    let width = outcomes
        .iter()
        .map(|o| o.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!(
        "{:<10} {:<width$} {:<7} {:>8}\n",
        "capability", "test", "result", "time"
    );
    for o in outcomes {
        let (verdict, detail) = match &o.verdict {
            Verdict::Pass => ("pass", String::new()),
            Verdict::Fail(why) => ("FAIL", format!("\n{:>10} {why}", "")),
            Verdict::Skipped(why) => ("skipped", format!("  ({why})")),
        };
        out += &format!(
            "{:<10} {:<width$} {:<7} {:>6}ms{detail}\n",
            o.capability.name(),
            o.name,
            verdict,
            o.elapsed.as_millis()
        );
    }
    let failed = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, Verdict::Fail(_)))
        .count();
    let skipped = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, Verdict::Skipped(_)))
        .count();
    out += &format!(
        "{} passed, {failed} failed, {skipped} skipped\n",
        outcomes.len() - failed - skipped
    );
    out
}

/// Whether any outcome failed.
pub fn any_failed(outcomes: &[Outcome]) -> bool {
    outcomes
        .iter()
        .any(|o| matches!(o.verdict, Verdict::Fail(_)))
}
