-- A `Semaphore`'s calls: one row per permit in `permits`, under the name's lock ('p').

-- Takes a permit while fewer than `most_permits` are live (no fence: a permit has none), or
-- answers how long until the earliest live permit ends when all are taken. Ended permits of
-- the name go first.
CREATE FUNCTION tower_lease.permit_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint,
    most_permits integer)
RETURNS tower_lease.acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    live integer;
    earliest_ends timestamptz;
BEGIN
    PERFORM tower_lease.take_name_lock('p', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    DELETE FROM tower_lease.permits p
    WHERE p.namespace = lock_namespace AND p.name = lock_name AND p.expires <= call_time;
    SELECT pg_catalog.count(*), pg_catalog.min(p.expires) INTO live, earliest_ends
    FROM tower_lease.permits p WHERE p.namespace = lock_namespace AND p.name = lock_name;
    IF live >= most_permits THEN
        -- A retry of an acquisition whose reply was lost finds our own permit: acquired.
        IF EXISTS (SELECT 1 FROM tower_lease.permits p
                   WHERE p.namespace = lock_namespace AND p.name = lock_name
                     AND p.secret = holder_secret) THEN
            RETURN tower_lease.acquired(NULL);
        END IF;
        PERFORM tower_lease.mark_waited('p', lock_namespace, lock_name, call_time);
        RETURN tower_lease.refused(earliest_ends, call_time);
    END IF;
    INSERT INTO tower_lease.permits VALUES
        (lock_namespace, lock_name, holder_secret, call_time + tower_lease.millis(ttl_ms))
    ON CONFLICT (namespace, name, secret) DO UPDATE SET expires = excluded.expires;
    RETURN tower_lease.acquired(NULL);
END
$$;

-- Restarts a live permit held with `holder_secret` for one TTL; answers whether it was held.
CREATE FUNCTION tower_lease.permit_extend(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    PERFORM tower_lease.take_name_lock('p', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE tower_lease.permits p SET expires = call_time + tower_lease.millis(ttl_ms)
    WHERE p.namespace = lock_namespace AND p.name = lock_name AND p.secret = holder_secret
      AND p.expires > call_time;
    RETURN FOUND;
END
$$;

-- Ends a live permit held with `holder_secret`; every release frees a slot, so every one tells
-- the listeners when a refused call marked the name.
CREATE FUNCTION tower_lease.permit_release(
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
    PERFORM tower_lease.take_name_lock('p', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    DELETE FROM tower_lease.permits p
    WHERE p.namespace = lock_namespace AND p.name = lock_name AND p.secret = holder_secret
    RETURNING p.expires INTO ended;
    IF NOT FOUND OR ended <= call_time THEN
        RETURN false;
    END IF;
    PERFORM tower_lease.notify_waited('p', 'p', lock_namespace, lock_name);
    RETURN true;
END
$$;

-- Reads only: how many permits of the name are live now.
CREATE FUNCTION tower_lease.permits_in_use(lock_namespace text, lock_name bytea)
RETURNS integer LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.count(*)::integer FROM tower_lease.permits p
    WHERE p.namespace = lock_namespace AND p.name = lock_name
      AND p.expires > pg_catalog.clock_timestamp()
$$;
