-- tower-lease-postgres, schema version 8
SELECT pg_catalog.pg_advisory_xact_lock(1953260907, 0);
DO $$
BEGIN
    IF pg_catalog.to_regclass('"tower_lease".schema_version') IS NOT NULL THEN
        IF (SELECT pg_catalog.max(version) FROM "tower_lease".schema_version) > 8 THEN
            RAISE EXCEPTION 'the schema tower_lease is at a newer version than 8, %',
                'which this SQL installs: a newer tower-lease-postgres installed it';
        END IF;
    END IF;
END
$$;
-- The tables of tower-lease-postgres, in the schema `tower_lease`. Run by `schema.rs` in one
-- transaction under an advisory lock, so replicas that start at once install it once; every
-- statement is idempotent, so an older schema is brought up to date by running it again.
--
-- Times are the server's (`clock_timestamp()`, read once per call after the name's lock, into
-- `call_time`), as µs-precise `timestamptz`. A lease is live while `expires > call_time`. Rows whose leases, records
-- and fence counters all ended are deleted by the calls that next touch their name, and in
-- batches by `"tower_lease".sweep()` (sweep.sql), which each store sends about once a second
-- after one of its acquisitions, off that call's path (`sweep.rs`): there is no background job.
--
-- Every function runs with `SET search_path = pg_catalog, pg_temp`, names its tables with their
-- schema and calls built-ins as `pg_catalog.…`, so no object of the caller's search path stands
-- in for ours. The exceptions are the one-expression helpers below (`lock_class` … `refused`):
-- they touch no table, and the planner inlines them into their callers (a `SET` would forbid
-- that and cost each call a switch of the search path).
CREATE SCHEMA IF NOT EXISTS "tower_lease";

-- The functions are installed afresh with each version: those of the version before go first,
-- since a function whose answer changed cannot be replaced in place, and a renamed one would
-- stay behind. Only the view `leases` (leases.sql) depends on them: it goes first, and comes
-- back last.
DROP VIEW IF EXISTS "tower_lease".leases;
DO $$
DECLARE
    old_function regprocedure;
BEGIN
    FOR old_function IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = '"tower_lease"'::regnamespace
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', old_function);
    END LOOP;
END
$$;
DROP TYPE IF EXISTS "tower_lease".acquisition;

CREATE TABLE IF NOT EXISTS "tower_lease".schema_version (
    version integer NOT NULL
);

-- A `Lock`'s lease (`secret` NULL once released), and its fence counter: the last fence
-- issued, kept until `fence_until`, an hour after the last acquisition (or one TTL, if longer).
CREATE TABLE IF NOT EXISTS "tower_lease".locks (
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
ALTER TABLE "tower_lease".locks ADD COLUMN IF NOT EXISTS waited smallint NOT NULL DEFAULT 0;

-- Who took each lease, for the view `leases`: the session's `application_name` and, over TCP,
-- the client's address. A column default, so each acquisition's insert (and the `excluded` row
-- of its upsert) fills it without a parameter. Only built-ins: a default that called a function
-- of the schema would keep the installer from dropping it.
ALTER TABLE "tower_lease".locks ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));

-- An `RwLock`'s writer, its write intent (a refused writer of a phase-fair or writers-first
-- lock), and the write generation (fence counter); its readers are rows of `readers`.
CREATE TABLE IF NOT EXISTS "tower_lease".rwlocks (
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

CREATE TABLE IF NOT EXISTS "tower_lease".readers (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea NOT NULL,
    expires timestamptz NOT NULL,
    PRIMARY KEY (namespace, name, secret)
);

-- The waiting readers of a phase-fair `RwLock` (refused by a writer or an intent, in a bounded
-- wait), until `expires`; a writer's release turns the live ones into its read phase (`phase`,
-- `expires` then the phase's end): they come in before the next writer.
CREATE TABLE IF NOT EXISTS "tower_lease".waiting_readers (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea NOT NULL,
    expires timestamptz NOT NULL,
    phase boolean NOT NULL DEFAULT false,
    PRIMARY KEY (namespace, name, secret)
);

CREATE TABLE IF NOT EXISTS "tower_lease".permits (
    namespace text NOT NULL,
    name bytea NOT NULL,
    secret bytea NOT NULL,
    expires timestamptz NOT NULL,
    PRIMARY KEY (namespace, name, secret)
);

-- One idempotency key of `IdempotencyLayer`: its reservation (the holder's secret and lease,
-- and the request fingerprint it runs for), its completed record (fingerprint, response, the
-- completing secret), the at-most-once marker, and the fence counter of fenced reservations.
CREATE TABLE IF NOT EXISTS "tower_lease".idempotency (
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
CREATE TABLE IF NOT EXISTS "tower_lease".waited (
    kind text NOT NULL,
    namespace text NOT NULL,
    name bytea NOT NULL,
    since timestamptz NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);

-- The holder of the writer's lease (`rwlocks`), of a reader's, of a permit, of a reservation:
-- as `locks.holder`.
ALTER TABLE "tower_lease".rwlocks ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));
ALTER TABLE "tower_lease".readers ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));
ALTER TABLE "tower_lease".permits ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));
ALTER TABLE "tower_lease".idempotency ADD COLUMN IF NOT EXISTS holder text
    DEFAULT pg_catalog.concat_ws('@', pg_catalog.current_setting('application_name'),
                                 pg_catalog.host(pg_catalog.inet_client_addr()));

-- Keys claimed by an application's own transaction (`tower_lease_postgres::claim`): the effect
-- of that request committed. Written only by `claim`, inside the application's transaction.
CREATE TABLE IF NOT EXISTS "tower_lease".claims (
    namespace text NOT NULL,
    name bytea NOT NULL,
    fingerprint bytea,
    expires timestamptz NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- When the claim was made: what a second claim of the key answers (`claimed_before`). NULL for
-- a claim made by `claim`, which older binaries send.
ALTER TABLE "tower_lease".claims ADD COLUMN IF NOT EXISTS claimed_at timestamptz;

-- What an acquire function answers: acquired (with the fence, NULL unfenced; 0 for a fenced
-- reader before any write), or refused, with the µs until the lease in the way ends.
CREATE TYPE "tower_lease".acquisition AS (
    acquired boolean,
    fence bigint,
    retry_after_us bigint
);

-- The first key of every advisory lock this crate takes (the two-key form, so an application's
-- one-key advisory locks never meet ours): 0x746c6561, "tlea". Written here once; `schema.rs`
-- takes the installation's lock before this function exists, with this number as `LOCK_CLASS`
-- (a test compares the two).
CREATE FUNCTION "tower_lease".lock_class()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 1953260907
$$;

-- The second key of a name's advisory lock: a hash of the kind of lock ('rw', 'p', 'v'), the
-- namespace and the name. Two names that share a hash only wait for each other.
CREATE FUNCTION "tower_lease".name_key(lock_kind text, lock_namespace text, lock_name bytea)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.hashtext(
        lock_kind || ':' || lock_namespace || ':' || pg_catalog.encode(lock_name, 'hex'))
$$;

-- A time in µs since the epoch: the clock a fence follows.
CREATE FUNCTION "tower_lease".micros(at_time timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.floor(extract(epoch FROM at_time) * 1000000)::bigint
$$;

-- A duration given in milliseconds, as every TTL and retention is.
CREATE FUNCTION "tower_lease".millis(ms bigint)
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.make_interval(secs => ms / 1000.0)
$$;

-- The µs from `call_time` until `ends` (0 if past): what a refusal answers as `retry_after_us`.
CREATE FUNCTION "tower_lease".micros_until(ends timestamptz, call_time timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(pg_catalog.floor(extract(epoch FROM (ends - call_time)) * 1000000)::bigint, 0)
$$;

-- How long a fence counter outlives its lock's last acquisition: an hour, or one TTL if longer.
CREATE FUNCTION "tower_lease".fence_life(ttl_ms bigint)
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT "tower_lease".millis(greatest(3600000, ttl_ms))
$$;

-- The answers of an acquire function: acquired with `fence`, or refused by a lease that ends
-- at `blocker_ends`.
CREATE FUNCTION "tower_lease".acquired(fence bigint)
RETURNS "tower_lease".acquisition LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(true, fence, NULL)::"tower_lease".acquisition
$$;

CREATE FUNCTION "tower_lease".refused(blocker_ends timestamptz, call_time timestamptz)
RETURNS "tower_lease".acquisition LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(false, NULL, "tower_lease".micros_until(blocker_ends, call_time))::"tower_lease".acquisition
$$;

-- Takes the transaction-scoped advisory lock that makes every call on one name of a kind
-- atomic (the `RwLock`s', the `Semaphore`s' and the idempotency keys': a `Lock`'s calls are
-- ordered by its one row's lock). No `SET` clause: its body names everything by its schema, and
-- a function with one is never inlined into its caller (each call cost a lone read's two
-- calls some 60 µs of the server's time each, against 3 µs for the lock itself).
CREATE FUNCTION "tower_lease".take_name_lock(lock_kind text, lock_namespace text, lock_name bytea)
RETURNS void LANGUAGE sql VOLATILE AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(
        "tower_lease".lock_class(), "tower_lease".name_key(lock_kind, lock_namespace, lock_name))
$$;

-- Tells the listeners of every replica (channel `tower_lease`) that a lease of a name ended
-- (`letter` 'e' exclusive, 'r' a reader's, 'w' the writer's or an intent withdrawn, 'p'
-- permit, 'v' reservation) or that a writer waits ('i'): the letter, the namespace and the name
-- in hex, split by ':'. A payload over NOTIFY's limit (a namespace of thousands of characters)
-- goes without its name, and the listener wakes every waiter.
CREATE FUNCTION "tower_lease".notify(letter text, lock_namespace text, lock_name bytea)
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
CREATE FUNCTION "tower_lease".mark_waited(
    lock_kind text, lock_namespace text, lock_name bytea, call_time timestamptz)
RETURNS void LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO "tower_lease".waited AS w VALUES (lock_kind, lock_namespace, lock_name, call_time)
    ON CONFLICT (kind, namespace, name) DO UPDATE SET since = excluded.since
        WHERE w.since < call_time - interval '10 seconds'
$$;

-- Tells the listeners that a lease of a name of `lock_kind` ended (`letter` as in `notify`), if
-- a refused call marked it; clears the mark. The caller holds the name's lock, as the refusals
-- that mark it do, so every refusal before this release is seen here. A woken waiter that is
-- refused again marks it again before it waits, for the next release.
CREATE FUNCTION "tower_lease".notify_waited(
    lock_kind text, letter text, lock_namespace text, lock_name bytea)
RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM "tower_lease".waited w
    WHERE w.kind = lock_kind AND w.namespace = lock_namespace AND w.name = lock_name;
    IF FOUND THEN
        PERFORM "tower_lease".notify(letter, lock_namespace, lock_name);
    END IF;
END
$$;

-- A `Lock`'s calls: one row per name, whose own row lock orders the calls on it (unlike the
-- other kinds, whose calls touch several rows and take the name's advisory lock).
--
-- Each is sent as a call of its own, like every other function of the schema: the upsert and
-- the delete sent as statements of their own, without the PL/pgSQL call around them, were
-- measured no faster (`benches/results/postgres.md`).

-- Takes the lease for `holder_secret`, or answers how long the holder's has left. A call sent
-- again after its reply was lost finds its own secret in place: acquired, with the fence it was
-- given.
CREATE FUNCTION "tower_lease".lock_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean)
RETURNS "tower_lease".acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
    issued bigint;
    held "tower_lease".locks;
BEGIN
    -- One statement on the common path, as `SET NX PX` on Redis: the row's own lock orders
    -- the calls on the name (an insert waits for a concurrent one, an update locks the row,
    -- and a refused update keeps it locked for the look below). A fence is max(last + 1,
    -- server µs): it grows with every acquisition, and stays above every fence before it when
    -- the counter is lost (a restore, a truncate), while the clock holds.
    INSERT INTO "tower_lease".locks AS l VALUES
        (lock_namespace, lock_name, holder_secret, call_time + "tower_lease".millis(ttl_ms),
         CASE WHEN fenced THEN "tower_lease".micros(call_time) ELSE 0 END,
         CASE WHEN fenced THEN call_time + "tower_lease".fence_life(ttl_ms) END)
    ON CONFLICT (namespace, name) DO UPDATE
        SET secret = excluded.secret, expires = excluded.expires, holder = excluded.holder,
            fence = CASE WHEN fenced THEN greatest(
                        CASE WHEN l.fence_until > call_time THEN l.fence ELSE 0 END + 1,
                        excluded.fence)
                    ELSE l.fence END,
            fence_until = CASE WHEN fenced THEN excluded.fence_until ELSE l.fence_until END
        WHERE l.expires <= call_time
    RETURNING l.fence INTO issued;
    IF FOUND THEN
        RETURN "tower_lease".acquired(CASE WHEN fenced THEN issued END);
    END IF;
    SELECT * INTO held FROM "tower_lease".locks l
    WHERE l.namespace = lock_namespace AND l.name = lock_name;
    -- A call sent again after its reply was lost finds its own secret: acquired, with the
    -- fence it was given.
    IF held.secret = holder_secret THEN
        RETURN "tower_lease".acquired(CASE WHEN fenced THEN held.fence END);
    END IF;
    -- The caller may wait for the release, which notifies only a marked row. The row stays
    -- locked until this commits, so a release after this refusal sees the mark. An acquisition
    -- leaves the mark alone: a waiter refused before it still waits for its release.
    IF held.waited <> 1 THEN
        UPDATE "tower_lease".locks l SET waited = 1
        WHERE l.namespace = lock_namespace AND l.name = lock_name;
    END IF;
    RETURN "tower_lease".refused(held.expires, call_time);
END
$$;

-- Restarts the lease for one TTL while it is held with `holder_secret`; never re-acquires one
-- that ended. Answers whether it was held.
CREATE FUNCTION "tower_lease".lock_extend(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
BEGIN
    UPDATE "tower_lease".locks l SET expires = call_time + "tower_lease".millis(ttl_ms)
    WHERE l.namespace = lock_namespace AND l.name = lock_name AND l.secret = holder_secret
      AND l.expires > call_time;
    RETURN FOUND;
END
$$;

-- Ends the lease while it is held with `holder_secret`, and tells the listeners if a refused
-- call marked the row (`waited`): the row goes, or while its fence counter lives, stays
-- released (`expires` -infinity, so an acquisition that read the clock before this release,
-- and waited for the row, finds it free). Safe to send again: a second release finds nothing
-- and answers false.
CREATE FUNCTION "tower_lease".lock_release(
    lock_namespace text, lock_name bytea, holder_secret bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
    marked boolean;
BEGIN
    -- A release's commit need not wait for its WAL flush (nor a synchronous standby): lost in
    -- a crash, the lease only lives on to its end, which delays the next holder and lets no
    -- second one in; an acquisition that follows it flushes it with its own commit.
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    DELETE FROM "tower_lease".locks l
    WHERE l.namespace = lock_namespace AND l.name = lock_name AND l.secret = holder_secret
      AND l.expires > call_time AND coalesce(l.fence_until, call_time) <= call_time
    RETURNING l.waited = 1 INTO marked;
    IF NOT FOUND THEN
        -- RETURNING answers the new row: -1 says it was marked (see `waited` in schema.sql).
        UPDATE "tower_lease".locks l
        SET secret = NULL, expires = '-infinity',
            waited = CASE WHEN l.waited = 1 THEN -1 ELSE 0 END
        WHERE l.namespace = lock_namespace AND l.name = lock_name AND l.secret = holder_secret
          AND l.expires > call_time
        RETURNING l.waited = -1 INTO marked;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    END IF;
    IF marked THEN
        PERFORM "tower_lease".notify('e', lock_namespace, lock_name);
    END IF;
    RETURN true;
END
$$;

-- An `RwLock`'s calls: its writer, intent and write generation in `rwlocks`, its readers in
-- `readers`, a phase-fair lock's waiting readers and read phase in `waiting_readers`, all under
-- the name's one lock ('rw'). Acquisitions answer as in lock.sql.

-- A reader gets in unless a writer holds, or a live write intent holds new readers off (unless
-- the reader is one of the read phase the last write's release began); acquired, it answers
-- the write generation (0 before any write; NULL unfenced). A reader is never refused for other
-- readers. A phase-fair (`read_phase_ms` > 0) reader that waits (`waiting`) and is refused is
-- noted in `waiting_readers` for the refusal's wait and two read phases.
CREATE FUNCTION "tower_lease".read_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean,
    read_phase_ms bigint, waiting boolean)
RETURNS "tower_lease".acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    rw "tower_lease".rwlocks;
    found_rw boolean;
    blocked_until timestamptz;
BEGIN
    PERFORM "tower_lease".take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO rw FROM "tower_lease".rwlocks r
    WHERE r.namespace = lock_namespace AND r.name = lock_name;
    found_rw := FOUND;
    IF rw.writer_expires > call_time THEN
        blocked_until := rw.writer_expires;
    -- A retry of an acquisition whose reply was lost finds our own live lease behind an intent.
    ELSIF rw.intent_expires > call_time AND NOT EXISTS (
        SELECT 1 FROM "tower_lease".readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.secret = holder_secret
          AND r.expires > call_time
    ) AND NOT (read_phase_ms > 0 AND EXISTS (
        SELECT 1 FROM "tower_lease".waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name AND w.secret = holder_secret
          AND w.phase AND w.expires > call_time
    )) THEN
        blocked_until := rw.intent_expires;
    END IF;
    IF blocked_until IS NOT NULL THEN
        IF read_phase_ms > 0 AND waiting THEN
            INSERT INTO "tower_lease".waiting_readers AS w (namespace, name, secret, expires)
            VALUES (lock_namespace, lock_name, holder_secret,
                    blocked_until + "tower_lease".millis(2 * read_phase_ms))
            ON CONFLICT (namespace, name, secret) DO UPDATE
                SET expires = excluded.expires WHERE NOT w.phase;
        END IF;
        PERFORM "tower_lease".mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN "tower_lease".refused(blocked_until, call_time);
    END IF;
    IF read_phase_ms > 0 AND waiting THEN
        -- In: it waits no more, and leaves its read phase.
        DELETE FROM "tower_lease".waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name AND w.secret = holder_secret;
    END IF;
    INSERT INTO "tower_lease".readers VALUES
        (lock_namespace, lock_name, holder_secret, call_time + "tower_lease".millis(ttl_ms))
    ON CONFLICT (namespace, name, secret) DO UPDATE SET expires = excluded.expires;
    IF NOT fenced THEN
        RETURN "tower_lease".acquired(NULL);
    END IF;
    -- Readers keep the write generation alive, but never start one.
    IF found_rw AND rw.fence_until > call_time THEN
        UPDATE "tower_lease".rwlocks r
        SET fence_until = greatest(r.fence_until, call_time + "tower_lease".fence_life(ttl_ms))
        WHERE r.namespace = lock_namespace AND r.name = lock_name;
        RETURN "tower_lease".acquired(rw.fence);
    END IF;
    RETURN "tower_lease".acquired(0);
END
$$;

-- A writer gets in while no writer holds, no reader lease is live and no read phase has readers
-- still to come in. Refused by readers or a phase, a writer of a phase-fair or writers-first
-- lock (`intent_ms` > 0) leaves its write intent for `intent_ms`, and the listeners hear of it;
-- refused by a writer, so does a phase-fair one that waits (`waiting_in_turn`). Acquired, it
-- removes any intent and the ended readers. Phase-fair writers that wait go in the order their
-- waits began (a secret's first six bytes, big-endian ms): the live intent of a writer whose wait
-- began no later refuses such a one, which takes over a later one's.
CREATE FUNCTION "tower_lease".write_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean,
    intent_ms bigint, waiting_in_turn boolean)
RETURNS "tower_lease".acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    rw "tower_lease".rwlocks;
    found_rw boolean;
    last_reader_ends timestamptz;
    issued bigint;
BEGIN
    PERFORM "tower_lease".take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO rw FROM "tower_lease".rwlocks r
    WHERE r.namespace = lock_namespace AND r.name = lock_name;
    found_rw := FOUND;
    IF waiting_in_turn AND rw.intent_expires > call_time AND rw.intent <> holder_secret
       AND substring(rw.intent FROM 1 FOR 6) <= substring(holder_secret FROM 1 FOR 6)
       AND coalesce(rw.writer, ''::bytea) <> holder_secret THEN
        PERFORM "tower_lease".mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN "tower_lease".refused(rw.intent_expires, call_time);
    END IF;
    IF rw.writer_expires > call_time THEN
        IF rw.writer = holder_secret THEN
            RETURN "tower_lease".acquired(CASE WHEN fenced THEN rw.fence END);
        END IF;
        IF waiting_in_turn AND intent_ms > 0 THEN
            UPDATE "tower_lease".rwlocks r
            SET intent = holder_secret, intent_expires = call_time + "tower_lease".millis(intent_ms)
            WHERE r.namespace = lock_namespace AND r.name = lock_name;
        END IF;
        PERFORM "tower_lease".mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN "tower_lease".refused(rw.writer_expires, call_time);
    END IF;
    SELECT pg_catalog.max(r.expires) INTO last_reader_ends FROM "tower_lease".readers r
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.expires > call_time;
    IF last_reader_ends IS NULL THEN
        -- The readers of a read phase come in before this writer.
        SELECT pg_catalog.max(w.expires) INTO last_reader_ends FROM "tower_lease".waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name AND w.phase
          AND w.expires > call_time;
    END IF;
    IF last_reader_ends IS NOT NULL THEN
        -- Ended readers go, so a name that readers never leave holds no crashed ones for long.
        DELETE FROM "tower_lease".readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.expires <= call_time;
        IF intent_ms > 0 THEN
            INSERT INTO "tower_lease".rwlocks AS r (namespace, name, intent, intent_expires)
            VALUES (lock_namespace, lock_name, holder_secret,
                    call_time + "tower_lease".millis(intent_ms))
            ON CONFLICT (namespace, name) DO UPDATE
                SET intent = excluded.intent, intent_expires = excluded.intent_expires;
            PERFORM "tower_lease".notify('i', lock_namespace, lock_name);
        END IF;
        PERFORM "tower_lease".mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN "tower_lease".refused(last_reader_ends, call_time);
    END IF;
    DELETE FROM "tower_lease".readers r WHERE r.namespace = lock_namespace AND r.name = lock_name;
    IF fenced THEN
        issued := greatest(
            CASE WHEN found_rw AND rw.fence_until > call_time THEN rw.fence ELSE 0 END + 1,
            "tower_lease".micros(call_time));
        INSERT INTO "tower_lease".rwlocks AS r
            (namespace, name, writer, writer_expires, intent, intent_expires, fence, fence_until)
        VALUES (lock_namespace, lock_name, holder_secret, call_time + "tower_lease".millis(ttl_ms),
                NULL, NULL, issued, call_time + "tower_lease".fence_life(ttl_ms))
        ON CONFLICT (namespace, name) DO UPDATE
            SET writer = excluded.writer, writer_expires = excluded.writer_expires,
                holder = excluded.holder, intent = NULL, intent_expires = NULL,
                fence = excluded.fence,
                fence_until = excluded.fence_until;
    ELSE
        INSERT INTO "tower_lease".rwlocks AS r (namespace, name, writer, writer_expires)
        VALUES (lock_namespace, lock_name, holder_secret, call_time + "tower_lease".millis(ttl_ms))
        ON CONFLICT (namespace, name) DO UPDATE
            SET writer = excluded.writer, writer_expires = excluded.writer_expires,
                holder = excluded.holder, intent = NULL, intent_expires = NULL;
    END IF;
    RETURN "tower_lease".acquired(issued);
END
$$;

-- Restarts a reader's (`as_reader`) or the writer's lease for one TTL while it is held with
-- `holder_secret`. `held`: it was; `writer_waiting`: a reader was extended while a write
-- intent lives.
CREATE FUNCTION "tower_lease".rwlock_extend(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, as_reader boolean,
    OUT held boolean, OUT writer_waiting boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    ends timestamptz;
BEGIN
    PERFORM "tower_lease".take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    ends := call_time + "tower_lease".millis(ttl_ms);
    writer_waiting := false;
    IF NOT as_reader THEN
        UPDATE "tower_lease".rwlocks r SET writer_expires = ends
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.writer = holder_secret
          AND r.writer_expires > call_time;
        held := FOUND;
        RETURN;
    END IF;
    UPDATE "tower_lease".readers r SET expires = ends
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.secret = holder_secret
      AND r.expires > call_time;
    held := FOUND;
    IF held THEN
        writer_waiting := EXISTS (
            SELECT 1 FROM "tower_lease".rwlocks r
            WHERE r.namespace = lock_namespace AND r.name = lock_name
              AND r.intent_expires > call_time);
    END IF;
END
$$;

-- Ends a reader's (`as_reader`) or the writer's lease held with `holder_secret`. The writer's
-- release, and the last live reader's, tell the listeners if a refused call marked the name. A
-- phase-fair (`read_phase_ms` > 0) writer's release turns the live waiting readers into its
-- read phase, for `read_phase_ms`.
CREATE FUNCTION "tower_lease".rwlock_release(
    lock_namespace text, lock_name bytea, holder_secret bytea, as_reader boolean,
    read_phase_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    ended timestamptz;
BEGIN
    -- A release's commit need not wait for its WAL flush (nor a synchronous standby): lost in
    -- a crash, the lease only lives on to its end, which delays the next holder and lets no
    -- second one in; an acquisition that follows it flushes it with its own commit.
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    PERFORM "tower_lease".take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    IF as_reader THEN
        DELETE FROM "tower_lease".readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.secret = holder_secret
        RETURNING r.expires INTO ended;
        IF NOT FOUND OR ended <= call_time THEN
            RETURN false;
        END IF;
        DELETE FROM "tower_lease".readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.expires <= call_time;
        IF NOT EXISTS (SELECT 1 FROM "tower_lease".readers r
                       WHERE r.namespace = lock_namespace AND r.name = lock_name) THEN
            PERFORM "tower_lease".notify_waited('rw', 'r', lock_namespace, lock_name);
        END IF;
        RETURN true;
    END IF;
    UPDATE "tower_lease".rwlocks r SET writer = NULL, writer_expires = NULL
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.writer = holder_secret
      AND r.writer_expires > call_time;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF read_phase_ms > 0 THEN
        DELETE FROM "tower_lease".waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name
          AND (w.expires <= call_time OR w.phase);
        UPDATE "tower_lease".waiting_readers w
        SET phase = true, expires = call_time + "tower_lease".millis(read_phase_ms)
        WHERE w.namespace = lock_namespace AND w.name = lock_name;
    END IF;
    DELETE FROM "tower_lease".rwlocks r
    WHERE r.namespace = lock_namespace AND r.name = lock_name
      AND coalesce(r.intent_expires, call_time) <= call_time
      AND coalesce(r.fence_until, call_time) <= call_time;
    PERFORM "tower_lease".notify_waited('rw', 'w', lock_namespace, lock_name);
    RETURN true;
END
$$;

-- Removes the write intent while it holds `holder_secret` (the writer that left it gives up);
-- readers waiting elsewhere (they marked the name when refused) hear of it as of a release.
CREATE FUNCTION "tower_lease".withdraw_intent(
    lock_namespace text, lock_name bytea, holder_secret bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    -- A release's commit need not wait for its WAL flush (nor a synchronous standby): lost in
    -- a crash, the lease only lives on to its end, which delays the next holder and lets no
    -- second one in; an acquisition that follows it flushes it with its own commit.
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    PERFORM "tower_lease".take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE "tower_lease".rwlocks r SET intent = NULL, intent_expires = NULL
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.intent = holder_secret
      AND r.intent_expires > call_time;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM "tower_lease".notify_waited('rw', 'w', lock_namespace, lock_name);
    RETURN true;
END
$$;

-- A `Semaphore`'s calls: one row per permit in `permits`, under the name's lock ('p').

-- Takes a permit while fewer than `most_permits` are live (no fence: a permit has none), or
-- answers how long until the earliest live permit ends when all are taken. Ended permits of
-- the name go first.
CREATE FUNCTION "tower_lease".permit_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint,
    most_permits integer)
RETURNS "tower_lease".acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    live integer;
    earliest_ends timestamptz;
BEGIN
    PERFORM "tower_lease".take_name_lock('p', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    DELETE FROM "tower_lease".permits p
    WHERE p.namespace = lock_namespace AND p.name = lock_name AND p.expires <= call_time;
    SELECT pg_catalog.count(*), pg_catalog.min(p.expires) INTO live, earliest_ends
    FROM "tower_lease".permits p WHERE p.namespace = lock_namespace AND p.name = lock_name;
    IF live >= most_permits THEN
        -- A retry of an acquisition whose reply was lost finds our own permit: acquired.
        IF EXISTS (SELECT 1 FROM "tower_lease".permits p
                   WHERE p.namespace = lock_namespace AND p.name = lock_name
                     AND p.secret = holder_secret) THEN
            RETURN "tower_lease".acquired(NULL);
        END IF;
        PERFORM "tower_lease".mark_waited('p', lock_namespace, lock_name, call_time);
        RETURN "tower_lease".refused(earliest_ends, call_time);
    END IF;
    INSERT INTO "tower_lease".permits VALUES
        (lock_namespace, lock_name, holder_secret, call_time + "tower_lease".millis(ttl_ms))
    ON CONFLICT (namespace, name, secret) DO UPDATE SET expires = excluded.expires;
    RETURN "tower_lease".acquired(NULL);
END
$$;

-- Restarts a live permit held with `holder_secret` for one TTL; answers whether it was held.
CREATE FUNCTION "tower_lease".permit_extend(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    PERFORM "tower_lease".take_name_lock('p', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE "tower_lease".permits p SET expires = call_time + "tower_lease".millis(ttl_ms)
    WHERE p.namespace = lock_namespace AND p.name = lock_name AND p.secret = holder_secret
      AND p.expires > call_time;
    RETURN FOUND;
END
$$;

-- Ends a live permit held with `holder_secret`; every release frees a slot, so every one tells
-- the listeners when a refused call marked the name.
CREATE FUNCTION "tower_lease".permit_release(
    lock_namespace text, lock_name bytea, holder_secret bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    ended timestamptz;
BEGIN
    -- A release's commit need not wait for its WAL flush (nor a synchronous standby): lost in
    -- a crash, the lease only lives on to its end, which delays the next holder and lets no
    -- second one in; an acquisition that follows it flushes it with its own commit.
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    PERFORM "tower_lease".take_name_lock('p', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    DELETE FROM "tower_lease".permits p
    WHERE p.namespace = lock_namespace AND p.name = lock_name AND p.secret = holder_secret
    RETURNING p.expires INTO ended;
    IF NOT FOUND OR ended <= call_time THEN
        RETURN false;
    END IF;
    PERFORM "tower_lease".notify_waited('p', 'p', lock_namespace, lock_name);
    RETURN true;
END
$$;

-- Reads only: how many permits of the name are live now.
CREATE FUNCTION "tower_lease".permits_in_use(lock_namespace text, lock_name bytea)
RETURNS integer LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.count(*)::integer FROM "tower_lease".permits p
    WHERE p.namespace = lock_namespace AND p.name = lock_name
      AND p.expires > pg_catalog.clock_timestamp()
$$;

-- `IdempotencyLayer`'s keys: one row of `idempotency` per key, under the name's lock ('v'),
-- and the claims applications make in their own transactions (`claims`).

-- The first look at a key, in one step. `outcome`:
--   'reserved'         ours now, with `fence` (NULL unfenced); also a key a transaction claimed
--                      (its effect committed) with no response stored, at-most-once or not:
--                      the handler runs again, its claim answers when the key was claimed,
--                      and it answers from its own record;
--   'in_flight'        another holder's lease has `remaining_us`;
--   'completed'        the record of this fingerprint: `response`, kept `remaining_us` more;
--   'mismatch'         another fingerprint completed or claimed it;
--   'outcome_unknown'  for `remaining_us`: an at-most-once reservation died without completing.
-- `at_most_once_ms` is the at-most-once marker's retention, NULL for a plain key.
CREATE FUNCTION "tower_lease".idempotency_begin(
    key_namespace text, key_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean,
    request_fingerprint bytea, at_most_once_ms bigint,
    OUT outcome text, OUT fence bigint, OUT remaining_us bigint, OUT response bytea)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    k "tower_lease".idempotency;
    found_k boolean;
    c "tower_lease".claims;
    claimed boolean;
    issued bigint;
BEGIN
    PERFORM "tower_lease".take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO k FROM "tower_lease".idempotency i
    WHERE i.namespace = key_namespace AND i.name = key_name;
    found_k := FOUND;
    IF k.record_expires > call_time THEN
        IF k.fingerprint = request_fingerprint THEN
            outcome := 'completed';
            remaining_us := "tower_lease".micros_until(k.record_expires, call_time);
            response := k.response;
        ELSE
            outcome := 'mismatch';
        END IF;
        RETURN;
    END IF;
    IF k.lease_expires > call_time THEN
        IF k.secret = holder_secret THEN
            -- A begin sent again after its reply was lost: ours, with the fence it took.
            outcome := 'reserved';
            IF fenced THEN
                fence := CASE WHEN k.fence_until > call_time THEN k.fence ELSE 0 END;
            END IF;
        ELSE
            outcome := 'in_flight';
            remaining_us := "tower_lease".micros_until(k.lease_expires, call_time);
            -- The caller may wait for the completion or release, which notify a marked key.
            PERFORM "tower_lease".mark_waited('v', key_namespace, key_name, call_time);
        END IF;
        RETURN;
    END IF;
    SELECT * INTO c FROM "tower_lease".claims cl
    WHERE cl.namespace = key_namespace AND cl.name = key_name AND cl.expires > call_time;
    claimed := FOUND;
    IF claimed AND c.fingerprint IS NOT NULL AND c.fingerprint <> request_fingerprint THEN
        outcome := 'mismatch';
        RETURN;
    END IF;
    IF NOT claimed AND at_most_once_ms IS NOT NULL AND k.unknown_expires > call_time THEN
        outcome := 'outcome_unknown';
        remaining_us := "tower_lease".micros_until(k.unknown_expires, call_time);
        RETURN;
    END IF;
    IF fenced THEN
        issued := greatest(
            CASE WHEN found_k AND k.fence_until > call_time THEN k.fence ELSE 0 END + 1,
            "tower_lease".micros(call_time));
    END IF;
    INSERT INTO "tower_lease".idempotency AS i
        (namespace, name, secret, lease_expires, fingerprint, unknown_expires, fence, fence_until)
    VALUES (key_namespace, key_name, holder_secret, call_time + "tower_lease".millis(ttl_ms),
            request_fingerprint, call_time + "tower_lease".millis(at_most_once_ms),
            coalesce(issued, 0),
            CASE WHEN fenced THEN call_time + "tower_lease".fence_life(ttl_ms) END)
    ON CONFLICT (namespace, name) DO UPDATE
        SET secret = excluded.secret, lease_expires = excluded.lease_expires,
            holder = excluded.holder, fingerprint = excluded.fingerprint, response = NULL,
            completed_by = NULL,
            record_expires = NULL,
            unknown_expires = coalesce(excluded.unknown_expires, i.unknown_expires),
            fence = CASE WHEN fenced THEN excluded.fence ELSE i.fence END,
            fence_until = CASE WHEN fenced THEN excluded.fence_until ELSE i.fence_until END;
    outcome := 'reserved';
    fence := issued;
END
$$;

-- Stores the record while the reservation is held with `holder_secret`, or nobody holds the key
-- (ours ran out, or was lost), which ends the reservation and its at-most-once marker. A
-- completion sent again finds its own record: true.
CREATE FUNCTION "tower_lease".idempotency_complete(
    key_namespace text, key_name bytea, holder_secret bytea, request_fingerprint bytea,
    record_response bytea, retention_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    k "tower_lease".idempotency;
BEGIN
    PERFORM "tower_lease".take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO k FROM "tower_lease".idempotency i
    WHERE i.namespace = key_namespace AND i.name = key_name;
    IF k.record_expires > call_time THEN
        RETURN k.completed_by = holder_secret;
    END IF;
    IF k.lease_expires > call_time AND k.secret <> holder_secret THEN
        RETURN false;
    END IF;
    INSERT INTO "tower_lease".idempotency AS i
        (namespace, name, fingerprint, response, completed_by, record_expires)
    VALUES (key_namespace, key_name, request_fingerprint, record_response, holder_secret,
            call_time + "tower_lease".millis(retention_ms))
    ON CONFLICT (namespace, name) DO UPDATE
        SET secret = NULL, lease_expires = NULL, fingerprint = excluded.fingerprint,
            response = excluded.response, completed_by = excluded.completed_by,
            record_expires = excluded.record_expires, unknown_expires = NULL;
    PERFORM "tower_lease".notify_waited('v', 'v', key_namespace, key_name);
    RETURN true;
END
$$;

-- Restarts the reservation held with `holder_secret` for one TTL; answers whether it was held.
CREATE FUNCTION "tower_lease".idempotency_extend(
    key_namespace text, key_name bytea, holder_secret bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    PERFORM "tower_lease".take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE "tower_lease".idempotency i SET lease_expires = call_time + "tower_lease".millis(ttl_ms)
    WHERE i.namespace = key_namespace AND i.name = key_name AND i.secret = holder_secret
      AND i.lease_expires > call_time;
    RETURN FOUND;
END
$$;

-- Releases the reservation held with `holder_secret`, and with `forget_at_most_once` its
-- at-most-once marker too (the request may run again); false when it is not held with it. A
-- claim stays: its effect committed, whatever the response.
CREATE FUNCTION "tower_lease".idempotency_release(
    key_namespace text, key_name bytea, holder_secret bytea, forget_at_most_once boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    PERFORM "tower_lease".take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE "tower_lease".idempotency i
    SET secret = NULL, lease_expires = NULL,
        unknown_expires = CASE WHEN forget_at_most_once THEN NULL ELSE i.unknown_expires END
    WHERE i.namespace = key_namespace AND i.name = key_name AND i.secret = holder_secret
      AND i.lease_expires > call_time;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM "tower_lease".idempotency i
    WHERE i.namespace = key_namespace AND i.name = key_name
      AND coalesce(i.record_expires, call_time) <= call_time
      AND coalesce(i.unknown_expires, call_time) <= call_time
      AND coalesce(i.fence_until, call_time) <= call_time;
    PERFORM "tower_lease".notify_waited('v', 'v', key_namespace, key_name);
    RETURN true;
END
$$;

-- Claims a key inside the caller's transaction: NULL when claimed now or, when a committed
-- claim of the key lives, the time it was made (for a claim without one: its expiry less this
-- retention). A claim being made by another open transaction is waited for (the primary key's
-- insert waits), so of two transactions claiming one key, one commits. What
-- `tower_lease_postgres::claim` sends.
CREATE FUNCTION "tower_lease".claimed_before(key_namespace text, key_name bytea, retention_ms bigint)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
    retention interval := "tower_lease".millis(retention_ms);
    earlier timestamptz;
BEGIN
    INSERT INTO "tower_lease".claims AS c (namespace, name, fingerprint, expires, claimed_at)
    SELECT key_namespace, key_name,
           (SELECT i.fingerprint FROM "tower_lease".idempotency i
            WHERE i.namespace = key_namespace AND i.name = key_name
              AND i.lease_expires > call_time),
           call_time + retention, call_time
    ON CONFLICT (namespace, name) DO UPDATE
        SET fingerprint = excluded.fingerprint, expires = excluded.expires,
            claimed_at = excluded.claimed_at
        WHERE c.expires <= call_time;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    -- The conflicting claim committed (the insert waited for its transaction) and lives.
    SELECT coalesce(c.claimed_at, c.expires - retention) INTO earlier
    FROM "tower_lease".claims c WHERE c.namespace = key_namespace AND c.name = key_name;
    RETURN earlier;
END
$$;

-- The heartbeat's batch: many extends in one round trip and one transaction, answering for each
-- lease, at its position, what its own extend would: `held`, and `writer_waiting` (a reader
-- extended while a write intent lives). `modes` are the modes' letters: 'e' exclusive, 'r'
-- read, 'w' write, 'p' permit, 'v' reservation.
--
-- The names' locks are held until the batch commits, so they are taken in the order of their
-- keys: two batches (or a batch and a single call) never wait for each other in a cycle.
CREATE FUNCTION "tower_lease".extend_many(
    modes text[], namespaces text[], names bytea[], holder_secrets bytea[], ttls_ms bigint[],
    OUT held boolean[], OUT writer_waiting boolean[])
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    leases integer := coalesce(pg_catalog.array_length(modes, 1), 0);
    i bigint;
    one record;
BEGIN
    held := pg_catalog.array_fill(false, ARRAY[leases]);
    writer_waiting := pg_catalog.array_fill(false, ARRAY[leases]);
    FOR i IN
        -- `unnest` of several arrays is the syntax of `ROWS FROM`, not a function to qualify.
        SELECT u.lease_index FROM unnest(modes, namespaces, names)
            WITH ORDINALITY AS u(mode, namespace, name, lease_index)
        ORDER BY "tower_lease".name_key(
            CASE u.mode WHEN 'r' THEN 'rw' WHEN 'w' THEN 'rw' ELSE u.mode END,
            u.namespace, u.name)
    LOOP
        CASE modes[i]
            WHEN 'e' THEN
                held[i] := "tower_lease".lock_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i]);
            WHEN 'r', 'w' THEN
                SELECT * INTO one FROM "tower_lease".rwlock_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i], modes[i] = 'r');
                held[i] := one.held;
                writer_waiting[i] := one.writer_waiting;
            WHEN 'p' THEN
                held[i] := "tower_lease".permit_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i]);
            WHEN 'v' THEN
                held[i] := "tower_lease".idempotency_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i]);
            ELSE
                NULL;
        END CASE;
    END LOOP;
END
$$;

-- The sweep of ended rows: `"tower_lease".sweep()`, sent by each store about once a second after
-- one of its acquisitions (`sweep.rs`), off that call's path.
--
-- Each table has `sweep_after`, indexed, when the sweep should look at a row again: -infinity
-- for a new row (its default, so no acquisition sets it), then the end the sweep last found.
-- The sweep reads only the rows whose `sweep_after` passed, through that index: those that
-- ended go, the others (extended, or taken again, since) are looked at again when they end
-- now. The calls never write `sweep_after`, and no index holds a lease's expiry, so an
-- acquisition, an extension or a release that finds its row changes no indexed column (a HOT
-- update, when the row's page has room): the index costs the sweep, not the calls.
ALTER TABLE "tower_lease".locks
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE "tower_lease".rwlocks
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE "tower_lease".readers
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE "tower_lease".waiting_readers
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE "tower_lease".permits
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE "tower_lease".idempotency
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE "tower_lease".claims
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE "tower_lease".waited
    ADD COLUMN IF NOT EXISTS sweep_after timestamptz NOT NULL DEFAULT '-infinity';
CREATE INDEX IF NOT EXISTS locks_sweep_after ON "tower_lease".locks (sweep_after);
CREATE INDEX IF NOT EXISTS rwlocks_sweep_after ON "tower_lease".rwlocks (sweep_after);
CREATE INDEX IF NOT EXISTS readers_sweep_after ON "tower_lease".readers (sweep_after);
CREATE INDEX IF NOT EXISTS waiting_readers_sweep_after
    ON "tower_lease".waiting_readers (sweep_after);
CREATE INDEX IF NOT EXISTS permits_sweep_after ON "tower_lease".permits (sweep_after);
CREATE INDEX IF NOT EXISTS idempotency_sweep_after ON "tower_lease".idempotency (sweep_after);
CREATE INDEX IF NOT EXISTS claims_sweep_after ON "tower_lease".claims (sweep_after);
CREATE INDEX IF NOT EXISTS waited_sweep_after ON "tower_lease".waited (sweep_after);

-- Sweeps up to `batch` due rows of `table_name` (`sweep_after` passed at `call_time`) without
-- ever waiting: a row another call has locked is left for later, and so is one whose name's
-- advisory lock ('rw', 'p', 'v'; '*' the row's own `kind`; NULL none) another call holds.
-- `ends` is the expression (over the row `t`) of when all of a row's leases, records and
-- counters end. Answers how many rows were due: a store sends the sweep again while a batch
-- was full. Built for each call (`EXECUTE`), so each is planned for its `call_time`: a plan
-- for any time would guess a third of the table due, and scan it.
CREATE FUNCTION "tower_lease".sweep_table(
    table_name text, ends text, name_lock text, batch integer, call_time timestamptz)
RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    unlocked text := '';
    due_rows integer;
BEGIN
    IF name_lock IS NOT NULL THEN
        unlocked := pg_catalog.format(
            'AND pg_catalog.pg_try_advisory_xact_lock("tower_lease".lock_class(), '
            '"tower_lease".name_key(%s, t.namespace, t.name))',
            CASE WHEN name_lock = '*' THEN 't.kind' ELSE pg_catalog.quote_literal(name_lock) END);
    END IF;
    -- The statements in WITH all run to completion, whether the last one reads them or not;
    -- the rows are found again by `ctid = ANY (ARRAY(…))`, which reads them by address.
    EXECUTE pg_catalog.format($sweep$
        WITH due AS (
            SELECT t.ctid AS row_id, %2$s AS ends FROM %1$s t
            WHERE t.sweep_after <= $2
            LIMIT $1 FOR UPDATE SKIP LOCKED),
        gone AS (
            DELETE FROM %1$s t
            WHERE t.ctid = ANY (ARRAY(SELECT row_id FROM due WHERE ends <= $2)) %3$s),
        again AS (
            UPDATE %1$s t SET sweep_after = due.ends FROM due
            WHERE t.ctid = ANY (ARRAY(SELECT row_id FROM due WHERE ends > $2))
              AND t.ctid = due.row_id)
        SELECT pg_catalog.count(*)::integer FROM due
        $sweep$, table_name, ends, unlocked)
    INTO due_rows USING batch, call_time;
    RETURN due_rows;
END
$$;

-- Sweeps every table (`sweep_table`, above), the marks of `waited` nobody refreshed for a
-- minute with them. Answers the most rows one table had due.
CREATE FUNCTION "tower_lease".sweep(batch integer DEFAULT 100)
RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
BEGIN
    RETURN greatest(
        "tower_lease".sweep_table('"tower_lease".locks',
            'greatest(t.expires, t.fence_until)', NULL, batch, call_time),
        "tower_lease".sweep_table('"tower_lease".rwlocks',
            $e$coalesce(greatest(t.writer_expires, t.intent_expires, t.fence_until),
                        '-infinity')$e$, 'rw', batch, call_time),
        "tower_lease".sweep_table('"tower_lease".readers', 't.expires', 'rw', batch, call_time),
        "tower_lease".sweep_table('"tower_lease".waiting_readers',
            't.expires', 'rw', batch, call_time),
        "tower_lease".sweep_table('"tower_lease".permits', 't.expires', 'p', batch, call_time),
        "tower_lease".sweep_table('"tower_lease".idempotency',
            $e$coalesce(greatest(t.lease_expires, t.record_expires, t.unknown_expires,
                                 t.fence_until), '-infinity')$e$, 'v', batch, call_time),
        "tower_lease".sweep_table('"tower_lease".claims', 't.expires', NULL, batch, call_time),
        "tower_lease".sweep_table('"tower_lease".waited',
            $e$t.since + interval '1 minute'$e$, '*', batch, call_time));
END
$$;

-- What operators look at: `"tower_lease".leases`, every live lease. Installed last, since it
-- calls a function of the schema (and so goes first when a version is installed over).

-- A name as text where it is UTF-8 (as most are: `Lock<str>`, `Lock<u64>`'s decimal), else
-- `\x` and its bytes in hex.
CREATE FUNCTION "tower_lease".readable_name(lock_name bytea)
RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pg_catalog.convert_from(lock_name, 'UTF8');
EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
    RETURN '\x' || pg_catalog.encode(lock_name, 'hex');
END
$$;

-- One row per live lease: `kind` ('lock', 'read', 'write', 'permit', 'idempotency' for a key's
-- reservation while its request runs), the namespace and the name, who took it (`holder`:
-- the session's `application_name`, and the client's address over TCP), when it ends unless
-- extended (`expires`, on the server's clock), and the last fence issued on the name while its
-- counter lives (NULL for none, and for permits). The holders' secrets are not shown: they
-- are what extends and releases a lease.
CREATE VIEW "tower_lease".leases AS
    SELECT 'lock'::text AS kind, l.namespace, "tower_lease".readable_name(l.name) AS name,
           l.holder, l.expires,
           CASE WHEN l.fence_until > pg_catalog.statement_timestamp() THEN l.fence END AS fence
    FROM "tower_lease".locks l
    WHERE l.expires > pg_catalog.statement_timestamp()
UNION ALL
    SELECT 'write', w.namespace, "tower_lease".readable_name(w.name), w.holder,
           w.writer_expires,
           CASE WHEN w.fence_until > pg_catalog.statement_timestamp() THEN w.fence END
    FROM "tower_lease".rwlocks w
    WHERE w.writer_expires > pg_catalog.statement_timestamp()
UNION ALL
    SELECT 'read', r.namespace, "tower_lease".readable_name(r.name), r.holder, r.expires,
           CASE WHEN w.fence_until > pg_catalog.statement_timestamp() THEN w.fence END
    FROM "tower_lease".readers r
    LEFT JOIN "tower_lease".rwlocks w ON w.namespace = r.namespace AND w.name = r.name
    WHERE r.expires > pg_catalog.statement_timestamp()
UNION ALL
    SELECT 'permit', p.namespace, "tower_lease".readable_name(p.name), p.holder, p.expires,
           NULL::bigint
    FROM "tower_lease".permits p
    WHERE p.expires > pg_catalog.statement_timestamp()
UNION ALL
    SELECT 'idempotency', i.namespace, "tower_lease".readable_name(i.name), i.holder,
           i.lease_expires,
           CASE WHEN i.fence_until > pg_catalog.statement_timestamp() THEN i.fence END
    FROM "tower_lease".idempotency i
    WHERE i.lease_expires > pg_catalog.statement_timestamp();

DELETE FROM "tower_lease".schema_version;
INSERT INTO "tower_lease".schema_version (version) VALUES (8);
