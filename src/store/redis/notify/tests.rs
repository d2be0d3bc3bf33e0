//! Unit tests of the wake-ups: registration before the question, what
//! wakes whom, invalidations and gaps.

use super::*;

fn notifier() -> Arc<Notifier> {
    Arc::new(Notifier::new(Arc::new(|_| {}), Duration::from_secs(3)))
}

fn push(payload: &str) -> PushInfo {
    PushInfo {
        kind: PushKind::Message,
        data: vec![
            Value::BulkString(b"sg:events".to_vec()),
            Value::BulkString(payload.as_bytes().to_vec()),
        ],
    }
}

#[tokio::test]
async fn a_message_before_the_wait_is_not_lost() {
    let notifier = notifier();
    let key = Key::for_value("t", b"k");
    let mut registration = notifier.register(key);
    notifier.on_push(push(&Event::Committed.message(&key)));
    let event = registration.wait(Duration::from_secs(5)).await;
    assert_eq!(event, Some(Event::Committed));
    assert_eq!(notifier.stats.by_message.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn other_keys_and_garbage_do_not_wake() {
    let notifier = notifier();
    let key = Key::for_value("t", b"k");
    let other = Key::for_value("t", b"other");
    let mut registration = notifier.register(key);
    notifier.on_push(push(&Event::Committed.message(&other)));
    notifier.on_push(push("not a message of ours"));
    notifier.on_push(push("c:0123"));
    assert_eq!(registration.wait(Duration::from_millis(10)).await, None);
}

#[test]
fn slots_are_dropped_with_their_last_registration() {
    let notifier = notifier();
    let key = Key::for_value("t", b"k");
    let a = notifier.register(key);
    let b = notifier.register(key);
    drop(a);
    assert_eq!(notifier.slots.lock().unwrap().len(), 1);
    drop(b);
    assert_eq!(notifier.slots.lock().unwrap().len(), 0);
}

#[test]
fn an_invalidation_reaches_the_callback_and_wakes_the_waiter() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let notifier = Arc::new(Notifier::new(
        {
            let seen = seen.clone();
            Arc::new(move |key| seen.lock().unwrap().push(key))
        },
        Duration::from_secs(3),
    ));
    let key = Key::for_value("t", b"k");
    let registration = notifier.register(key);
    notifier.on_push(push(&Event::Committed.message(&key)));
    assert!(
        seen.lock().unwrap().is_empty(),
        "a commit is not an invalidation"
    );
    notifier.on_push(push(&Event::Invalidated.message(&key)));
    assert_eq!(*seen.lock().unwrap(), [Invalidated::Key(key)]);
    assert_eq!(registration.rx.borrow().event, Event::Invalidated);
    // Another instance's signed notice counts; so does this process's own
    // echo (its purge's caller may have been dropped before it dropped its
    // copies), which it acknowledges itself.
    notifier.on_push(push(
        &Event::Invalidated.message_from(&key, "0123456789abcdef"),
    ));
    assert_eq!(seen.lock().unwrap().len(), 2);
    let mut acked = notifier.acks.expect(9);
    notifier.on_push(push(&notifier.invalidation(&key, 9)));
    assert_eq!(
        seen.lock().unwrap().len(),
        3,
        "its own echo drops its copies"
    );
    assert_eq!(acked.borrow_and_update().count, 1, "and is acknowledged");
    assert!(acked.borrow().by.contains(&notifier.instance), "by itself");
    // Another's, with a nonce: handled, then acknowledged to it.
    notifier.on_push(push(&format!("i:{key}:0123456789abcdef:5")));
    assert_eq!(seen.lock().unwrap().len(), 4);
    let mut queue = notifier.take_ack_queue().unwrap();
    assert_eq!(
        queue.try_recv().unwrap(),
        ("0123456789abcdef".to_owned(), 5, key.to_string()),
        "with what it invalidated"
    );
    notifier.on_push(push(&ack_message(9, "0123456789abcdef")));
    assert_eq!(acked.borrow().count, 2);
    assert!(acked.borrow().by.contains("0123456789abcdef"));
}

#[test]
fn a_gap_invalidates_everything_at_once_and_after_it() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let notifier = Arc::new(Notifier::new(
        {
            let seen = seen.clone();
            Arc::new(move |what| seen.lock().unwrap().push(what))
        },
        Duration::from_secs(3),
    ));
    let subscribed = || PushInfo {
        kind: PushKind::Subscribe,
        data: vec![Value::BulkString(b"sg:events".to_vec()), Value::Int(1)],
    };
    // The first subscription is no gap.
    notifier.on_push(subscribed());
    assert!(seen.lock().unwrap().is_empty());
    notifier.on_push(PushInfo {
        kind: PushKind::Disconnection,
        data: vec![],
    });
    notifier.subscription_lost();
    assert_eq!(
        *seen.lock().unwrap(),
        [Invalidated::Everything],
        "at once, not only once it is back, and once per gap"
    );
    notifier.on_push(subscribed());
    notifier.on_push(subscribed());
    assert_eq!(
        *seen.lock().unwrap(),
        [Invalidated::Everything, Invalidated::Everything]
    );
}
