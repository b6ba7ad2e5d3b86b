-- Rotations made before 0014 (`successor_id`) left the old text on its own budget for the
-- rest of its overlap (see migrations/sqlite/0027_rotated_successors.sql). The rotations
-- are read first (MATERIALIZED: no other row's `after` is ever cast).
WITH rotated AS MATERIALIZED (
    SELECT target, id, after FROM audit_log WHERE action = 'token.rotate'
), latest AS (
    SELECT DISTINCT ON (target) target, (after::jsonb ->> 'new_token_id')::bigint AS new_id
    FROM rotated ORDER BY target, id DESC
)
UPDATE tokens t SET successor_id = l.new_id
FROM latest l
WHERE l.target = 'token:' || t.id AND t.successor_id IS NULL
  AND EXISTS (SELECT 1 FROM tokens n WHERE n.id = l.new_id);
