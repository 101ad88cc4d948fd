//! What the `serve` tests share: a `serve` process of its own (config, port, log), curl and its
//! Server-Sent Events, and JSON.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "admin-token-1";
pub const READER: &str = "reader-token-1";

/// A `serve` process on a port of its own, with its config in a folder of its own.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub dir: PathBuf,
    pub port: u16,
}

pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

pub fn config_text(port: u16, broker: &str) -> String {
    let tokens = format!(
        "[[token]]\ntoken = \"{ADMIN}\"\nallow = [\"*:*:*\"]\n\
         [[token]]\ntoken = \"{READER}\"\nallow = [\"log:read:orders.*\"]\n"
    );
    // `open` in the broker text: no tokens (a browser's EventSource sends no Authorization).
    // Its pages are files here (origin `null`).
    let (top, broker, tokens) = match broker.strip_prefix("open\n") {
        Some(broker) => ("cors_origins = [\"null\"]\n", broker, String::new()),
        None => ("", broker, tokens),
    };
    format!("listen = \"127.0.0.1:{port}\"\nmax_body_bytes = 4096\n{top}{broker}\n{tokens}")
}

impl Server {
    /// Start `serve` on the `[broker]` table `broker` in a fresh folder.
    pub fn start(broker: &str) -> Server {
        let dir = std::env::temp_dir().join(format!("serve-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let port = free_port();
        std::fs::write(dir.join("serve.toml"), config_text(port, broker)).expect("the config");
        Server::start_in(dir, port)
    }

    pub fn start_in(dir: PathBuf, port: u16) -> Server {
        let log = std::fs::File::create(dir.join("serve.log")).expect("a log file");
        let child = Command::new(env!("CARGO_BIN_EXE_wrpc-broker"))
            .args(["serve", "--config"])
            .arg(dir.join("serve.toml"))
            .args(["--poll", "0.2"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting wrpc-broker serve");
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
            port,
        };
        server.wait_for(
            || curl(&server.url("/healthz"), &[]).0 == 200,
            "serve to answer",
        );
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    pub fn wait_for(&self, mut done: impl FnMut() -> bool, what: &str) {
        let started = Instant::now();
        while !done() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "waited 30 s for {what}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting") {
                return (status, self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no exit 60 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run curl with `args` on `url`: the status and the body.
pub fn curl(url: &str, args: &[&str]) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("running curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

pub fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

pub fn post(url: &str, token: &str, body: &str) -> (u16, String) {
    curl(
        url,
        &["-X", "POST", "-H", &bearer(token), "--data-binary", body],
    )
}

pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The events of an SSE response read for `seconds`: (id, data) pairs.
pub fn events(url: &str, token: &str, seconds: &str, extra: &[&str]) -> Vec<(String, String)> {
    let mut args = vec!["-N", "--max-time", seconds, "-H"];
    let auth = bearer(token);
    args.push(&auth);
    args.extend_from_slice(extra);
    let (_, body) = curl(url, &args);
    let mut out = Vec::new();
    let (mut id, mut data) = (String::new(), String::new());
    for line in body.lines() {
        if let Some(v) = line
            .strip_prefix("id: ")
            .or_else(|| line.strip_prefix("id:"))
        {
            id = v.to_string();
        } else if let Some(v) = line
            .strip_prefix("data: ")
            .or_else(|| line.strip_prefix("data:"))
        {
            data = v.to_string();
        } else if line.is_empty() && !data.is_empty() {
            out.push((std::mem::take(&mut id), std::mem::take(&mut data)));
        }
    }
    out
}

pub fn values(events: &[(String, String)]) -> Vec<String> {
    events
        .iter()
        .map(|(_, data)| json(data)["value"].as_str().unwrap_or("?").to_string())
        .collect()
}

pub fn append(server: &Server, topic: &str, value: &str) -> String {
    let (status, body) = post(&server.url(&format!("/v1/log/{topic}")), ADMIN, value);
    assert_eq!(status, 201, "append: {body}");
    json(&body)["id"].as_str().expect("an id").to_string()
}

pub fn write_config(server: &Server, broker: &str) {
    let port = server.port;
    let path = server.dir.join("serve.toml");
    let temp = server.dir.join("serve.toml.new");
    std::fs::write(&temp, config_text(port, broker)).expect("the new config");
    std::fs::rename(temp, path).expect("replacing the config");
}
