-- Rotations made before 0014 (`successor_id`) left the old text on its own budget for the
-- rest of its overlap (see migrations/sqlite/0027_rotated_successors.sql). Only a rotation
-- row's `after` is cast (the CASE: no other row's text is read as JSON), and a pair whose
-- new token was revoked is left alone: the old text kept working on its own budget, and
-- the link would end it unannounced.
WITH latest AS (
    SELECT DISTINCT ON (target) target,
           CASE WHEN action = 'token.rotate' THEN (after::jsonb ->> 'new_token_id')::bigint END AS new_id
    FROM audit_log WHERE action = 'token.rotate' ORDER BY target, id DESC
)
UPDATE tokens t SET successor_id = l.new_id
FROM latest l
WHERE l.target = 'token:' || t.id AND t.successor_id IS NULL
  AND EXISTS (SELECT 1 FROM tokens n WHERE n.id = l.new_id AND n.revoked_at IS NULL);
