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
CREATE FUNCTION tower_lease.idempotency_begin(
    key_namespace text, key_name bytea, holder_secret bytea, ttl_ms bigint, fenced boolean,
    request_fingerprint bytea, at_most_once_ms bigint,
    OUT outcome text, OUT fence bigint, OUT remaining_us bigint, OUT response bytea)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    k tower_lease.idempotency;
    found_k boolean;
    c tower_lease.claims;
    claimed boolean;
    issued bigint;
BEGIN
    PERFORM tower_lease.take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO k FROM tower_lease.idempotency i
    WHERE i.namespace = key_namespace AND i.name = key_name;
    found_k := FOUND;
    IF k.record_expires > call_time THEN
        IF k.fingerprint = request_fingerprint THEN
            outcome := 'completed';
            remaining_us := tower_lease.micros_until(k.record_expires, call_time);
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
            remaining_us := tower_lease.micros_until(k.lease_expires, call_time);
            -- The caller may wait for the completion or release, which notify a marked key.
            PERFORM tower_lease.mark_waited('v', key_namespace, key_name, call_time);
        END IF;
        RETURN;
    END IF;
    SELECT * INTO c FROM tower_lease.claims cl
    WHERE cl.namespace = key_namespace AND cl.name = key_name AND cl.expires > call_time;
    claimed := FOUND;
    IF claimed AND c.fingerprint IS NOT NULL AND c.fingerprint <> request_fingerprint THEN
        outcome := 'mismatch';
        RETURN;
    END IF;
    IF NOT claimed AND at_most_once_ms IS NOT NULL AND k.unknown_expires > call_time THEN
        outcome := 'outcome_unknown';
        remaining_us := tower_lease.micros_until(k.unknown_expires, call_time);
        RETURN;
    END IF;
    IF fenced THEN
        issued := greatest(
            CASE WHEN found_k AND k.fence_until > call_time THEN k.fence ELSE 0 END + 1,
            tower_lease.micros(call_time));
    END IF;
    INSERT INTO tower_lease.idempotency AS i
        (namespace, name, secret, lease_expires, fingerprint, unknown_expires, fence, fence_until)
    VALUES (key_namespace, key_name, holder_secret, call_time + tower_lease.millis(ttl_ms),
            request_fingerprint, call_time + tower_lease.millis(at_most_once_ms),
            coalesce(issued, 0),
            CASE WHEN fenced THEN call_time + tower_lease.fence_life(ttl_ms) END)
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
CREATE FUNCTION tower_lease.idempotency_complete(
    key_namespace text, key_name bytea, holder_secret bytea, request_fingerprint bytea,
    record_response bytea, retention_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
    k tower_lease.idempotency;
BEGIN
    PERFORM tower_lease.take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    SELECT * INTO k FROM tower_lease.idempotency i
    WHERE i.namespace = key_namespace AND i.name = key_name;
    IF k.record_expires > call_time THEN
        RETURN k.completed_by = holder_secret;
    END IF;
    IF k.lease_expires > call_time AND k.secret <> holder_secret THEN
        RETURN false;
    END IF;
    INSERT INTO tower_lease.idempotency AS i
        (namespace, name, fingerprint, response, completed_by, record_expires)
    VALUES (key_namespace, key_name, request_fingerprint, record_response, holder_secret,
            call_time + tower_lease.millis(retention_ms))
    ON CONFLICT (namespace, name) DO UPDATE
        SET secret = NULL, lease_expires = NULL, fingerprint = excluded.fingerprint,
            response = excluded.response, completed_by = excluded.completed_by,
            record_expires = excluded.record_expires, unknown_expires = NULL;
    PERFORM tower_lease.notify_waited('v', 'v', key_namespace, key_name);
    RETURN true;
END
$$;

-- Restarts the reservation held with `holder_secret` for one TTL; answers whether it was held.
CREATE FUNCTION tower_lease.idempotency_extend(
    key_namespace text, key_name bytea, holder_secret bytea, ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    PERFORM tower_lease.take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE tower_lease.idempotency i SET lease_expires = call_time + tower_lease.millis(ttl_ms)
    WHERE i.namespace = key_namespace AND i.name = key_name AND i.secret = holder_secret
      AND i.lease_expires > call_time;
    RETURN FOUND;
END
$$;

-- Releases the reservation held with `holder_secret`, and with `forget_at_most_once` its
-- at-most-once marker too (the request may run again); false when it is not held with it. A
-- claim stays: its effect committed, whatever the response.
CREATE FUNCTION tower_lease.idempotency_release(
    key_namespace text, key_name bytea, holder_secret bytea, forget_at_most_once boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz;
BEGIN
    PERFORM tower_lease.take_name_lock('v', key_namespace, key_name);
    call_time := pg_catalog.clock_timestamp();
    UPDATE tower_lease.idempotency i
    SET secret = NULL, lease_expires = NULL,
        unknown_expires = CASE WHEN forget_at_most_once THEN NULL ELSE i.unknown_expires END
    WHERE i.namespace = key_namespace AND i.name = key_name AND i.secret = holder_secret
      AND i.lease_expires > call_time;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM tower_lease.idempotency i
    WHERE i.namespace = key_namespace AND i.name = key_name
      AND coalesce(i.record_expires, call_time) <= call_time
      AND coalesce(i.unknown_expires, call_time) <= call_time
      AND coalesce(i.fence_until, call_time) <= call_time;
    PERFORM tower_lease.notify_waited('v', 'v', key_namespace, key_name);
    RETURN true;
END
$$;

-- Claims a key inside the caller's transaction: NULL when claimed now or, when a committed
-- claim of the key lives, the time it was made (for a claim without one: its expiry less this
-- retention). A claim being made by another open transaction is waited for (the primary key's
-- insert waits), so of two transactions claiming one key, one commits. What
-- `tower_lease_postgres::claim` sends.
CREATE FUNCTION tower_lease.claimed_before(key_namespace text, key_name bytea, retention_ms bigint)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
    retention interval := tower_lease.millis(retention_ms);
    earlier timestamptz;
BEGIN
    INSERT INTO tower_lease.claims AS c (namespace, name, fingerprint, expires, claimed_at)
    SELECT key_namespace, key_name,
           (SELECT i.fingerprint FROM tower_lease.idempotency i
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
    FROM tower_lease.claims c WHERE c.namespace = key_namespace AND c.name = key_name;
    RETURN earlier;
END
$$;
