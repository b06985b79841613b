-- A `Semaphore`'s calls: one row per permit in `permits`, under the name's lock ('p').

-- Takes a permit while fewer than `most` are live: 0 when acquired, -1 - the µs until the
-- earliest live permit ends when all are taken. Ended permits of the name go first.
CREATE OR REPLACE FUNCTION tower_lease.permit_acquire(ns text, nm bytea, s bytea, ttl_ms bigint, most integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    live integer;
    earliest timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('p', ns, nm);
    now := clock_timestamp();
    DELETE FROM tower_lease.permits WHERE namespace = ns AND name = nm AND expires <= now;
    SELECT count(*), min(expires) INTO live, earliest FROM tower_lease.permits
    WHERE namespace = ns AND name = nm;
    IF live >= most THEN
        -- A retry of an acquisition whose reply was lost finds our own permit: acquired.
        IF EXISTS (SELECT 1 FROM tower_lease.permits
                   WHERE namespace = ns AND name = nm AND secret = s) THEN
            RETURN 0;
        END IF;
        PERFORM tower_lease.mark_waited('p', ns, nm, now);
        RETURN -1 - tower_lease.left_us(earliest, now);
    END IF;
    INSERT INTO tower_lease.permits VALUES (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0))
    ON CONFLICT (namespace, name, secret) DO UPDATE SET expires = excluded.expires;
    RETURN 0;
END
$$;

CREATE OR REPLACE FUNCTION tower_lease.permit_extend(ns text, nm bytea, s bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('p', ns, nm);
    now := clock_timestamp();
    UPDATE tower_lease.permits SET expires = now + make_interval(secs => ttl_ms / 1000.0)
    WHERE namespace = ns AND name = nm AND secret = s AND expires > now;
    RETURN FOUND;
END
$$;

-- Ends a live permit held with `s`; every release frees a slot, so every one tells the
-- listeners when a refused call marked the name.
CREATE OR REPLACE FUNCTION tower_lease.permit_release(ns text, nm bytea, s bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    ended timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('p', ns, nm);
    now := clock_timestamp();
    DELETE FROM tower_lease.permits WHERE namespace = ns AND name = nm AND secret = s
    RETURNING expires INTO ended;
    IF NOT FOUND OR ended <= now THEN
        RETURN false;
    END IF;
    PERFORM tower_lease.notify_waited('p', 'p', ns, nm);
    RETURN true;
END
$$;

-- Reads only: the permits of the name live now.
CREATE OR REPLACE FUNCTION tower_lease.permits_in_use(ns text, nm bytea)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT count(*)::integer FROM tower_lease.permits
    WHERE namespace = ns AND name = nm AND expires > clock_timestamp()
$$;
