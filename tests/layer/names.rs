//! Untrusted names over HTTP, against a real redis-server: whatever bytes a path segment or a
//! header carries, the layer answers `400` problem+json exactly when the name is empty, longer
//! than 1024 bytes, or (unless `binary_names`) not text: not UTF-8, a control character or a
//! brace. Otherwise it locks exactly that name: never a 5xx, never a look-alike.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{Method, StatusCode};
use percent_encoding::{NON_ALPHANUMERIC, percent_encode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tower_lease::{Lock, LockLayer, MAX_NAME_LEN, RedisStore, Store, extract};

use tower_lease_harness::http::{Http, Reply, serve};
use tower_lease_harness::{Endpoint, RedisServer};

const INVOICE: Lock<str> = Lock::new("invoice", Duration::from_secs(5));
const RAW: Lock<[u8]> = Lock::new("invoice", Duration::from_secs(5));

#[derive(Clone, Copy, Debug)]
enum Via {
    Path,
    Header,
}

/// Which names a layer accepts: text only (the default) or any bytes (`binary_names`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Names {
    Text,
    Binary,
}

impl Names {
    /// The layer's documented rule, written out independently of its code.
    fn accepts(self, name: &[u8]) -> bool {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return false;
        }
        self == Names::Binary
            || std::str::from_utf8(name)
                .is_ok_and(|text| !text.chars().any(|c| c.is_control() || c == '{' || c == '}'))
    }
}

struct Setup {
    store: Store,
    names: Names,
    by_path: SocketAddr,
    by_header: SocketAddr,
    http: Http,
    _server: RedisServer,
}

fn layer<E>(store: &Store, names: Names, extractor: E) -> LockLayer<E> {
    let layer = LockLayer::new(store.clone(), INVOICE, extractor);
    match names {
        Names::Text => layer,
        Names::Binary => layer.binary_names(),
    }
}

async fn setup(names: Names) -> Setup {
    let server = RedisServer::start();
    let store = Store::from(RedisStore::new(server.connection_manager().await));
    let by_path = serve(
        Router::new()
            .route("/invoices/{id}/finalize", post(|| async { "done" }))
            .route_layer(layer(&store, names, extract::path_segment(1))),
    )
    .await;
    let by_header = serve(
        Router::new()
            .route("/run", post(|| async { "done" }))
            .route_layer(layer(&store, names, extract::header("x-name"))),
    )
    .await;
    Setup {
        store,
        names,
        by_path,
        by_header,
        http: Http::new(),
        _server: server,
    }
}

impl Setup {
    async fn by_path(&self, name: &[u8]) -> Reply {
        let path = format!(
            "/invoices/{}/finalize",
            percent_encode(name, NON_ALPHANUMERIC)
        );
        self.http.send(self.by_path, Method::POST, &path, &[]).await
    }

    async fn by_header(&self, name: &[u8]) -> Reply {
        self.http
            .send(self.by_header, Method::POST, "/run", &[("x-name", name)])
            .await
    }

    async fn send(&self, via: Via, name: &[u8]) -> Reply {
        match via {
            Via::Path => self.by_path(name).await,
            Via::Header => self.by_header(name).await,
        }
    }

    /// The layer's answers for `name` through `via`: free, held by someone else, and for a
    /// look-alike name while `name` is held.
    async fn check(&self, via: Via, name: &[u8]) -> Result<(), TestCaseError> {
        let reply = self.send(via, name).await;
        if !self.names.accepts(name) {
            prop_assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{:?}", reply);
            prop_assert_eq!(
                &reply.problem()["type"],
                "urn:tower-lease:invalid-lock-name"
            );
            return Ok(());
        }
        prop_assert_eq!(reply.status, StatusCode::OK, "{:?}", reply);
        let held = RAW.try_lock(&self.store, name).await.unwrap();
        let held = held.expect("the layer released the name");
        let reply = self.send(via, name).await;
        prop_assert_eq!(
            reply.status,
            StatusCode::CONFLICT,
            "the exact name is held: {:?}",
            reply
        );
        // Names that differ by a byte a naive encoding might lose stay independent.
        for sibling in [
            [name, b"}"].concat(),
            [name, b":"].concat(),
            name[1..].to_vec(),
        ] {
            if !self.names.accepts(&sibling) {
                continue;
            }
            let reply = self.send(via, &sibling).await;
            prop_assert_eq!(
                reply.status,
                StatusCode::OK,
                "{:?} is not {:?}",
                sibling,
                name
            );
        }
        prop_assert!(held.release().await.unwrap());
        Ok(())
    }
}

/// Arbitrary bytes, weighted towards the ones that matter: braces, colons, NUL, non-UTF-8, and
/// lengths around the 1024-byte limit.
fn names_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..12),
        prop::collection::vec(prop::sample::select(b"{}:\0\xff\xc3a/%".to_vec()), 1..12),
        prop::collection::vec(any::<u8>(), MAX_NAME_LEN - 2..MAX_NAME_LEN + 3),
    ]
}

/// What a header value can carry: no control bytes, no surrounding whitespace (HTTP trims it).
fn header_names() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![0x21u8..=0x7e, 0x80u8..=0xff, Just(b' ')];
    prop_oneof![
        prop::collection::vec(byte.clone(), 0..12),
        prop::collection::vec(byte, MAX_NAME_LEN - 2..MAX_NAME_LEN + 3),
    ]
    .prop_map(|mut name| {
        while name.last() == Some(&b' ') {
            name.pop();
        }
        while name.first() == Some(&b' ') {
            name.remove(0);
        }
        name
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn run_property(names: Names, via: Via) {
    let rt = runtime();
    let setup = rt.block_on(setup(names));
    let mut runner = TestRunner::new(Config::with_cases(150));
    let strategy = match via {
        Via::Path => names_strategy().boxed(),
        Via::Header => header_names().boxed(),
    };
    runner
        .run(&strategy, |name| rt.block_on(setup.check(via, &name)))
        .unwrap();
}

#[test]
fn any_path_segment_gets_400_or_locks_exactly_that_name() {
    run_property(Names::Text, Via::Path);
}

#[test]
fn any_path_segment_gets_400_or_locks_exactly_that_binary_name() {
    run_property(Names::Binary, Via::Path);
}

#[test]
fn any_header_value_gets_400_or_locks_exactly_that_name() {
    run_property(Names::Text, Via::Header);
}

#[test]
fn any_header_value_gets_400_or_locks_exactly_that_binary_name() {
    run_property(Names::Binary, Via::Header);
}

#[test]
fn the_named_bad_inputs() {
    let rt = runtime();
    rt.block_on(async {
        let setup = setup(Names::Text).await;
        // An empty segment and a segment of 1025 bytes once decoded.
        let empty = setup
            .http
            .send(setup.by_path, Method::POST, "/invoices//finalize", &[])
            .await;
        assert_eq!(empty.status, StatusCode::BAD_REQUEST, "{empty:?}");
        empty.problem();
        let long = setup.by_path(&[b'%'; MAX_NAME_LEN + 1]).await;
        assert_eq!(long.status, StatusCode::BAD_REQUEST, "{long:?}");
        assert!(long.problem()["detail"].as_str().unwrap().contains("1025"));
        // NUL, braces and bytes that are not UTF-8: 400 through a path or a header.
        for name in [&b"a\0b"[..], b"{x}", b"}{", b"\xff\xfe", b"{invoice:1}"] {
            let reply = setup.by_path(name).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{name:?}: {reply:?}");
            assert_eq!(reply.problem()["type"], "urn:tower-lease:invalid-lock-name");
        }
        for name in [&b"{x}"[..], b"\xff\xfe", b"}:{"] {
            let reply = setup.by_header(name).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{name:?}: {reply:?}");
        }

        // The store is binary-safe: with `binary_names` the same names lock exactly themselves.
        let setup = self::setup(Names::Binary).await;
        for name in [&b"a\0b"[..], b"{x}", b"}{", b"\xff\xfe", b"{invoice:1}"] {
            setup.check(Via::Path, name).await.unwrap();
        }
        for name in [&b"{x}"[..], b"\xff\xfe", b"}:{"] {
            setup.check(Via::Header, name).await.unwrap();
        }
    });
}
