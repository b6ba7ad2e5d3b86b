-- A refund follows its reservation's estimate through a rollback's carries
-- (`store::pg::ledger::recarry`), and reads only those: `adjust` rows with a carry's
-- reason and no request id. A refund's own row taking a carry back has the reason too, and
-- its request's id (since s32 stop attack F1); through `ledger_carries_<level>` (0018) the
-- walk read each such row and dropped it. Partial on what the walk reads, one per level as
-- 0018's. 0018's indexes stay: the rollback's sum of what earlier carries brought
-- (`carry_back`) counts the refunds' rows too, each taking back what its carry brought.
CREATE INDEX ledger_rollback_carries_token ON ledger(token_id, reason, id) WHERE kind = 'adjust' AND request_id IS NULL;
CREATE INDEX ledger_rollback_carries_user ON ledger(user_id, reason, id) WHERE kind = 'adjust' AND request_id IS NULL;
CREATE INDEX ledger_rollback_carries_team ON ledger(team_id, reason, id) WHERE kind = 'adjust' AND request_id IS NULL;

-- The walk starts after the reservation's own `reserve` row, looked up by its request id
-- and found by it here, not among every row of the held period of its level — a team's
-- month of spend (no index on `request_id` since 0011 dropped SQLite's; PostgreSQL never
-- had one). Partial on `reserve` rows, the only ones looked up so: one page more per
-- reservation, none per settlement.
CREATE INDEX ledger_reserve_request ON ledger(request_id) WHERE kind = 'reserve';

-- Plain `CREATE INDEX`: each holds a write lock on the ledger while it reads the whole table
-- to build, so reservations and settlements wait out the upgrade's four builds.
-- `CREATE INDEX CONCURRENTLY` cannot run inside the transaction a migration runs in.
