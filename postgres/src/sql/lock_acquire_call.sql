-- A `Lock`'s acquisition as the store sends it: one prepared statement (`backend.rs`), since a
-- PL/pgSQL call around it cost as much as the statement. Not installed. $1 the namespace, $2
-- the name, $3 the holder's secret, $4 the TTL in ms, $5 whether fenced.
--
-- One row when acquired: its fence (NULL unfenced). No row when refused, or when the row holds
-- this secret already (a call sent again after its reply was lost): the store then calls
-- `tower_lease.lock_acquire` (lock.sql), which answers either, and marks a refused row as
-- waited on. The clock is read where each use needs it; a later reading only lets a lease that
-- just ended go a µs sooner, and fences still only grow.
INSERT INTO tower_lease.locks AS l (namespace, name, secret, expires, fence, fence_until)
VALUES ($1, $2, $3, pg_catalog.clock_timestamp() + tower_lease.millis($4::bigint),
        CASE WHEN $5 THEN tower_lease.micros(pg_catalog.clock_timestamp()) ELSE 0 END,
        CASE WHEN $5 THEN pg_catalog.clock_timestamp() + tower_lease.fence_life($4::bigint) END)
ON CONFLICT (namespace, name) DO UPDATE
    SET secret = excluded.secret, expires = excluded.expires,
        fence = CASE WHEN $5 THEN greatest(
                    CASE WHEN l.fence_until > pg_catalog.clock_timestamp() THEN l.fence ELSE 0 END
                        + 1,
                    excluded.fence)
                ELSE l.fence END,
        fence_until = CASE WHEN $5 THEN excluded.fence_until ELSE l.fence_until END
    WHERE l.expires <= pg_catalog.clock_timestamp()
RETURNING CASE WHEN $5 THEN l.fence END AS fence
