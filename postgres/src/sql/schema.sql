-- The tables of tower-lease-postgres, in the schema `tower_lease`. Run by `schema.rs` in one
-- transaction under an advisory lock, so replicas that start at once install it once; every
-- statement is idempotent, so an older schema is brought up to date by running it again.
--
-- Times are the server's (`clock_timestamp()`, read once per call after the name's lock), as
-- µs-precise `timestamptz`. A lease is live while `expires > now`. Rows whose leases, records
-- and fence counters all ended are deleted by the calls that next touch their name, and a few
-- at a time by `tower_lease.sweep()`, which the acquiring calls run now and then: there is no
-- background job.
CREATE SCHEMA IF NOT EXISTS tower_lease;

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

-- An `RwLock`'s writer, its write intent (a refused writer of a writer-preferred lock), and the
-- write generation (fence counter); its readers are rows of `readers`.
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

-- Keys claimed by an application's own transaction (`tower_lease_postgres::claim`): the effect
-- of that request committed. Written only by `claim`, inside the application's transaction.
CREATE TABLE IF NOT EXISTS tower_lease.claims (
    namespace text NOT NULL,
    name bytea NOT NULL,
    fingerprint bytea,
    expires timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- The transaction-scoped advisory lock that makes every call on one name atomic: the two-key
-- form, whose first key is this crate's (so an application's one-key advisory locks never
-- meet ours), the second a hash of the kind of lock, the namespace and the name. Two names
-- that share a hash only wait for each other.
CREATE OR REPLACE FUNCTION tower_lease.lock_name(kind text, ns text, nm bytea)
RETURNS void LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(1953260907, hashtext(kind || ':' || ns || ':' || encode(nm, 'hex')))
$$;

-- A time in µs since the epoch: the clock a fence follows.
CREATE OR REPLACE FUNCTION tower_lease.micros(t timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT floor(extract(epoch FROM t) * 1000000)::bigint
$$;

-- The µs from `now` to `t` (0 if past): what a refusal answers as `retry_after`.
CREATE OR REPLACE FUNCTION tower_lease.left_us(t timestamptz, now timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(floor(extract(epoch FROM (t - now)) * 1000000)::bigint, 0)
$$;

-- How long a fence counter outlives its lock's last acquisition: an hour, or one TTL if longer.
CREATE OR REPLACE FUNCTION tower_lease.fence_life(ttl_ms bigint)
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
    SELECT make_interval(secs => greatest(3600000, ttl_ms) / 1000.0)
$$;

-- Tells the listeners of every replica (channel `tower_lease`) that a lease of `name` ended
-- (`kind` 'e' exclusive, 'r' a reader's, 'w' the writer's or an intent withdrawn, 'p' permit,
-- 'v' reservation) or that a writer waits ('i'): the kind, the namespace and the name in hex,
-- split by ':'. A payload over NOTIFY's limit (a namespace of thousands of characters) goes
-- without its name, and the listener wakes every waiter.
CREATE OR REPLACE FUNCTION tower_lease.notify(kind text, ns text, nm bytea)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    payload text := kind || ':' || ns || ':' || encode(nm, 'hex');
BEGIN
    IF octet_length(payload) >= 7900 THEN
        payload := kind || ':*';
    END IF;
    PERFORM pg_notify('tower_lease', payload);
END
$$;

-- Deletes a few rows whose leases, records and counters all ended, without ever waiting: a
-- row another call has locked, or whose name's advisory lock another call holds, is left for
-- later (so two calls sweeping at once never wait for each other). Sequential scans that stop
-- at the first `many` dead rows: cheap while tables hold mostly live rows.
CREATE OR REPLACE FUNCTION tower_lease.sweep(many integer DEFAULT 16)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz := clock_timestamp();
BEGIN
    DELETE FROM tower_lease.locks t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.locks
        WHERE expires <= now AND (fence_until IS NULL OR fence_until <= now)
        LIMIT many FOR UPDATE SKIP LOCKED));
    DELETE FROM tower_lease.rwlocks t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.rwlocks
        WHERE coalesce(writer_expires, now) <= now AND coalesce(intent_expires, now) <= now
          AND coalesce(fence_until, now) <= now LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('rw:' || t.namespace || ':' || encode(t.name, 'hex')));
    DELETE FROM tower_lease.readers t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.readers WHERE expires <= now LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('rw:' || t.namespace || ':' || encode(t.name, 'hex')));
    DELETE FROM tower_lease.permits t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.permits WHERE expires <= now LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('p:' || t.namespace || ':' || encode(t.name, 'hex')));
    DELETE FROM tower_lease.idempotency t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.idempotency
        WHERE coalesce(lease_expires, now) <= now AND coalesce(record_expires, now) <= now
          AND coalesce(unknown_expires, now) <= now AND coalesce(fence_until, now) <= now
        LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('v:' || t.namespace || ':' || encode(t.name, 'hex')));
    DELETE FROM tower_lease.claims t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.claims WHERE expires <= now LIMIT many FOR UPDATE SKIP LOCKED));
END
$$;
