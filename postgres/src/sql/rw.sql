-- An `RwLock`'s calls: its writer, intent and write generation in `rwlocks`, its readers in
-- `readers`, both under the name's one lock ('rw'). Answers as in lock.sql.

-- A reader gets in unless a writer holds, or a live write intent holds new readers off (unless
-- it is one of the read phase the last write's release began); acquired, it answers the write
-- generation (0 unfenced, or before any write). A reader is never refused for other readers. A
-- phase-fair (`phase_ms` > 0) reader that waits (`waiting`) and is refused is noted in
-- `waiting_readers` for the refusal's wait and two read phases.
DROP FUNCTION IF EXISTS tower_lease.read_acquire(text, bytea, bytea, bigint, boolean);
CREATE OR REPLACE FUNCTION tower_lease.read_acquire(ns text, nm bytea, s bytea, ttl_ms bigint, fenced boolean, phase_ms bigint, waiting boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    rw tower_lease.rwlocks;
    found_rw boolean;
    blocked timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('rw', ns, nm);
    now := clock_timestamp();
    SELECT * INTO rw FROM tower_lease.rwlocks WHERE namespace = ns AND name = nm;
    found_rw := FOUND;
    IF rw.writer_expires > now THEN
        blocked := rw.writer_expires;
    -- A retry of an acquisition whose reply was lost finds our own live lease behind an intent.
    ELSIF rw.intent_expires > now AND NOT EXISTS (
        SELECT 1 FROM tower_lease.readers
        WHERE namespace = ns AND name = nm AND secret = s AND expires > now
    ) AND NOT (phase_ms > 0 AND EXISTS (
        SELECT 1 FROM tower_lease.waiting_readers
        WHERE namespace = ns AND name = nm AND secret = s AND phase AND expires > now
    )) THEN
        blocked := rw.intent_expires;
    END IF;
    IF blocked IS NOT NULL THEN
        IF phase_ms > 0 AND waiting THEN
            INSERT INTO tower_lease.waiting_readers AS w (namespace, name, secret, expires)
            VALUES (ns, nm, s, blocked + make_interval(secs => 2 * phase_ms / 1000.0))
            ON CONFLICT (namespace, name, secret) DO UPDATE
                SET expires = excluded.expires WHERE NOT w.phase;
        END IF;
        PERFORM tower_lease.mark_waited('rw', ns, nm, now);
        RETURN -1 - tower_lease.left_us(blocked, now);
    END IF;
    IF phase_ms > 0 AND waiting THEN
        -- In: it waits no more, and leaves its read phase.
        DELETE FROM tower_lease.waiting_readers WHERE namespace = ns AND name = nm AND secret = s;
    END IF;
    INSERT INTO tower_lease.readers VALUES (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0))
    ON CONFLICT (namespace, name, secret) DO UPDATE SET expires = excluded.expires;
    -- Readers keep the write generation alive, but never start one.
    IF fenced AND found_rw AND rw.fence_until > now THEN
        UPDATE tower_lease.rwlocks
        SET fence_until = greatest(fence_until, now + tower_lease.fence_life(ttl_ms))
        WHERE namespace = ns AND name = nm;
        RETURN rw.fence;
    END IF;
    RETURN 0;
END
$$;

-- A writer gets in while no writer holds, no reader lease is live and no read phase has readers
-- still to come in. Refused by readers or a phase, a writer of a phase-fair or writers-first
-- lock (`intent_ms` > 0) leaves its write intent for `intent_ms`, and the listeners hear of it;
-- refused by a writer, so does a phase-fair one that waits (`fair` 2). Acquired, it removes any
-- intent and the ended readers.
-- Phase-fair writers (`fair` 1, or 2 for an attempt of a bounded wait) that wait go in the order
-- of their intents: another writer's live intent refuses such a one.
DROP FUNCTION IF EXISTS tower_lease.write_acquire(text, bytea, bytea, bigint, boolean, bigint);
DROP FUNCTION IF EXISTS tower_lease.write_acquire(text, bytea, bytea, bigint, boolean, bigint, boolean);
CREATE OR REPLACE FUNCTION tower_lease.write_acquire(ns text, nm bytea, s bytea, ttl_ms bigint, fenced boolean, intent_ms bigint, fair integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    rw tower_lease.rwlocks;
    found_rw boolean;
    last_reader timestamptz;
    issued bigint := 0;
BEGIN
    PERFORM tower_lease.lock_name('rw', ns, nm);
    now := clock_timestamp();
    SELECT * INTO rw FROM tower_lease.rwlocks WHERE namespace = ns AND name = nm;
    found_rw := FOUND;
    IF fair = 2 AND rw.intent_expires > now AND rw.intent <> s
       AND coalesce(rw.writer, ''::bytea) <> s THEN
        PERFORM tower_lease.mark_waited('rw', ns, nm, now);
        RETURN -1 - tower_lease.left_us(rw.intent_expires, now);
    END IF;
    IF rw.writer_expires > now THEN
        IF rw.writer = s THEN
            RETURN CASE WHEN fenced THEN rw.fence ELSE 0 END;
        END IF;
        IF fair = 2 AND intent_ms > 0 THEN
            UPDATE tower_lease.rwlocks
            SET intent = s, intent_expires = now + make_interval(secs => intent_ms / 1000.0)
            WHERE namespace = ns AND name = nm;
        END IF;
        PERFORM tower_lease.mark_waited('rw', ns, nm, now);
        RETURN -1 - tower_lease.left_us(rw.writer_expires, now);
    END IF;
    SELECT max(expires) INTO last_reader FROM tower_lease.readers
    WHERE namespace = ns AND name = nm AND expires > now;
    IF last_reader IS NULL THEN
        -- The readers of a read phase come in before this writer.
        SELECT max(expires) INTO last_reader FROM tower_lease.waiting_readers
        WHERE namespace = ns AND name = nm AND phase AND expires > now;
    END IF;
    IF last_reader IS NOT NULL THEN
        -- Ended readers go, so a name that readers never leave holds no crashed ones for long.
        DELETE FROM tower_lease.readers WHERE namespace = ns AND name = nm AND expires <= now;
        IF intent_ms > 0 THEN
            INSERT INTO tower_lease.rwlocks AS r (namespace, name, intent, intent_expires)
            VALUES (ns, nm, s, now + make_interval(secs => intent_ms / 1000.0))
            ON CONFLICT (namespace, name) DO UPDATE
                SET intent = excluded.intent, intent_expires = excluded.intent_expires;
            PERFORM tower_lease.notify('i', ns, nm);
        END IF;
        PERFORM tower_lease.mark_waited('rw', ns, nm, now);
        RETURN -1 - tower_lease.left_us(last_reader, now);
    END IF;
    DELETE FROM tower_lease.readers WHERE namespace = ns AND name = nm;
    IF fenced THEN
        issued := greatest(
            CASE WHEN found_rw AND rw.fence_until > now THEN rw.fence ELSE 0 END + 1,
            tower_lease.micros(now));
        INSERT INTO tower_lease.rwlocks AS r
            (namespace, name, writer, writer_expires, intent, intent_expires, fence, fence_until)
        VALUES (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0), NULL, NULL, issued,
                now + tower_lease.fence_life(ttl_ms))
        ON CONFLICT (namespace, name) DO UPDATE
            SET writer = excluded.writer, writer_expires = excluded.writer_expires,
                intent = NULL, intent_expires = NULL, fence = excluded.fence,
                fence_until = excluded.fence_until;
    ELSE
        INSERT INTO tower_lease.rwlocks AS r (namespace, name, writer, writer_expires)
        VALUES (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0))
        ON CONFLICT (namespace, name) DO UPDATE
            SET writer = excluded.writer, writer_expires = excluded.writer_expires,
                intent = NULL, intent_expires = NULL;
    END IF;
    RETURN issued;
END
$$;

-- 0: the lease is gone; 1: extended; 2: a reader extended while a write intent lives.
CREATE OR REPLACE FUNCTION tower_lease.rw_extend(ns text, nm bytea, s bytea, ttl_ms bigint, reader boolean)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    ends timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('rw', ns, nm);
    now := clock_timestamp();
    ends := now + make_interval(secs => ttl_ms / 1000.0);
    IF NOT reader THEN
        UPDATE tower_lease.rwlocks SET writer_expires = ends
        WHERE namespace = ns AND name = nm AND writer = s AND writer_expires > now;
        RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
    END IF;
    UPDATE tower_lease.readers SET expires = ends
    WHERE namespace = ns AND name = nm AND secret = s AND expires > now;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT 1 FROM tower_lease.rwlocks
               WHERE namespace = ns AND name = nm AND intent_expires > now) THEN
        RETURN 2;
    END IF;
    RETURN 1;
END
$$;

-- Ends a reader's or the writer's lease held with `s`. The writer's release, and the last live
-- reader's, tell the listeners if a refused call marked the name. A phase-fair (`phase_ms` > 0)
-- writer's release turns the live waiting readers into its read phase, for `phase_ms`.
DROP FUNCTION IF EXISTS tower_lease.rw_release(text, bytea, bytea, boolean);
CREATE OR REPLACE FUNCTION tower_lease.rw_release(ns text, nm bytea, s bytea, reader boolean, phase_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    ended timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('rw', ns, nm);
    now := clock_timestamp();
    IF reader THEN
        DELETE FROM tower_lease.readers WHERE namespace = ns AND name = nm AND secret = s
        RETURNING expires INTO ended;
        IF NOT FOUND OR ended <= now THEN
            RETURN false;
        END IF;
        DELETE FROM tower_lease.readers WHERE namespace = ns AND name = nm AND expires <= now;
        IF NOT EXISTS (SELECT 1 FROM tower_lease.readers WHERE namespace = ns AND name = nm) THEN
            PERFORM tower_lease.notify_waited('rw', 'r', ns, nm);
        END IF;
        RETURN true;
    END IF;
    UPDATE tower_lease.rwlocks SET writer = NULL, writer_expires = NULL
    WHERE namespace = ns AND name = nm AND writer = s AND writer_expires > now;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF phase_ms > 0 THEN
        DELETE FROM tower_lease.waiting_readers
        WHERE namespace = ns AND name = nm AND (expires <= now OR phase);
        UPDATE tower_lease.waiting_readers
        SET phase = true, expires = now + make_interval(secs => phase_ms / 1000.0)
        WHERE namespace = ns AND name = nm;
    END IF;
    DELETE FROM tower_lease.rwlocks
    WHERE namespace = ns AND name = nm AND coalesce(intent_expires, now) <= now
      AND coalesce(fence_until, now) <= now;
    PERFORM tower_lease.notify_waited('rw', 'w', ns, nm);
    RETURN true;
END
$$;

-- Removes the write intent while it holds `s` (the writer that left it gives up); readers
-- waiting elsewhere (they marked the name when refused) hear of it as of a release.
CREATE OR REPLACE FUNCTION tower_lease.withdraw_intent(ns text, nm bytea, s bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('rw', ns, nm);
    now := clock_timestamp();
    UPDATE tower_lease.rwlocks SET intent = NULL, intent_expires = NULL
    WHERE namespace = ns AND name = nm AND intent = s AND intent_expires > now;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM tower_lease.notify_waited('rw', 'w', ns, nm);
    RETURN true;
END
$$;
