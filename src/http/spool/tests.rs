//! Tests of the spool: readers, failures, the kept body, bounded memory.

use super::*;
use std::task::Wake;
use std::time::Duration;

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

fn read(reader: &mut SpoolReader) -> Poll<Option<Read>> {
    let waker = Waker::from(Arc::new(Noop));
    reader.poll_read(&mut Context::from_waker(&waker))
}

fn data(poll: Poll<Option<Read>>) -> Bytes {
    match poll {
        Poll::Ready(Some(Read::Frame(frame))) => frame.into_data().expect("data"),
        _ => panic!("expected data"),
    }
}

#[test]
fn every_reader_reads_from_the_start_at_its_own_pace() {
    let spool = Spool::new(None, 1 << 20);
    // Keeps the start for the late reader.
    let _hold = Hold::new(&spool);
    let mut early = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"ab"));
    assert_eq!(data(read(&mut early)), "ab");
    assert!(read(&mut early).is_pending());
    spool.push(Bytes::from_static(b"cd"));
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", "1".parse().unwrap());
    spool.finish(Some(trailers));
    let mut late = SpoolReader::new(spool.clone());
    for reader in [&mut early, &mut late] {
        if reader.next == 0 {
            assert_eq!(data(read(reader)), "ab");
        }
        assert_eq!(data(read(reader)), "cd");
        assert!(matches!(read(reader), Poll::Ready(Some(Read::Frame(f))) if f.is_trailers()));
        assert!(matches!(read(reader), Poll::Ready(None)));
    }
    // Trailers: not a body the cache may keep.
    assert!(spool.to_owned_bytes().is_none());
}

#[test]
fn a_failure_reaches_every_reader_after_the_bytes_read() {
    let spool = Spool::new(None, 1 << 20);
    spool.push(Bytes::from_static(b"ab"));
    spool.fail();
    let mut reader = SpoolReader::new(spool.clone());
    assert_eq!(data(read(&mut reader)), "ab");
    assert!(matches!(read(&mut reader), Poll::Ready(Some(Read::Failed))));
    assert!(matches!(read(&mut reader), Poll::Ready(None)));
    assert!(spool.to_owned_bytes().is_none());
}

#[test]
fn the_kept_body_is_one_exact_buffer() {
    let spool = Spool::new(None, 1 << 20);
    let big = Bytes::from(vec![1u8; 4096]);
    spool.push(big.slice(0..3));
    spool.push(big.slice(10..12));
    spool.finish(None);
    let owned = spool.to_owned_bytes().unwrap();
    assert_eq!(owned.len(), 5);
    // Not a slice of the big buffer.
    assert!(!big.as_ptr_range().contains(&owned.as_ptr()));
}

fn failed(poll: Poll<Option<Read>>) -> bool {
    matches!(poll, Poll::Ready(Some(Read::Failed)))
}

#[test]
fn a_body_that_breaks_its_declared_length_fails() {
    let short = Spool::new(Some(4), 1 << 20);
    let mut reader = SpoolReader::new(short.clone());
    assert!(short.push(Bytes::from_static(b"ab")));
    short.finish(None);
    assert_eq!(data(read(&mut reader)), "ab");
    assert!(failed(read(&mut reader)));
    assert!(short.to_owned_bytes().is_none());

    let long = Spool::new(Some(3), 1 << 20);
    let mut reader = SpoolReader::new(long.clone());
    assert!(long.push(Bytes::from_static(b"ab")));
    assert!(!long.push(Bytes::from_static(b"cd")));
    assert_eq!(data(read(&mut reader)), "ab");
    assert!(failed(read(&mut reader)));

    let exact = Spool::new(Some(2), 1 << 20);
    assert!(exact.push(Bytes::from_static(b"ab")));
    exact.finish(None);
    assert_eq!(exact.to_owned_bytes().unwrap(), "ab");
}

#[test]
fn chunks_go_once_every_reader_passed_them_and_then_nobody_joins() {
    let spool = Spool::new(None, 1 << 20);
    let hold = Hold::new(&spool);
    let mut a = SpoolReader::new(spool.clone());
    let mut b = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"ab"));
    spool.push(Bytes::from_static(b"cd"));
    assert_eq!(data(read(&mut a)), "ab");
    assert_eq!(data(read(&mut a)), "cd");
    assert_eq!(spool.lock().held, 4, "the hold keeps the start");
    drop(hold);
    assert_eq!(spool.lock().held, 4, "b has not read yet");
    assert!(SpoolReader::new(spool.clone()).joined());
    assert_eq!(data(read(&mut b)), "ab");
    assert_eq!(spool.lock().held, 2);
    let mut late = SpoolReader::new(spool.clone());
    assert!(!late.joined());
    assert!(failed(read(&mut late)));
    drop(b);
    assert_eq!(spool.lock().held, 0);
}

#[test]
fn a_slow_reader_holds_the_filling_task_back_within_the_window() {
    let spool = Spool::new(None, 4);
    let hold = Hold::new(&spool);
    let mut slow = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    spool.push(Bytes::from_static(b"ab"));
    assert!(spool.poll_room(&mut cx).is_ready());
    spool.push(Bytes::from_static(b"cd"));
    // Full, and nobody waits for more: the filling task waits.
    assert!(spool.poll_room(&mut cx).is_pending());
    assert_eq!(data(read(&mut fast)), "ab");
    assert!(spool.poll_room(&mut cx).is_pending());
    assert_eq!(data(read(&mut fast)), "cd");
    assert!(read(&mut fast).is_pending());
    // The fast reader waits: the filling task waits for the hold and the
    // slow reader, which still has the start.
    assert!(spool.poll_room(&mut cx).is_pending());
    drop(hold);
    assert!(spool.poll_room(&mut cx).is_pending());
    assert_eq!(spool.lock().held, 4);
    assert_eq!(data(read(&mut slow)), "ab");
    assert!(spool.poll_room(&mut cx).is_ready());
    // The start is gone: nobody joins any more.
    assert!(!SpoolReader::new(spool.clone()).joined());
    spool.push(Bytes::from_static(b"ef"));
    assert_eq!(data(read(&mut fast)), "ef");
    assert_eq!(data(read(&mut slow)), "cd");
    assert_eq!(data(read(&mut slow)), "ef");
}

fn cut_off(poll: Poll<Option<Read>>) -> bool {
    matches!(poll, Poll::Ready(Some(Read::CutOff)))
}

/// Whether the filling task gets room within `wait` (of paused time).
async fn room_within(spool: &Spool, wait: Duration) -> bool {
    tokio::time::timeout(wait, spool.room()).await.is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_reads_nothing_while_others_read_ahead_is_cut_off() {
    let spool = Spool::new(None, 4);
    let mut stalled = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"ab"));
    spool.push(Bytes::from_static(b"cd"));
    assert_eq!(data(read(&mut fast)), "ab");
    assert_eq!(data(read(&mut fast)), "cd");
    // Before the limit: the others wait for it.
    assert!(!room_within(&spool, LAG_LIMIT / 2).await);
    assert_eq!(spool.lock().held, 4);
    // After it: cut off, its chunks let go, the others go on.
    assert!(room_within(&spool, LAG_LIMIT).await);
    assert_eq!(spool.lock().held, 0);
    assert!(cut_off(read(&mut stalled)));
    assert!(matches!(read(&mut stalled), Poll::Ready(None)));
    spool.push(Bytes::from_static(b"ef"));
    spool.finish(None);
    assert_eq!(data(read(&mut fast)), "ef");
    assert!(matches!(read(&mut fast), Poll::Ready(None)));
}

#[tokio::test(start_paused = true)]
async fn a_reader_alone_or_level_with_the_others_is_never_cut_off() {
    // Alone: it slows nobody.
    let spool = Spool::new(None, 4);
    let mut alone = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"abcd"));
    assert!(!room_within(&spool, LAG_LIMIT * 3).await);
    assert_eq!(data(read(&mut alone)), "abcd");
    assert!(room_within(&spool, Duration::ZERO).await);

    // Several, all at the same place: nobody waits for another.
    let spool = Spool::new(None, 4);
    let mut a = SpoolReader::new(spool.clone());
    let mut b = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"abcd"));
    assert!(!room_within(&spool, LAG_LIMIT * 3).await);
    assert_eq!(data(read(&mut a)), "abcd");
    assert_eq!(data(read(&mut b)), "abcd");
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_keeps_within_the_limit_is_never_cut_off() {
    let spool = Spool::new(None, 4);
    let mut slow = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    let chunks = [b"ab", b"cd", b"ef", b"gh", b"ij", b"kl"];
    spool.push(Bytes::from_static(chunks[0]));
    assert_eq!(data(read(&mut fast)), "ab");
    for pair in chunks.windows(2) {
        // Full: the fast reader and the filling task wait for the slow
        // one, which reads a chunk behind, each a third of the limit
        // after it came.
        spool.push(Bytes::from_static(pair[1]));
        assert_eq!(data(read(&mut fast)), Bytes::from_static(pair[1]));
        assert!(!room_within(&spool, LAG_LIMIT / 3).await);
        assert_eq!(data(read(&mut slow)), Bytes::from_static(pair[0]));
        assert!(room_within(&spool, Duration::ZERO).await);
    }
    spool.finish(None);
    assert_eq!(data(read(&mut slow)), "kl");
    assert!(matches!(read(&mut slow), Poll::Ready(None)));
}

#[test]
fn a_reader_dropped_lets_go_of_its_chunks_at_once() {
    let spool = Spool::new(None, 4);
    let gone = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"abcd"));
    assert_eq!(data(read(&mut fast)), "abcd");
    assert_eq!(spool.lock().held, 4);
    drop(gone);
    assert_eq!(spool.lock().held, 0);
    let waker = Waker::from(Arc::new(Noop));
    assert!(spool.poll_room(&mut Context::from_waker(&waker)).is_ready());
}
