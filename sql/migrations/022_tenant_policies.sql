-- 022_tenant_policies: row-level security on endpoint_renamed_names, and the tenant administrator's
-- restrictive policy on messages.
--
-- endpoint_renamed_names (008) keeps the all-digit names migration 008 renamed, which
-- endpoint_ref() refuses as it runs as its caller; readers and tenant administrators read it, and
-- without a policy every tenant read every other's old names. Each row is its endpoint's tenant's.
-- messages has the tenant_isolation policy (014); the policy that shows a tenant administrator's
-- session without its tenant no row (015's tenant_admin_needs_tenant, on the other tenant tables) is
-- added too, should that role ever be granted the table.

ALTER TABLE webhooks.endpoint_renamed_names ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.endpoint_renamed_names
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR webhook_id IN (SELECT e.id FROM webhooks.endpoints e
                             WHERE e.tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint));

DO $$
DECLARE
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['endpoint_renamed_names', 'messages'] LOOP
        EXECUTE format('CREATE POLICY tenant_admin_needs_tenant ON webhooks.%I AS RESTRICTIVE'
                       ' TO webhooks_tenant_admin'
                       ' USING (nullif(current_setting(''webhooks.tenant'', true), '''') IS NOT NULL)',
                       v_table);
    END LOOP;
END;
$$;
