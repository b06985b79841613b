-- A `Lock`'s release as the store sends it: one prepared statement (`backend.rs`) rather than a
-- PL/pgSQL call, which cost as much as its statement. Not installed. $1 the namespace, $2 the
-- name, $3 the holder's secret.
--
-- Answers `released`: whether the lease was held with the secret. Notifies only when a refused
-- call marked the row. The row goes (`gone`), or while its fence counter lives stays released
-- (`kept`: `expires` -infinity, so an acquisition that read the clock before this release, and
-- waited for the row, finds it free): one of the two, by the fence counter, which no other call
-- changes while the lease lives. Safe to send again: a second release finds nothing.
WITH call AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS call_time),
gone AS (
    DELETE FROM tower_lease.locks l USING call
    WHERE l.namespace = $1 AND l.name = $2 AND l.secret = $3 AND l.expires > call.call_time
      AND coalesce(l.fence_until, call.call_time) <= call.call_time
    RETURNING l.waited = 1 AS marked),
kept AS (
    -- RETURNING answers the new row: -1 says it was marked (see `waited` in schema.sql).
    UPDATE tower_lease.locks l
    SET secret = NULL, expires = '-infinity',
        waited = CASE WHEN l.waited = 1 THEN -1 ELSE 0 END
    FROM call
    WHERE l.namespace = $1 AND l.name = $2 AND l.secret = $3 AND l.expires > call.call_time
      AND l.fence_until > call.call_time
    RETURNING l.waited = -1 AS marked),
ended AS (SELECT marked FROM gone UNION ALL SELECT marked FROM kept)
-- CASE calls `notify` only for a marked row.
SELECT pg_catalog.count(*) > 0 AS released,
       pg_catalog.count(CASE WHEN marked THEN tower_lease.notify('e', $1, $2)::text END) AS notified
FROM ended
