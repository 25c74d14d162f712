-- 021_sealed_credentials: endpoint URLs, signing secrets, secret settings and custom header values
-- (an Authorization header is a credential) are stored as AES-GCM
-- envelopes ('enc:v1:<key id>:<base64>') sealed by the worker side; the key never reaches
-- PostgreSQL (worker/encryption.py). These functions let `webhook-worker keys status|rotate` see which
-- keys are in use and re-seal every value under a new key while workers keep running.

-- A sealed URL is longer than the URL (base64, nonce and tag): 8192 characters of URL fit in this.
ALTER TABLE webhooks.endpoints DROP CONSTRAINT endpoints_url_check;
ALTER TABLE webhooks.endpoints ADD CONSTRAINT endpoints_url_check CHECK (char_length(url) <= 11200);

-- The key id each stored credential is sealed with ('plaintext' for values stored before sealing).
CREATE FUNCTION webhooks.credential_keys()
RETURNS TABLE (key_id text, credentials bigint)
LANGUAGE sql STABLE AS $$
    WITH stored AS (
        SELECT e.url AS value FROM webhooks.endpoints e
        UNION ALL
        SELECT s ->> 'secret' FROM webhooks.endpoints e, jsonb_array_elements(e.signing_secrets) s
        UNION ALL
        SELECT v.value FROM webhooks.endpoints e, jsonb_each_text(e.secret_settings) v
        UNION ALL
        SELECT h.value FROM webhooks.endpoints e, jsonb_each_text(e.headers) h
    )
    SELECT CASE WHEN starts_with(value, 'enc:v1:') THEN split_part(value, ':', 3) ELSE 'plaintext' END,
           count(*)
    FROM stored
    GROUP BY 1
    ORDER BY 1;
$$;

-- A page of endpoints' credentials, locked against concurrent changes until the caller commits
-- (FOR NO KEY UPDATE: producers inserting rows for these endpoints are not blocked).
CREATE FUNCTION webhooks.endpoint_credentials(p_after_id bigint, p_limit integer)
RETURNS TABLE (id bigint, url text, signing_secrets jsonb, secret_settings jsonb, headers jsonb)
LANGUAGE sql AS $$
    SELECT e.id, e.url, e.signing_secrets, e.secret_settings, e.headers
    FROM webhooks.endpoints e
    WHERE e.id > p_after_id
    ORDER BY e.id
    LIMIT p_limit
    FOR NO KEY UPDATE;
$$;

CREATE FUNCTION webhooks.store_endpoint_credentials(
    p_id bigint, p_url text, p_signing_secrets jsonb, p_secret_settings jsonb, p_headers jsonb
) RETURNS void
LANGUAGE sql AS $$
    UPDATE webhooks.endpoints
    SET url = p_url, signing_secrets = p_signing_secrets, secret_settings = p_secret_settings,
        headers = p_headers
    WHERE id = p_id;
$$;
