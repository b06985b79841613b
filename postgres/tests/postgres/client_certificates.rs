//! TLS with client certificates: a server that takes TLS connections only, each authenticated
//! by a client certificate its CA signed (`cert` in `pg_hba.conf`). A store given the
//! certificate and its key (`sslcert` and `sslkey` in the URL, as libpq reads them, or the
//! builder's `client_certificate`) connects,
//! locks, and its listener's session is authenticated the same way; without them the server
//! refuses the store at once, with its reason. `sslmode=allow`, libpq's "plain text unless the
//! server asks for TLS", connects to such a server over TLS.

use crate::support;

use std::time::Duration;

use tower_lease::Lock;
use tower_lease_postgres::PgStore;

use support::pki::{chain, client_certificate_server, make_pki, temp_file};

const JOBS: Lock<str> = Lock::new("client-certificates", Duration::from_secs(5));

/// The sessions named `name`: how many, and how many over TLS with a client certificate, once
/// there are at least `least` of them. The listener connects in the background, after
/// `connect` answered, so a count taken at once may not see its session yet.
async fn sessions(store: &PgStore, name: &str, least: i64) -> (i64, i64) {
    let client = store.pool().get().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row = client
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE s.ssl AND s.client_dn = '/CN=postgres') \
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name = $1",
                &[&name],
            )
            .await
            .unwrap();
        let (all, certified): (i64, i64) = (row.get(0), row.get(1));
        if all >= least || std::time::Instant::now() >= deadline {
            return (all, certified);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslcert_and_sslkey_in_the_url_authenticate_the_pool_and_the_listener() {
    let pki = make_pki("tower-lease client CA");
    let server = client_certificate_server(&pki);
    let ca = temp_file("client-ca.pem", &pki.ca);
    let cert = temp_file("client.crt", &pki.client_cert);
    let key = temp_file("client.key", &pki.client_key);
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}&application_name=cert-url",
        server.url(),
        ca.display(),
        cert.display(),
        key.display(),
    );
    let store = PgStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect with a client certificate: {}", chain(&e)));
    for path in [ca, cert, key] {
        let _ = std::fs::remove_file(path);
    }
    let token = JOBS.try_lock(&store.clone().into(), "a").await.unwrap();
    assert!(token.expect("free").release().await.unwrap());
    // The pool's sessions and the listener's.
    let (all, certified) = sessions(&store, "cert-url", 2).await;
    assert!(all >= 2, "{all} sessions: the pool's and the listener's");
    assert_eq!(certified, all, "sessions without the client certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builders_client_certificate_authenticates_the_pool_and_the_listener() {
    let pki = make_pki("tower-lease client CA");
    let server = client_certificate_server(&pki);
    let url = format!("{}?sslmode=verify-full", server.url());
    let store = PgStore::builder()
        .root_certificates(&pki.ca)
        .client_certificate(&pki.client_cert, &pki.client_key)
        .application_name("cert-builder")
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect with a client certificate: {}", chain(&e)));
    let token = JOBS.try_lock(&store.clone().into(), "b").await.unwrap();
    assert!(token.expect("free").release().await.unwrap());
    let (all, certified) = sessions(&store, "cert-builder", 2).await;
    assert!(all >= 2, "{all} sessions: the pool's and the listener's");
    assert_eq!(certified, all, "sessions without the client certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_the_server_refuses_at_once() {
    let pki = make_pki("tower-lease client CA");
    let server = client_certificate_server(&pki);
    let url = format!("{}?sslmode=require", server.url());
    let started = std::time::Instant::now();
    let refused = PgStore::builder()
        .root_certificates(&pki.ca)
        .connect(&url)
        .await
        .expect_err("connected without a client certificate");
    let why = chain(&refused);
    assert!(why.contains("certificate"), "{why}");
    assert!(started.elapsed() < Duration::from_secs(5), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_allow_connects_over_tls_to_a_server_that_requires_it() {
    let pki = make_pki("tower-lease client CA");
    let server = client_certificate_server(&pki);
    let cert = temp_file("allow.crt", &pki.client_cert);
    let key = temp_file("allow.key", &pki.client_key);
    let url = format!(
        "{}?sslmode=allow&sslcert={}&sslkey={}&application_name=cert-allow",
        server.url(),
        cert.display(),
        key.display(),
    );
    let store = PgStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect with sslmode=allow: {}", chain(&e)));
    for path in [cert, key] {
        let _ = std::fs::remove_file(path);
    }
    let (all, certified) = sessions(&store, "cert-allow", 1).await;
    assert!(all >= 1);
    assert_eq!(
        certified, all,
        "sessions without TLS and the client certificate"
    );
}
