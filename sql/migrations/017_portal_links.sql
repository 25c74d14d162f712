-- 017_portal_links: one-time links that open a console session as a tenant's administrator.
--
-- An application sends its customer to manage their own webhooks with a link (`tokens portal-link`,
-- POST /v1/tenants/{id}/portal-link). The link's secret is never stored: this table keeps its
-- SHA-256, as api_tokens does for tokens. Each link stands for a tenant_admin token made with it
-- (scoped to the tenant, expiring with the link, its secret thrown away): opening the link once
-- (used_at) starts a console session on that token, so the session ends when the link expires, or
-- at once when `tokens revoke` revokes the token (functions/console.sql).

CREATE TABLE webhooks.portal_links (
    link_hash  bytea       PRIMARY KEY CHECK (length(link_hash) = 32),
    token_id   bigint      NOT NULL REFERENCES webhooks.api_tokens (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz
);

COMMENT ON TABLE webhooks.portal_links IS
    'One-time console links for a tenant''s administrator: SHA-256 of the link''s secret, never the secret.';

CREATE INDEX portal_links_token ON webhooks.portal_links (token_id);
