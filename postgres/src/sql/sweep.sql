-- The sweep of ended rows: `tower_lease.sweep()`, sent by each store about once a second after
-- one of its acquisitions (`sweep.rs`), off that call's path.
--
-- It reads only the rows whose `sweep_after` (tables.sql) passed, through that column's index:
-- those that ended go, the others (extended, or taken again, since) are looked at again when
-- they end now. No index holds a lease's expiry: the index costs the sweep, not the calls.

-- Sweeps up to `batch` due rows of `table_name` (`sweep_after` passed at `call_time`) without
-- ever waiting: a row another call has locked is left for later, and so is one whose name's
-- advisory lock ('rw', 'p', 'v'; '*' the row's own `kind`; NULL none) another call holds.
-- `ends` is the expression (over the row `t`) of when all of a row's leases, records and
-- counters end. Answers how many rows were due: a store sends the sweep again while a batch
-- was full. Built for each call (`EXECUTE`), so each is planned for its `call_time`: a plan
-- for any time would guess a third of the table due, and scan it.
CREATE FUNCTION tower_lease.sweep_table(
    table_name text, ends text, name_lock text, batch integer, call_time timestamptz)
RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    unlocked text := '';
    due_rows integer;
BEGIN
    IF name_lock IS NOT NULL THEN
        unlocked := pg_catalog.format(
            'AND pg_catalog.pg_try_advisory_xact_lock(tower_lease.lock_class(), '
            'tower_lease.name_key(%s, t.namespace, t.name))',
            CASE WHEN name_lock = '*' THEN 't.kind' ELSE pg_catalog.quote_literal(name_lock) END);
    END IF;
    -- The statements in WITH all run to completion, whether the last one reads them or not;
    -- the rows are found again by `ctid = ANY (ARRAY(…))`, which reads them by address.
    EXECUTE pg_catalog.format($sweep$
        WITH due AS (
            SELECT t.ctid AS row_id, %2$s AS ends FROM %1$s t
            WHERE t.sweep_after <= $2
            LIMIT $1 FOR UPDATE SKIP LOCKED),
        gone AS (
            DELETE FROM %1$s t
            WHERE t.ctid = ANY (ARRAY(SELECT row_id FROM due WHERE ends <= $2)) %3$s),
        again AS (
            UPDATE %1$s t SET sweep_after = due.ends FROM due
            WHERE t.ctid = ANY (ARRAY(SELECT row_id FROM due WHERE ends > $2))
              AND t.ctid = due.row_id)
        SELECT pg_catalog.count(*)::integer FROM due
        $sweep$, table_name, ends, unlocked)
    INTO due_rows USING batch, call_time;
    RETURN due_rows;
END
$$;

-- Sweeps every table (`sweep_table`, above), the marks of `waited` nobody refreshed for a
-- minute with them. Answers the most rows one table had due.
CREATE FUNCTION tower_lease.sweep(batch integer DEFAULT 100)
RETURNS integer LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    call_time timestamptz := pg_catalog.clock_timestamp();
BEGIN
    RETURN greatest(
        tower_lease.sweep_table('tower_lease.locks',
            'greatest(t.expires, t.fence_until)', NULL, batch, call_time),
        tower_lease.sweep_table('tower_lease.rwlocks',
            $e$coalesce(greatest(t.writer_expires, t.intent_expires, t.fence_until),
                        '-infinity')$e$, 'rw', batch, call_time),
        tower_lease.sweep_table('tower_lease.readers', 't.expires', 'rw', batch, call_time),
        tower_lease.sweep_table('tower_lease.waiting_readers',
            't.expires', 'rw', batch, call_time),
        tower_lease.sweep_table('tower_lease.permits', 't.expires', 'p', batch, call_time),
        tower_lease.sweep_table('tower_lease.idempotency',
            $e$coalesce(greatest(t.lease_expires, t.record_expires, t.unknown_expires,
                                 t.fence_until), '-infinity')$e$, 'v', batch, call_time),
        tower_lease.sweep_table('tower_lease.claims', 't.expires', NULL, batch, call_time),
        tower_lease.sweep_table('tower_lease.waited',
            $e$t.since + interval '1 minute'$e$, '*', batch, call_time));
END
$$;
