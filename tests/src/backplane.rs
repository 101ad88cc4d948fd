//! Backplane contracts: at-most-once fan-out to every subscriber on every host instance of one
//! broker; channel names are literal.

use anyhow::Context as _;
use bytes::Bytes;

use crate::support::{next, silence, unique};
use crate::{Factory, ensure_eq};

crate::contract_tests!(
    Backplane:
    publish_100_reaches_a_subscriber_in_order,
    every_subscriber_on_every_instance_gets_each_payload,
    a_new_subscriber_gets_no_old_payloads,
    channel_names_are_literal_never_patterns,
    channels_are_isolated,
    publishing_with_no_subscriber_succeeds,
    an_unsubscribed_subscriber_gets_nothing_and_others_keep_receiving,
    concurrent_close_while_publishing,
    an_empty_payload_arrives_empty,
);

async fn publish_100_reaches_a_subscriber_in_order(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let backplane = broker.backplane()?;
    let channel = unique("room");
    let mut sub = backplane.subscribe(&channel).await?;
    for i in 0..100 {
        backplane.publish(&channel, format!("p{i}")).await?;
    }
    for i in 0..100 {
        ensure_eq!(
            next(&mut sub, &format!("payload {i}")).await?,
            Bytes::from(format!("p{i}")),
            "payload {i}"
        );
    }
    silence(&mut sub, "after the 100 payloads").await
}

async fn every_subscriber_on_every_instance_gets_each_payload(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let channel = unique("room");
    let mut subs = [
        a.backplane()?.subscribe(&channel).await?,
        a.backplane()?.subscribe(&channel).await?,
        b.backplane()?.subscribe(&channel).await?,
    ];
    b.backplane()?.publish(&channel, "from-b").await?;
    a.backplane()?.publish(&channel, "from-a").await?;
    for (i, sub) in subs.iter_mut().enumerate() {
        let mut got = vec![
            next(sub, &format!("subscriber {i}")).await?,
            next(sub, &format!("subscriber {i}")).await?,
        ];
        got.sort();
        ensure_eq!(
            got,
            vec![Bytes::from("from-a"), Bytes::from("from-b")],
            "subscriber {i}"
        );
        silence(sub, &format!("subscriber {i} after two payloads")).await?;
    }
    Ok(())
}

async fn a_new_subscriber_gets_no_old_payloads(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let channel = unique("room");
    let mut early = a.backplane()?.subscribe(&channel).await?;
    for i in 0..5 {
        a.backplane()?.publish(&channel, format!("old{i}")).await?;
    }
    for i in 0..5 {
        next(
            &mut early,
            &format!("old payload {i} on the early subscriber"),
        )
        .await?;
    }
    // An instance that published before it subscribed at all (its first broker subscription).
    let c = f.instance().await?;
    c.backplane()?.publish(&channel, "old-from-c").await?;
    next(&mut early, "the payload published by c").await?;
    let mut fresh = c.backplane()?.subscribe(&channel).await?;
    silence(
        &mut fresh,
        "a first subscriber on an instance that published before",
    )
    .await?;
    // The adapter's own contract, without the host's fan-out in between: a broker subscription
    // made after a publish starts empty.
    let raw_channel = unique("raw-room");
    c.adapter()
        .backplane_publish(raw_channel.clone(), vec![b"before".to_vec()])
        .await?;
    let mut raw = c.adapter().backplane_subscribe(raw_channel.clone()).await?;
    if let Ok(Some(old)) = tokio::time::timeout(crate::support::SILENCE, raw.recv()).await {
        anyhow::bail!(
            "the adapter's new subscription delivered {} payload(s) published before it",
            old.len()
        );
    }
    for (name, host) in [("same instance", &a), ("other instance", &b)] {
        let mut late = host.backplane()?.subscribe(&channel).await?;
        silence(
            &mut late,
            &format!("a new subscriber ({name}) before any new payload"),
        )
        .await?;
        a.backplane()?.publish(&channel, "new").await?;
        ensure_eq!(
            next(&mut late, name).await?,
            Bytes::from("new"),
            "the first payload of a new subscriber ({name})"
        );
        next(&mut early, "the early subscriber").await?;
    }
    Ok(())
}

async fn channel_names_are_literal_never_patterns(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let backplane = broker.backplane()?;
    let base = unique("room");
    for (pattern, concrete) in [
        (format!("{base}:*"), format!("{base}:1")),
        (format!("{base}.>"), format!("{base}.a.b")),
        (format!("{base}.*"), format!("{base}.x")),
        (format!("{base}/#"), format!("{base}/y")),
        (format!("{base}?"), format!("{base}1")),
    ] {
        let mut wild = backplane.subscribe(&pattern).await?;
        let mut exact = backplane.subscribe(&concrete).await?;
        backplane.publish(&concrete, "to-concrete").await?;
        ensure_eq!(
            next(&mut exact, &concrete).await?,
            Bytes::from("to-concrete"),
            "{concrete}"
        );
        silence(&mut wild, &format!("{pattern} must not match {concrete}")).await?;
        backplane.publish(&pattern, "to-pattern").await?;
        ensure_eq!(
            next(&mut wild, &pattern).await?,
            Bytes::from("to-pattern"),
            "publishing to the literal {pattern}"
        );
        silence(
            &mut exact,
            &format!("{concrete} after a publish to {pattern}"),
        )
        .await?;
    }
    Ok(())
}

async fn channels_are_isolated(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let backplane = broker.backplane()?;
    let (one, two) = (unique("a"), unique("b"));
    let mut sub_one = backplane.subscribe(&one).await?;
    let mut sub_two = backplane.subscribe(&two).await?;
    backplane.publish(&one, "1").await?;
    ensure_eq!(
        next(&mut sub_one, "channel one").await?,
        Bytes::from("1"),
        "channel one"
    );
    silence(&mut sub_two, "channel two").await
}

async fn publishing_with_no_subscriber_succeeds(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    broker
        .backplane()?
        .publish(&unique("empty"), "nobody")
        .await
        .context("publish to a channel nobody hears")?;
    Ok(())
}

async fn an_unsubscribed_subscriber_gets_nothing_and_others_keep_receiving(
    f: Factory,
) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let channel = unique("room");
    let leaving = a.backplane()?.subscribe(&channel).await?;
    let mut staying = b.backplane()?.subscribe(&channel).await?;
    drop(leaving);
    a.backplane()?.publish(&channel, "after").await?;
    ensure_eq!(
        next(&mut staying, "the staying subscriber").await?,
        Bytes::from("after"),
        "after an unsubscribe"
    );
    let mut again = a.backplane()?.subscribe(&channel).await?;
    silence(&mut again, "a re-subscriber before a new payload").await?;
    b.backplane()?.publish(&channel, "again").await?;
    ensure_eq!(
        next(&mut again, "the re-subscriber").await?,
        Bytes::from("again"),
        "after re-subscribing"
    );
    Ok(())
}

async fn concurrent_close_while_publishing(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let backplane = broker.backplane()?;
    let channel = unique("room");
    let mut keeper = backplane.subscribe(&channel).await?;
    let mut transient = Vec::new();
    for _ in 0..20 {
        transient.push(backplane.subscribe(&channel).await?);
    }
    let publisher = {
        let (backplane, channel) = (backplane.clone(), channel.clone());
        tokio::spawn(async move {
            for i in 0..200 {
                backplane.publish(&channel, format!("p{i}")).await?;
            }
            anyhow::Ok(())
        })
    };
    let closers: Vec<_> = transient
        .into_iter()
        .map(|s| tokio::spawn(async move { drop(s) }))
        .collect();
    for closer in closers {
        closer.await?;
    }
    publisher.await??;
    for i in 0..200 {
        ensure_eq!(
            next(&mut keeper, &format!("payload {i}")).await?,
            Bytes::from(format!("p{i}")),
            "payload {i}"
        );
    }
    Ok(())
}

async fn an_empty_payload_arrives_empty(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let channel = unique("empty");
    let mut sub = b.backplane()?.subscribe(&channel).await?;
    let backplane = a.backplane()?;
    backplane.publish(&channel, Vec::<u8>::new()).await?;
    backplane.publish(&channel, "after").await?;
    ensure_eq!(
        next(&mut sub, "the empty payload").await?,
        Bytes::new(),
        "the first payload (zero bytes were published)"
    );
    ensure_eq!(
        next(&mut sub, "the payload after it").await?,
        Bytes::from("after"),
        "the payload after the empty one"
    );
    Ok(())
}
