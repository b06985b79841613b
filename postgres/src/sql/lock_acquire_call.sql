-- A `Lock`'s acquisition as the store sends it: the upsert of `tower_lease.lock_acquire`
-- (lock.sql) alone, as a prepared statement of its own, since the PL/pgSQL call around it cost
-- as much as the statement. One row when acquired: the fence (0 unfenced). No row when refused,
-- or when the row holds this secret (a call sent again after its reply was lost): the store
-- then calls `lock_acquire`, which answers either, and marks a refused row as waited on.
-- Not installed: `backend.rs` prepares it. $1 namespace, $2 name, $3 secret, $4 TTL in ms,
-- $5 fenced. The clock is read where each use needs it; a later reading only lets a lease
-- that just ended go a µs sooner, and fences still only grow.
INSERT INTO tower_lease.locks AS l (namespace, name, secret, expires, fence, fence_until)
VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4::bigint / 1000.0),
        CASE WHEN $5 THEN tower_lease.micros(clock_timestamp()) ELSE 0 END,
        CASE WHEN $5 THEN clock_timestamp() + tower_lease.fence_life($4::bigint) END)
ON CONFLICT (namespace, name) DO UPDATE
    SET secret = excluded.secret, expires = excluded.expires,
        fence = CASE WHEN $5 THEN greatest(
                    CASE WHEN l.fence_until > clock_timestamp() THEN l.fence ELSE 0 END + 1,
                    excluded.fence)
                ELSE l.fence END,
        fence_until = CASE WHEN $5 THEN excluded.fence_until ELSE l.fence_until END
    WHERE l.expires <= clock_timestamp()
RETURNING CASE WHEN $5 THEN l.fence ELSE 0 END
