//! [`PgStoreBuilder`]: what a store is built with before it connects (its pool, its sessions'
//! name, its schema and whether it installs it, its sweep's cadence).

use std::time::Duration;

/// The connections [`PgStore::connect`](crate::PgStore::connect) pools unless told otherwise.
pub(crate) const DEFAULT_POOL: usize = 16;
/// The `application_name` of a store's sessions, unless the URL or the builder names one.
pub(crate) const DEFAULT_APPLICATION_NAME: &str = "tower-lease";
/// How often a busy store sweeps unless told otherwise.
pub(crate) const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Options of a [`PgStore`](crate::PgStore) that must be known before it connects, from
/// [`PgStore::builder`](crate::PgStore::builder); [`connect`](Self::connect) or
/// [`from_pool`](Self::from_pool) builds the store. Options that can change later
/// ([`timeout`](crate::PgStore::timeout),
/// [`expect_concurrency`](crate::PgStore::expect_concurrency)) are the store's own.
///
/// ```no_run
/// use tower_lease::Store;
/// use tower_lease_postgres::PgStore;
///
/// # async fn run() -> Result<(), tower_lease::Error> {
/// // The schema comes from the application's migrations, under a name of its own; the
/// // store's database user cannot create schemas.
/// let store: Store = PgStore::builder()
///     .schema("shop_locks")
///     .install_schema(false)
///     .max_connections(32)
///     .application_name("shop-api")
///     .connect("postgres://shop@db.internal/shop")
///     .await?
///     .into();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until connect or from_pool builds the store"]
pub struct PgStoreBuilder {
    pub(crate) max_connections: usize,
    pub(crate) application_name: Option<String>,
    pub(crate) schema: String,
    pub(crate) install_schema: bool,
    pub(crate) sweep_every: Duration,
    /// PEM certificates of CAs to trust besides the platform's.
    pub(crate) root_certificates: Vec<Vec<u8>>,
    /// Whether TLS goes on with a certificate that does not verify.
    pub(crate) accept_invalid_certificates: bool,
    /// A client certificate with its chain, and its private key, in PEM.
    pub(crate) client_certificate: Option<(Vec<u8>, Vec<u8>)>,
    /// Whether calls go through a transaction pooler (see `transaction_pooler`).
    pub(crate) transaction_pooler: bool,
}

impl Default for PgStoreBuilder {
    fn default() -> Self {
        PgStoreBuilder {
            max_connections: DEFAULT_POOL,
            application_name: None,
            schema: crate::naming::DEFAULT_SCHEMA.to_owned(),
            install_schema: true,
            sweep_every: DEFAULT_SWEEP_EVERY,
            root_certificates: Vec::new(),
            accept_invalid_certificates: false,
            client_certificate: None,
            transaction_pooler: false,
        }
    }
}

impl PgStoreBuilder {
    /// The most connections the pool of [`connect`](Self::connect) opens (16 by default); the
    /// store's listener has one more of its own. Each call of the store holds one for its
    /// round trip: size it for the calls expected at once (the layers' concurrency limits,
    /// the tasks that hold leases, whose heartbeats extend them), and tell
    /// [`expect_concurrency`](crate::PgStore::expect_concurrency) so that
    /// [`check`](crate::PgStore::check) warns when it is too small. A pool of your own
    /// ([`from_pool`](Self::from_pool)) keeps its size.
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections.max(1);
        self
    }

    /// The `application_name` of the store's sessions, the pool's and the listener's: what
    /// `pg_stat_activity` shows, and the start of the holder of each lease in the view
    /// `leases`. By default the URL's `application_name`, else `tower-lease`; name each
    /// replica (`shop-api-3`) to see which one holds what. A pool of your own
    /// ([`from_pool`](Self::from_pool)) keeps the name its configuration gives.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// The schema the store keeps its tables and functions in (`tower_lease` by default),
    /// whose name is also the channel its releases are notified on: stores of different
    /// schemas on one database are separate lock spaces. A name is lowercase ASCII letters,
    /// digits and `_`, not first a digit nor `pg_`, at most 63 bytes: what PostgreSQL keeps
    /// unquoted, so `SELECT * FROM shop_locks.leases` finds it (the store quotes it, so a
    /// keyword works too). Any other name fails [`connect`](Self::connect). Claim idempotency
    /// keys in it with [`claim_in`](crate::claim_in), and migrate it with
    /// [`schema_sql`](crate::schema_sql) of the same name.
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.schema = name.into();
        self
    }

    /// Whether connecting installs the schema (`true`, the default): creates it when missing
    /// and brings it to this version when older, which needs a database user that may create
    /// it. With `false` the store installs nothing, and connecting fails, saying what to
    /// apply, unless the schema is there at this version: for applications whose migrations
    /// apply [`schema_sql`](crate::schema_sql), and whose store runs as a user with only the
    /// privileges it uses (`USAGE` on the schema; `SELECT`, `INSERT`, `UPDATE` and `DELETE`
    /// on its tables). Either way a schema of a newer version is refused.
    pub fn install_schema(mut self, install: bool) -> Self {
        self.install_schema = install;
        self
    }

    /// How often a busy store sweeps ended rows (once a second by default): after one of its
    /// acquisitions, on a task of its own, when the last sweep is older than this; an idle
    /// store sends none. The sweep finds ended rows by index, and the calls on a name delete
    /// its ended rows anyway: with many replicas, a longer cadence (10 s, a minute) keeps the
    /// tables as small in practice for fewer statements.
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every;
        self
    }

    /// Trusts the CA certificates in `pem` (PEM, one or more `-----BEGIN CERTIFICATE-----`
    /// blocks) besides the platform's roots, for the TLS connections of the pool of
    /// [`connect`](Self::connect) and of the listener: e.g. your cloud provider's CA bundle,
    /// as `sslrootcert=<path>` in the URL does from a file. Each call adds to the CAs of the
    /// calls before; a `pem` without a certificate fails [`connect`](Self::connect). Whether
    /// TLS is used is the URL's `sslmode` (see [`PgStore::connect`](crate::PgStore::connect)).
    /// Without the feature `tls`, a store given CAs refuses to connect.
    pub fn root_certificates(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.root_certificates.push(pem.as_ref().to_vec());
        self
    }

    /// Authenticates the store's TLS connections (the pool's and the listener's) with the
    /// client certificate `cert_pem` (PEM, the certificate first, then any intermediate CAs)
    /// and its private key `key_pem` (PEM: PKCS#8, PKCS#1 or SEC1), for a server that asks
    /// for one (`cert` in `pg_hba.conf`, or `clientcert=verify-full`), as `sslcert` and
    /// `sslkey` in the URL do from files. A store given a certificate both ways, or one that
    /// does not load, fails [`connect`](Self::connect). Without the feature `tls`, a store
    /// given one refuses to connect.
    pub fn client_certificate(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Self {
        self.client_certificate = Some((cert_pem.as_ref().to_vec(), key_pem.as_ref().to_vec()));
        self
    }

    /// With `true`, TLS connections go on whatever certificate the server shows (expired,
    /// self-signed, of another name, of an unknown CA) in every `sslmode`, also `verify-full`
    /// and with CAs given: encrypted, but not authenticated, so anyone on the path can pose as
    /// the server. `false` by default: a certificate is verified where the URL's `sslmode`
    /// (`verify-ca`, `verify-full`) or given CAs ask for it. For a server whose CA
    /// you cannot have (a development machine's self-signed certificate); give
    /// [`root_certificates`](Self::root_certificates) instead whenever you can. Without the
    /// feature `tls`, where no connection uses TLS, it does nothing.
    pub fn danger_accept_invalid_certificates(mut self, accept: bool) -> Self {
        self.accept_invalid_certificates = accept;
        self
    }

    /// Whether the URL of [`connect`](Self::connect) (or the pool of
    /// [`from_pool`](Self::from_pool)) reaches PostgreSQL through a transaction pooler, such
    /// as PgBouncer with `pool_mode = transaction` (`false` by default), which gives each
    /// transaction whichever server connection is free. With `true`:
    ///
    /// - each call is sent as the unnamed statement, with its parameters' types, in one
    ///   message: no prepared statement is left on a server connection for the next call to
    ///   miss. The store learns each statement's types the first time it sends it, in a
    ///   transaction of its own;
    /// - each call runs in a transaction of its own, `BEGIN ISOLATION LEVEL READ COMMITTED`,
    ///   `SET LOCAL statement_timeout` and `lock_timeout`, the call and `COMMIT` sent together
    ///   in one round trip, as on a pool of [`from_pool`](Self::from_pool): nothing is set on
    ///   a session, whose settings would stay on a server connection for other clients;
    /// - [`connect`](Self::connect) does not listen for releases, since `LISTEN` needs a
    ///   session of its own: add [`listen`](crate::PgStore::listen) with a direct URL to
    ///   PostgreSQL, not the pooler's, or waiters poll for releases made by other processes.
    ///
    /// The schema's installation works through the pooler too (its lock and DDL are one
    /// transaction). A pooler in `session` mode, or PgBouncer 1.21 and later with
    /// `max_prepared_statements` set, needs none of this.
    pub fn transaction_pooler(mut self, pooler: bool) -> Self {
        self.transaction_pooler = pooler;
        self
    }
}
