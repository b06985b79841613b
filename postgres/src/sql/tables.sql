-- The tables, shared by every version installed (install.sql): each made only when missing,
-- with its columns in the order that the versions before made them in (some `INSERT`s name
-- none), and its index for the sweep (sweep.sql) while it is still empty. Tables only grow:
-- a column is added where it is missing, never changed or dropped while a version that reads
-- it may run, so no statement here waits for a table lock once the tables are there (an
-- `ALTER TABLE … IF NOT EXISTS` takes its table's ACCESS EXCLUSIVE lock even when it changes
-- nothing, and a `CREATE INDEX IF NOT EXISTS` its SHARE lock). An index missing from a table
-- that already held rows is built `CONCURRENTLY` by the store after this transaction
-- (`schema.rs`).
--
-- Times are the server's (`clock_timestamp()`, read once per call after the name's lock, into
-- `call_time`), as µs-precise `timestamptz`. A lease is live while `expires > call_time`. Rows
-- whose leases, records and fence counters all ended are deleted by the calls that next touch
-- their name, and in batches by the sweep. `sweep_after` is when the sweep should look at a
-- row again: -infinity for a new row (its default, so no acquisition sets it), then the end
-- the sweep last found; the calls never write it, so an acquisition, an extension or a release
-- changes no indexed column (a HOT update, when the row's page has room).
--
-- `holder`: who took the lease, for the view `leases`: the session's `application_name` and,
-- over TCP, the client's address. A column default, so each acquisition's insert (and the
-- `excluded` row of its upsert) fills it without a parameter. Only built-ins: a default that
-- called a function of the schema would tie that function's version to the table.
DO $$
BEGIN
    -- A `Lock`'s lease (`secret` NULL once released), and its fence counter: the last fence
    -- issued, kept until `fence_until`, an hour after the last acquisition (or one TTL, if
    -- longer). `waited`: whether a call was refused while the lease was held, so that its
    -- release must `NOTIFY` (an unwaited release skips it: a notifying commit takes a
    -- database-wide lock). Written by the refusal while it holds the row's lock, so a release
    -- after it sees it. 1 marked; 0 and -1 unmarked (-1: a release found it marked and
    -- notified; `RETURNING` answers the row it leaves, so one statement both reads and clears
    -- the mark).
    IF pg_catalog.to_regclass('tower_lease.locks') IS NULL THEN
        CREATE TABLE tower_lease.locks (
            namespace text NOT NULL,
            name bytea NOT NULL,
            secret bytea,
            expires timestamptz NOT NULL,
            fence bigint NOT NULL DEFAULT 0,
            fence_until timestamptz,
            waited smallint NOT NULL DEFAULT 0,
            holder text DEFAULT pg_catalog.concat_ws('@',
                pg_catalog.current_setting('application_name'),
                pg_catalog.host(pg_catalog.inet_client_addr())),
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (namespace, name)
        );
        CREATE INDEX locks_sweep_after ON tower_lease.locks (sweep_after);
    END IF;

    -- An `RwLock`'s writer, its write intent (a refused writer of a phase-fair or
    -- writers-first lock), and the write generation (fence counter); its readers are rows of
    -- `readers`.
    IF pg_catalog.to_regclass('tower_lease.rwlocks') IS NULL THEN
        CREATE TABLE tower_lease.rwlocks (
            namespace text NOT NULL,
            name bytea NOT NULL,
            writer bytea,
            writer_expires timestamptz,
            intent bytea,
            intent_expires timestamptz,
            fence bigint NOT NULL DEFAULT 0,
            fence_until timestamptz,
            holder text DEFAULT pg_catalog.concat_ws('@',
                pg_catalog.current_setting('application_name'),
                pg_catalog.host(pg_catalog.inet_client_addr())),
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (namespace, name)
        );
        CREATE INDEX rwlocks_sweep_after ON tower_lease.rwlocks (sweep_after);
    END IF;

    IF pg_catalog.to_regclass('tower_lease.readers') IS NULL THEN
        CREATE TABLE tower_lease.readers (
            namespace text NOT NULL,
            name bytea NOT NULL,
            secret bytea NOT NULL,
            expires timestamptz NOT NULL,
            holder text DEFAULT pg_catalog.concat_ws('@',
                pg_catalog.current_setting('application_name'),
                pg_catalog.host(pg_catalog.inet_client_addr())),
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (namespace, name, secret)
        );
        CREATE INDEX readers_sweep_after ON tower_lease.readers (sweep_after);
    END IF;

    -- The waiting readers of a phase-fair `RwLock` (refused by a writer or an intent, in a
    -- bounded wait), until `expires`; a writer's release turns the live ones into its read
    -- phase (`phase`, `expires` then the phase's end): they come in before the next writer.
    IF pg_catalog.to_regclass('tower_lease.waiting_readers') IS NULL THEN
        CREATE TABLE tower_lease.waiting_readers (
            namespace text NOT NULL,
            name bytea NOT NULL,
            secret bytea NOT NULL,
            expires timestamptz NOT NULL,
            phase boolean NOT NULL DEFAULT false,
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (namespace, name, secret)
        );
        CREATE INDEX waiting_readers_sweep_after ON tower_lease.waiting_readers (sweep_after);
    END IF;

    IF pg_catalog.to_regclass('tower_lease.permits') IS NULL THEN
        CREATE TABLE tower_lease.permits (
            namespace text NOT NULL,
            name bytea NOT NULL,
            secret bytea NOT NULL,
            expires timestamptz NOT NULL,
            holder text DEFAULT pg_catalog.concat_ws('@',
                pg_catalog.current_setting('application_name'),
                pg_catalog.host(pg_catalog.inet_client_addr())),
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (namespace, name, secret)
        );
        CREATE INDEX permits_sweep_after ON tower_lease.permits (sweep_after);
    END IF;

    -- One idempotency key of `IdempotencyLayer`: its reservation (the holder's secret and
    -- lease, and the request fingerprint it runs for), its completed record (fingerprint,
    -- response, the completing secret), the at-most-once marker, and the fence counter of
    -- fenced reservations.
    IF pg_catalog.to_regclass('tower_lease.idempotency') IS NULL THEN
        CREATE TABLE tower_lease.idempotency (
            namespace text NOT NULL,
            name bytea NOT NULL,
            secret bytea,
            lease_expires timestamptz,
            fingerprint bytea,
            response bytea,
            completed_by bytea,
            record_expires timestamptz,
            unknown_expires timestamptz,
            fence bigint NOT NULL DEFAULT 0,
            fence_until timestamptz,
            holder text DEFAULT pg_catalog.concat_ws('@',
                pg_catalog.current_setting('application_name'),
                pg_catalog.host(pg_catalog.inet_client_addr())),
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (namespace, name)
        );
        CREATE INDEX idempotency_sweep_after ON tower_lease.idempotency (sweep_after);
    END IF;

    -- The names of the other kinds ('rw', 'p', 'v') that a refused call waits on, as `waited`
    -- of `locks`: written under the name's advisory lock by the refusal, deleted (and then
    -- notified) by the next release under the same lock. A mark nobody refreshed for a minute
    -- is swept (a waiter that is still refused writes it again, and `since` is refreshed every
    -- 10 s of it), so a lock whose holder died does not keep one forever.
    IF pg_catalog.to_regclass('tower_lease.waited') IS NULL THEN
        CREATE TABLE tower_lease.waited (
            kind text NOT NULL,
            namespace text NOT NULL,
            name bytea NOT NULL,
            since timestamptz NOT NULL,
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (kind, namespace, name)
        );
        CREATE INDEX waited_sweep_after ON tower_lease.waited (sweep_after);
    END IF;

    -- Keys claimed by an application's own transaction (`tower_lease_postgres::claim`): the
    -- effect of that request committed. Written only by `claim`, inside the application's
    -- transaction. `claimed_at`: when, what a second claim of the key answers
    -- (`claimed_before`); NULL for a claim of a version that did not record it.
    IF pg_catalog.to_regclass('tower_lease.claims') IS NULL THEN
        CREATE TABLE tower_lease.claims (
            namespace text NOT NULL,
            name bytea NOT NULL,
            fingerprint bytea,
            expires timestamptz NOT NULL,
            claimed_at timestamptz,
            sweep_after timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (namespace, name)
        );
        CREATE INDEX claims_sweep_after ON tower_lease.claims (sweep_after);
    END IF;
END
$$;

-- The columns that the tables of older versions lack, added only where missing.
DO $$
DECLARE
    holder_default constant text := $holder$ DEFAULT pg_catalog.concat_ws('@',
        pg_catalog.current_setting('application_name'),
        pg_catalog.host(pg_catalog.inet_client_addr()))$holder$;
    added record;
BEGIN
    FOR added IN
        SELECT * FROM (VALUES
            ('locks', 'waited', 'smallint NOT NULL DEFAULT 0'),
            ('locks', 'holder', 'text' || holder_default),
            ('rwlocks', 'holder', 'text' || holder_default),
            ('readers', 'holder', 'text' || holder_default),
            ('permits', 'holder', 'text' || holder_default),
            ('idempotency', 'holder', 'text' || holder_default),
            ('claims', 'claimed_at', 'timestamptz'),
            ('locks', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$),
            ('rwlocks', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$),
            ('readers', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$),
            ('waiting_readers', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$),
            ('permits', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$),
            ('idempotency', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$),
            ('claims', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$),
            ('waited', 'sweep_after', $d$timestamptz NOT NULL DEFAULT '-infinity'$d$)
        ) AS wanted (table_name, column_name, definition)
    LOOP
        IF NOT EXISTS (
            SELECT FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = pg_catalog.to_regclass('tower_lease.' || added.table_name)
              AND a.attname = added.column_name AND NOT a.attisdropped
        ) THEN
            EXECUTE pg_catalog.format('ALTER TABLE tower_lease.%I ADD COLUMN %I %s',
                added.table_name, added.column_name, added.definition);
        END IF;
    END LOOP;
END
$$;
