-- A `Lock`'s calls. Each one takes the name's lock first, then reads the clock, so calls on
-- one name are ordered and see each other's writes.
--
-- Acquire answers one bigint, as the Redis scripts do: the fence (0 unfenced) when acquired,
-- -1 - the µs the holder's lease has left when refused. A call sent again after its reply was
-- lost finds its own secret in place: acquired, with the fence it was given.
CREATE OR REPLACE FUNCTION tower_lease.lock_acquire(ns text, nm bytea, s bytea, ttl_ms bigint, fenced boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    held tower_lease.locks;
    issued bigint := 0;
BEGIN
    PERFORM tower_lease.lock_name('e', ns, nm);
    now := clock_timestamp();
    SELECT * INTO held FROM tower_lease.locks WHERE namespace = ns AND name = nm;
    IF FOUND AND held.expires > now THEN
        IF held.secret = s THEN
            RETURN CASE WHEN fenced THEN held.fence ELSE 0 END;
        END IF;
        RETURN -1 - tower_lease.left_us(held.expires, now);
    END IF;
    IF fenced THEN
        -- max(last + 1, server µs): grows with every acquisition, and stays above every fence
        -- before it when the counter is lost (a restore, a truncate), while the clock holds.
        issued := greatest(
            CASE WHEN FOUND AND held.fence_until > now THEN held.fence ELSE 0 END + 1,
            tower_lease.micros(now));
        INSERT INTO tower_lease.locks AS l VALUES
            (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0), issued, now + tower_lease.fence_life(ttl_ms))
        ON CONFLICT (namespace, name) DO UPDATE
            SET secret = excluded.secret, expires = excluded.expires, fence = excluded.fence,
                fence_until = excluded.fence_until;
    ELSE
        INSERT INTO tower_lease.locks AS l VALUES
            (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0), 0, NULL)
        ON CONFLICT (namespace, name) DO UPDATE
            SET secret = excluded.secret, expires = excluded.expires;
    END IF;
    IF random() < 0.01 THEN
        PERFORM tower_lease.sweep();
    END IF;
    RETURN issued;
END
$$;

-- Restarts the lease for one TTL while it is held with `s`; never re-acquires one that ended.
CREATE OR REPLACE FUNCTION tower_lease.lock_extend(ns text, nm bytea, s bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('e', ns, nm);
    now := clock_timestamp();
    UPDATE tower_lease.locks SET expires = now + make_interval(secs => ttl_ms / 1000.0)
    WHERE namespace = ns AND name = nm AND secret = s AND expires > now;
    RETURN FOUND;
END
$$;

-- Ends the lease while it is held with `s`, and tells the listeners. The row stays while its
-- fence counter lives. Safe to send again: a second release finds nothing and answers false.
CREATE OR REPLACE FUNCTION tower_lease.lock_release(ns text, nm bytea, s bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    held tower_lease.locks;
BEGIN
    PERFORM tower_lease.lock_name('e', ns, nm);
    now := clock_timestamp();
    SELECT * INTO held FROM tower_lease.locks WHERE namespace = ns AND name = nm;
    IF NOT FOUND OR held.secret IS DISTINCT FROM s OR held.expires <= now THEN
        RETURN false;
    END IF;
    IF held.fence_until > now THEN
        UPDATE tower_lease.locks SET secret = NULL, expires = now WHERE namespace = ns AND name = nm;
    ELSE
        DELETE FROM tower_lease.locks WHERE namespace = ns AND name = nm;
    END IF;
    PERFORM tower_lease.notify('e', ns, nm);
    RETURN true;
END
$$;
