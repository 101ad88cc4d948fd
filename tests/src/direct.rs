//! Direct contracts: addressable inboxes, at most once. `inbox()` is unique and routable;
//! listeners in one group compete, ungrouped ones each get every packet; packets from one sender
//! to one address arrive in order; a send nobody can take is 503; a stopped adapter listener
//! hands over what reached it before the stop; the host's request/reply
//! pairs each reply with its request across host instances.

use std::collections::{BTreeMap, HashSet};
use std::future::Ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use wrpc_broker::{Direct, Error, Incoming, ListenOptions, Listener, Packet, SendOptions};

use crate::support::{ARRIVAL, next, silence, unique};
use crate::{Factory, ensure_eq};

crate::contract_tests!(
    Direct:
    request_reply_across_two_instances,
    a_packet_arrives_whole,
    an_empty_packet_arrives_empty,
    inbox_addresses_are_unique_and_routable,
    send_to_an_address_nobody_listens_on_is_unavailable,
    grouped_listeners_on_two_instances_compete,
    each_group_and_each_ungrouped_listener_gets_every_packet,
    ungrouped_listeners_each_get_every_packet,
    packets_from_one_sender_arrive_in_order,
    a_request_nobody_answers_times_out,
    a_stopped_listener_gets_nothing_more,
    an_adapter_listener_hands_over_what_reached_it_before_its_stop,
    a_live_listener_is_healthy,
    concurrent_requests_each_get_their_own_reply,
    a_packet_without_reply_to_cannot_be_answered,
);

/// How long a request in these tests waits for its reply when one is expected.
const REPLY: Duration = ARRIVAL;

/// A handler that forwards each packet, tagged with `who`, to `tx`.
fn forward_to<T: Clone + Send + Sync + 'static>(
    who: T,
    tx: UnboundedSender<(T, Packet)>,
) -> impl Fn(Incoming) -> Ready<anyhow::Result<()>> + Send + Sync + 'static {
    move |incoming: Incoming| {
        let sent = tx.unbounded_send((who.clone(), incoming.packet));
        std::future::ready(sent.context("the test stopped reading"))
    }
}

/// Listen on `address` (in `group`, if any), forwarding packets to the returned stream.
async fn listen(
    direct: &Direct,
    address: &str,
    group: Option<&str>,
) -> anyhow::Result<(Listener, UnboundedReceiver<((), Packet)>)> {
    let (tx, rx) = unbounded();
    let handler = forward_to((), tx);
    let options = ListenOptions {
        group: group.map(str::to_string),
        ..ListenOptions::default()
    };
    let listener = direct
        .listen(address, handler, options)
        .await
        .with_context(|| format!("listening on {address}"))?;
    Ok((listener, rx))
}

/// A packet with just a body.
fn body(text: impl Into<String>) -> Packet {
    Packet {
        body: text.into().into_bytes(),
        ..Packet::default()
    }
}

/// A packet of the adapter's own interface with just a body.
fn raw_packet(text: impl Into<String>) -> wrpc_broker::bindings::direct::Packet {
    wrpc_broker::bindings::direct::Packet {
        body: text.into().into_bytes(),
        headers: Vec::new(),
        correlation_id: None,
        reply_to: None,
    }
}

fn text(packet: &Packet) -> String {
    String::from_utf8_lossy(&packet.body).into_owned()
}

async fn request_reply_across_two_instances(f: Factory) -> anyhow::Result<()> {
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

async fn a_packet_arrives_whole(f: Factory) -> anyhow::Result<()> {
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

async fn an_empty_packet_arrives_empty(f: Factory) -> anyhow::Result<()> {
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

async fn inbox_addresses_are_unique_and_routable(f: Factory) -> anyhow::Result<()> {
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

async fn send_to_an_address_nobody_listens_on_is_unavailable(f: Factory) -> anyhow::Result<()> {
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

async fn grouped_listeners_on_two_instances_compete(f: Factory) -> anyhow::Result<()> {
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

async fn each_group_and_each_ungrouped_listener_gets_every_packet(
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

async fn ungrouped_listeners_each_get_every_packet(f: Factory) -> anyhow::Result<()> {
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

async fn packets_from_one_sender_arrive_in_order(f: Factory) -> anyhow::Result<()> {
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

async fn a_request_nobody_answers_times_out(f: Factory) -> anyhow::Result<()> {
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

async fn a_stopped_listener_gets_nothing_more(f: Factory) -> anyhow::Result<()> {
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

async fn an_adapter_listener_hands_over_what_reached_it_before_its_stop(
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

async fn a_live_listener_is_healthy(f: Factory) -> anyhow::Result<()> {
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

async fn concurrent_requests_each_get_their_own_reply(f: Factory) -> anyhow::Result<()> {
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

async fn a_packet_without_reply_to_cannot_be_answered(f: Factory) -> anyhow::Result<()> {
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
