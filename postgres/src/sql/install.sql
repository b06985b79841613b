-- The installation of one version of the schema `tower_lease` beside the versions already
-- there (`schema.rs` puts this version's number for {version}, and the oldest version whose
-- calls may run beside its own for {oldest_peer}). Tables are shared by every version and only
-- ever grow (tables.sql); each version's functions and type carry its number (`lock_acquire`
-- is installed as `lock_acquire_v{version}`), so the replicas of the version before keep
-- calling theirs while the new ones start, and after a rollback. Run in one transaction under
-- the crate's advisory lock.

-- The schema, made only when missing: `CREATE SCHEMA IF NOT EXISTS` asks for the database's
-- CREATE privilege even when it exists, and a DBA may have made it for a user without it. A
-- schema that exists is ours only when empty or holding our version table: the installer
-- makes tables in it, and a later contraction drops functions from it.
DO $$
DECLARE
    foreign_objects text;
BEGIN
    IF pg_catalog.to_regnamespace('tower_lease') IS NULL THEN
        CREATE SCHEMA tower_lease;
    ELSIF pg_catalog.to_regclass('tower_lease.schema_version') IS NULL THEN
        SELECT pg_catalog.string_agg(found.object_name, ', ') INTO foreign_objects FROM (
            SELECT c.relname::text AS object_name FROM pg_catalog.pg_class c
            WHERE c.relnamespace = 'tower_lease'::regnamespace
            UNION ALL
            SELECT p.proname::text FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'tower_lease'::regnamespace
            UNION ALL
            SELECT t.typname::text FROM pg_catalog.pg_type t
            WHERE t.typnamespace = 'tower_lease'::regnamespace
              AND t.typrelid = 0 AND t.typcategory <> 'A'
            LIMIT 5) found;
        IF foreign_objects IS NOT NULL THEN
            RAISE EXCEPTION 'the schema % holds objects that tower-lease-postgres did not make '
                '(%): give the leases a schema of their own', 'tower_lease'::regnamespace,
                foreign_objects;
        END IF;
    END IF;
END
$$;

-- One row per version installed, with the oldest version whose calls may run beside it
-- (NULL in rows of the versions before these rows had it).
CREATE TABLE IF NOT EXISTS tower_lease.schema_version (
    version integer NOT NULL
);
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_attribute a
        WHERE a.attrelid = 'tower_lease.schema_version'::regclass
          AND a.attname = 'oldest_peer' AND NOT a.attisdropped
    ) THEN
        ALTER TABLE tower_lease.schema_version ADD COLUMN oldest_peer integer;
    END IF;
END
$$;

-- A newer version that no longer runs beside this one refuses it: this version's calls would
-- not keep its promises.
DO $$
DECLARE
    newest record;
BEGIN
    SELECT v.version, coalesce(v.oldest_peer, v.version) AS oldest_peer INTO newest
    FROM tower_lease.schema_version v ORDER BY v.version DESC LIMIT 1;
    IF newest.version > {version} AND newest.oldest_peer > {version} THEN
        RAISE EXCEPTION 'the schema % is at version %, which runs beside versions % and newer '
            'only: this SQL installs version {version}', 'tower_lease'::regnamespace,
            newest.version, newest.oldest_peer;
    END IF;
END
$$;

-- The view `leases` belongs to the newest version installed, whose functions it calls: it goes
-- now (before any function it calls is dropped) and comes back last (leases.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM tower_lease.schema_version v WHERE v.version > {version}) THEN
        DROP VIEW IF EXISTS tower_lease.leases;
    END IF;
END
$$;
