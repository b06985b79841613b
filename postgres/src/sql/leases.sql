-- What operators look at: `tower_lease.leases`, every live lease. It calls the functions of
-- the newest version installed: that version installs it, last (and install.sql drops it
-- first), and an older version installed after it leaves it alone.

-- A name as text where it is UTF-8 (as most are: `Lock<str>`, `Lock<u64>`'s decimal), else
-- `\x` and its bytes in hex.
CREATE FUNCTION tower_lease.readable_name(lock_name bytea)
RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN pg_catalog.convert_from(lock_name, 'UTF8');
EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
    RETURN '\x' || pg_catalog.encode(lock_name, 'hex');
END
$$;

-- One row per live lease: `kind` ('lock', 'read', 'write', 'permit', 'idempotency' for a key's
-- reservation while its request runs), the namespace and the name, who took it (`holder`:
-- the session's `application_name`, and the client's address over TCP), when it ends unless
-- extended (`expires`, on the server's clock), and the last fence issued on the name while its
-- counter lives (NULL for none, and for permits). The holders' secrets are not shown: they
-- are what extends and releases a lease.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM tower_lease.schema_version v WHERE v.version > {version}) THEN
        CREATE VIEW tower_lease.leases AS
            SELECT 'lock'::text AS kind, l.namespace, tower_lease.readable_name(l.name) AS name,
                   l.holder, l.expires,
                   CASE WHEN l.fence_until > pg_catalog.statement_timestamp() THEN l.fence END AS fence
            FROM tower_lease.locks l
            WHERE l.expires > pg_catalog.statement_timestamp()
        UNION ALL
            SELECT 'write', w.namespace, tower_lease.readable_name(w.name), w.holder,
                   w.writer_expires,
                   CASE WHEN w.fence_until > pg_catalog.statement_timestamp() THEN w.fence END
            FROM tower_lease.rwlocks w
            WHERE w.writer_expires > pg_catalog.statement_timestamp()
        UNION ALL
            SELECT 'read', r.namespace, tower_lease.readable_name(r.name), r.holder, r.expires,
                   CASE WHEN w.fence_until > pg_catalog.statement_timestamp() THEN w.fence END
            FROM tower_lease.readers r
            LEFT JOIN tower_lease.rwlocks w ON w.namespace = r.namespace AND w.name = r.name
            WHERE r.expires > pg_catalog.statement_timestamp()
        UNION ALL
            SELECT 'permit', p.namespace, tower_lease.readable_name(p.name), p.holder, p.expires,
                   NULL::bigint
            FROM tower_lease.permits p
            WHERE p.expires > pg_catalog.statement_timestamp()
        UNION ALL
            SELECT 'idempotency', i.namespace, tower_lease.readable_name(i.name), i.holder,
                   i.lease_expires,
                   CASE WHEN i.fence_until > pg_catalog.statement_timestamp() THEN i.fence END
            FROM tower_lease.idempotency i
            WHERE i.lease_expires > pg_catalog.statement_timestamp();
    END IF;
END
$$;
