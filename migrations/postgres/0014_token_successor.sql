-- A rotated token's successor (see migrations/sqlite/0025_token_successor.sql).
ALTER TABLE tokens ADD COLUMN successor_id BIGINT;
