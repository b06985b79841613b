//! The rooms of bounded waits: their lifetime, their turn, and wake-ups that land early.

use std::time::Duration;

use super::*;

#[tokio::test]
async fn a_room_lives_as_long_as_its_seats() {
    let rooms = Arc::new(WaitRooms::default());
    let first = rooms.enter(Mode::Exclusive, "jobs", b"a");
    let second = rooms.enter(Mode::Exclusive, "jobs", b"a");
    let other = rooms.enter(Mode::Read, "jobs", b"a");
    assert_eq!(
        rooms.rooms(),
        2,
        "a lock and an rwlock of one name are apart"
    );
    drop(first);
    assert_eq!(rooms.rooms(), 2);
    drop((second, other));
    assert_eq!(rooms.rooms(), 0, "nothing left once every waiter is gone");
}

#[tokio::test]
async fn a_release_before_the_wait_is_not_missed() {
    use futures_util::FutureExt;

    let rooms = Arc::new(WaitRooms::default());
    let seat = rooms.enter(Mode::Write, "docs", b"d");
    let turn = seat
        .turn(Instant::now() + Duration::from_secs(1))
        .await
        .unwrap();
    // Without a release the wait waits: a wake-up that ends at once proves nothing below.
    let idle = turn.released();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), idle)
            .await
            .is_err(),
        "woken without a release"
    );
    // Nor does a release of another name, or of another kind of lock of this name, wake it.
    let unrelated = turn.released();
    rooms.released(Mode::Read, "docs", b"other");
    rooms.released(Mode::Exclusive, "docs", b"d");
    rooms.released(Mode::Permit, "docs", b"d");
    assert!(unrelated.now_or_never().is_none(), "woken by another lock");
    // The release lands between the attempt and the wait: the wait, after it, ends at once.
    let released = turn.released();
    rooms.released(Mode::Read, "docs", b"d");
    assert!(released.now_or_never().is_some(), "the release was missed");
}

#[tokio::test]
async fn only_one_waiter_of_a_name_has_the_turn() {
    let rooms = Arc::new(WaitRooms::default());
    let (a, b) = (
        rooms.enter(Mode::Exclusive, "j", b"n"),
        rooms.enter(Mode::Exclusive, "j", b"n"),
    );
    let deadline = Instant::now() + Duration::from_millis(50);
    let turn = a.turn(deadline).await;
    assert!(turn.is_some());
    assert!(
        b.turn(deadline).await.is_none(),
        "the second waits for the first"
    );
    drop(turn);
    assert!(
        b.turn(Instant::now() + Duration::from_millis(50))
            .await
            .is_some()
    );
}

#[tokio::test]
async fn a_readers_release_wakes_the_writer_and_no_reader() {
    use futures_util::FutureExt;

    let rooms = Arc::new(WaitRooms::default());
    let reader = rooms.enter(Mode::Read, "docs", b"d");
    let writer = rooms.enter(Mode::Write, "docs", b"d");
    let deadline = Instant::now() + Duration::from_secs(1);
    let read_turn = reader.together();
    let write_turn = writer.turn(deadline).await.unwrap();
    let (read_woken, write_woken) = (read_turn.released(), write_turn.released());
    rooms.released(Mode::Read, "docs", b"d");
    assert!(
        write_woken.now_or_never().is_some(),
        "the last reader lets a writer in"
    );
    assert!(
        read_woken.now_or_never().is_none(),
        "a reader's release woke a reader, which it can never admit"
    );
    // A writer's release opens the way to both.
    let (read_woken, write_woken) = (read_turn.released(), write_turn.released());
    rooms.released(Mode::Write, "docs", b"d");
    assert!(read_woken.now_or_never().is_some());
    assert!(write_woken.now_or_never().is_some());
}
