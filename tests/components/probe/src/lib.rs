//! A probe adapter for the runtime's tests, hostile on demand. It keeps nothing; `log.append`
//! obeys its topic (see [`hostile`]): `trap` traps, `spin` loops forever, `sleep:<ms>` awaits
//! the host's sleep, and the hostile commands below; anything else answers one id per record at
//! once. `init` misbehaves as its options say (`hostile.init`, from generation
//! `hostile.initFrom`), `close` as `hostile.close`. With `only-log` it exports only `log`; with
//! `forbidden-import` it imports an interface no host provides; with `hostile-describe` its
//! `describe` never returns.

#[cfg(not(any(feature = "only-log", feature = "forbidden-import")))]
wit_bindgen::generate!({
    inline: "package wrpc:probe; world probe { include wrpc:broker/full-adapter@0.1.0; }",
    path: ["../../../wit/broker"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
    },
});

#[cfg(feature = "only-log")]
wit_bindgen::generate!({
    inline: "package wrpc:probe; world probe { include wrpc:broker/log-adapter@0.1.0; }",
    path: ["../../../wit/broker"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
    },
});

#[cfg(feature = "forbidden-import")]
wit_bindgen::generate!({
    inline: r#"
        package wrpc:probe;
        interface secrets { read: func() -> string; }
        world probe { include wrpc:broker/log-adapter@0.1.0; import secrets; }
    "#,
    path: ["../../../wit/broker"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
    },
});

use exports::wrpc::broker::adapter::{Guest as Adapter, Info};
use exports::wrpc::broker::log::{Entry, Guest as Log, Page, RecordIn};
use wrpc_broker_guest::{Error, Position, Start};

struct Probe;
export!(Probe);

mod hostile;

/// The options `init` takes.
const OPTIONS: &[wrpc_broker_guest::options::Spec] = &[
    wrpc_broker_guest::options::Spec {
        name: "hostile.init",
        default: "",
        doc: "how init misbehaves: spin-host, block, hang, panic (empty: it does not)",
    },
    wrpc_broker_guest::options::Spec {
        name: "hostile.initFrom",
        default: "1",
        doc: "the first generation whose init misbehaves",
    },
    wrpc_broker_guest::options::Spec {
        name: "hostile.close",
        default: "",
        doc: "how close misbehaves: spin-host, block, hang (empty: it does not)",
    },
];

static CLOSE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

impl Adapter for Probe {
    fn describe() -> Info {
        #[cfg(feature = "hostile-describe")]
        hostile::spin_calling_the_host();
        // Said before the host knows the adapter's name: it must still go to `broker.probe`.
        wrpc_broker_guest::log::write(wrpc_broker_guest::Level::Info, "probe: describe");
        Info {
            name: "probe".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            broker: "none".into(),
            options: vec![],
        }
    }

    async fn init(generation: u32, options: Vec<(String, String)>) -> Result<(), Error> {
        let options = wrpc_broker_guest::options::Options::new(OPTIONS, options)?;
        let from: u32 = options.get("hostile.initFrom")?;
        *CLOSE.lock().unwrap() = options.text("hostile.close").unwrap_or_default();
        match options.text("hostile.init") {
            Some(how) if generation >= from => hostile::misbehave(&how).await,
            _ => Ok(()),
        }
    }

    async fn close() {
        let how = CLOSE.lock().unwrap().clone();
        if !how.is_empty() {
            let _ = hostile::misbehave(&how).await;
        }
    }
}

impl Log for Probe {
    async fn append(topic: String, batch: Vec<RecordIn>) -> Result<Vec<String>, Error> {
        #[cfg(feature = "forbidden-import")]
        let _ = wrpc::probe::secrets::read();
        if topic == "trap" {
            panic!("the probe was asked to trap");
        }
        if topic == "spin" {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        if let Some(ms) = topic.strip_prefix("sleep:") {
            let ms = ms.parse().map_err(|_| Error::bad_request("sleep:<ms>"))?;
            wrpc_broker_guest::sleep(ms).await;
        }
        hostile::append(&topic).await?;
        Ok((0..batch.len()).map(|i| i.to_string()).collect())
    }

    fn parse_id(_text: String) -> Result<(), Error> {
        Ok(())
    }

    async fn range(_topic: String, _origin: Start, _limit: u32) -> Result<Page, Error> {
        Ok(Page {
            entries: vec![],
            done: true,
        })
    }

    async fn tail(
        _topic: String,
        _origin: Start,
    ) -> Result<(Vec<Position>, wit_bindgen::StreamReader<Entry>), Error> {
        Err(Error::Unsupported("the probe has no tail".into()))
    }
}

#[cfg(not(any(feature = "only-log", feature = "forbidden-import")))]
mod others {
    use super::*;
    use exports::wrpc::broker::backplane::Guest as Backplane;
    use exports::wrpc::broker::direct::{Guest as Direct, ListenerId, Packet};
    use exports::wrpc::broker::queue::{
        ConsumeOptions, ConsumerId, Delivery, Guest as Queue, Message, Settlement,
    };
    use wrpc_broker_guest::Tag;

    fn no<T>() -> Result<T, Error> {
        Err(Error::Unsupported(
            "the probe only answers log.append".into(),
        ))
    }

    impl Backplane for Probe {
        async fn publish(_channel: String, _payloads: Vec<Vec<u8>>) -> Result<(), Error> {
            no()
        }
        async fn subscribe(_channel: String) -> Result<wit_bindgen::StreamReader<Vec<u8>>, Error> {
            no()
        }
    }

    impl Queue for Probe {
        async fn produce(_queue: String, _batch: Vec<Message>) -> Result<(), Error> {
            no()
        }
        async fn consume(
            _queue: String,
            _opts: ConsumeOptions,
        ) -> Result<(ConsumerId, wit_bindgen::StreamReader<Delivery>), Error> {
            no()
        }
        async fn settle(
            _consumer: ConsumerId,
            batch: Vec<(Tag, Settlement)>,
        ) -> Vec<Result<(), Error>> {
            batch.iter().map(|_| no()).collect()
        }
        fn healthy(_consumer: ConsumerId) -> Option<bool> {
            None
        }
        async fn stop(_consumer: ConsumerId) {}
        async fn depth(_queue: String) -> Result<u64, Error> {
            no()
        }
    }

    impl Direct for Probe {
        fn inbox() -> String {
            wrpc_broker_guest::ids::prefixed("probe.")
        }
        async fn send(_address: String, _message: Packet, _timeout_ms: u32) -> Result<(), Error> {
            no()
        }
        async fn listen(
            _address: String,
            _group: Option<String>,
        ) -> Result<(ListenerId, wit_bindgen::StreamReader<Packet>), Error> {
            no()
        }
        fn healthy(_listener: ListenerId) -> Option<bool> {
            None
        }
        async fn stop(_listener: ListenerId) {}
    }
}
