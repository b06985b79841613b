-- `IdempotencyLayer`'s keys: one row of `idempotency` per key, under the name's lock ('v'),
-- and the claims applications make in their own transactions (`claims`).

-- The first look at a key, in one step. `kind`: 0 reserved (with `fence`), 1 in flight (the
-- holder's lease has `left_us`), 2 completed (`response`, kept `left_us` more), 3 another
-- fingerprint completed or claimed it, 4 outcome unknown for `left_us`: an at-most-once
-- reservation died without completing. A key a transaction claimed (its effect committed) with
-- no response stored is reserved (0), at-most-once or not: the handler runs again, its claim
-- answers when the key was claimed, and it answers from its own record. `once_ms` is the
-- at-most-once marker's retention, NULL for a plain key.
CREATE OR REPLACE FUNCTION tower_lease.idem_begin(
    ns text, nm bytea, s bytea, ttl_ms bigint, fenced boolean, fp bytea, once_ms bigint,
    OUT kind integer, OUT fence bigint, OUT left_us bigint, OUT response bytea)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    k tower_lease.idempotency;
    found_k boolean;
    c tower_lease.claims;
    claimed boolean;
    issued bigint;
BEGIN
    PERFORM tower_lease.lock_name('v', ns, nm);
    now := clock_timestamp();
    SELECT * INTO k FROM tower_lease.idempotency WHERE namespace = ns AND name = nm;
    found_k := FOUND;
    IF k.record_expires > now THEN
        IF k.fingerprint = fp THEN
            kind := 2;
            left_us := tower_lease.left_us(k.record_expires, now);
            response := k.response;
        ELSE
            kind := 3;
        END IF;
        RETURN;
    END IF;
    IF k.lease_expires > now THEN
        IF k.secret = s THEN
            -- A begin sent again after its reply was lost: ours, with the fence it took.
            kind := 0;
            IF fenced THEN
                fence := CASE WHEN k.fence_until > now THEN k.fence ELSE 0 END;
            END IF;
        ELSE
            kind := 1;
            left_us := tower_lease.left_us(k.lease_expires, now);
            -- The caller may wait for the completion or release, which notify a marked key.
            PERFORM tower_lease.mark_waited('v', ns, nm, now);
        END IF;
        RETURN;
    END IF;
    SELECT * INTO c FROM tower_lease.claims WHERE namespace = ns AND name = nm AND expires > now;
    claimed := FOUND;
    IF claimed AND c.fingerprint IS NOT NULL AND c.fingerprint <> fp THEN
        kind := 3;
        RETURN;
    END IF;
    IF NOT claimed AND once_ms IS NOT NULL AND k.unknown_expires > now THEN
        kind := 4;
        left_us := tower_lease.left_us(k.unknown_expires, now);
        RETURN;
    END IF;
    IF fenced THEN
        issued := greatest(
            CASE WHEN found_k AND k.fence_until > now THEN k.fence ELSE 0 END + 1,
            tower_lease.micros(now));
    END IF;
    INSERT INTO tower_lease.idempotency AS i
        (namespace, name, secret, lease_expires, fingerprint, unknown_expires, fence, fence_until)
    VALUES (ns, nm, s, now + make_interval(secs => ttl_ms / 1000.0), fp,
            now + make_interval(secs => once_ms / 1000.0), coalesce(issued, 0),
            CASE WHEN fenced THEN now + tower_lease.fence_life(ttl_ms) END)
    ON CONFLICT (namespace, name) DO UPDATE
        SET secret = excluded.secret, lease_expires = excluded.lease_expires,
            fingerprint = excluded.fingerprint, response = NULL, completed_by = NULL,
            record_expires = NULL,
            unknown_expires = coalesce(excluded.unknown_expires, i.unknown_expires),
            fence = CASE WHEN fenced THEN excluded.fence ELSE i.fence END,
            fence_until = CASE WHEN fenced THEN excluded.fence_until ELSE i.fence_until END;
    kind := 0;
    fence := issued;
END
$$;

-- Stores the record while the reservation is held with `s`, or nobody holds the key (ours ran
-- out, or was lost), which ends the reservation and its at-most-once marker. A completion sent
-- again finds its own record: true.
CREATE OR REPLACE FUNCTION tower_lease.idem_complete(ns text, nm bytea, s bytea, fp bytea, resp bytea, retention_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
    k tower_lease.idempotency;
BEGIN
    PERFORM tower_lease.lock_name('v', ns, nm);
    now := clock_timestamp();
    SELECT * INTO k FROM tower_lease.idempotency WHERE namespace = ns AND name = nm;
    IF k.record_expires > now THEN
        RETURN k.completed_by = s;
    END IF;
    IF k.lease_expires > now AND k.secret <> s THEN
        RETURN false;
    END IF;
    INSERT INTO tower_lease.idempotency AS i
        (namespace, name, fingerprint, response, completed_by, record_expires)
    VALUES (ns, nm, fp, resp, s, now + make_interval(secs => retention_ms / 1000.0))
    ON CONFLICT (namespace, name) DO UPDATE
        SET secret = NULL, lease_expires = NULL, fingerprint = excluded.fingerprint,
            response = excluded.response, completed_by = excluded.completed_by,
            record_expires = excluded.record_expires, unknown_expires = NULL;
    PERFORM tower_lease.notify_waited('v', 'v', ns, nm);
    RETURN true;
END
$$;

-- Extends (`extend`), releases, or frees (`free`: with the at-most-once marker) the
-- reservation held with `s`; false when it is not held with it. A claim stays: its effect
-- committed, whatever the response.
CREATE OR REPLACE FUNCTION tower_lease.idem_update(ns text, nm bytea, s bytea, ttl_ms bigint, extend boolean, free boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz;
BEGIN
    PERFORM tower_lease.lock_name('v', ns, nm);
    now := clock_timestamp();
    IF extend THEN
        UPDATE tower_lease.idempotency SET lease_expires = now + make_interval(secs => ttl_ms / 1000.0)
        WHERE namespace = ns AND name = nm AND secret = s AND lease_expires > now;
        RETURN FOUND;
    END IF;
    UPDATE tower_lease.idempotency
    SET secret = NULL, lease_expires = NULL,
        unknown_expires = CASE WHEN free THEN NULL ELSE unknown_expires END
    WHERE namespace = ns AND name = nm AND secret = s AND lease_expires > now;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM tower_lease.idempotency
    WHERE namespace = ns AND name = nm AND coalesce(record_expires, now) <= now
      AND coalesce(unknown_expires, now) <= now AND coalesce(fence_until, now) <= now;
    PERFORM tower_lease.notify_waited('v', 'v', ns, nm);
    RETURN true;
END
$$;

-- Claims a key inside the caller's transaction: true when claimed now, false when a committed
-- claim of the key lives. A claim being made by another open transaction is waited for (the
-- primary key's insert waits), so of two transactions claiming one key, one commits.
CREATE OR REPLACE FUNCTION tower_lease.claim(ns text, nm bytea, retention_ms bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO tower_lease.claims AS c
    SELECT ns, nm,
           (SELECT fingerprint FROM tower_lease.idempotency
            WHERE namespace = ns AND name = nm AND lease_expires > now),
           now + make_interval(secs => retention_ms / 1000.0)
    ON CONFLICT (namespace, name) DO UPDATE
        SET fingerprint = excluded.fingerprint, expires = excluded.expires
        WHERE c.expires <= now;
    RETURN FOUND;
END
$$;

-- Claims a key inside the caller's transaction, as `claim` does (which stays, for the binaries
-- of an older version), and answers NULL when claimed now or, when a committed claim of the
-- key lives, the time it was made (for a claim without one, made by an older `claim`: its
-- expiry less this retention). What `tower_lease_postgres::claim` sends.
CREATE OR REPLACE FUNCTION tower_lease.claimed_before(key_namespace text, key_name bytea, retention_ms bigint)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now timestamptz := clock_timestamp();
    retention interval := make_interval(secs => retention_ms / 1000.0);
    earlier timestamptz;
BEGIN
    INSERT INTO tower_lease.claims AS c (namespace, name, fingerprint, expires, claimed_at)
    SELECT key_namespace, key_name,
           (SELECT i.fingerprint FROM tower_lease.idempotency i
            WHERE i.namespace = key_namespace AND i.name = key_name AND i.lease_expires > now),
           now + retention, now
    ON CONFLICT (namespace, name) DO UPDATE
        SET fingerprint = excluded.fingerprint, expires = excluded.expires,
            claimed_at = excluded.claimed_at
        WHERE c.expires <= now;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    -- The conflicting claim committed (the insert waited for its transaction) and lives.
    SELECT coalesce(c.claimed_at, c.expires - retention) INTO earlier
    FROM tower_lease.claims c WHERE c.namespace = key_namespace AND c.name = key_name;
    RETURN earlier;
END
$$;
