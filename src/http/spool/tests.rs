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
    let spool = Spool::new(None, 1 << 20, 0);
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
    let spool = Spool::new(None, 1 << 20, 0);
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
    let spool = Spool::new(None, 1 << 20, 0);
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
    let short = Spool::new(Some(4), 1 << 20, 0);
    let mut reader = SpoolReader::new(short.clone());
    assert!(short.push(Bytes::from_static(b"ab")));
    short.finish(None);
    assert_eq!(data(read(&mut reader)), "ab");
    assert!(failed(read(&mut reader)));
    assert!(short.to_owned_bytes().is_none());

    let long = Spool::new(Some(3), 1 << 20, 0);
    let mut reader = SpoolReader::new(long.clone());
    assert!(long.push(Bytes::from_static(b"ab")));
    assert!(!long.push(Bytes::from_static(b"cd")));
    assert_eq!(data(read(&mut reader)), "ab");
    assert!(failed(read(&mut reader)));

    let exact = Spool::new(Some(2), 1 << 20, 0);
    assert!(exact.push(Bytes::from_static(b"ab")));
    exact.finish(None);
    assert_eq!(exact.to_owned_bytes().unwrap(), "ab");
}

#[test]
fn chunks_go_once_every_reader_passed_them_and_then_nobody_joins() {
    let spool = Spool::new(None, 1 << 20, 0);
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

#[tokio::test(start_paused = true)]
async fn a_slow_reader_holds_the_filling_task_back_within_the_window() {
    // No file: the memory window alone.
    let spool = Spool::new(None, 4, 0);
    let hold = Hold::new(&spool);
    let mut slow = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"ab"));
    assert!(room_within(&spool, Duration::ZERO).await);
    spool.push(Bytes::from_static(b"cd"));
    // Full, and nobody waits for more: the filling task waits.
    assert!(!room_within(&spool, Duration::ZERO).await);
    assert_eq!(data(read(&mut fast)), "ab");
    assert!(!room_within(&spool, Duration::ZERO).await);
    assert_eq!(data(read(&mut fast)), "cd");
    assert!(read(&mut fast).is_pending());
    // The fast reader waits: the filling task waits for the hold and the
    // slow reader, which still has the start.
    assert!(!room_within(&spool, Duration::ZERO).await);
    drop(hold);
    assert!(!room_within(&spool, Duration::ZERO).await);
    assert_eq!(spool.lock().held, 4);
    assert_eq!(data(read(&mut slow)), "ab");
    assert!(room_within(&spool, Duration::ZERO).await);
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
    let spool = Spool::new(None, 4, 0);
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
    let spool = Spool::new(None, 4, 0);
    let mut alone = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"abcd"));
    assert!(!room_within(&spool, LAG_LIMIT * 3).await);
    assert_eq!(data(read(&mut alone)), "abcd");
    assert!(room_within(&spool, Duration::ZERO).await);

    // Several, all at the same place: nobody waits for another.
    let spool = Spool::new(None, 4, 0);
    let mut a = SpoolReader::new(spool.clone());
    let mut b = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"abcd"));
    assert!(!room_within(&spool, LAG_LIMIT * 3).await);
    assert_eq!(data(read(&mut a)), "abcd");
    assert_eq!(data(read(&mut b)), "abcd");
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_keeps_within_the_limit_is_never_cut_off() {
    let spool = Spool::new(None, 4, 0);
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

#[tokio::test(start_paused = true)]
async fn a_reader_dropped_lets_go_of_its_chunks_at_once() {
    let spool = Spool::new(None, 4, 0);
    let gone = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"abcd"));
    assert_eq!(data(read(&mut fast)), "abcd");
    assert_eq!(spool.lock().held, 4);
    drop(gone);
    assert_eq!(spool.lock().held, 0);
    assert!(room_within(&spool, Duration::ZERO).await);
}

/// Reads the next frame, waiting for it (a read from the spill file runs
/// on a blocking thread).
async fn next(reader: &mut SpoolReader) -> Option<Read> {
    std::future::poll_fn(|cx| reader.poll_read(cx)).await
}

async fn next_data(reader: &mut SpoolReader) -> Bytes {
    data(Poll::Ready(next(reader).await))
}

/// Reads to the end: the bytes, and whether it ended whole.
async fn read_rest(reader: &mut SpoolReader, into: &mut Vec<u8>) -> bool {
    loop {
        match next(reader).await {
            Some(Read::Frame(frame)) => into.extend_from_slice(&frame.into_data().expect("data")),
            Some(_) => return false,
            None => return true,
        }
    }
}

/// A directory of its own for a test's spill files.
fn spill_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "stampede-guard-spool-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn entries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// A spool of 4 bytes in memory, spilling up to `cap` bytes into `dir`.
fn spilling(cap: u64, dir: &std::path::Path) -> Arc<Spool> {
    let spool = Spool::new(None, 4, cap);
    spool.lock().spill.dir = Some(dir.to_path_buf());
    spool
}

/// Gets room for the next chunk (within a bound far past any wait).
async fn room(spool: &Spool) {
    assert!(room_within(spool, LAG_LIMIT * 100).await, "no room");
}

/// Pushes `n` two-byte chunks, each read at once by `fast`; calls `between`
/// after each. Returns the bytes pushed.
async fn push_read(
    spool: &Spool,
    fast: &mut SpoolReader,
    n: u8,
    mut between: impl AsyncFnMut(u8),
) -> Vec<u8> {
    let mut sent = Vec::new();
    for i in 0..n {
        room(spool).await;
        let chunk = Bytes::from(vec![i; 2]);
        spool.push(chunk.clone());
        sent.extend_from_slice(&chunk);
        assert_eq!(next_data(fast).await, chunk);
        // It waits for more.
        assert!(read(fast).is_pending());
        assert!(spool.lock().held <= 4 + 2, "memory past its bound");
        between(i).await;
    }
    sent
}

#[tokio::test(start_paused = true)]
async fn a_reader_behind_the_window_reads_from_the_file_and_the_others_go_on() {
    let dir = spill_dir("behind");
    let spool = spilling(1 << 10, &dir);
    let mut slow = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    let mut slow_read = Vec::new();
    // The fast reader reads every chunk as it comes; the slow one one in
    // four: it falls ever further behind the 4 bytes in memory.
    let sent = push_read(&spool, &mut fast, 64, async |i| {
        if i % 4 == 3 {
            slow_read.extend_from_slice(&next_data(&mut slow).await);
        }
    })
    .await;
    // Each read from the file takes all it has.
    assert!(slow_read.len() < sent.len());
    assert!(spool.lock().mem_start >= 100, "the window moved on");
    spool.finish(None);
    assert!(next(&mut fast).await.is_none());
    // The slow reader ends whole, from the file and then from memory.
    assert!(read_rest(&mut slow, &mut slow_read).await);
    assert_eq!(slow_read, sent);
    // The file was made, and is not in the directory.
    assert!(spool.lock().spill.file.is_some());
    assert_eq!(entries(&dir), 0);
    drop((slow, fast, spool));
    assert_eq!(entries(&dir), 0);
    std::fs::remove_dir(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_pauses_within_the_limit_ends_whole() {
    let dir = spill_dir("pause");
    let spool = spilling(1 << 10, &dir);
    let mut paused = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    let sent = push_read(&spool, &mut fast, 16, async |_| {}).await;
    spool.finish(None);
    tokio::time::advance(LAG_LIMIT / 2).await;
    let mut got = next_data(&mut paused).await.to_vec();
    tokio::time::advance(LAG_LIMIT / 2).await;
    assert!(read_rest(&mut paused, &mut got).await);
    assert_eq!(got, sent);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_reads_nothing_for_the_limit_is_cut_off_and_the_others_finish() {
    let dir = spill_dir("stalled");
    let spool = spilling(1 << 10, &dir);
    let mut stalled = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    let sent = push_read(&spool, &mut fast, 32, async |_| {}).await;
    spool.finish(None);
    assert!(next(&mut fast).await.is_none());
    assert_eq!(sent.len(), 64);
    tokio::time::advance(LAG_LIMIT).await;
    assert!(matches!(next(&mut stalled).await, Some(Read::CutOff)));
    assert!(next(&mut stalled).await.is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reader_further_behind_than_the_disk_cap_is_cut_off() {
    let dir = spill_dir("cap");
    let spool = spilling(8, &dir);
    let mut behind = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    // 4 bytes in memory, 8 in the file: the file is full.
    let mut sent = push_read(&spool, &mut fast, 6, async |_| {}).await;
    // The next chunk would overwrite bytes `behind` still needs: the
    // others wait for it until the lag limit, then it is cut off.
    assert!(!room_within(&spool, LAG_LIMIT / 2).await);
    assert!(room_within(&spool, LAG_LIMIT).await);
    assert!(matches!(next(&mut behind).await, Some(Read::CutOff)));
    for i in 6..32u8 {
        room(&spool).await;
        let chunk = Bytes::from(vec![i; 2]);
        spool.push(chunk.clone());
        sent.extend_from_slice(&chunk);
        assert_eq!(next_data(&mut fast).await, chunk);
    }
    spool.finish(None);
    assert!(next(&mut fast).await.is_none());
    assert_eq!(sent.len(), 64);
    let size = spool.lock().spill.file.as_ref().expect("spilled").size();
    assert!(size <= 8, "the file grew to {size} bytes");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reader_within_the_disk_cap_is_never_held_to_it() {
    let dir = spill_dir("within");
    let spool = spilling(8, &dir);
    let mut within = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    let mut got = Vec::new();
    // Two chunks behind the fast one, at most: 4 bytes, within the 8 the
    // file keeps.
    let sent = push_read(&spool, &mut fast, 32, async |i| {
        if i >= 2 {
            while got.len() < 2 * usize::from(i - 1) {
                got.extend_from_slice(&next_data(&mut within).await);
            }
        }
    })
    .await;
    spool.finish(None);
    assert!(read_rest(&mut within, &mut got).await);
    assert_eq!(got, sent);
    let size = spool.lock().spill.file.as_ref().expect("spilled").size();
    assert!(size <= 8, "the file grew to {size} bytes");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn readers_still_join_while_the_start_is_in_the_file() {
    let dir = spill_dir("join");
    let spool = spilling(1 << 10, &dir);
    let hold = Hold::new(&spool);
    let mut fast = SpoolReader::new(spool.clone());
    let sent = push_read(&spool, &mut fast, 16, async |_| {}).await;
    assert!(spool.lock().mem_start > 0, "the start went to the file");
    let mut late = SpoolReader::new(spool.clone());
    assert!(late.joined());
    drop(hold);
    spool.finish(None);
    let mut got = Vec::new();
    assert!(read_rest(&mut late, &mut got).await);
    assert_eq!(got, sent);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_a_file_a_lagging_reader_is_cut_off_as_before() {
    // The directory does not exist: the file cannot be made.
    let dir = std::env::temp_dir().join(format!(
        "stampede-guard-spool-{}-missing/none",
        std::process::id()
    ));
    let spool = spilling(1 << 10, &dir);
    let mut stalled = SpoolReader::new(spool.clone());
    let mut fast = SpoolReader::new(spool.clone());
    spool.push(Bytes::from_static(b"ab"));
    spool.push(Bytes::from_static(b"cd"));
    assert_eq!(data(read(&mut fast)), "ab");
    assert_eq!(data(read(&mut fast)), "cd");
    assert!(read(&mut fast).is_pending());
    assert!(!room_within(&spool, LAG_LIMIT / 2).await);
    assert!(!spool.lock().spill.usable);
    assert!(room_within(&spool, LAG_LIMIT).await);
    assert!(cut_off(read(&mut stalled)));
}

#[test]
fn the_disk_cap_is_64_times_the_cap_and_never_past_the_declared_length() {
    assert_eq!(spill_cap(4 << 20, None), 256 << 20);
    assert_eq!(spill_cap(4 << 20, Some(10 << 20)), 10 << 20);
    assert_eq!(spill_cap(4 << 20, Some(1 << 40)), 256 << 20);
    assert_eq!(spill_cap(usize::MAX, None), u64::MAX);
}

#[tokio::test(start_paused = true)]
async fn at_the_disk_cap_the_spool_waits_for_the_waiters_still_to_join() {
    let dir = spill_dir("hold");
    let spool = spilling(8, &dir);
    let hold = Hold::new(&spool);
    let mut fast = SpoolReader::new(spool.clone());
    let mut sent = Vec::new();
    // Two-byte chunks until the file is full: 4 in memory, 8 on disk.
    for i in 0..6u8 {
        room(&spool).await;
        let chunk = Bytes::from(vec![i; 2]);
        spool.push(chunk.clone());
        sent.extend_from_slice(&chunk);
        assert_eq!(next_data(&mut fast).await, chunk);
        assert!(read(&mut fast).is_pending());
    }
    // Past the disk cap the start would go: the spool waits for the hold.
    assert!(!room_within(&spool, LAG_LIMIT / 2).await);
    let mut late = SpoolReader::new(spool.clone());
    assert!(late.joined(), "the start is still kept");
    drop(hold);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend_from_slice(&next_data(&mut late).await);
    }
    room(&spool).await;
    spool.finish(None);
    assert!(read_rest(&mut late, &mut got).await);
    assert_eq!(got, sent);

    // A hold that stays: let go once the window has waited the limit.
    let spool = spilling(8, &dir);
    let _hold = Hold::new(&spool);
    let mut fast = SpoolReader::new(spool.clone());
    push_read(&spool, &mut fast, 6, async |_| {}).await;
    assert!(!room_within(&spool, LAG_LIMIT / 2).await);
    assert!(room_within(&spool, LAG_LIMIT).await);
    assert!(!SpoolReader::new(spool.clone()).joined());
    std::fs::remove_dir_all(&dir).unwrap();
}
