//! [`PgStore`]: the store's handle, how it is built, and its options.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tower_lease::{Error, Result, Store};

use crate::call::Stalled;
use crate::naming::Schema;
use crate::network;
use crate::notify::Listening;
use crate::options::{DEFAULT_APPLICATION_NAME, PgStoreBuilder};
use crate::schema;
use crate::session::{self, ServerBound, Sessions};
use crate::statement::Statements;
use crate::sweep::Sweeper;
use crate::tls::{self, Connector};

/// The deadline of each call unless [`PgStore::timeout`] says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// A lease store in PostgreSQL: a [`Backend`](tower_lease::backend::Backend) on a pool of
/// connections, made into a [`Store`] with `.into()`.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_lease::Store;
/// use tower_lease_postgres::PgStore;
///
/// # async fn run() -> Result<(), tower_lease::Error> {
/// let store: Store = PgStore::connect("postgres://app@127.0.0.1/app")
///     .await?
///     .timeout(Duration::from_millis(500))
///     .into();
/// for warning in store.check().await? {
///     eprintln!("lock store: {warning}");
/// }
/// # Ok(())
/// # }
/// ```
///
/// Cloning it is cheap: the clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    pub(crate) pool: Pool,
    pub(crate) timeout: Duration,
    pub(crate) concurrency: Option<usize>,
    pub(crate) stalled: Arc<Stalled>,
    pub(crate) listening: Option<Listening>,
    pub(crate) sweeper: Arc<Sweeper>,
    pub(crate) schema: Schema,
    pub(crate) sessions: Sessions,
    /// Named and cached per connection, or unnamed behind a transaction pooler.
    pub(crate) statements: Statements,
    /// The server's bound on the statements of a pool the store made, which its hooks read.
    pub(crate) server_bound: Arc<ServerBound>,
    /// What the listener connects with: the builder's CAs (and the URL's, from `connect`).
    pub(crate) tls: Connector,
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db`, or the
    /// `key=value` form libpq takes) with a pool of 16 connections, installs the
    /// schema `tower_lease` if it is missing or older (see [`from_pool`](Self::from_pool)),
    /// and listens for releases on a connection of its own. Every session is named
    /// `tower-lease` (`application_name`) unless the URL names it. The options that must be
    /// known before connecting (the pool's size, the sessions' name, the schema and whether
    /// to install it) are the [`builder`](Self::builder)'s.
    ///
    /// **TLS** (the default feature `tls`, rustls): the URL's `sslmode` says whether to use
    /// it, for the pool and the listener alike: `disable` never, `prefer` (the default) when
    /// the server offers it, `require`, `verify-ca` and `verify-full` always, or no
    /// connection. As with libpq, the server's certificate and name are verified under
    /// `verify-ca` and `verify-full`, and in every mode once CAs are given (the file
    /// `sslrootcert=<path>` in the URL, the builder's
    /// [`root_certificates`](PgStoreBuilder::root_certificates)), against the platform's roots
    /// and those CAs: `postgres://app@db.example.com/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem`.
    /// Under `prefer` and `require` without CAs, TLS encrypts but does not authenticate the
    /// server (a development server's self-signed certificate is spoken to). A certificate
    /// that does not verify fails `connect` with the reason (`invalid peer certificate:
    /// UnknownIssuer` in the error's sources). A client certificate, for a server that asks
    /// for one, is the files `sslcert=<path>&sslkey=<path>` in the URL, or the builder's
    /// [`client_certificate`](PgStoreBuilder::client_certificate). `sslmode=allow` is read as
    /// `prefer`.
    pub async fn connect(url: &str) -> Result<PgStore> {
        Self::builder().connect(url).await
    }

    /// The options a store connects with, then [`connect`](PgStoreBuilder::connect) or
    /// [`from_pool`](PgStoreBuilder::from_pool): as `sqlx`'s pool options, set before the
    /// pool exists.
    pub fn builder() -> PgStoreBuilder {
        PgStoreBuilder::default()
    }

    /// A store on `pool`, after installing the schema: the schema `tower_lease` and the tables
    /// when missing, and this version's functions beside those of the versions already there
    /// ([`schema_sql`](crate::schema_sql)), in one transaction under an advisory lock, so
    /// replicas that start at once install it once. The database user needs the `CREATE`
    /// privilege on the database the first time, or on a schema made for it in advance. A newer
    /// version of the schema that does not run beside this one is refused with an error naming
    /// both versions. Another schema, or none installed: the [`builder`](Self::builder)'s
    /// [`from_pool`](PgStoreBuilder::from_pool).
    ///
    /// A pool has no way to open the extra connection that listens for releases: add
    /// [`listen`](Self::listen), or waiters poll for releases made by other processes.
    pub async fn from_pool(pool: Pool) -> Result<PgStore> {
        Self::builder().from_pool(pool).await
    }

    /// The deadline of each call, from the checkout of a connection to the answer (1 s by
    /// default): past it the call answers [`Error::Timeout`], and what it may still take is
    /// given back.
    ///
    /// The server bounds each call's statements by it too (`statement_timeout` and
    /// `lock_timeout`, in whole milliseconds), so a call given up on does not wait on a lock
    /// and act later; a statement the server cancels answers [`Error::Timeout`]. On the pool
    /// of [`connect`](Self::connect) they are set on each session as it opens (the
    /// connections opened before a change close at their next checkout, and the last timeout
    /// set on a store or any of its clones holds for the pool), so your queries on
    /// [`pool`](Self::pool) have them too; on a pool given to [`from_pool`](Self::from_pool),
    /// or behind a [transaction pooler](PgStoreBuilder::transaction_pooler), they are `SET
    /// LOCAL` in each call's transaction and touch nothing else.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.server_bound.set(timeout);
        self
    }

    /// Listens for releases, write intents and completions with a connection of its own to
    /// the database `config` names (TLS as its `sslmode` says, trusting the platform's roots
    /// and the builder's [`root_certificates`](PgStoreBuilder::root_certificates); named
    /// `tower-lease` unless `config` names it), reconnecting with backoff when it is lost.
    /// [`connect`](Self::connect) does it already, but not behind a
    /// [transaction pooler](PgStoreBuilder::transaction_pooler): there `LISTEN` on a direct
    /// URL to PostgreSQL, since it needs a session of its own.
    pub fn listen(mut self, mut config: tokio_postgres::Config) -> Self {
        if config.get_application_name().is_none() {
            config.application_name(DEFAULT_APPLICATION_NAME);
        }
        self.listening = Some(Listening::new(config, self.schema, self.tls.clone()));
        self
    }

    /// How many calls may be under way at once (the layers' concurrency limits, the tasks that
    /// hold leases): [`check`](Self::check) warns when the pool has fewer connections.
    pub fn expect_concurrency(mut self, calls: usize) -> Self {
        self.concurrency = Some(calls);
        self
    }

    /// The pool the store runs on. The sessions of the pool of [`connect`](Self::connect)
    /// default to read committed, and bound each statement by the store's
    /// [`timeout`](Self::timeout) (`statement_timeout`, `lock_timeout`): a query of yours on
    /// it that may run longer sets its own (`SET LOCAL statement_timeout = 0` in its
    /// transaction).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Drops the functions of the schema's versions older than this crate's (the contract step
    /// of an upgrade, [`contract_sql`](crate::contract_sql)): call it once every replica runs
    /// this version. The tables and the leases in them stay. A replica of an older version that
    /// starts afterwards installs its functions again.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when this version is not installed, or the server fails;
    /// [`Error::Timeout`] past 30 s.
    pub async fn contract(&self) -> Result<()> {
        crate::schema::contract(&self.pool, self.schema).await
    }

    /// The schema the store keeps its leases in, as [`claim_in`](crate::claim_in) takes it.
    pub fn schema_name(&self) -> &str {
        self.schema.name()
    }
}

impl PgStoreBuilder {
    /// Connects to the database at `url`, as [`PgStore::connect`] does with these options.
    pub async fn connect(self, url: &str) -> Result<PgStore> {
        let tls::Target {
            mut config,
            files,
            verify,
        } = tls::parse(url)?;
        let tls = Connector::new(&self, &files, verify)?;
        network::find_dead_sockets(&mut config, url);
        if let Some(name) = &self.application_name {
            config.application_name(name);
        } else if config.get_application_name().is_none() {
            config.application_name(DEFAULT_APPLICATION_NAME);
        }
        let manager = Manager::from_config(
            config.clone(),
            tls.make(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let server_bound = Arc::new(ServerBound::new(DEFAULT_TIMEOUT));
        let pooler = self.transaction_pooler;
        let mut pool = Pool::builder(manager).max_size(self.max_connections);
        // Behind a transaction pooler a session's settings stay on a server connection: each
        // call sets its own in its transaction, and the store listens on a direct URL.
        let sessions = if pooler {
            Sessions::AnyDefault
        } else {
            pool = pool
                .post_create(session::session_hook(server_bound.clone()))
                .post_recycle(session::stale_hook(server_bound.clone()));
            Sessions::ReadCommitted
        };
        let pool = pool.build().map_err(|e| Error::Backend(Box::new(e)))?;
        let store = self.on_pool(pool, sessions, server_bound, tls).await?;
        Ok(if pooler { store } else { store.listen(config) })
    }

    /// A store on `pool`, as [`PgStore::from_pool`] makes it with these options (but the
    /// pool's size and its sessions' name, which are the pool's).
    ///
    /// Its sessions may default to any isolation level (a pool's settings, `ALTER ROLE … SET
    /// default_transaction_isolation`): each call runs in a transaction of its own at read
    /// committed, `BEGIN ISOLATION LEVEL READ COMMITTED`, the call and `COMMIT` sent together
    /// in one round trip. The pool of [`connect`](Self::connect) sets read committed as each
    /// session's default when it opens, and its calls need no such transaction.
    pub async fn from_pool(self, pool: Pool) -> Result<PgStore> {
        let server_bound = Arc::new(ServerBound::new(DEFAULT_TIMEOUT));
        let tls = Connector::new(&self, &tls::TlsFiles::default(), false)?;
        self.on_pool(pool, Sessions::AnyDefault, server_bound, tls)
            .await
    }

    async fn on_pool(
        self,
        pool: Pool,
        sessions: Sessions,
        server_bound: Arc<ServerBound>,
        tls: Connector,
    ) -> Result<PgStore> {
        let schema = Schema::new(&self.schema).map_err(|e| Error::Backend(e.into()))?;
        schema::install(&pool, schema, self.install_schema).await?;
        Ok(PgStore {
            pool,
            timeout: DEFAULT_TIMEOUT,
            concurrency: None,
            stalled: Arc::default(),
            listening: None,
            sweeper: Arc::new(Sweeper::new(self.sweep_every, schema)),
            schema,
            sessions,
            statements: Statements::new(self.transaction_pooler),
            server_bound,
            tls,
        })
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("pool", &self.pool.status())
            .field("timeout", &self.timeout)
            .field("concurrency", &self.concurrency)
            .field("listening", &self.listening.is_some())
            .field("schema", &self.schema.name())
            .field("sessions", &self.sessions)
            .field("statements", &self.statements)
            .finish_non_exhaustive()
    }
}

impl From<PgStore> for Store {
    fn from(store: PgStore) -> Store {
        Store::from_backend(store)
    }
}
