-- 007_api_login: the HTTP API logs in as a role of its own, neither the schema owner nor able to
-- create roles (a login with CREATEROLE can grant itself pg_execute_server_program and run programs
-- as the server's OS user).
--
-- Two more group roles (NOLOGIN; their privileges: functions/roles.sql and beside each function):
--   webhooks_admin          what an admin token's requests may do: the readers' reads, and the
--                           administration functions (endpoints, replay, tenants, settings)
--   webhooks_authenticator  what the API's login holds between requests: checking tokens and
--                           console sessions, and the schema version for /ready
-- The API's login is a member of these and of webhooks_producer and webhooks_reader; it switches to
-- the caller's group role for each request (SET LOCAL ROLE) and rests as webhooks_authenticator:
--
--   CREATE ROLE api_pod LOGIN NOINHERIT PASSWORD '…'
--       IN ROLE webhooks_authenticator, webhooks_producer, webhooks_reader, webhooks_admin;
--
-- Creating the roles needs CREATEROLE, as 001_baseline's do; without it, create them beforehand
-- (CREATE ROLE webhooks_admin NOLOGIN; CREATE ROLE webhooks_authenticator NOLOGIN) and the
-- migration only grants. `webhook-worker migrate` says how to drop CREATEROLE afterwards.

DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['webhooks_admin', 'webhooks_authenticator'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile by a migration of another database in this cluster
            END;
        END IF;
    END LOOP;
END;
$$;

-- An API that still logs in as the owner (as 002_api made possible) keeps working: the owner may
-- switch to these roles too. The API warns at start-up while it runs so.
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT webhooks_admin, webhooks_authenticator TO %I', current_user);
    END IF;
EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
    RAISE NOTICE 'an API logging in as this role needs membership of webhooks_admin and '
                 'webhooks_authenticator; give the API a login of its own instead (docs/security.md)';
END;
$$;
