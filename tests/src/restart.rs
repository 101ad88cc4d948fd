//! The broker-restart scenario, once for every server broker: a server of the test's own (its
//! own loopback port, its state in a directory of its own) is killed with SIGKILL in the middle
//! of a queue run and of log reads, started again on the same state, and nothing is lost.
//!
//! A broker supplies a [`ServerRecipe`] (the command line that runs its server, the URL and the
//! adapter options); [`a_server_restart_loses_nothing`] runs the scenario against it. A server
//! that cannot be run, or does not become ready, fails the test with what it logged: it is never
//! skipped.

use std::collections::HashSet;
use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use wrpc_broker::{
    AppendOptions, Backplane, ConsumeOptions, Entry, ProduceOptions, ReadFrom, Reader, Subscription,
};

use crate::support::{next_within, retry};
use crate::workload::{Handled, numbered_consumer, until_all_handled, until_handled};
use crate::{Factory, ensure_eq};

/// How a broker's server of the test's own is run: a program, its arguments, the port it
/// prefers, the broker URL, the adapter options and a readiness check. In the arguments and the
/// URL, `{port}` stands for its port and `{data}` for the directory of its state. The server
/// must persist every write it acknowledges (a SIGKILL loses nothing acknowledged) and serve in
/// the foreground: the process spawned is the one killed (a script `exec`s the server; one that
/// must prepare its state once, as Kafka's `format`, does it when `{data}` is empty).
#[derive(Debug, Clone)]
pub struct ServerRecipe {
    program: String,
    install_hint: String,
    args: Vec<String>,
    preferred_port: u16,
    url: String,
    options: Vec<(String, String)>,
    ready: fn(u16) -> bool,
    startup: Duration,
}

impl ServerRecipe {
    /// Run `program` (looked up on `PATH`, then in the sbin directories), which `install_hint`
    /// says how to get when it is missing (e.g. `apt-get install redis-server`). It prefers
    /// `port` (a free one is taken when that one is busy), is ready once it accepts connections,
    /// within 10 s.
    pub fn new(program: &str, install_hint: &str, port: u16) -> Self {
        ServerRecipe {
            program: program.into(),
            install_hint: install_hint.into(),
            args: Vec::new(),
            preferred_port: port,
            url: String::new(),
            options: Vec::new(),
            ready: accepts,
            startup: Duration::from_secs(10),
        }
    }

    /// More arguments.
    pub fn args<'a>(mut self, args: impl IntoIterator<Item = &'a str>) -> Self {
        self.args.extend(args.into_iter().map(String::from));
        self
    }

    /// The broker URL, e.g. `redis://127.0.0.1:{port}`.
    pub fn url(mut self, url: &str) -> Self {
        self.url = url.into();
        self
    }

    /// One more adapter option every host instance gets.
    pub fn option(mut self, name: &str, value: &str) -> Self {
        self.options.push((name.into(), value.into()));
        self
    }

    /// Ready when `check(port)` says so, within `startup` (a quick check: it blocks).
    pub fn ready(mut self, check: fn(u16) -> bool, startup: Duration) -> Self {
        (self.ready, self.startup) = (check, startup);
        self
    }

    fn fill(&self, text: &str, port: u16, data: &Path) -> String {
        text.replace("{port}", &port.to_string())
            .replace("{data}", &data.to_string_lossy())
    }
}

/// A server of the test's own, run from a [`ServerRecipe`]: killed on drop, its directory (the
/// state and `server.log`, where its output goes) removed.
pub struct OwnServer {
    recipe: ServerRecipe,
    program: PathBuf,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// How long the server stays down between the kill and the start again.
const DOWNTIME: Duration = Duration::from_millis(300);

impl OwnServer {
    /// Start the server on a fresh directory and wait until it is ready; a missing program or a
    /// server that exits or is not ready in time is an error.
    pub async fn start(recipe: ServerRecipe) -> anyhow::Result<Self> {
        let program = find_program(&recipe.program).with_context(|| {
            format!(
                "`{}` is not installed ({}): the restart test never skips",
                recipe.program, recipe.install_hint
            )
        })?;
        let name = program.file_name().unwrap_or_default().to_string_lossy();
        let dir = std::env::temp_dir().join(format!(
            "wrpc-restart-{name}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(dir.join("data"))
            .with_context(|| format!("a directory for the server at {}", dir.display()))?;
        let mut server = OwnServer {
            port: free_port(recipe.preferred_port)?,
            recipe,
            program,
            dir,
            child: None,
        };
        server.spawn().await?;
        Ok(server)
    }

    /// Its broker URL.
    pub fn url(&self) -> String {
        self.recipe
            .fill(&self.recipe.url, self.port, &self.dir.join("data"))
    }

    /// The adapter options every host instance gets.
    pub fn options(&self) -> Vec<(String, String)> {
        self.recipe.options.clone()
    }

    /// Kill the server (SIGKILL: nothing graceful), wait until its port is closed, leave it down
    /// for a moment and start it again on the same state.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while accepts(self.port) {
            ensure!(
                Instant::now() < deadline,
                "port {} still open 10 s after the server was killed",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(DOWNTIME).await;
        self.spawn().await
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .context("the server's log file")?;
        let data = self.dir.join("data");
        let args = self.recipe.args.iter();
        let child = Command::new(&self.program)
            .args(args.map(|arg| self.recipe.fill(arg, self.port, &data)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("{} could not be started", self.program.display()))?;
        let child = self.child.insert(child);
        let deadline = Instant::now() + self.recipe.startup;
        loop {
            let ready = (self.recipe.ready)(self.port);
            // Exited: it could not start (when the check passed, another server took the port).
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{} exited ({status}) instead of serving on 127.0.0.1:{}\n{}",
                    self.program.display(),
                    self.port,
                    self.log_tail()
                );
            }
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} was not ready on 127.0.0.1:{} within {:?}\n{}",
                    self.program.display(),
                    self.port,
                    self.recipe.startup,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The last lines the server wrote (its directory goes with it).
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        match lines[lines.len().saturating_sub(20)..].join("\n") {
            tail if tail.trim().is_empty() => "it wrote nothing".to_string(),
            tail => format!("its last output:\n{tail}"),
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether something accepts connections on 127.0.0.1:`port` (the default readiness check).
pub fn accepts(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok()
}

/// `preferred` when free, else a free loopback port (two test runs at once on one machine).
fn free_port(preferred: u16) -> anyhow::Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", preferred))
        .or_else(|_| TcpListener::bind(("127.0.0.1", 0)))
        .context("a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// `program` on `PATH` or in the sbin directories (not always on a user's `PATH`).
fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

// ------------------------------------------------------------------------------ the scenario

/// The log topic, the queue and the backplane channel of the scenario (a fresh server each time).
const TOPIC: &str = "restart-log";
const QUEUE: &str = "restart-queue";
const ROOM: &str = "restart-room";
/// Entries appended before the restart, in batches of [`BATCH`], and how many each reader has
/// read when the server goes down.
const ENTRIES_BEFORE: usize = 2000;
const BATCH: usize = 250;
const READ_BEFORE: usize = 500;
/// Messages produced before the restart, and how many are handled when the server goes down.
const MESSAGES_BEFORE: usize = 300;
const HANDLED_BEFORE: usize = 60;
/// Entries and messages added after the restart, through the same handles.
const ADDED_AFTER: usize = 100;
/// How long an entry may take before the restart, and after it.
const BEFORE: Duration = Duration::from_secs(10);
const AFTER: Duration = Duration::from_secs(30);

/// The server restarts in the middle of a queue run and of two log reads (one on the host that
/// appends, one on another host), with a backplane subscriber on each host; nothing is lost.
/// Before the restart: 2000 entries, each reader 500 in; 300 messages, handled slowly by two
/// consumers on one host and one on another, 60 of them handled; each subscriber heard a
/// payload. After it, through the same handles, 100 more messages and 100 more entries go in at
/// once, and one more entry once the readers caught up. Then each reader has read every entry
/// once, in order, with dense offsets, the last one the entry appended last, with its id; each
/// subscriber hears a payload published after the restart (its subscription re-established);
/// and every message was handled.
pub async fn a_server_restart_loses_nothing(recipe: ServerRecipe) -> anyhow::Result<()> {
    let mut server = OwnServer::start(recipe).await?;
    let url = server.url();
    let factory = Factory::for_url(&url, None, server.options())
        .await
        .with_context(|| format!("the server of our own at {url}"))?;
    let broker = factory.instance().await.context("a host instance")?;
    let other = factory.instance().await.context("a second host instance")?;

    // A log of 2000 entries, and a reader on each host that has read 500 of them.
    let log = broker.log()?;
    for start in (0..ENTRIES_BEFORE).step_by(BATCH) {
        log.append_batch(TOPIC, numbered_entries(start..start + BATCH))
            .await
            .context("appends before the restart")?;
    }
    let mut readers = Vec::new();
    for (who, host) in [("the appending host", &broker), ("another host", &other)] {
        let reader = host.log()?.read(TOPIC, ReadFrom::Earliest).await?;
        readers.push((who, reader, Vec::new()));
    }
    for (who, reader, read) in &mut readers {
        read_until(reader, read, READ_BEFORE, BEFORE, who).await?;
    }

    // A queue of 300 messages, handled slowly by two consumers on one host and one on another.
    let queue = broker.queue()?;
    queue
        .produce_batch(QUEUE, numbered_messages(0..MESSAGES_BEFORE))
        .await
        .context("produce")?;
    let handled = Handled::default();
    let mut consumers = Vec::new();
    for host in [&broker, &broker, &other] {
        let options = ConsumeOptions {
            prefetch: 8,
            dead_letter: None,
        };
        let work = Duration::from_millis(5);
        consumers.push(numbered_consumer(&host.queue()?, QUEUE, &handled, options, work).await?);
    }
    until_handled(&handled, HANDLED_BEFORE, BEFORE)
        .await
        .context("the queue run did not start before the restart")?;

    // A backplane subscriber on each host, each having heard a payload.
    let backplane = broker.backplane()?;
    let mut rooms = Vec::new();
    for host in [&broker, &other] {
        rooms.push(host.backplane()?.subscribe(ROOM).await?);
    }
    for (n, room) in rooms.iter_mut().enumerate() {
        hear(&backplane, room, b"before", BEFORE)
            .await
            .with_context(|| format!("subscriber {n} before the restart"))?;
    }

    // Restart in the middle of all three.
    let before = handled.lock().unwrap().len();
    server.restart().await.context("the restart")?;
    println!(
        "restarted the server with {before} of {MESSAGES_BEFORE} messages handled and \
         {READ_BEFORE} of {ENTRIES_BEFORE} entries read"
    );

    // At once, through the same handles: more work and more entries.
    let (messages, entries) = (MESSAGES_BEFORE + ADDED_AFTER, ENTRIES_BEFORE + ADDED_AFTER);
    queue
        .produce_batch(QUEUE, numbered_messages(MESSAGES_BEFORE..messages))
        .await
        .context("produce after the restart")?;
    log.append_batch(TOPIC, numbered_entries(ENTRIES_BEFORE..entries))
        .await
        .context("appends after the restart")?;

    // The readers resume without a gap, and see entries appended once they caught up.
    for (who, reader, read) in &mut readers {
        read_until(reader, read, entries, AFTER, who).await?;
    }
    let appended = retry(Duration::from_secs(20), "the last append", || {
        log.append(TOPIC, "after", AppendOptions::default())
    })
    .await?;
    for (who, reader, read) in &mut readers {
        let last = next_within(reader, AFTER, "the entry appended last")
            .await?
            .context("the reader failed")?;
        ensure_eq!(last.value, b"after".to_vec(), "{who}: the last entry");
        ensure_eq!(last.id, appended, "{who}: the last entry's id");
        let values: Vec<String> = read
            .iter()
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
            .collect();
        let expected: Vec<String> = (0..entries).map(|i| i.to_string()).collect();
        ensure!(
            values == expected,
            "{who}: the reader skipped or repeated entries across the restart (first wrong at \
             {:?})",
            values.iter().zip(&expected).position(|(v, e)| v != e)
        );
        let offsets: Vec<u64> = read
            .iter()
            .chain([&last])
            .map(|e| e.position.offset)
            .collect();
        ensure!(
            offsets.windows(2).all(|w| w[1] == w[0] + 1),
            "{who}: offsets stay dense across the restart"
        );
    }

    // Each subscription was re-established: a payload published now reaches both subscribers
    // (what was published while they were cut off may be lost, as at-most-once allows).
    for (n, room) in rooms.iter_mut().enumerate() {
        hear(&backplane, room, b"after", AFTER)
            .await
            .with_context(|| format!("subscriber {n} after the restart"))?;
    }

    // Every message is handled.
    until_all_handled(&handled, messages)
        .await
        .context("after the restart")?;
    for consumer in &consumers {
        consumer.stop().await;
    }
    let all: HashSet<usize> = (0..messages).collect();
    ensure!(
        *handled.lock().unwrap() == all,
        "every message handled across the restart, and no other"
    );
    println!(
        "after the restart: all {messages} messages handled, {} entries read in order by each \
         reader",
        entries + 1
    );
    Ok(())
}

/// Publish `payload` to [`ROOM`] every 100 ms until `room` hears it, for up to `within`
/// (other payloads it hears are passed over; a publish that fails is tried again).
async fn hear(
    backplane: &Backplane,
    room: &mut Subscription,
    payload: &[u8],
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let _ = backplane.publish(ROOM, payload).await;
        let heard = tokio::time::timeout(Duration::from_millis(100), async {
            while let Some(got) = room.recv().await {
                if got.as_ref() == payload {
                    return true;
                }
            }
            false
        })
        .await;
        match heard {
            Ok(true) => return Ok(()),
            Ok(false) => bail!("the subscription ended for good"),
            Err(_) => {}
        }
    }
    bail!(
        "{:?} not heard within {within:?}",
        String::from_utf8_lossy(payload)
    )
}

/// Entries whose values are the numbers of `range`.
fn numbered_entries(range: Range<usize>) -> Vec<(Vec<u8>, AppendOptions)> {
    range
        .map(|i| (i.to_string().into_bytes(), AppendOptions::default()))
        .collect()
}

/// Messages whose bodies are the numbers of `range`.
fn numbered_messages(range: Range<usize>) -> Vec<(Vec<u8>, ProduceOptions)> {
    range
        .map(|i| (i.to_string().into_bytes(), ProduceOptions::default()))
        .collect()
}

/// Read from `reader` (on `who`) into `read` until it holds `count` entries, each within
/// `within`.
async fn read_until(
    reader: &mut Reader,
    read: &mut Vec<Entry>,
    count: usize,
    within: Duration,
    who: &str,
) -> anyhow::Result<()> {
    while read.len() < count {
        let what = format!("{who}: entry {} of {count}", read.len());
        let entry = next_within(reader, within, &what).await?;
        read.push(entry.with_context(|| format!("{what}: the reader failed"))?);
    }
    Ok(())
}
