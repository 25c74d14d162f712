-- 018_api_publish_round_trips: the API publishes in two statements, the second checking the token
-- in the publish's own statement (functions/api.sql: api_publish_check(), api_publish_as(),
-- api_publish_batch_as(), api_authorize()).
--
-- Those are functions, defined by their file; this migration gives them a schema version, so that
-- an API that calls them (worker/api/app.py: API_SCHEMA_VERSION) does not call itself ready on a
-- database migrated by an older release, which does not have them. Of the tables, only what the
-- token table says of itself changes.

COMMENT ON TABLE webhooks.api_tokens IS
    'HTTP API tokens: name, role and the SHA-256 of the token (never the token itself). Read on every'
    ' request, and by a publish in its own statement: nothing caches a token, so a revocation or an'
    ' expiry holds from the next request.';
