-- A `Lock`'s release as the store sends it: `tower_lease.lock_release` (lock.sql) as one
-- prepared statement rather than a PL/pgSQL call, which cost as much as its statement. Answers
-- whether the lease was held with the secret; notifies only when a refused call marked the
-- row. The row goes (`gone`), or while its fence counter lives stays released (`kept`): one of
-- the two, by the fence counter, which no other call changes while the lease lives. Not
-- installed: `backend.rs` prepares it. $1 namespace, $2 name, $3 secret.
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
gone AS (
    DELETE FROM tower_lease.locks l USING c
    WHERE l.namespace = $1 AND l.name = $2 AND l.secret = $3 AND l.expires > c.now
      AND coalesce(l.fence_until, c.now) <= c.now
    RETURNING l.waited = 1 AS marked),
kept AS (
    -- RETURNING answers the new row: -1 says it was marked (see `waited` in schema.sql).
    UPDATE tower_lease.locks l
    SET secret = NULL, expires = '-infinity',
        waited = CASE WHEN l.waited = 1 THEN -1 ELSE 0 END
    FROM c
    WHERE l.namespace = $1 AND l.name = $2 AND l.secret = $3 AND l.expires > c.now
      AND l.fence_until > c.now
    RETURNING l.waited = -1 AS marked),
ended AS (SELECT marked FROM gone UNION ALL SELECT marked FROM kept)
-- CASE calls `notify` only for a marked row.
SELECT count(*) > 0, count(CASE WHEN marked THEN tower_lease.notify('e', $1, $2)::text END)
FROM ended
