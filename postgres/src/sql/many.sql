-- The heartbeat's batch: many extends in one round trip and one transaction, answering for each
-- lease, at its position, what its own extend would: `held`, and `writer_waiting` (a reader
-- extended while a write intent lives). `modes` are the modes' letters: 'e' exclusive, 'r'
-- read, 'w' write, 'p' permit, 'v' reservation.
--
-- The names' locks are held until the batch commits, so they are taken in the order of their
-- keys: two batches (or a batch and a single call) never wait for each other in a cycle.
CREATE FUNCTION tower_lease.extend_many(
    modes text[], namespaces text[], names bytea[], holder_secrets bytea[], ttls_ms bigint[],
    OUT held boolean[], OUT writer_waiting boolean[])
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    leases integer := coalesce(pg_catalog.array_length(modes, 1), 0);
    i bigint;
    one record;
BEGIN
    held := pg_catalog.array_fill(false, ARRAY[leases]);
    writer_waiting := pg_catalog.array_fill(false, ARRAY[leases]);
    FOR i IN
        -- `unnest` of several arrays is the syntax of `ROWS FROM`, not a function to qualify.
        SELECT u.lease_index FROM unnest(modes, namespaces, names)
            WITH ORDINALITY AS u(mode, namespace, name, lease_index)
        ORDER BY tower_lease.name_key(
            CASE u.mode WHEN 'r' THEN 'rw' WHEN 'w' THEN 'rw' ELSE u.mode END,
            u.namespace, u.name)
    LOOP
        CASE modes[i]
            WHEN 'e' THEN
                held[i] := tower_lease.lock_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i]);
            WHEN 'r', 'w' THEN
                SELECT * INTO one FROM tower_lease.rwlock_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i], modes[i] = 'r');
                held[i] := one.held;
                writer_waiting[i] := one.writer_waiting;
            WHEN 'p' THEN
                held[i] := tower_lease.permit_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i]);
            WHEN 'v' THEN
                held[i] := tower_lease.idempotency_extend(
                    namespaces[i], names[i], holder_secrets[i], ttls_ms[i]);
            ELSE
                NULL;
        END CASE;
    END LOOP;
END
$$;
