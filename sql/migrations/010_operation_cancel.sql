-- 010_operation_cancel: a bulk operation can be cancelled (POST /v1/operations/{id}/cancel,
-- `webhook-worker operations cancel`): it stops at the end of the step it is in, and says who
-- stopped it. Its rate holds for the fleet: the row says when its next step is due, whichever API
-- process takes it (each process used to keep the rate on its own, so two replayed twice as fast).

ALTER TABLE webhooks.api_operations
    DROP CONSTRAINT api_operations_status_check,
    ADD CONSTRAINT api_operations_status_check
        CHECK (status IN ('running', 'done', 'failed', 'cancelled')),
    ADD COLUMN cancelled_by text,
    ADD COLUMN next_step_at timestamptz NOT NULL DEFAULT now();
