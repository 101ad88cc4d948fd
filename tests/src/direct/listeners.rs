//! Direct contracts of listeners: groups compete, ungrouped listeners each get every
//! packet, a stopped listener gets nothing more and hands over what reached it.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::channel::mpsc::{UnboundedReceiver, unbounded};
use wrpc_broker::{Error, ListenOptions, Packet, SendOptions};

use super::{body, forward_to, listen, raw_packet, text};
use crate::support::{ARRIVAL, next, silence, unique};
use crate::{Factory, ensure_eq};

/// Read `n` packets from `rx`, then expect silence; returns who got each body, by body.
async fn gather(
    rx: &mut UnboundedReceiver<(usize, Packet)>,
    n: usize,
    what: &str,
) -> anyhow::Result<BTreeMap<String, Vec<usize>>> {
    let mut got: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        let (who, packet) = next(rx, &format!("{what}: packet {i} of {n}")).await?;
        got.entry(text(&packet)).or_default().push(who);
    }
    silence(rx, &format!("{what} after {n} packets")).await?;
    Ok(got)
}

pub(super) async fn grouped_listeners_on_two_instances_compete(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let sender = f.instance().await?;
    let address = unique("work");
    let (tx, mut rx) = unbounded();
    let mut listeners = Vec::new();
    for (who, host) in [&a, &b].into_iter().enumerate() {
        let handler = forward_to(who, tx.clone());
        let options = ListenOptions {
            group: Some("workers".into()),
            ..ListenOptions::default()
        };
        listeners.push(host.direct()?.listen(&address, handler, options).await?);
    }
    let direct = sender.direct()?;
    for i in 0..100 {
        direct
            .send(&address, body(format!("p{i}")), SendOptions::default())
            .await?;
    }
    let got = gather(&mut rx, 100, "the group").await?;
    let mut per_listener = [0usize; 2];
    for i in 0..100 {
        let whom = got.get(&format!("p{i}")).cloned().unwrap_or_default();
        ensure!(
            whom.len() == 1,
            "packet p{i} must reach exactly one member of the group, reached {whom:?}"
        );
        per_listener[whom[0]] += 1;
    }
    ensure!(
        per_listener.iter().all(|n| *n > 0),
        "both members of the group must get some of the 100 packets, got {per_listener:?}"
    );
    Ok(())
}

pub(super) async fn each_group_and_each_ungrouped_listener_gets_every_packet(
    f: Factory,
) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("mixed");
    // Who: 0 and 1 in group `g1`, 2 alone in group `g2`, 3 ungrouped.
    let members = [
        (&a, Some("g1")),
        (&b, Some("g1")),
        (&b, Some("g2")),
        (&a, None),
    ];
    let (tx, mut rx) = unbounded();
    let mut listeners = Vec::new();
    for (who, (host, group)) in members.into_iter().enumerate() {
        let handler = forward_to(who, tx.clone());
        let options = ListenOptions {
            group: group.map(str::to_string),
            ..ListenOptions::default()
        };
        listeners.push(host.direct()?.listen(&address, handler, options).await?);
    }
    let n = 20;
    for i in 0..n {
        a.direct()?
            .send(&address, body(format!("p{i}")), SendOptions::default())
            .await?;
    }
    let got = gather(&mut rx, 3 * n, "two groups and one ungrouped listener").await?;
    for i in 0..n {
        let mut whom = got.get(&format!("p{i}")).cloned().unwrap_or_default();
        whom.sort();
        ensure!(
            whom.len() == 3 && (whom[0] == 0 || whom[0] == 1) && whom[1] == 2 && whom[2] == 3,
            "packet p{i} must reach one member of g1 (0 or 1), the member of g2 (2) and the \
             ungrouped listener (3), reached {whom:?}"
        );
    }
    Ok(())
}

pub(super) async fn ungrouped_listeners_each_get_every_packet(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("all");
    let mut listeners = [
        listen(&a.direct()?, &address, None).await?,
        listen(&a.direct()?, &address, None).await?,
        listen(&b.direct()?, &address, None).await?,
    ];
    for i in 0..20 {
        b.direct()?
            .send(&address, body(format!("p{i}")), SendOptions::default())
            .await?;
    }
    for (who, (_, rx)) in listeners.iter_mut().enumerate() {
        for i in 0..20 {
            let ((), got) = next(rx, &format!("listener {who}: packet {i}")).await?;
            ensure_eq!(text(&got), format!("p{i}"), "listener {who}: packet {i}");
        }
        silence(rx, &format!("listener {who} after 20 packets")).await?;
    }
    Ok(())
}

pub(super) async fn a_stopped_listener_gets_nothing_more(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("stop");
    let (stopping, mut stopped_rx) = listen(&a.direct()?, &address, None).await?;
    let (staying, mut staying_rx) = listen(&b.direct()?, &address, None).await?;
    let send = |text: &'static str| {
        let direct = b.direct();
        let address = address.clone();
        async move {
            direct?
                .send(&address, body(text), SendOptions::default())
                .await
                .map_err(anyhow::Error::from)
        }
    };
    send("before").await?;
    next(&mut stopped_rx, "the first packet at the listener to stop").await?;
    next(&mut staying_rx, "the first packet at the staying listener").await?;
    stopping.stop().await;
    send("after").await?;
    let ((), got) = next(&mut staying_rx, "the staying listener after a stop").await?;
    ensure_eq!(text(&got), "after", "the staying listener after a stop");
    silence(&mut stopped_rx, "a stopped listener").await?;
    staying.stop().await;
    match send("to-nobody").await {
        Err(e) if matches!(e.downcast_ref(), Some(Error::Unavailable(_))) => {}
        other => bail!("a send once the only listener stopped: expected 503, got {other:?}"),
    }
    silence(&mut staying_rx, "the second stopped listener").await
}

pub(super) async fn an_adapter_listener_hands_over_what_reached_it_before_its_stop(
    f: Factory,
) -> anyhow::Result<()> {
    // The adapter itself (no host machinery): packets sent while nobody reads the listener's
    // stream wait in the adapter and in the broker's subscription; `stop` must take the
    // listener off the broker and still hand every one of them over, in order, before the
    // stream ends. This is what keeps a hot swap from losing a request that reached only the
    // old adapter.
    // Sent one at a time with a pause, so the adapter relays each on its own: the host's side
    // of the stream holds 64 batches, so from then on the packets wait in the adapter and the
    // broker, however loaded the machine is.
    const PACKETS: usize = 300;
    let broker = f.instance().await?;
    let adapter = broker.adapter();
    let address = unique("handover");
    let (id, mut packets) = adapter.direct_listen(address.clone(), None).await?;
    for n in 0..PACKETS {
        adapter
            .direct_send(address.clone(), raw_packet(n.to_string()), 5_000)
            .await
            .with_context(|| format!("send {n}"))?;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let read_to_end = async {
        let mut got = Vec::new();
        while let Some(batch) = packets.recv().await {
            got.extend(
                batch
                    .into_iter()
                    .map(|p| String::from_utf8_lossy(&p.body).into_owned()),
            );
        }
        got
    };
    let (stopped, got) = tokio::join!(
        adapter.direct_stop(id),
        tokio::time::timeout(ARRIVAL, read_to_end)
    );
    stopped.context("stopping the listener")?;
    let got = got.context("the stopped listener's stream did not end")?;
    let expected: Vec<String> = (0..PACKETS).map(|n| n.to_string()).collect();
    ensure_eq!(
        got.len(),
        PACKETS,
        "packets handed over by the stopped listener"
    );
    ensure_eq!(got, expected, "the packets handed over, in order");
    match adapter
        .direct_send(address, raw_packet("late"), 1_000)
        .await
    {
        Err(Error::Unavailable(_)) => Ok(()),
        other => bail!("a send once the only listener stopped: expected 503, got {other:?}"),
    }
}

pub(super) async fn a_live_listener_is_healthy(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let address = unique("health");
    let (listener, mut rx) = listen(&a.direct()?, &address, Some("g")).await?;
    ensure!(listener.healthy().await, "a new listener is healthy");
    a.direct()?
        .send(&address, body("ping"), SendOptions::default())
        .await?;
    next(&mut rx, "a packet").await?;
    ensure!(
        listener.healthy().await,
        "a listener that got a packet is healthy"
    );
    listener.stop().await;
    ensure!(
        !listener.healthy().await,
        "a stopped listener is not healthy"
    );
    Ok(())
}
