-- A refund follows its reservation's estimate through a rollback's carries
-- (`store::ledger::cas::recarry_tx`), and reads only those: `adjust` rows with a carry's
-- reason and no request id. A refund's own row taking a carry back has the reason too, and
-- its request's id (since s32 stop attack F1); through `ledger_carries_<level>` (0030) the
-- walk read each such row and dropped it. Partial on what the walk reads, one per level as
-- 0030's. 0030's indexes stay: the rollback's sum of what earlier carries brought
-- (`carry_back`) counts the refunds' rows too, each taking back what its carry brought.
CREATE INDEX ledger_rollback_carries_token ON ledger(token_id, reason, id) WHERE kind = 'adjust' AND request_id IS NULL;
CREATE INDEX ledger_rollback_carries_user ON ledger(user_id, reason, id) WHERE kind = 'adjust' AND request_id IS NULL;
CREATE INDEX ledger_rollback_carries_team ON ledger(team_id, reason, id) WHERE kind = 'adjust' AND request_id IS NULL;

-- The reservation's own `reserve` row, where the walk starts, is still found among the
-- held period's rows of its level (`ledger_<level>_period`): an index on `request_id`
-- would write one page more on every reservation (0011 dropped `ledger_request` for that
-- cost) for a lookup made only after a wrong clock's rollback. PostgreSQL has one (0020).
