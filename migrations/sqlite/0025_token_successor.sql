-- A rotated token's successor (`admin::token_ops::rotate`): during its overlap the old text
-- authenticates as the new token — its budget, windows and request rows are the new
-- token's — so the pair never spends more than the new token's budget (review s21 #7).
-- No foreign key: `sluice migrate-store` copies tokens in id order, and a successor's id
-- is always the greater.
ALTER TABLE tokens ADD COLUMN successor_id INTEGER;
