-- Rotations made before 0014 (`successor_id`) left the old text on its own budget for the
-- rest of its overlap (see migrations/sqlite/0027_rotated_successors.sql: the latest
-- rotation whose new token is not revoked; none, left alone). Only a rotation row's
-- `after` is cast (the CASE: no other row's text is read as JSON).
WITH rotated AS (
    SELECT target, id,
           CASE WHEN action = 'token.rotate' THEN (after::jsonb ->> 'new_token_id')::bigint END AS new_id
    FROM audit_log WHERE action = 'token.rotate'
), latest AS (
    SELECT DISTINCT ON (r.target) r.target, r.new_id
    FROM rotated r JOIN tokens n ON n.id = r.new_id AND n.revoked_at IS NULL
    ORDER BY r.target, r.id DESC
)
UPDATE tokens t SET successor_id = l.new_id
FROM latest l
WHERE l.target = 'token:' || t.id AND t.successor_id IS NULL;
