-- 019_lean_audit_rows: an audit row costs one index entry and no trigger call.
--
-- finish() writes an audit row for every attempt, the one write of a delivery that cannot be made
-- smaller. It paid for two index entries and a PL/pgSQL trigger call per row:
--
-- * The primary key (log_id, logged_at) answered no query: the history of a delivery is read
--   through alert_delivery_log_delivery (delivery_id, logged_at), and log_id stays an identity
--   column that only PostgreSQL fills (GENERATED ALWAYS), in the order rows are written. Only the
--   schema's functions write this table (the roles read it), and retention drops whole partitions.
--   Its entry was about 70 of a delivery's 1,290 bytes of WAL. Dropping it is immediate.
-- * The tenant was filled by a row trigger that looked up the row's endpoint. finish() now writes
--   the endpoint's tenant itself, read in the same statement; the trigger fills it only for a row
--   that leaves it NULL (the other writers: lease expiry, release, replay, disabling), so the
--   column loses its default, which would have hidden a writer that forgot it
--   (functions/tenants.sql). The call was about a tenth of finish()'s PostgreSQL CPU.

ALTER TABLE webhooks.alert_delivery_log DROP CONSTRAINT alert_delivery_log_pkey;
ALTER TABLE webhooks.alert_delivery_log ALTER COLUMN tenant_id DROP DEFAULT;
