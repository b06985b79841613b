//! Which commits wait for their WAL flush: every call that takes, extends or marks a lease
//! does (lost in a crash, it could let a second holder in), a release does not (lost, it only
//! delays the next holder, and an acquisition after it flushes it with its own commit).

use crate::support;

/// `synchronous_commit` in the call's transaction once the call ran: what its commit waits for.
async fn commit_of(client: &mut tokio_postgres::Client, call: &str) -> String {
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&support::versioned(call)).await.unwrap();
    let row = tx
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .await
        .unwrap();
    let setting: String = row.get(0);
    tx.commit().await.unwrap();
    setting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_commit_without_waiting_for_the_flush_and_nothing_else_does() {
    let server = support::server().await;
    let _store = support::pg_store(&server).await;
    let mut client = support::client(&server.url()).await;
    let waits = [
        "SELECT tower_lease.lock_acquire('c', 'x', 'holder', 10000, true)",
        "SELECT tower_lease.lock_extend('c', 'x', 'holder', 10000)",
        "SELECT tower_lease.read_acquire('c', 'r', 'reader', 10000, true, 500, true)",
        "SELECT tower_lease.write_acquire('c', 'r', 'writer', 10000, true, 2000, true)",
        "SELECT tower_lease.permit_acquire('c', 'p', 'holder', 10000, 2)",
    ];
    for call in waits {
        assert_eq!(commit_of(&mut client, call).await, "on", "{call}");
    }
    let released = [
        "SELECT tower_lease.lock_release('c', 'x', 'holder')",
        "SELECT tower_lease.withdraw_intent('c', 'r', 'writer')",
        "SELECT tower_lease.rwlock_release('c', 'r', 'reader', true, 500)",
        "SELECT tower_lease.permit_release('c', 'p', 'holder')",
    ];
    for call in released {
        assert_eq!(commit_of(&mut client, call).await, "off", "{call}");
    }
}
