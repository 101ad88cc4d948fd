//! Direct contracts of request/reply: each reply reaches its own request across host
//! instances, an unanswered request times out, a packet sent is not answerable.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::channel::mpsc::unbounded;
use wrpc_broker::{Error, Incoming, ListenOptions, SendOptions};

use super::{REPLY, body, listen, text};
use crate::support::{next, unique};
use crate::{Factory, ensure_eq};

pub(super) async fn request_reply_across_two_instances(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("billing.quote");
    let (seen_tx, mut seen) = unbounded();
    let handler = move |incoming: Incoming| {
        let seen_tx = seen_tx.clone();
        async move {
            incoming
                .reply(format!("re:{}", text(&incoming.packet)))
                .await?;
            seen_tx.unbounded_send(incoming.packet)?;
            Ok(())
        }
    };
    let _listener = b
        .direct()?
        .listen(&address, handler, ListenOptions::default())
        .await?;
    for (i, (name, requester)) in [("a", &a), ("b", &b)].into_iter().enumerate() {
        let reply = requester
            .direct()?
            .request(&address, format!("quote-{i}"), REPLY)
            .await
            .with_context(|| format!("the request from instance {name}"))?;
        ensure_eq!(text(&reply), format!("re:quote-{i}"), "the reply to {name}");
        let request = next(
            &mut seen,
            &format!("the request from {name} at the listener"),
        )
        .await?;
        ensure!(
            request.correlation_id.is_some(),
            "a request carries a correlation id, got {request:?}"
        );
        ensure!(
            request.reply_to.is_some(),
            "a request carries a reply-to address, got {request:?}"
        );
        ensure_eq!(
            reply.correlation_id,
            request.correlation_id,
            "the reply echoes the request's correlation id"
        );
    }
    Ok(())
}

pub(super) async fn a_request_nobody_answers_times_out(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("silent");
    let (_listener, mut rx) = listen(&b.direct()?, &address, None).await?;
    let timeout = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    match a.direct()?.request(&address, "anyone?", timeout).await {
        Err(Error::Timeout(message)) => ensure!(
            message.contains(&address),
            "the timeout should name the address {address}: {message}"
        ),
        other => bail!("a request nobody answers: expected a timeout, got {other:?}"),
    }
    let waited = started.elapsed();
    ensure!(
        waited >= timeout,
        "the request gave up after {waited:?}, before its {timeout:?} timeout"
    );
    let ((), got) = next(&mut rx, "the unanswered request at the listener").await?;
    ensure_eq!(text(&got), "anyone?", "the unanswered request");
    Ok(())
}

pub(super) async fn concurrent_requests_each_get_their_own_reply(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("echo");
    // Replies come back out of order: the later a request, the sooner its answer.
    let options = ListenOptions {
        group: None,
        concurrency: 20,
    };
    let handler = |incoming: Incoming| async move {
        let i: u64 = text(&incoming.packet)
            .trim_start_matches("q")
            .parse()
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(5 * (20 - i.min(20)))).await;
        incoming
            .reply(format!("re:{}", text(&incoming.packet)))
            .await?;
        Ok(())
    };
    let _listener = b.direct()?.listen(&address, handler, options).await?;
    let direct = a.direct()?;
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let (direct, address) = (direct.clone(), address.clone());
            tokio::spawn(async move { (i, direct.request(&address, format!("q{i}"), REPLY).await) })
        })
        .collect();
    let mut ids = HashSet::new();
    for request in requests {
        let (i, reply) = request.await?;
        let reply = reply.with_context(|| format!("request {i}"))?;
        ensure_eq!(text(&reply), format!("re:q{i}"), "the reply to request {i}");
        let id = reply
            .correlation_id
            .with_context(|| format!("the reply to request {i} has no correlation id"))?;
        ensure!(ids.insert(id.clone()), "correlation id {id} used twice");
    }
    Ok(())
}

pub(super) async fn a_packet_without_reply_to_cannot_be_answered(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let address = unique("noreply");
    let (tx, mut rx) = unbounded();
    let handler = move |incoming: Incoming| {
        let tx = tx.clone();
        async move {
            let answer = incoming.reply("re").await;
            tx.unbounded_send(answer)?;
            Ok(())
        }
    };
    let _listener = a
        .direct()?
        .listen(&address, handler, ListenOptions::default())
        .await?;
    a.direct()?
        .send(&address, body("fire-and-forget"), SendOptions::default())
        .await?;
    match next(&mut rx, "the reply attempt").await? {
        Err(Error::BadRequest(_)) => Ok(()),
        other => bail!("replying to a packet without reply_to: expected 400, got {other:?}"),
    }
}
