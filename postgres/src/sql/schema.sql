-- The type and helpers of this version's functions (the tables are in tables.sql). Every name
-- of a function or type of the schema is installed with the version's number
-- (`tower_lease.lock_class` as `lock_class_v9`: `naming.rs`), so a version's functions call only
-- their own.
--
-- Every function runs with `SET search_path = pg_catalog, pg_temp`, names its tables with their
-- schema and calls built-ins as `pg_catalog.…`, so no object of the caller's search path stands
-- in for ours. The exceptions are the one-expression helpers below (`lock_class` … `refused`):
-- they touch no table, and the planner inlines them into their callers (a `SET` would forbid
-- that and cost each call a switch of the search path).

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
