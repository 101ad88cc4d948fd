//! Direct contracts: addressable inboxes, at most once. `inbox()` is unique and routable;
//! listeners in one group compete, ungrouped ones each get every packet; packets from one sender
//! to one address arrive in order; a send nobody can take is 503; a stopped adapter listener
//! hands over what reached it before the stop; the host's request/reply
//! pairs each reply with its request across host instances.

mod listeners;
mod packets;
mod request;

use std::future::Ready;
use std::time::Duration;

use anyhow::Context as _;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use wrpc_broker::{Direct, Incoming, ListenOptions, Listener, Packet};

use crate::support::ARRIVAL;
use listeners::{
    a_live_listener_is_healthy, a_stopped_listener_gets_nothing_more,
    an_adapter_listener_hands_over_what_reached_it_before_its_stop,
    each_group_and_each_ungrouped_listener_gets_every_packet,
    grouped_listeners_on_two_instances_compete, ungrouped_listeners_each_get_every_packet,
};
use packets::{
    a_packet_arrives_whole, an_empty_packet_arrives_empty, inbox_addresses_are_unique_and_routable,
    packets_from_one_sender_arrive_in_order, send_to_an_address_nobody_listens_on_is_unavailable,
};
use request::{
    a_packet_without_reply_to_cannot_be_answered, a_request_nobody_answers_times_out,
    concurrent_requests_each_get_their_own_reply, request_reply_across_two_instances,
};

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
