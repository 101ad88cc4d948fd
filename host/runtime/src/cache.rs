//! Compiled components are cached on disk so a second load of the same file skips compilation.
//!
//! Key: SHA-256 of the component file + the engine's `precompile_compatibility_hash`. The
//! directory is private to the host (mode 0700): deserialising a tampered artifact would run
//! arbitrary native code, so nothing else may write there.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A directory of compiled components for one engine configuration.
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
}

/// Where a component came from on load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled now (and written to the cache).
    Compiled,
    /// Deserialised from the cache.
    Cached,
}

impl ComponentCache {
    /// The default directory: `$WRPC_BROKER_CACHE`, else `$XDG_CACHE_HOME/wrpc-broker/components`,
    /// else `~/.cache/wrpc-broker/components`.
    pub fn default_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("WRPC_BROKER_CACHE") {
            return PathBuf::from(dir);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("wrpc-broker").join("components")
    }

    /// A cache in `dir`, created private to this user.
    pub fn open(dir: impl Into<PathBuf>) -> anyhow::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating cache dir {}", dir.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("making {} private", dir.display()))?;
        }
        Ok(Self { dir })
    }

    /// The file a component with these bytes compiles to under `engine`.
    pub fn path_for(&self, engine: &Engine, wasm: &[u8]) -> PathBuf {
        let mut engine_hash = DefaultHasher::new();
        engine
            .precompile_compatibility_hash()
            .hash(&mut engine_hash);
        let file_hash = hex::encode(Sha256::digest(wasm));
        self.dir
            .join(format!("{file_hash}-{:016x}.cwasm", engine_hash.finish()))
    }

    /// The component for `wasm`: from the cache when present, else compiled and stored.
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> anyhow::Result<(Component, Origin)> {
        let path = self.path_for(engine, wasm);
        if path.exists() {
            // SAFETY: the file was written by `store` below into a directory only this user can
            // write, for this exact engine configuration (part of the key).
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok((component, Origin::Cached)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "cached component unusable, recompiling: {e:#}")
                }
            }
        }
        let component = Component::new(engine, wasm)
            .map_err(|e| anyhow::anyhow!("compiling the component: {e:#}"))?;
        if let Err(e) = store(&path, &component) {
            tracing::warn!(path = %path.display(), "could not cache the compiled component: {e:#}");
        }
        Ok((component, Origin::Compiled))
    }
}

/// Write atomically: a reader never sees a half-written artifact.
fn store(path: &Path, component: &Component) -> anyhow::Result<()> {
    let bytes = component
        .serialize()
        .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
