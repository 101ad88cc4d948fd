//! Ids that cannot be read from: malformed (400), past the tip (400), of another log or older
//! than the retained history (410).

use anyhow::bail;
use wrpc_broker::{Error, ReadFrom};

use super::{append_n, expected, take, values};
use crate::support::unique;
use crate::{Factory, ensure_eq};

pub(super) async fn a_malformed_id_is_bad_request(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("malformed");
    append_n(&log, &topic, 2).await?;
    for bad in ["not-an-id", "", "::", "\u{0}"] {
        match log.parse_id(bad).await {
            Err(Error::BadRequest(_)) => {}
            other => bail!("parse-id({bad:?}): expected bad request, got {other:?}"),
        }
        match log.read(&topic, ReadFrom::After(bad.into())).await {
            Err(Error::BadRequest(_)) => {}
            other => bail!("read after {bad:?}: expected bad request, got {other:?}"),
        }
    }
    Ok(())
}

/// The id of the same log `distance` entries later, when ids end in a decimal offset.
fn forge_later(id: &str, distance: u64) -> Option<String> {
    let digits = id.len() - id.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = id.split_at(id.len() - digits);
    let n: u64 = tail.parse().ok()?;
    Some(format!("{head}{}", n + distance))
}

pub(super) async fn an_id_past_the_tip_is_bad_request(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("tip");
    let ids = append_n(&log, &topic, 3).await?;
    let Some(past) = forge_later(&ids[2], 1000) else {
        // Ids without a trailing offset (e.g. a partition-offset vector): forge per format.
        bail!("cannot derive an id past the tip from {:?}", ids[2]);
    };
    match log.read(&topic, ReadFrom::After(past.clone())).await {
        Err(Error::BadRequest(_)) => Ok(()),
        other => bail!("read after {past:?} (past the tip): expected bad request, got {other:?}"),
    }
}

pub(super) async fn an_id_from_another_log_is_gone(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let (one, other) = (unique("one"), unique("other"));
    let foreign = append_n(&log, &one, 3).await?;
    append_n(&log, &other, 3).await?;
    match log.read(&other, ReadFrom::After(foreign[0].clone())).await {
        Err(Error::Gone(_)) => Ok(()),
        other => bail!("an id minted by another log: expected gone (410), got {other:?}"),
    }
}

pub(super) async fn an_id_older_than_retention_is_gone(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance_with(&[("retention.maxEntries", "5")]).await?;
    let log = broker.log()?;
    let topic = unique("retention");
    let ids = append_n(&log, &topic, 20).await?;
    match log.read(&topic, ReadFrom::After(ids[2].clone())).await {
        Err(Error::Gone(_)) => {}
        other => bail!("an id older than the retained history: expected gone (410), got {other:?}"),
    }
    let mut earliest = log.read(&topic, ReadFrom::Earliest).await?;
    ensure_eq!(
        values(&take(&mut earliest, 5, "retained").await?),
        expected(15..20),
        "the retained entries"
    );
    let mut resumed = log.read(&topic, ReadFrom::After(ids[16].clone())).await?;
    ensure_eq!(
        values(&take(&mut resumed, 3, "inside retention").await?),
        expected(17..20),
        "resume inside retention"
    );
    Ok(())
}
