-- FROZEN FIXTURE: the schema of version 1 as the release before SchemaVersion 2 applied it (below this
-- header, byte for byte the schema.sql of commit 83c3bc04e9f00ecdc6aa5bc24d239d3dd82e92bd), which
-- migrate_test.go applies to test Migrate's upgrade from it and the records it keeps. Never edit it, nor
-- derive it from schema.sql: its near-copies of schema.sql's functions are the point, the old text that a
-- deployed database still holds. Schema version 3 adds testdata/schema_v2.sql, schema.sql as released.
--
-- The schema of package pgstore (github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore),
-- version 1. pgstore.Migrate applies it in one transaction, under an advisory lock; it is idempotent
-- (CREATE ... IF NOT EXISTS, CREATE OR REPLACE). __SCHEMA__ stands for the store's schema (pgstore.WithSchema,
-- default public), quoted. `go run ./cmd/pgstore sql -schema NAME` prints it with the name filled in.

-- One row per record key: absent, in progress under a lease (token set, record NULL), or completed
-- (record set, token NULL). Timestamps are the database's clock (statement_timestamp()), so every replica
-- judges leases and TTLs by one clock.
CREATE TABLE IF NOT EXISTS __SCHEMA__.resilience_idempotency (
    id            bytea       PRIMARY KEY,          -- SHA-256 of the record key (scope, method, key), parts length-prefixed
    scope_id      bytea       NOT NULL,             -- SHA-256 of the scope: the quota's unit (the scope itself is not stored)
    part          smallint    NOT NULL,             -- the scope's partition of the key (pgstore.WithScopePartitions)
    method        text        NOT NULL,             -- the full method, for operators
    key           text        NOT NULL,             -- the idempotency key, for operators
    fingerprint   bytea       NOT NULL,             -- SHA-256 of the request
    token         text,                             -- the owner's token while in progress
    lease_until   timestamptz,                      -- while in progress: the lease's end
    record        bytea,                            -- once completed: the outcome (idempotency.Record.MarshalBinary)
    retain_until  timestamptz,                      -- once completed: the minimum retention's end
    expires_at    timestamptz NOT NULL,             -- the row's end: its lease's, or its TTL's once completed or past a phase
    size          integer     NOT NULL,             -- bytes the row holds, as its scope's quota counts them
    charged       integer,                          -- bytes charged to the quota table for it; NULL: not counted
    phases        text[]      NOT NULL DEFAULT '{}', -- the phases committed (pgstore.Phase), in order
    phase_results bytea[]     NOT NULL DEFAULT '{}'  -- what each returned
);
-- The reaper's: rows past their end, oldest first.
CREATE INDEX IF NOT EXISTS resilience_idempotency_expires ON __SCHEMA__.resilience_idempotency (expires_at);
-- A scope at its quota: its own ended rows, and its completed records past their minimum retention, oldest first.
CREATE INDEX IF NOT EXISTS resilience_idempotency_scope ON __SCHEMA__.resilience_idempotency (scope_id, part, expires_at);
CREATE INDEX IF NOT EXISTS resilience_idempotency_retain ON __SCHEMA__.resilience_idempotency (scope_id, part, retain_until)
    WHERE record IS NOT NULL;

-- What each scope partition holds, as the quota counts it: rows whose charged is not NULL.
CREATE TABLE IF NOT EXISTS __SCHEMA__.resilience_idempotency_quota (
    scope_id bytea    NOT NULL,
    part     smallint NOT NULL,
    entries  bigint   NOT NULL DEFAULT 0,
    bytes    bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (scope_id, part)
);

-- The schema's version, for pgstore.Check.
CREATE TABLE IF NOT EXISTS __SCHEMA__.resilience_idempotency_version (version integer NOT NULL);
INSERT INTO __SCHEMA__.resilience_idempotency_version (version)
    SELECT 1 WHERE NOT EXISTS (SELECT FROM __SCHEMA__.resilience_idempotency_version);

-- Lock order, so that no two statements wait on each other: a record row, then its scope partition's
-- quota row. The one statement that holds a quota row and then takes record rows (resilience_idem_room's
-- eviction) takes them with SKIP LOCKED, never waiting.

-- resilience_idem_ms is an interval in whole milliseconds, at least 1.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_ms(d interval) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT greatest(1, ceil(extract(epoch FROM d) * 1000))::bigint $$;

-- resilience_idem_uncharge takes a removed row's charge off its scope partition's quota.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_uncharge(p_scope bytea, p_part smallint, p_charged integer)
RETURNS void LANGUAGE sql AS $$
    UPDATE __SCHEMA__.resilience_idempotency_quota SET entries = entries - 1, bytes = bytes - p_charged
    WHERE scope_id = p_scope AND part = p_part AND p_charged IS NOT NULL
$$;

-- resilience_idem_room makes room for one more entry of p_size bytes in a scope partition, under the lock
-- of its quota row: it drops the partition's ended rows, then evicts its completed records past their
-- minimum retention, oldest first, until the entry fits. With p_reserve it charges the entry to the quota
-- when it fits. It returns 0 when the entry fits, else the milliseconds until room may come: the soonest
-- end of a lease or of a minimum retention in the partition.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_room(p_scope bytea, p_part smallint, p_size integer,
    p_max_entries bigint, p_max_bytes bigint, p_reserve boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := statement_timestamp();
    q __SCHEMA__.resilience_idempotency_quota%ROWTYPE;
    gone record;
    soonest timestamptz;
BEGIN
    INSERT INTO __SCHEMA__.resilience_idempotency_quota (scope_id, part) VALUES (p_scope, p_part) ON CONFLICT DO NOTHING;
    SELECT * INTO q FROM __SCHEMA__.resilience_idempotency_quota WHERE scope_id = p_scope AND part = p_part FOR UPDATE;
    FOR i IN 1..64 LOOP
        IF (p_max_entries = 0 OR q.entries + 1 <= p_max_entries) AND (p_max_bytes = 0 OR q.bytes + p_size <= p_max_bytes) THEN
            IF p_reserve THEN
                UPDATE __SCHEMA__.resilience_idempotency_quota SET entries = entries + 1, bytes = bytes + p_size
                WHERE scope_id = p_scope AND part = p_part;
            END IF;
            RETURN 0;
        END IF;
        -- The oldest row that may go: ended, else completed and past its minimum retention.
        DELETE FROM __SCHEMA__.resilience_idempotency WHERE id = (
            SELECT id FROM __SCHEMA__.resilience_idempotency
            WHERE scope_id = p_scope AND part = p_part AND expires_at <= now
            ORDER BY expires_at LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING charged INTO gone;
        IF NOT FOUND THEN
            DELETE FROM __SCHEMA__.resilience_idempotency WHERE id = (
                SELECT id FROM __SCHEMA__.resilience_idempotency
                WHERE scope_id = p_scope AND part = p_part AND record IS NOT NULL AND retain_until <= now
                ORDER BY retain_until LIMIT 1 FOR UPDATE SKIP LOCKED)
            RETURNING charged INTO gone;
        END IF;
        EXIT WHEN NOT FOUND;
        IF gone.charged IS NOT NULL THEN
            q.entries := q.entries - 1;
            q.bytes := q.bytes - gone.charged;
            UPDATE __SCHEMA__.resilience_idempotency_quota SET entries = q.entries, bytes = q.bytes
            WHERE scope_id = p_scope AND part = p_part;
        END IF;
    END LOOP;
    SELECT min(t) INTO soonest FROM (
        (SELECT retain_until AS t FROM __SCHEMA__.resilience_idempotency
         WHERE scope_id = p_scope AND part = p_part AND record IS NOT NULL ORDER BY retain_until LIMIT 1)
        UNION ALL
        (SELECT expires_at FROM __SCHEMA__.resilience_idempotency
         WHERE scope_id = p_scope AND part = p_part AND record IS NULL ORDER BY expires_at LIMIT 1)) s;
    RETURN __SCHEMA__.resilience_idem_ms(coalesce(soonest, now + interval '1 second') - now);
END $$;

-- resilience_idem_state answers a claim of a row found live (not ended): 4 mismatch, 2 completed,
-- 3 in progress (with the lease's rest), or 0 when the caller may own it: its own token (a claim retried
-- after its reply was lost), or a row of its own request whose lease ended with phases committed (a
-- takeover that resumes them).
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_state(r __SCHEMA__.resilience_idempotency, p_fp bytea,
    p_token text, now timestamptz, OUT state smallint, OUT wait_ms bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    wait_ms := 0;
    IF r.fingerprint <> p_fp THEN
        state := 4;
    ELSIF r.record IS NOT NULL THEN
        state := 2;
    ELSIF r.lease_until > now AND r.token IS DISTINCT FROM p_token THEN
        state := 3;
        wait_ms := __SCHEMA__.resilience_idem_ms(r.lease_until - now);
    ELSE
        state := 0;
    END IF;
END $$;

-- resilience_idem_claim is Store.Claim (lease mode), one autocommit statement: it returns the state
-- (1 owned, 2 completed with the record, 3 in progress, 4 mismatch, 5 refused for the scope's quota) and,
-- for 3 and 5, the milliseconds to wait. A key held by a joined transaction (joined mode on the same
-- schema) makes it wait for that transaction up to p_lock_ms, then fail with lock_not_available.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_claim(p_id bytea, p_scope bytea, p_part smallint,
    p_method text, p_key text, p_fp bytea, p_token text, p_lease_ms bigint, p_size integer,
    p_max_entries bigint, p_max_bytes bigint, p_lock_ms bigint,
    OUT state smallint, OUT record bytea, OUT wait_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := statement_timestamp();
    lease interval := p_lease_ms * interval '1 millisecond';
    quota boolean := p_max_entries > 0 OR p_max_bytes > 0; -- off: rows are not charged, and no quota row is locked
    r __SCHEMA__.resilience_idempotency%ROWTYPE;
BEGIN
    wait_ms := 0;
    -- A live completed record is answered (replay or mismatch) without a row lock: the lock would give the
    -- statement a transaction id, and its commit a WAL flush, a disk write per replay. A completed row only
    -- ever goes away, so the committed version is the answer the locking read below would give.
    SELECT * INTO r FROM __SCHEMA__.resilience_idempotency WHERE id = p_id;
    IF FOUND AND r.expires_at > now AND r.record IS NOT NULL THEN
        state := CASE WHEN r.fingerprint <> p_fp THEN 4 ELSE 2 END;
        IF state = 2 THEN
            record := r.record;
        END IF;
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', p_lock_ms::text, true);
    FOR attempt IN 1..3 LOOP
        SELECT * INTO r FROM __SCHEMA__.resilience_idempotency WHERE id = p_id FOR UPDATE;
        IF FOUND AND r.expires_at > now THEN
            SELECT s.state, s.wait_ms INTO state, wait_ms FROM __SCHEMA__.resilience_idem_state(r, p_fp, p_token, now) s;
            IF state = 2 THEN
                record := r.record;
            END IF;
            IF state <> 0 THEN
                RETURN;
            END IF;
            UPDATE __SCHEMA__.resilience_idempotency SET token = p_token, lease_until = now + lease,
                expires_at = greatest(expires_at, now + lease) WHERE id = p_id;
            state := 1;
            RETURN;
        END IF;
        IF FOUND THEN -- ended: the key is free
            DELETE FROM __SCHEMA__.resilience_idempotency WHERE id = p_id;
            PERFORM __SCHEMA__.resilience_idem_uncharge(r.scope_id, r.part, r.charged);
        END IF;
        IF quota THEN
            wait_ms := __SCHEMA__.resilience_idem_room(p_scope, p_part, p_size, p_max_entries, p_max_bytes, true);
            IF wait_ms > 0 THEN
                state := 5;
                RETURN;
            END IF;
        END IF;
        INSERT INTO __SCHEMA__.resilience_idempotency (id, scope_id, part, method, key, fingerprint, token,
            lease_until, expires_at, size, charged)
        VALUES (p_id, p_scope, p_part, p_method, p_key, p_fp, p_token, now + lease, now + lease, p_size,
            CASE WHEN quota THEN p_size END)
        ON CONFLICT (id) DO NOTHING;
        IF FOUND THEN
            state := 1;
            RETURN;
        END IF;
        -- Claimed by another since this one looked: give its room back, and look again.
        PERFORM __SCHEMA__.resilience_idem_uncharge(p_scope, p_part, CASE WHEN quota THEN p_size END);
    END LOOP;
    RAISE EXCEPTION 'resilience_idem_claim: the key changed under three claims in a row';
END $$;

-- resilience_idem_complete is Store.Complete (lease mode): true when stored, false when p_token does not
-- own the key. An ended row, or none, is an absent key: the record is stored all the same.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_complete(p_id bytea, p_scope bytea, p_part smallint,
    p_method text, p_key text, p_fp bytea, p_token text, p_record bytea, p_size integer, p_ttl_ms bigint,
    p_retain_ms bigint, p_quota boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := statement_timestamp();
    r __SCHEMA__.resilience_idempotency%ROWTYPE;
BEGIN
    SELECT * INTO r FROM __SCHEMA__.resilience_idempotency WHERE id = p_id FOR UPDATE;
    IF FOUND AND r.token = p_token AND r.record IS NULL THEN
        UPDATE __SCHEMA__.resilience_idempotency SET record = p_record, token = NULL, lease_until = NULL,
            retain_until = now + p_retain_ms * interval '1 millisecond',
            expires_at = now + p_ttl_ms * interval '1 millisecond', size = p_size,
            charged = CASE WHEN r.charged IS NOT NULL THEN p_size END, phases = '{}', phase_results = '{}'
        WHERE id = p_id;
        IF r.charged IS NOT NULL THEN
            UPDATE __SCHEMA__.resilience_idempotency_quota SET bytes = bytes + p_size - r.charged
            WHERE scope_id = r.scope_id AND part = r.part;
        END IF;
        RETURN true;
    END IF;
    IF FOUND AND r.expires_at > now THEN
        RETURN false; -- another owner's, or completed
    END IF;
    IF FOUND THEN
        DELETE FROM __SCHEMA__.resilience_idempotency WHERE id = p_id;
        PERFORM __SCHEMA__.resilience_idem_uncharge(r.scope_id, r.part, r.charged);
    END IF;
    INSERT INTO __SCHEMA__.resilience_idempotency (id, scope_id, part, method, key, fingerprint, record,
        retain_until, expires_at, size, charged)
    VALUES (p_id, p_scope, p_part, p_method, p_key, p_fp, p_record, now + p_retain_ms * interval '1 millisecond',
        now + p_ttl_ms * interval '1 millisecond', p_size, CASE WHEN p_quota THEN p_size END)
    ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false; -- claimed by another since
    END IF;
    IF NOT p_quota THEN
        RETURN true;
    END IF;
    INSERT INTO __SCHEMA__.resilience_idempotency_quota AS q (scope_id, part, entries, bytes)
    VALUES (p_scope, p_part, 1, p_size)
    ON CONFLICT (scope_id, part) DO UPDATE SET entries = q.entries + 1, bytes = q.bytes + p_size;
    RETURN true;
END $$;

-- resilience_idem_release is Store.Release: true when released, false when p_token does not own the key.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_release(p_id bytea, p_token text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    DELETE FROM __SCHEMA__.resilience_idempotency WHERE id = p_id AND token = p_token AND record IS NULL
    RETURNING scope_id, part, charged INTO r;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM __SCHEMA__.resilience_idem_uncharge(r.scope_id, r.part, r.charged);
    RETURN true;
END $$;

-- resilience_idem_claim_tx is the claim of joined mode, run inside the transaction the handler joins: the
-- row it inserts stays invisible to others until that transaction commits, and a concurrent claim of the
-- same key waits on it (up to lock_timeout) and then finds it completed, or free again after a rollback.
-- It returns the state as resilience_idem_claim does (5: the partition is over its quota, read without a
-- lock; nothing is reserved: joined rows are charged after they commit, by resilience_idem_charge), and,
-- for an owned row that resumes, the phases already committed.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_claim_tx(p_id bytea, p_scope bytea, p_part smallint,
    p_method text, p_key text, p_fp bytea, p_token text, p_lease_ms bigint, p_size integer,
    p_max_entries bigint, p_max_bytes bigint,
    OUT state smallint, OUT record bytea, OUT wait_ms bigint, OUT phases text[], OUT phase_results bytea[])
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := statement_timestamp();
    lease interval := p_lease_ms * interval '1 millisecond';
    r __SCHEMA__.resilience_idempotency%ROWTYPE;
    q __SCHEMA__.resilience_idempotency_quota%ROWTYPE;
BEGIN
    wait_ms := 0;
    FOR attempt IN 1..3 LOOP
        INSERT INTO __SCHEMA__.resilience_idempotency (id, scope_id, part, method, key, fingerprint, token,
            lease_until, expires_at, size)
        VALUES (p_id, p_scope, p_part, p_method, p_key, p_fp, p_token, now + lease, now + lease, p_size)
        ON CONFLICT (id) DO NOTHING;
        IF FOUND THEN
            SELECT * INTO q FROM __SCHEMA__.resilience_idempotency_quota WHERE scope_id = p_scope AND part = p_part;
            IF FOUND AND ((p_max_entries > 0 AND q.entries + 1 > p_max_entries) OR
                          (p_max_bytes > 0 AND q.bytes + p_size > p_max_bytes)) THEN
                state := 5;
                wait_ms := 1;
                RETURN;
            END IF;
            state := 1;
            RETURN;
        END IF;
        -- A committed row holds the key. Lock it: a live owner that committed phases holds its lock, and
        -- this waits for it, up to lock_timeout.
        SELECT * INTO r FROM __SCHEMA__.resilience_idempotency WHERE id = p_id FOR UPDATE;
        CONTINUE WHEN NOT FOUND; -- deleted since (released, reaped): insert again
        IF r.expires_at > now THEN
            SELECT s.state, s.wait_ms INTO state, wait_ms FROM __SCHEMA__.resilience_idem_state(r, p_fp, p_token, now) s;
            IF state = 2 THEN
                record := r.record;
            END IF;
            IF state <> 0 THEN
                RETURN;
            END IF;
            UPDATE __SCHEMA__.resilience_idempotency SET token = p_token, lease_until = now + lease,
                expires_at = greatest(expires_at, now + lease) WHERE id = p_id;
            state := 1;
            phases := r.phases;
            phase_results := r.phase_results;
            RETURN;
        END IF;
        -- Ended: the key is free. Take the row over as a fresh claim; its charge stays until this
        -- transaction's row is charged (or, rolled back, the ended row comes back as it was).
        UPDATE __SCHEMA__.resilience_idempotency SET method = p_method, key = p_key, fingerprint = p_fp,
            token = p_token, lease_until = now + lease, record = NULL, retain_until = NULL, expires_at = now + lease,
            size = p_size, phases = '{}', phase_results = '{}'
        WHERE id = p_id;
        state := 1;
        RETURN;
    END LOOP;
    RAISE EXCEPTION 'resilience_idem_claim_tx: the key changed under three claims in a row';
END $$;

-- resilience_idem_complete_tx completes the joined transaction's own row, in that transaction.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_complete_tx(p_id bytea, p_token text,
    p_record bytea, p_size integer, p_ttl_ms bigint, p_retain_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := clock_timestamp();
BEGIN
    UPDATE __SCHEMA__.resilience_idempotency SET record = p_record, token = NULL,
        lease_until = NULL, retain_until = now + p_retain_ms * interval '1 millisecond',
        expires_at = now + p_ttl_ms * interval '1 millisecond', size = p_size, phases = '{}', phase_results = '{}'
    WHERE id = p_id AND token = p_token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'resilience_idem_complete_tx: the joined transaction no longer holds its row'
            USING ERRCODE = 'P0002';
    END IF;
END $$;

-- resilience_idem_phase commits a phase's recovery point in the joined transaction, and renews the
-- lease: once committed, the row is visible in progress, and a retry of the same request resumes after
-- this phase when the owner is gone (its lock released) and its lease has ended.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_phase(p_id bytea, p_token text, p_name text,
    p_result bytea, p_lease_ms bigint, p_ttl_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := clock_timestamp();
BEGIN
    UPDATE __SCHEMA__.resilience_idempotency SET phases = phases || p_name,
        phase_results = phase_results || coalesce(p_result, ''::bytea),
        lease_until = now + p_lease_ms * interval '1 millisecond',
        expires_at = greatest(expires_at, now + p_ttl_ms * interval '1 millisecond'),
        size = size + octet_length(p_name) + octet_length(coalesce(p_result, ''::bytea))
    WHERE id = p_id AND token = p_token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'resilience_idem_phase: the joined transaction no longer holds its row' USING ERRCODE = 'P0002';
    END IF;
END $$;

-- resilience_idem_relock takes the lock of the joined call's row again, in the transaction that follows a
-- phase's commit; false when another owner has taken the row over since.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_relock(p_id bytea, p_token text)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM __SCHEMA__.resilience_idempotency WHERE id = p_id AND token = p_token FOR UPDATE)
$$;

-- resilience_idem_charge charges a committed joined row to its scope partition's quota, in a transaction
-- of its own after the joined one committed, with synchronous_commit off: the quota row's lock is held for
-- this short transaction only, never across a handler or a durable commit. A crash before it leaves the
-- row uncharged (counted by no quota), never charged twice.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_charge(p_id bytea)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE __SCHEMA__.resilience_idempotency n SET charged = n.size
    FROM (SELECT id, charged FROM __SCHEMA__.resilience_idempotency WHERE id = p_id FOR UPDATE) o
    WHERE n.id = o.id AND n.charged IS DISTINCT FROM n.size
    RETURNING n.scope_id, n.part, n.size, o.charged INTO r;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO __SCHEMA__.resilience_idempotency_quota AS q (scope_id, part, entries, bytes)
    VALUES (r.scope_id, r.part, 1, r.size)
    ON CONFLICT (scope_id, part) DO UPDATE
        SET entries = q.entries + CASE WHEN r.charged IS NULL THEN 1 ELSE 0 END,
            bytes = q.bytes + r.size - coalesce(r.charged, 0);
END $$;

-- resilience_idem_reap deletes up to p_limit rows past their end, oldest first, skipping rows a claim has
-- locked, and takes their charges off the quota; it returns how many it deleted. One replica reaps at a
-- time (an advisory lock: the only statement that holds several quota rows); the others return 0 at once.
-- synchronous_commit is off: a reap lost in a crash is done again.
CREATE OR REPLACE FUNCTION __SCHEMA__.resilience_idem_reap(p_limit integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('resilience_idem_reap ' || '__SCHEMA__')) THEN
        RETURN 0;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH gone AS (
        DELETE FROM __SCHEMA__.resilience_idempotency WHERE id IN (
            SELECT id FROM __SCHEMA__.resilience_idempotency WHERE expires_at <= statement_timestamp()
            ORDER BY expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING scope_id, part, charged),
    agg AS (
        SELECT scope_id, part, count(*) AS n, count(charged) AS entries, coalesce(sum(charged), 0) AS bytes
        FROM gone GROUP BY scope_id, part),
    upd AS (
        UPDATE __SCHEMA__.resilience_idempotency_quota q SET entries = q.entries - agg.entries, bytes = q.bytes - agg.bytes
        FROM agg WHERE q.scope_id = agg.scope_id AND q.part = agg.part AND agg.entries > 0)
    SELECT coalesce(sum(agg.n), 0) INTO n FROM agg;
    RETURN n;
END $$;
