-- The tables of tower-lease-postgres, in the schema `tower_lease`. Run by `schema.rs` in one
-- transaction under an advisory lock, so replicas that start at once install it once; every
-- statement is idempotent, so an older schema is brought up to date by running it again.
--
-- Times are the server's (`clock_timestamp()`, read once per call after the name's lock, into
-- `call_time`), as µs-precise `timestamptz`. A lease is live while `expires > call_time`. Rows whose leases, records
-- and fence counters all ended are deleted by the calls that next touch their name, and in
-- batches by `tower_lease.sweep()` (sweep.sql), which each store sends about once a second
-- after one of its acquisitions, off that call's path (`sweep.rs`): there is no background job.
--
-- Every function runs with `SET search_path = pg_catalog, pg_temp`, names its tables with their
-- schema and calls built-ins as `pg_catalog.…`, so no object of the caller's search path stands
-- in for ours. The exceptions are the one-expression helpers below (`lock_class` … `refused`):
-- they touch no table, and the planner inlines them into their callers (a `SET` would forbid
-- that and cost each call a switch of the search path).
CREATE SCHEMA IF NOT EXISTS tower_lease;

-- The functions are installed afresh with each version: those of the version before go first,
-- since a function whose answer changed cannot be replaced in place, and a renamed one would
-- stay behind. Only the view `leases` (leases.sql) depends on them: it goes first, and comes
-- back last.
DROP VIEW IF EXISTS tower_lease.leases;
DO $$
DECLARE
    old_function regprocedure;
BEGIN
    FOR old_function IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'tower_lease'::regnamespace
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', old_function);
    END LOOP;
END
$$;
DROP TYPE IF EXISTS tower_lease.acquisition;

CREATE TABLE IF NOT EXISTS tower_lease.schema_version (
    version integer NOT NULL
);

-- A `Lock`'s lease (`secret` NULL once released), and its fence counter: the last fence
-- issued, kept until `fence_until`, an hour after the last acquisition (or one TTL, if longer).
CREATE TABLE IF NOT EXISTS tower_lease.locks (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea,
    expires timestamptz NOT NULL,
    fence bigint NOT NULL DEFAULT 0,
    fence_until timestamptz,
    PRIMARY KEY (namespace, name)
);

-- Whether a call was refused while the lease was held, so that its release must `NOTIFY` (an
-- unwaited release skips it: a notifying commit takes a database-wide lock). Written by the
-- refusal while it holds the row's lock, so a release after it sees it. 1 marked; 0 and -1
-- unmarked (-1: a release found it marked and notified; `RETURNING` answers the row it
-- leaves, so one statement both reads and clears the mark).
ALTER TABLE tower_lease.locks ADD COLUMN IF NOT EXISTS waited smallint NOT NULL DEFAULT 0;

-- Who took each lease, for the view `leases`: the session's `application_name` and, over TCP,
-- the client's address. A column default, so each acquisition's insert (and the `excluded` row
-- of its upsert) fills it without a parameter. Only built-ins: a default that called a function
-- of the schema would keep the installer from dropping it.
ALTER TABLE tower_lease.locks ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));

-- An `RwLock`'s writer, its write intent (a refused writer of a phase-fair or writers-first
-- lock), and the write generation (fence counter); its readers are rows of `readers`.
CREATE TABLE IF NOT EXISTS tower_lease.rwlocks (
    namespace text NOT NULL,
    name bytea NOT NULL,
    writer bytea,
    writer_expires timestamptz,
    intent bytea,
    intent_expires timestamptz,
    fence bigint NOT NULL DEFAULT 0,
    fence_until timestamptz,
    PRIMARY KEY (namespace, name)
);

CREATE TABLE IF NOT EXISTS tower_lease.readers (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea NOT NULL,
    expires timestamptz NOT NULL,
    PRIMARY KEY (namespace, name, secret)
);

-- The waiting readers of a phase-fair `RwLock` (refused by a writer or an intent, in a bounded
-- wait), until `expires`; a writer's release turns the live ones into its read phase (`phase`,
-- `expires` then the phase's end): they come in before the next writer.
CREATE TABLE IF NOT EXISTS tower_lease.waiting_readers (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea NOT NULL,
    expires timestamptz NOT NULL,
    phase boolean NOT NULL DEFAULT false,
    PRIMARY KEY (namespace, name, secret)
);

CREATE TABLE IF NOT EXISTS tower_lease.permits (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea NOT NULL,
    expires timestamptz NOT NULL,
    PRIMARY KEY (namespace, name, secret)
);

-- One idempotency key of `IdempotencyLayer`: its reservation (the holder's secret and lease,
-- and the request fingerprint it runs for), its completed record (fingerprint, response, the
-- completing secret), the at-most-once marker, and the fence counter of fenced reservations.
CREATE TABLE IF NOT EXISTS tower_lease.idempotency (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea,
    lease_expires timestamptz,
    fingerprint bytea,
    response bytea,
    completed_by bytea,
    record_expires timestamptz,
    unknown_expires timestamptz,
    fence bigint NOT NULL DEFAULT 0,
    fence_until timestamptz,
    PRIMARY KEY (namespace, name)
);

-- The names of the other kinds ('rw', 'p', 'v') that a refused call waits on, as `waited` of
-- `locks`: written under the name's advisory lock by the refusal, deleted (and then notified)
-- by the next release under the same lock. A mark nobody refreshed for a minute is swept (a
-- waiter that is still refused writes it again, and `since` is refreshed every 10 s of it),
-- so a lock whose holder died does not keep one forever.
CREATE TABLE IF NOT EXISTS tower_lease.waited (
    kind text NOT NULL,
    namespace text NOT NULL,
    name bytea NOT NULL,
    since timestamptz NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);

-- The holder of the writer's lease (`rwlocks`), of a reader's, of a permit, of a reservation:
-- as `locks.holder`.
ALTER TABLE tower_lease.rwlocks ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));
ALTER TABLE tower_lease.readers ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));
ALTER TABLE tower_lease.permits ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));
ALTER TABLE tower_lease.idempotency ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));

-- Keys claimed by an application's own transaction (`tower_lease_postgres::claim`): the effect
-- of that request committed. Written only by `claim`, inside the application's transaction.
CREATE TABLE IF NOT EXISTS tower_lease.claims (
    namespace text NOT NULL,
    name bytea NOT NULL,
    fingerprint bytea,
    expires timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- When the claim was made: what a second claim of the key answers (`claimed_before`). NULL for
-- a claim made by `claim`, which older binaries send.
ALTER TABLE tower_lease.claims ADD COLUMN IF NOT EXISTS claimed_at timestamptz;

-- What an acquire function answers: acquired (with the fence, NULL unfenced; 0 for a fenced
-- reader before any write), or refused, with the µs until the lease in the way ends.
CREATE TYPE tower_lease.acquisition AS (
    acquired boolean,
    fence bigint,
    retry_after_us bigint
);

-- The first key of every advisory lock this crate takes (the two-key form, so an application's
-- one-key advisory locks never meet ours): 0x746c6561, "tlea". Written here once; `schema.rs`
-- takes the installation's lock before this function exists, with this number as `LOCK_CLASS`
-- (a test compares the two).
CREATE FUNCTION tower_lease.lock_class()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 1953260907
$$;

-- The second key of a name's advisory lock: a hash of the kind of lock ('rw', 'p', 'v'), the
-- namespace and the name. Two names that share a hash only wait for each other.
CREATE FUNCTION tower_lease.name_key(lock_kind text, lock_namespace text, lock_name bytea)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.hashtext(
        lock_kind || ':' || lock_namespace || ':' || pg_catalog.encode(lock_name, 'hex'))
$$;

-- A time in µs since the epoch: the clock a fence follows.
CREATE FUNCTION tower_lease.micros(at_time timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.floor(extract(epoch FROM at_time) * 1000000)::bigint
$$;

-- A duration given in milliseconds, as every TTL and retention is.
CREATE FUNCTION tower_lease.millis(ms bigint)
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.make_interval(secs => ms / 1000.0)
$$;

-- The µs from `call_time` until `ends` (0 if past): what a refusal answers as `retry_after_us`.
CREATE FUNCTION tower_lease.micros_until(ends timestamptz, call_time timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(pg_catalog.floor(extract(epoch FROM (ends - call_time)) * 1000000)::bigint, 0)
$$;

-- How long a fence counter outlives its lock's last acquisition: an hour, or one TTL if longer.
CREATE FUNCTION tower_lease.fence_life(ttl_ms bigint)
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT tower_lease.millis(greatest(3600000, ttl_ms))
$$;

-- The answers of an acquire function: acquired with `fence`, or refused by a lease that ends
-- at `blocker_ends`.
CREATE FUNCTION tower_lease.acquired(fence bigint)
RETURNS tower_lease.acquisition LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(true, fence, NULL)::tower_lease.acquisition
$$;

CREATE FUNCTION tower_lease.refused(blocker_ends timestamptz, call_time timestamptz)
RETURNS tower_lease.acquisition LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(false, NULL, tower_lease.micros_until(blocker_ends, call_time))::tower_lease.acquisition
$$;

-- Takes the transaction-scoped advisory lock that makes every call on one name of a kind
-- atomic (the `RwLock`s', the `Semaphore`s' and the idempotency keys': a `Lock`'s calls are
-- ordered by its one row's lock). No `SET` clause: its body names everything by its schema, and
-- a function with one is never inlined into its caller (each call cost a lone read's two
-- calls some 60 µs of the server's time each, against 3 µs for the lock itself).
CREATE FUNCTION tower_lease.take_name_lock(lock_kind text, lock_namespace text, lock_name bytea)
RETURNS void LANGUAGE sql VOLATILE AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(
        tower_lease.lock_class(), tower_lease.name_key(lock_kind, lock_namespace, lock_name))
$$;

-- Tells the listeners of every replica (channel `tower_lease`) that a lease of a name ended
-- (`letter` 'e' exclusive, 'r' a reader's, 'w' the writer's or an intent withdrawn, 'p'
-- permit, 'v' reservation) or that a writer waits ('i'): the letter, the namespace and the name
-- in hex, split by ':'. A payload over NOTIFY's limit (a namespace of thousands of characters)
-- goes without its name, and the listener wakes every waiter.
CREATE FUNCTION tower_lease.notify(letter text, lock_namespace text, lock_name bytea)
RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    payload text := letter || ':' || lock_namespace || ':' || pg_catalog.encode(lock_name, 'hex');
BEGIN
    IF pg_catalog.octet_length(payload) >= 7900 THEN
        payload := letter || ':*';
    END IF;
    PERFORM pg_catalog.pg_notify('tower_lease', payload);
END
$$;

-- Marks a name of kind `lock_kind` ('rw', 'p', 'v') as waited on; the caller holds the name's
-- lock. A mark already there is left alone (no write) unless 10 s old, so a waiter refused
-- again and again costs one write per 10 s.
CREATE FUNCTION tower_lease.mark_waited(
    lock_kind text, lock_namespace text, lock_name bytea, call_time timestamptz)
RETURNS void LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO tower_lease.waited AS w VALUES (lock_kind, lock_namespace, lock_name, call_time)
    ON CONFLICT (kind, namespace, name) DO UPDATE SET since = excluded.since
        WHERE w.since < call_time - interval '10 seconds'
$$;

-- Tells the listeners that a lease of a name of `lock_kind` ended (`letter` as in `notify`), if
-- a refused call marked it; clears the mark. The caller holds the name's lock, as the refusals
-- that mark it do, so every refusal before this release is seen here. A woken waiter that is
-- refused again marks it again before it waits, for the next release.
CREATE FUNCTION tower_lease.notify_waited(
    lock_kind text, letter text, lock_namespace text, lock_name bytea)
RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM tower_lease.waited w
    WHERE w.kind = lock_kind AND w.namespace = lock_namespace AND w.name = lock_name;
    IF FOUND THEN
        PERFORM tower_lease.notify(letter, lock_namespace, lock_name);
    END IF;
END
$$;
