//! TLS: a server that accepts TLS connections only (`hostssl` in `pg_hba.conf`), its
//! certificate for `localhost` and 127.0.0.1 signed by a CA the test makes. A store given the
//! CA (the builder's `root_certificates`, or `sslrootcert` in the URL) connects, its pool's and
//! its listener's sessions are TLS ones, and a release in one store wakes a waiter in another
//! through the listener; a store without the CA, or with another, is refused at once with the
//! reason, unless told to accept any certificate; a client without TLS is refused by the
//! server.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::{Lock, Store};
use tower_lease_postgres::PgStore;

use support::pki::{chain, make_pki, tls_server};

const JOBS: Lock<str> = Lock::new("tls", Duration::from_secs(5));
/// How long the waiter waits before the release: polling would look about twenty times in it,
/// listening about twice (its first attempt, one once watching).
const WAIT: Duration = Duration::from_millis(1500);

/// A store of `name` (its sessions' `application_name`) trusting `ca`, over `url`.
async fn store(url: &str, ca: &str, name: &str) -> PgStore {
    PgStore::builder()
        .root_certificates(ca)
        .application_name(name)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {}", chain(&e)))
}

/// The sessions named `name`: how many, how many over TLS, and how many of them listen (their
/// last statement the listener's `LISTEN` or heartbeat).
async fn sessions(store: &PgStore, name: &str) -> (i64, i64, i64) {
    let client = store.pool().get().await.unwrap();
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl), \
             count(*) FILTER (WHERE a.query LIKE 'LISTEN%' OR a.query = 'SHOW transaction_read_only') \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_the_ca_locks_and_hears_releases_over_tls() {
    let pki = make_pki("tower-lease test CA");
    let server = tls_server(&pki);
    let url = format!("{}?sslmode=require", server.url());
    let holder: Store = store(&url, &pki.ca, "tls-holder").await.into();
    let acquisitions = Arc::new(AtomicUsize::new(0));
    let waiter_store = store(&url, &pki.ca, "tls-waiter").await;
    let waiter = Store::from_backend(support::Counting {
        store: waiter_store.clone(),
        acquisitions: acquisitions.clone(),
    });

    let held = JOBS.try_lock(&holder, "a").await.unwrap().expect("free");
    assert!(JOBS.try_lock(&waiter, "a").await.unwrap().is_none());
    let before = acquisitions.load(Ordering::SeqCst);
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let token = JOBS.try_lock_for(&waiter, "a", WAIT * 3).await.unwrap();
            (Instant::now(), token.expect("acquired once released"))
        })
    };
    tokio::time::sleep(WAIT).await;
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let (got, token) = waiting.await.unwrap();
    let looks = acquisitions.load(Ordering::SeqCst) - before;
    // Woken by the release's notification: a waiter that polled would have looked about
    // twenty times, and one that missed it would look again only after its 1 s fallback.
    assert!(looks <= 5, "the waiter polled: {looks} attempts");
    assert!(
        got - released < Duration::from_millis(300),
        "woken {:?} after the release",
        got - released
    );

    // Every session of the waiter's store, the pool's and the listener's, is a TLS one.
    let (all, tls, listening) = sessions(&waiter_store, "tls-waiter").await;
    assert!(all >= 2, "{all} sessions: the pool's and the listener's");
    assert_eq!(tls, all, "sessions without TLS");
    assert_eq!(listening, 1, "the listener's session");
    assert!(token.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslrootcert_and_verify_full_in_the_url_are_honoured() {
    let pki = make_pki("tower-lease test CA");
    let server = tls_server(&pki);
    let ca = std::env::temp_dir().join(format!("tower-lease-tls-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, &pki.ca).unwrap();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}&application_name=tls-url",
        server.url(),
        ca.display()
    );
    let from_url = PgStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect with sslrootcert: {}", chain(&e)));
    let _ = std::fs::remove_file(&ca);
    let token = JOBS.try_lock(&from_url.clone().into(), "b").await.unwrap();
    assert!(token.expect("free").release().await.unwrap());
    let (all, tls, _) = sessions(&from_url, "tls-url").await;
    assert!(all >= 1);
    assert_eq!(tls, all, "sessions without TLS");

    // The default, prefer, uses TLS when the server offers it, verified as well.
    let preferring = store(&server.url(), &pki.ca, "tls-prefer").await;
    let (all, tls, _) = sessions(&preferring, "tls-prefer").await;
    assert!(all >= 1);
    assert_eq!(tls, all, "sessions without TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_verify_is_refused_at_once_where_verified() {
    let pki = make_pki("tower-lease test CA");
    let server = tls_server(&pki);
    let other = make_pki("another CA");
    // Not verified: no CA, and verify-full asks for it; another CA, in every mode.
    let refused = [
        (
            "no CA",
            PgStore::builder(),
            vec![format!("{}?sslmode=verify-full", server.url())],
        ),
        (
            "another CA",
            PgStore::builder().root_certificates(&other.ca),
            vec![
                format!("{}?sslmode=require", server.url()),
                format!("{}?sslmode=verify-ca", server.url()),
                server.url(),
            ],
        ),
    ];
    for (what, builder, urls) in refused {
        for url in urls {
            let started = Instant::now();
            let connecting = builder.clone().connect(&url);
            let e = tokio::time::timeout(Duration::from_secs(5), connecting)
                .await
                .unwrap_or_else(|_| panic!("{what}, {url}: still connecting after 5 s"))
                .expect_err("connected to a server whose certificate does not verify");
            let e = chain(&e);
            assert!(
                e.contains("invalid peer certificate: UnknownIssuer"),
                "{what}, {url}: {e}"
            );
            assert!(started.elapsed() < Duration::from_secs(2), "{what}: slow");
        }
    }

    // Told to accept any certificate, even under verify-full: encrypted, not authenticated.
    let accepting = PgStore::builder()
        .danger_accept_invalid_certificates(true)
        .application_name("tls-any")
        .connect(&format!("{}?sslmode=verify-full", server.url()))
        .await
        .unwrap_or_else(|e| panic!("connect accepting any certificate: {}", chain(&e)));
    let (all, tls, _) = sessions(&accepting, "tls-any").await;
    assert!(all >= 1);
    assert_eq!(tls, all, "sessions without TLS");

    // No CA and no verify-* mode, as libpq: encrypted, not authenticated (a development
    // server's self-signed certificate), under require and under the default prefer.
    for (mode, url) in [
        (
            "require",
            format!(
                "{}?sslmode=require&application_name=tls-unverified",
                server.url()
            ),
        ),
        (
            "prefer",
            format!("{}?application_name=tls-unverified", server.url()),
        ),
    ] {
        let store = PgStore::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{mode} without a CA: {}", chain(&e)));
        let (all, tls, _) = sessions(&store, "tls-unverified").await;
        assert!(all >= 1);
        assert_eq!(tls, all, "{mode}: sessions without TLS");
    }

    // A name the certificate does not carry (the same server, at `hostaddr`): refused even
    // with the CA.
    let url = format!(
        "postgres://postgres@db.invalid:{}/postgres?hostaddr=127.0.0.1&sslmode=require",
        server.port()
    );
    let e = PgStore::builder()
        .root_certificates(&pki.ca)
        .connect(&url)
        .await
        .expect_err("connected to a server under another name");
    let e = chain(&e);
    assert!(
        e.contains("certificate not valid for name \"db.invalid\""),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_tls_is_refused_by_the_server() {
    let pki = make_pki("tower-lease test CA");
    let server = tls_server(&pki);
    let url = format!("{}?sslmode=disable", server.url());
    let e = PgStore::builder()
        .root_certificates(&pki.ca)
        .connect(&url)
        .await
        .expect_err("connected without TLS");
    let e = chain(&e);
    assert!(e.contains("no pg_hba.conf entry"), "{e}");
    assert!(e.contains("no encryption"), "{e}");
}
