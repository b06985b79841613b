-- The tables of tower-lease-postgres, in the schema `tower_lease`. Run by `schema.rs` in one
-- transaction under an advisory lock, so replicas that start at once install it once; every
-- statement is idempotent, so an older schema is brought up to date by running it again.
--
-- Times are the server's (`clock_timestamp()`, read once per call after the name's lock), as
-- µs-precise `timestamptz`. A lease is live while `expires > now`. Rows whose leases, records
-- and fence counters all ended are deleted by the calls that next touch their name, and in
-- batches by `tower_lease.sweep()`, which each store sends about once a second after one of its
-- acquisitions, off that call's path (`sweep.rs`): there is no background job.
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

-- Whether a call was refused while the lease was held, so that its release must `NOTIFY` (an
-- unwaited release skips it: a notifying commit takes a database-wide lock). Written by the
-- refusal while it holds the row's lock, so a release after it sees it. 1 marked; 0 and -1
-- unmarked (-1: a release found it marked and notified; the release answers the value it
-- leaves, so one statement both reads and clears the mark).
ALTER TABLE tower_lease.locks ADD COLUMN IF NOT EXISTS waited smallint NOT NULL DEFAULT 0;

-- An `RwLock`'s writer, its write intent (a refused writer of a phase-fair or writers-first lock), and the
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

-- Marks a name of kind `kind` ('rw', 'p', 'v') as waited on; the caller holds the name's lock.
-- A mark already there is left alone (no write) unless 10 s old, so a waiter refused again and
-- again costs one write per 10 s.
CREATE OR REPLACE FUNCTION tower_lease.mark_waited(kind text, ns text, nm bytea, now timestamptz)
RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO tower_lease.waited AS w VALUES (kind, ns, nm, now)
    ON CONFLICT (kind, namespace, name) DO UPDATE SET since = excluded.since
        WHERE w.since < now - interval '10 seconds'
$$;

-- Tells the listeners that a lease of a name of `kind` ended (`letter` as in `notify`), if a
-- refused call marked it; clears the mark. The caller holds the name's lock, as the refusals
-- that mark it do, so every refusal before this release is seen here. A woken waiter that is
-- refused again marks it again before it waits, for the next release.
CREATE OR REPLACE FUNCTION tower_lease.notify_waited(kind text, letter text, ns text, nm bytea)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM tower_lease.waited w
    WHERE w.kind = notify_waited.kind AND w.namespace = ns AND w.name = nm;
    IF FOUND THEN
        PERFORM tower_lease.notify(letter, ns, nm);
    END IF;
END
$$;

-- Deletes up to `many` rows of each table whose leases, records and counters all ended, and the
-- marks of `waited` nobody refreshed for a minute, without ever waiting: a row another call has
-- locked, or whose name's advisory lock another call holds, is left for later (so two calls
-- sweeping at once never wait for each other). Sequential scans that stop at the first `many`
-- dead rows. Answers how many rows went: a store sends it again while a batch was full.
DROP FUNCTION IF EXISTS tower_lease.sweep(integer);
CREATE FUNCTION tower_lease.sweep(many integer DEFAULT 100)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz := clock_timestamp();
    gone integer;
    most integer := 0;
BEGIN
    DELETE FROM tower_lease.locks t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.locks
        WHERE expires <= now AND (fence_until IS NULL OR fence_until <= now)
        LIMIT many FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS gone = ROW_COUNT;
    most := greatest(most, gone);
    DELETE FROM tower_lease.rwlocks t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.rwlocks
        WHERE coalesce(writer_expires, now) <= now AND coalesce(intent_expires, now) <= now
          AND coalesce(fence_until, now) <= now LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('rw:' || t.namespace || ':' || encode(t.name, 'hex')));
    GET DIAGNOSTICS gone = ROW_COUNT;
    most := greatest(most, gone);
    DELETE FROM tower_lease.readers t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.readers WHERE expires <= now LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('rw:' || t.namespace || ':' || encode(t.name, 'hex')));
    GET DIAGNOSTICS gone = ROW_COUNT;
    most := greatest(most, gone);
    DELETE FROM tower_lease.waiting_readers t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.waiting_readers WHERE expires <= now LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('rw:' || t.namespace || ':' || encode(t.name, 'hex')));
    GET DIAGNOSTICS gone = ROW_COUNT;
    most := greatest(most, gone);
    DELETE FROM tower_lease.permits t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.permits WHERE expires <= now LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('p:' || t.namespace || ':' || encode(t.name, 'hex')));
    GET DIAGNOSTICS gone = ROW_COUNT;
    most := greatest(most, gone);
    DELETE FROM tower_lease.idempotency t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.idempotency
        WHERE coalesce(lease_expires, now) <= now AND coalesce(record_expires, now) <= now
          AND coalesce(unknown_expires, now) <= now AND coalesce(fence_until, now) <= now
        LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext('v:' || t.namespace || ':' || encode(t.name, 'hex')));
    GET DIAGNOSTICS gone = ROW_COUNT;
    most := greatest(most, gone);
    DELETE FROM tower_lease.claims t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.claims WHERE expires <= now LIMIT many FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS gone = ROW_COUNT;
    most := greatest(most, gone);
    DELETE FROM tower_lease.waited t WHERE t.ctid = ANY (ARRAY(
        SELECT ctid FROM tower_lease.waited WHERE since < now - interval '1 minute'
        LIMIT many FOR UPDATE SKIP LOCKED))
      AND pg_try_advisory_xact_lock(1953260907, hashtext(t.kind || ':' || t.namespace || ':' || encode(t.name, 'hex')));
    GET DIAGNOSTICS gone = ROW_COUNT;
    RETURN greatest(most, gone);
END
$$;
