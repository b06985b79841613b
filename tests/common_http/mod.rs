//! Helpers for the layer's black-box tests: a store on a real redis-server or in memory, axum
//! servers on 127.0.0.1:0, and an HTTP/1 client.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{RedisStore, Store};

use crate::support::RedisServer;

/// Runs `$body` (an async fn taking an [`Env`]) once against Redis and once against memory.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common_http::Env::redis().await).await
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common_http::Env::memory()).await
                }
            )*
        }
        #[cfg(feature = "cluster")]
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common_http::Env::cluster().await).await
                }
            )*
        }
    };
}

/// A store and, for Redis, the server behind it and a side connection for looking at keys.
pub struct Env {
    pub store: Store,
    pub server: Option<RedisServer>,
    conn: Option<redis::aio::MultiplexedConnection>,
    #[cfg(feature = "cluster")]
    cluster: Option<(
        crate::support::cluster::RedisCluster,
        redis::cluster_async::ClusterConnection,
    )>,
    layout: KeyLayout,
}

/// The deadline of every store call in these tests: short, so failure tests stay fast.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(500);

impl Env {
    pub async fn redis() -> Self {
        let server = RedisServer::start();
        let store = RedisStore::new(server.connection_manager().await).timeout(STORE_TIMEOUT);
        let layout = store.layout().clone();
        let conn = server.connection().await;
        Env {
            store: store.into(),
            server: Some(server),
            conn: Some(conn),
            #[cfg(feature = "cluster")]
            cluster: None,
            layout,
        }
    }

    /// A store on a local 3-master Redis Cluster.
    #[cfg(feature = "cluster")]
    pub async fn cluster() -> Self {
        let cluster = crate::support::cluster::RedisCluster::start();
        let conn = cluster.connection().await;
        let store = RedisStore::new(conn.clone()).timeout(STORE_TIMEOUT);
        let layout = store.layout().clone();
        Env {
            store: store.into(),
            server: None,
            conn: None,
            cluster: Some((cluster, conn)),
            layout,
        }
    }

    /// Runs `cmd` on the Redis behind the store, a single server or the cluster.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        #[cfg(feature = "cluster")]
        if let Some((_, conn)) = &self.cluster {
            return cmd.query_async(&mut conn.clone()).await.unwrap();
        }
        let mut conn = self.conn.clone().expect("only a Redis env has keys");
        cmd.query_async(&mut conn).await.unwrap()
    }

    pub fn memory() -> Self {
        Env {
            store: Store::memory(),
            server: None,
            conn: None,
            #[cfg(feature = "cluster")]
            cluster: None,
            layout: KeyLayout::default(),
        }
    }

    pub fn is_redis(&self) -> bool {
        self.conn.is_some() || self.is_cluster()
    }

    fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        return self.cluster.is_some();
        #[cfg(not(feature = "cluster"))]
        false
    }

    /// Deletes a lease's key behind the layer's back (Redis only).
    pub async fn delete(&self, role: KeyRole, namespace: &str, name: &[u8]) -> bool {
        let key = self.layout.key(role, namespace, name);
        self.query::<i64>(redis::cmd("DEL").arg(key)).await == 1
    }

    /// The raw value of a lease's key (Redis only).
    pub async fn get(&self, role: KeyRole, namespace: &str, name: &[u8]) -> Option<Vec<u8>> {
        let key = self.layout.key(role, namespace, name);
        self.query(redis::cmd("GET").arg(key)).await
    }
}

/// Serves `app` on a fresh 127.0.0.1 port until the test's runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("utf-8 body")
    }

    /// The body as JSON, checking it is a problem document of this reply's status.
    pub fn problem(&self) -> serde_json::Value {
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("application/problem+json"),
            "{self:?}"
        );
        let json: serde_json::Value = serde_json::from_slice(&self.body).expect("a JSON body");
        assert_eq!(json["status"], self.status.as_u16(), "{json}");
        for field in ["type", "title", "detail"] {
            assert!(json[field].is_string(), "problem without {field}: {json}");
        }
        json
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap())
    }
}

/// An HTTP/1 client.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn send(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        headers: &[(&str, &[u8])],
    ) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let res = self
            .client
            .request(req.body(Full::default()).unwrap())
            .await
            .unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn get(&self, addr: SocketAddr, path: &str) -> Reply {
        self.send(addr, Method::GET, path, &[]).await
    }

    pub async fn post(&self, addr: SocketAddr, path: &str) -> Reply {
        self.send(addr, Method::POST, path, &[]).await
    }

    pub async fn put(&self, addr: SocketAddr, path: &str) -> Reply {
        self.send(addr, Method::PUT, path, &[]).await
    }
}
