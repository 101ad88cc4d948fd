//! Direct contracts of packets and addresses: a packet arrives whole and in order,
//! inboxes are unique and routable, a send nobody listens for is unavailable.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::channel::mpsc::unbounded;
use wrpc_broker::{Error, Incoming, ListenOptions, Packet, SendOptions};

use super::{REPLY, body, listen, text};
use crate::support::{next, silence, unique};
use crate::{Factory, ensure_eq};

pub(super) async fn a_packet_arrives_whole(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("whole");
    let (_listener, mut rx) = listen(&b.direct()?, &address, None).await?;
    let packet = Packet {
        body: vec![0, 159, 146, 150, 255],
        headers: vec![
            ("x-repeated".into(), b"one".to_vec()),
            ("x-binary".into(), vec![0, 255, 10]),
            ("x-repeated".into(), b"two".to_vec()),
        ],
        correlation_id: Some("corr-1".into()),
        reply_to: Some("somewhere.else".into()),
    };
    a.direct()?
        .send(&address, packet.clone(), SendOptions::default())
        .await?;
    let ((), got) = next(&mut rx, "the packet").await?;
    ensure_eq!(got, packet, "the packet as received");
    Ok(())
}

pub(super) async fn an_empty_packet_arrives_empty(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("empty");
    let (_listener, mut rx) = listen(&b.direct()?, &address, None).await?;
    let direct = a.direct()?;
    direct
        .send(&address, Packet::default(), SendOptions::default())
        .await?;
    direct
        .send(&address, body("after"), SendOptions::default())
        .await?;
    let ((), got) = next(&mut rx, "the empty packet").await?;
    ensure_eq!(
        got,
        Packet::default(),
        "the first packet (an empty one was sent)"
    );
    let ((), got) = next(&mut rx, "the packet after it").await?;
    ensure_eq!(text(&got), "after", "the packet after the empty one");
    Ok(())
}

pub(super) async fn inbox_addresses_are_unique_and_routable(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let mut seen = HashSet::new();
    for (name, host) in [("a", &a), ("b", &b)] {
        let direct = host.direct()?;
        for _ in 0..100 {
            let inbox = direct.inbox().await?;
            ensure!(
                !inbox.is_empty(),
                "instance {name} made an empty inbox address"
            );
            ensure!(
                seen.insert(inbox.clone()),
                "instance {name} made the inbox address {inbox} twice"
            );
        }
    }
    let inbox = a.direct()?.inbox().await?;
    let (_listener, mut rx) = listen(&a.direct()?, &inbox, None).await?;
    b.direct()?
        .send(&inbox, body("to-inbox"), SendOptions::default())
        .await
        .with_context(|| format!("sending to the inbox {inbox}"))?;
    let ((), got) = next(&mut rx, "the packet sent to an inbox").await?;
    ensure_eq!(text(&got), "to-inbox", "the packet sent to an inbox");
    Ok(())
}

pub(super) async fn send_to_an_address_nobody_listens_on_is_unavailable(
    f: Factory,
) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let direct = a.direct()?;
    let fresh = direct.inbox().await?;
    for address in [unique("nobody"), fresh] {
        match direct
            .send(&address, body("lost"), SendOptions::default())
            .await
        {
            Err(Error::Unavailable(_)) => {}
            other => {
                bail!("a send to {address}, where nobody listens: expected 503, got {other:?}")
            }
        }
        match direct.request(&address, "lost", REPLY).await {
            Err(Error::Unavailable(_)) => {}
            other => {
                bail!("a request to {address}, where nobody listens: expected 503, got {other:?}")
            }
        }
    }
    Ok(())
}

pub(super) async fn packets_from_one_sender_arrive_in_order(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let address = unique("ordered");
    // The default listener handles one packet at a time: check that too.
    let (tx, mut rx) = unbounded();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (in_flight, most) = (in_flight.clone(), most.clone());
        move |incoming: Incoming| {
            let (tx, in_flight, most) = (tx.clone(), in_flight.clone(), most.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                tx.unbounded_send(((), incoming.packet))?;
                Ok(())
            }
        }
    };
    let _listener = b
        .direct()?
        .listen(&address, handler, ListenOptions::default())
        .await?;
    let direct = a.direct()?;
    for i in 0..100 {
        direct
            .send(&address, body(format!("p{i}")), SendOptions::default())
            .await?;
        // In bursts: a busy listener queues packets, an idle one may take them as they come;
        // order must hold across the changes between the two.
        if i % 20 == 19 {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
    for i in 0..100 {
        let ((), got) = next(&mut rx, &format!("packet {i}")).await?;
        ensure_eq!(text(&got), format!("p{i}"), "packet {i} in send order");
    }
    silence(&mut rx, "after the 100 packets").await?;
    ensure_eq!(
        most.load(Ordering::SeqCst),
        1,
        "handlers running at once on a default listener"
    );
    Ok(())
}
