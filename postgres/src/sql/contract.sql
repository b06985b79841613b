-- Drops the functions and types of the versions installed whose number is {versions} (see
-- `schema.rs`), and their rows. Functions and types of this crate carry their version's number
-- (`lock_acquire_v9`); those of the versions before the numbers (8 and older) are the names
-- without one in {legacy_names}. Nothing else in the schema is touched.
DO $$
DECLARE
    legacy integer := (
        SELECT pg_catalog.max(v.version) FROM tower_lease.schema_version v WHERE v.version <= 8);
    made record;
BEGIN
    FOR made IN
        SELECT p.oid::regprocedure AS signature,
               CASE WHEN p.proname ~ '_v[0-9]+$'
                    THEN pg_catalog.substring(p.proname, '_v([0-9]+)$')::integer
                    WHEN p.proname = ANY ({legacy_names}) THEN legacy
               END AS made_in
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'tower_lease'::regnamespace
    LOOP
        IF made.made_in {versions} THEN
            EXECUTE pg_catalog.format('DROP FUNCTION %s', made.signature);
        END IF;
    END LOOP;
    FOR made IN
        SELECT t.oid::regtype AS signature,
               CASE WHEN t.typname ~ '_v[0-9]+$'
                    THEN pg_catalog.substring(t.typname, '_v([0-9]+)$')::integer
                    WHEN t.typname = 'acquisition' THEN legacy
               END AS made_in
        FROM pg_catalog.pg_type t
        JOIN pg_catalog.pg_class c ON c.oid = t.typrelid AND c.relkind = 'c'
        WHERE t.typnamespace = 'tower_lease'::regnamespace
    LOOP
        IF made.made_in {versions} THEN
            EXECUTE pg_catalog.format('DROP TYPE %s', made.signature);
        END IF;
    END LOOP;
    DELETE FROM tower_lease.schema_version v WHERE v.version {versions};
END
$$;
