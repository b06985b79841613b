-- An `RwLock`'s calls: its writer, intent and write generation in `rwlocks`, its readers in
-- `readers`, a phase-fair lock's waiting readers and read phase in `waiting_readers`, all under
-- the name's one lock ('rw'). Acquisitions answer as in lock.sql.

-- A reader gets in unless a writer holds, or a live write intent holds new readers off (unless
-- the reader is one of the read phase the last write's release began); acquired, it answers
-- the write generation (0 before any write; NULL unfenced). A reader is never refused for other
-- readers. A phase-fair (`read_phase_ms` > 0) reader that waits (`waiting`) and is refused is
-- noted in `waiting_readers` for the refusal's wait and two read phases.
CREATE FUNCTION tower_lease.read_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean,
    read_phase_ms bigint, waiting boolean)
RETURNS tower_lease.acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    rw tower_lease.rwlocks;
    found_rw boolean;
    blocked_until timestamptz;
BEGIN
    PERFORM tower_lease.take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO rw FROM tower_lease.rwlocks r
    WHERE r.namespace = lock_namespace AND r.name = lock_name;
    found_rw := FOUND;
    IF rw.writer_expires > call_time THEN
        blocked_until := rw.writer_expires;
    -- A retry of an acquisition whose reply was lost finds our own live lease behind an intent.
    ELSIF rw.intent_expires > call_time AND NOT EXISTS (
        SELECT 1 FROM tower_lease.readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.secret = holder_secret
          AND r.expires > call_time
    ) AND NOT (read_phase_ms > 0 AND EXISTS (
        SELECT 1 FROM tower_lease.waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name AND w.secret = holder_secret
          AND w.phase AND w.expires > call_time
    )) THEN
        blocked_until := rw.intent_expires;
    END IF;
    IF blocked_until IS NOT NULL THEN
        IF read_phase_ms > 0 AND waiting THEN
            INSERT INTO tower_lease.waiting_readers AS w (namespace, name, secret, expires)
            VALUES (lock_namespace, lock_name, holder_secret,
                    blocked_until + tower_lease.millis(2 * read_phase_ms))
            ON CONFLICT (namespace, name, secret) DO UPDATE
                SET expires = excluded.expires WHERE NOT w.phase;
        END IF;
        PERFORM tower_lease.mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN tower_lease.refused(blocked_until, call_time);
    END IF;
    IF read_phase_ms > 0 AND waiting THEN
        -- In: it waits no more, and leaves its read phase.
        DELETE FROM tower_lease.waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name AND w.secret = holder_secret;
    END IF;
    INSERT INTO tower_lease.readers VALUES
        (lock_namespace, lock_name, holder_secret, call_time + tower_lease.millis(ttl_ms))
    ON CONFLICT (namespace, name, secret) DO UPDATE SET expires = excluded.expires;
    IF NOT fenced THEN
        RETURN tower_lease.acquired(NULL);
    END IF;
    -- Readers keep the write generation alive, but never start one.
    IF found_rw AND rw.fence_until > call_time THEN
        UPDATE tower_lease.rwlocks r
        SET fence_until = greatest(r.fence_until, call_time + tower_lease.fence_life(ttl_ms))
        WHERE r.namespace = lock_namespace AND r.name = lock_name;
        RETURN tower_lease.acquired(rw.fence);
    END IF;
    RETURN tower_lease.acquired(0);
END
$$;

-- A writer gets in while no writer holds, no reader lease is live and no read phase has readers
-- still to come in. Refused by readers or a phase, a writer of a phase-fair or writers-first
-- lock (`intent_ms` > 0) leaves its write intent for `intent_ms`, and the listeners hear of it;
-- refused by a writer, so does a phase-fair one that waits (`waiting_in_turn`). Acquired, it
-- removes any intent and the ended readers. Phase-fair writers that wait go in the order their
-- waits began (a secret's first six bytes, big-endian ms): the live intent of a writer whose wait
-- began no later refuses such a one, which takes over a later one's.
CREATE FUNCTION tower_lease.write_acquire(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean,
    intent_ms bigint, waiting_in_turn boolean)
RETURNS tower_lease.acquisition LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    rw tower_lease.rwlocks;
    found_rw boolean;
    last_reader_ends timestamptz;
    issued bigint;
BEGIN
    PERFORM tower_lease.take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO rw FROM tower_lease.rwlocks r
    WHERE r.namespace = lock_namespace AND r.name = lock_name;
    found_rw := FOUND;
    IF waiting_in_turn AND rw.intent_expires > call_time AND rw.intent <> holder_secret
       AND substring(rw.intent FROM 1 FOR 6) <= substring(holder_secret FROM 1 FOR 6)
       AND coalesce(rw.writer, ''::bytea) <> holder_secret THEN
        PERFORM tower_lease.mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN tower_lease.refused(rw.intent_expires, call_time);
    END IF;
    IF rw.writer_expires > call_time THEN
        IF rw.writer = holder_secret THEN
            RETURN tower_lease.acquired(CASE WHEN fenced THEN rw.fence END);
        END IF;
        IF waiting_in_turn AND intent_ms > 0 THEN
            UPDATE tower_lease.rwlocks r
            SET intent = holder_secret, intent_expires = call_time + tower_lease.millis(intent_ms)
            WHERE r.namespace = lock_namespace AND r.name = lock_name;
        END IF;
        PERFORM tower_lease.mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN tower_lease.refused(rw.writer_expires, call_time);
    END IF;
    SELECT pg_catalog.max(r.expires) INTO last_reader_ends FROM tower_lease.readers r
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.expires > call_time;
    IF last_reader_ends IS NULL THEN
        -- The readers of a read phase come in before this writer.
        SELECT pg_catalog.max(w.expires) INTO last_reader_ends FROM tower_lease.waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name AND w.phase
          AND w.expires > call_time;
    END IF;
    IF last_reader_ends IS NOT NULL THEN
        -- Ended readers go, so a name that readers never leave holds no crashed ones for long.
        DELETE FROM tower_lease.readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.expires <= call_time;
        IF intent_ms > 0 THEN
            INSERT INTO tower_lease.rwlocks AS r (namespace, name, intent, intent_expires)
            VALUES (lock_namespace, lock_name, holder_secret,
                    call_time + tower_lease.millis(intent_ms))
            ON CONFLICT (namespace, name) DO UPDATE
                SET intent = excluded.intent, intent_expires = excluded.intent_expires;
            PERFORM tower_lease.notify('i', lock_namespace, lock_name);
        END IF;
        PERFORM tower_lease.mark_waited('rw', lock_namespace, lock_name, call_time);
        RETURN tower_lease.refused(last_reader_ends, call_time);
    END IF;
    DELETE FROM tower_lease.readers r WHERE r.namespace = lock_namespace AND r.name = lock_name;
    IF fenced THEN
        issued := greatest(
            CASE WHEN found_rw AND rw.fence_until > call_time THEN rw.fence ELSE 0 END + 1,
            tower_lease.micros(call_time));
        INSERT INTO tower_lease.rwlocks AS r
            (namespace, name, writer, writer_expires, intent, intent_expires, fence, fence_until)
        VALUES (lock_namespace, lock_name, holder_secret, call_time + tower_lease.millis(ttl_ms),
                NULL, NULL, issued, call_time + tower_lease.fence_life(ttl_ms))
        ON CONFLICT (namespace, name) DO UPDATE
            SET writer = excluded.writer, writer_expires = excluded.writer_expires,
                holder = excluded.holder, intent = NULL, intent_expires = NULL,
                fence = excluded.fence,
                fence_until = excluded.fence_until;
    ELSE
        INSERT INTO tower_lease.rwlocks AS r (namespace, name, writer, writer_expires)
        VALUES (lock_namespace, lock_name, holder_secret, call_time + tower_lease.millis(ttl_ms))
        ON CONFLICT (namespace, name) DO UPDATE
            SET writer = excluded.writer, writer_expires = excluded.writer_expires,
                holder = excluded.holder, intent = NULL, intent_expires = NULL;
    END IF;
    RETURN tower_lease.acquired(issued);
END
$$;

-- Restarts a reader's (`as_reader`) or the writer's lease for one TTL while it is held with
-- `holder_secret`. `held`: it was; `writer_waiting`: a reader was extended while a write
-- intent lives.
CREATE FUNCTION tower_lease.rwlock_extend(
    lock_namespace text, lock_name bytea, holder_secret bytea, ttl_ms bigint, as_reader boolean,
    OUT held boolean, OUT writer_waiting boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    ends timestamptz;
BEGIN
    PERFORM tower_lease.take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    ends := call_time + tower_lease.millis(ttl_ms);
    writer_waiting := false;
    IF NOT as_reader THEN
        UPDATE tower_lease.rwlocks r SET writer_expires = ends
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.writer = holder_secret
          AND r.writer_expires > call_time;
        held := FOUND;
        RETURN;
    END IF;
    UPDATE tower_lease.readers r SET expires = ends
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.secret = holder_secret
      AND r.expires > call_time;
    held := FOUND;
    IF held THEN
        writer_waiting := EXISTS (
            SELECT 1 FROM tower_lease.rwlocks r
            WHERE r.namespace = lock_namespace AND r.name = lock_name
              AND r.intent_expires > call_time);
    END IF;
END
$$;

-- Ends a reader's (`as_reader`) or the writer's lease held with `holder_secret`. The writer's
-- release, and the last live reader's, tell the listeners if a refused call marked the name. A
-- phase-fair (`read_phase_ms` > 0) writer's release turns the live waiting readers into its
-- read phase, for `read_phase_ms`.
CREATE FUNCTION tower_lease.rwlock_release(
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
    PERFORM tower_lease.take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    IF as_reader THEN
        DELETE FROM tower_lease.readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.secret = holder_secret
        RETURNING r.expires INTO ended;
        IF NOT FOUND OR ended <= call_time THEN
            RETURN false;
        END IF;
        DELETE FROM tower_lease.readers r
        WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.expires <= call_time;
        IF NOT EXISTS (SELECT 1 FROM tower_lease.readers r
                       WHERE r.namespace = lock_namespace AND r.name = lock_name) THEN
            PERFORM tower_lease.notify_waited('rw', 'r', lock_namespace, lock_name);
        END IF;
        RETURN true;
    END IF;
    UPDATE tower_lease.rwlocks r SET writer = NULL, writer_expires = NULL
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.writer = holder_secret
      AND r.writer_expires > call_time;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF read_phase_ms > 0 THEN
        DELETE FROM tower_lease.waiting_readers w
        WHERE w.namespace = lock_namespace AND w.name = lock_name
          AND (w.expires <= call_time OR w.phase);
        UPDATE tower_lease.waiting_readers w
        SET phase = true, expires = call_time + tower_lease.millis(read_phase_ms)
        WHERE w.namespace = lock_namespace AND w.name = lock_name;
    END IF;
    DELETE FROM tower_lease.rwlocks r
    WHERE r.namespace = lock_namespace AND r.name = lock_name
      AND coalesce(r.intent_expires, call_time) <= call_time
      AND coalesce(r.fence_until, call_time) <= call_time;
    PERFORM tower_lease.notify_waited('rw', 'w', lock_namespace, lock_name);
    RETURN true;
END
$$;

-- Removes the write intent while it holds `holder_secret` (the writer that left it gives up);
-- readers waiting elsewhere (they marked the name when refused) hear of it as of a release.
CREATE FUNCTION tower_lease.withdraw_intent(
    lock_namespace text, lock_name bytea, holder_secret bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    -- A release's commit need not wait for its WAL flush (nor a synchronous standby): lost in
    -- a crash, the lease only lives on to its end, which delays the next holder and lets no
    -- second one in; an acquisition that follows it flushes it with its own commit.
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    PERFORM tower_lease.take_name_lock('rw', lock_namespace, lock_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE tower_lease.rwlocks r SET intent = NULL, intent_expires = NULL
    WHERE r.namespace = lock_namespace AND r.name = lock_name AND r.intent = holder_secret
      AND r.intent_expires > call_time;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM tower_lease.notify_waited('rw', 'w', lock_namespace, lock_name);
    RETURN true;
END
$$;
