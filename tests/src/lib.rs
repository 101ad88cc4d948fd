//! The contract suite every wrpc-broker adapter must pass: one module per capability, each test a
//! function over a [`Factory`] that makes host instances sharing one broker (like Watermill's
//! universal pub/sub tests). The cargo tests run it against every adapter component the
//! workspace builds; `wrpc-broker check` runs it against any component file. Beyond it, the
//! scenarios every server broker runs on a server of its own ([`restart`]).

#![deny(missing_docs)]

pub mod backplane;
pub mod components;
pub mod direct;
pub mod log;
pub mod queue;
pub mod restart;
pub mod support;
pub mod workload;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

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
    features: Features,
}

/// Makes the broker refuse the next `count` settlements on a queue (a fault-injecting driver).
type RefuseFn = dyn Fn(&str, u32) + Send + Sync;

impl Factory {
    /// A factory from a function of the extra `init` options a test asks for. It has the
    /// features of [`Features::default`] until told otherwise.
    pub fn new<F, Fut>(open: F) -> Self
    where
        F: Fn(Vec<(String, String)>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Broker>> + Send + 'static,
    {
        Self {
            open: Arc::new(move |options| Box::pin(open(options))),
            refuse_settlements: None,
            features: Features::default(),
        }
    }

    /// Host instances on the broker at `url` (every instance on the same broker: one server, or
    /// one in-process store), through the component at `component` or the adapter embedded for
    /// the URL, with `options` on every instance. Connects once now, so a broker that does not
    /// answer fails here. The features are discovered: the driver's fault hook, and count
    /// retention when the adapter describes `retention.maxEntries`, the visibility option when
    /// it describes `queue.visibilityMs`.
    pub async fn for_url(
        url: &str,
        component: Option<PathBuf>,
        options: Vec<(String, String)>,
    ) -> anyhow::Result<Factory> {
        let driver = wrpc_broker::drivers::for_url(url)?;
        let url = driver.shared_url(url);
        let connection = driver
            .connect(&url)
            .await
            .with_context(|| format!("the {} broker at {url} must answer", driver.info().name))?;
        let open_url = url.clone();
        let mut factory = Factory::new(move |extra| {
            let (url, component, options) = (open_url.clone(), component.clone(), options.clone());
            async move {
                let mut builder = Broker::builder().url(&url)?.options(options).options(extra);
                if let Some(path) = component {
                    builder = builder.component_file(path);
                }
                Ok(builder.open().await?)
            }
        });
        if driver.refuse_settlements(&connection, "", 0) {
            factory = factory.with_settlement_refusals(move |queue, count| {
                driver.refuse_settlements(&connection, queue, count);
            });
        }
        let info = factory.instance().await?.info();
        let described = |option: &str| info.options.iter().any(|(name, _, _)| name == option);
        factory.features.retention_by_count = described("retention.maxEntries");
        factory.features.visibility = described("queue.visibilityMs");
        Ok(factory)
    }

    /// Let tests make the broker refuse settlements: `refuse(queue, count)` refuses the next
    /// `count` settlements on the queue of that name.
    pub fn with_settlement_refusals(
        mut self,
        refuse: impl Fn(&str, u32) + Send + Sync + 'static,
    ) -> Self {
        self.refuse_settlements = Some(Arc::new(refuse));
        self.features.refusals = true;
        self
    }

    /// Declare what the backend has, replacing what was discovered.
    pub fn with_features(mut self, features: Features) -> Self {
        self.features = features;
        self
    }

    /// What the backend has.
    pub fn features(&self) -> Features {
        self.features
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

/// What a backend (a broker with its adapter) has beyond the contracts every one must keep, as
/// Watermill's `Features`: a test that needs a feature the backend lacks is skipped, saying
/// why, never failed and never passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// Log retention by entry count (`retention.maxEntries`); without it, by bytes or age only.
    pub retention_by_count: bool,
    /// A fault hook that makes the broker refuse settlements on cue.
    pub refusals: bool,
    /// The adapter takes `queue.visibilityMs` (how long a delivery stays with its consumer
    /// before the broker may hand it to another).
    pub visibility: bool,
}

/// One feature a test may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// See [`Features::retention_by_count`].
    RetentionByCount,
    /// See [`Features::refusals`].
    Refusals,
    /// See [`Features::visibility`].
    Visibility,
}

impl Features {
    /// Whether the backend has `feature`.
    pub fn has(&self, feature: Feature) -> bool {
        match feature {
            Feature::RetentionByCount => self.retention_by_count,
            Feature::Refusals => self.refusals,
            Feature::Visibility => self.visibility,
        }
    }
}

impl Feature {
    /// Why a test needing this is skipped on a backend without it.
    pub fn lacking(self) -> &'static str {
        match self {
            Feature::RetentionByCount => {
                "the backend retains by bytes or age, not by entry count (`retention.maxEntries`)"
            }
            Feature::Refusals => "the backend's driver has no fault hook to refuse settlements",
            Feature::Visibility => "the adapter takes no `queue.visibilityMs` option",
        }
    }
}

/// Declares a capability module's contract tests: `contract_tests!(Log: a, b [RetentionByCount])`
/// makes its `tests()`, each test named after its function and needing the features in brackets.
#[macro_export]
macro_rules! contract_tests {
    ($capability:ident: $($name:ident $([$($needs:ident),+])?),* $(,)?) => {
        /// Every contract test of this capability.
        pub fn tests() -> Vec<$crate::Test> {
            vec![$($crate::Test {
                capability: $crate::Capability::$capability,
                name: stringify!($name),
                needs: &[$($($crate::Feature::$needs),+)?],
                run: |f| Box::pin($name(f)),
            }),*]
        }
    };
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
    /// The features it needs beyond the capability.
    pub needs: &'static [Feature],
    /// The test itself: `Err` says which assertion broke.
    pub run: fn(Factory) -> BoxFuture<anyhow::Result<()>>,
}

impl Test {
    /// `capability/name`, as filters match it.
    pub fn path(&self) -> String {
        format!("{}/{}", self.capability.name(), self.name)
    }
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
    /// The adapter does not export the capability, or the backend lacks a feature the test
    /// needs: the reason.
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

/// Why `test` is skipped on a backend with `capabilities` and `features`, if it is.
pub fn skip_reason(
    test: &Test,
    capabilities: &Capabilities,
    features: &Features,
) -> Option<String> {
    if !test.capability.offered_by(capabilities) {
        return Some(format!(
            "the component does not export `{}`",
            test.capability.name()
        ));
    }
    test.needs
        .iter()
        .find(|f| !features.has(**f))
        .map(|f| f.lacking().to_string())
}

/// Run one test against the broker `factory` opens, bounded by [`TEST_TIMEOUT`].
pub async fn run_one(factory: &Factory, test: &Test, capabilities: &Capabilities) -> Outcome {
    let started = Instant::now();
    let verdict = match skip_reason(test, capabilities, &factory.features()) {
        Some(why) => Verdict::Skipped(why),
        None => match tokio::time::timeout(TEST_TIMEOUT, (test.run)(factory.clone())).await {
            Ok(Ok(())) => Verdict::Pass,
            Ok(Err(e)) => Verdict::Fail(format!("{e:#}")),
            Err(_) => Verdict::Fail(format!("did not finish within {TEST_TIMEOUT:?}")),
        },
    };
    Outcome {
        capability: test.capability,
        name: test.name,
        verdict,
        elapsed: started.elapsed(),
    }
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
        .filter(|t| filter.is_none_or(|f| t.path().contains(f)))
        .collect();
    let mut outcomes = Vec::with_capacity(tests.len());
    for (i, test) in tests.iter().enumerate() {
        progress(i, tests.len(), test);
        let outcome = run_one(factory, test, &capabilities).await;
        let failed = matches!(outcome.verdict, Verdict::Fail(_));
        outcomes.push(outcome);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn needing(needs: &'static [Feature]) -> Test {
        Test {
            capability: Capability::Log,
            name: "t",
            needs,
            run: |_| Box::pin(async { Ok(()) }),
        }
    }

    #[test]
    fn a_test_is_skipped_with_a_reason_when_the_backend_lacks_what_it_needs() {
        let all = Capabilities {
            backplane: true,
            log: true,
            queue: true,
            direct: true,
        };
        let none = Features::default();
        let test = needing(&[Feature::RetentionByCount]);
        let why = skip_reason(&test, &all, &none).expect("skipped");
        assert!(why.contains("retains by bytes or age"), "{why}");
        let with = Features {
            retention_by_count: true,
            ..none
        };
        assert_eq!(skip_reason(&test, &all, &with), None);
        let why = skip_reason(&needing(&[Feature::Refusals]), &all, &with).expect("skipped");
        assert!(why.contains("fault hook"), "{why}");
        let no_log = Capabilities { log: false, ..all };
        let why = skip_reason(&needing(&[]), &no_log, &with).expect("skipped");
        assert!(why.contains("does not export `log`"), "{why}");
    }
}
