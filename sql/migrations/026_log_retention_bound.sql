-- 026_log_retention_bound: log_retention is at least one day.
--
-- The audit log is kept in daily partitions, and retention drops a partition once the whole of its
-- day is older than log_retention (functions/retention.sql): a shorter setting was accepted and then
-- dropped nothing until the day ended, so what `config set log_retention '1 minute'` promised was
-- never done. It is refused now, by this constraint (SQLSTATE 23514, naming it), and by the API's
-- and the CLI's checks before it (worker/api/routes.py SETTING_BOUNDS, worker/operator_sql.py
-- SETTING_RULES; a test compares them with this). A database that holds a shorter value gets one day,
-- said in a notice.

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhooks.delivery_config WHERE log_retention < interval '1 day') THEN
        RAISE NOTICE 'log_retention was % and is now 1 day: the audit log is dropped a whole day at a time',
                     (SELECT log_retention FROM webhooks.delivery_config);
        UPDATE webhooks.delivery_config SET log_retention = interval '1 day', updated_at = now()
        WHERE log_retention < interval '1 day';
    END IF;
END;
$$;

ALTER TABLE webhooks.delivery_config
    ADD CONSTRAINT log_retention_at_least_a_day CHECK (log_retention >= interval '1 day');
