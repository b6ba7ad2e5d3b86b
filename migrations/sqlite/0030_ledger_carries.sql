-- A rollback's carries (`adjust` rows whose reason names the period a wrong clock had put a
-- level in) are looked up by reason: what earlier carries of that period brought, in any
-- period (a wrong day spans the host's midnight: carried again in full, the next day paid
-- for the day before), and where a reservation's estimate went, so that its refund follows
-- it (`store::ledger::cas::recarry_tx`). Partial (carries and admin
-- adjustments are a handful of rows among the ledger's millions), and one per level: every
-- level carried from one wrong period shares the reason, so an index on the reason alone
-- read them all for each level's sum.
CREATE INDEX ledger_carries_token ON ledger(token_id, reason, id) WHERE kind = 'adjust';
CREATE INDEX ledger_carries_user ON ledger(user_id, reason, id) WHERE kind = 'adjust';
CREATE INDEX ledger_carries_team ON ledger(team_id, reason, id) WHERE kind = 'adjust';
