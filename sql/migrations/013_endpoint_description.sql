-- 013_endpoint_description: an endpoint's description, free text for the people who read lists of
-- endpoints (whose receiver it is, who to ask). Bounded as worker/endpoints.py bounds it; the
-- models' bounds are compared with this constraint by a test.

ALTER TABLE webhooks.endpoints
    ADD COLUMN description text,
    ADD CONSTRAINT endpoints_description_length CHECK (char_length(description) <= 1000);
