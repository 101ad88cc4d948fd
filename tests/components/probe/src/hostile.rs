//! What the probe does to attack its host, on command.
//!
//! As a `log.append` topic: `spin-host` (a loop calling `host.now-ms`, which must not renew the
//! CPU slice), `block:<ms>` (`std::thread::sleep`, a blocking WASI wait), `panic:<text>` (a
//! panic with that message), `grow:<MiB>` (allocate and touch that much memory), `log-line:<KiB>`
//! (one `host.log` line and one stdout line of that size), `yield-forever` (a loop that awaits
//! the host's sleep each turn: cooperative, never done). The same words (without arguments:
//! `block` sleeps 60 s) make `init` or `close` misbehave, plus `hang` (await forever).

use wrpc_broker_guest::{Error, Level};

/// Loop forever, calling a host import each turn.
pub fn spin_calling_the_host() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(wrpc_broker_guest::now_ms()));
    }
}

/// Misbehave as `how` says (for `init` and `close`).
pub async fn misbehave(how: &str) -> Result<(), Error> {
    match how {
        "spin-host" => spin_calling_the_host(),
        "block" => std::thread::sleep(std::time::Duration::from_secs(60)),
        "hang" => std::future::pending::<()>().await,
        "panic" => panic!("the probe's init was told to panic"),
        other => return Err(Error::bad_request(format!("hostile: unknown `{other}`"))),
    }
    Ok(())
}

/// The hostile `log.append` topics; any other topic does nothing here.
pub async fn append(topic: &str) -> Result<(), Error> {
    let (command, argument) = topic.split_once(':').unwrap_or((topic, ""));
    let number = || {
        argument
            .parse::<u64>()
            .map_err(|_| Error::bad_request(format!("{command}:<number>")))
    };
    match command {
        "spin-host" => spin_calling_the_host(),
        "block" => std::thread::sleep(std::time::Duration::from_millis(number()?)),
        "panic" => panic!("{argument}"),
        "grow" => {
            let mut held: Vec<Vec<u8>> = Vec::new();
            for _ in 0..number()? {
                held.push(vec![1; 1 << 20]);
            }
            std::hint::black_box(&held);
        }
        "log-line" => {
            let line = "x".repeat((number()? as usize) << 10);
            wrpc_broker_guest::log::write(Level::Info, &line);
            println!("{line}");
        }
        "yield-forever" => loop {
            wrpc_broker_guest::sleep(0).await;
        },
        _ => {}
    }
    Ok(())
}
