-- The heartbeat's batch: many extends in one round trip and one transaction, answering for
-- each what its own extend would (0 gone, 1 extended, 2 a reader extended while a writer
-- waits). `kinds` are the modes' letters: 'e' exclusive, 'r' read, 'w' write, 'p' permit, 'v'
-- reservation.
--
-- The names' locks are held until the batch commits, so they are taken in the order of their
-- keys: two batches (or a batch and a single call) never wait for each other in a cycle.
CREATE OR REPLACE FUNCTION tower_lease.extend_many(
    kinds text[], nss text[], nms bytea[], ss bytea[], ttls bigint[])
RETURNS integer[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    answers integer[] := array_fill(0, ARRAY[coalesce(array_length(kinds, 1), 0)]);
    i bigint;
BEGIN
    FOR i IN
        SELECT o FROM unnest(kinds, nss, nms) WITH ORDINALITY AS u(k, ns, nm, o)
        ORDER BY hashtext(CASE u.k WHEN 'r' THEN 'rw' WHEN 'w' THEN 'rw' ELSE u.k END
                          || ':' || u.ns || ':' || encode(u.nm, 'hex'))
    LOOP
        answers[i] := CASE kinds[i]
            WHEN 'e' THEN tower_lease.lock_extend(nss[i], nms[i], ss[i], ttls[i])::integer
            WHEN 'r' THEN tower_lease.rw_extend(nss[i], nms[i], ss[i], ttls[i], true)
            WHEN 'w' THEN tower_lease.rw_extend(nss[i], nms[i], ss[i], ttls[i], false)
            WHEN 'p' THEN tower_lease.permit_extend(nss[i], nms[i], ss[i], ttls[i])::integer
            WHEN 'v' THEN tower_lease.idem_update(nss[i], nms[i], ss[i], ttls[i], true, false)::integer
        END;
    END LOOP;
    RETURN answers;
END
$$;
