-- liveness: dead workers found by their database session, not by their lease.
--
-- Each worker process registers here on a connection it keeps for its whole life, holding a
-- session-level advisory lock keyed on its worker id. When the process dies, PostgreSQL ends the
-- session and drops the lock; every worker runs reclaim_lost_workers() twice a second, which
-- reclaims the rows of a registered worker whose lock is gone, exactly as an expired lease is
-- (end_leases(), claim.sql). The lock's absence is trusted only for a registration made in the
-- current lifetime of the postmaster (a restart drops every lock while the workers live on), and
-- only after it has been missing for a grace (a worker whose liveness connection was cut registers
-- again well within it). A worker alive but stuck still holds its lock: the lease applies to it.
-- A new process under an id whose previous process died reclaims that process's rows when it
-- registers; a second live process under an id in use cannot take the lock and is refused.
-- A process that registers again (its liveness connection was lost: a restart, a failover) names
-- the leases it still holds, and every other row leased under its id goes back to the queue at once
-- (release_unheld_leases): after a failover to a standby that was behind, the new primary still
-- shows rows `delivering` whose outcomes the process wrote to the old one and forgot, and they would
-- count against their endpoints' max_in_flight, with nobody to finish them, until their leases ran out.

-- The advisory lock key of a worker id: the same in every session and every release.
CREATE OR REPLACE FUNCTION webhooks.worker_lock_key(p_worker_id text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended('webhook-worker liveness:' || p_worker_id, 0);
$$;

-- The advisory locks held in this database, as the (high, low) halves of their bigint keys.
CREATE OR REPLACE FUNCTION webhooks.held_advisory_locks() RETURNS TABLE (key_high bigint, key_low bigint)
LANGUAGE sql STABLE AS $$
    SELECT l.classid::bigint, l.objid::bigint FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database());
$$;

-- The rows a lost worker held, back to the queue under the rules of an expired lease (end_leases(),
-- claim.sql), saying that the lease ended early because its worker was lost; idle workers are woken.
CREATE OR REPLACE FUNCTION webhooks.reclaim_rows_of(p_worker_id text) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    v_count integer;
BEGIN
    v_count := webhooks.end_leases(
        ARRAY(SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
              WHERE q.status = 'delivering' AND q.locked_by = p_worker_id
              FOR UPDATE SKIP LOCKED),
        'its worker was lost', 'its worker was lost (database session ended)');
    IF v_count > 0 THEN
        -- the rows are due now: wake idle workers rather than let them sleep out their poll
        PERFORM pg_notify('webhooks_queue', '');
    END IF;
    RETURN v_count;
END;
$$;

-- Registers the calling session as the live process of a worker id, holding the id's advisory
-- lock until the session ends. Refused (registered = false, with who holds the id) when another
-- session holds it. A new process under the id reclaims what an earlier, dead process of the same
-- id left in flight (`reclaimed`); the same process registering again after a lost connection or
-- a PostgreSQL restart keeps its rows.
-- p_tenants / p_exclude_tenants: the pool it serves (worker.tenants / worker.exclude_tenants).
CREATE OR REPLACE FUNCTION webhooks.register_worker(p_worker_id text, p_instance uuid,
                                                   p_tenants text[] DEFAULT NULL,
                                                   p_exclude_tenants text[] DEFAULT NULL)
RETURNS TABLE (registered boolean, holder_pid integer, holder_since timestamptz, reclaimed integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_key bigint := webhooks.worker_lock_key(p_worker_id);
    v_old webhooks.worker_liveness;
BEGIN
    reclaimed := 0;
    IF NOT pg_try_advisory_lock(v_key) THEN
        registered := false;
        SELECT w.backend_pid, w.started_at INTO holder_pid, holder_since
        FROM webhooks.worker_liveness w WHERE w.worker_id = p_worker_id;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO v_old FROM webhooks.worker_liveness w WHERE w.worker_id = p_worker_id FOR UPDATE;
    IF FOUND AND v_old.instance <> p_instance
       AND v_old.postmaster_started_at = pg_postmaster_start_time() THEN
        -- We hold the id's lock, so the process that registered before us is gone.
        reclaimed := webhooks.reclaim_rows_of(p_worker_id);
    END IF;
    INSERT INTO webhooks.worker_liveness AS w
        (worker_id, instance, lock_key, backend_pid, postmaster_started_at, tenants, exclude_tenants)
    VALUES (p_worker_id, p_instance, v_key, pg_backend_pid(), pg_postmaster_start_time(), p_tenants,
            p_exclude_tenants)
    ON CONFLICT (worker_id) DO UPDATE
    SET instance = excluded.instance, lock_key = excluded.lock_key, backend_pid = excluded.backend_pid,
        tenants = excluded.tenants, exclude_tenants = excluded.exclude_tenants,
        postmaster_started_at = excluded.postmaster_started_at,
        started_at = CASE WHEN w.instance = excluded.instance THEN w.started_at ELSE now() END,
        registered_at = now(), lost_at = NULL;
    registered := true;
    RETURN NEXT;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.register_worker(text, uuid, text[], text[]) TO webhooks_worker;

-- Called by every worker twice a second on its liveness connection. Marks registrations whose
-- lock is gone; reclaims the rows of those missing it for longer than the grace (only those
-- registered in this PostgreSQL lifetime, see the header); forgets registrations that nothing
-- depends on any more. Returns how many rows were reclaimed. Concurrent callers skip each other.
CREATE OR REPLACE FUNCTION webhooks.reclaim_lost_workers(p_grace_seconds double precision DEFAULT 1.0)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_worker record;
    v_total integer := 0;
BEGIN
    FOR v_worker IN
        WITH held AS MATERIALIZED (SELECT * FROM webhooks.held_advisory_locks())
        SELECT w.worker_id, w.lost_at, w.postmaster_started_at = pg_postmaster_start_time() AS this_lifetime
        FROM webhooks.worker_liveness w
        WHERE NOT EXISTS (SELECT 1 FROM held h
                          WHERE h.key_high = (w.lock_key >> 32) & 4294967295
                            AND h.key_low = w.lock_key & 4294967295)
        ORDER BY w.worker_id
        FOR UPDATE OF w SKIP LOCKED
    LOOP
        IF NOT v_worker.this_lifetime THEN
            -- Registered before PostgreSQL restarted: its process may be alive and reconnecting,
            -- so its rows wait for their lease. Forget it once none is left.
            IF NOT EXISTS (SELECT 1 FROM webhooks.alert_delivery_queue q
                           WHERE q.status = 'delivering' AND q.locked_by = v_worker.worker_id) THEN
                DELETE FROM webhooks.worker_liveness WHERE worker_id = v_worker.worker_id;
            END IF;
        ELSIF v_worker.lost_at IS NULL THEN
            UPDATE webhooks.worker_liveness SET lost_at = now() WHERE worker_id = v_worker.worker_id;
        ELSIF v_worker.lost_at <= now() - make_interval(secs => p_grace_seconds) THEN
            v_total := v_total + webhooks.reclaim_rows_of(v_worker.worker_id);
            DELETE FROM webhooks.worker_liveness WHERE worker_id = v_worker.worker_id;
        END IF;
    END LOOP;
    RETURN v_total;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.reclaim_lost_workers(double precision) TO webhooks_worker;

-- Called by a process that has just registered again (register_worker on this same session, which
-- holds the id's lock): every row `delivering` under its worker id whose lease is not one of
-- p_held goes back to the queue as an expired lease does (end_leases(), claim.sql): its attempt
-- counts, as its request may have been sent. Such rows are leases the process no longer holds:
-- finished on a primary that failed before the standby received the outcome, or claimed by a
-- commit whose answer never arrived. Rows locked by a transaction in progress (an outcome being
-- written) are left alone. Returns how many rows went back; idle workers are woken.
CREATE OR REPLACE FUNCTION webhooks.release_unheld_leases(p_worker_id text, p_held uuid[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_key bigint := webhooks.worker_lock_key(p_worker_id);
    v_count integer;
BEGIN
    -- Only the live process of the id may say what it holds: the session holding the id's lock.
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                     AND l.pid = pg_backend_pid()
                     AND l.classid::bigint = (v_key >> 32) & 4294967295
                     AND l.objid::bigint = v_key & 4294967295) THEN
        RAISE EXCEPTION 'worker id % is not registered on this session', p_worker_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    v_count := webhooks.end_leases(
        ARRAY(SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
              WHERE q.status = 'delivering' AND q.locked_by = p_worker_id
                AND q.lease_token <> ALL (coalesce(p_held, '{}'))
              FOR UPDATE SKIP LOCKED),
        'its worker no longer holds it', 'its worker no longer holds it (its outcome was lost, e.g. in a failover)');
    IF v_count > 0 THEN
        PERFORM pg_notify('webhooks_queue', '');
    END IF;
    RETURN v_count;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.release_unheld_leases(text, uuid[]) TO webhooks_worker;
