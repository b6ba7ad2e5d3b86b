-- Rotations made before 0025 (`successor_id`) left the old text on its own budget for the
-- rest of its overlap, next to the new token's: the pair could spend both (s23 attack #3).
-- Each is found in the audit log (`token.rotate`: target `token:<old id>`, `after` naming
-- `new_token_id`; a token rotated twice by an older version follows its latest) and the
-- pair linked, so the old text works as the new token from here on — unless the new token
-- was revoked: the old text kept working on its own budget, and the link would end it
-- unannounced.
UPDATE tokens SET successor_id = (
    SELECT CAST(json_extract(a.after, '$.new_token_id') AS INTEGER)
    FROM audit_log a
    WHERE a.action = 'token.rotate' AND a.target = 'token:' || tokens.id AND json_valid(a.after)
    ORDER BY a.id DESC LIMIT 1)
WHERE successor_id IS NULL
  AND (
    SELECT CAST(json_extract(a.after, '$.new_token_id') AS INTEGER)
    FROM audit_log a
    WHERE a.action = 'token.rotate' AND a.target = 'token:' || tokens.id AND json_valid(a.after)
    ORDER BY a.id DESC LIMIT 1) IN (SELECT id FROM tokens WHERE revoked_at IS NULL);
