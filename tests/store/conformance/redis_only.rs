//! What can only be seen by looking at Redis itself: keys, their TTLs, the script cache.

use std::time::Duration;

use tokio::time::sleep;
use tower_lease::store::KeyRole;
use tower_lease::{Lock, RwLock, Semaphore};

use tower_lease_harness::{Backing, Raw};

tower_lease_harness::store_tests!(
    Core: [],
    redis: [
        pttl_right_after_acquire_is_the_ttl,
        crashed_reader_member_is_removed,
        reader_set_key_expires,
        every_operation_survives_script_flush,
        exact_key_names,
        custom_prefix,
        abandoned_lock_key_is_gone_after_ttl,
        permit_set_layout_and_expiry,
        permits_survive_script_flush,
    ]
);

const INVOICES: Lock<u64> = Lock::new("invoice", Duration::from_secs(30));
const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_millis(300));

async fn pttl_right_after_acquire_is_the_ttl(env: Backing) {
    let raw = env.raw();
    let _token = INVOICES.try_lock(&env.store, &7).await.unwrap().unwrap();
    let pttl = raw.pttl(&raw.key(KeyRole::Lock, "invoice", b"7")).await;
    let ttl = INVOICES.ttl().as_millis() as i64;
    assert!(
        pttl <= ttl && pttl >= ttl - 50,
        "PTTL {pttl} ms right after a {ttl} ms acquire"
    );
}

async fn crashed_reader_member_is_removed(env: Backing) {
    let raw = env.raw();
    let long = RwLock::<str>::new("catalog", Duration::from_secs(30));
    let readers = raw.key(KeyRole::Readers, "catalog", b"shop");
    drop(CATALOG.try_read(&env.store, "shop").await.unwrap().unwrap()); // crashes: 300 ms lease
    let survivor = long.try_read(&env.store, "shop").await.unwrap().unwrap();
    assert_eq!(raw.query::<i64>(redis::cmd("ZCARD").arg(&readers)).await, 2);
    sleep(Duration::from_millis(400)).await;

    // Any script on the name drops the expired member; the live one stays.
    assert!(
        CATALOG
            .try_write(&env.store, "shop")
            .await
            .unwrap()
            .is_none(),
        "survivor blocks"
    );
    assert_eq!(raw.query::<i64>(redis::cmd("ZCARD").arg(&readers)).await, 1);
    assert!(survivor.release().await.unwrap());
    assert!(
        !raw.exists(&readers).await,
        "an empty reader set must not linger"
    );
}

async fn reader_set_key_expires(env: Backing) {
    let raw = env.raw();
    let readers = raw.key(KeyRole::Readers, "catalog", b"idle");
    drop(CATALOG.try_read(&env.store, "idle").await.unwrap().unwrap());
    let pttl = raw.pttl(&readers).await;
    assert!(
        pttl > 0 && pttl <= 300,
        "the reader set's PTTL is {pttl} ms for a 300 ms lease"
    );
    sleep(Duration::from_millis(400)).await;
    assert!(
        !raw.exists(&readers).await,
        "the reader set outlived its last lease"
    );
}

async fn every_operation_survives_script_flush(env: Backing) {
    let raw = env.raw();
    for round in 0..2 {
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        let token = INVOICES
            .fenced()
            .try_lock(&env.store, &round)
            .await
            .unwrap()
            .unwrap();
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        assert!(token.extend().await.unwrap());
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        assert!(token.release().await.unwrap());

        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        let reader = CATALOG
            .try_read(&env.store, "flush")
            .await
            .unwrap()
            .unwrap();
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        assert!(reader.extend().await.unwrap());
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        assert!(reader.release().await.unwrap());
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        let writer = CATALOG
            .try_write(&env.store, "flush")
            .await
            .unwrap()
            .unwrap();
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        assert!(writer.extend().await.unwrap());
        let _: () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
        assert!(writer.release().await.unwrap());
    }
}

async fn keys(raw: &Raw) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = raw.query(redis::cmd("KEYS").arg("*")).await;
    keys.sort();
    keys
}

async fn exact_key_names(env: Backing) {
    let raw = env.raw();
    let invoice = INVOICES
        .fenced()
        .try_lock(&env.store, &42)
        .await
        .unwrap()
        .unwrap();
    let writer = CATALOG
        .fenced()
        .try_write(&env.store, "shop-1")
        .await
        .unwrap()
        .unwrap();
    let mut expected: Vec<Vec<u8>> = [
        &b"tower-lease:lock:{invoice:42}"[..],
        b"tower-lease:lock:{invoice:42}:fence",
        b"tower-lease:rwlock:{catalog:shop-1}:w",
        b"tower-lease:rwlock:{catalog:shop-1}:fence",
    ]
    .map(<[u8]>::to_vec)
    .to_vec();
    expected.sort();
    assert_eq!(keys(raw).await, expected);
    let holder: Vec<u8> = raw
        .query(redis::cmd("GET").arg("tower-lease:lock:{invoice:42}"))
        .await;
    assert_eq!(holder.len(), 16, "the holder's key holds its 16-byte token");
    assert!(writer.release().await.unwrap());
    assert!(invoice.release().await.unwrap());

    let reader = CATALOG
        .try_read(&env.store, "shop-1")
        .await
        .unwrap()
        .unwrap();
    let readers = b"tower-lease:rwlock:{catalog:shop-1}:r".to_vec();
    assert!(raw.exists(&readers).await);
    assert_eq!(
        raw.query::<String>(redis::cmd("TYPE").arg(&readers)).await,
        "zset"
    );
    assert!(reader.release().await.unwrap());
    // Only the never-expiring fence counters are left once everything is released.
    let fences: Vec<Vec<u8>> = expected
        .into_iter()
        .filter(|k| k.ends_with(b":fence"))
        .collect();
    assert_eq!(keys(raw).await, fences);
}

async fn custom_prefix(env: Backing) {
    // A second store over the same Redis with another prefix: its keys never meet the first's.
    let raw = env.raw();
    let _default = INVOICES.try_lock(&env.store, &1).await.unwrap().unwrap();
    let other = raw.store_with_prefix("billing");
    let token = INVOICES.try_lock(&other, &1).await.unwrap();
    assert!(token.is_some(), "another prefix is another lock space");
    assert_eq!(
        keys(raw).await,
        vec![
            b"billing:lock:{invoice:1}".to_vec(),
            b"tower-lease:lock:{invoice:1}".to_vec()
        ]
    );
}

async fn abandoned_lock_key_is_gone_after_ttl(env: Backing) {
    let raw = env.raw();
    let short = Lock::<str>::new("jobs", Duration::from_millis(200));
    drop(short.try_lock(&env.store, "gone").await.unwrap().unwrap());
    let key = raw.key(KeyRole::Lock, "jobs", b"gone");
    assert!(raw.exists(&key).await);
    sleep(Duration::from_millis(300)).await;
    assert!(
        !raw.exists(&key).await,
        "an abandoned lock key outlived its TTL"
    );
}

const EXPORTS: Semaphore<str> = Semaphore::new("export", 3, Duration::from_secs(10));

async fn permit_set_layout_and_expiry(env: Backing) {
    let raw = env.raw();
    let key = raw.key(KeyRole::Permits, "export", b"t");
    assert_eq!(key, b"tower-lease:sem:{export:t}");
    let sem = Semaphore::<str>::new("export", 2, Duration::from_millis(300));
    let a = sem.try_acquire(&env.store, "t").await.unwrap().unwrap();
    let b = EXPORTS.try_acquire(&env.store, "t").await.unwrap().unwrap();
    assert_eq!(raw.query::<i64>(redis::cmd("ZCARD").arg(&key)).await, 2);
    // The set lives as long as its longest permit (10 s), and no longer.
    let pttl = raw.pttl(&key).await;
    assert!((9_000..=10_000).contains(&pttl), "PTTL {pttl}");
    assert!(b.release().await.unwrap());
    sleep(Duration::from_millis(400)).await;
    // The ended permit no longer counts, but stays until the set is full or expires: while
    // the set has room counting it, it has room without it. The expiry never moves earlier.
    let c = sem.try_acquire(&env.store, "t").await.unwrap().unwrap();
    assert_eq!(sem.in_use(&env.store, "t").await.unwrap(), 1);
    assert_eq!(raw.query::<i64>(redis::cmd("ZCARD").arg(&key)).await, 2);
    assert!(raw.pttl(&key).await <= 10_000);
    // Full counting the ended one: the next acquire drops it.
    let d = sem.try_acquire(&env.store, "t").await.unwrap().unwrap();
    assert_eq!(raw.query::<i64>(redis::cmd("ZCARD").arg(&key)).await, 2);
    assert!(!a.release().await.unwrap());
    assert!(d.release().await.unwrap());
    assert!(c.release().await.unwrap());
    assert!(
        !raw.exists(&key).await,
        "an empty permit set must not linger"
    );
}

async fn permits_survive_script_flush(env: Backing) {
    let raw = env.raw();
    let flush = || async { raw.query::<()>(redis::cmd("SCRIPT").arg("FLUSH")).await };
    flush().await;
    let permit = EXPORTS.try_acquire(&env.store, "t").await.unwrap().unwrap();
    flush().await;
    assert!(permit.extend().await.unwrap());
    flush().await;
    assert_eq!(EXPORTS.in_use(&env.store, "t").await.unwrap(), 1);
    flush().await;
    assert!(permit.release().await.unwrap());
}
