-- A rollback's carries (`adjust` rows whose reason names the period a wrong clock had put a
-- level in) are looked up by reason: what earlier carries of that period brought, in any
-- period (a wrong day spans the host's midnight: carried again in full, the next day paid
-- for the day before), and where a reservation's estimate went, so that its refund follows
-- it (`store::ledger::cas::recarry_tx`). Partial: carries are a handful of rows among
-- the ledger's millions.
CREATE INDEX ledger_carries ON ledger(reason, id) WHERE kind = 'adjust';
