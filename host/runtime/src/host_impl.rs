//! The `wrpc:broker/host` import every component gets: logging into `tracing`, the operator's
//! ids, timers that never block the instance, wall-clock time and `encode-token`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmtime::component::{Accessor, HasSelf};

use super::sandbox::Ctx;
use crate::bindings::{host, types};
use crate::token;

impl host::Host for Ctx {
    fn log(&mut self, level: types::Level, message: String) {
        let level = match level {
            types::Level::Trace => tracing::Level::TRACE,
            types::Level::Debug => tracing::Level::DEBUG,
            types::Level::Info => tracing::Level::INFO,
            types::Level::Warn => tracing::Level::WARN,
            types::Level::Error => tracing::Level::ERROR,
        };
        // Cut at `output::MAX_LINE`, like stdout and stderr.
        self.log.log(level, &message);
    }

    fn generate_id(&mut self) -> String {
        self.ids.generate()
    }

    fn now_ms(&mut self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn encode_token(
        &mut self,
        name: String,
        safe: String,
        escape: String,
        max_len: u32,
    ) -> Result<String, types::Error> {
        token::encode_token(&name, &safe, &escape, max_len)
            .map_err(|e| types::Error::BadRequest(format!("encode-token: {e}")))
    }
}

impl types::Host for Ctx {}

impl<T> host::HostWithStore<T> for HasSelf<Ctx> {
    async fn sleep(_accessor: &Accessor<T, Self>, ms: u32) {
        tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
    }
}
