-- A `Lock`'s calls: one row per name, whose own row lock orders the calls on it (unlike the
-- other kinds, whose calls touch several rows and take the name's advisory lock).
--
-- Acquire answers one bigint, as the Redis scripts do: the fence (0 unfenced) when acquired,
-- -1 - the µs the holder's lease has left when refused. A call sent again after its reply was
-- lost finds its own secret in place: acquired, with the fence it was given.
CREATE OR REPLACE FUNCTION tower_lease.lock_acquire(ns text, nm bytea, s bytea, ttl_ms bigint, fenced boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz := clock_timestamp();
    issued bigint;
    held tower_lease.locks;
BEGIN
    -- One statement on the common path, as `SET NX PX` on Redis: the row's own lock orders
    -- the calls on the name (an insert waits for a concurrent one, an update locks the row,
    -- and a refused update keeps it locked for the look below). A fence is max(last + 1,
    -- server µs): it grows with every acquisition, and stays above every fence before it when
    -- the counter is lost (a restore, a truncate), while the clock holds.
    INSERT INTO tower_lease.locks AS l VALUES
        (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0),
         CASE WHEN fenced THEN tower_lease.micros(now) ELSE 0 END,
         CASE WHEN fenced THEN now + tower_lease.fence_life(ttl_ms) END)
    ON CONFLICT (namespace, name) DO UPDATE
        SET secret = excluded.secret, expires = excluded.expires,
            fence = CASE WHEN fenced THEN greatest(
                        CASE WHEN l.fence_until > now THEN l.fence ELSE 0 END + 1, excluded.fence)
                    ELSE l.fence END,
            fence_until = CASE WHEN fenced THEN excluded.fence_until ELSE l.fence_until END
        WHERE l.expires <= now
    RETURNING l.fence INTO issued;
    IF FOUND THEN
        RETURN CASE WHEN fenced THEN issued ELSE 0 END;
    END IF;
    SELECT * INTO held FROM tower_lease.locks WHERE namespace = ns AND name = nm;
    -- A call sent again after its reply was lost finds its own secret: acquired, with the
    -- fence it was given.
    IF held.secret = s THEN
        RETURN CASE WHEN fenced THEN held.fence ELSE 0 END;
    END IF;
    -- The caller may wait for the release, which notifies only a marked row. The row stays
    -- locked until this commits, so a release after this refusal sees the mark. An acquisition
    -- leaves the mark alone: a waiter refused before it still waits for its release.
    IF held.waited <> 1 THEN
        UPDATE tower_lease.locks SET waited = 1 WHERE namespace = ns AND name = nm;
    END IF;
    RETURN -1 - tower_lease.left_us(held.expires, now);
END
$$;

-- Restarts the lease for one TTL while it is held with `s`; never re-acquires one that ended.
CREATE OR REPLACE FUNCTION tower_lease.lock_extend(ns text, nm bytea, s bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz := clock_timestamp();
BEGIN
    UPDATE tower_lease.locks SET expires = now + make_interval(secs => ttl_ms / 1000.0)
    WHERE namespace = ns AND name = nm AND secret = s AND expires > now;
    RETURN FOUND;
END
$$;

-- Ends the lease while it is held with `s`, and tells the listeners if a refused call marked
-- the row (`waited`): the row goes, or while its fence counter lives, stays released (`expires`
-- -infinity, so an acquisition that read the clock before this release, and waited for the
-- row, finds it free). Safe to send again: a second release finds nothing and answers false.
CREATE OR REPLACE FUNCTION tower_lease.lock_release(ns text, nm bytea, s bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz := clock_timestamp();
    marked boolean;
BEGIN
    DELETE FROM tower_lease.locks
    WHERE namespace = ns AND name = nm AND secret = s AND expires > now
      AND coalesce(fence_until, now) <= now
    RETURNING waited = 1 INTO marked;
    IF NOT FOUND THEN
        -- RETURNING answers the new row: -1 says it was marked (see `waited` in schema.sql).
        UPDATE tower_lease.locks
        SET secret = NULL, expires = '-infinity',
            waited = CASE WHEN waited = 1 THEN -1 ELSE 0 END
        WHERE namespace = ns AND name = nm AND secret = s AND expires > now
        RETURNING waited = -1 INTO marked;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    END IF;
    IF marked THEN
        PERFORM tower_lease.notify('e', ns, nm);
    END IF;
    RETURN true;
END
$$;
