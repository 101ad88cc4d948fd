//! Tests of the driver's calls against the NATS server of `scripts/services.sh`.

use super::*;
use futures::StreamExt;

/// `count` requests to `subject`, empty.
fn outgoing(subject: &str, count: usize) -> Vec<wit::Outgoing> {
    (0..count)
        .map(|_| wit::Outgoing {
            subject: subject.to_string(),
            headers: Vec::new(),
            payload: Vec::new(),
        })
        .collect()
}

/// A client of the NATS server of `scripts/services.sh`, a fresh subject and its
/// subscription (which the server has).
async fn listening() -> (async_nats::Client, String, async_nats::Subscriber) {
    let client = async_nats::connect("nats://127.0.0.1:4222")
        .await
        .expect("the NATS server of scripts/services.sh on 127.0.0.1:4222");
    let subject = client.new_inbox();
    let subscription = client.subscribe(subject.clone()).await.unwrap();
    client.flush().await.unwrap();
    (client, subject, subscription)
}

/// `request-all-keeping` hands on only the reply headers it was asked for, whatever their
/// case, every value of a repeated one, and the rest of the reply as `request-all` does.
/// Needs the NATS server of `scripts/services.sh`.
#[tokio::test]
async fn request_all_keeping_cuts_reply_headers_to_the_names_kept() {
    let (client, subject, mut asked) = listening().await;
    let replier = client.clone();
    let answering = tokio::spawn(async move {
        let request = asked.next().await.expect("the request");
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Sequence", "7");
        headers.append("x-wrpc-key", "a2V5");
        headers.append("x-wrpc-key", "second");
        headers.insert("X-Wrpc-Headers", "packed");
        let reply = request.reply.expect("a reply subject");
        replier
            .publish_with_headers(reply, headers, "payload".into())
            .await
            .unwrap();
    });
    let keep = ["X-WRPC-KEY".to_string(), "x-wrpc-headers".to_string()];
    let answers = request_all(&client, outgoing(&subject, 1), 5_000, Some(&keep)).await;
    answering.await.unwrap();
    let [Ok(reply)] = answers.as_slice() else {
        panic!("{answers:?}");
    };
    let mut headers = reply.headers.clone();
    headers.sort();
    let value = |v: &str| v.as_bytes().to_vec();
    assert_eq!(
        headers,
        [
            ("X-Wrpc-Headers".to_string(), value("packed")),
            ("x-wrpc-key".to_string(), value("a2V5")),
            ("x-wrpc-key".to_string(), value("second")),
        ]
    );
    assert_eq!(reply.payload, b"payload");
    assert_eq!(reply.status, None);

    // Over its cap of names nothing is sent and every answer is `bad-request`.
    let keep = vec!["x-name".to_string(); MAX_KEPT_NAMES + 1];
    let answers = request_all(&client, outgoing(&subject, 2), 300, Some(&keep)).await;
    for answer in &answers {
        assert!(
            matches!(answer, Err(wit::NatsError::BadRequest(why)) if why.contains("at most 64")),
            "{answer:?}"
        );
    }
}

/// Over its cap `request-all` sends nothing and answers `bad-request` for each request; at
/// the cap every request goes out. Needs the NATS server of `scripts/services.sh`.
#[tokio::test]
async fn request_all_over_its_cap_sends_nothing_and_at_it_sends_all() {
    let (client, subject, mut seen) = listening().await;

    let over = MAX_REQUESTS_PER_CALL + 1;
    let answers = request_all(&client, outgoing(&subject, over), 1_000, None).await;
    assert_eq!(answers.len(), over);
    for answer in &answers {
        assert!(
            matches!(answer, Err(wit::NatsError::BadRequest(why)) if why.contains("at most 4096")),
            "{answer:?}"
        );
    }
    client.flush().await.unwrap();
    let leaked = tokio::time::timeout(Duration::from_millis(300), seen.next()).await;
    assert!(
        leaked.is_err(),
        "a request over the cap went out: {leaked:?}"
    );

    // Nobody replies, so each request at the cap times out — after it went out.
    let answers = request_all(
        &client,
        outgoing(&subject, MAX_REQUESTS_PER_CALL),
        300,
        None,
    )
    .await;
    assert_eq!(answers.len(), MAX_REQUESTS_PER_CALL);
    assert!(
        answers
            .iter()
            .all(|a| !matches!(a, Err(wit::NatsError::BadRequest(_)))),
        "a request at the cap was refused"
    );
    for received in 0..MAX_REQUESTS_PER_CALL {
        tokio::time::timeout(Duration::from_secs(10), seen.next())
            .await
            .unwrap_or_else(|_| panic!("only {received} requests at the cap arrived"))
            .expect("the subscription ended");
    }
}

/// `request-all` puts its requests on the connection in the order given, however many (a
/// chain of JetStream publishes depends on it). Needs the NATS server of
/// `scripts/services.sh`.
#[tokio::test]
async fn request_all_sends_in_the_order_given() {
    let (client, subject, mut seen) = listening().await;
    let count = 1_000;
    let requests = (0..count)
        .map(|i: usize| wit::Outgoing {
            subject: subject.clone(),
            headers: Vec::new(),
            payload: i.to_string().into_bytes(),
        })
        .collect();
    // Nobody replies: each answer times out, after its request went out.
    let answers = request_all(&client, requests, 300, None).await;
    assert_eq!(answers.len(), count);
    for expected in 0..count {
        let request = tokio::time::timeout(Duration::from_secs(10), seen.next())
            .await
            .unwrap_or_else(|_| panic!("only {expected} requests arrived"))
            .expect("the subscription ended");
        assert_eq!(
            String::from_utf8_lossy(&request.payload),
            expected.to_string(),
            "request {expected} out of order"
        );
    }
}
