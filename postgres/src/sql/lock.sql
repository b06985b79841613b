-- A `Lock`'s calls: one row per name, whose own row lock orders the calls on it (unlike the
-- other kinds, whose calls touch several rows and take the name's advisory lock).
--
-- Each is sent as a call of its own, like every other function of the schema: the upsert and
-- the delete sent as statements of their own, without the PL/pgSQL call around them, were
-- measured no faster (`benches/results/postgres.md`).

-- Takes the lease for `holder_secret`, or answers how long the holder's has left. A call sent
-- again after its reply was lost finds its own secret in place: acquired, with the fence it was
-- given.
CREATE FUNCTION tower_lease.lock_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean)
RETURNS tower_lease.acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
    issued bigint;
    held tower_lease.locks;
BEGIN
    -- One statement on the common path, as `SET NX PX` on Redis: the row's own lock orders
    -- the calls on the name (an insert waits for a concurrent one, an update locks the row,
    -- and a refused update keeps it locked for the look below). A fence is max(last + 1,
    -- server µs): it grows with every acquisition, and stays above every fence before it when
    -- the counter is lost (a restore, a truncate), while the clock holds.
    INSERT INTO tower_lease.locks AS l VALUES
        (lock_namespace, lock_name, holder_secret, call_time + tower_lease.millis(ttl_ms),
         CASE WHEN fenced THEN tower_lease.micros(call_time) ELSE 0 END,
         CASE WHEN fenced THEN call_time + tower_lease.fence_life(ttl_ms) END)
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
        RETURN tower_lease.acquired(CASE WHEN fenced THEN issued END);
    END IF;
    SELECT * INTO held FROM tower_lease.locks l
    WHERE l.namespace = lock_namespace AND l.name = lock_name;
    -- A call sent again after its reply was lost finds its own secret: acquired, with the
    -- fence it was given.
    IF held.secret = holder_secret THEN
        RETURN tower_lease.acquired(CASE WHEN fenced THEN held.fence END);
    END IF;
    -- The caller may wait for the release, which notifies only a marked row. The row stays
    -- locked until this commits, so a release after this refusal sees the mark. An acquisition
    -- leaves the mark alone: a waiter refused before it still waits for its release.
    IF held.waited <> 1 THEN
        UPDATE tower_lease.locks l SET waited = 1
        WHERE l.namespace = lock_namespace AND l.name = lock_name;
    END IF;
    RETURN tower_lease.refused(held.expires, call_time);
END
$$;

-- Restarts the lease for one TTL while it is held with `holder_secret`; never re-acquires one
-- that ended. Answers whether it was held.
CREATE FUNCTION tower_lease.lock_extend(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
BEGIN
    UPDATE tower_lease.locks l SET expires = call_time + tower_lease.millis(ttl_ms)
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
CREATE FUNCTION tower_lease.lock_release(
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
    DELETE FROM tower_lease.locks l
    WHERE l.namespace = lock_namespace AND l.name = lock_name AND l.secret = holder_secret
      AND l.expires > call_time AND coalesce(l.fence_until, call_time) <= call_time
    RETURNING l.waited = 1 INTO marked;
    IF NOT FOUND THEN
        -- RETURNING answers the new row: -1 says it was marked (see `waited` in schema.sql).
        UPDATE tower_lease.locks l
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
        PERFORM tower_lease.notify('e', lock_namespace, lock_name);
    END IF;
    RETURN true;
END
$$;
